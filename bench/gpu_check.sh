#!/usr/bin/env bash
# The GPU gate for the trainer: one call of at most ~9 minutes on one H100/H200-class GPU, written
# for the H200 image (Python 3.12, torch 2.11, numpy 2, pandas, scipy, numba, transformers,
# pytest; no Ray, dask, pydantic; no network). One global deadline (KILN_GPU_DEADLINE_S, 540 s):
# every stage's timeout is cut to what is left, a stage that cannot start is recorded as
# `skipped: deadline` and fails the gate. Most valuable first:
#   env       interpreter, torch, GPU (nvidia-smi)
#   wheels    what the image lacks (bench/gpu_wheels.txt), fetched when missing and PyPI is
#             reachable, installed with pip --target or, without pip, `python -m zipfile`
#   imports   kiln.training imports with Ray absent; every torch API the trainer calls is there
#   bench     MFU per row against its floor (compiled and eager, 1b and an 8B slice), every
#             step's loss and grad norm finite, step 0 at ln V + s^2/2, SDPA on cuDNN/flash only
#   parity    torchrun at world 1: first-step loss and grad norm of one process, replicate and
#             fully_shard equal (fp32)
#   learn     the 1b preset learns a repeated batch (loss falls by the stated margin)
#   torchrun  kiln's torchrun entry point, 1b preset, 8 accumulation steps, finite steps
#   moe_grouped_mm  an MoE layer on torch._grouped_mm against the per-expert loop (bf16)
#   pytest    pytest -m gpu over every test module that has the marker
# $OUT/gpu_check.json is rewritten after every stage; non-zero exit if any stage fails.
# docs/gpu.md states the rules and the floors (bench/gpu_gate.py holds them).
#
#   bash bench/gpu_check.sh                 # on the GPU machine, from the repository root
#   bash bench/gpu_check.sh --dry           # on CPU, in a throwaway venv holding exactly the
#                                           # image's packages (torch linked from the local
#                                           # venv): every stage up to its first CUDA call
#   bash bench/gpu_check.sh --fetch-wheels  # where PyPI is reachable: fill the wheel folders
#                                           # and build --dry's venv
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
START=$(date +%s)
DEADLINE=$((START + ${KILN_GPU_DEADLINE_S:-540}))
DEV_PY=${PYTHON:-.venv/bin/python}  # the development venv (--dry: its torch, its pip)
[ -x "$DEV_PY" ] || DEV_PY=python3
WHEELS=${KILN_GPU_WHEELS:-bench/.gpu-wheels}          # cp312: carried to the GPU
HOST_WHEELS=${KILN_GPU_HOST_WHEELS:-bench/.gpu-wheels-host}  # the same list, this interpreter
IMAGE_WHEELS=${KILN_GPU_IMAGE_WHEELS:-bench/.gpu-image-wheels}  # --dry: the image's packages
DRY_VENV=${KILN_GPU_DRY_VENV:-bench/.gpu-dry-venv}
# The GPU image's interpreter: the carried wheels are resolved for it.
WHEEL_TAGS=(--python-version 3.12 --implementation cp --only-binary=:all:
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64
  --platform manylinux_2_28_x86_64 --platform any)

pip_of() {  # a working `python -m pip` (this interpreter's, else the development venv's)
  if "$1" -m pip --version >/dev/null 2>&1; then echo "$1 -m pip"
  elif "$DEV_PY" -m pip --version >/dev/null 2>&1; then echo "$DEV_PY -m pip"
  fi
}
fetch_carried() {  # fetch_carried DIR [TAGS...]: the pinned list, no dependencies
  local dir=$1 pip
  shift
  pip=$(pip_of "$DEV_PY")
  [ -n "$pip" ] || { echo "no pip to fetch wheels with" >&2; return 1; }
  timeout 300 $pip download --quiet --no-deps --only-binary=:all: "$@" -d "$dir" \
    -r bench/gpu_wheels.txt
}
fetch_image() {  # the image's packages for this interpreter (--dry's venv), with dependencies
  local pip
  pip=$(pip_of "$DEV_PY")
  [ -n "$pip" ] || return 1
  timeout 600 $pip download --quiet --only-binary=:all: -d "$IMAGE_WHEELS" \
    -r bench/gpu_image_packages.txt
}
SCRATCH=$(mktemp -d)
trap 'rm -rf "$SCRATCH"' EXIT

# --dry: a venv with the image's package set only (no Ray, dask, pydantic...), torch linked from
# the development venv (a CPU build of the same major line; its Python, 3.11 here, stands in for
# the image's 3.12). Rebuilt when the package list or the torch build changes.
dry_venv() {
  local torch_dir site stamp pip
  torch_dir=$("$DEV_PY" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))') \
    || { echo "--dry needs torch in $DEV_PY" >&2; return 1; }
  stamp="$(sha256sum bench/gpu_image_packages.txt | cut -c1-16) $torch_dir $(ls -d "$torch_dir"/torch-*.dist-info)"
  if [ -f "$DRY_VENV/.kiln-stamp" ] && [ "$(cat "$DRY_VENV/.kiln-stamp")" = "$stamp" ]; then
    return 0
  fi
  echo "building the image-like venv $DRY_VENV"
  rm -rf "$DRY_VENV"
  "$DEV_PY" -c 'import sys; print(sys._base_executable)' >"$SCRATCH/base" || return 1
  "$(cat "$SCRATCH/base")" -m venv --without-pip "$DRY_VENV" || return 1
  site=$("$DRY_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  for entry in torch torchgen functorch "$(basename "$(ls -d "$torch_dir"/torch-*.dist-info)")"; do
    [ -e "$torch_dir/$entry" ] && ln -s "$torch_dir/$entry" "$site/$entry"
  done
  pip=$(pip_of "$DEV_PY")
  [ -n "$pip" ] || return 1
  [ -d "$IMAGE_WHEELS" ] || fetch_image || return 1
  timeout 600 $pip --python "$DRY_VENV/bin/python" install --quiet --no-index --no-compile \
    --disable-pip-version-check --find-links "$IMAGE_WHEELS" -r bench/gpu_image_packages.txt \
    || return 1
  # transformers' dependencies bring pydantic; the image has none (it travels as a wheel)
  $pip --python "$DRY_VENV/bin/python" uninstall --quiet -y pydantic pydantic-core \
    annotated-types typing-inspection >/dev/null 2>&1
  echo "$stamp" >"$DRY_VENV/.kiln-stamp"
}

if [ "$FETCH" = 1 ]; then  # everything --dry and the GPU call need, so neither fetches
  fetch_carried "$WHEELS" "${WHEEL_TAGS[@]}" && fetch_carried "$HOST_WHEELS" && fetch_image \
    && dry_venv
  exit $?
fi

OUT_DIR=${OUT:-/tmp/kiln-gpu-check}
mkdir -p "$OUT_DIR"
JSON="$OUT_DIR/gpu_check.json"
rm -f "$JSON"

if [ "$DRY" = 1 ]; then
  if ! dry_venv; then
    echo "--dry: cannot build the image-like venv (no $IMAGE_WHEELS and no PyPI?)" >&2
    exit 3
  fi
  PY="$DRY_VENV/bin/python"
  CARRIED=$HOST_WHEELS
else
  PY=${GPU_PYTHON:-python3}
  CARRIED=$WHEELS
fi
record() { "$PY" bench/gpu_check.py record "$JSON" "$@" || status=1; }
left() { echo $((DEADLINE - $(date +%s))); }
status=0
limit_for() {  # limit_for CAP: the stage's cap, cut to what the deadline leaves; 0: no time
  local cap=$1 rest
  rest=$(($(left) - 5))
  [ "$rest" -lt 20 ] && { echo 0; return; }
  [ "$rest" -lt "$cap" ] && echo "$rest" || echo "$cap"
}
# stage NAME CAP CMD...: run in its own process group under its limit (the whole group, torchrun's
# workers included, is killed at the limit); the last stdout line, when a JSON object, is merged
# into the stage's record; a non-zero exit fails the stage.
set -m
stage() {
  local name=$1 limit pid watchdog rc figures why
  limit=$(limit_for "$2")
  shift 2
  echo "== $name (limit ${limit} s)"
  if [ "$limit" = 0 ]; then
    record "$name" skipped --data '{"error": "global deadline"}'
    status=1
    return
  fi
  local began=$SECONDS
  # the stage's own end, for the Python stages that stop starting work near it
  KILN_GPU_DEADLINE=$(($(date +%s) + limit)) "$@" >"$SCRATCH/$name.out" 2>"$SCRATCH/$name.err" &
  pid=$!
  (sleep "$limit"; kill -TERM -- -"$pid"; sleep 10; kill -KILL -- -"$pid") >/dev/null 2>&1 &
  watchdog=$!
  wait "$pid"
  rc=$?
  kill -- -"$watchdog" 2>/dev/null
  wait "$watchdog" 2>/dev/null  # reaped here: no job-control notice in the log
  cat "$SCRATCH/$name.out"
  tail -n 30 "$SCRATCH/$name.err" >&2
  figures=$(tail -n 1 "$SCRATCH/$name.out")
  case "$figures" in \{*\}) ;; *) figures='{}' ;; esac
  record "$name" running --data "{\"seconds\": $((SECONDS - began))}"
  if [ "$rc" = 0 ]; then
    record "$name" ok --data "$figures"
    return
  fi
  why=$(tail -n 1 "$SCRATCH/$name.err" | tr -d '"\\' | tr -d '[:cntrl:]' | cut -c1-300)
  [ "$rc" -ge 128 ] && why="killed at the ${limit} s limit (signal $((rc - 128)))"
  record "$name" failed --data "{\"exit\": $rc, \"error\": \"$why\"}"
  status=1
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
mkdir -p "$SITE"
missing_carried() {  # missing_carried DIR: the pinned wheels of bench/gpu_wheels.txt not in DIR
  grep -v '^#' bench/gpu_wheels.txt | grep -v '^$' | while IFS='=' read -r name _ version; do
    ls "$1/$(echo "$name" | tr '-' '_')-$version-"*.whl >/dev/null 2>&1 || echo "$name"
  done
}
# a folder fetched before the list grew (torchao) is completed the same way
if [ ! -d "$CARRIED" ] || [ -n "$(missing_carried "$CARRIED")" ]; then
  fresh=0
  [ -d "$CARRIED" ] || fresh=1
  echo "$CARRIED lacks: $(missing_carried "$CARRIED" | tr '\n' ' ')- fetching (needs PyPI)"
  if [ "$DRY" = 1 ]; then fetch_carried "$CARRIED"; else fetch_carried "$CARRIED" "${WHEEL_TAGS[@]}"; fi \
    || { [ "$fresh" = 1 ] && rm -rf "$CARRIED"
         record wheels failed --data "{\"error\": \"$CARRIED lacks wheels and no PyPI\"}"; exit 1; }
fi
wheel_kib=$(du -sk "$CARRIED" | cut -f1)
if [ "$wheel_kib" -gt $((64 * 1024)) ]; then
  record wheels failed --data "{\"error\": \"$wheel_kib KiB of wheels: over the 64 MiB carry\"}"
  exit 1
fi
# The list is complete and pinned (fetched with --no-deps): no resolver pass over the
# interpreter's own packages, and no byte-compiling. Without pip, a wheel is a zip to unpack.
if "$PY" -m pip --version >/dev/null 2>&1; then
  method=pip
  timeout 120 "$PY" -m pip install --quiet --no-index --no-deps --no-compile \
    --disable-pip-version-check --find-links "$CARRIED" --target "$SITE" \
    -r bench/gpu_wheels.txt
else
  method=zipfile
  for wheel in "$CARRIED"/*.whl; do "$PY" -m zipfile -e "$wheel" "$SITE" || exit 1; done
fi
if [ $? = 0 ]; then
  record wheels ok --data "{\"kib\": $wheel_kib, \"method\": \"$method\"}"
else
  record wheels failed --data "{\"method\": \"$method\"}"
  exit 1
fi
export PYTHONPATH="$SITE:$PWD"

dry_flag=()
[ "$DRY" = 1 ] && dry_flag=(--dry)
stage imports 90 "$PY" bench/gpu_check.py imports
stage bench 240 "$PY" bench/gpu_check_train.py bench "$JSON" "${dry_flag[@]}"
stage parity 90 "$PY" -m torch.distributed.run --standalone --nproc-per-node 1 \
  bench/gpu_check_parity.py "$JSON" "${dry_flag[@]}"
stage learn 90 "$PY" bench/gpu_check_train.py learn "$JSON" "${dry_flag[@]}"

cfg="$OUT_DIR/torchrun_accum8.yaml"
metrics="$OUT_DIR/torchrun_accum8.jsonl"
rm -f "$metrics"
"$PY" bench/gpu_check.py torchrun-config "$cfg" "$metrics" "${dry_flag[@]}"
torchrun_stage() {
  "$PY" -m torch.distributed.run --standalone --nproc-per-node 1 \
    -m kiln.training.torchrun_main --config "$cfg" >&2 \
    && "$PY" bench/gpu_check.py torchrun-figures "$metrics"
}
stage torchrun_accum8 90 torchrun_stage
# exit 1 (figures still printed) when grouped and loop disagree or sm90+ cannot group
stage moe_grouped_mm 60 "$PY" bench/gpu_check_moe.py "${dry_flag[@]}"

# Every module that carries the gpu marker, wherever it is in the suite.
mapfile -t gpu_tests < <(grep -rlE "pytest\.mark\.gpu" tests --include='test_*.py' | sort)
pytest_stage() {
  local args=(-q -m gpu -p no:cacheprovider "${gpu_tests[@]}")
  [ "$DRY" = 1 ] && args=(--collect-only "${args[@]}")  # running them needs CUDA
  "$PY" -m pytest "${args[@]}" >"$SCRATCH/pytest.log" 2>&1
  local rc=$? count summary
  tail -n 40 "$SCRATCH/pytest.log" >&2
  count=$(grep -Eo '[0-9]+(/[0-9]+)? tests? (collected|selected)|[0-9]+ passed' "$SCRATCH/pytest.log" \
    | tail -n 1 | grep -Eo '^[0-9]+')
  summary=$(tail -n 1 "$SCRATCH/pytest.log" | tr -d '"\\=' | sed 's/^ *//; s/ *$//')
  echo "pytest -m gpu: ${count:-0} tests in ${#gpu_tests[@]} modules ($summary)" >&2
  echo "{\"modules\": ${#gpu_tests[@]}, \"tests\": ${count:-0}, \"summary\": \"$summary\"}"
  return $rc
}
stage pytest 150 pytest_stage

echo "== done (status $status, $(($(date +%s) - START)) s); figures in $JSON"
exit $status
