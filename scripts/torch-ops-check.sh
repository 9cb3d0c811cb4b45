#!/usr/bin/env bash
# weft.torch (python/weft/torch) on a GPU machine: tests/python/test_torch.py with 2 and 4 ranks
# (NPS) as processes sharing the GPUs (rank r on GPU r mod the count; MPS started here and stopped
# after, unless a daemon already runs), each run under `timeout` (LIMIT, default 600 s); then the
# examples with 2 ranks (EXAMPLES=0 skips them) and, with PERF=1, perf/py_overhead.py. libweft
# comes from WEFT_LIBRARY, else $BUILD/lib (default build/), built with -DWEFT_CUDA=ON;
# PYTHONPATH gets python/. Logs go to $OUT (default /tmp): torch-ops-np<N>.log, example-<name>.log,
# py-overhead.log. Exit 0 when every run passed, 77 when python3 has no PyTorch with CUDA or
# there is no libweft, else 1.
#   WEFT_TORCH_OPS_CHECKS  only these checks of test_torch.py (comma-separated: backend,
#                          from_process_group, collectives, graph, gradcheck, compile, tp,
#                          attention, moe, compressed, ddp)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out="${OUT:-/tmp}"
mkdir -p "$out"
if ! python3 -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null
then
  echo "torch-ops-check: SKIP: python3 has no PyTorch with CUDA"
  exit 77
fi
lib="${WEFT_LIBRARY:-$PWD/${BUILD:-build}/lib/libweft.so.0}"
if [[ ! -e "$lib" ]]; then
  echo "torch-ops-check: SKIP: no libweft at $lib (cmake -DWEFT_CUDA=ON, or set WEFT_LIBRARY)"
  exit 77
fi
export WEFT_LIBRARY="$lib" PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 WEFT_TIMEOUT_S="${WEFT_TIMEOUT_S:-60}"
echo "torch-ops-check: $(python3 -c 'import torch; print("PyTorch", torch.__version__, "CUDA",
  torch.version.cuda, torch.cuda.get_device_name(0), "x", torch.cuda.device_count())'); $lib"

started=0
if [[ -z "${CUDA_MPS_PIPE_DIRECTORY:-}" ]] && command -v nvidia-cuda-mps-control >/dev/null; then
  mps="$(mktemp -d)"
  export CUDA_MPS_PIPE_DIRECTORY="$mps/pipe" CUDA_MPS_LOG_DIRECTORY="$mps/log"
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if nvidia-cuda-mps-control -d; then started=1; else echo "MPS did not start: ranks time-slice"; fi
fi
# shellcheck disable=SC2317  # run by the EXIT trap
stop_mps() { if ((started)); then echo quit | nvidia-cuda-mps-control; fi; }
trap stop_mps EXIT

status=0
for np in ${NPS:-2 4}; do
  log="$out/torch-ops-np$np.log"
  t=$SECONDS
  timeout "${LIMIT:-600}" python3 tests/python/test_torch.py --nprocs "$np" >"$log" 2>&1
  rc=$?
  if ((rc == 0)); then
    echo "PASS  torch-ops-np$np ($((SECONDS - t)) s)"
  elif ((rc == 77)); then
    echo "SKIP  torch-ops-np$np: $(grep -m1 SKIP "$log")"
  else
    why="exit $rc"
    ((rc == 124)) && why="timed out after ${LIMIT:-600} s"
    echo "FAIL  torch-ops-np$np ($why, $((SECONDS - t)) s; see $log)"
    grep -E -A12 "^FAIL" "$log" | head -40
    status=1
  fi
  grep -E "^ok " "$log" | sed "s/^/  np$np /"
done

run_torchrun() {  # NAME LOG SCRIPT [ARGS...]
  local name="$1" log="$2"
  shift 2
  local t=$SECONDS
  if timeout "${LIMIT:-600}" python3 -m torch.distributed.run --standalone --nproc_per_node=2 \
    "$@" >"$log" 2>&1; then
    echo "PASS  $name ($((SECONDS - t)) s)"
    grep -E "^\[rank 0\]" "$log" | tail -3 | sed "s/^/  /"
  else
    echo "FAIL  $name (see $log)"
    tail -20 "$log"
    status=1
  fi
}
if [[ "${EXAMPLES:-1}" == 1 ]]; then
  for ex in tp_mlp_decode cp_ring_attention moe_layer; do
    run_torchrun "example $ex" "$out/example-$ex.log" "examples/$ex.py"
  done
fi
if [[ "${PERF:-0}" == 1 ]]; then
  run_torchrun "py_overhead" "$out/py-overhead.log" perf/py_overhead.py
  grep -E "µs" "$out/py-overhead.log" | sed "s/^/  /"
fi
exit $status
