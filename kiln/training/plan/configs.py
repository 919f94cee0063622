"""The train configs a spec names, their world size, and the config as one CPU can build it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from kiln.platform.config import load_config, read_yaml
from kiln.platform.spec import load_pipeline
from kiln.training.config import TrainConfig
from kiln.training.parallel.dims import ParallelDims
from kiln.training.precision import check_fp8_layout

if TYPE_CHECKING:
    from kiln.training.config import TrainConfig


def world_size_of(cfg: TrainConfig) -> int:
    """The world size a layout names (dp_shard=-1 counts as 1)."""

    return ParallelDims.from_config(cfg.parallel).world_size


def train_configs(path: str, overrides: list[str] = ()) -> list[tuple[str, TrainConfig]]:
    """(name, TrainConfig) for each train stage of a pipeline spec, or the one TrainConfig file;
    `overrides` are `kiln run`'s (`STAGE.FIELD=VALUE`) or `kiln train`'s (`FIELD=VALUE`)."""

    raw = read_yaml(path) or {}
    if isinstance(raw, dict) and "stages" in raw:
        stages = load_pipeline(path, overrides).stages
        return [(s.name, s.config.train_config()) for s in stages if s.type_name == "train"]

    return [(Path(path).stem, load_config(TrainConfig, path, block="train", overrides=overrides))]


def cpu_stand_in(cfg: TrainConfig, shrink: bool = False) -> TrainConfig:
    """The config as this CPU can build it: SDPA attention, bf16 for fp8, no checkpoint I/O.

    Layout rules of the hardware-only choices are still checked (fp8's, here). `shrink` keeps
    the heads, KV heads and stage count but makes every matrix small (a quick layout check)."""
    if cfg.precision == "fp8":
        check_fp8_layout(cfg)
    model = cfg.model.model_copy(update={"attention_backend": "sdpa"})
    if shrink:
        p = cfg.parallel
        stages = p.pp * (2 if p.pp_schedule == "zbv" else max(p.pp_virtual_stages, 1))
        head_dim = 8
        model = model.model_copy(
            update={
                "n_layers": max(stages, 1),
                "dim": model.n_heads * head_dim,
                "ffn_hidden_dim": 2 * model.n_heads * head_dim,
                # a smaller vocabulary with the same remainder mod 8192 (so mod any power-of-2 tp)
                "vocab_size": min(model.vocab_size, 8192 + model.vocab_size % 8192),
            }
        )
    return cfg.model_copy(
        update={
            "model": model,
            "device": "cpu",
            "precision": "bf16" if cfg.precision in ("fp8", "auto") else cfg.precision,
            "checkpoint": cfg.checkpoint.model_copy(
                update={"dir": None, "load_from": None, "init_from": None}
            ),
        }
    )
