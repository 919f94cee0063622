#!/usr/bin/env bash
# GPU check for the trainer, one script, <= ~8 minutes on one H100/H200-class GPU:
#   1. the GPU-marked tests (attention backends, bf16 and fp8 training),
#   2. the dense bf16 (and fp8) matmul peak of *this* GPU, measured with large GEMMs,
#   3. MFU of the `1b` preset on one GPU in bf16 (target >= 50% of the measured bf16 peak) and fp8,
#   4. the flash-attn and Transformer Engine attention paths inside a real training step.
# Every stage has its own timeout so one hang cannot eat the budget. Figures go to stdout and
# to $OUT/gpu_check.json when $OUT is set.
#
#   bash bench/gpu_check.sh            # from the repository root
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python
OUT_DIR=${OUT:-/tmp/kiln-gpu-check}
mkdir -p "$OUT_DIR"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
status=0

echo "== environment"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || { echo "no GPU"; exit 1; }
"$PY" - <<'PYEOF'
import importlib.util, torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "device", torch.cuda.get_device_name(),
      "capability", torch.cuda.get_device_capability())
for pkg in ("flash_attn", "transformer_engine"):
    print(f"{pkg}:", "present" if importlib.util.find_spec(pkg) else "MISSING (pip install 'kiln[gpu]')")
PYEOF

echo "== GPU tests (pytest -m gpu)"
timeout 150 "$PY" -m pytest -q -m gpu tests/training -p no:cacheprovider || status=1

echo "== matmul peak and MFU of the 1b preset"
timeout 330 "$PY" - "$OUT_DIR/gpu_check.json" <<'PYEOF' || status=1
import importlib.util, json, sys, time
import torch

from kiln.training.config import TrainConfig
from kiln.training.metrics import device_peak_flops
from kiln.training.trainer import Trainer

results = {"device": torch.cuda.get_device_name()}


def matmul_peak(dtype, n=8192, iters=50):
    """Dense GEMM throughput: the best this GPU does on large square matmuls, in FLOP/s."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    if dtype == "fp8":
        a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn).t().contiguous().t()
        one = torch.ones((), device="cuda")
        run = lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)  # noqa: E731
    else:
        run = lambda: a @ b  # noqa: E731
    for _ in range(5):
        run()
    torch.cuda.synchronize()
    best = 0.0
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(iters):
            run()
        torch.cuda.synchronize()
        best = max(best, 2 * n**3 * iters / (time.perf_counter() - start))
    return best


peak_bf16 = matmul_peak("bf16")
results["matmul_peak_bf16_tflops"] = peak_bf16 / 1e12
print(f"measured bf16 matmul peak: {peak_bf16 / 1e12:.0f} TFLOP/s "
      f"(datasheet {(device_peak_flops('bf16') or 0) / 1e12:.0f})")
try:
    peak_fp8 = matmul_peak("fp8")
    results["matmul_peak_fp8_tflops"] = peak_fp8 / 1e12
    print(f"measured fp8 matmul peak: {peak_fp8 / 1e12:.0f} TFLOP/s")
except Exception as exc:  # older GPUs have no fp8 GEMM
    peak_fp8 = None
    print(f"fp8 matmul: not available ({type(exc).__name__}: {exc})")


def mfu_run(precision, peak, steps=10, warmup=3, **extra):
    cfg = TrainConfig.model_validate(dict(
        model={"preset": "1b", **extra.pop("model", {})}, precision=precision, device="cuda",
        seq_len=2048, micro_batch_size=4, global_batch_size=4, steps=warmup + steps,
        data={"synthetic": True}, peak_tflops=peak / 1e12, log_every=1000,
        optimizer={"implementation": "fused"}, **extra,
    ))
    trainer = Trainer(cfg).setup()
    for _ in range(warmup):
        trainer.train_step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    metrics = [trainer.train_step() for _ in range(steps)]
    tokens_per_s = sorted(m["tokens_per_s"] for m in metrics)[steps // 2]
    mfu = trainer.flops_per_token * tokens_per_s / peak
    out = {"tokens_per_s": tokens_per_s, "mfu": mfu, "peak_mem_gb": metrics[-1]["peak_mem_gb"],
           "loss": metrics[-1]["loss"]}
    del trainer
    torch.cuda.empty_cache()
    return out


for name, precision, peak, extra in [
    ("1b_bf16", "bf16", peak_bf16, {}),
    ("1b_bf16_compile", "bf16", peak_bf16, {"parallel": {"compile": True}}),
    ("1b_fp8_vs_bf16_peak", "fp8", peak_bf16, {}),
]:
    if precision == "fp8" and not importlib.util.find_spec("transformer_engine"):
        print(f"{name}: skipped (no Transformer Engine)")
        continue
    try:
        r = mfu_run(precision, peak, **extra)
    except Exception as exc:
        print(f"{name}: FAILED {type(exc).__name__}: {exc}")
        results[name] = {"error": str(exc)}
        continue
    results[name] = r
    print(f"{name}: {r['tokens_per_s']:.0f} tokens/s, MFU {100 * r['mfu']:.1f}% of the measured bf16 peak, "
          f"peak memory {r['peak_mem_gb']:.1f} GB, loss {r['loss']:.3f}")
best = max((results[k]["mfu"] for k in ("1b_bf16", "1b_bf16_compile") if "mfu" in results.get(k, {})), default=0)
print(f"bf16 MFU target >= 50%: {'MET' if best >= 0.5 else 'NOT MET'} ({100 * best:.1f}%)")

for backend in ("flash_attn", "te"):
    try:
        r = mfu_run("bf16", peak_bf16, steps=3, warmup=1,
                    model={"attention_backend": backend, "sliding_window": 1024})
        results[f"1b_bf16_{backend}_window"] = r
        print(f"attention_backend={backend} (sliding window 1024): {r['tokens_per_s']:.0f} tokens/s, "
              f"MFU {100 * r['mfu']:.1f}%, loss {r['loss']:.3f}")
    except Exception as exc:
        print(f"attention_backend={backend}: FAILED {type(exc).__name__}: {exc}")
        results[f"1b_bf16_{backend}_window"] = {"error": str(exc)}

with open(sys.argv[1], "w") as f:
    json.dump(results, f, indent=2)
print("figures written to", sys.argv[1])
PYEOF

echo "== done (status $status)"
exit $status
