#!/usr/bin/env bash
# Parley's measurements on a lent NVIDIA GPU (H100 or H200; never in CI): the numbers the README and users quote.
# From the repository root, the device tool carrying .gpu (carry: [".gpu"]):
#   bash tests/device/harness.sh setup STEP [STEP ...]        setup first in every call (quick once done)
#   DRY=1 bash tests/device/harness.sh setup STEP [STEP ...]  prints what would run, runs nothing (works here)
# Each step runs under its limit (then SIGABRT: faulthandler prints every thread) and logs to $OUT/STEP.log, a
# `parley` step's report to $OUT/STEP.json, so that one slow step leaves the others'. A call runs at most 600 s.
#
# step        limit  measures ("limit": seconds each of its processes may run)
# setup         120  MLX CUDA, the wheels and the kernel cache from .gpu/, installed; MLX's device and the GPU
# ptxsave        60  the kernel cache as $OUT/ptx.tgz (top folder ptx/): the next machine's .gpu/ptx.tgz
# fidelity      480  fast against exact in the six cases (bf16, 4-bit, 8-bit × prompt or not), tiny checkpoints:
#                    three processes at once, each on its own copy of the kernel cache, merged after
# full4         590  exact numerics, full size, 4-bit: speed, peak memory and agreement against mlx-vlm, 3 rounds
# full8         590  the same at 8 bits
# fast4         590  fast numerics, 4-bit, against mlx-vlm
# fast8         590  fast numerics, 8-bit, against mlx-vlm
# fastexact     480  fast against exact numerics: one model switched in place, alternating rounds
# drift         300  fast numerics' drift from exact on the structure model (seeds 0 and 1, 40 frames)
# counters      400  primitives, kernels and host syncs a frame, exact numerics (structure model)
# fastcount     400  the same in fast numerics
# check         300  compiled programs against their op-by-op form, bit for bit (PARLEY_COMPILE=check)
# fastkernels   420  each fast kernel admitted against its fallback: difference and time per call
# fused          60  which kernels MLX generated add to a product (a GPU compiler contracts them to FMA)
# long          400  fresh against aged by 7,300 frames (ten minutes), alternating in one process, fast numerics
# abfast4       590  fast numerics, 4-bit, full size: this build against the build in .baseline/ (carried: `git archive
#                    REV app engine ui tests assets pyproject.toml | tar -x -C .baseline`), alternating processes on one
#                    checkpoint written once (A B, ROUNDS times, default 2), 100 frames each; the p50/mean of each from its report
# gputime       420  every kernel of 20 steady fast frames through CUPTI (PyTorch's profiler), full size, 4-bit: GPU
#                    time by kernel family against idle gaps, placed by what the host was doing (NUMERICS=exact too);
#                    then the host's Python over the same frames by own and cumulative time (cProfile)
# toolturn      540  issue 52 at full size, 4-bit: the 900-position tool prompt's prefill (fast in chunks of 64 and 256,
#                    fast and exact one position a step) and one tool turn's timings, fast then exact
# serve         300  `parley serve`'s added latency a frame against the engine alone (structure model, 4-bit, fast;
#                    needs websockets' wheel in .gpu/whl)
# coldstart     400  process start to model ready (structure model, 4-bit: the full size's layers and kernels with
#                    little weight to make; NUMERICS=exact or fast): an empty kernel cache,
#                    then the cache the first process left, then a new user seeded from those kernels shipped in
#                    assets/kernels (the app's own cache setting, no MLX_PTX_CACHE_DIR)
#
# .gpu/ (git-ignored) holds data only, made here:
#   mlx-cuda-sm90.tar.xz  `python3 tests/device/pack_mlx_cuda.py CUDA_WHEEL MLX_WHEEL .gpu/mlx-cuda-sm90.tar.xz`, the
#                         wheels from `../shared/tools/mlx-cuda/get-wheels.sh DIR` (the CUDA one: `cat` its two parts)
#   whl/                  the wheels the machine's Python lacks (platformdirs soundfile cffi pycparser soxr websockets, and for
#                         --compare mlx-vlm 0.7.10 and mlx-audio 0.6.2), and ../shared/tools/mlx-cuda/
#                         peer-shim-sitecustomize.py as whl/sitecustomize.py
#   ptx.tgz               a kernel cache `ptxsave` returned
set -uo pipefail
export PYTHONPATH=$HOME/mlx-site:/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 MLX_PTX_CACHE_DIR=/tmp/ptx
OUT=${OUT:-/tmp/out} DRY=${DRY:-}
mkdir -p "$OUT"
if [ -n "$DRY" ]; then exec 3>&1; else exec 3>/dev/null; fi  # fd 3: what is read from a step's log instead
failed=()

# limit STEP: the step's limit in the table above (nothing for an unknown step).
HARNESS=$(readlink -f "$0")  # read by limit() from any folder (abfast4 runs the baseline from .baseline/)
limit() { awk -v step="$1" '$1 == "#" && $2 == step && $3 ~ /^[0-9]+$/ { print $3; exit }' "$HARNESS"; }
# x COMMAND...: run it, or with DRY print it.
x() { if [ -n "$DRY" ]; then echo "+ $*"; else "$@"; fi; }
# run NAME COMMAND...: under the limit of NAME's step (NAME up to a "-"), logged to $OUT/NAME.log.
# "parley" stands for python3 -m app.cli, its report written to $OUT/NAME.json.
run() {
  local name=$1; shift
  [ "$1" = parley ] && set -- python3 -m app.cli "${@:2}" --json "$OUT/$name.json"
  echo "=== $name ($(date +%T))"
  if [ -n "$DRY" ]; then
    local env="MLX_PTX_CACHE_DIR=${MLX_PTX_CACHE_DIR:-(unset)}"
    env+="${CUDA_CACHE_PATH:+ CUDA_CACHE_PATH=$CUDA_CACHE_PATH}${PARLEY_COMPILE:+ PARLEY_COMPILE=$PARLEY_COMPILE}"
    echo "+ $env timeout $(limit "${name%%-*}") $*"
    return
  fi
  timeout -s ABRT -k 10 "$(limit "${name%%-*}")" "$@" 2>&1 | tee "$OUT/$name.log"
  local rc=$?
  [ "$rc" = 0 ] || { echo "=== $name failed: rc $rc"; failed+=("$name"); }
  return "$rc"
}

setup() {
  if [ ! -d "$HOME/mlx-site/mlx" ]; then
    x mkdir -p "$HOME/mlx-site" && x tar -xJf .gpu/mlx-cuda-sm90.tar.xz -C "$HOME/mlx-site"
  fi
  if [ ! -d /tmp/site/mlx_vlm ]; then
    x python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpu/whl/*.whl &&
      x cp .gpu/whl/sitecustomize.py /tmp/site/
  fi
  [ -d /tmp/ptx ] || [ ! -f .gpu/ptx.tgz ] || x tar -xzf .gpu/ptx.tgz -C /tmp
  x mkdir -p /tmp/ptx
  echo "kernels cached: $(find /tmp/ptx -name '*.ptx' 2>/dev/null | wc -l)"
  x python3 -c 'import mlx.core as mx; print("mlx", mx.__version__, mx.default_device(), mx.device_info())
a = mx.ones((64, 64)); print("check", (a @ a).sum().item())'
  x nvidia-smi --query-gpu=name,memory.used,utilization.gpu --format=csv,noheader
}

# The six cases in three processes (each runs one quantization with and without the prompt), each on its own copy of
# the kernel cache (MLX writes a kernel's files as it compiles them); the copies merged into /tmp/ptx after.
fidelity() {
  local quant
  x mkdir -p /tmp/ptx
  for quant in none 4 8; do
    x rm -rf "/tmp/ptx-$quant" && x cp -r /tmp/ptx "/tmp/ptx-$quant"
    MLX_PTX_CACHE_DIR=/tmp/ptx-$quant run "fidelity-$quant" python3 tests/device/fidelity.py cases "$quant" >&3 &
  done
  wait
  for quant in none 4 8; do
    x cp -r "/tmp/ptx-$quant/." /tmp/ptx/
    grep -hE "^case|Error|error" "$OUT/fidelity-$quant.log" 2>/dev/null | cut -c1-400
    grep -q "^case" "$OUT/fidelity-$quant.log" 2>/dev/null || [ -n "$DRY" ] || failed+=("fidelity-$quant")
  done
}

# Two processes on one kernel cache (and CUDA's own, for PTX compiled to the GPU) that starts empty.
coldstart() {
  local pass began
  x rm -rf /tmp/ptx-cold /tmp/cuda-cold && x mkdir -p /tmp/ptx-cold
  for pass in cold warm; do
    began=$(date +%s.%N)
    MLX_PTX_CACHE_DIR=/tmp/ptx-cold CUDA_CACHE_PATH=/tmp/cuda-cold run "coldstart-$pass" parley bench --random structure \
      --quantize 4 --numerics "${NUMERICS:-exact}" --frames 10 >&3
    echo "coldstart $pass: process $(awk -v a="$began" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s" \
      "(10 frames included); $(grep -hoE 'ready in .*compiling [0-9.]+ s\)|compiled kernels cached: .*' \
        "$OUT/coldstart-$pass.log" 2>/dev/null | tr '\n' ' ')"
  done
  # A new user whose Parley ships the kernels the cold pass compiled: no MLX_PTX_CACHE_DIR, an empty home, the
  # archive in assets/kernels (what a release would carry): the app's own setting and seeding, measured.
  x python3 -c "import sys, mlx.core as mx; from pathlib import Path; from engine.kernel_cache import pack_kernel_cache
print(pack_kernel_cache(Path(sys.argv[1]), Path('assets/kernels'), mlx_version=mx.__version__,
      architecture=mx.device_info()['architecture']))" /tmp/ptx-cold
  began=$(date +%s.%N)
  (unset MLX_PTX_CACHE_DIR; HOME=/tmp/home-shipped XDG_CACHE_HOME=/tmp/home-shipped/.cache \
    CUDA_CACHE_PATH=/tmp/cuda-shipped run coldstart-shipped parley bench --random structure --quantize 4 \
    --numerics "${NUMERICS:-exact}" --frames 10 >&3)
  echo "coldstart shipped: process $(awk -v a="$began" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s" \
    "$(grep -hoE 'ready in .*compiling [0-9.]+ s\)|compiled kernels cached: .*' "$OUT/coldstart-shipped.log" \
      2>/dev/null | tr '\n' ' ')"
  x rm -rf assets/kernels
  x cp -r /tmp/ptx-cold/. /tmp/ptx/
}

# This build and the one in .baseline/ in alternating processes on one full-size 4-bit checkpoint, fast numerics.
abfast4() {
  local round build
  [ -n "$DRY" ] || [ -d .baseline/engine ] || { echo "abfast4: no .baseline/ (see the table above)"; failed+=(abfast4); return; }
  [ -f /tmp/full4/config.json ] || x python3 -m app.cli make-checkpoint /tmp/full4 --size full --quantize 4 --overwrite
  for round in $(seq "${ROUNDS:-2}"); do
    for build in after before; do
      if [ "$build" = before ]; then
        (cd .baseline && run "abfast4-$build$round" parley bench --model /tmp/full4 --numerics fast --frames 100 >&3)
      else
        run "abfast4-$build$round" parley bench --model /tmp/full4 --numerics fast --frames 100 >&3
      fi
      grep -hE "p50|mean|ready in" "$OUT/abfast4-$build$round.log" 2>/dev/null | head -4 | sed "s/^/$build $round: /"
    done
  done
}

for arg in "$@"; do  # every step known before any runs: a misspelt one costs no device time
  [ -n "$(limit "$arg")" ] && continue
  echo "unknown step $arg; the steps:" >&2; grep -E '^# [a-z0-9]+ +[0-9]+ ' "$HARNESS" >&2; exit 2
done
for arg in "$@"; do
  case "$arg" in
    setup) setup ;;
    ptxsave) x tar -czf "$OUT/ptx.tgz" -C /tmp ptx && echo "saved: $(find /tmp/ptx -type f 2>/dev/null | wc -l)" ;;
    fidelity) fidelity ;;
    full4 | full8) run "$arg" parley bench --random full --quantize "${arg#full}" --frames 100 --rounds 3 \
      --compare mlx-vlm ;;
    fast4 | fast8) run "$arg" parley bench --random full --quantize "${arg#fast}" --numerics fast --frames 100 \
      --rounds 3 --compare mlx-vlm ;;
    fastexact) run fastexact parley bench --random full --quantize 4 --numerics fast --frames 100 --rounds 3 \
      --compare exact ;;
    drift) run drift parley drift --random structure --seeds 0 1 --frames 40 ;;
    counters) run counters parley bench --counters --frames 90 ;;
    fastcount) run fastcount parley bench --counters --numerics fast --frames 90 ;;
    check) PARLEY_COMPILE=check run check parley bench --random tiny --frames 80 ;;
    fastkernels) run fastkernels python3 tests/device/fast_kernels.py ;;
    fused) run fused python3 tests/device/fused_products.py /tmp/ptx ;;
    long) run long python3 tests/device/long.py fast ;;
    gputime) run gputime python3 tests/device/gpu_time.py 20 ;;
    toolturn) run toolturn python3 tests/device/tool_turn.py ;;
    serve) [ -f /tmp/struct4/config.json ] || x python3 -m app.cli make-checkpoint /tmp/struct4 --size structure \
      --quantize 4 --overwrite >/dev/null
      run serve python3 -m tests.serve_latency --model /tmp/struct4 --numerics fast --repeat 2 ;;
    coldstart) coldstart ;;
    abfast4) abfast4 ;;
  esac
done
[ ${#failed[@]} = 0 ] || { echo "failed: ${failed[*]}"; exit 1; }
