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

from kiln.engine.engine import Engine
from kiln.engine.sampler import SamplingParams
from kiln.engine.sequence import Sequence as EngineSequence
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
    """The serving engine, plus each sampled token's log-prob under its row's temperature."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # id(sequence) -> every sampled token (the end-of-text one included) and its log-prob
        self.sampled: dict[int, tuple[list[int], list[float]]] = {}

    def _sample_rows(self, seqs: list[EngineSequence], logits: torch.Tensor) -> list[int]:
        tokens = Engine._sample_rows(seqs, logits)
        chosen = torch.tensor(tokens, device=logits.device)
        for seq, row, token in zip(seqs, logits, chosen, strict=True):
            logp = token_logprobs(row.float(), token, seq.params.temperature)
            ids, logps = self.sampled.setdefault(id(seq), ([], []))
            ids.append(int(token))
            logps.append(float(logp))
        return tokens


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
