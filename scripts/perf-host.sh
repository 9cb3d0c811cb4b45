#!/usr/bin/env bash
# Host-memory performance on this machine, weft against Open MPI (issue 5's figures): the memory
# copy ceiling, then weft-perf under mpirun with --compare mpi for all-reduce, all-gather,
# reduce-scatter and all-to-all. Logs and JSON go to $OUT (default ./out).
#   NP=8 SIZES="-b 8 -e 128M -f 2" scripts/perf-host.sh
set -uo pipefail
source "$(dirname "$0")/common.sh"
OUT="${OUT:-$WEFT_ROOT/out}"
NP="${NP:-8}"
SIZES="${SIZES:--b 8 -e 128M -f 2}"
COLLS="${COLLS:-allreduce allgather reducescatter alltoall}"
mkdir -p "$OUT"
dir="${BUILD_DIR:-$WEFT_ROOT/build-perf}"
{
  add_cuda_to_path
  cmake -S "$WEFT_ROOT" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DWEFT_TESTS=OFF \
    -DWEFT_CUDA=OFF && cmake --build "$dir" -j "$JOBS" --target weft-perf weft-membw
} >"$OUT/perf-build.log" 2>&1 || {
  tail -40 "$OUT/perf-build.log"
  exit 1
}
lscpu | grep -E "Model name|^CPU\(s\)|NUMA node\(s\)|Socket" | tee "$OUT/machine.txt"
timeout 300 "$dir/weft-membw" 1,2,4,"$NP",$(nproc) 256M 10 | tee "$OUT/membw.txt"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Two cores per rank where the machine has them: weft's second channel runs on its own thread.
if ((NP * 2 <= $(nproc))); then bind=(--map-by slot:PE=2 --bind-to core); else bind=(--bind-to none); fi
mpi=(mpirun --oversubscribe -np "$NP" "${bind[@]}")
for coll in $COLLS; do
  # shellcheck disable=SC2086
  timeout 900 "${mpi[@]}" "$dir/weft-perf" "$coll" $SIZES -n 20 -w 5 --compare mpi \
    --json "$OUT/$coll.json" ${EXTRA:-} >"$OUT/$coll.txt" 2>&1
  echo "== $coll: exit $?"
  grep -vE "^#  Rank|^$" "$OUT/$coll.txt" | tail -32
done
