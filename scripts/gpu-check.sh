#!/usr/bin/env bash
# The GPU suite, for a machine with a GPU and no package installs (the H200 test machine):
# builds with CUDA and the NCCL interface from source (saying against which nccl.h); runs the GPU
# tests (ranks as threads, and as processes both time-sliced and under MPS, which the script
# starts and stops) and the NCCL interface's; runs them under compute-sanitizer memcheck and
# racecheck; runs the GPU benchmarks; prints a short table last. Full logs go to $OUT.
#   FULL=1   also the host unit and runtime suites
#   BENCH=0  skip the benchmarks
#   SAN=0    skip compute-sanitizer
#   PERF_MAX the largest size of the MPS all-reduce sweeps (default 256M)
#   PERF_ALGOS also sweep these algorithms forced (weft-perf --algos; default ring,oneshot,twoshot,
#            "" for none): the memory-bandwidth table gets a column for each
#   COPY_TBS the device's copy bandwidth for that table (default: weft-bench's 1 GiB memcpy)
#   ONLY     a gtest filter for the thread run (default: every thread, p2p and fault test)
#   CHANNELS a list of WEFT_GPU_CHANNELS values ("24 33") to also sweep 4 ranks at, 64-256 MB,
#            ring and two-shot forced (uneven channel counts were 3x slower before the
#            geometry cut pieces at 16-byte multiples)
#   BUNDLE=1 leave $OUT holding only summary.txt and logs.tgz (every log, packed): for a runner
#            that brings back only a few files
#   CUDA_FLAGS extra nvcc flags of the build, e.g. -DWEFT_GPU_POST_FENCE=1 (a kernel A/B switch
#            under the whole suite)
#   DEADLINE seconds the whole script may take: each step's limit is cut to what is left, and
#            steps that no longer fit are skipped, so the summary and the bundle still get written
#   SWEEPS   extra weft-perf argument lines, one per line, run under MPS after the process tests
#            (a line may start with NAME=VALUE settings for it, e.g. WEFT_GPU_CHANNELS=12)
#   SAN_STEPS the compute-sanitizer steps to run, by name (e.g. "racecheck-processes
#            memcheck-processes"; default every one)
set -uo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "$0")/common.sh"
OUT="${OUT:-$WEFT_ROOT/out}"
mkdir -p "$OUT"
dir="${BUILD_DIR:-$WEFT_ROOT/build-gpu}"

nvidia-smi -L | tee "$OUT/gpu.txt"
# Only what this script runs (FULL=1: everything), from source; the NCCL interface and its tests
# against the first nccl.h found (NCCL_HOME, the system's, the CUDA toolkit's; any of 2.19-2.28).
targets=(--target weft_gpu_tests weft_gpu_runtime_tests weft_gpu_tp_tests weft-topo weft-bench weft-perf weft-plan)
add_cuda_to_path
t0=$SECONDS
cmake -S "$WEFT_ROOT" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DWEFT_CUDA=ON \
  "-DCMAKE_CUDA_FLAGS=${CUDA_FLAGS:-}" >"$OUT/build.log" 2>&1 || {
  tail -50 "$OUT/build.log"
  exit 1
}
shim=0
if grep -q "NCCL interface ON" "$OUT/build.log"; then
  shim=1
  targets+=(weft_nccl weft_nccl_shim_test weft_nccl_shim_gpu_test weft_nccl_refuses_test
            weft_nccl_compress_test)
  grep -q "DevCommCreate" "$dir/nccl/nccl_functions.cmake" && targets+=(weft_nccl_device_api_test)
fi
[[ "${FULL:-0}" == 1 ]] && targets=()
cmake --build "$dir" -j "$JOBS" "${targets[@]}" >>"$OUT/build.log" 2>&1 || {
  tail -50 "$OUT/build.log"
  exit 1
}
header="$(grep -o 'NCCL interface O[NF].*' "$OUT/build.log" | tail -1)"
echo "gpu-check: built from source in $((SECONDS - t0)) s; ${header:-no NCCL interface}" |
  tee -a "$OUT/gpu.txt"
status=0
summary=()
run() {  # run NAME LIMIT_S CMD...
  local name="$1" limit="$2"
  shift 2
  if [[ -n "${SAN_STEPS:-}" && ($name == memcheck-* || $name == racecheck-*) &&
    " $SAN_STEPS " != *" $name "* ]]; then
    summary+=("SKIP  $name (SAN_STEPS)")
    return
  fi
  if [[ -n "${DEADLINE:-}" ]]; then
    local left=$((DEADLINE - SECONDS - 15))
    if ((left < 10)); then
      summary+=("SKIP  $name (DEADLINE)")
      return
    fi
    ((limit > left)) && limit=$left
  fi
  local t0=$SECONDS
  if timeout "$limit" "$@" >"$OUT/$name.log" 2>&1; then
    summary+=("PASS  $name ($((SECONDS - t0)) s)")
  else
    summary+=("FAIL  $name ($((SECONDS - t0)) s, see $name.log)")
    tail -30 "$OUT/$name.log"
    status=1
  fi
}
T="$dir/tests/weft_gpu_runtime_tests"
# A call that makes no progress fails after 30 s instead of the default 300 (a hang would
# otherwise eat the run); tests of the timeout set their own.
export WEFT_TIMEOUT_S="${WEFT_TIMEOUT_S:-30}"

run gpu-kernels 300 "$dir/tests/weft_gpu_tests"
# Ranks as threads of one process, a stream each: the matrix, every algorithm x protocol forced,
# one-shot both ways, 256 MB, graphs, point-to-point, faults.
# GpuThreadsOrdering: a communicator's calls on several streams, graphs among eager calls, two
# host threads; GpuCheckPlans: WEFT_CHECK_PLANS; GpuCompressed: the fp8 collectives.
run gpu-threads 900 "$T" --gtest_filter="${ONLY:-*GpuThreads*:*GpuP2p*:GpuFaults*:GpuCheckPlans*:*GpuCompressed*}"
# The tensor-parallel GEMMs with their collective, ranks as threads.
if [[ -z "${ONLY:-}" ]]; then
  run gpu-tp 600 "$dir/tests/weft_gpu_tp_tests" --gtest_filter='-*GpuAttentionProcesses*'
  # Context-parallel attention with ranks as processes (they fork: a process of their own).
  run gpu-attention-processes 300 "$dir/tests/weft_gpu_tp_tests" \
    --gtest_filter='*GpuAttentionProcesses*'
fi
# The NCCL interface: its C API on host and GPU memory, its device API, its exports.
if ((shim)); then
  run nccl-interface 300 bash -c "cd '$dir' && ctest -R '^nccl_shim' --output-on-failure"
fi
# Ranks as processes sharing the GPU through CUDA IPC: time-sliced (correctness; 8 processes
# that spin on each other's kernels would wait out time slices there, and so would the forced
# algorithms' many calls), then under MPS, 8 ranks and every algorithm x protocol too, and the
# ordering of calls on several streams (GpuProcessesOrdering).
run gpu-processes 600 "$T" --gtest_filter='*GpuProcesses.Collectives*-*/8ranks'
if command -v nvidia-cuda-mps-control >/dev/null; then
  mps="$(mktemp -d)"
  export CUDA_MPS_PIPE_DIRECTORY="$mps/pipe" CUDA_MPS_LOG_DIRECTORY="$mps/log"
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if nvidia-cuda-mps-control -d; then
    run gpu-processes-mps 600 "$T" --gtest_filter='*GpuProcesses*'
    k=0
    while IFS= read -r line; do
      [[ -z "$line" ]] && continue
      k=$((k + 1))
      split_settings "$line"
      echo "perf-sweep$k: weft-perf $line" >>"$OUT/sweeps.txt"
      WEFT_TIMEOUT_S=60 run "perf-sweep$k" 150 env "${envs[@]}" "$dir/weft-perf" "${words[@]}"
    done <<<"${SWEEPS:-}"
    if [[ "${BENCH:-1}" == 1 ]]; then
      # All-reduce between processes sharing the GPU (MPS runs their kernels side by side).
      algos="${PERF_ALGOS-ring,oneshot,twoshot}"
      for n in 2 4 8; do
        WEFT_TIMEOUT_S=60 run "perf-allreduce-np$n" 300 "$dir/weft-perf" allreduce -np "$n" -b 8 -e "${PERF_MAX:-256M}" -f 4 -w 3 -n 10 ${algos:+--algos "$algos"}
      done
      # The tensor-parallel GEMMs with their collective beside their parts (docs/perf-tp.md).
      for op in ag-gemm gemm-rs; do
        WEFT_TIMEOUT_S=60 run "perf-$op-np2" 200 "$dir/weft-perf" "$op" -np 2 --m 1024,4096,16384 -w 5 -n 20 --algos unfused,chunked:2,chunked:4
      done
      for c in ${CHANNELS:-}; do
        WEFT_GPU_CHANNELS="$c" WEFT_TIMEOUT_S=60 run "perf-channels-np4-c$c" 120 "$dir/weft-perf" allreduce -np 4 -b 64M -e 256M -f 4 -w 2 -n 5 -c 1 --algos ring,twoshot
      done
      # Registered buffers: the direct kernels read the peers' inputs in place (no copy);
      # WEFT_GPU_REGISTERED=1 (REGISTERED) makes one-shot do so at every rank count, to compare
      # with the perf-allreduce rows (the slabs) and so keep the auto policy's rank limit true.
      for n in 2 4 8; do
        WEFT_GPU_REGISTERED="${REGISTERED:-1}" WEFT_TIMEOUT_S=60 run "perf-registered-np$n" 120 "$dir/weft-perf" allreduce -np "$n" -b 8 -e 4M -f 4 -w 3 -n 20 -R 1 --algos oneshot,twoshot
      done
    fi
    echo quit | nvidia-cuda-mps-control
    sleep 1
  else
    summary+=("SKIP  gpu-processes-mps (the MPS daemon did not start)")
  fi
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
fi
if [[ "${FULL:-0}" == 1 ]]; then
  run unit-tests 600 "$dir/tests/weft_unit_tests" --gtest_brief=1
  run runtime-tests 900 "$dir/tests/weft_runtime_tests" --gtest_brief=1
fi
# Discovery against the real driver: NVML's GPUs and links, the CUDA driver's peer access.
run topo 60 "$dir/weft-topo" show
run topo-dump 60 "$dir/weft-topo" dump --out "$OUT/discovered.xml"
if [[ "${SAN:-1}" == 1 ]] && command -v compute-sanitizer >/dev/null; then
  # The sanitizer serializes a process's kernels, so ranks that wait on each other run one per
  # process (each its own sanitized process) or alone.
  san=(compute-sanitizer --error-exitcode 1 --target-processes all)
  export WEFT_TIMEOUT_S=300  # sanitized kernels run many times slower
  run memcheck-kernels 600 "${san[@]}" --tool memcheck "$dir/tests/weft_gpu_tests" --gtest_filter='*Float32*:*Bfloat16*:*Float8e4m3*:*Rejects*'
  run memcheck-one-rank 600 "${san[@]}" --tool memcheck "$T" --gtest_filter='*GpuThreads*/1ranks:GpuFaults.Bad*'
  # Ranks as forked processes: the sanitizer follows each child (it loads the driver into this
  # process, but the test forks before CUDA is initialized).
  run memcheck-processes 600 "${san[@]}" --tool memcheck "$T" --gtest_filter='*GpuProcesses.Collectives*/2ranks:*GpuProcesses.Collectives*/3ranks'
  run racecheck-processes 600 "${san[@]}" --tool racecheck "$T" --gtest_filter='*GpuProcesses.Collectives*/2ranks'
  run racecheck-kernels 600 "${san[@]}" --tool racecheck "$dir/tests/weft_gpu_tests" --gtest_filter='*Float16*'
  run racecheck-one-rank 600 "${san[@]}" --tool racecheck "$T" --gtest_filter='*GpuThreads.Every*/1ranks'
  # The tensor-parallel GEMMs: one rank as a thread, then 2 and 3 as weft-perf's forked processes
  # (every variant, shapes that are not multiples of 128; the bench checks C). racecheck stays on
  # bf16: cuBLASLt's own block-scaled fp8 kernel reports shared-memory hazards inside itself.
  run memcheck-tp-one-rank 600 "${san[@]}" --tool memcheck "$dir/tests/weft_gpu_tp_tests" \
    --gtest_filter='*GpuTp*/1ranks*:GpuTpErrors*'
  # cuBLASLt's candidates tuned and the wave-fitted tiles (fused/tp/tiles).
  run memcheck-tp-gemms 300 "${san[@]}" --tool memcheck "$dir/tests/weft_gpu_tests" \
    --gtest_filter='GpuTpGemms*'
  tp=(-w 1 -n 2 --algos "unfused,chunked:2,fused,fused:inplace")
  run memcheck-tp-rs-processes 300 "${san[@]}" --tool memcheck "$dir/weft-perf" gemm-rs -np 2 \
    --m 1000 --n 1000 --k 520 "${tp[@]}"
  run memcheck-tp-ag-processes 300 "${san[@]}" --tool memcheck "$dir/weft-perf" ag-gemm -np 3 \
    --m 1002 --n 1500 --k 520 "${tp[@]}"
  for op in gemm-rs ag-gemm; do
    run "memcheck-tp-$op-fp8-processes" 300 "${san[@]}" --tool memcheck "$dir/weft-perf" "$op" \
      -np 3 --m 1008 --n 1512 --k 1536 -d e4m3 --fp8-scales block "${tp[@]}"
    run "racecheck-tp-$op-processes" 300 "${san[@]}" --tool racecheck "$dir/weft-perf" "$op" \
      -np 2 --m 1000 --n 1000 --k 520 "${tp[@]}"
  done
fi
if [[ "${BENCH:-1}" == 1 ]]; then
  # The primitive against the device's copy bandwidth (bytes read + written).
  run bench-primitives 300 "$dir/weft-bench" --benchmark_filter='^gpu/' --benchmark_min_time=0.2
  # Small all-reduce latency, 2 ranks as threads, CUDA graph replay: one-shot against ring.
  run perf-latency 120 "$dir/weft-perf" allreduce -t 2 -b 8 -e 256K -f 4 -G 20 -c 1 --algos oneshot,ring
  grep -E '^gpu/' "$OUT/bench-primitives.log" | awk '{print $1, $NF}' >"$OUT/bench-table.txt" || true
fi
# The MPS sweeps as a fraction of the device's memory bandwidth: each algorithm's memory traffic
# (weft-plan verify) over the time, over the copy bandwidth weft-bench measured (1 GiB memcpy).
copy_tbs="${COPY_TBS:-}"
if [[ -z "$copy_tbs" && -f "$OUT/bench-primitives.log" ]]; then
  copy_tbs="$(awk '/^gpu\/memcpy\/bytes:1073741824\// {
      v = $NF; sub(/^bytes_per_second=/, "", v); x = v + 0
      if (v ~ /Ti\/s$/) x *= 1.099511627776; else if (v ~ /Gi\/s$/) x *= 0.001073741824
      printf "%.3f", x }' "$OUT/bench-primitives.log")"
fi
sweeps=("$OUT"/perf-allreduce-np*.log)
if [[ -n "$copy_tbs" && -f "${sweeps[0]}" ]]; then
  python3 "$WEFT_ROOT/scripts/gpu-memory-fraction.py" --plan "$dir/weft-plan" --copy-tbs "$copy_tbs" \
    "${sweeps[@]}" >"$OUT/memory-fraction.txt" 2>&1 || true
fi
{
  grep "^gpu-check:" "$OUT/gpu.txt"
  grep -E "PASSED|FAILED|SKIPPED" "$OUT/gpu-threads.log" | tail -3
  printf '%s\n' "${summary[@]}"
  [[ -f "$OUT/bench-table.txt" ]] && cat "$OUT/bench-table.txt"
  [[ -f "$OUT/sweeps.txt" ]] && cat "$OUT/sweeps.txt"
  for f in "$OUT"/perf-*.log; do
    [[ -f "$f" ]] || continue
    echo "== $(basename "$f" .log): the rows as weft-perf printed them"
    grep -E '^ +[0-9]+ +[0-9]+ |^# (WEFT_ALGO|Avg)|^#  +m ' "$f"
  done
  [[ -f "$OUT/memory-fraction.txt" ]] && cat "$OUT/memory-fraction.txt"
} 2>/dev/null | tee "$OUT/summary.txt"
if [[ "${BUNDLE:-0}" == 1 ]]; then
  pack="$(mktemp -d)"
  tar czf "$pack/logs.tgz" -C "$OUT" --exclude=./summary.txt . &&
    find "$OUT" -mindepth 1 -not -name summary.txt -delete && mv "$pack/logs.tgz" "$OUT/"
fi
exit $status
