"""The trainer's forward over a GRPO batch with each prompt computed once for its whole group.

A step's G completions of a prompt share that prompt token for token, and a full forward over
every prompt + completion computes the prompt G times (most of a step's tokens when prompts are
longer than completions, as chat-templated ones are). Here one `Transformer.forward` runs over
one packed row, through the model's KV-cache contract (`kv_cache=`), without a copy of the model:

- the row holds the distinct prompts (right-padded to the longest, a grid of `prompt_rows` x
  `prompt_width`) then every completion but its last token (right-padded, `rows` x `width`),
  each token at its own RoPE position;
- the embedding, every Linear and the head see all of the batch's tokens in one matmul, so each
  weight's gradient is one product over the batch (two passes, one for the prompts and one for
  the completions, took two products and a sum per weight: most of their backward's extra cost);
- in each layer the attention (`Packed.attend`) unpacks the two grids: the prompts attend
  causally to themselves; each completion attends to its prompt's keys/values gathered in front
  of its own, with masked keys only trailing, the layout the engine's decode attends over.

A prompt's last position gives the logits of its completions' first token, a completion's
positions those of its other tokens. Gradients reach the prompt's tokens through the gathered
keys and values (summed over the group), so the loss and its gradient are the full forward's, up
to summation order. With the batch-invariant attention (`rollout.batch_invariant`) every token's
logits equal the full forward's bit for bit: a row's result does not depend on how many rows
share a matmul once there are `MIN_GEMM_ROWS` (tests/training/rl/test_shared_prompt.py).

Models whose attention caches something else (MLA's latent), whose experts drop tokens by
capacity (a token's expert would depend on the batch), or that are laid out over ranks
(DTensor parameters) take the full forward (`applies`)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from kiln.model.batch_invariance import MIN_GEMM_ROWS


def applies(model: nn.Module, prompts: Sequence[Sequence[int]]) -> bool:
    """Whether the packed forward can run on `model` and saves work: some prompt repeats."""
    cfg = getattr(model, "cfg", None)
    if cfg is None or cfg.mla is not None or (cfg.n_experts and cfg.capacity_factor):
        return False
    if len({tuple(p) for p in prompts}) == len(prompts):
        return False
    return not any(isinstance(p, DTensor) for p in model.parameters())


def _unpack(t: torch.Tensor, start: int, rows: int, width: int) -> torch.Tensor:
    """[1, H, N, Dh] packed -> the grid at `start` as [rows, H, width, Dh] (a view)."""
    return t[0, :, start : start + rows * width].unflatten(1, (rows, width)).transpose(0, 1)


def _pack(t: torch.Tensor) -> torch.Tensor:
    """[rows, H, width, Dh] -> [1, H, rows * width, Dh]."""
    return t.transpose(0, 1).flatten(1, 2)[None]


class Packed:
    """The KV-cache contract's hooks for the packed row: its RoPE positions and the attention
    of its two grids (nothing is stored or advanced)."""

    def __init__(
        self,
        prompt_grid: tuple[int, int],
        prompt_of: list[int],
        lengths: list[int],
        width: int,
    ) -> None:
        self.prompt_rows, self.prompt_width = prompt_grid
        self.rows, self.width = len(prompt_of), width
        self.start = self.prompt_rows * self.prompt_width  # the completions' first slot
        self.prompt_of = torch.tensor(prompt_of)
        lengths_t = torch.tensor(lengths)[:, None]  # [B, 1]
        self.query = lengths_t + torch.arange(width)  # [B, W]: completion token positions
        longest = self.prompt_width
        total = longest + width
        key = torch.arange(total)[None, :]  # [1, L]
        # key slot j of row b: its prompt's j-th key while j < P_b, then its own (j - P_b)-th
        # from the `longest` slots on; past the row's tokens any slot (masked by causality)
        self.gather = torch.where(key < lengths_t, key, longest + key - lengths_t).clamp(
            max=total - 1
        )
        self.key = key  # key slot j holds position j while j < P_b + width
        prompt_positions = torch.arange(longest).repeat(self.prompt_rows)
        self._positions = torch.cat([prompt_positions, self.query.flatten()])[None]

    def to(self, device) -> Packed:
        for name in ("prompt_of", "query", "gather", "key", "_positions"):
            setattr(self, name, getattr(self, name).to(device))
        return self

    def positions(self, seq_len: int) -> torch.Tensor:
        return self._positions  # [1, N]

    def begin(self, seq_len: int) -> None:
        pass

    def advance(self, seq_len: int) -> None:
        pass

    def layer(self, index: int) -> Packed:
        return self  # every layer attends alike; nothing is kept per layer

    def attend(self, q, k, v, core) -> torch.Tensor:
        grid = (0, self.prompt_rows, self.prompt_width)
        prompt_k, prompt_v = _unpack(k, *grid), _unpack(v, *grid)
        out = _pack(core(_unpack(q, *grid), prompt_k, prompt_v))
        if self.width == 0:
            return out
        own = (self.start, self.rows, self.width)
        keys = [
            torch.cat([t.index_select(0, self.prompt_of), _unpack(new, *own)], dim=2)
            for t, new in ((prompt_k, k), (prompt_v, v))
        ]
        slots = self.gather[:, None, :, None]
        keys = [t.gather(2, slots.expand(-1, t.shape[1], -1, t.shape[3])) for t in keys]
        query = self.query[:, :, None]  # [B, W, 1]
        mask = self.key[:, None, :] <= query  # [B, W, L]
        if core.sliding_window is not None:
            mask &= query - self.key[:, None, :] < core.sliding_window
        over = core(_unpack(q, *own), *keys, mask=mask[:, None])
        return torch.cat([out, _pack(over)], dim=2)


def _grid(rows: Sequence[Sequence[int]], width: int, min_rows: int = 0) -> torch.Tensor:
    """Token rows right-padded to `width`, with empty rows added up to `min_rows`."""
    tokens = torch.zeros(max(len(rows), min_rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        tokens[i, : len(row)] = torch.tensor(list(row), dtype=torch.long)
    return tokens


def shared_prompt_logits(
    model: nn.Module, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits predicting each completion token [N, V] (row by row, token by token, as
    `completion_logits` orders them) and those tokens [N], by the packed forward above."""
    device = next(model.parameters()).device
    distinct: dict[tuple[int, ...], int] = {}
    prompt_of = [distinct.setdefault(tuple(p), len(distinct)) for p in prompts]
    unique = list(distinct)
    longest = max(len(p) for p in unique)
    # the prompt grid alone fills a matmul's MIN_GEMM_ROWS (empty rows added), as the full
    # forward's and the engine's token rows do
    prompt_grid = _grid(unique, longest, -(-MIN_GEMM_ROWS // longest))
    inputs = [list(c[:-1]) for c in completions]  # a completion's last token predicts nothing
    width = max(len(c) for c in inputs)
    packed = torch.cat([prompt_grid.flatten(), _grid(inputs, width).flatten()])[None]
    cache = Packed(tuple(prompt_grid.shape), prompt_of, [len(p) for p in prompts], width)
    # row i's token 0 from its prompt's last position, token j > 0 from its own position j - 1
    cols = []
    for i, c in enumerate(completions):
        if c:
            cols.append(prompt_of[i] * longest + len(prompts[i]) - 1)
            cols += range(cache.start + i * width, cache.start + i * width + len(c) - 1)
    wanted = len(cols)
    cols += [cols[0] if cols else 0] * (MIN_GEMM_ROWS - wanted)  # head rows up to the minimum
    rows = torch.zeros(len(cols), dtype=torch.long, device=device)
    index = (rows, torch.tensor(cols, device=device))
    logits = model(packed.to(device), kv_cache=cache.to(device), logits_positions=index)
    targets = torch.tensor([t for c in completions for t in c], device=device)
    return logits[:wanted], targets
