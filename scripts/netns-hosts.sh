#!/usr/bin/env bash
# Hosts on one machine for multi-host tests: each "host" is a network namespace with its own
# interface (eth0 on a private bridge, 10.77.<net>.<h+1>/24), hostname and /dev/shm (a tmpfs in
# a mount namespace of its own), its link shaped with tc tbf. Needs root (CAP_NET_ADMIN and
# CAP_SYS_ADMIN), ip, tc, unshare and nsenter.
#   netns-hosts.sh up N [RATES]    make hosts 0..N-1; RATES: per-host link rates, comma-separated
#                                  (e.g. 10gbit,25gbit; the last repeats; none: unshaped)
#   netns-hosts.sh run H CMD...    run CMD on host H (its network, hostname and /dev/shm)
#   netns-hosts.sh addr H          host H's address
#   netns-hosts.sh link H up|down  set host H's link up or down (a cable pulled)
#   netns-hosts.sh down            remove every host, link and mount this set made
#   netns-hosts.sh with N [RATES] -- CMD...
#                                  up, CMD (with NETNS_HOSTS=N and this script as NETNS), down:
#                                  on success, failure or a signal
#   netns-hosts.sh check           exit 0 where hosts can be made here, else 77 saying why
# WEFT_NETNS_SET names the set (default weft), so that several can coexist; its state lives in
# /run/weft-netns/<set>.
set -euo pipefail

SET="${WEFT_NETNS_SET:-weft}"
STATE="/run/weft-netns/$SET"
BRIDGE="wb-$SET"
NET="${WEFT_NETNS_NET:-77}"
SELF="$(readlink -f "$0")"

die() {
  echo "netns-hosts: $*" >&2
  exit 1
}

check() {
  [[ $(id -u) -eq 0 ]] || { echo "netns-hosts: needs root"; exit 77; }
  for tool in ip tc unshare nsenter; do
    command -v "$tool" >/dev/null || { echo "netns-hosts: $tool is missing"; exit 77; }
  done
  local probe="wprobe-$$"
  if ! ip netns add "$probe" 2>/dev/null; then
    echo "netns-hosts: cannot make network namespaces here (no CAP_NET_ADMIN?)"
    exit 77
  fi
  ip netns del "$probe"
  if ! unshare --mount true 2>/dev/null; then
    echo "netns-hosts: cannot make mount namespaces here (no CAP_SYS_ADMIN?)"
    exit 77
  fi
}

ns() { echo "$SET-h$1"; }
addr() { echo "10.$NET.0.$(($1 + 1))"; }

# The process holding host H's mount and UTS namespaces (entered by nsenter).
holder() {
  local pid
  pid=$(cat "$STATE/h$1.pid" 2>/dev/null) || die "no host $1 in set $SET (run: $0 up N)"
  echo "$pid"
}

up() {
  local n=$1 rates=${2:-}
  [[ $n =~ ^[0-9]+$ && $n -ge 1 && $n -le 200 ]] || die "up: N must be 1..200"
  [[ -e $STATE ]] && die "set $SET exists (run: $0 down)"
  mkdir -p "$STATE"
  echo "$n" >"$STATE/hosts"
  ip link add "$BRIDGE" type bridge
  ip link set "$BRIDGE" up
  IFS=, read -r -a rate <<<"$rates"
  for ((h = 0; h < n; h++)); do
    local name veth="wv-$SET-$h"
    name=$(ns "$h")
    ip netns add "$name"
    ip link add "$veth" type veth peer name eth0 netns "$name"
    ip link set "$veth" master "$BRIDGE" up
    ip -n "$name" addr add "$(addr "$h")/24" dev eth0
    ip -n "$name" link set eth0 up
    ip -n "$name" link set lo up
    if ((${#rate[@]} > 0)); then
      local r=${rate[$((h < ${#rate[@]} ? h : ${#rate[@]} - 1))]}
      # Both ways: the bridge side shapes what reaches the host, eth0 what leaves it.
      tc qdisc add dev "$veth" root tbf rate "$r" burst 4mb latency 50ms
      ip netns exec "$name" tc qdisc add dev eth0 root tbf rate "$r" burst 4mb latency 50ms
      echo "$r" >"$STATE/h$h.rate"
    fi
    # A holder in the host's network namespace with its own mount, UTS and PID namespaces (as a
    # host of its own: a private tmpfs on /dev/shm, the hostname <set>-h<H>, no process of
    # another host in sight, so no shared-memory path to it either). Its first process, the
    # one commands enter, is found as unshare's child.
    ip netns exec "$name" unshare --mount --uts --pid --fork --propagation private \
      sh -c "mount -t tmpfs -o size=4g tmpfs /dev/shm && mount -t proc proc /proc &&
             hostname $SET-h$h && exec sleep infinity" &
    local parent=$!
    disown
    for _ in $(seq 100); do
      pgrep -P "$parent" >"$STATE/h$h.pid" 2>/dev/null && [[ -s $STATE/h$h.pid ]] && break
      sleep 0.05
    done
    [[ -s $STATE/h$h.pid ]] || die "host $h's holder did not start"
    # Until it has mounted and named itself.
    for _ in $(seq 100); do
      [[ $(nsenter -t "$(cat "$STATE/h$h.pid")" -u hostname) == "$SET-h$h" ]] && break
      sleep 0.05
    done
  done
}

down() {
  [[ -d $STATE ]] || return 0
  local n
  n=$(cat "$STATE/hosts" 2>/dev/null || echo 0)
  for ((h = 0; h < n; h++)); do
    if [[ -s $STATE/h$h.pid ]]; then
      # Everything still running on the host first, then its holder (its mounts go with it).
      local pid
      pid=$(cat "$STATE/h$h.pid")
      { ip netns pids "$(ns "$h")" 2>/dev/null || true; } | grep -vx "$pid" | xargs -r kill -9 2>/dev/null || true
      kill -9 "$pid" 2>/dev/null || true
    fi
    ip netns del "$(ns "$h")" 2>/dev/null || true
    ip link del "wv-$SET-$h" 2>/dev/null || true
  done
  ip link del "$BRIDGE" 2>/dev/null || true
  rm -rf "$STATE"
}

run() {
  local h=$1
  shift
  local pid
  pid=$(holder "$h")
  exec nsenter -t "$pid" -m -u -n -p -- "$@"
}

case "${1:-}" in
  check) check ;;
  up) shift; up "$@" ;;
  down) down ;;
  run) shift; run "$@" ;;
  addr) addr "$2" ;;
  link)
    ip link set "wv-$SET-$2" "$3"
    ;;
  with)
    shift
    n=$1
    shift
    rates=""
    if [[ ${1:-} != "--" ]]; then rates=$1; shift; fi
    [[ ${1:-} == "--" ]] || die "with N [RATES] -- CMD..."
    shift
    trap down EXIT
    trap 'exit 130' INT TERM
    up "$n" "$rates"
    NETNS_HOSTS=$n NETNS="$SELF" WEFT_NETNS_SET="$SET" "$@"
    ;;
  *)
    sed -n '2,21p' "$SELF" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
