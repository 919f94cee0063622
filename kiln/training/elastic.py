"""Elastic training on Ray: after a worker or node is lost, re-plan the layout for the workers
the cluster can still hold and continue from the latest checkpoint.

Only data parallelism changes: tp/pp/cp (and dp_replicate) are kept, dp_shard takes what is left,
gradient accumulation grows so the global batch is unchanged, DCP reshards the checkpoint into
the new layout and the data loader continues at the same global sample (its state is global).

Ray Train 2.60 has elastic scaling of its own (`ScalingConfig(num_workers=(min, max))`), but it
starts any worker count in between, from free resources: a tp=2 layout can be handed 3 workers.
Kiln therefore restarts the run itself (`kiln.training.ray_train`) at the largest count that both
fits the alive nodes and forms a valid layout.

It grows back the same way: while a run is below `max_workers`, rank 0 asks after each committed
checkpoint whether the extra workers of a larger valid layout can be placed (a node came back);
if so it ends the attempt (`NodesReturned`) and kiln restarts at that size from that checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kiln.platform.errors import ConfigError

log = logging.getLogger("kiln.train")
LAYOUT_CHANGES_FILE = "layout_changes.jsonl"


class ElasticConfig(BaseModel):
    """Worker counts a run may shrink to (and start at) when nodes come and go."""

    model_config = ConfigDict(extra="forbid")

    min_workers: int = Field(..., ge=1, description="Fewest workers the run continues on.")
    max_workers: int = Field(..., ge=1, description="Most workers the run starts with.")
    max_restarts: int = Field(3, ge=0, description="Elastic restarts allowed per run.")

    @model_validator(mode="after")
    def _ordered(self) -> ElasticConfig:
        if self.min_workers > self.max_workers:
            raise ConfigError(
                f"ray.elastic: min_workers ({self.min_workers}) > max_workers ({self.max_workers})"
            )
        return self


def valid_worker_counts(cfg, elastic: ElasticConfig) -> list[int]:
    """Worker counts in [min, max] that form a layout: a multiple of pp*dp_replicate*cp*tp whose
    dp divides the global batch into whole micro-batches. Largest first."""
    p = cfg.parallel
    if p.dp_shard != -1:
        raise ConfigError(
            "ray.elastic needs parallel.dp_shard: -1 (dp takes what workers are left)"
        )
    others = p.pp * p.dp_replicate * p.cp * p.tp
    counts = []
    for n in range(elastic.max_workers, elastic.min_workers - 1, -1):
        if n % others:
            continue
        dp = p.dp_replicate * (n // others)
        if cfg.global_batch_size % (cfg.micro_batch_size * dp) == 0:
            counts.append(n)
    if not counts:
        raise ConfigError(
            f"ray.elastic: no worker count in [{elastic.min_workers}, {elastic.max_workers}] "
            f"is a multiple of pp*dp_replicate*cp*tp={others} dividing global_batch_size"
        )
    return counts


def schedulable_workers(cpus_per_worker: float, use_gpu: bool) -> int:
    """Workers the alive nodes can hold (from each node's total resources)."""
    import ray

    total = 0
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        res = node.get("Resources", {})
        fit = int(res.get("CPU", 0) // cpus_per_worker + 1e-9)
        if use_gpu:
            fit = min(fit, int(res.get("GPU", 0)))
        total += fit
    return total


def plan_workers(
    cfg, elastic: ElasticConfig, cpus_per_worker: float, use_gpu: bool, wait_s: float = 30.0
) -> int:
    """The largest valid worker count the cluster can place now: a placement group of that
    many workers is reserved and released (a node Ray has not yet marked dead cannot host it).
    Raises when even `min_workers` cannot be placed within `wait_s`."""
    counts = valid_worker_counts(cfg, elastic)
    deadline = time.monotonic() + wait_s
    while True:
        fits = schedulable_workers(cpus_per_worker, use_gpu)
        for n in (n for n in counts if n <= fits):
            if _can_place(n, cpus_per_worker, use_gpu):
                return n
        if time.monotonic() > deadline:
            raise ConfigError(
                f"ray.elastic: the cluster holds {fits} workers, fewer than min_workers "
                f"({elastic.min_workers}) in a valid layout"
            )
        time.sleep(0.5)


def _can_place(n: int, cpus_per_worker: float, use_gpu: bool, timeout_s: float = 5.0) -> bool:
    """Whether Ray can reserve n worker bundles right now (as Ray Train will ask)."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    bundle = {"CPU": cpus_per_worker, **({"GPU": 1} if use_gpu else {})}
    group = placement_group([bundle] * n, strategy="PACK")
    try:
        ray.get(group.ready(), timeout=timeout_s)
        return True
    except ray.exceptions.GetTimeoutError:
        return False
    finally:
        remove_placement_group(group)


GROW_MARK = "nodes returned"


class NodesReturned(RuntimeError):
    """Ends an elastic attempt on purpose: a larger layout can be placed again."""


def grow_target(plan: dict[str, Any], timeout_s: float = 2.0) -> int | None:
    """The largest valid count above the running one whose extra workers Ray can place now
    (reserved and released: a node that is listed but not yet ready does not count)."""
    running, cpus, use_gpu = plan["running"], plan["cpus"], plan["use_gpu"]
    larger = [n for n in plan["counts"] if n > running]
    if not larger:
        return None
    fits = running + schedulable_free_workers(cpus, use_gpu)
    for n in (n for n in larger if n <= fits):
        if _can_place(n - running, cpus, use_gpu, timeout_s):
            return n
    return None


def schedulable_free_workers(cpus_per_worker: float, use_gpu: bool) -> int:
    """Workers the alive nodes' currently free resources can hold."""
    import ray

    free = ray.available_resources()
    fit = int(free.get("CPU", 0) // cpus_per_worker + 1e-9)
    return min(fit, int(free.get("GPU", 0))) if use_gpu else fit


def check_grow(plan: dict[str, Any] | None, step: int, committed: tuple[int, str] | None) -> None:
    """On rank 0 at the step after a checkpoint commit: raise `NodesReturned` when a larger
    layout fits again, so kiln restarts there from that checkpoint (nothing recomputed but the
    one step this call interrupts)."""
    if not plan or committed is None or committed[0] != step - 1:
        return
    target = grow_target(plan)
    if target:
        raise NodesReturned(
            f"{GROW_MARK}: {target} workers can be placed again (running {plan['running']}); "
            f"restarting from the checkpoint of step {committed[0]}"
        )


def record_layout_change(run_dir: str, change: dict[str, Any]) -> None:
    """Append one event (time, step resumed from, old/new worker counts, reason) to the run."""
    with open(os.path.join(run_dir, LAYOUT_CHANGES_FILE), "a") as f:
        f.write(json.dumps({"time": time.time(), **change}) + "\n")
    log.warning(
        "layout changed: %d -> %d workers from step %s (%s)",
        change["from_workers"],
        change["to_workers"],
        change.get("resume_step"),
        change["reason"],
    )


def read_layout_changes(run_dir: str) -> list[dict[str, Any]]:
    path = os.path.join(run_dir, LAYOUT_CHANGES_FILE)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
