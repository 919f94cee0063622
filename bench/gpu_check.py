"""The Python half of bench/gpu_check.sh that needs no kiln: stage results in one JSON, the
environment line, the no-Ray import check with its torch API probe, and the torchrun stage's
config and figures (the training stages are gpu_check_train.py and gpu_check_parity.py).

    python bench/gpu_check.py record OUT.json STAGE ok|failed|skipped|running [--data JSON]
    python bench/gpu_check.py env                # interpreter, torch and its CUDA version
    python bench/gpu_check.py imports            # kiln.training without Ray; exit 1 on a
                                                 # missing torch API
    python bench/gpu_check.py torchrun-config OUT.yaml METRICS.jsonl [--dry]
    python bench/gpu_check.py torchrun-figures METRICS.jsonl   # exit 1 on a non-finite step
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gpu_gate import GateFailure, check_apis, check_finite  # noqa: E402


def record(path: str, stage: str, status: str, data: dict | None = None) -> None:
    """Merge one stage's status and figures into the JSON file (written after every stage)."""
    results: dict[str, Any] = {}
    if os.path.exists(path):
        with open(path) as f:
            results = json.load(f)
    entry = results.setdefault("stages", {}).setdefault(stage, {})
    entry.update(data or {})  # a stage's own figures stay when the script adds its status
    entry["status"] = status
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
    ("_scaled_mm (fp8 GEMMs)", "torch", "_scaled_mm", "scale_a"),
    # precision fp8's default backend (a carried wheel, bench/gpu_wheels.txt)
    ("torchao Float8 training", "torchao.float8", "convert_to_float8_training", "module_filter_fn"),
    (
        "torchao fp8 all-gather scales",
        "torchao.float8",
        "precompute_float8_dynamic_scale_for_fsdp",
        None,
    ),
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


def torchrun_config(dry: bool, metrics_file: str) -> dict[str, Any]:
    """One GPU under torchrun through kiln's own entry point (NCCL, FSDP2 bf16 policy): the 1b
    preset with 8 accumulation steps. Dry: the tiny preset on CPU (gloo), one step."""
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
    return {
        "model": {"preset": "1b"},
        "device": "cuda",
        "precision": "bf16",
        "seq_len": 2048,
        "micro_batch_size": 2,
        "global_batch_size": 16,  # 8 accumulation steps on one rank
        "steps": 6,
        "optimizer": {"implementation": "fused"},
        "parallel": {"compile": False},  # compile's time and speed are the bench's rows
        "log_every": 1000,
        "metrics_file": metrics_file,
    }


def torchrun_figures(metrics_file: str) -> dict[str, Any]:
    """Median tokens/s, step time and MFU of the steps after the first (warm-up)."""
    with open(metrics_file) as f:
        steps = [json.loads(line) for line in f if line.strip()]
    if not steps:
        raise GateFailure(f"{metrics_file}: no step was logged")
    for m in steps:
        check_finite(m)
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/gpu_check.py")
    sub = parser.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("path")
    rec.add_argument("stage")
    rec.add_argument("status", choices=["ok", "failed", "skipped", "running"])
    rec.add_argument("--data", default="{}")
    sub.add_parser("env")
    sub.add_parser("imports")
    trc = sub.add_parser("torchrun-config")
    trc.add_argument("path")
    trc.add_argument("metrics_file")
    trc.add_argument("--dry", action="store_true")
    trf = sub.add_parser("torchrun-figures")
    trf.add_argument("metrics_file")
    args = parser.parse_args(argv)
    if args.cmd == "record":
        record(args.path, args.stage, args.status, json.loads(args.data))
    elif args.cmd == "env":
        print(env_line())
    elif args.cmd == "imports":
        found = check_imports()
        print(json.dumps(found))
        try:
            check_apis(found["torch_apis"])
        except GateFailure as exc:
            print(exc, file=sys.stderr)
            return 1
    elif args.cmd == "torchrun-config":
        cfg = torchrun_config(args.dry, args.metrics_file)
        with open(args.path, "w") as f:
            json.dump(cfg, f)  # JSON is YAML: torchrun_main reads either
    else:
        try:
            figures = torchrun_figures(args.metrics_file)
        except GateFailure as exc:
            print(exc, file=sys.stderr)
            return 1
        print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
