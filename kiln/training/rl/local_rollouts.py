"""Rollouts in the trainer's process: one engine over a plain copy of the policy, refit by an
in-place tensor copy (no serialisation)."""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence

from torch import nn

from kiln.engine.generator import Generator
from kiln.engine.sampler import SamplingParams
from kiln.training.rl.refit import copy_state, state_checksum
from kiln.training.rl.rollout import Rollout, generate_rollouts


class LocalRollouts:
    """The engine beside the trainer; `generator.model` is the engine's copy of the policy."""

    def __init__(
        self, policy: nn.Module, tokenizer, eos_token_ids: Sequence[int], max_batch_size: int
    ) -> None:
        model = copy.deepcopy(policy).eval().requires_grad_(False)
        self.generator = Generator(model, tokenizer, eos_token_ids=eos_token_ids)
        self.max_batch_size = max_batch_size
        self.restarts = 0  # nothing here dies on its own; the Ray pool counts its replacements

    def generate(
        self,
        prompt_ids: Sequence[list[int]],
        group_size: int,
        params: SamplingParams,
        seed: int,
    ) -> list[Rollout]:
        return generate_rollouts(
            self.generator, prompt_ids, group_size, params, seed, self.max_batch_size
        )

    def refit(self, state: dict) -> float:
        """The merged policy `state` copied into the engine's model; seconds."""
        start = time.perf_counter()
        copy_state(state, self.generator.model)
        return time.perf_counter() - start

    def checksums(self) -> list[str]:
        return [state_checksum(self.generator.model.state_dict())]

    def engine_names(self) -> list[str]:
        return list(self.generator.model.state_dict())

    def close(self) -> None:
        """Nothing to release: the engine goes with this object."""
