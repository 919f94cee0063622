"""gpu_check's parity stage, run under `torchrun --nproc-per-node 1`: the same first step three ways
on the same weights and batch, whose loss and grad norm must agree (gpu_gate.PARITY_RTOL).

  single     one process, no process group (the trainer's autocast / plain path)
  replicate  the process group at world 1: FSDP2's replicate, as a data-parallel run
  shard      fully_shard at world 1 (the trainer shards at world 1 under optimizer_offload;
             FSDP2's all-gather, reduce-scatter and CPU offload all run)

fp32 at full precision (TF32 off after the trainer's setup turns it on), so only a difference in
what is computed can exceed the tolerance: a wrong reduction, a doubled gradient, a dropped
micro-batch, or other weights (the first H200 run's shard path was initialised on the CPU
generator: 0.4% off in grad norm). Two accumulation micro-batches, so the gradient-sync toggling
between them is in the path. `--tf32` keeps TF32 matmuls.

    python -m torch.distributed.run --standalone --nproc-per-node 1 \\
        bench/gpu_check_parity.py OUT.json [--dry] [--tf32]

Rank 0 records the `parity` stage; exit 1 when the paths disagree or a value is not finite.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gpu_check import record  # noqa: E402
from gpu_gate import GateFailure, check_finite, check_parity  # noqa: E402

from kiln.training.config import TrainConfig  # noqa: E402
from kiln.training.launch import init_process_group_from_env  # noqa: E402
from kiln.training.trainer import Trainer  # noqa: E402


def parity_config(dry: bool, **update: Any) -> TrainConfig:
    """A 4-layer 1b-wide model on CUDA (the tiny preset on CPU), fp32, no compile: one step."""
    if dry:
        fields = {"model": {"preset": "tiny", "n_layers": 2}, "device": "cpu", "seq_len": 64}
    else:
        fields = {"model": {"preset": "1b", "n_layers": 4}, "device": "cuda", "seq_len": 1024}
    fields.update(
        precision="fp32",
        micro_batch_size=2,
        global_batch_size=4,  # two accumulation micro-batches at world 1
        steps=1,
        log_every=1000,
        parallel={"compile": False},
        **update,
    )
    return TrainConfig.model_validate(fields)


def batches(cfg: TrainConfig):
    """The same two micro-batches for every path."""
    g = torch.Generator().manual_seed(1)
    shape = (cfg.micro_batch_size, cfg.seq_len + 1)
    pairs = []
    for _ in range(2):
        tokens = torch.randint(0, cfg.model.vocab_size, shape, generator=g)
        pairs.append((tokens[:, :-1], tokens[:, 1:]))
    return itertools.cycle(pairs)


def first_step(cfg: TrainConfig, tf32: bool = False) -> dict[str, float]:
    trainer = Trainer(cfg, dataloader=batches(cfg)).setup()
    if not tf32:
        torch.set_float32_matmul_precision("highest")
    metrics = trainer.train_step()
    check_finite(metrics)
    result = {"loss": metrics["loss"], "grad_norm": metrics["grad_norm"]}
    del trainer
    if cfg.device == "cuda":
        torch.cuda.empty_cache()
    return result


def run(dry: bool, tf32: bool = False) -> dict[str, Any]:
    cfg = parity_config(dry)
    found: dict[str, Any] = {"single": first_step(cfg, tf32), "tf32": tf32}
    sharded = parity_config(dry, optimizer_offload=True)
    init_process_group_from_env(cfg.device, optimizer_offload=True)
    try:
        found["replicate"] = first_step(cfg, tf32)
        found["shard"] = first_step(sharded, tf32)
    finally:
        dist.destroy_process_group()
    for path in ("replicate", "shard"):
        check_parity(path, found["single"], found[path])
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/gpu_check_parity.py")
    parser.add_argument("path")
    parser.add_argument("--dry", action="store_true")
    parser.add_argument("--tf32", action="store_true", help="keep TF32 matmuls (diagnosis)")
    args = parser.parse_args(argv)
    rank0 = int(os.environ.get("RANK", "0")) == 0
    try:
        found = run(args.dry, args.tf32)
    except GateFailure as exc:
        if rank0:
            record(args.path, "parity", "failed", {"failed": str(exc)})
        print(f"parity failed: {exc}", file=sys.stderr)
        return 1
    if rank0:
        record(args.path, "parity", "ok", found)
        print(json.dumps(found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
