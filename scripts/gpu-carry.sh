#!/usr/bin/env bash
# Packs a CUDA build made here for a GPU machine that should not spend its time building:
# strips weft-perf, libweft.so.0, the GPU test binaries and (where built) the NCCL interface of
# BUILD (default build/) into build-carry/ (git-ignored), which a remote run takes along (the
# device tool's `carry`).
# There, before running them:
#   export LD_LIBRARY_PATH=$PWD/build-carry:/usr/local/cuda/lib64:/usr/local/cuda/lib
# The binaries need the same CUDA major version there (13 on the H200 machine). MPS, where a
# run needs it, is started by that run (scripts/gpu-check.sh shows how).
set -euo pipefail
cd "$(dirname "$0")/.."
build="${BUILD:-build}"
out="build-carry"
mkdir -p "$out"
for f in weft-perf lib/libweft.so.0 tests/weft_gpu_runtime_tests tests/weft_gpu_tests \
  weft-topo; do
  if [[ ! -f "$build/$f" ]]; then
    echo "gpu-carry: $build/$f is missing (build with CUDA first)" >&2
    exit 1
  fi
  strip -o "$out/$(basename "$f")" "$build/$f"
done
# The NCCL interface, laid out as in the build (its RUNPATH finds libweft.so.0 in ../lib), for
# BUILD=build-carry scripts/torch-check.sh there.
if [[ -f "$build/nccl/libweft_nccl.so" ]]; then
  mkdir -p "$out/nccl" "$out/lib"
  strip -o "$out/nccl/libweft_nccl.so" "$build/nccl/libweft_nccl.so"
  ln -sf libweft_nccl.so "$out/nccl/libnccl.so.2"
  cp "$out/libweft.so.0" "$out/lib/libweft.so.0"
  for t in weft_nccl_shim_test weft_nccl_shim_gpu_test weft_nccl_device_api_test; do
    [[ -f "$build/tests/$t" ]] && strip -o "$out/$t" "$build/tests/$t"
  done
fi
du -sh "$out"
