#!/usr/bin/env bash
# Packs a CUDA build made here for a GPU machine that should not spend its time building:
# strips weft-perf, libweft.so.0 and the GPU test binaries of BUILD (default build/) into
# build-carry/ (git-ignored), which a remote run takes along (the device tool's `carry`).
# There, before running them:
#   export LD_LIBRARY_PATH=$PWD/build-carry:/usr/local/cuda/lib64:/usr/local/cuda/lib
# The binaries need the same CUDA major version there (13 on the H200 machine). MPS, where a
# run needs it, is started by that run (scripts/gpu-check.sh shows how).
set -euo pipefail
cd "$(dirname "$0")/.."
build="${BUILD:-build}"
out=build-carry
mkdir -p "$out"
for f in weft-perf lib/libweft.so.0 tests/weft_gpu_runtime_tests tests/weft_gpu_tests; do
  if [[ ! -f "$build/$f" ]]; then
    echo "gpu-carry: $build/$f is missing (build with CUDA first)" >&2
    exit 1
  fi
  strip -o "$out/$(basename "$f")" "$build/$f"
done
du -sh "$out"
