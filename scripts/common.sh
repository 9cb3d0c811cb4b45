# Shared by demo.sh, test.sh and gpu-check.sh: install what is missing, configure, build.
# Sourced, not run.

WEFT_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
JOBS="${JOBS:-$(nproc 2>/dev/null || echo 2)}"

# Debian packages the build and tests need. Installed only when missing, quietly.
WEFT_PACKAGES=(cmake ninja-build g++ pkg-config googletest libgtest-dev libgmock-dev libcli11-dev
  libexpat1-dev libhwloc-dev nlohmann-json3-dev libucx-dev libopenmpi-dev openmpi-bin libbenchmark-dev
  python3 python3-numpy)

log() { printf '\033[1m== %s\033[0m\n' "$*"; }

install_dependencies() {
  local missing=()
  for pkg in "${WEFT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  if ((${#missing[@]} == 0)); then
    return 0
  fi
  if ! command -v apt-get >/dev/null; then
    echo "missing packages: ${missing[*]} (no apt-get here: install them by hand)" >&2
    return 1
  fi
  log "installing ${missing[*]}"
  local sudo=""
  if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# split_settings LINE: a sweep line's leading NAME=VALUE words into the array envs, the rest
# (weft-perf's arguments) into the array words.
split_settings() {
  read -ra words <<<"$1"
  envs=()
  while [[ ${#words[@]} -gt 0 && "${words[0]}" == *=* ]]; do
    envs+=("${words[0]}")
    words=("${words[@]:1}")
  done
}

# The CUDA toolkit lives outside PATH on the project's machines.
add_cuda_to_path() {
  if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
    export PATH="/usr/local/cuda/bin:$PATH"
  fi
}

# configure_and_build BUILD_DIR [cmake args...]
configure_and_build() {
  local dir="$1"
  shift
  add_cuda_to_path
  log "configuring $dir"
  mkdir -p "$dir"
  cmake -S "$WEFT_ROOT" -B "$dir" -G Ninja "$@" >"$dir/configure.log" 2>&1 || {
    cat "$dir/configure.log" >&2
    return 1
  }
  grep -E "^-- weft:" "$dir/configure.log" || true
  log "building $dir with $JOBS jobs"
  cmake --build "$dir" -j "$JOBS"
}
