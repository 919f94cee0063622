"""How a pipeline-parallel layout cuts the model and the batch: stages per rank and
micro-batches per schedule step. Config arithmetic only (no torch), so the driver checks a
layout before any worker starts (kiln.training.preflight) with the same rules the workers use."""

from __future__ import annotations

from kiln.platform.errors import ConfigError


def pipeline_microbatches(cfg) -> int:
    """Micro-batches per schedule step (each trainer micro-batch is split into this many)."""
    return cfg.parallel.pp_microbatches or cfg.parallel.pp


def virtual_stages(p) -> int:
    """Stages per rank: 1 for gpipe/1f1b, 2 for zbv, >= 2 for interleaved_1f1b."""
    virtual = 2 if p.pp_schedule == "zbv" else p.pp_virtual_stages
    if p.pp_schedule in ("gpipe", "1f1b") and virtual != 1:
        raise ConfigError(
            f"parallel.pp_schedule={p.pp_schedule} runs one stage per rank (pp_virtual_stages=1)"
        )
    if p.pp_schedule == "interleaved_1f1b" and virtual < 2:
        virtual = 2
    return virtual
