#!/usr/bin/env bash
# GPU measurements on the lent NVIDIA H200 (never in CI). Run from the repository root:
#   bash tests/device/h200.sh stash                    first call, carrying .gpu-wheels (part a of MLX CUDA)
#   bash tests/device/h200.sh setup STEP [STEP ...]    later calls, carrying .gpu-wheels and .whl
# .gpu-wheels: ../shared/tools/mlx-cuda/get-wheels.sh .gpu-wheels, plus its install.sh copied in.
# .whl: the wheels the machine's Python lacks (platformdirs soundfile cffi pycparser soxr, mlx-vlm and
# mlx-audio for --compare) and ../shared/tools/mlx-cuda/peer-shim-sitecustomize.py as sitecustomize.py.
# Steps write logs and JSON under $OUT; each is time-limited so that one slow step leaves the others' results.
# A fresh machine's first process compiles MLX's kernels for about 5 minutes: `ptxsave` (last step of a call)
# returns the compiled kernels as $OUT/ptx.tgz; copied to .ptx-cache/ptx.tgz here and carried with the
# stash call (beside .gpu-wheels/a), `stash` unpacks them, so that the next machine starts compiled.
set -uo pipefail
# A step past its limit gets SIGABRT, so that faulthandler prints where every thread was.
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 MLX_PTX_CACHE_DIR=/tmp/ptx
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
# step NAME SECONDS COMMAND...: run with a time limit, log to $OUT/NAME.log ("parley" means python3 -m app.cli).
step() {
  local name=$1 limit=$2; shift 2
  [ "$1" = parley ] && set -- python3 -m app.cli "${@:2}"
  echo "=== $name ($(date +%T))"; timeout -s ABRT -k 10 "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
}

for arg in "$@"; do
  case "$arg" in
    stash) bash .gpu-wheels/install.sh stash .gpu-wheels/a
      if [ -f .ptx-cache/ptx.tgz ]; then
        mkdir -p /tmp/ptx && tar -xzf .ptx-cache/ptx.tgz -C /tmp && echo "kernels unpacked: $(ls /tmp/ptx | wc -l)"
      fi ;;
    ptxsave) tar -czf "$OUT/ptx.tgz" -C /tmp ptx && ls -l "$OUT/ptx.tgz" ;;
    setup)
      [ -d "$HOME/mlx-site/mlx" ] || bash .gpu-wheels/install.sh finish .gpu-wheels/b
      [ -d /tmp/site/mlx_vlm ] || { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --target /tmp/site .whl/*.whl && cp .whl/sitecustomize.py /tmp/site/; }
      export PYTHONPATH=$HOME/mlx-site:/tmp/site:$PWD
      python3 -c 'import mlx.core as mx; print("mlx", mx.__version__, mx.default_device(), mx.device_info())'
      nvidia-smi --query-gpu=name,memory.used,utilization.gpu --format=csv ;;
    # Compiled programs against their op-by-op form, bit for bit, on this GPU.
    check) PARLEY_COMPILE=check step check 300 parley bench --random tiny --frames 80 --json "$OUT/check.json" ;;
    # Counts on this GPU (the structure model has the full size's layers and head sizes).
    counters) step counters 400 parley bench --counters --frames 90 --json "$OUT/counters-gpu.json" ;;
    # Which fused kernels add to a product (they would contract to FMA): scan the generated CUDA.
    fused) step fused 60 python3 tests/device/fused_products.py /tmp/ptx ;;
    # In the background for the rest of the call: compiled kernels and GPU load every 30 s (compiling or stuck?).
    monitor) (while sleep 30; do echo "--- $(date +%T) kernels $(find /tmp/ptx -type f 2>/dev/null | wc -l)," \
      "$(nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader)"; done) >> "$OUT/monitor.log" 2>&1 &
      MONITOR=$! ;;
    kernels) find /tmp/ptx -name '*.ptx' | wc -l | tee "$OUT/kernels.log" ;;
    full4) step full4 590 parley bench --random full --quantize 4 --frames 100 --rounds 3 --compare mlx-vlm \
      --json "$OUT/full4.json" ;;
    full8) step full8 590 parley bench --random full --quantize 8 --frames 100 --rounds 3 --compare mlx-vlm \
      --json "$OUT/full8.json" ;;
    tiny) step tiny 200 parley bench --random tiny --frames 100 --rounds 2 --compare mlx-vlm --json "$OUT/tiny.json" ;;
    # Fast numerics: speed against mlx-vlm, counts, and drift against exact (the fused kernel admitted or not).
    fast4) step fast4 590 parley bench --random full --quantize 4 --numerics fast --frames 100 --rounds 3 \
      --compare mlx-vlm --json "$OUT/fast4.json" ;;
    # Fast against exact: the same model switched in place, alternating rounds in one process.
    fastexact) step fastexact 480 parley bench --random full --quantize 4 --numerics fast --frames 100 --rounds 3 \
      --compare exact --json "$OUT/fastexact.json" ;;
    # Where a fast frame's time goes: every stage and sub-stage evaluated at its boundary, at full size and on the
    # structure model (the same kernels with almost no arithmetic: what is left there is per-kernel cost).
    fastsub) step fastsub 300 parley bench --random full --quantize 4 --numerics fast --frames 60 --sub-stages \
      --json "$OUT/fastsub.json" ;;
    fastsubs) step fastsubs 200 parley bench --random structure --numerics fast --frames 60 --sub-stages \
      --json "$OUT/fastsubs.json" ;;
    # The host's share of a fast frame by Python function, and the time in mx.eval (structure model).
    hostprofile) step hostprofile 240 python3 tests/device/host_profile.py structure fast 20 ;;
    # Fast numerics at 8 bits against mlx-vlm (speed and peak memory, one process).
    fast8) step fast8 590 parley bench --random full --quantize 8 --numerics fast --frames 100 --rounds 2 \
      --compare mlx-vlm --json "$OUT/fast8.json" ;;
    # The RN-T attempt's kernels: drift against their operations, tokens against exact mode, time per frame.
    rnntattempts) step rnntattempts 300 python3 tests/device/rnnt_attempts.py 200 ;;
    # The MoG draw's kernel: draws equal to its operations' out of 200, and the guided projections' product.
    mogdraw) step mogdraw 200 python3 tests/device/mog_draw.py 200 ;;
    # The codec's step: its norm's operations against the CPU's; fast against exact (SNR, counts, time).
    codecstep) step codecstep 300 python3 tests/device/codec_step.py 100 ;;
    # CUDA graphs for fast numerics (MLX reads the setting once per process): alternating processes, structure
    # model (the same primitives as full size, almost no weights: the host's share of a frame).
    fastgraphs)
      for round in 1 2; do
        for setting in "MLX_USE_CUDA_GRAPHS=1" "MLX_USE_CUDA_GRAPHS=0"; do
          echo "--- $setting round $round"
          env "$setting" timeout 150 python3 -m app.cli bench --random structure --numerics fast --frames 100 \
            --rounds 2 2>&1 | grep -E "^(parley |parley rounds|parley stalls)"
        done
      done 2>&1 | tee "$OUT/fastgraphs.log" ;;
    # fast4 in one round (a short device budget): speed, agreement and peak memory against mlx-vlm.
    fast4once) step fast4once 400 parley bench --random full --quantize 4 --numerics fast --frames 100 --rounds 1 \
      --compare mlx-vlm --json "$OUT/fast4once.json" ;;
    fastcount) step fastcount 400 parley bench --counters --numerics fast --frames 90 --json "$OUT/fastcount.json" ;;
    # Memory: a model loaded for fast numerics (its row products' weights left bf16) beside one loaded for exact.
    fastmem)
      for numerics in fast exact; do
        echo "--- loaded for $numerics"
        timeout 200 python3 -m app.cli bench --random full --quantize 4 --numerics "$numerics" --frames 100 \
          --json "$OUT/mem-$numerics.json" 2>&1 | grep -E "^(parley |model|weights)"
      done 2>&1 | tee "$OUT/fastmem.log" ;;
    # Fast numerics in a ten-minute conversation: fresh and aged by 7300 frames, alternating processes.
    fastlong)
      for run in 1 2; do
        for history in 0 7300; do
          echo "--- history $history, run $run"
          timeout 200 python3 -m app.cli bench --random full --quantize 4 --numerics fast --frames 200 \
            --history "$history" 2>&1 | grep -E "^(parley |model)"
        done
      done 2>&1 | tee "$OUT/fastlong.log" ;;
    # The same, one process: fresh and aged conversations alternating round by round on one loaded model.
    longab) step longab 400 python3 tests/device/long_ab.py fast ;;
    # Fast numerics' kernels: admission, difference from the fallback, time per call.
    fastkernels) step fastkernels 240 python3 tests/device/fast_kernels.py ;;
    # The LLM's quantized rows only (the chained step's among them): admission, difference, time per call.
    quantkernels) step quantkernels 240 python3 tests/device/fast_kernels.py quantized ;;
    # The LLM's step chained (each block's last kernel writing the next block's norm) against unchained.
    chainedab) step chainedab 420 python3 tests/device/fold_ab.py chained ;;
    # The TTS backbone's heads made by its attention kernel against their own kernel.
    headsab) step headsab 420 python3 tests/device/fold_ab.py heads ;;
    # The attention making its heads: admission, bit for bit against the heads kernel and the attention apart.
    headskernels) step headskernels 200 python3 tests/device/fast_kernels.py heads ;;
    # The encoder's window attention kernel with 4 to 32 warps a head: admission, difference, time per call.
    relwarps) step relwarps 200 python3 tests/device/relative_warps.py kernel ;;
    # The frame with the window kernel of 4 warps against RELWARPS (else relwarps's fastest, else 16), alternating.
    relwarpsab) fastest=$(grep -oP 'fastest queued: \K[0-9]+' "$OUT/relwarps.log" 2>/dev/null)
      step relwarpsab 420 python3 tests/device/relative_warps.py frame 4 "${RELWARPS:-${fastest:-16}}" ;;
    # A conversation's peak memory by phase: session creation's parts and the first frames (full 4-bit, fast).
    peakprobe) step peakprobe 450 python3 tests/device/peak_probe.py ;;
    # A step's random draws as one kernel against the library's one by one (bit for bit), no model built.
    drawskernel) step drawskernel 200 python3 tests/device/fast_kernels.py draws ;;
    # The backbone attention kernel writing its cache against the scatters, alternating rounds (full 4-bit, fast).
    writingab) step writingab 420 python3 tests/device/writing_ab.py ;;
    # The LLM's attention blocks through the writing kernel against MLX's operations, alternating rounds.
    llmattnab) step llmattnab 420 python3 tests/device/llm_attention_ab.py ;;
    # A MaskGIT round's quantizers in one launch against one launch each, alternating rounds.
    rvqroundsab) step rvqroundsab 420 python3 tests/device/rvq_rounds_ab.py ;;
    # The text conditioning read from the vocabulary's table against encoded every frame, alternating rounds.
    tableab) step tableab 420 python3 tests/device/condition_table_ab.py ;;
    # The long conversation's levers (bf16 caches, the attention merging its shares in one launch) against the build
    # before, fresh and aged by 7,300 frames, alternating rounds in one process.
    longlevers) step longlevers 560 python3 tests/device/long_levers_ab.py ;;
    longquick) step longquick 400 python3 tests/device/long_levers_ab.py full quick ;;
    # The attention's 2026-12-07 forms (bf16 buffers, merged shares) admitted or not, and timed: no model loaded.
    cachekernels) step cachekernels 300 python3 tests/device/cache_kernels.py ;;
    # The same forms' arithmetic with no MLX at all (no stash, no setup: one short call on a fresh machine), built and
    # run by the machine's CuPy from launches recorded here: `python tests/device/attention_recipes.py .attn-cases`,
    # then `bash tests/device/h200.sh attentioncupy` carrying .attn-cases.
    attentioncupy) step attentioncupy 200 python3 tests/device/attention_cupy.py .attn-cases ;;
    # Where the RN-T loop's one launch spends its time: against the attempt kernels, its barriers alone, its reads.
    loopprobe) step loopprobe 240 python3 tests/device/greedy_loop_probe.py ;;
    # Nsight Compute on one launch of the loop (stalls, occupancy, memory).
    loopncu) step loopncu 240 ncu --kernel-name regex:parley_greedy_loop --launch-skip 4 --launch-count 1 \
      --section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats \
      --section SchedulerStats python3 tests/device/greedy_loop_probe.py ncu ;;
    # This build's launches joined (row chains, the RN-T loop) against the same steps apart, and each joined alone,
    # alternating rounds.
    rowchainsab) step rowchainsab 480 python3 tests/device/row_chains_ab.py ;;
    # The attention's keys a step and the quantized rows' columns and warps, side by side (or the attention's only).
    layouts) step layouts 400 python3 tests/device/kernel_layouts.py ;;
    attnlayouts) before=tests/device/decode_attention_before.py  # another build's, when carried: its layout first
      step attnlayouts 200 python3 tests/device/kernel_layouts.py attention $([ -f $before ] && echo $before) ;;
    quantlayouts) step quantlayouts 300 python3 tests/device/kernel_layouts.py quantized ;;
    rvqlayouts) step rvqlayouts 200 python3 tests/device/kernel_layouts.py residualvq ;;
    # Nsight Compute on one 4-bit and one 8-bit quantized row kernel (the Mamba mixer's in projection).
    quantprofile) for bits in 4 8; do
        step "ncu$bits" 200 ncu --kernel-name regex:parley_quantized --launch-skip 3 --launch-count 1 \
          --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats \
          --section SchedulerStats --section LaunchStats python3 tests/device/profile_quantized.py 4480 22656 "$bits"
      done ;;
    # GPU time by kernel over steady frames, fresh and aged by 7300 frames (PyTorch's profiler records MLX's
    # kernels through CUPTI): which kernels an aged frame's extra time is in, how busy the GPU is, and what the host
    # was doing in the GPU's long idle gaps (the session's launches, syncs and stage ends marked in the profile).
    # One steady fast frame's graphs, stage by stage (read here with `python3 tests/device/graph_dump.py --read`).
    # Read there too (its files would pass the call's limit on files back): graphread.log, the folder removed.
    graphdump) step graphdump 200 python3 tests/device/graph_dump.py "$OUT/graphs" structure 85
      python3 tests/device/graph_dump.py --read "$OUT/graphs" > "$OUT/graphread.log" 2>&1 && rm -rf "$OUT/graphs" ;;
    gputime) step gputime 400 python3 tests/device/gpu_time.py 20 0 7300 ;;
    # Each part launched as soon as it is built against launched at the syncs only, alternating rounds (fast, exact).
    launchab) step launchab 300 python3 tests/device/launch_ab.py fast ;;
    launchabexact) step launchabexact 300 python3 tests/device/launch_ab.py exact ;;
    # Parts of a phase launched as built (the RN-T, the TTS backbone) against phases launched whole, alternating.
    partsab) step partsab 300 python3 tests/device/launch_ab.py parts ;;
    # Fast frames with one sync (the text id spelled on the device) against two, alternating rounds.
    syncab) step syncab 300 python3 tests/device/sync_ab.py ;;
    # Whether the backbone's cache writes happen in place (peak memory around a write and an aged frame).
    cachewrites) step cachewrites 200 python3 tests/device/cache_writes.py ;;
    # This build's quantized row kernel against another build's (tests/device/quantized_ab.py says how).
    quantizedab) step quantizedab 300 python3 tests/device/quantized_ab.py tests/device/quantized_product_before.py ;;
    # Where an aged frame's time goes: every stage and sub-stage evaluated at its boundary, fresh and aged by 7300
    # frames (the ten-minute target), one process each.
    fastsublong)
      for history in 0 7300; do
        echo "--- history $history"
        timeout 250 python3 -m app.cli bench --random full --quantize 4 --numerics fast --frames 60 --sub-stages \
          --history "$history" 2>&1 | grep -E "^(parley|model)"
      done 2>&1 | tee "$OUT/fastsublong.log" ;;
    # Only the LLM's quantized one-row products against MLX's, with their bandwidth.
    quantkernels) step quantkernels 240 python3 tests/device/fast_kernels.py quantized ;;
    # Fast numerics with and without the LLM blocks' fused quantized rows, alternating in one process.
    fusedab) step fusedab 400 python3 tests/device/fused_rows_ab.py ;;
    # Fast numerics with the TTS backbone's step traced and op by op, alternating in one process.
    tracedab) step tracedab 400 python3 tests/device/traced_ab.py ;;
    drift) step drift 300 parley drift --random structure --seeds 0 1 --frames 40 --json "$OUT/drift.json" ;;
    # CUDA graph settings, alternating processes (MLX reads them once per process), host-bound structure model.
    graphs)
      for round in 1 2; do
        for setting in "MLX_USE_CUDA_GRAPHS=1" "MLX_USE_CUDA_GRAPHS=0" "MLX_MAX_OPS_PER_BUFFER=400" \
          "MLX_MAX_OPS_PER_BUFFER=1600"; do
          echo "--- $setting round $round"
          env "$setting" timeout 120 python3 -m app.cli bench --random structure --frames 100 2>&1 | grep -E "^parley "
        done
      done 2>&1 | tee "$OUT/graphs.log" ;;
    # The same at full size with --compare, the first process (which compiles) included.
    graphsfull)
      for setting in "MLX_USE_CUDA_GRAPHS=0" "MLX_USE_CUDA_GRAPHS=1" "MLX_USE_CUDA_GRAPHS=0"; do
        echo "--- $setting"
        env "$setting" timeout 330 python3 -m app.cli bench --random full --quantize 4 --frames 100 --rounds 2 \
          --compare mlx-vlm 2>&1 | grep -E "^(parley|mlx-vlm|speedup|compiled|model)"
      done 2>&1 | tee "$OUT/graphsfull.log" ;;
    *) echo "unknown step $arg" >&2; exit 2 ;;
  esac
done
[ -n "${MONITOR:-}" ] && kill "$MONITOR" 2>/dev/null
exit 0
