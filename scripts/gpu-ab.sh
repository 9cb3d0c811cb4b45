#!/usr/bin/env bash
# An A/B experiment in one call of the GPU machine: builds weft-perf and weft-bench twice, side
# by side (A with A_FLAGS, B with B_FLAGS as extra CUDA compiler flags, e.g. -DSOME_SWITCH=1),
# starts MPS, and runs the same weft-perf sweeps with each, then the primitives' benchmark.
# Writes summary.txt (every table row, per variant) and logs.tgz (every log) to $OUT.
#   B_FLAGS  CUDA flags of variant B; A_FLAGS those of A (default none). With B_FLAGS unset only
#            A is built and run: one build of the sweeps, e.g. to check the tuner's picks
#   C_FLAGS, D_FLAGS  optional variants C and D, built and run beside A and B when set
#   A_SRC, B_SRC, ...  a variant built from that source tree instead of this one (e.g. the
#            commit before a change, `git archive REV | tar -x -C DIR`): before/after in one run
#   SWEEPS   weft-perf argument lines, one per line (default: 256 MB all-reduce at 2, 4 and 8
#            processes, ring, one-shot and two-shot forced)
#   ENVS     environment settings for every sweep, e.g. "WEFT_GPU_SLOT_BYTES=1048576"; a sweep
#            line may also start with its own NAME=VALUE words
#   BENCH=0  skip weft-bench
set -uo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "$0")/common.sh"
add_cuda_to_path
OUT="${OUT:-$WEFT_ROOT/out}"
logs="$OUT/logs"
mkdir -p "$logs"
sweeps="${SWEEPS:-allreduce -np 2 -b 64M -e 256M -f 4 -w 2 -n 5 -c 1 --algos ring,oneshot,twoshot
allreduce -np 4 -b 64M -e 256M -f 4 -w 2 -n 5 -c 1 --algos ring,oneshot,twoshot
allreduce -np 8 -b 64M -e 256M -f 4 -w 2 -n 5 -c 1 --algos ring,oneshot,twoshot}"
summary="$OUT/summary.txt"
: >"$summary"

variants=(a)
[[ -n "${B_FLAGS+set}" || -n "${B_SRC:-}" ]] && variants+=(b)
[[ -n "${C_FLAGS:-}" ]] && variants+=(c)
[[ -n "${D_FLAGS:-}" ]] && variants+=(d)
t0=$SECONDS
for v in "${variants[@]}"; do
  flags="${v^^}_FLAGS"
  src="${v^^}_SRC"
  src="${!src:-$WEFT_ROOT}"
  cmake -S "$src" -B "$WEFT_ROOT/build-ab-$v" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DWEFT_CUDA=ON "-DCMAKE_CUDA_FLAGS=${!flags:-}" >"$logs/configure-$v.log" 2>&1 || {
    tail -20 "$logs/configure-$v.log"
    exit 1
  }
done
share=$(((JOBS + ${#variants[@]} - 1) / ${#variants[@]}))
pids=()
for v in "${variants[@]}"; do
  cmake --build "$WEFT_ROOT/build-ab-$v" -j "$share" --target weft-perf weft-bench \
    >"$logs/build-$v.log" 2>&1 &
  pids+=($!)
done
failed=0
for i in "${!variants[@]}"; do
  wait "${pids[$i]}" || {
    failed=1
    tail -30 "$logs/build-${variants[$i]}.log"
  }
done
echo "build: $((SECONDS - t0)) s (A ${A_FLAGS:-none} ${A_SRC:-}, B ${B_FLAGS-unset} ${B_SRC:-}, C ${C_FLAGS:-unset}, D ${D_FLAGS:-unset})" |
  tee -a "$summary"
((failed == 0)) || exit 1

mps="$(mktemp -d)"
export CUDA_MPS_PIPE_DIRECTORY="$mps/pipe" CUDA_MPS_LOG_DIRECTORY="$mps/log"
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
nvidia-cuda-mps-control -d || echo "MPS did not start: processes time-slice" | tee -a "$summary"
export WEFT_TIMEOUT_S="${WEFT_TIMEOUT_S:-60}"
k=0
while IFS= read -r line; do
  [[ -z "$line" ]] && continue
  k=$((k + 1))
  for v in "${variants[@]}"; do
    name="sweep$k-$v"
    split_settings "$line"
    # shellcheck disable=SC2086  # ENVS is a list of settings, split on purpose
    env ${ENVS:-} "${envs[@]}" timeout 120 "$WEFT_ROOT/build-ab-$v/weft-perf" "${words[@]}" \
      >"$logs/$name.log" 2>&1
    echo "== $name (rc $?): weft-perf $line" >>"$summary"
    grep -E '^ +[0-9]+ +[0-9]+ |^# (WEFT_ALGO|Avg)' "$logs/$name.log" >>"$summary"
  done
done <<<"$sweeps"
echo quit | nvidia-cuda-mps-control >/dev/null 2>&1
if [[ "${BENCH:-1}" == 1 ]]; then
  for v in "${variants[@]}"; do
    timeout 150 "$WEFT_ROOT/build-ab-$v/weft-bench" --benchmark_filter='^gpu/' \
      --benchmark_min_time=0.2 >"$logs/bench-$v.log" 2>&1
    echo "== bench $v" >>"$summary"
    grep -E '^gpu/' "$logs/bench-$v.log" | awk '{print $1, $NF}' >>"$summary"
  done
fi
cat "$summary"
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$logs"
