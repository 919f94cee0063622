"""Rollouts in the trainer's process: one engine over a plain copy of the policy, refit by an
in-place tensor copy (no serialisation).

The engine works on one background thread, fed in order: a batch submitted ahead (async GRPO,
`max_policy_lag`) samples while the trainer's thread trains, and a refit queues behind the
batches submitted before it, so each batch decodes with the weights the engine held when it
was submitted, as a Ray actor's queue of calls does (ray_rollouts.py)."""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from torch import nn

from kiln.engine.generator import Generator
from kiln.engine.sampler import SamplingParams
from kiln.training.rl.refit import copy_state, state_checksum
from kiln.training.rl.rollout import Rollout, RolloutBackend, generate_rollouts


class LocalRollouts(RolloutBackend):
    """The engine beside the trainer; `generator.model` is the engine's copy of the policy."""

    def __init__(
        self,
        policy: nn.Module,
        tokenizer,
        eos_token_ids: Sequence[int],
        max_batch_size: int,
        recompute_logprobs: bool = False,
    ) -> None:
        model = copy.deepcopy(policy).eval().requires_grad_(False)
        self.generator = Generator(model, tokenizer, eos_token_ids=eos_token_ids)
        self.max_batch_size = max_batch_size
        self.recompute_logprobs = recompute_logprobs
        self.version = 0  # updates the engine's weights have seen
        self.restarts = 0  # nothing here dies on its own; the Ray pool counts its replacements
        self._queue = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kiln-rollouts")

    def submit(
        self,
        prompt_ids: Sequence[list[int]],
        group_size: int,
        params: SamplingParams,
        seed: int,
    ) -> Future:
        """Sampling queued behind earlier batches and refits; `wait` returns its rollouts."""
        prompts = [list(p) for p in prompt_ids]
        return self._queue.submit(
            lambda: generate_rollouts(
                self.generator,
                prompts,
                group_size,
                params,
                seed,
                self.max_batch_size,
                policy_version=self.version,
                recompute_logprobs=self.recompute_logprobs,
            )
        )

    def wait(self, pending: Future) -> list[Rollout]:
        return pending.result()

    def refit(self, state: dict, version: int) -> float:
        """The merged policy `state` (after `version` updates) copied into the engine's model
        once the batches submitted before have sampled; seconds of the copy itself."""

        def load() -> float:
            start = time.perf_counter()
            copy_state(state, self.generator.model)
            self.version = version
            return time.perf_counter() - start

        return self._queue.submit(load).result()

    def checksums(self) -> list[str]:
        return [
            self._queue.submit(lambda: state_checksum(self.generator.model.state_dict())).result()
        ]

    def engine_names(self) -> list[str]:
        return list(self.generator.model.state_dict())

    def close(self) -> None:
        """Batches sampled ahead and never taken are dropped."""
        self._queue.shutdown(wait=True, cancel_futures=True)
