"""The trainer's per-token log-probs of sampled completions, and how far the engine's are.

"Log-prob" here is what the sampler drew from before filtering: log_softmax(logits / T) over
the whole vocabulary, at the rollout's temperature T (T = 1 when greedy). top-k/top-p are left
out, as TRL and vLLM's `processed_logprobs` do: the policy gradient is taken through the
temperature-scaled model, and the nucleus only decides which tokens get sampled. The engine and
the trainer both call `token_logprobs` on fp32 logits (computed in float64), so on CPU fp32 the
two differ only by the KV-cache decode's arithmetic against one full forward; with the
batch-invariant attention the RL loops switch on (`rollout.batch_invariant`,
kiln/model/batch_invariance.py) that arithmetic is the same and so are the log-probs, bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from kiln.model.batch_invariance import MIN_GEMM_ROWS
from kiln.training.rl import shared_prompt
from kiln.training.rl.tied_embedding import tied_embedding_in_place


def sampler_log_softmax(logits: torch.Tensor, temperature: float | torch.Tensor) -> torch.Tensor:
    """log_softmax(logits / T) in float64 over the vocabulary: logits [..., V] -> [..., V].
    T: one temperature (0 means 1: greedy), or a float64 tensor broadcasting against logits.
    A float T of 1 divides nothing (x / 1 is x exactly, so the values are the same)."""
    scaled = logits.double()
    if isinstance(temperature, torch.Tensor) or temperature not in (0, 1):
        scaled = scaled / temperature
    return torch.log_softmax(scaled, dim=-1)


def token_logprobs(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float | torch.Tensor
) -> torch.Tensor:
    """log_softmax(logits / T)[token] per row: logits [..., V], tokens [...] -> [...] float64."""
    return sampler_log_softmax(logits, temperature).gather(-1, tokens[..., None])[..., 0]


@dataclass
class SequenceScores:
    logp: torch.Tensor  # [B, T] float64, carries the gradient when the model does
    mask: torch.Tensor  # [B, T] float64: 1 on completion tokens
    entropy: torch.Tensor  # [B, T] float64, detached


@dataclass
class CompletionLogits:
    logits: torch.Tensor  # [N, V]: the logits predicting each completion token, row by row
    targets: torch.Tensor  # [N]: those tokens
    place: tuple[torch.Tensor, torch.Tensor]  # (row, completion position) of each of the N


def completion_logits(
    model: nn.Module, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]]
) -> CompletionLogits:
    """One `Transformer.forward` over each prompt + completion (right-padded: causal attention
    never looks at the padding), the logits at the positions that predict completion tokens.

    Under tensor parallelism the blocks hand the head sequence shards, which positions cannot
    index: the head then runs on every position (the width padded to a multiple of tp) and the
    wanted rows are taken from its replicated logits.

    Where prompts repeat (a GRPO group's) and the model allows, each distinct prompt is computed
    once for all its rows (shared_prompt.py): the same logits, fewer tokens."""
    with tied_embedding_in_place(model):
        return _completion_logits(model, prompts, completions)


def _completion_logits(
    model: nn.Module, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]]
) -> CompletionLogits:
    if completions and shared_prompt.applies(model, prompts):
        logits, targets = shared_prompt.shared_prompt_logits(model, prompts, completions)
        return CompletionLogits(logits, targets, _places(completions, logits.device))
    width = max(len(p) + len(c) for p, c in zip(prompts, completions, strict=True))
    tp = _tensor_parallel_size(model)
    width = -(-width // tp) * tp
    device = next(model.parameters()).device
    # at least MIN_GEMM_ROWS token rows (empty sequences added) and head rows (a position
    # repeated) go into every matmul: the engine's decode does the same (rollout.py
    # `InvariantRows`), so with the invariant attention both compute a token's logits alike
    rows_needed = -(-MIN_GEMM_ROWS // width)
    tokens = torch.zeros(max(len(prompts), rows_needed), width, dtype=torch.long)
    rows, cols, targets = [], [], []
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        tokens[i, : len(p) + len(c)] = torch.tensor([*p, *c])
        for j, token in enumerate(c):
            rows.append(i)
            cols.append(len(p) + j - 1)  # the position whose logits predict token j
            targets.append(token)
    wanted = len(rows)
    if 0 < wanted < MIN_GEMM_ROWS:
        fill = MIN_GEMM_ROWS - wanted
        rows, cols = rows + [rows[0]] * fill, cols + [cols[0]] * fill
    index = (torch.tensor(rows, device=device), torch.tensor(cols, device=device))
    if tp > 1:
        logits = model(tokens.to(device))[index]
    else:
        logits = model(tokens.to(device), logits_positions=index)
    return CompletionLogits(
        logits[:wanted], torch.tensor(targets, device=device), _places(completions, device)
    )


def _places(completions: Sequence[Sequence[int]], device) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, completion position) of every completion token, row by row."""
    rows = [i for i, c in enumerate(completions) for _ in c]
    cols = [j for c in completions for j in range(len(c))]
    return torch.tensor(rows, device=device), torch.tensor(cols, device=device)


def _tensor_parallel_size(model: nn.Module) -> int:
    """The tp degree of a model laid out by kiln/training/parallel (1 for a plain model)."""
    weight = model.output.weight if model.output is not None else model.tok_embeddings.weight
    mesh = getattr(weight, "device_mesh", None)  # a DTensor's; a plain tensor has none
    if mesh is None or "tp" not in (mesh.mesh_dim_names or ()):
        return 1
    return mesh.size(mesh.mesh_dim_names.index("tp"))


def per_completion(values: torch.Tensor, out: CompletionLogits, rows: int) -> torch.Tensor:
    """[N] values laid out [rows, longest completion] (0 past each completion's end)."""
    steps = max(1, int(out.place[1].max()) + 1) if out.place[1].numel() else 1
    grid = torch.zeros(rows, steps, dtype=values.dtype, device=values.device)
    return grid.index_put(out.place, values)


def completion_logprobs(
    model: nn.Module,
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    temperature: float,
) -> SequenceScores:
    """The completion tokens' log-probs (one forward, `completion_logits`) and the sampler's
    entropy."""
    out = completion_logits(model, prompts, completions)
    # one log-softmax over the vocabulary serves both (a [tokens, V] float64 pass each)
    logp_all = sampler_log_softmax(out.logits, temperature)
    flat = logp_all.gather(-1, out.targets[:, None])[:, 0]
    with torch.no_grad():
        scaled = logp_all.detach()
        flat_entropy = -(scaled.exp() * scaled).sum(-1)
    n = len(prompts)
    logp = per_completion(flat, out, n)
    return SequenceScores(
        logp,
        per_completion(torch.ones_like(flat_entropy), out, n),
        per_completion(flat_entropy, out, n),
    )


def mismatch(
    engine: torch.Tensor, trainer: torch.Tensor, mask: torch.Tensor
) -> tuple[float, float]:
    """Mean and max |engine - trainer| log-prob over the completion tokens."""
    diff = (engine - trainer.detach()).abs()[mask > 0]
    if diff.numel() == 0:
        return 0.0, 0.0
    return float(diff.mean()), float(diff.max())


def rollout_mismatch_max(model: nn.Module, rollouts, temperature: float = 1.0) -> float:
    """The largest |engine - trainer| log-prob over `rollouts`' completion tokens (objects with
    `prompt_ids`, `completion_ids` and the engine's `logprobs`), the trainer's recomputed here
    by `completion_logprobs` without gradients."""
    with torch.no_grad():
        scores = completion_logprobs(
            model,
            [r.prompt_ids for r in rollouts],
            [r.completion_ids for r in rollouts],
            temperature,
        )
    return max(
        (
            abs(a - b)
            for r, row in zip(rollouts, scores.logp, strict=True)
            for a, b in zip(r.logprobs, row[: len(r.completion_ids)].tolist(), strict=True)
        ),
        default=0.0,
    )
