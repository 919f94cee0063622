"""A laid-out loop's rollout engines (layouts.py): how the ranks share the sampling.

In-process engines (`rollout.workers: 0`): every rank holds an engine with the gathered
weights, so the ranks split each batch: rank r samples its contiguous share of the prompts
(completion k of the batch keeps its seed, `seed + k`, whichever rank samples it, as the Ray
actors do: ray_rollouts.py), and the shares are all-gathered in rank order, so every rank ends
with the batch one process samples. Rewards, advantages and the update then go on as before.

Ray actors (`rollout.workers` > 0): rank 0 owns the actors (one pool, not one per rank) and
refits them; each batch it collects is broadcast to the other ranks, as are its checksums.

Every method here is a collective: the ranks call them in the same order, which the loop does
(each runs the same steps). So is `refit`, whose seconds are the same on every rank: the
slowest rank's engine load (in-process engines), or rank 0's actors' (Ray), so that whichever
rank logs a step logs the step's refit."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch.distributed as dist
from torch import nn

from kiln.model.attention import set_attention_backend
from kiln.training.rl.config import OnPolicyConfig
from kiln.training.rl.local_rollouts import LocalRollouts
from kiln.training.rl.ray_rollouts import RayRollouts, shards
from kiln.training.rl.rollout import Rollout, RolloutBackend
from kiln.training.rl.rollouts import open_rollouts


@dataclass
class _Share:
    start: int  # this rank's first prompt in the batch
    pending: object  # the engine's handle, None when this rank has no prompts this batch


class SplitRollouts(RolloutBackend):
    """Each rank's in-process engine samples its share of a batch; `wait` all-gathers them."""

    def __init__(self, local: LocalRollouts, group=None) -> None:
        self.local = local
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.sampled = 0  # completions this rank sampled in the last batch it waited for

    @property
    def restarts(self) -> int:
        return self.local.restarts

    def submit(self, prompt_ids, group_size: int, params, seed: int) -> _Share:
        parts = shards(len(prompt_ids), self.size)
        if self.rank >= len(parts):  # fewer prompts than ranks: this one sits the batch out
            return _Share(len(prompt_ids), None)
        start, end = parts[self.rank]
        pending = self.local.submit(
            prompt_ids[start:end], group_size, params, seed + start * group_size
        )
        return _Share(start, pending)

    def wait(self, pending: _Share) -> list[Rollout]:
        mine = [] if pending.pending is None else self.local.wait(pending.pending)
        for r in mine:
            r.prompt_index += pending.start
        self.sampled = len(mine)
        shares: list[list[Rollout] | None] = [None] * self.size
        dist.all_gather_object(shares, mine, group=self.group)
        return [r for share in shares for r in share]

    def refit(self, state: dict, version: int) -> float:
        """Every rank's engine loads the gathered `state`; the slowest one's seconds (an
        object collective, as the others here: it runs over gloo and NCCL alike)."""
        seconds: list[float | None] = [None] * self.size
        dist.all_gather_object(seconds, self.local.refit(state, version), group=self.group)
        return max(seconds)

    def checksums(self) -> list[str]:
        gathered: list[list[str] | None] = [None] * self.size
        dist.all_gather_object(gathered, self.local.checksums(), group=self.group)
        return [c for each in gathered for c in each]

    def engine_names(self) -> list[str]:
        return self.local.engine_names()

    def close(self) -> None:
        self.local.close()


class RankZeroRollouts(RolloutBackend):
    """Ray rollout actors driven by rank 0; the other ranks receive what it collects."""

    def __init__(self, actors: RayRollouts | None, group=None) -> None:
        self.actors = actors  # on rank 0 only
        self.group = group
        self.rank = dist.get_rank(group)
        self.source = dist.get_global_rank(group, 0) if group is not None else 0
        self._names = self._from_rank_zero(lambda: actors.engine_names())

    def _from_rank_zero(self, produce):
        box = [produce() if self.rank == 0 else None]
        dist.broadcast_object_list(box, src=self.source, group=self.group)
        return box[0]

    @property
    def restarts(self) -> int:
        return self.actors.restarts if self.actors is not None else 0

    def submit(self, prompt_ids: Sequence[list[int]], group_size: int, params, seed: int):
        if self.actors is None:
            return None
        return self.actors.submit(prompt_ids, group_size, params, seed)

    def wait(self, pending) -> list[Rollout]:
        return self._from_rank_zero(lambda: self.actors.wait(pending))

    def refit(self, state: dict, version: int) -> float:
        """The gathered `state` (every rank has it) into rank 0's actors; their seconds, on
        every rank."""
        return self._from_rank_zero(lambda: self.actors.refit(state, version))

    def checksums(self) -> list[str]:
        return self._from_rank_zero(lambda: self.actors.checksums())

    def engine_names(self) -> list[str]:
        return list(self._names)

    def close(self) -> None:
        if self.actors is not None:
            self.actors.close()


def open_shared_rollouts(
    cfg: OnPolicyConfig, policy: nn.Module, tokenizer, eos_token_ids: Sequence[int], group=None
) -> RolloutBackend:
    """The engines of a laid-out run, opened on every rank of `group` (before LoRA is applied,
    as open_rollouts): one in-process engine per rank, or Ray actors on rank 0 only."""
    if cfg.rollout.batch_invariant:  # before the engines copy the policy (as OnPolicyLoop)
        set_attention_backend(policy, "invariant")
    if cfg.rollout.workers == 0:
        return SplitRollouts(open_rollouts(cfg, policy, tokenizer, eos_token_ids), group)
    owner = dist.get_rank(group) == 0
    return RankZeroRollouts(
        open_rollouts(cfg, policy, tokenizer, eos_token_ids) if owner else None, group
    )


def share_rollouts(rollouts: RolloutBackend, group=None) -> RolloutBackend:
    """`rollouts` a loop opened on every rank, shared over `group`'s ranks: in-process engines
    split each batch; of the Ray pools, rank 0's is kept and the others stopped
    (open_shared_rollouts never starts them). Already shared: returned as it is."""
    if isinstance(rollouts, LocalRollouts):
        return SplitRollouts(rollouts, group)
    if isinstance(rollouts, RayRollouts):
        if dist.get_rank(group) != 0:
            rollouts.close()
            rollouts = None
        return RankZeroRollouts(rollouts, group)
    return rollouts
