#!/usr/bin/env bash
# GPU check for the trainer: one script, <= 10 minutes on one H100/H200-class GPU, written for
# the H200 image (Python 3.12, torch 2.11, numpy 2, transformers; no Ray, no pydantic, no network).
# Stages, each with its own timeout; $OUT/gpu_check.json is rewritten after every stage:
#   env       interpreter, torch, GPU (nvidia-smi)
#   wheels    bench/.gpu-wheels (bench/gpu_wheels.txt) installed with --no-index into a scratch
#             --target, exactly as on the GPU; that target goes first on PYTHONPATH there
#   imports   kiln.training (trainer, launcher, checkpoint, planner) imports with Ray absent
#   cpu_step  one tiny Trainer step on CPU
#   moe_grouped_mm  an MoE layer's experts on torch._grouped_mm vs the per-expert loop (bf16):
#             agreement, both times, and that an sm90+ GPU takes the grouped kernel
#   torchrun  torchrun --nproc-per-node 1: the 1b preset with 8 accumulation steps (NCCL, FSDP2
#             bf16 policy), then with optimizer_offload (cuda:nccl,cpu:gloo)
#   pytest    pytest -m gpu (training, curator, and ring attention / activation offload kernels)
#   bench     MFU of the 1b preset and an 8B-shaped slice (seq 8192, selective recompute),
#             activation offload, fp8 when TE is present; datasheet and measured GEMM peaks
# Non-zero exit if any stage fails.
#
#   bash bench/gpu_check.sh                 # on the GPU machine, from the repository root
#   bash bench/gpu_check.sh --dry           # on CPU: every stage up to the first CUDA-only step,
#                                           # with Ray made unimportable (as on the GPU image)
#   bash bench/gpu_check.sh --fetch-wheels  # once, on a machine with PyPI: fill bench/.gpu-wheels
set -uo pipefail
cd "$(dirname "$0")/.."
DRY=0
FETCH=0
for arg in "$@"; do
  case "$arg" in
    --dry) DRY=1 ;;
    --fetch-wheels) FETCH=1 ;;
    *) echo "usage: bash bench/gpu_check.sh [--dry | --fetch-wheels]" >&2; exit 2 ;;
  esac
done
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
WHEELS=${KILN_GPU_WHEELS:-bench/.gpu-wheels}
# The GPU image's interpreter: wheels are resolved for it even when --dry runs elsewhere.
WHEEL_TAGS=(--python-version 3.12 --implementation cp --only-binary=:all:
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64
  --platform manylinux_2_28_x86_64 --platform any)

if [ "$FETCH" = 1 ]; then
  exec "$PY" -m pip download --no-deps "${WHEEL_TAGS[@]}" -d "$WHEELS" -r bench/gpu_wheels.txt
fi

OUT_DIR=${OUT:-/tmp/kiln-gpu-check}
mkdir -p "$OUT_DIR"
JSON="$OUT_DIR/gpu_check.json"
rm -f "$JSON"
SCRATCH=$(mktemp -d)
trap 'rm -rf "$SCRATCH"' EXIT
status=0
record() { "$PY" bench/gpu_check.py record "$JSON" "$@" || status=1; }
stage() {  # stage NAME SECONDS CMD...: run, record ok/failed, keep going
  local name=$1 limit=$2
  shift 2
  echo "== $name"
  if timeout "$limit" "$@"; then record "$name" ok; else record "$name" failed; status=1; fi
}

echo "== env"
"$PY" bench/gpu_check.py env
if [ "$DRY" = 0 ]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader \
    || { record env failed --data '{"error": "no GPU"}'; exit 1; }
fi
record env ok --data "{\"dry\": $([ "$DRY" = 1 ] && echo true || echo false)}"

echo "== wheels"
SITE="$SCRATCH/site"
if [ ! -d "$WHEELS" ]; then
  echo "no $WHEELS: run 'bash bench/gpu_check.sh --fetch-wheels' where PyPI is reachable"
  record wheels failed --data '{"error": "wheel folder missing"}'
  exit 1
fi
wheel_kib=$(du -sk "$WHEELS" | cut -f1)
if [ "$wheel_kib" -gt $((64 * 1024)) ]; then
  record wheels failed --data "{\"error\": \"$wheel_kib KiB of wheels: over the 64 MiB carry\"}"
  exit 1
fi
# The list is complete and pinned (fetched with --no-deps): no resolver pass over the
# interpreter's own packages, and no byte-compiling (most of pip's time; imports compile
# what they use).
if timeout 120 "$PY" -m pip install --quiet --no-index --no-deps --no-compile \
    --disable-pip-version-check --find-links "$WHEELS" --target "$SITE" \
    "${WHEEL_TAGS[@]}" -r bench/gpu_wheels.txt; then
  record wheels ok --data "{\"kib\": $wheel_kib}"
else
  record wheels failed
  exit 1
fi

# On the GPU's Python the carried packages shadow nothing and fill the gaps; a --dry run on
# another Python keeps its own (the cp312 binaries would not load) but loses Ray, as there.
PYPATH="$PWD"
if "$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))'; then
  PYPATH="$SITE:$PYPATH"
fi
if [ "$DRY" = 1 ]; then
  mkdir -p "$SCRATCH/noray/ray"
  echo 'raise ImportError("ray is not on the GPU image (gpu_check --dry)")' \
    > "$SCRATCH/noray/ray/__init__.py"
  PYPATH="$SCRATCH/noray:$PYPATH"
fi
export PYTHONPATH="$PYPATH${PYTHONPATH:+:$PYTHONPATH}"

echo "== imports"
if found=$(timeout 120 "$PY" bench/gpu_check.py imports); then
  echo "$found"
  record imports ok --data "$found"
else
  record imports failed
  status=1
fi
stage cpu_step 180 "$PY" bench/gpu_check.py cpu-step

dry_flag=()
[ "$DRY" = 1 ] && dry_flag=(--dry)
echo "== moe_grouped_mm"
# exit 1 (figures still printed) when grouped and loop disagree or sm90+ cannot group
if moe=$(timeout 120 "$PY" bench/gpu_check_moe.py "${dry_flag[@]}"); then
  echo "$moe"
  record moe_grouped_mm ok --data "$moe"
else
  echo "$moe"
  [ -n "$moe" ] || moe='{}'
  record moe_grouped_mm failed --data "$moe" || record moe_grouped_mm failed
  status=1
fi
variants=(accum8 offload)
[ "$DRY" = 1 ] && variants=(accum8)
for variant in "${variants[@]}"; do
  cfg="$OUT_DIR/torchrun_$variant.yaml"
  metrics="$OUT_DIR/torchrun_$variant.jsonl"
  rm -f "$metrics"
  "$PY" bench/gpu_check.py torchrun-config "$cfg" "$metrics" --variant "$variant" "${dry_flag[@]}"
  echo "== torchrun_$variant"
  if timeout 240 "$PY" -m torch.distributed.run --standalone --nproc-per-node 1 \
      -m kiln.training.torchrun_main --config "$cfg" \
      && figures=$("$PY" bench/gpu_check.py torchrun-figures "$metrics"); then
    echo "$figures"
    record "torchrun_$variant" ok --data "$figures"
  else
    record "torchrun_$variant" failed
    status=1
  fi
done

if [ "$DRY" = 1 ]; then
  # Collection only: every GPU test module imports without Ray; running them needs CUDA.
  stage pytest 120 "$PY" -m pytest -q -m gpu --collect-only -p no:cacheprovider \
    tests/training/trainer/test_gpu.py tests/curator/test_gpu.py \
    tests/training/parallel/test_gpu_kernels.py
else
  stage pytest 150 "$PY" -m pytest -q -m gpu -p no:cacheprovider \
    tests/training/trainer/test_gpu.py tests/curator/test_gpu.py \
    tests/training/parallel/test_gpu_kernels.py
fi

echo "== bench"
timeout 300 "$PY" bench/gpu_check.py bench "$JSON" "${dry_flag[@]}" || status=1

echo "== done (status $status); figures in $JSON"
exit $status
