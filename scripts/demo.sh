#!/usr/bin/env bash
# The main job: installs what is missing, builds, and shows what weft does today: the topology,
# the tuner, the schedules, then a perf sweep on NP local ranks (4 by default) against Open MPI.
#   NP=8 scripts/demo.sh
set -euo pipefail
source "$(dirname "$0")/common.sh"

install_dependencies
dir="${BUILD_DIR:-$WEFT_ROOT/build}"
configure_and_build "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null

log "this machine, as weft's discovery sees it"
"$dir/weft-topo" show

log "an 8x H100 HGX node (fixture), four of them on a rail-optimized fabric"
"$dir/weft-topo" show --file "$WEFT_ROOT/topology/fixtures/hgx_h100.xml" --nodes 4 | head -3

log "the tuner on 8 such nodes: all-reduce from 8 B to 1 GiB, every candidate simulated"
"$dir/weft-plan" tune --topo "$WEFT_ROOT/topology/fixtures/hgx_h100.xml" --nodes 8 --coll allreduce --sizes 8:1G:8

log "the algorithms and the collectives they implement"
"$dir/weft-plan" list

log "one rank's steps: ring all-reduce, 4 ranks, rank 1"
"$dir/weft-plan" show --algo ring --coll allreduce --ranks 4 --rank 1

log "PAT reduce-scatter, 12 ranks, aggregation 2, rank 0"
"$dir/weft-plan" show --algo pat --coll reducescatter --ranks 12 --rank 0 --aggregation 2

log "the host runtime: four ranks as threads all-reduce 1 Mi floats (the log shows the pick)"
WEFT_DEBUG=INFO WEFT_DEBUG_SUBSYS=INIT,TUNING "$dir/examples/allreduce_threads"

log "every schedule verified: 1..64 ranks and 96..1000, in place and out of place"
"$dir/weft-plan" verify

NP="${NP:-4}"
sizes=(-b 8 -e 64M -f 8 -n 10 -w 2)
summary=()
for coll in allreduce allgather reducescatter alltoall; do
  log "weft-perf $coll on $NP local ranks (host memory), Open MPI beside it"
  if command -v mpirun >/dev/null && [[ -x "$dir/weft-perf" ]]; then
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 900 \
      mpirun --oversubscribe -np "$NP" "$dir/weft-perf" "$coll" "${sizes[@]}" --compare mpi |
      grep -v "^#  Rank" | tee "$dir/demo-$coll.txt"
  else
    timeout 900 "$dir/weft-perf" "$coll" -np "$NP" --host "${sizes[@]}" | grep -v "^#  Rank" |
      tee "$dir/demo-$coll.txt"
  fi
  summary+=("$(printf '%-14s %s' "$coll" "$(grep -E "Avg bus bandwidth|geometric mean" "$dir/demo-$coll.txt" |
    sed 's/^# *//' | paste -sd ';' -)")")
done

if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  log "GPU present: the device kernels' tests"
  "$dir/tests/weft_gpu_tests" --gtest_brief=1 || true
  if [[ -x "$dir/weft-perf" ]]; then
    log "weft-perf allreduce on GPU memory: $NP ranks as threads of one process sharing the GPU"
    timeout 900 "$dir/weft-perf" allreduce --gpu -t "$NP" -b 8 -e 256M -f 8 -n 10 -w 2 |
      grep -v "^#  Rank" | tee "$dir/demo-gpu-allreduce.txt"
    summary+=("$(printf '%-14s %s' "allreduce/GPU" "$(grep -E "Avg bus bandwidth" \
      "$dir/demo-gpu-allreduce.txt" | sed 's/^# *//')")")
  fi
fi

log "summary: weft-perf on $NP ranks (busbw in GB/s; ratio > 1: weft faster than Open MPI; GPU: no peer)"
printf '%s\n' "${summary[@]}"
