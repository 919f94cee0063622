"""gpu_check's training stages, in one process: `bench` (MFU per row against its floor) and
`learn` (step-0 loss as expected, a repeated batch is learnt). Every step's loss and grad norm
must be finite and attention must run on a fused kernel (see `fused_attention_only`).

    python bench/gpu_check_train.py bench OUT.json [--dry]
    python bench/gpu_check_train.py learn OUT.json [--dry]

`--dry` (CPU): every bench row's config validated and one tiny CPU row measured through the same
code; `learn` on the tiny preset, with the same rules. Exit 1 when a rule fails.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import itertools
import json
import os
import sys
import time
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gpu_check import record  # noqa: E402
from gpu_gate import (  # noqa: E402
    GateFailure,
    check_finite,
    check_initial_loss,
    check_learns,
    check_mfu,
)

from kiln.model.transformer import BASE_STD  # noqa: E402
from kiln.training.config import TrainConfig  # noqa: E402
from kiln.training.metrics import device_peak_flops  # noqa: E402
from kiln.training.trainer import Trainer  # noqa: E402

# cuDNN and FlashAttention-2 are SDPA's fast kernels on Hopper; without the math kernel in the
# list a silent fallback (an unsupported mask, dtype or GQA layout) raises instead of running
# at a fraction of the speed. On CPU the fused (flash) CPU kernel plays their part.
FUSED_KERNELS = {
    "cuda": [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION],
    "cpu": [SDPBackend.FLASH_ATTENTION],
}

# Rows the image cannot run (no Transformer Engine, no flash-attn): listed as unmeasured. The
# torchao fp8 rows are not here: torchao is a carried wheel, so its absence fails the row.
NEEDS_PACKAGE = {"1b_fp8_te": "transformer_engine", "1b_flash_attn_window": "flash_attn"}
NEEDS_PACKAGE["1b_te_window"] = "transformer_engine"

LEARN_STEPS = {"cuda": 25, "cpu": 10}


def seconds_left() -> float:
    """Until the stage's end (KILN_GPU_DEADLINE, epoch seconds, set by gpu_check.sh from the
    stage's limit, itself cut to the global deadline); inf without."""
    deadline = os.environ.get("KILN_GPU_DEADLINE")
    return float("inf") if deadline is None else float(deadline) - time.time()


@contextlib.contextmanager
def fused_attention_only(device: str, kernels=None):
    """SDPA restricted to the fused kernels: a fall to the math kernel is a GateFailure."""
    with sdpa_kernel(kernels if kernels is not None else FUSED_KERNELS[device]):
        try:
            yield
        except RuntimeError as exc:
            if "No viable backend for scaled_dot_product_attention" in str(exc):
                raise GateFailure(
                    f"attention has no fused kernel here (math fallback): {exc}"
                ) from exc
            raise


def planned_runs() -> list[tuple[str, dict[str, Any]]]:
    """(row, TrainConfig fields) of every single-process GPU measurement, most valuable first.
    `parallel.compile` is left to its CUDA default (on) except in the `_eager` rows."""
    base = {"seq_len": 2048, "micro_batch_size": 4, "global_batch_size": 4}
    slice_8b = {
        "model": {"preset": "llama3_8b", "n_layers": 4, "max_seq_len": 8192},
        "seq_len": 8192,
        "micro_batch_size": 1,
        "global_batch_size": 1,
        "recompute": "selective",
    }
    eager = {"parallel": {"compile": False}}
    window = {"preset": "1b", "sliding_window": 1024}
    return [
        ("1b_bf16", {"model": {"preset": "1b"}, "precision": "bf16", **base}),
        ("8b_slice_bf16", {**slice_8b, "precision": "bf16"}),
        ("1b_bf16_eager", {"model": {"preset": "1b"}, "precision": "bf16", **base, **eager}),
        ("8b_slice_bf16_eager", {**slice_8b, "precision": "bf16", **eager}),
        ("1b_bf16_accum8", {**base, "model": {"preset": "1b"}, "global_batch_size": 32}),
        ("1b_activation_offload", {"model": {"preset": "1b"}, **base, "activation_offload": True}),
        # fp8 without Transformer Engine: torchao's Float8Linear (tensorwise), compiled
        ("8b_slice_fp8", {**slice_8b, "precision": "fp8"}),
        ("1b_fp8", {"model": {"preset": "1b"}, "precision": "fp8", **base}),
        ("1b_fp8_te", {"model": {"preset": "1b"}, "precision": "fp8", "fp8_backend": "te", **base}),
        *(
            (f"1b_{backend}_window", {"model": {**window, "attention_backend": backend}, **base})
            for backend in ("flash_attn", "te")
        ),
    ]


def train_config(fields: dict[str, Any], steps: int, device: str = "cuda") -> TrainConfig:
    return TrainConfig.model_validate(
        {
            "device": device,
            "steps": steps,
            "log_every": 1000,
            "schedule": {"kind": "constant"},
            "optimizer": {"implementation": "fused"} if device == "cuda" else {},
            **fields,
        }
    )


def repeated_batch(cfg: TrainConfig, seed: int = 0, period: int = 64):
    """One micro-batch, forever: each row a cycle of `period` distinct random tokens (a shifted
    copy per row). At init its loss is the expected one, as for any tokens; a working backward
    learns the cycle's successor table in a few steps, where a batch of uniform tokens would only
    teach which tokens occur (11.8 -> ~9 nats for the 1b preset: no margin to test)."""
    g = torch.Generator().manual_seed(seed)
    cycle = torch.randperm(cfg.model.vocab_size, generator=g)[: min(period, cfg.model.vocab_size)]
    reps = (cfg.seq_len + 1) // len(cycle) + 2
    rows = [cycle.roll(-row).repeat(reps)[: cfg.seq_len + 1] for row in range(cfg.micro_batch_size)]
    tokens = torch.stack(rows)
    return itertools.repeat((tokens[:, :-1], tokens[:, 1:]))


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def measure(cfg: TrainConfig, peak: float | None, warmup: int = 3) -> dict[str, Any]:
    """Steady-state figures of one row, every step checked (finite, step 0 as expected, fused
    attention); raises GateFailure on a rule. The MFU floor is the caller's (figures kept)."""
    device = torch.device(cfg.device).type
    with fused_attention_only(device):
        trainer = Trainer(cfg).setup()
        compiled = trainer.cfg.parallel.compile
        start = time.perf_counter()
        first = trainer.train_step()
        _sync(device)
        first_step_s = time.perf_counter() - start
        check_finite(first)
        check_initial_loss(first["loss"], cfg.model.vocab_size, cfg.model.dim, BASE_STD)
        for _ in range(warmup - 1):
            check_finite(trainer.train_step())
        _sync(device)
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        metrics = [trainer.train_step() for _ in range(cfg.steps - warmup)]
    for m in metrics:
        check_finite(m)
    tokens_per_s = sorted(m["tokens_per_s"] for m in metrics)[len(metrics) // 2]
    step_time_s = sorted(m["step_time_s"] for m in metrics)[len(metrics) // 2]
    out = {
        "tokens_per_s": tokens_per_s,
        "step_time_s": step_time_s,
        "first_step_s": first_step_s,
        # the first step's excess over a steady one: torch.compile's time when compiled
        "compile_s": max(first_step_s - step_time_s, 0.0) if compiled else None,
        "mfu_vs_datasheet_bf16": trainer.flops_per_token * tokens_per_s / peak if peak else None,
        "peak_mem_gb": torch.cuda.max_memory_allocated() / 1e9 if device == "cuda" else None,
        "loss": metrics[-1]["loss"],
    }
    del trainer
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


def bench(out_path: str, dry: bool) -> int:
    """Every row measured in order while time is left; a failed rule fails the stage."""
    runs = [(row, train_config(fields, steps=13)) for row, fields in planned_runs()]
    figures: dict[str, Any] = {"floors": "bench/gpu_gate.py MFU_FLOORS"}
    if dry:
        # the same code on a tiny CPU row; everything after it needs CUDA
        tiny = train_config({"model": {"preset": "tiny"}, "seq_len": 64}, steps=4, device="cpu")
        figures["tiny_cpu"] = measure(tiny, peak=None)
        figures.update(planned=[row for row, _ in runs], dry=True)
        record(out_path, "bench", "ok", figures)
        print(f"dry: {len(runs)} row configs valid, tiny CPU row measured; stopping at CUDA")
        return 0
    peak = device_peak_flops("bf16")
    figures.update(
        device=torch.cuda.get_device_name(),
        datasheet_bf16_tflops=peak / 1e12 if peak else None,
        measured_gemm_bf16_tflops=gemm_peak() / 1e12,
    )
    status = 0
    for row, cfg in runs:
        package = NEEDS_PACKAGE.get(row)
        if package and not importlib.util.find_spec(package):
            figures[row] = {"unmeasured": f"no {package} on this image"}
            continue
        if seconds_left() < 45:
            figures[row] = {"unmeasured": "deadline"}
            status = 1
            continue
        try:
            figures[row] = measure(cfg, peak)
            check_mfu(row, figures[row]["mfu_vs_datasheet_bf16"])
        except GateFailure as exc:
            figures[row] = {**figures.get(row, {}), "failed": str(exc)}
            status = 1
        except Exception as exc:  # one broken row must not hide the others' figures
            figures[row] = {"error": f"{type(exc).__name__}: {exc}"}
            status = 1
        gc.collect()  # a failed row's trainer (held by its traceback) frees its memory
        torch.cuda.empty_cache()
        print(row, figures[row], flush=True)
        record(out_path, "bench", "running", figures)
    record(out_path, "bench", "ok" if status == 0 else "failed", figures)
    return status


def gemm_peak(n: int = 8192, iters: int = 50) -> float:
    """The best bf16 FLOP/s this GPU does on large square matmuls (a separate figure)."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(5):
        a @ b
    torch.cuda.synchronize()
    best = 0.0
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(iters):
            a @ b
        torch.cuda.synchronize()
        best = max(best, 2 * n**3 * iters / (time.perf_counter() - start))
    return best


def learn_config(dry: bool, lr: float | None = None) -> TrainConfig:
    """The 1b preset (tiny on CPU) on one repeated micro-batch at a constant learning rate:
    5e-4 for the 1b preset (Adam moves a 2048-wide model's logits ~30x further per step than
    the tiny preset's 64-wide one), 3e-3 for tiny (0.62x its first loss in 10 steps)."""
    if dry:
        fields = {"model": {"preset": "tiny"}, "seq_len": 64, "micro_batch_size": 4}
        lr = 3e-3 if lr is None else lr
    else:
        fields = {"model": {"preset": "1b"}, "precision": "bf16", "seq_len": 2048}
        fields["micro_batch_size"] = 4
        lr = 5e-4 if lr is None else lr
    fields["global_batch_size"] = fields["micro_batch_size"]
    fields["optimizer"] = {"lr": lr, "weight_decay": 0.0}
    device = "cpu" if dry else "cuda"
    return train_config(fields, steps=LEARN_STEPS[device], device=device)


def learn(cfg: TrainConfig) -> dict[str, Any]:
    """The repeated batch: finite steps, step 0 as expected, the loss falls by the margin."""
    device = torch.device(cfg.device).type
    with fused_attention_only(device):
        trainer = Trainer(cfg, dataloader=repeated_batch(cfg)).setup()
        history = []
        for _ in range(cfg.steps):
            history.append(trainer.train_step())
            check_finite(history[-1])
    losses = [m["loss"] for m in history]
    check_initial_loss(losses[0], cfg.model.vocab_size, cfg.model.dim, BASE_STD)
    check_learns(losses)
    return {"steps": len(losses), "first_loss": losses[0], "last_loss": losses[-1]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/gpu_check_train.py")
    parser.add_argument("stage", choices=["bench", "learn"])
    parser.add_argument("path")
    parser.add_argument("--dry", action="store_true")
    args = parser.parse_args(argv)
    if args.stage == "bench":
        return bench(args.path, args.dry)
    try:
        result = learn(learn_config(args.dry))
    except GateFailure as exc:
        record(args.path, "learn", "failed", {"failed": str(exc)})
        print(f"learn failed: {exc}", file=sys.stderr)
        return 1
    record(args.path, "learn", "ok", result)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
