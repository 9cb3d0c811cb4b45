#!/usr/bin/env bash
# Hosts on one machine for multi-host tests: each "host" is a network namespace with its own
# interfaces (eth0 on a private bridge, 10.<net>.0.<h+1>/24; with WEFT_NETNS_IFACES=2 also eth1
# on a second bridge, 10.<net>.1.<h+1>/24), hostname, SysV IPC and /dev/shm (a tmpfs in a mount namespace
# of its own), its links shaped with tc tbf. The machine itself is 10.<net>.0.254 on the first
# bridge (mpirun's daemons call back there). Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN), ip,
# tc, unshare and nsenter.
#   netns-hosts.sh up N [RATES]    make hosts 0..N-1; RATES: per-host link rates, comma-separated
#                                  (e.g. 10gbit,25gbit; the last repeats; none: unshaped)
#   netns-hosts.sh run H CMD...    run CMD on host H (its network, hostname and /dev/shm)
#   netns-hosts.sh addr H [IF]     host H's address on eth0 (or IF: eth1)
#   netns-hosts.sh link H up|down [IF]
#                                  set host H's eth0 (or IF, or all) up or down (a cable pulled)
#   netns-hosts.sh kill H          kill every process of host H (the host crashed)
#   netns-hosts.sh partition H,... move these hosts' eth0 to a bridge of their own (a split
#                                  network: each side still reaches itself); heal undoes it
#   netns-hosts.sh rsh HOST CMD... Open MPI's launch agent (plm_rsh_agent): CMD on HOST, a
#                                  host's name (<set>-h<H>) or address, as ssh would
#   netns-hosts.sh mpirun PPN ARGS...
#                                  Open MPI's mpirun with PPN ranks on each host of the set,
#                                  launched through rsh, its traffic on the hosts' eth0
#   netns-hosts.sh down            remove every host, link and mount this set made
#   netns-hosts.sh with N [RATES] -- CMD...
#                                  up, CMD (with NETNS_HOSTS=N and this script as NETNS), down:
#                                  on success, failure or a signal
#   netns-hosts.sh check           exit 0 where hosts can be made here, else 77 saying why
# WEFT_NETNS_SET names the set (default weft), so that several can coexist; its state lives in
# /run/weft-netns/<set>. WEFT_NETNS_CPUS=split (at up) deals the machine's CPUs out to the hosts
# in turn, as hosts of their own would have (where hosts outnumber CPUs, host H gets CPU H mod
# the count): every process run on a host stays on its CPUs. The default, all, lets every host
# use every CPU.
set -euo pipefail

SET="${WEFT_NETNS_SET:-weft}"
STATE="/run/weft-netns/$SET"
BRIDGE="wb-$SET"
BRIDGE2="wc-$SET"  # eth1's
SPLIT="wp-$SET"    # the far side of a partition
NET="${WEFT_NETNS_NET:-77}"
IFACES="${WEFT_NETNS_IFACES:-1}"
CPUS="${WEFT_NETNS_CPUS:-all}"
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
addr() {
  case "${2:-eth0}" in
    eth0) echo "10.$NET.0.$(($1 + 1))" ;;
    eth1) echo "10.$NET.1.$(($1 + 1))" ;;
    *) die "addr: no interface ${2}" ;;
  esac
}
# The bridge-side end of host H's interface IF.
veth() { if [[ ${2:-eth0} == eth1 ]]; then echo "wx-$SET-$1"; else echo "wv-$SET-$1"; fi; }

# The process holding host H's mount and UTS namespaces (entered by nsenter).
holder() {
  local pid
  pid=$(cat "$STATE/h$1.pid" 2>/dev/null) || die "no host $1 in set $SET (run: $0 up N)"
  echo "$pid"
}

# The CPUs this process may use, one per line ("0-3,8" in /proc/self/status expanded).
machine_cpus() {
  local list part p
  list=$(awk '/^Cpus_allowed_list:/ {print $2}' /proc/self/status)
  IFS=, read -r -a part <<<"$list"
  for p in "${part[@]}"; do
    if [[ $p == *-* ]]; then seq "${p%-*}" "${p#*-}"; else echo "$p"; fi
  done
}

# WEFT_NETNS_CPUS=split: host H's CPUs into $STATE/hH.cpus (a taskset list).
deal_cpus() {
  local n=$1 cpus mine h i
  mapfile -t cpus < <(machine_cpus)
  for ((h = 0; h < n; h++)); do
    mine=()
    if ((${#cpus[@]} <= n)); then
      mine=("${cpus[$((h % ${#cpus[@]}))]}")
    else
      for ((i = h; i < ${#cpus[@]}; i += n)); do mine+=("${cpus[$i]}"); done
    fi
    (IFS=,; echo "${mine[*]}") >"$STATE/h$h.cpus"
  done
}

up() {
  local n=$1 rates=${2:-}
  [[ $n =~ ^[0-9]+$ && $n -ge 1 && $n -le 200 ]] || die "up: N must be 1..200"
  [[ -e $STATE ]] && die "set $SET exists (run: $0 down)"
  [[ $CPUS == all || $CPUS == split ]] || die "WEFT_NETNS_CPUS must be all or split"
  mkdir -p "$STATE"
  echo "$n" >"$STATE/hosts"
  [[ $CPUS == split ]] && deal_cpus "$n"
  [[ $IFACES == 1 || $IFACES == 2 ]] || die "WEFT_NETNS_IFACES must be 1 or 2"
  echo "$IFACES" >"$STATE/ifaces"
  ip link add "$BRIDGE" type bridge
  ip link set "$BRIDGE" up
  ip addr add "10.$NET.0.254/24" dev "$BRIDGE"
  if ((IFACES == 2)); then
    ip link add "$BRIDGE2" type bridge
    ip link set "$BRIDGE2" up
  fi
  IFS=, read -r -a rate <<<"$rates"
  for ((h = 0; h < n; h++)); do
    local name
    name=$(ns "$h")
    ip netns add "$name"
    ip -n "$name" link set lo up
    local ifs=(eth0)
    ((IFACES == 2)) && ifs+=(eth1)
    for dev in "${ifs[@]}"; do
      local side bridge=$BRIDGE
      side=$(veth "$h" "$dev")
      [[ $dev == eth1 ]] && bridge=$BRIDGE2
      ip link add "$side" type veth peer name "$dev" netns "$name"
      ip link set "$side" master "$bridge" up
      ip -n "$name" addr add "$(addr "$h" "$dev")/24" dev "$dev"
      ip -n "$name" link set "$dev" up
      if ((${#rate[@]} > 0)); then
        local r=${rate[$((h < ${#rate[@]} ? h : ${#rate[@]} - 1))]}
        # Both ways: the bridge side shapes what reaches the host, the host's side what leaves.
        tc qdisc add dev "$side" root tbf rate "$r" burst 4mb latency 50ms
        ip netns exec "$name" tc qdisc add dev "$dev" root tbf rate "$r" burst 4mb latency 50ms
        echo "$r" >"$STATE/h$h.rate"
      fi
    done
    # A holder in the host's network namespace with its own mount, UTS, IPC and PID namespaces
    # (as a host of its own: a private tmpfs on /dev/shm, the hostname <set>-h<H>, its own SysV
    # segments, no process of another host in sight, so no shared-memory path to it either:
    # UCX's sysv transport crossed the hosts while they shared the IPC namespace). Its first
    # process, the one commands enter, is found as unshare's child.
    ip netns exec "$name" unshare --mount --uts --ipc --pid --fork --propagation private \
      sh -c "mount -t tmpfs -o size=4g tmpfs /dev/shm && mount -t proc proc /proc &&
             hostname $SET-h$h && exec sleep infinity" 2>>"$STATE/h$h.err" &
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
    ip link del "$(veth "$h" eth0)" 2>/dev/null || true
    ip link del "$(veth "$h" eth1)" 2>/dev/null || true
  done
  ip link del "$BRIDGE" 2>/dev/null || true
  ip link del "$BRIDGE2" 2>/dev/null || true
  ip link del "$SPLIT" 2>/dev/null || true
  rm -rf "$STATE"
}

run() {
  local h=$1
  shift
  local pid
  pid=$(holder "$h")
  if [[ -s $STATE/h$h.cpus ]]; then
    exec nsenter -t "$pid" -m -u -i -n -p -- taskset -c "$(cat "$STATE/h$h.cpus")" "$@"
  fi
  exec nsenter -t "$pid" -m -u -i -n -p -- "$@"
}

# Every process of host H: its holder is the PID namespace's first process, so the kernel ends
# the rest with it.
crash() {
  local pid
  pid=$(holder "$1")
  kill -9 "$pid"
  rm -f "$STATE/h$1.pid"
}

partition() {
  ip link show "$SPLIT" >/dev/null 2>&1 || {
    ip link add "$SPLIT" type bridge
    ip link set "$SPLIT" up
  }
  IFS=, read -r -a far <<<"$1"
  for h in "${far[@]}"; do ip link set "$(veth "$h" eth0)" master "$SPLIT"; done
}

heal() {
  local n
  n=$(cat "$STATE/hosts")
  for ((h = 0; h < n; h++)); do ip link set "$(veth "$h" eth0)" master "$BRIDGE"; done
  ip link del "$SPLIT" 2>/dev/null || true
}

# Open MPI calls its agent as ssh: AGENT [options] HOST WORDS..., the words one shell command.
rsh() {
  while [[ ${1:-} == -* ]]; do shift; done
  local host=$1 h="" n
  shift
  n=$(cat "$STATE/hosts" 2>/dev/null) || die "rsh: no set $SET"
  for ((i = 0; i < n; i++)); do
    if [[ $host == "$(ns "$i")" || $host == "$(addr "$i")" || $host == "$(addr "$i" eth1)" ]]; then
      h=$i
    fi
  done
  [[ -n $h ]] || die "rsh: no host $host in set $SET"
  run "$h" sh -c "$*"
}

# mpirun PPN ARGS...: the set's hosts by address, PPN slots each. Each "host" sees every core of
# the machine, so Open MPI's binding (core 0 onwards on each) would stack the hosts' ranks on the
# same cores: unbound (WEFT_NETNS_CPUS=split keeps each host's ranks on its own CPUs).
launch() {
  local ppn=$1 n hosts="" root=()
  shift
  [[ $ppn =~ ^[0-9]+$ && $ppn -ge 1 ]] || die "mpirun: PPN must be a number of ranks per host"
  n=$(cat "$STATE/hosts" 2>/dev/null) || die "mpirun: no set $SET"
  for ((h = 0; h < n; h++)); do hosts+="${hosts:+,}$(addr "$h"):$ppn"; done
  [[ $(id -u) -eq 0 ]] && root=(--allow-run-as-root)
  exec mpirun "${root[@]}" --host "$hosts" --bind-to none \
    --mca plm_rsh_agent "$SELF rsh" --mca orte_keep_fqdn_hostnames 1 \
    --mca oob_tcp_if_include "10.$NET.0.0/24" --mca btl_tcp_if_include "10.$NET.0.0/24" \
    --mca btl self,vader,tcp -x WEFT_NETNS_SET="$SET" "$@"
}

case "${1:-}" in
  check) check ;;
  up) shift; up "$@" ;;
  down) down ;;
  run) shift; run "$@" ;;
  addr) addr "$2" "${3:-eth0}" ;;
  link)
    if [[ ${4:-eth0} == all ]]; then
      ip link set "$(veth "$2" eth0)" "$3"
      ip link show "$(veth "$2" eth1)" >/dev/null 2>&1 && ip link set "$(veth "$2" eth1)" "$3"
    else
      ip link set "$(veth "$2" "${4:-eth0}")" "$3"
    fi
    ;;
  kill) crash "$2" ;;
  partition) partition "$2" ;;
  heal) heal ;;
  rsh) shift; rsh "$@" ;;
  mpirun) shift; launch "$@" ;;
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
    sed -n '2,28p' "$SELF" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
