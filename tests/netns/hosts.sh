#!/usr/bin/env bash
# weft across "hosts" made of network namespaces (scripts/netns-hosts.sh): 4 hosts with two
# interfaces each, shaped links. Every collective of weft-perf, checked, at 2 hosts x 2 ranks
# (UCX between hosts, shared memory within), every type and op at 3 x 3 and 4 x 1, in and out of
# place; MoE dispatch and combine by the flat and the hierarchical path; launched by mpirun
# through the set's launch agent; --calibrate measuring the network; WEFT_SOCKET_IFNAME moving
# the traffic to eth0 or eth1; host 1's link pulled, a partition, a crashed host, each
# mid-sweep: every survivor must report an error within the timeout. No /dev/shm segment may be
# left on any host, and nothing (namespaces, links, state) after. With WEFT_NETNS_CPUS=split,
# each host's processes stay on its share of the CPUs. Exit 77 (skipped) where
# namespaces cannot be made here.
#   hosts.sh WEFT_PERF
set -uo pipefail
perf=$(readlink -f "$1")
export perf
here="$(cd "$(dirname "$0")" && pwd)"
netns="$here/../../scripts/netns-hosts.sh"
export WEFT_NETNS_SET="t$$" WEFT_NETNS_IFACES=2
"$netns" check || exit $?

body() {
  local status=0 port=$((29000 + $$ % 1000))
  # run_ranks LABEL TIMEOUT HOSTS THREADS IFACE weft-perf-arguments...: one process on each of
  # hosts 0..HOSTS-1 with THREADS ranks, the root on host 0's IFACE; prints the exit codes.
  run_ranks() {
    local label=$1 limit=$2 hosts=$3 threads=$4 iface=$5
    shift 5
    local root pids=() codes=""
    root="$("$NETNS" addr 0 "$iface"):$port"
    for ((h = 0; h < hosts; h++)); do
      timeout "$limit" "$NETNS" run "$h" env WEFT_COMM_ID="$root" WEFT_SOCKET_IFNAME="$iface" \
        WEFT_RANK="$h" WEFT_NRANKS="$hosts" WEFT_TIMEOUT_S=10 "$perf" "$@" -t "$threads" --host \
        >"$TMPDIR/$label.$h.log" 2>&1 &
      pids+=($!)
    done
    for p in "${pids[@]}"; do
      wait "$p"
      codes+="$? "
    done
    port=$((port + 1))
    echo "${codes% }"
  }
  fail() {
    echo "FAIL $*"
    status=1
  }
  # Nothing in any host's /dev/shm once its processes are gone.
  shm_clean() {
    local left
    for ((h = 0; h < NETNS_HOSTS; h++)); do
      left=$("$NETNS" run "$h" sh -c 'ls /dev/shm' 2>/dev/null | wc -l)
      ((left == 0)) || fail "$1: $left /dev/shm entries left on host $h"
    done
  }
  # Bytes host 1 received on IFACE (counted at the bridge's end of its cable).
  rx() { cat "/sys/class/net/wv-$WEFT_NETNS_SET-1/statistics/tx_bytes" 2>/dev/null; }
  rx1() { cat "/sys/class/net/wx-$WEFT_NETNS_SET-1/statistics/tx_bytes" 2>/dev/null; }

  # Hosts apart in SysV IPC too: else UCX's sysv transport carries their messages, not eth0.
  local ipc0 ipc1
  ipc0=$("$NETNS" run 0 readlink /proc/self/ns/ipc)
  ipc1=$("$NETNS" run 1 readlink /proc/self/ns/ipc)
  if [[ $ipc0 == "$ipc1" || $ipc0 == "$(readlink /proc/self/ns/ipc)" ]]; then
    fail "hosts 0 and 1 share an IPC namespace ($ipc0, $ipc1)"
  else
    echo "ok   each host has its own IPC namespace"
  fi
  for coll in allreduce allgather reducescatter alltoall broadcast; do
    codes=$(run_ranks "$coll" 120 2 2 eth0 "$coll" -b 8 -e 8M -f 8 -n 3 -w 1 -c 1)
    if [[ $codes != "0 0" ]] || ! grep -q "on *$WEFT_NETNS_SET-h1" "$TMPDIR/$coll.0.log"; then
      fail "$coll across 2 hosts: exit codes $codes"
      tail -n 5 "$TMPDIR/$coll".*.log
    else
      echo "ok   $coll across 2 hosts ($(grep -c '^ *[0-9]' "$TMPDIR/$coll.0.log") sizes checked)"
    fi
  done
  # Every type and op: 3 hosts x 3 ranks, then 4 hosts x 1 rank.
  for layout in "3 3" "4 1"; do
    read -r nh nt <<<"$layout"
    for coll in allreduce reducescatter reduce; do
      codes=$(run_ranks "all-$coll" 200 "$nh" "$nt" eth0 "$coll" -b 64 -e 64K -f 32 -n 1 -w 0 -c 1 -d all -o all)
      local rows
      rows=$(grep -c '^ *[0-9]' "$TMPDIR/all-$coll.0.log")
      if [[ $codes == *[1-9]* ]] || ((rows < 150)); then
        fail "$coll, every type and op, $nh hosts x $nt ranks: exit codes $codes, $rows rows"
        tail -n 5 "$TMPDIR/all-$coll".*.log
      else
        echo "ok   $coll, every type and op, $nh hosts x $nt ranks ($rows rows checked)"
      fi
    done
    for coll in allgather alltoall broadcast sendrecv; do
      codes=$(run_ranks "all-$coll" 200 "$nh" "$nt" eth0 "$coll" -b 64 -e 64K -f 32 -n 1 -w 0 -c 1 -d all)
      if [[ $codes == *[1-9]* ]]; then
        fail "$coll, every type, $nh hosts x $nt ranks: exit codes $codes"
        tail -n 5 "$TMPDIR/all-$coll".*.log
      else
        echo "ok   $coll, every type, $nh hosts x $nt ranks"
      fi
    done
  done
  shm_clean "after the collectives"

  # MoE dispatch and combine across hosts, checked, by both paths: the hierarchical one sends a
  # token once per host, so host 1 receives fewer bytes (fp8 dispatch: no plain all-to-all-v
  # MoE runs beside it).
  local moe_rx=()
  for path in flat hierarchical; do
    local before=$(rx)
    codes=$(WEFT_MOE_PATH=$path WEFT_DEBUG=INFO WEFT_DEBUG_SUBSYS=TUNING run_ranks "moe-$path" 120 2 2 eth0 \
      moe --tokens 64,512 --hidden 1024 --topk 8 --experts 16 --dispatch-dtype fp8 -n 2 -w 1)
    moe_rx+=($(($(rx) - before)))
    if [[ $codes != "0 0" ]] || ! grep -q "INFO moe .*; $path" "$TMPDIR/moe-$path.0.log"; then
      fail "moe across 2 hosts, $path: exit codes $codes"
      tail -n 5 "$TMPDIR/moe-$path".*.log
    else
      echo "ok   moe across 2 hosts x 2 ranks, $path: checked, host 1 received $((moe_rx[-1] >> 20)) MiB"
    fi
  done
  ((moe_rx[1] < moe_rx[0] * 3 / 4)) ||
    fail "moe: the hierarchical path's host 1 received ${moe_rx[1]} B, the flat one's ${moe_rx[0]}"

  # Open MPI across the hosts through the set's launch agent, weft beside MPI. Open MPI does not
  # free what it allocates: an ASan build's ranks check no leaks here (as perf/CMakeLists.txt's
  # mpirun tests).
  if command -v mpirun >/dev/null; then
    timeout 120 "$NETNS" mpirun 2 -np 4 -x WEFT_TIMEOUT_S=20 \
      -x ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" "$perf" allreduce -b 8 \
      -e 1M -f 8 -n 2 -w 1 -c 1 --compare mpi >"$TMPDIR/mpirun.log" 2>&1
    local code=$?
    if ((code != 0)) || ! grep -q "launched by mpirun" "$TMPDIR/mpirun.log" ||
      ! grep -q "on *$WEFT_NETNS_SET-h1" "$TMPDIR/mpirun.log"; then
      fail "mpirun across 2 hosts: exit code $code"
      tail -n 5 "$TMPDIR/mpirun.log"
    else
      echo "ok   mpirun -np 4 across 2 hosts, weft beside MPI ($(grep -c '^ *[0-9]' "$TMPDIR/mpirun.log") sizes)"
    fi
  else
    echo "skip mpirun: not installed"
  fi

  # --calibrate across hosts: the network's hops and net_gbs beside the shared memory's keys.
  codes=$(run_ranks calibrate 120 2 2 eth0 allreduce --calibrate "$TMPDIR/net.json")
  if [[ $codes != "0 0" ]] || ! grep -q '"net_gbs"' "$TMPDIR/net.json" ||
    ! grep -q '"network"' "$TMPDIR/net.json" || ! grep -q '"pcie"' "$TMPDIR/net.json"; then
    fail "--calibrate across 2 hosts: exit codes $codes"
    tail -n 5 "$TMPDIR"/calibrate.*.log
  else
    echo "ok   --calibrate across 2 hosts: $(grep -o 'graphs.net_gbs .*' "$TMPDIR/calibrate.0.log" | tr -s ' ' | cut -d' ' -f1,3) GB/s"
  fi

  # WEFT_SOCKET_IFNAME picks the interface of the bootstrap and of UCX's traffic alike.
  for iface in eth0 eth1; do
    local a0 a1 b0 b1
    a0=$(rx) a1=$(rx1)
    codes=$(run_ranks "if-$iface" 120 2 1 "$iface" allreduce -b 32M -e 32M -n 2 -w 1 -c 1)
    b0=$(($(rx) - a0)) b1=$(($(rx1) - a1))
    local on=$b0 off=$b1
    [[ $iface == eth1 ]] && on=$b1 off=$b0
    if [[ $codes != "0 0" ]] || ((on < 32 << 20 || off > 4 << 20)); then
      fail "WEFT_SOCKET_IFNAME=$iface: exit codes $codes, host 1 received $b0 B on eth0, $b1 B on eth1"
      tail -n 3 "$TMPDIR/if-$iface".*.log
    else
      echo "ok   WEFT_SOCKET_IFNAME=$iface: host 1 received $((on >> 20)) MiB there, $((off >> 10)) KiB on the other"
    fi
  done

  # expect_lost WHAT LABEL CODES TOOK LOST...: every code but the lost hosts' nonzero and no
  # timeout, within the limit, each survivor's log naming a failure.
  expect_lost() {
    local what=$1 label=$2 codes=$3 took=$4
    shift 4
    read -r -a c <<<"$codes"
    local bad=0
    for ((h = 0; h < ${#c[@]}; h++)); do
      [[ " $* " == *" $h "* ]] && continue
      if ((c[h] == 0 || c[h] == 124)); then bad=1; fi
      grep -qi 'error\|fail\|abort\|timeout' "$TMPDIR/$label.$h.log" || bad=1
    done
    if ((bad || took > 45)); then
      fail "$what: exit codes $codes after ${took}s (want every survivor failing, no timeout)"
      tail -n 3 "$TMPDIR/$label".*.log
    else
      echo "ok   $what: survivors failed in ${took}s ($(grep -ho 'rank [0-9][^;]*\(timeout\|lost\|fail\|died\|gone\|remote error\)[^;]*' "$TMPDIR/$label".*.log | head -1 | cut -c1-100))"
    fi
  }

  # Host 1's cable pulled a second into a long sweep: both ranks fail, neither hangs.
  (sleep 1.5; "$NETNS" link 1 down) &
  local t0=$SECONDS
  codes=$(run_ranks cut 60 2 2 eth0 allreduce -b 64M -e 64M -n 1000 -w 1)
  expect_lost "a pulled link" cut "$codes" $((SECONDS - t0))
  "$NETNS" link 1 up
  shm_clean "after a pulled link"

  # Three hosts; a partition leaves hosts 0 and 1 together, host 2 alone: all three fail.
  (sleep 1.5; "$NETNS" partition 2) &
  t0=$SECONDS
  codes=$(run_ranks partition 60 3 1 eth0 allreduce -b 16M -e 16M -n 1000 -w 1)
  expect_lost "a partition" partition "$codes" $((SECONDS - t0))
  "$NETNS" heal
  shm_clean "after a partition"

  # Host 2 crashes (every process on it killed at once): hosts 0 and 1 fail.
  (sleep 1.5; "$NETNS" kill 2) &
  t0=$SECONDS
  codes=$(run_ranks crash 60 3 1 eth0 allreduce -b 16M -e 16M -n 1000 -w 1)
  expect_lost "a crashed host" crash "$codes" $((SECONDS - t0)) 2
  NETNS_HOSTS=2 shm_clean "after a crashed host"
  "$NETNS" run 3 true  # host 3 took no part: still up
  return $status
}

# WEFT_NETNS_CPUS=split: every process a host runs stays on the host's share of the CPUs, the
# shares cover the machine's CPUs, and no two hosts share one while there are enough.
cpus_split() {
  local machine lists=() all="" status=0
  machine=$(taskset -pc $$ | sed 's/.*: //')
  for ((h = 0; h < NETNS_HOSTS; h++)); do
    lists+=("$("$NETNS" run "$h" sh -c 'taskset -pc $$' | sed 's/.*: //')")
    all+="${all:+,}${lists[$h]}"
  done
  local expand='{n = split($0, p, ","); for (i = 1; i <= n; i++) { if (split(p[i], r, "-") == 2) for (c = r[1]; c <= r[2]; c++) print c; else print p[i] } }'
  local have want count
  have=$(echo "$all" | awk "$expand" | sort -nu | tr '\n' ' ')
  want=$(echo "$machine" | awk "$expand" | sort -nu | tr '\n' ' ')
  count=$(echo "$want" | wc -w)
  if [[ $have != "$want" ]]; then
    echo "FAIL split CPUs: the hosts have $have, the machine $want"
    status=1
  fi
  for ((h = 0; h < NETNS_HOSTS; h++)); do
    local mine
    mine=$(echo "${lists[$h]}" | awk "$expand" | wc -l)
    if ((count < NETNS_HOSTS && mine != 1)); then
      echo "FAIL split CPUs: host $h has ${lists[$h]}, not one CPU of $count"
      status=1
    fi
  done
  if ((count >= NETNS_HOSTS)) && [[ $(echo "$all" | awk "$expand" | sort -n | uniq -d) != "" ]]; then
    echo "FAIL split CPUs: hosts share CPUs (${lists[*]})"
    status=1
  fi
  ((status == 0)) && echo "ok   WEFT_NETNS_CPUS=split: hosts on CPUs ${lists[*]} of $machine"
  return $status
}

TMPDIR=$(mktemp -d)
export TMPDIR
export -f body cpus_split
"$netns" with 4 10gbit,25gbit -- bash -c body
status=$?
WEFT_NETNS_CPUS=split "$netns" with 3 -- bash -c cpus_split || status=1
[[ -n ${KEEP_LOGS:-} ]] && cp -r "$TMPDIR" "$KEEP_LOGS"
# Nothing left: namespaces, links, state.
left=$( (ip netns list | grep "^$WEFT_NETNS_SET-"; ip -o link | grep -- "-$WEFT_NETNS_SET"; ls "/run/weft-netns/$WEFT_NETNS_SET" 2>/dev/null) | wc -l)
if ((left > 0)); then
  echo "FAIL $left namespace(s), link(s) or state left behind"
  status=1
fi
rm -rf "$TMPDIR"
exit $status
