#!/usr/bin/env bash
# Several GPUs of one host (issue 8): what weft sees of the fabric beside nvidia-smi's matrix,
# the GPU tests with one rank per GPU, weft against NCCL in nccl-tests' sweeps (normal and
# CUDA-graph), the GPU tuner's calibration and the regret of its picks with the file (every
# algorithm forced beside them), and PyTorch with one process per GPU. Runs prebuilt binaries:
# BUILD (default build/; build-carry/ from scripts/gpu-carry.sh works).
# NVLink multicast stays off everywhere (the machines' rule; weft never creates multicast
# objects). Logs under OUT (default ./out-multi); a summary is printed last.
#   STEPS     which steps, by name (default: topo tests perf graph calibrate torch)
#   MAXBYTES  the sweeps' largest size (default 1G; issue 8 asks up to 8G where time allows)
#   DEADLINE  seconds the whole script may take (default 560): a step that no longer fits is
#             skipped, and every step's limit is cut to what is left
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
build="${BUILD:-build}"
out="${OUT:-$PWD/out-multi}"
mkdir -p "$out"
steps="${STEPS:-topo tests perf graph calibrate torch}"
maxbytes="${MAXBYTES:-1G}"
deadline="${DEADLINE:-560}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
lib="$PWD/$build"
[[ -f "$build/libweft.so.0" ]] || lib="$PWD/$build/lib"
export LD_LIBRARY_PATH="$lib:/usr/local/cuda/lib64:/usr/local/cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
find_bin() {  # the binary in BUILD, laid out as a build or as build-carry
  for p in "$build/$1" "$build/tests/$1"; do
    [[ -x "$p" ]] && { echo "$p"; return; }
  done
}
perf=$(find_bin weft-perf)
topo=$(find_bin weft-topo)
tests=$(find_bin weft_gpu_runtime_tests)
gpus=$(nvidia-smi -L | grep -c '^GPU')
start=$SECONDS
summary=()
left() { echo $((deadline - (SECONDS - start))); }
want() { [[ " $steps " == *" $1 "* ]]; }
# run NAME LIMIT CMD...: the step's log in $out/NAME.log, its line in the summary.
run() {
  local name=$1 limit=$2
  shift 2
  local l
  l=$(left)
  ((l < 15)) && { summary+=("SKIP  $name (no time left)"); return; }
  ((limit > l)) && limit=$l
  local t0=$SECONDS
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  local what=PASS
  ((rc == 124)) && what=TIME
  ((rc != 0 && rc != 124)) && what=FAIL
  summary+=("$(printf '%-5s %-28s %4d s' "$what" "$name" $((SECONDS - t0)))")
}

echo "$gpus GPU(s)" | tee "$out/gpus.txt"
nvidia-smi -L >>"$out/gpus.txt"

if want topo; then
  run topo-smi 30 nvidia-smi topo -m
  [[ -n "$topo" ]] && run topo-weft 60 "$topo" show
fi

if want tests; then
  # One rank per GPU (the tests place rank r on GPU r mod the count), then more ranks than
  # GPUs, which share them: as threads, and as processes (time-sliced where they share).
  run tests-threads 240 "$tests" --gtest_filter='*GpuThreads.EveryCollective*:*GpuThreads.LargeAllReduce*:*GpuThreads.EveryAlgorithm*'
  run tests-processes 180 "$tests" --gtest_filter='*GpuProcesses.*'
  # A C program on weft's libnccl.so.2, GPU buffers, rank r on GPU r mod the count.
  shim=$(find_bin weft_nccl_shim_gpu_test)
  [[ -n "$shim" ]] && run tests-nccl-c 120 env LD_LIBRARY_PATH="$PWD/$build/nccl:$LD_LIBRARY_PATH" "$shim"
fi

sweep() {  # sweep NAME COLLECTIVE extra weft-perf flags...
  local name=$1 coll=$2
  shift 2
  run "$name" 120 "$perf" "$coll" -np "$gpus" -w 5 -n 20 -c 1 --compare nccl \
    --json "$out/$name.json" "$@"
}
if want perf; then
  for coll in allreduce allgather reducescatter alltoall; do
    sweep "perf-$coll" "$coll" -b 8 -e "$maxbytes" -f 4
  done
fi
if want graph; then
  # Small calls in CUDA graphs (issue 8's latency target for all-reduce: <= 0.5x NCCL's to 64
  # KB), NCCL's captured too.
  for coll in allreduce allgather reducescatter alltoall; do
    sweep "graph-$coll" "$coll" -b 8 -e 1M -f 2 -G 10
  done
fi
if want calibrate; then
  # Issue 8's third step: the tuning file for this machine (commit it under perf/tuning/), then
  # the regret of the picks it makes against every algorithm forced (scripts/regret.awk).
  run calibrate 120 "$perf" allreduce -np "$gpus" --gpu --calibrate "$out/tuning-${gpus}gpu.json"
  declare -A algos=([allreduce]=ring,dbtree,rhd,oneshot,twoshot [allgather]=ring,pat,oneshot
    [reducescatter]=ring,pat,oneshot [alltoall]=pairwise,bruck,oneshot)
  for coll in allreduce allgather reducescatter alltoall; do
    for mode in normal graph; do
      flags=(-b 8 -e "$maxbytes" -f 4)
      [[ $mode == graph ]] && flags=(-b 8 -e 16M -f 4 -G 10)
      run "regret-$mode-$coll" 130 env WEFT_TUNING_FILE="$out/tuning-${gpus}gpu.json" "$perf" \
        "$coll" -np "$gpus" -w 3 -n 10 -c 0 --algos "${algos[$coll]}" "${flags[@]}"
      awk -v algos="${algos[$coll]}" -f scripts/regret.awk "$out/regret-$mode-$coll.log" \
        >"$out/regret-$mode-$coll.txt"
    done
  done
fi
if want torch; then
  # torch_check.py puts local rank r on GPU r mod the count: one process per GPU here.
  run torch 240 env NPS="$gpus" OUT="$out/torch" BUILD="$build" scripts/torch-check.sh
fi

printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
for f in "$out"/regret-*.txt; do
  [[ -f "$f" ]] && echo "$(basename "$f" .txt): $(tail -1 "$f")"
done
for f in "$out"/perf-*.log "$out"/graph-*.log; do
  [[ -f "$f" ]] || continue
  echo "== $(basename "$f" .log)"
  grep -E '^ +[0-9]' "$f" | awk '{print $1, $6, $8}' | head -30
done
