#!/usr/bin/env bash
# weft as another project uses it: installed into a temporary prefix and found by
# find_package and by pkg-config, built from source by add_subdirectory, and packaged as a
# Debian package whose files pass the same checks. Each way builds and runs examples/.
#   outside_project.sh BUILD_DIR SOURCE_DIR WORK_DIR [package|pkgconfig|subdirectory|deb]...
set -euo pipefail
# Gentle on the machine the rest of the suite runs on at the same time.
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-1}
build=$(cd "$1" && pwd) src=$(cd "$2" && pwd) work=$3
shift 3
ways=("$@")
((${#ways[@]})) || ways=(package pkgconfig subdirectory deb)
rm -rf "$work" && mkdir -p "$work"
step() { printf '== %s\n' "$*"; }

# run_examples DIR: the two examples built in DIR run and say so.
run_examples() {
  "$1/allreduce_threads" | grep -q "rank 3: ok"
  "$1/allreduce_c" | grep -q "all ranks ok"
}

# check_prefix PREFIX: what an install must hold.
check_prefix() {
  local p=$1 libdir
  libdir=$(dirname "$(find "$p" -name weft.pc | head -1)")/..
  for f in include/weft/weft.h include/weft/weft.hpp; do
    [[ -f $p/$f ]] || { echo "missing $f in $p" >&2; return 1; }
  done
  for f in libweft.so libweft.so.0 cmake/weft/weftConfig.cmake cmake/weft/weftConfigVersion.cmake \
           cmake/weft/weftTargets.cmake pkgconfig/weft.pc; do
    [[ -e $libdir/$f ]] || { echo "missing lib/$f in $p" >&2; return 1; }
  done
  if [[ -e $build/nccl/libnccl.so.2 ]]; then
    [[ -e $libdir/weft/libnccl.so.2 ]] || { echo "missing lib/weft/libnccl.so.2 in $p" >&2; return 1; }
    # The drop-in finds libweft from its own folder, with no LD_LIBRARY_PATH.
    local found
    found=$(ldd "$libdir/weft/libnccl.so.2" | awk '$1 == "libweft.so.0" {print $3}')
    [[ $(readlink -f "$found") == $(readlink -f "$libdir/libweft.so.0") ]] ||
      { echo "the drop-in loads libweft from '$found'" >&2; return 1; }
  fi
  if [[ -x $p/bin/weft-config ]]; then
    "$p/bin/weft-config" --version | grep -q "^weft-config 0\."
  fi
  # The Python package finds the installed library from its own place, with no WEFT_LIBRARY.
  if command -v python3 >/dev/null; then
    (unset WEFT_LIBRARY; PYTHONPATH=$libdir/python3/dist-packages python3 -c \
      'import weft, sys; sys.exit(0 if weft.version() > 0 and len(weft.unique_id()) == 128 else 1)') ||
      { echo "the installed Python package does not load its library" >&2; return 1; }
  fi
}

# with_package PREFIX: find_package(weft) from PREFIX.
with_package() {
  step "find_package from $1"
  cmake -S "$src/examples" -B "$work/package" -G Ninja -DCMAKE_PREFIX_PATH="$1" >/dev/null
  cmake --build "$work/package" >/dev/null
  run_examples "$work/package"
}

# with_pkgconfig PREFIX: plain compiler commands with pkg-config's flags.
with_pkgconfig() {
  step "pkg-config from $1"
  local pc libdir
  pc=$(dirname "$(find "$1" -name weft.pc | head -1)")
  export PKG_CONFIG_PATH=$pc
  pkg-config --exists weft
  libdir=$(pkg-config --variable=libdir weft)
  mkdir -p "$work/pkgconfig"
  # shellcheck disable=SC2046
  cc -std=c11 -Wall -Werror "$src/examples/allreduce.c" -o "$work/pkgconfig/allreduce_c" \
    $(pkg-config --cflags --libs weft) -pthread -Wl,-rpath,"$libdir"
  # shellcheck disable=SC2046
  c++ -std=c++17 -Wall -Werror "$src/examples/allreduce_threads.cpp" \
    -o "$work/pkgconfig/allreduce_threads" $(pkg-config --cflags --libs weft) -pthread \
    -Wl,-rpath,"$libdir"
  run_examples "$work/pkgconfig"
  unset PKG_CONFIG_PATH
}

for way in "${ways[@]}"; do
  case $way in
    package | pkgconfig)
      if [[ ! -d $work/prefix ]]; then
        step "cmake --install into $work/prefix"
        cmake --install "$build" --prefix "$work/prefix" >/dev/null
        check_prefix "$work/prefix"
      fi
      "with_$way" "$work/prefix"
      ;;
    subdirectory)
      # Without CUDA: the point is the CMake wiring; the kernels compile in weft's own build.
      step "add_subdirectory of $src"
      cmake -S "$src/examples" -B "$work/subdirectory" -G Ninja -DWEFT_FROM=subdirectory \
        -DWEFT_SOURCE="$src" -DWEFT_CUDA=OFF >/dev/null
      cmake --build "$work/subdirectory" >/dev/null
      run_examples "$work/subdirectory"
      ;;
    deb)
      # Installed by dpkg into a root of its own (its dependencies are this machine's, not
      # that root's database's, hence --force-depends), then removed again by dpkg.
      step "cpack -G DEB, installed by dpkg --root $work/deb/root"
      (cd "$build" && cpack -G DEB -B "$work/deb" >/dev/null)
      deb=$(find "$work/deb" -maxdepth 1 -name 'weft_*.deb' | head -1)
      dpkg-deb -f "$deb" Package Version Depends
      mkdir -p "$work/deb/root/var/lib/dpkg/info" "$work/deb/root/var/lib/dpkg/updates"
      touch "$work/deb/root/var/lib/dpkg/status"
      dpkg --root="$work/deb/root" --force-depends --force-not-root --force-script-chrootless \
        --log=/dev/null -i "$deb" >"$work/deb/dpkg.log" 2>&1 || { cat "$work/deb/dpkg.log" >&2; exit 1; }
      check_prefix "$work/deb/root/usr"
      rm -rf "$work/package"
      with_package "$work/deb/root/usr"
      with_pkgconfig "$work/deb/root/usr"
      dpkg --root="$work/deb/root" --force-not-root --force-script-chrootless --log=/dev/null \
        --remove weft >/dev/null
      [[ ! -e $work/deb/root/usr/lib/libweft.so.0 ]] || { echo "dpkg --remove left libweft" >&2; exit 1; }
      ;;
    *) echo "unknown way $way" >&2; exit 2 ;;
  esac
done
step "outside project: ${ways[*]} passed"
