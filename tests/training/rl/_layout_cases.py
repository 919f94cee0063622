"""Rank functions: GRPO and on-policy distillation with the policy under a training layout vs
the same run in one process."""

from __future__ import annotations

import json
import os

import torch.distributed as dist

from kiln.training.config import ParallelConfig
from kiln.training.rl.config import GRPORunConfig
from kiln.training.rl.layouts import shard_policy
from kiln.training.rl.run import load_config, main, run_grpo
from tests.training.rl.test_distill import HELD_OUT as DISTILL_HELD_OUT
from tests.training.rl.test_distill import _loop as distill_loop
from tests.training.rl.test_grpo import _loop


def _steps(parallel: dict | None, steps: int, overrides: dict) -> list[tuple]:
    """Per step: reward, loss, the engine-vs-trainer log-prob mismatch, whether every engine's
    weights equal the trainer's gathered ones after the refit, the completions this rank
    scored and those it sampled (None in one process)."""
    loop = _loop(steps, **overrides)
    if parallel is not None:
        shard_policy(loop, ParallelConfig(**parallel), dist.get_world_size())
    rows = []
    loop.run(
        on_step=lambda m: rows.append(
            (
                m["reward"],
                m["loss"],
                m["logprob_mismatch_max"],
                loop.engines_match(),
                len(loop.last_update.rollouts),
                getattr(loop.rollouts, "sampled", None),
            )
        )
    )
    loop.close()
    return rows


def grpo_layout_vs_single(parallel: dict, steps: int, overrides: dict) -> tuple[list, list]:
    """(this rank's steps under `parallel`, the same steps in one process without a layout)."""
    laid_out = _steps(parallel, steps, overrides)
    return laid_out, _steps(None, steps, overrides)


def torchrun_entry_vs_single(config: str, out: str) -> tuple[list, list] | None:
    """`python -m kiln.training.rl.run` on this rank (the process group already up, as torchrun's
    env would bring it), then on rank 0, which wrote the run, the run.json metrics and those of
    run_grpo in one process without the layout."""
    assert main(["--config", config, "--out", out]) == 0
    dist.barrier()  # rank 0 has written the run
    if dist.get_rank() != 0:
        return None
    with open(os.path.join(out, "run.json")) as f:
        laid_out = json.load(f)["metrics"]
    single_cfg = load_config(config).model_copy(update={"parallel": None})
    return laid_out, run_grpo(single_cfg, f"{out}-single")["metrics"]


def _distill_steps(parallel: dict | None, steps: int, overrides: dict) -> list[tuple]:
    """Per step: reverse KL, loss, the log-prob mismatch, whether the engines hold the trainer's
    weights, the completions this rank's teacher scored and the step's reported most per rank."""
    loop = distill_loop(steps, **overrides)
    if parallel is not None:
        shard_policy(loop, ParallelConfig(**parallel), dist.get_world_size())
    rows, scored = [], [0]

    def record(m: dict) -> None:
        rows.append(
            (
                m["reverse_kl"],
                m["loss"],
                m["logprob_mismatch_max"],
                loop.engines_match(),
                loop.teacher_rows - scored[0],
                m["teacher_rows_per_rank"],
            )
        )
        scored[0] = loop.teacher_rows

    loop.run(on_step=record)
    loop.close()
    return rows


def distill_layout_vs_single(
    parallel: dict, steps: int, overrides: dict | None = None
) -> tuple[list, list]:
    """On-policy distillation's steps with the student under `parallel`, and in one process."""
    overrides = overrides or {}
    return _distill_steps(parallel, steps, overrides), _distill_steps(None, steps, overrides)


def _held_out_reverse_kl(parallel: dict | None) -> tuple[float, int]:
    """The base student's held-out reverse KL and the completions this rank's teacher scored."""
    loop = distill_loop(1)
    if parallel is not None:
        shard_policy(loop, ParallelConfig(**parallel), dist.get_world_size())
    score = loop.evaluate([{"prompt": p} for p in DISTILL_HELD_OUT])
    loop.close()
    return score, loop.teacher_rows


def distill_evaluate_vs_single(parallel: dict) -> tuple[tuple, tuple]:
    return _held_out_reverse_kl(parallel), _held_out_reverse_kl(None)


def grpo_resumed_vs_straight(fields: dict, tmp: str) -> tuple[list, list, list] | None:
    """On rank 0: the metrics of a laid-out GRPO run straight through, and of the same run
    stopped after step 2 (its state saved every step) and started again, plus the steps the
    second start ran."""
    cfg = GRPORunConfig(**fields)
    straight = run_grpo(cfg, f"{tmp}/straight")
    state = f"{tmp}/state"
    run_grpo(cfg.model_copy(update={"steps": 2}), f"{tmp}/resumed", state_dir=state)
    dist.barrier()  # rank 0 has written the state
    ran: list[int] = []
    resumed = run_grpo(cfg, f"{tmp}/resumed", lambda m: ran.append(m["step"]), state)
    if dist.get_rank() != 0:
        return None
    return straight["metrics"], resumed["metrics"], ran
