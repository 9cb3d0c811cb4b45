#!/usr/bin/env bash
# Builds libweft_nccl.so and its tests against the nccl.h of each NCCL release given, from a git
# checkout of NCCL's sources (the header is made from src/nccl.h.in as NCCL's build makes it),
# and runs the NCCL interface's tests (the C API on host memory, the device API where the header
# has it, the exports against that header's function list). One line per release.
#   NCCL_SRC=~/src/nccl scripts/nccl-header-matrix.sh v2.19.3-1 v2.24.3-1 v2.28.3-1
#   BUILD_DIR  a configured CUDA build to reconfigure (default build/); it is pointed back at the
#              header it had when done
set -uo pipefail
source "$(dirname "$0")/common.sh"
add_cuda_to_path
src="${NCCL_SRC:?set NCCL_SRC to a git checkout of NCCL}"
dir="${BUILD_DIR:-$WEFT_ROOT/build}"
[[ -f "$dir/CMakeCache.txt" ]] || { echo "$dir is not a configured build" >&2; exit 1; }
before="$(sed -n 's/^WEFT_NCCL_INCLUDE_DIR:PATH=//p' "$dir/CMakeCache.txt")"
work="$(mktemp -d)"
trap 'rm -rf "$work"; cmake -B "$dir" -DWEFT_NCCL_INCLUDE_DIR="$before" >/dev/null' EXIT
status=0
for tag in "$@"; do
  inc="$work/$tag/include"
  mkdir -p "$inc"
  version="$(git -C "$src" show "$tag:makefiles/version.mk")" || { echo "FAIL  $tag: no such tag"; status=1; continue; }
  major="$(sed -n 's/^NCCL_MAJOR *:= *//p' <<<"$version")"
  minor="$(sed -n 's/^NCCL_MINOR *:= *//p' <<<"$version")"
  patch="$(sed -n 's/^NCCL_PATCH *:= *//p' <<<"$version")"
  code=$((major * 10000 + minor * 100 + patch))
  git -C "$src" show "$tag:src/nccl.h.in" |
    sed -e "s/\${nccl:Major}/$major/g" -e "s/\${nccl:Minor}/$minor/g" -e "s/\${nccl:Patch}/$patch/g" \
      -e "s/\${nccl:Suffix}//g" -e "s/\${nccl:Version}/$code/g" >"$inc/nccl.h"
  # The device API's headers, where the release has them.
  if git -C "$src" cat-file -e "$tag:src/include/nccl_device" 2>/dev/null; then
    git -C "$src" archive "$tag" src/include/nccl_device src/include/nccl_device.h |
      tar -x -C "$work/$tag" && cp -r "$work/$tag/src/include/"* "$inc/"
  fi
  log="$work/$tag.log"
  targets=(weft_nccl weft_nccl_shim_test weft_nccl_shim_gpu_test)
  [[ -d "$inc/nccl_device" ]] && targets+=(weft_nccl_device_api_test)
  if cmake -B "$dir" -DWEFT_NCCL_INCLUDE_DIR="$inc" >"$log" 2>&1 &&
    cmake --build "$dir" -j "$JOBS" --target "${targets[@]}" >>"$log" 2>&1 &&
    (cd "$dir" && ctest -R '^nccl_shim' --output-on-failure) >>"$log" 2>&1; then
    echo "PASS  $tag: $(grep -o 'NCCL interface ON.*' "$log" | head -1)"
  else
    echo "FAIL  $tag"
    grep -E "error|FAIL|Error" "$log" | head -20
    status=1
  fi
done
exit $status
