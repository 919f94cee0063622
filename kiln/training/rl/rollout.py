"""Rollouts on Kiln's engine: G completions per prompt, each with its token ids and the log-prob
the sampler drew every token with (kiln/training/rl/logprobs.py says which distribution that is).

The engine is the one that serves (continuous batching over KV-cache slots, per-request
temperature/top-p/seed); `RolloutEngine` only records, at each sampling step, the chosen token's
log-prob from the logits the engine sampled from. Where the engines run and how the
policy's weights reach them: local_rollouts.py (this process), ray_rollouts.py (Ray actors).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from kiln.engine.engine import Engine
from kiln.engine.sampler import SamplingParams
from kiln.engine.sequence import Sequence as EngineSequence
from kiln.model.batch_invariance import MIN_GEMM_ROWS, column_major_exact_rows
from kiln.model.cpu_linear import column_major, linear_layers
from kiln.model.paged_kv_cache import NULL_BLOCK, PagedBatch
from kiln.training.rl.logprobs import completion_logprobs, token_logprobs


@dataclass
class Rollout:
    prompt_index: int
    prompt_ids: list[int]
    completion_ids: list[int]  # ends with the end-of-text token when the model stopped
    logprobs: list[float]  # the engine's, one per completion token
    truncated: bool  # cut at max_new_tokens (DAPO's overlong filter drops these)
    policy_version: int = 0  # updates the engine's weights had seen when it sampled this


class RolloutEngine(Engine):
    """The serving engine, plus each sampled token's log-prob under its row's temperature.
    For a model with the batch-invariant attention (`attention_backend: invariant`, which the
    RL loops set) every forward also gets enough rows for the invariant matmuls
    (`InvariantRows`), so its logits equal the trainer's full forward bit for bit on CPU."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # id(sequence) -> every sampled token (the end-of-text one included) and its log-prob
        self.sampled: dict[int, tuple[list[int], list[float]]] = {}
        rows, head_rows = column_major_layout(self.target.model)
        if self.target.model.cfg.attention_backend == "invariant":
            self._forward = InvariantRows(self._forward, rows, head_rows)

    def _packable(self, work) -> bool:
        # InvariantRows pads a forward with dummy sequences, which a packed batch (one row of
        # all the step's tokens) cannot take: a step of fewer tokens runs as separate forwards
        forward = self._forward
        if isinstance(forward, InvariantRows) and sum(n for _, n in work) < forward.rows:
            return False
        return super()._packable(work)

    def _sample_rows(self, seqs: list[EngineSequence], logits: torch.Tensor) -> list[int]:
        tokens = Engine._sample_rows(seqs, logits)
        # one log-softmax over the step's rows (each at its own temperature), as the trainer's
        # over all its tokens: a row's values do not depend on the rows beside it
        chosen = torch.tensor(tokens, device=logits.device)
        temperature = torch.tensor(
            [s.params.temperature or 1.0 for s in seqs], dtype=torch.float64, device=logits.device
        )
        logps = token_logprobs(logits.float(), chosen, temperature[:, None]).tolist()
        for seq, token, logp in zip(seqs, tokens, logps, strict=True):
            ids, seq_logps = self.sampled.setdefault(id(seq), ([], []))
            ids.append(token)
            seq_logps.append(logp)
        return tokens


class InvariantRows:
    """The engine's model runner with at least `rows` rows into every matmul of the blocks
    and `head_rows` into the LM head's: a decode step of fewer sequences gets dummy sequences
    (no blocks: they read and write only the null block, which pad tokens write anyway) and
    its LM head repeated positions, then both are sliced off. Below that many rows the matmul
    kernels round differently from the trainer's one large forward
    (kiln/model/batch_invariance.py): `MIN_GEMM_ROWS` for row-major weights, 2 for the
    column-major ones `column_major_layout` gives the engine's model."""

    def __init__(self, runner, rows: int = MIN_GEMM_ROWS, head_rows: int = MIN_GEMM_ROWS) -> None:
        self.runner = runner
        self.rows = rows
        self.head_rows = head_rows

    def __call__(
        self, tokens: torch.Tensor, cache: PagedBatch, rows: list[int], cols: list[int]
    ) -> torch.Tensor:
        batch, width = tokens.shape
        extra = max(0, -(-self.rows // width) - batch)
        if extra:
            tokens = torch.cat([tokens, tokens.new_zeros(extra, width)])
            cache = _with_dummy_rows(cache, extra)
        wanted = len(rows)
        if 0 < wanted < self.head_rows:
            fill = self.head_rows - wanted
            rows, cols = rows + [rows[0]] * fill, cols + [cols[0]] * fill
        return self.runner(tokens, cache, rows, cols)[:wanted]


def column_major_layout(model: nn.Module) -> tuple[int, int]:
    """Store every linear weight of a CPU fp32 engine model column-major but a tied LM head's
    (the embedding's, whose row lookups want it row-major; a copy of its own would double
    every refit's slowest copy, a transposing one): the same values, which a refit's in-place
    copy keeps in this layout. Returns the rows a forward needs, (for the blocks' linears, for
    the LM head), to compute the trainer's numbers (batch_invariance.py):
    `column_major_exact_rows` over the column-major weights' shapes, `MIN_GEMM_ROWS` for a
    row-major head and wherever the layout does not apply (another device or dtype, no MKL,
    a matmul outside `nn.Linear`: MoE experts, MLA's absorbed weights). Idempotent: the engine
    calls it per batch."""
    weight = model.tok_embeddings.weight
    if weight.device.type != "cpu" or weight.dtype != torch.float32:
        return MIN_GEMM_ROWS, MIN_GEMM_ROWS
    if not torch.backends.mkl.is_available():
        return MIN_GEMM_ROWS, MIN_GEMM_ROWS
    linears = [linear for _, linear in linear_layers(model)]
    covered = {id(linear.weight) for linear in linears} | {id(weight)}
    if any(p.dim() > 1 and id(p) not in covered for p in model.parameters()):
        return MIN_GEMM_ROWS, MIN_GEMM_ROWS
    head = getattr(model, "output", None)
    tied = isinstance(head, nn.Linear) and head.weight is weight
    threads = torch.get_num_threads()
    rows = {}
    for linear in linears:
        if tied and linear is head:
            continue
        column_major(linear)
        rows[linear] = column_major_exact_rows(*linear.weight.shape, threads)
    body = max((n for linear, n in rows.items() if linear is not head), default=MIN_GEMM_ROWS)
    return body, rows.get(head, MIN_GEMM_ROWS)


def _with_dummy_rows(batch: PagedBatch, extra: int) -> PagedBatch:
    """`batch` plus `extra` empty sequences whose tokens go to positions 0.. in the null block."""
    table, lengths = batch.table, batch.lengths
    bs = batch.cache.block_size
    slots = NULL_BLOCK * bs + torch.arange(batch.seq_len, device=lengths.device) % bs
    return PagedBatch(
        batch.cache,
        torch.cat([table, table.new_full((extra, table.shape[1]), NULL_BLOCK)]),
        torch.cat([lengths, lengths.new_zeros(extra)]),
        torch.cat([batch.write_slots, slots.repeat(extra)]),
        batch.end,
        batch.seq_len,
    )


def generate_rollouts(
    generator,
    prompt_ids: Sequence[list[int]],
    group_size: int,
    params: SamplingParams,
    seed: int,
    max_batch_size: int = 64,
    policy_version: int = 0,
    recompute_logprobs: bool = False,
) -> list[Rollout]:
    """`group_size` completions of every prompt (a group's adjacent), seeded per completion
    (seed + index) so a run repeats; `generator` is a kiln.engine Generator whose weights are
    the policy after `policy_version` updates. `recompute_logprobs`: the log-probs from one
    full forward of the engine's model over the whole batch (the trainer's computation, so
    equal to its bit for bit on CPU fp32) instead of the KV-cached decode's."""
    if params.penalized:
        raise ValueError("rollouts take no penalties: the trainer could not recompute them")
    jobs = [(i, ids) for i, ids in enumerate(prompt_ids) for _ in range(group_size)]
    engine = RolloutEngine(
        generator, max_slots=min(max_batch_size, len(jobs)), prefill_chunk=1 << 30
    )
    requests = [
        engine.submit(
            list(ids),
            params.model_copy(update={"seed": seed + k, "stop": []}),
            _unheard,
        )
        for k, (_, ids) in enumerate(jobs)
    ]
    for _ in engine.run(requests):
        pass
    out = []
    for (i, ids), request in zip(jobs, requests, strict=True):
        if request.error is not None:
            raise request.error
        seq = request.seq
        # the engine keeps the end-of-text token out of `seq.token_ids`; the policy must learn
        # to emit it, so a rollout keeps every sampled token
        completion, logprobs = engine.sampled.get(id(seq), ([], []))
        out.append(
            Rollout(
                i,
                list(ids),
                completion,
                logprobs,
                truncated=seq.finish_reason == "length",
                policy_version=policy_version,
            )
        )
    if recompute_logprobs and out:
        with torch.no_grad():
            scores = completion_logprobs(
                generator.model,
                [r.prompt_ids for r in out],
                [r.completion_ids for r in out],
                params.temperature,
            )
        for row, r in zip(scores.logp, out, strict=True):
            r.logprobs = row[: len(r.completion_ids)].tolist()
    return out


def _unheard(event) -> None:
    """Rollouts read each request's sequence themselves."""


class RolloutBackend:
    """What the on-policy loop samples through: `submit` a batch (returns a handle at once,
    sampled behind the refits submitted before it), `wait` for it; `generate` is both."""

    def submit(self, prompt_ids, group_size: int, params, seed: int):
        raise NotImplementedError

    def wait(self, pending) -> list[Rollout]:
        raise NotImplementedError

    def generate(self, prompt_ids, group_size: int, params, seed: int) -> list[Rollout]:
        return self.wait(self.submit(prompt_ids, group_size, params, seed))
