"""Rollouts on Ray: N actors, each holding an engine over its own copy of the policy.

A step's prompts are split into N contiguous shards (whole groups), each shard sampled by one
actor with the seeds the in-process engine would give those completions, so the rollouts are
the same wherever they ran. Refit puts the merged weights into Ray's object store once and every
actor loads them from there (refit.py: numpy buffers, no pickled tensor bytes). An actor that
dies is replaced by a fresh one built from the latest weights in the object store and its shard
is sampled again: the step loses nothing.

An actor runs its calls in order, one at a time: a batch submitted ahead (async GRPO,
`max_policy_lag`) samples while the trainer trains, and the next refit's load waits behind it,
so every batch decodes with the weights its actor held when it was submitted and says which
(`Rollout.policy_version`).

Ray is imported here only when a pool starts, so `kiln.training` imports without it (the lent
GPU image has no Ray).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from tokenizers import Tokenizer

from kiln.engine.generator import Generator
from kiln.engine.sampler import SamplingParams
from kiln.model.attention import backend_available, set_attention_backend
from kiln.model.config import ModelConfig
from kiln.model.formats.weights import build_model
from kiln.platform.errors import KilnError
from kiln.training.rl.config import RolloutConfig
from kiln.training.rl.refit import copy_state, from_wire, state_checksum, to_wire
from kiln.training.rl.rollout import Rollout, RolloutBackend, generate_rollouts

log = logging.getLogger("kiln.training.rl")


class RolloutWorkerLost(KilnError):
    """A rollout actor kept dying after `rollout.max_retries` replacements."""


class RolloutWorker:
    """The body of one rollout actor: an engine over a model built from the wire weights."""

    def __init__(
        self,
        model_cfg: dict,
        weights,
        tokenizer_json: str,
        eos_token_ids: list[int],
        max_batch_size: int,
        dtype: str,
        version: int = 0,
        recompute_logprobs: bool = False,
    ) -> None:
        cfg = ModelConfig(**model_cfg)
        model = build_model(cfg, from_wire(weights), device="cpu", dtype=getattr(torch, dtype))
        # build_model puts every model on SDPA; the trainer's backend (the RL loops' batch-
        # invariant one, `rollout.batch_invariant`) is what makes the engine's log-probs equal
        # the trainer's bit for bit: on SDPA they sit ~1e-6 apart. A GPU kernel the trainer
        # named and this CPU actor cannot run stays on SDPA.
        if backend_available(cfg.attention_backend):
            set_attention_backend(model, cfg.attention_backend)
        tokenizer = Tokenizer.from_str(tokenizer_json)
        self.generator = Generator(model, tokenizer, eos_token_ids=eos_token_ids)
        self.max_batch_size = max_batch_size
        self.version = version  # updates the weights have seen
        self.recompute_logprobs = recompute_logprobs

    def generate(
        self,
        prompt_ids: list[list[int]],
        group_size: int,
        params: SamplingParams,
        seed: int,
    ) -> list[Rollout]:
        return generate_rollouts(
            self.generator,
            prompt_ids,
            group_size,
            params,
            seed,
            self.max_batch_size,
            policy_version=self.version,
            recompute_logprobs=self.recompute_logprobs,
        )

    def load(self, weights, version: int) -> float:
        """The wire weights (after `version` updates) written into the engine's model in
        place; seconds."""
        start = time.perf_counter()
        copy_state(from_wire(weights), self.generator.model)
        self.version = version
        return time.perf_counter() - start

    def checksum(self) -> str:
        return state_checksum(self.generator.model.state_dict())

    def names(self) -> list[str]:
        return list(self.generator.model.state_dict())


def shards(n_prompts: int, n_workers: int) -> list[tuple[int, int]]:
    """Contiguous [start, end) prompt ranges, as even as possible, none empty."""
    n = min(n_prompts, n_workers)
    bounds = [round(i * n_prompts / n) for i in range(n + 1)]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


@dataclass
class PendingCalls:
    """Calls sent to the actors and not yet collected: `futures[i]` went to `sent_to[i]`."""

    call: Callable
    items: list
    futures: list
    sent_to: list


class RayRollouts(RolloutBackend):
    """`rollout.workers` rollout actors; the same methods as LocalRollouts."""

    def __init__(
        self,
        cfg: RolloutConfig,
        state: dict[str, torch.Tensor],
        model_cfg: ModelConfig,
        tokenizer,
        eos_token_ids: Sequence[int],
        max_batch_size: int,
    ) -> None:
        import ray

        self.cfg = cfg
        self.restarts = 0
        self.version = 0  # the weights in the object store: updates they have seen
        dtype = str(next(iter(state.values())).dtype).removeprefix("torch.")
        self._actor = ray.remote(num_cpus=cfg.cpus_per_worker, max_restarts=0)(RolloutWorker)
        self._weights = ray.put(to_wire(state))
        self._args = (
            model_cfg.model_dump(mode="json"),
            tokenizer.to_str(),
            list(eos_token_ids),
            max_batch_size,
            dtype,
        )
        self.workers = [self._start() for _ in range(cfg.workers)]
        self._names = ray.get(self.workers[0].names.remote())

    def _start(self):
        model_cfg, tokenizer_json, eos, slots, dtype = self._args
        return self._actor.remote(
            model_cfg,
            self._weights,
            tokenizer_json,
            eos,
            slots,
            dtype,
            self.version,
            self.cfg.recompute_logprobs,
        )

    def _replace(self, i: int, error: Exception) -> None:
        import ray

        log.warning("rollout actor %d died (%s): replaced, its share retried", i, error)
        ray.kill(self.workers[i], no_restart=True)
        self.workers[i] = self._start()
        self.restarts += 1

    def _send(self, call, items: Sequence) -> PendingCalls:
        """call(worker, item) sent to worker i for item i; `_collect` gathers the results."""
        workers = self.workers[: len(items)]
        futures = [call(w, item) for w, item in zip(workers, items, strict=False)]
        return PendingCalls(call, list(items), futures, list(workers))

    def _collect(self, pending: PendingCalls) -> list:
        """Every result of `pending`; a dead worker is replaced and its item sent again (up to
        rollout.max_retries times each). A worker already replaced since the call was sent (a
        refit found it dead) is not replaced twice: the item goes to its successor."""
        import ray
        from ray.exceptions import RayActorError

        results = []
        for i, item in enumerate(pending.items):
            for attempt in range(self.cfg.max_retries + 1):
                try:
                    results.append(ray.get(pending.futures[i]))
                    break
                except RayActorError as e:
                    if attempt == self.cfg.max_retries:
                        raise RolloutWorkerLost(
                            f"rollout.workers: actor {i} died {attempt + 1} times in one step "
                            f"(rollout.max_retries {self.cfg.max_retries}): {e}"
                        ) from None
                    if self.workers[i] is pending.sent_to[i]:
                        self._replace(i, e)
                    pending.sent_to[i] = self.workers[i]
                    pending.futures[i] = pending.call(self.workers[i], item)
        return results

    def _each(self, call, items: Sequence) -> list:
        return self._collect(self._send(call, items))

    def submit(
        self,
        prompt_ids: Sequence[list[int]],
        group_size: int,
        params: SamplingParams,
        seed: int,
    ) -> PendingCalls:
        """Sampling sent to the actors (queued behind their earlier calls); `wait` returns the
        rollouts."""
        parts = shards(len(prompt_ids), len(self.workers))
        prompts = [list(p) for p in prompt_ids]

        def call(worker, part):
            start, end = part
            # completion k of the batch has seed + k, whichever actor samples it
            return worker.generate.remote(
                prompts[start:end], group_size, params, seed + start * group_size
            )

        return self._send(call, parts)

    def wait(self, pending: PendingCalls) -> list[Rollout]:
        out = []
        for (start, _), rollouts in zip(pending.items, self._collect(pending), strict=True):
            for r in rollouts:
                r.prompt_index += start
            out.extend(rollouts)
        return out

    def refit(self, state: dict[str, torch.Tensor], version: int) -> float:
        """The merged policy `state` (after `version` updates) put into the object store once,
        every actor loading it after the calls sent to it before; seconds until the last has."""
        import ray

        start = time.perf_counter()
        self._weights = ray.put(to_wire({name: state[name] for name in self._names}))
        self.version = version
        weights = self._weights
        self._each(lambda worker, _: worker.load.remote(weights, version), self.workers[:])
        return time.perf_counter() - start

    def checksums(self) -> list[str]:
        return self._each(lambda worker, _: worker.checksum.remote(), self.workers[:])

    def engine_names(self) -> list[str]:
        return list(self._names)

    def close(self) -> None:
        import ray

        for worker in self.workers:
            ray.kill(worker, no_restart=True)
        self.workers = []
