#!/usr/bin/env bash
# Installs what is missing, builds, runs every test with ctest. What CI runs.
#   SANITIZE=asan scripts/test.sh   AddressSanitizer + UBSan build in build-asan/
#   SANITIZE=tsan scripts/test.sh   ThreadSanitizer build in build-tsan/
#   BUILD_DIR=... CMAKE_ARGS=...    override the build folder / pass options
set -euo pipefail
source "$(dirname "$0")/common.sh"

install_dependencies

args=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DWEFT_TESTS=ON)
case "${SANITIZE:-}" in
  "") dir="${BUILD_DIR:-$WEFT_ROOT/build}" ;;
  asan) dir="${BUILD_DIR:-$WEFT_ROOT/build-asan}"; args+=(-DWEFT_ASAN=ON) ;;
  tsan) dir="${BUILD_DIR:-$WEFT_ROOT/build-tsan}"; args+=(-DWEFT_TSAN=ON) ;;
  *) echo "SANITIZE must be asan or tsan" >&2; exit 2 ;;
esac
# shellcheck disable=SC2206
args+=(${CMAKE_ARGS:-})

configure_and_build "$dir" "${args[@]}"

log "running tests"
cd "$dir"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$WEFT_ROOT/tests/lsan.supp}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
if [[ "${SANITIZE:-}" == tsan ]]; then
  # UCX's memory hooks (libucm patches mmap/munmap when it loads) crash under ThreadSanitizer's
  # own interceptors in every process that links UCX; weft needs no memory events.
  export UCX_MEM_MMAP_HOOK_MODE="${UCX_MEM_MMAP_HOOK_MODE:-none}"
  # Nor may UCX's own fatal-signal handlers run inside ThreadSanitizer's.
  export UCX_ERROR_SIGNALS="${UCX_ERROR_SIGNALS-}"
fi
ctest --output-on-failure -j "$JOBS" --timeout 900
