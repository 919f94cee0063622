"""Kiln's training step against a plain single-process PyTorch loop: same model, batch, optimizer.

Both sides do the same work per step (forward, cross entropy, backward, grad-norm clip, AdamW,
lr schedule, loss to Python for logging); the difference is the trainer's bookkeeping: its loop
(`Trainer.train`: progress line and ETA) and, as rank 0 does on Ray Train, the local metrics
writer (a JSON line and TensorBoard scalars per step). Runs alternate A/B/A/B and report
medians, so load from other processes hits both sides alike.

A second table sets kiln's speed options (chunked cross entropy, fused projections, both)
against kiln's plain path on the same batch: tokens/s and the step's peak tensor memory (torch's
MemTracker over one step: parameters, gradients, optimizer state, activations and temporaries)
and the ratios of both.

    .venv/bin/python bench/trainer_overhead.py [--steps 10] [--rounds 3] [--threads 1]
        [--dim 128 --layers 2 --seq 128 --batch 4] [--vocab 8192] [--loss-chunk 1024]
        [--options "chunked CE,fused proj,fused+chunked"] [--no-overhead]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch
import torch.nn.functional as F
from torch.distributed._tools.mem_tracker import MemTracker

from kiln.model import ModelConfig, Transformer
from kiln.training.config import TrainConfig
from kiln.training.metrics_log import MetricsWriter
from kiln.training.trainer import Trainer


class SameBatch:
    def __init__(self, batch):
        self.batch = batch

    def __iter__(self):
        while True:
            yield self.batch

    def state_dict(self):
        return {}


def plain_loop(model_cfg: ModelConfig, batch, steps: int, precision: str) -> float:
    """tokens/s of a hand-written loop."""
    torch.manual_seed(0)
    model = Transformer(model_cfg)
    opt = torch.optim.AdamW(
        model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, foreach=True
    )
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    tokens, labels = batch
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")

    def step():
        opt.zero_grad(set_to_none=True)
        with autocast:
            logits = model(tokens)
            loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        return loss.item()

    step()  # warm-up
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return steps * tokens.numel() / (time.perf_counter() - start)


def kiln_config(model_cfg: ModelConfig, batch, steps: int, precision: str, **options):
    tokens, _ = batch
    model = options.pop("model", {})  # model options (fused_projections) over the shape
    return TrainConfig(
        model=model_cfg.model_copy(update=model),
        seq_len=tokens.shape[1],
        global_batch_size=tokens.shape[0],
        micro_batch_size=tokens.shape[0],
        steps=steps + 1,
        precision=precision,
        schedule={"kind": "constant"},
        optimizer={"implementation": "foreach"},
        **options,
    )


def kiln_loop(model_cfg: ModelConfig, batch, steps: int, precision: str, **options) -> float:
    """tokens/s of Trainer.train (its loop and a metrics writer per step) on the same batch."""
    cfg = kiln_config(model_cfg, batch, steps, precision, **options)
    with tempfile.TemporaryDirectory() as run_dir:
        writer = MetricsWriter(run_dir)
        trainer = Trainer(cfg, on_step=writer.write, dataloader=SameBatch(batch)).setup()
        trainer.train_step()  # warm-up
        start = time.perf_counter()
        trainer.train()  # the remaining `steps` steps
        elapsed = time.perf_counter() - start
        writer.close()
    return steps * batch[0].numel() / elapsed


def kiln_peak_bytes(model_cfg: ModelConfig, batch, precision: str, **options) -> int:
    """Peak tensor bytes of one Trainer step after a warm-up step (optimizer state exists)."""
    cfg = kiln_config(model_cfg, batch, 1, precision, **options)
    trainer = Trainer(cfg, dataloader=SameBatch(batch)).setup()
    trainer.train_step()
    tracker = MemTracker()
    tracker.track_external(*trainer.model_parts, *trainer.optimizers)
    with tracker:
        trainer.train_step()
    return sum(sum(kinds.values()) for kinds in tracker.get_tracker_snapshot("peak").values())


def options_table(model_cfg: ModelConfig, batch, args) -> None:
    """Each speed option against kiln's plain path: tokens/s, peak memory, and their ratios."""
    chunked = {"loss_chunk_tokens": args.loss_chunk}
    fused = {"model": {"fused_projections": True}}
    variants = {"chunked CE": chunked, "fused proj": fused, "fused+chunked": {**chunked, **fused}}
    variants = {k: v for k, v in variants.items() if k in args.options.split(",")}
    print(
        f"\n{'precision':<10}{'option':<14}{'plain tok/s':>12}{'option tok/s':>13}{'ratio':>7}"
        f"{'plain MiB':>11}{'option MiB':>11}{'ratio':>7}  load before/after"
    )
    for precision in ("fp32", "bf16"):
        for name, options in variants.items():
            before = _load()
            plain, ours = [], []
            for _ in range(args.rounds):
                plain.append(kiln_loop(model_cfg, batch, args.steps, precision))
                ours.append(kiln_loop(model_cfg, batch, args.steps, precision, **options))
            p, o = statistics.median(plain), statistics.median(ours)
            mp = kiln_peak_bytes(model_cfg, batch, precision) / 2**20
            mo = kiln_peak_bytes(model_cfg, batch, precision, **options) / 2**20
            print(
                f"{precision:<10}{name:<14}{p:>12.0f}{o:>13.0f}{o / p:>7.2f}"
                f"{mp:>11.1f}{mo:>11.1f}{mo / mp:>7.2f}  {before}/{_load()}"
            )


def _load() -> str:
    """The 1-minute load average: other work on the machine moves the wall-clock figures."""
    return f"{os.getloadavg()[0]:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--loss-chunk", type=int, default=1024, help="loss_chunk_tokens")
    parser.add_argument(
        "--options",
        default="chunked CE,fused proj,fused+chunked",
        help="comma-separated rows of the options table",
    )
    parser.add_argument(
        "--no-overhead", action="store_true", help="only the options table, not the plain loop"
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (1: steadier on a shared box)"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    model_cfg = ModelConfig(
        vocab_size=args.vocab,
        dim=args.dim,
        n_layers=args.layers,
        n_heads=args.dim // 64,
        n_kv_heads=max(1, args.dim // 128),
        ffn_hidden_dim=args.dim * 8 // 3 // 64 * 64,
        max_seq_len=args.seq,
    )
    g = torch.Generator().manual_seed(0)
    sample = torch.randint(0, model_cfg.vocab_size, (args.batch, args.seq + 1), generator=g)
    batch = (sample[:, :-1].contiguous(), sample[:, 1:].contiguous())
    print(
        f"model: {model_cfg.num_params() / 1e6:.1f}M params, batch {args.batch}x{args.seq}, "
        f"{args.steps} steps x {args.rounds} rounds, {torch.get_num_threads()} threads, "
        f"{os.cpu_count()} cores"
    )
    if not args.no_overhead:
        overhead_table(model_cfg, batch, args)
    options_table(model_cfg, batch, args)


def overhead_table(model_cfg: ModelConfig, batch, args) -> None:
    """Kiln's Trainer against the hand-written loop: tokens/s and the overhead."""
    print(f"{'precision':<10}{'plain tok/s':>14}{'kiln tok/s':>14}{'overhead':>10}  load")
    for precision in ("fp32", "bf16"):
        before = _load()
        plain, kiln = [], []
        for _ in range(args.rounds):
            plain.append(plain_loop(model_cfg, batch, args.steps, precision))
            kiln.append(kiln_loop(model_cfg, batch, args.steps, precision))
        p, k = statistics.median(plain), statistics.median(kiln)
        print(f"{precision:<10}{p:>14.0f}{k:>14.0f}{100 * (p - k) / p:>9.1f}%  {before}/{_load()}")


if __name__ == "__main__":
    main()
