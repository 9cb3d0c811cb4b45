#!/usr/bin/env bash
# One GPU call that chases a hang: builds the GPU runtime tests and weft-perf, runs one gtest
# filter REPEAT times as it is and REPEAT times with each environment in VARIANTS (a list of
# "NAME=VALUE" words, one variant each), then the MPS sweeps named in SWEEPS (weft-perf argument
# lists separated by ';'). Logs, one summary and one bundle under $OUT.
#   FILTER    gtest filter (default: the forced-algorithm test at 8 ranks)
#   FORCED    WEFT_TEST_FORCED for it (default: "ring/ll dbtree/ll"; "all": every pair)
#   REPEAT    runs per variant (default 3)
#   VARIANTS  e.g. "CUDA_DEVICE_MAX_CONNECTIONS=32"
#   DEADLINE  seconds after which no further repeat starts (default 420)
#   RUN_TIMEOUT  seconds one repeat may take (default 300)
#   CUDA_FLAGS extra nvcc flags of the build (a kernel A/B switch)
#   SWEEPS    e.g. "allreduce -np 2 -b 8 -e 4M -R 1;WEFT_GPU_CHANNELS=24 allreduce -np 4 ..."
set -uo pipefail
source "$(dirname "$0")/common.sh"
OUT="${OUT:-$WEFT_ROOT/out}"
mkdir -p "$OUT"
dir="${BUILD_DIR:-$WEFT_ROOT/build-gpu}"
add_cuda_to_path
{
  cmake -S "$WEFT_ROOT" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DWEFT_CUDA=ON \
    "-DCMAKE_CUDA_FLAGS=${CUDA_FLAGS:-}" &&
    cmake --build "$dir" -j "$JOBS" --target weft_gpu_runtime_tests weft-perf
} >"$OUT/build.log" 2>&1 || {
  tail -50 "$OUT/build.log"
  exit 1
}
summary=()
T="$dir/tests/weft_gpu_runtime_tests"
export WEFT_TIMEOUT_S="${WEFT_TIMEOUT_S:-10}" WEFT_TEST_FORCED="${FORCED-ring/ll dbtree/ll}"
[[ "$WEFT_TEST_FORCED" == all ]] && unset WEFT_TEST_FORCED
for v in "" ${VARIANTS:-}; do
  for ((i = 1; i <= ${REPEAT:-3}; ++i)); do
    if ((SECONDS > ${DEADLINE:-420})); then
      summary+=("SKIP  repeat $i ${v:-default}: past DEADLINE")
      continue
    fi
    name="repro${v:+-${v%%=*}}-$i"
    t0=$SECONDS
    if env ${v:+"$v"} timeout "${RUN_TIMEOUT:-300}" "$T" --gtest_filter="${FILTER:-*EveryAlgorithmAndProtocolForced/8ranks}" >"$OUT/$name.log" 2>&1; then
      summary+=("PASS  $name ${v:-default} ($((SECONDS - t0)) s)")
    else
      summary+=("FAIL  $name ${v:-default} ($((SECONDS - t0)) s): $(grep -m1 -A3 'Which is' "$OUT/$name.log" | tr '\n' ' ' | cut -c1-600)")
    fi
  done
done
if [[ -n "${SWEEPS:-}" ]] && command -v nvidia-cuda-mps-control >/dev/null; then
  mps="$(mktemp -d)"
  export CUDA_MPS_PIPE_DIRECTORY="$mps/pipe" CUDA_MPS_LOG_DIRECTORY="$mps/log"
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d
  k=0
  IFS=';' read -ra sweeps <<<"$SWEEPS"
  for s in "${sweeps[@]}"; do
    k=$((k + 1))
    t0=$SECONDS
    # Leading NAME=VALUE words are the sweep's environment.
    read -ra words <<<"$s"
    envs=(WEFT_TIMEOUT_S=60)
    while [[ ${#words[@]} -gt 0 && "${words[0]}" == *=* ]]; do
      envs+=("${words[0]}")
      words=("${words[@]:1}")
    done
    if env "${envs[@]}" timeout 150 "$dir/weft-perf" "${words[@]}" >"$OUT/sweep-$k.log" 2>&1; then
      summary+=("PASS  sweep-$k: $s ($((SECONDS - t0)) s)")
    else
      summary+=("FAIL  sweep-$k: $s ($((SECONDS - t0)) s)")
    fi
  done
  echo quit | nvidia-cuda-mps-control
fi
{
  printf '%s\n' "${summary[@]}"
  for f in "$OUT"/sweep-*.log; do
    [[ -f "$f" ]] || continue
    echo "== $(basename "$f" .log): $(grep -m1 -E '^# (weft-perf|nThread|Collective)' "$f")"
    grep -E '^ +[0-9]+ +[0-9]+ |^# (WEFT_ALGO|Avg)' "$f"
  done
} | tee "$OUT/summary.txt"
pack="$(mktemp -d)"
tar czf "$pack/logs.tgz" -C "$OUT" --exclude=./summary.txt . &&
  find "$OUT" -mindepth 1 -not -name summary.txt -delete && mv "$pack/logs.tgz" "$OUT/"
