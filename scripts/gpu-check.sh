#!/usr/bin/env bash
# The GPU suite, for a machine with a GPU and no package installs (the H200 test machine):
# builds with CUDA, runs the GPU tests plainly and under compute-sanitizer, logs to $OUT.
set -uo pipefail
source "$(dirname "$0")/common.sh"
OUT="${OUT:-$WEFT_ROOT/out}"
mkdir -p "$OUT"
dir="${BUILD_DIR:-$WEFT_ROOT/build-gpu}"

nvidia-smi -L | tee "$OUT/gpu.txt"
configure_and_build "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DWEFT_CUDA=ON >"$OUT/build.log" 2>&1 || {
  tail -50 "$OUT/build.log"
  exit 1
}
status=0
run() {  # run NAME CMD...
  local name="$1"
  shift
  if timeout 600 "$@" >"$OUT/$name.log" 2>&1; then
    echo "PASS $name"
  else
    echo "FAIL $name (see $name.log)"
    tail -30 "$OUT/$name.log"
    status=1
  fi
}
run gpu-tests "$dir/tests/weft_gpu_tests"
run unit-tests "$dir/tests/weft_unit_tests" --gtest_brief=1
run runtime-tests "$dir/tests/weft_runtime_tests" --gtest_brief=1
# Discovery against the real driver: NVML's GPUs and links, the CUDA driver's peer access.
run topo "$dir/weft-topo" show
run topo-dump "$dir/weft-topo" dump --out "$OUT/discovered.xml"
if command -v compute-sanitizer >/dev/null; then
  run memcheck compute-sanitizer --tool memcheck --error-exitcode 1 "$dir/tests/weft_gpu_tests" --gtest_filter='*Float32*:*Bfloat16*:*Float8e4m3*:*Rejects*'
  run racecheck compute-sanitizer --tool racecheck --error-exitcode 1 "$dir/tests/weft_gpu_tests" --gtest_filter='*Float16*'
fi
grep -E "PASSED|FAILED|SKIPPED" "$OUT/gpu-tests.log" | tail -3
exit $status
