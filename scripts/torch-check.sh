#!/usr/bin/env bash
# PyTorch on weft: tests/nccl/torch_check.py under torchrun with 2 and 4 processes (NPS), local
# rank r on GPU r mod the GPU count: on one GPU all share GPU 0
# (MPS started and stopped here), LD_PRELOAD naming weft's libnccl.so.2. Needs a CUDA build
# (BUILD, default build/) with libweft_nccl.so and a Python with PyTorch. Logs go to $OUT
# (default /tmp/torch-check). Exit 0 when every rank of every run passed.
set -uo pipefail
cd "$(dirname "$0")/.."
build="${BUILD:-build}"
out="${OUT:-/tmp/torch-check}"
mkdir -p "$out"
lib="$PWD/$build/nccl/libweft_nccl.so"
[[ -f "$lib" ]] || { echo "torch-check: $lib is missing (a CUDA build with nccl.h)" >&2; exit 1; }
python3 -c 'import torch' 2>/dev/null || { echo "torch-check: no PyTorch here" >&2; exit 1; }
mps="$(mktemp -d)"
export CUDA_MPS_PIPE_DIRECTORY="$mps/pipe" CUDA_MPS_LOG_DIRECTORY="$mps/log"
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
started=0
if command -v nvidia-cuda-mps-control >/dev/null && nvidia-cuda-mps-control -d; then started=1; fi
export WEFT_TIMEOUT_S="${WEFT_TIMEOUT_S:-60}"
status=0
for np in ${NPS:-2 4}; do
  if LD_PRELOAD="$lib" timeout 300 python3 -m torch.distributed.run --standalone \
      --nproc_per_node="$np" tests/nccl/torch_check.py >"$out/torch-np$np.log" 2>&1; then
    echo "PASS  torch-np$np ($(grep -c 'every check passed' "$out/torch-np$np.log") ranks)"
  else
    echo "FAIL  torch-np$np (see $out/torch-np$np.log)"
    tail -20 "$out/torch-np$np.log"
    status=1
  fi
done
if ((started)); then echo quit | nvidia-cuda-mps-control; fi
exit $status
