"""`refit_s` under a layout is the step's refit, the same on every rank (rank 0 writes the
run's metrics, but any rank's must say the same): with in-process engines the slowest rank's
load, with Ray actors rank 0's actors' seconds broadcast; and the gather of the policy's
shards before the load counts too."""

import time

import pytest
import torch.distributed as dist

from kiln.training.config import ParallelConfig
from kiln.training.rl import on_policy
from kiln.training.rl.layouts import shard_policy
from kiln.training.rl.rank_rollouts import RankZeroRollouts, SplitRollouts
from tests.training.distributed import run_distributed
from tests.training.rl.test_grpo import _loop


class _Engines:
    """A rollout backend whose refit takes a given number of seconds (reported, not slept)."""

    restarts = 0

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def refit(self, state, version) -> float:
        return self.seconds

    def engine_names(self) -> list[str]:
        return []

    def close(self) -> None:
        pass


def _split_refit() -> float:
    rank = dist.get_rank()
    return SplitRollouts(_Engines(0.1 * (rank + 1))).refit({}, 1)


def _rank_zero_refit() -> float:
    actors = _Engines(0.25) if dist.get_rank() == 0 else None  # only rank 0 owns the actors
    return RankZeroRollouts(actors).refit({}, 1)


def test_split_engines_report_the_slowest_ranks_load_on_every_rank():
    assert run_distributed(_split_refit, 2) == [pytest.approx(0.2), pytest.approx(0.2)]


def test_rank_zero_actors_refit_seconds_reach_every_rank():
    assert run_distributed(_rank_zero_refit, 2) == [0.25, 0.25]


GATHER_S, LOAD_S = 0.1, 0.2  # slept by the patched gather (every rank) and rank 1's load


def _laid_out_refits() -> list[float]:
    """A GRPO run at dp_shard=2 with in-process engines, the gather slowed on every rank and
    the engine load on rank 1 only: this rank's logged refit seconds per step."""
    gather = on_policy.merged_policy_state

    def slow_gather(policy):
        time.sleep(GATHER_S)
        return gather(policy)

    on_policy.merged_policy_state = slow_gather  # this rank's process only
    loop = _loop(steps=2)
    shard_policy(loop, ParallelConfig(dp_shard=2), dist.get_world_size())
    engine = loop.rollouts.local
    load = engine.refit
    if dist.get_rank() == 1:

        def slow_load(state, version):
            time.sleep(LOAD_S)
            return load(state, version) + LOAD_S

        engine.refit = slow_load
    loop.run()
    loop.close()
    return [m["refit_s"] for m in loop.metrics]


def test_a_laid_out_runs_refit_seconds_count_the_gather_and_the_slowest_load():
    for refits in run_distributed(_laid_out_refits, 2):
        assert len(refits) == 2
        assert all(GATHER_S + LOAD_S <= s < 5 for s in refits), refits
