"""The trainer's forward over a GRPO batch with each prompt computed once for its whole group.

A step's G completions of a prompt share that prompt token for token, and a full forward over
every prompt + completion computes the prompt G times (most of a step's tokens when prompts are
longer than completions, as chat-templated ones are). Here the forward runs in two passes
through `Transformer.forward`'s KV-cache contract (`kv_cache=`), without a copy of the model:

1. the distinct prompts, right-padded, as a plain causal forward; every layer's keys and values
   are kept (`PromptKeys`, still in the autograd graph), and the last prompt position gives the
   logits of each completion's first token;
2. the completions (all but their last token), each row at its prompt's positions, attending to
   its prompt's keys/values gathered in front of its own (`OverPrompt`); their positions give
   the logits of the other completion tokens.

Gradients reach the prompt's tokens through the gathered keys and values (summed over the
group), so the loss and its gradient are the full forward's, up to summation order. With the
batch-invariant attention (`rollout.batch_invariant`) every token's logits equal the full
forward's bit for bit: each row's keys are its prompt then its completion with masked keys only
trailing, the layout the engine's decode attends over, and every matmul keeps at least
`MIN_GEMM_ROWS` rows (tests/training/rl/test_shared_prompt.py).

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
    """Whether the two-pass forward can run on `model` and saves work: some prompt repeats."""
    cfg = getattr(model, "cfg", None)
    if cfg is None or cfg.mla is not None or (cfg.n_experts and cfg.capacity_factor):
        return False
    if len({tuple(p) for p in prompts}) == len(prompts):
        return False
    return not any(isinstance(p, DTensor) for p in model.parameters())


class _Hooks:
    """The KV-cache contract's hooks that neither pass needs: nothing to reserve or advance."""

    def begin(self, seq_len: int) -> None:
        pass

    def advance(self, seq_len: int) -> None:
        pass

    def layer(self, index: int) -> _Layer:
        return _Layer(self, index)


class PromptKeys(_Hooks):
    """Pass 1's cache: a plain causal forward (the contract's hooks do nothing else) that keeps
    each layer's keys and values [U, Hkv, P, Dh], after RoPE."""

    def __init__(self) -> None:
        self.k: dict[int, torch.Tensor] = {}
        self.v: dict[int, torch.Tensor] = {}

    def positions(self, seq_len: int) -> None:
        return None  # 0 .. seq_len - 1, as a forward without a cache

    def attend(self, index: int, q, k, v, core) -> torch.Tensor:
        self.k[index], self.v[index] = k, v
        return core(q, k, v)


class OverPrompt(_Hooks):
    """Pass 2's cache: row b's tokens at positions P_b.., attending to its prompt's keys and
    values (row `prompt_of[b]` of `keys`), then its own, with masked keys only at the end."""

    def __init__(self, keys: PromptKeys, prompt_of: list[int], lengths: list[int], width: int):
        self.keys = keys
        device = next(iter(keys.k.values())).device
        self.prompt_of = torch.tensor(prompt_of, device=device)
        lengths_t = torch.tensor(lengths, device=device)[:, None]  # [B, 1]
        self.query = lengths_t + torch.arange(width, device=device)  # [B, S] positions
        longest = next(iter(keys.k.values())).shape[2]
        total = longest + width
        key = torch.arange(total, device=device)[None, :]  # [1, L]
        # key slot j of row b: its prompt's j-th key while j < P_b, then its own (j - P_b)-th
        # from the `longest` slots on; past the row's tokens any slot (masked by causality)
        self.gather = torch.where(key < lengths_t, key, longest + key - lengths_t).clamp(
            max=total - 1
        )
        self.key = key  # key slot j holds position j while j < P_b + width

    def positions(self, seq_len: int) -> torch.Tensor:
        return self.query

    def attend(self, index: int, q, k, v, core) -> torch.Tensor:
        rows = [
            torch.cat([t.index_select(0, self.prompt_of), new], dim=2)
            for t, new in ((self.keys.k[index], k), (self.keys.v[index], v))
        ]
        slots = self.gather[:, None, :, None]
        k, v = (t.gather(2, slots.expand(-1, t.shape[1], -1, t.shape[3])) for t in rows)
        query = self.query[:, :, None]  # [B, S, 1]
        mask = self.key[:, None, :] <= query  # [B, S, L]
        if core.sliding_window is not None:
            mask &= query - self.key[:, None, :] < core.sliding_window
        return core(q, k, v, mask=mask[:, None])


class _Layer:
    """What an `Attention` module is handed: `LayerKV`'s `attend` (no storage of its own)."""

    __slots__ = ("cache", "index")

    def __init__(self, cache, index: int) -> None:
        self.cache, self.index = cache, index

    def attend(self, q, k, v, core) -> torch.Tensor:
        return self.cache.attend(self.index, q, k, v, core)


def _padded(rows: Sequence[Sequence[int]], width: int, min_rows: int) -> torch.Tensor:
    """Token rows right-padded to `width`, with empty rows added up to `min_rows`."""
    tokens = torch.zeros(max(len(rows), min_rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        tokens[i, : len(row)] = torch.tensor(list(row), dtype=torch.long)
    return tokens


def _logits(model, tokens, cache, rows: list[int], cols: list[int], device) -> torch.Tensor:
    """The forward's logits at (rows, cols), at least `MIN_GEMM_ROWS` head rows (a position
    repeated, then sliced off), as `completion_logits` and the engine's decode take them."""
    wanted = len(rows)
    if wanted < MIN_GEMM_ROWS:
        fill = MIN_GEMM_ROWS - wanted
        rows, cols = rows + [rows[0]] * fill, cols + [cols[0]] * fill
    index = (torch.tensor(rows, device=device), torch.tensor(cols, device=device))
    return model(tokens.to(device), kv_cache=cache, logits_positions=index)[:wanted]


def shared_prompt_logits(
    model: nn.Module, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits predicting each completion token [N, V] (row by row, token by token, as
    `completion_logits` orders them) and those tokens [N], by the two passes above."""
    device = next(model.parameters()).device
    distinct: dict[tuple[int, ...], int] = {}
    prompt_of = [distinct.setdefault(tuple(p), len(distinct)) for p in prompts]
    unique = list(distinct)
    lengths = [len(p) for p in unique]
    # pass 1: the distinct prompts; each one's last position predicts its completions' first
    longest = max(lengths)
    keys = PromptKeys()
    tokens = _padded(unique, longest, -(-MIN_GEMM_ROWS // longest))
    first = _logits(model, tokens, keys, list(range(len(unique))), [n - 1 for n in lengths], device)
    # pass 2: each completion but its last token (which predicts nothing kept)
    inputs = [list(c[:-1]) for c in completions]
    rows, cols = [], []
    for i, c in enumerate(inputs):
        rows += [i] * len(c)
        cols += range(len(c))
    if rows:
        width = max(len(c) for c in inputs)
        tokens = _padded(inputs, width, -(-MIN_GEMM_ROWS // width))
        extra = tokens.shape[0] - len(inputs)  # empty rows: prompt 0 at length 0
        cache = OverPrompt(
            keys,
            prompt_of + [0] * extra,
            [len(prompts[i]) for i in range(len(prompts))] + [0] * extra,
            width,
        )
        rest = _logits(model, tokens, cache, rows, cols, device)
        logits = torch.cat([first, rest])
    else:
        logits = first
    # row i's token 0 from its prompt's row of `first`, token j > 0 from `rest`
    order, k = [], len(unique)
    for i, c in enumerate(completions):
        if c:
            order.append(prompt_of[i])
            order += range(k, k + len(c) - 1)
            k += len(c) - 1
    logits = logits.index_select(0, torch.tensor(order, device=device))
    targets = torch.tensor([t for c in completions for t in c], device=device)
    return logits, targets
