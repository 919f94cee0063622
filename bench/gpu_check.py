"""The Python half of bench/gpu_check.sh: stage results in one JSON, the no-Ray import check, a
CPU step, and the GPU figures (MFU against the datasheet and the measured GEMM peak).

    python bench/gpu_check.py record OUT.json STAGE ok|failed|skipped [--data JSON]
    python bench/gpu_check.py env                # interpreter, torch and its CUDA version
    python bench/gpu_check.py imports            # kiln.training without Ray
    python bench/gpu_check.py cpu-step           # one tiny training step on CPU
    python bench/gpu_check.py torchrun-config OUT.yaml METRICS.jsonl [--variant offload] [--dry]
    python bench/gpu_check.py torchrun-figures METRICS.jsonl
    python bench/gpu_check.py bench OUT.json [--dry]

`--dry` validates every planned run's config and stops before the first CUDA call.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from typing import Any


def record(path: str, stage: str, status: str, data: dict | None = None) -> None:
    """Merge one stage's result into the JSON file (written after every stage)."""
    results: dict[str, Any] = {}
    if os.path.exists(path):
        with open(path) as f:
            results = json.load(f)
    results.setdefault("stages", {})[stage] = {"status": status, **(data or {})}
    with open(path, "w") as f:
        json.dump(results, f, indent=2)


def env_line() -> str:
    """Interpreter, torch and its CUDA build, read from torch/version.py: importing torch only
    to print its version cost seconds of every run (the imports stage imports it anyway)."""
    import importlib.metadata
    import runpy

    try:
        version_py = importlib.metadata.distribution("torch").locate_file("torch/version.py")
        found = runpy.run_path(str(version_py))
    except (importlib.metadata.PackageNotFoundError, OSError):  # torch without pip metadata
        import torch

        found = {"__version__": torch.__version__, "cuda": torch.version.cuda}
    return f"python {sys.version.split()[0]} torch {found['__version__']} cuda {found['cuda']}"


def check_imports() -> dict[str, Any]:
    """kiln.training's trainer, launcher, checkpoint and planner import with Ray absent."""
    try:
        import ray  # noqa: F401
    except ImportError:
        pass
    else:
        raise SystemExit("ray is importable: the GPU image has no Ray, so this check means nothing")
    import pydantic
    import torch

    import kiln.training.checkpoint  # noqa: F401
    import kiln.training.parallel.parallelize  # noqa: F401
    import kiln.training.plan  # noqa: F401
    import kiln.training.torchrun_main  # noqa: F401
    import kiln.training.trainer  # noqa: F401

    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "pydantic_from": os.path.dirname(pydantic.__file__),
        "flash_attn": importlib.util.find_spec("flash_attn") is not None,
        "transformer_engine": importlib.util.find_spec("transformer_engine") is not None,
        "torch_apis": torch_api_probe(),
    }


# The recent torch pieces the trainer calls (docs/gpu.md lists them with their fallbacks):
# (name, module, attribute, keyword the call passes or None).
TORCH_APIS = [
    (
        "replicate (FSDP2-based DDP)",
        "torch.distributed._composable.replicate_with_fsdp",
        "replicate",
        "ignored_params",
    ),
    ("fully_shard", "torch.distributed.fsdp", "fully_shard", "mp_policy"),
    ("CPUOffloadPolicy", "torch.distributed.fsdp", "CPUOffloadPolicy", None),
    ("DCP DefaultStager", "torch.distributed.checkpoint.staging", "DefaultStager", None),
    ("DCP StagingOptions", "torch.distributed.checkpoint.staging", "StagingOptions", None),
    ("get_total_norm", "torch.nn.utils", "get_total_norm", "foreach"),
    (
        "ScheduleZBVZeroBubble",
        "torch.distributed.pipelining.schedules",
        "ScheduleZBVZeroBubble",
        None,
    ),
    (
        "ScheduleInterleaved1F1B",
        "torch.distributed.pipelining.schedules",
        "ScheduleInterleaved1F1B",
        None,
    ),
    (
        "selective checkpoint",
        "torch.utils.checkpoint",
        "create_selective_checkpoint_contexts",
        None,
    ),
    ("saved_tensors_hooks", "torch.autograd.graph", "saved_tensors_hooks", None),
    ("loss_parallel", "torch.distributed.tensor.parallel", "loss_parallel", None),
    ("DeviceMesh._flatten", "torch.distributed.device_mesh", "DeviceMesh", None),
    ("fake process group", "torch.testing._internal.distributed.fake_pg", "FakeStore", None),
    ("_grouped_mm (MoE experts)", "torch", "_grouped_mm", "offs"),
]


def _has_keyword(obj, keyword: str) -> bool:
    """A Python callable's keyword, or a builtin aten op's schema argument."""
    import inspect

    try:
        return keyword in inspect.signature(obj).parameters
    except ValueError:  # a builtin: read the aten schema (e.g. torch._grouped_mm)
        import torch

        op = getattr(torch.ops.aten, obj.__name__)
        return any(keyword in [a.name for a in o._schema.arguments] for o in _overloads(op))


def _overloads(op):
    return [getattr(op, name) for name in op.overloads()]


def torch_api_probe() -> dict[str, bool]:
    """Which of TORCH_APIS this torch has (with the keyword kiln passes)."""
    import importlib

    found = {}
    for name, module, attr, keyword in TORCH_APIS:
        try:
            obj = getattr(importlib.import_module(module), attr)
            ok = keyword is None or _has_keyword(obj, keyword)
            if name == "DeviceMesh._flatten":
                ok = hasattr(obj, "_flatten")
        except (ImportError, AttributeError, ValueError, TypeError):
            ok = False
        found[name] = ok
    return found


def cpu_step() -> dict[str, Any]:
    """One optimizer step of the tiny preset on CPU, through the Trainer."""
    from kiln.training.config import TrainConfig
    from kiln.training.trainer import Trainer

    cfg = TrainConfig(
        model={"preset": "tiny", "n_layers": 2}, steps=1, device="cpu", log_every=1000
    )
    [metrics] = Trainer(cfg).train()
    return {"loss": metrics["loss"], "precision": "fp32 (auto on CPU)"}


def torchrun_config(dry: bool, variant: str, metrics_file: str) -> dict[str, Any]:
    """One GPU under torchrun (NCCL, FSDP2 bf16 policy): the 1b preset with 8 accumulation
    steps, or with optimizer_offload (FSDP2 CPUOffloadPolicy: needs the process group). Dry: the
    tiny preset on CPU (gloo), one step."""
    if dry:
        return {
            "model": {"preset": "tiny", "n_layers": 2},
            "device": "cpu",
            "steps": 1,
            "seq_len": 64,
            "global_batch_size": 4,
            "micro_batch_size": 2,
            "metrics_file": metrics_file,
        }
    cfg = {
        "model": {"preset": "1b"},
        "device": "cuda",
        "precision": "bf16",
        "seq_len": 2048,
        "micro_batch_size": 2,
        "global_batch_size": 16,  # 8 accumulation steps on one rank
        "steps": 6,
        "optimizer": {"implementation": "fused"},
        "log_every": 1000,
        "metrics_file": metrics_file,
    }
    if variant == "offload":
        cfg.update(optimizer_offload=True, global_batch_size=2, optimizer={})
    return cfg


def torchrun_figures(metrics_file: str) -> dict[str, Any]:
    """Median tokens/s, step time and MFU of the steps after the first (warm-up)."""
    with open(metrics_file) as f:
        steps = [json.loads(line) for line in f if line.strip()]
    steady = steps[1:] or steps
    mid = len(steady) // 2

    def median(key):
        values = sorted(m[key] for m in steady if m.get(key) is not None)
        return values[len(values) // 2] if values else None

    return {
        "steps": len(steps),
        "tokens_per_s": median("tokens_per_s"),
        "step_time_s": median("step_time_s"),
        "mfu_vs_datasheet": median("mfu"),
        "loss": steady[mid]["loss"],
    }


def planned_runs() -> list[tuple[str, dict[str, Any]]]:
    """(name, TrainConfig fields) of every single-process GPU measurement."""
    base = {"seq_len": 2048, "micro_batch_size": 4, "global_batch_size": 4}
    slice_8b = {
        "model": {"preset": "llama3_8b", "n_layers": 4, "max_seq_len": 8192},
        "seq_len": 8192,
        "micro_batch_size": 1,
        "global_batch_size": 1,
        "recompute": "selective",
    }
    window = {"preset": "1b", "sliding_window": 1024}
    return [
        ("1b_bf16", {"model": {"preset": "1b"}, "precision": "bf16", **base}),
        ("1b_bf16_accum8", {**base, "model": {"preset": "1b"}, "global_batch_size": 32}),
        ("8b_slice_bf16", {**slice_8b, "precision": "bf16"}),
        ("1b_activation_offload", {"model": {"preset": "1b"}, **base, "activation_offload": True}),
        ("1b_fp8", {"model": {"preset": "1b"}, "precision": "fp8", **base}),
        *(
            (f"1b_{backend}_window", {"model": {**window, "attention_backend": backend}, **base})
            for backend in ("flash_attn", "te")
        ),
    ]


def _config(fields: dict[str, Any], steps: int):
    from kiln.training.config import TrainConfig

    return TrainConfig.model_validate(
        {
            "device": "cuda",
            "steps": steps,
            "log_every": 1000,
            "optimizer": {"implementation": "fused"},
            **fields,
        }
    )


def bench(out_path: str, dry: bool) -> int:
    """Every planned run validated; on a GPU, measured (errors recorded per run, exit 1 on any)."""
    runs = [(name, _config(fields, steps=13)) for name, fields in planned_runs()]
    if dry:
        record(out_path, "bench", "skipped", {"planned": [n for n, _ in runs], "dry": True})
        print(f"dry: {len(runs)} run configs valid; stopping before the first CUDA call")
        return 0
    import torch

    from kiln.training.metrics import device_peak_flops

    peak = device_peak_flops("bf16")
    figures: dict[str, Any] = {
        "device": torch.cuda.get_device_name(),
        "datasheet_bf16_tflops": peak / 1e12 if peak else None,
        "measured_gemm_bf16_tflops": _gemm_peak() / 1e12,
    }
    status = 0
    for name, cfg in runs:
        needs = {"flash_attn": "flash_attn", "te": "transformer_engine"}
        package = needs.get(cfg.model.attention_backend)
        if cfg.precision == "fp8":
            package = "transformer_engine"
        if package and not importlib.util.find_spec(package):
            figures[name] = {"skipped": f"no {package}"}
            continue
        try:
            figures[name] = _measure(cfg, peak)
        except Exception as exc:  # one failing run must not hide the others' figures
            figures[name] = {"error": f"{type(exc).__name__}: {exc}"}
            status = 1
        print(name, figures[name], flush=True)
        record(out_path, "bench", "running", figures)
    record(out_path, "bench", "ok" if status == 0 else "failed", figures)
    return status


def _gemm_peak(n: int = 8192, iters: int = 50) -> float:
    """The best bf16 FLOP/s this GPU does on large square matmuls (a separate figure)."""
    import torch

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


def _measure(cfg, peak: float | None, warmup: int = 3) -> dict[str, Any]:
    import torch

    from kiln.training.trainer import Trainer

    trainer = Trainer(cfg).setup()
    for _ in range(warmup):
        trainer.train_step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    metrics = [trainer.train_step() for _ in range(cfg.steps - warmup)]
    tokens_per_s = sorted(m["tokens_per_s"] for m in metrics)[len(metrics) // 2]
    out = {
        "tokens_per_s": tokens_per_s,
        "step_time_s": sorted(m["step_time_s"] for m in metrics)[len(metrics) // 2],
        "mfu_vs_datasheet_bf16": trainer.flops_per_token * tokens_per_s / peak if peak else None,
        "peak_mem_gb": torch.cuda.max_memory_allocated() / 1e9,
        "loss": metrics[-1]["loss"],
    }
    del trainer
    torch.cuda.empty_cache()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/gpu_check.py")
    sub = parser.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("path")
    rec.add_argument("stage")
    rec.add_argument("status", choices=["ok", "failed", "skipped"])
    rec.add_argument("--data", default="{}")
    sub.add_parser("env")
    sub.add_parser("imports")
    sub.add_parser("cpu-step")
    trc = sub.add_parser("torchrun-config")
    trc.add_argument("path")
    trc.add_argument("metrics_file")
    trc.add_argument("--variant", choices=["accum8", "offload"], default="accum8")
    trc.add_argument("--dry", action="store_true")
    trf = sub.add_parser("torchrun-figures")
    trf.add_argument("metrics_file")
    ben = sub.add_parser("bench")
    ben.add_argument("path")
    ben.add_argument("--dry", action="store_true")
    args = parser.parse_args(argv)
    if args.cmd == "record":
        record(args.path, args.stage, args.status, json.loads(args.data))
    elif args.cmd == "env":
        print(env_line())
    elif args.cmd == "imports":
        found = check_imports()
        print(json.dumps(found))
        missing = [name for name, ok in found["torch_apis"].items() if not ok]
        if missing:
            print("torch lacks:", ", ".join(missing), "(docs/gpu.md: fallbacks)", file=sys.stderr)
    elif args.cmd == "cpu-step":
        print(json.dumps(cpu_step()))
    elif args.cmd == "torchrun-config":
        cfg = torchrun_config(args.dry, args.variant, args.metrics_file)
        with open(args.path, "w") as f:
            json.dump(cfg, f)  # JSON is YAML: torchrun_main reads either
    elif args.cmd == "torchrun-figures":
        print(json.dumps(torchrun_figures(args.metrics_file)))
    else:
        return bench(args.path, args.dry)
    return 0


if __name__ == "__main__":
    sys.exit(main())
