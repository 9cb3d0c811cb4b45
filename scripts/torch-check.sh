#!/usr/bin/env bash
# PyTorch on weft, from source: builds libweft.so and libweft_nccl.so (BUILD, default
# build-torch/; an existing build is reconfigured, so only what the header changes is rebuilt)
# against the nccl.h PyTorch ships with (its nvidia-nccl package, where that is NCCL 2.19-2.28;
# else the system's, or NCCL_INCLUDE), says in one line which, then runs tests/nccl/torch_check.py
# under torchrun with 2 and 4 processes (NPS), local rank r on GPU r mod the GPU count: on one GPU
# all share GPU 0 (MPS started and stopped here), LD_PRELOAD naming weft's libnccl.so.2. Needs
# nvcc and a Python with PyTorch. Then scripts/torch-ops-check.sh runs weft.torch's tests on the
# same library. Logs go to $OUT (default /tmp/torch-check). Exit 0 when every rank of every run
# passed.
#   WEFT_TORCH_CHECKS  the checks to run (torch_check.py; default every one)
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/common.sh
source scripts/common.sh
add_cuda_to_path
build="${BUILD:-build-torch}"
out="${OUT:-/tmp/torch-check}"
mkdir -p "$out"
python3 -c 'import torch' 2>/dev/null || { echo "torch-check: no PyTorch here" >&2; exit 1; }

# The version of the nccl.h in a folder, as 2.28.3.
header_version() {
  sed -n 's/^#define NCCL_\(MAJOR\|MINOR\|PATCH\) *\([0-9][0-9]*\).*/\2/p' "$1/nccl.h" | paste -sd.
}
inc="${NCCL_INCLUDE:-}"
why="NCCL_INCLUDE"
if [[ -z "$inc" ]]; then
  inc="$(python3 -c 'import os, nvidia.nccl as m
d = os.path.join(list(m.__path__)[0], "include")
print(d if os.path.isfile(os.path.join(d, "nccl.h")) else "")' 2>/dev/null)"
  why="PyTorch's nvidia-nccl"
  if [[ -n "$inc" ]]; then
    v="$(header_version "$inc")"
    if [[ "$(printf '%s\n2.19.0\n' "$v" | sort -V | head -1)" != 2.19.0 ||
      "$(printf '%s\n2.28.999\n' "$v" | sort -V | tail -1)" != 2.28.999 ]]; then
      echo "torch-check: PyTorch's nccl.h is $v, outside 2.19-2.28: the system's header instead"
      inc=""
    fi
  fi
  if [[ -z "$inc" ]]; then
    why="the first nccl.h found (NCCL_HOME, the system's, the CUDA toolkit's)"
  fi
fi
args=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DWEFT_CUDA=ON -DWEFT_NCCL_SHIM=ON)
[[ -n "$inc" ]] && args+=("-DWEFT_NCCL_INCLUDE_DIR=$inc")
t0=$SECONDS
if ! { cmake -S . -B "$build" -G Ninja "${args[@]}" && cmake --build "$build" -j "$JOBS" --target weft weft_nccl; } >"$out/build.log" 2>&1; then
  echo "torch-check: the build failed (see $out/build.log)"
  tail -30 "$out/build.log"
  exit 1
fi
header="$(grep -o 'NCCL interface ON.*' "$out/build.log" | tail -1)"
torch="$(python3 -c 'import torch; print(torch.__version__, "with NCCL", ".".join(map(str, torch.cuda.nccl.version())))' 2>/dev/null)"
echo "torch-check: built from source in $((SECONDS - t0)) s: ${header#NCCL interface ON } ($why); PyTorch $torch"
lib="$PWD/$build/nccl/libweft_nccl.so"

mps="$(mktemp -d)"
export CUDA_MPS_PIPE_DIRECTORY="$mps/pipe" CUDA_MPS_LOG_DIRECTORY="$mps/log"
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
started=0
if command -v nvidia-cuda-mps-control >/dev/null && nvidia-cuda-mps-control -d; then started=1; fi
export WEFT_TIMEOUT_S="${WEFT_TIMEOUT_S:-60}" PYTHONUNBUFFERED=1
status=0
for np in ${NPS:-2 4}; do
  t=$SECONDS
  if LD_PRELOAD="$lib" timeout "${LIMIT:-300}" python3 -m torch.distributed.run --standalone \
      --nproc_per_node="$np" tests/nccl/torch_check.py >"$out/torch-np$np.log" 2>&1; then
    echo "PASS  torch-np$np ($(grep -c 'every check passed' "$out/torch-np$np.log") ranks, $((SECONDS - t)) s)"
  else
    echo "FAIL  torch-np$np ($((SECONDS - t)) s, see $out/torch-np$np.log)"
    grep -E "FAIL|Error|error" "$out/torch-np$np.log" | head -20
    status=1
  fi
  grep -E "^ok " "$out/torch-np$np.log" | sed "s/^/  np$np /"
done
# weft.torch (the custom ops and the "weft" backend) against the library just built, under the
# same MPS daemon; WEFT_TORCH_OPS=0 skips it.
if [[ "${WEFT_TORCH_OPS:-1}" == 1 ]]; then
  WEFT_LIBRARY="$PWD/$build/lib/libweft.so.0" OUT="$out" scripts/torch-ops-check.sh
  rc=$?
  ((rc == 0 || rc == 77)) || status=1
fi
if ((started)); then echo quit | nvidia-cuda-mps-control; fi
exit $status
