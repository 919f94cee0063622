"""Build a training config's model and layout as rank R of a real-size job, on one CPU.

PyTorch's fake process-group backend stands in for the other ranks (collectives return at once),
so `Trainer.setup()` runs the same mesh, pipeline carving, TP/FSDP sharding, batch arithmetic and
config checks a 32- or 512-rank job runs, and fails with the same one-line error.

    kiln plan kiln/pipelines/pretrain_gpt.yaml --ranks 0,31
    python -m kiln.training.plan kiln/pipelines/pretrain_gpt.yaml    # the same

The shape is shrunk by default (`--full` keeps it): the same heads and KV heads, enough layers
for every pipeline stage, a small head and FFN, and a vocabulary with the same remainder mod 8192,
so the build fits a laptop until the trainer builds on the meta device. Hardware-only choices
(flash-attn, TE fp8) become SDPA / bf16 here.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kiln.training.config import TrainConfig


def world_size_of(cfg: TrainConfig) -> int:
    """The world size a layout names (dp_shard=-1 counts as 1)."""
    from kiln.training.parallel.dims import ParallelDims

    return ParallelDims.from_config(cfg.parallel).world_size


def train_configs(path: str) -> list[tuple[str, TrainConfig]]:
    """(name, TrainConfig) for each train stage of a pipeline spec, or the one TrainConfig file."""
    from kiln.platform.config import read_yaml

    raw = read_yaml(path) or {}
    if isinstance(raw, dict) and "stages" in raw:
        from kiln.platform.spec import load_pipeline

        stages = load_pipeline(path).stages
        return [(s.name, s.config.train_config()) for s in stages if s.type_name == "train"]
    from kiln.training.torchrun_main import load_config

    return [(Path(path).stem, load_config(path))]


def cpu_stand_in(cfg: TrainConfig, shrink: bool = True) -> TrainConfig:
    """The config as this CPU can build it: SDPA attention, bf16 for fp8, no checkpoint I/O.

    Layout rules of the hardware-only choices are still checked (fp8's, here)."""
    if cfg.precision == "fp8":
        from kiln.training.precision import check_fp8_layout

        check_fp8_layout(cfg.parallel)
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
            "precision": "bf16" if cfg.precision == "fp8" else cfg.precision,
            "checkpoint": cfg.checkpoint.model_copy(
                update={"dir": None, "load_from": None, "init_from": None}
            ),
        }
    )


def plan_rank(cfg: TrainConfig, rank: int, world: int) -> dict[str, Any]:
    """Set up rank `rank` of `world` on the fake backend; its local parameters and batch figures."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from kiln.training.trainer import Trainer

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        trainer = Trainer(cfg).setup()
        shards = [
            p.to_local() if hasattr(p, "to_local") else p
            for part in trainer.model_parts
            for p in part.parameters()
        ]
        local = sum(t.numel() for t in shards)
        param_bytes = sum(t.numel() * t.element_size() for t in shards)
        return {
            "rank": rank,
            "world": world,
            "local_params": local,
            "grad_accum": trainer.grad_accum,
            "tokens_per_step": cfg.global_batch_size * cfg.seq_len,
            "model_parts": len(trainer.model_parts),
            # sharded fp32 master weights + gradients + AdamW's two moments; activations and the
            # all-gathered bf16 compute copies come on top
            "states_gb": round(4 * param_bytes / 1e9, 3),
        }
    finally:
        dist.destroy_process_group()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("specs", nargs="+", help="pipeline specs or TrainConfig YAMLs")
    parser.add_argument("--world", type=int, help="world size (default: the layout's product)")
    parser.add_argument("--ranks", default="0,-1", help="ranks to build (-1: the last)")
    parser.add_argument("--full", action="store_true", help="the configured shape, not shrunk")


def run(args: argparse.Namespace) -> int:
    """Print one line per planned rank; a KilnError propagates as the real run's one-liner."""
    for name, cfg in (c for spec in args.specs for c in train_configs(spec)):
        world = args.world or world_size_of(cfg)
        stand_in = cpu_stand_in(cfg, shrink=not args.full)
        for r in (int(x) for x in args.ranks.split(",")):
            info = plan_rank(stand_in, r % world, world)
            print(f"{name}: " + " ".join(f"{k}={v}" for k, v in info.items()), flush=True)
    return 0


def register(subparsers) -> None:
    """`kiln plan`: build a layout as chosen ranks of its real world size on fake ranks."""
    p = subparsers.add_parser(
        "plan", help="build a training layout as any rank of its world size, on one CPU"
    )
    add_arguments(p)
    p.set_defaults(func=run)


def main(argv: list[str] | None = None) -> int:
    from kiln.platform.errors import KilnError

    parser = argparse.ArgumentParser(prog="python -m kiln.training.plan")
    add_arguments(parser)
    try:
        return run(parser.parse_args(argv))
    except KilnError as exc:
        print(f"kiln: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
