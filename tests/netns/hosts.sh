#!/usr/bin/env bash
# weft across "hosts" made of network namespaces (scripts/netns-hosts.sh): 2 hosts, each one
# process of 2 ranks, over their own interfaces on a shaped bridge (UCX between hosts, shared
# memory within each). Every collective of weft-perf, checked; then host 1's link pulled in
# the middle of a sweep, which every rank must report as an error within the timeout; then
# nothing left behind (namespaces, links, mounts, state). Exit 77 (skipped) where namespaces
# cannot be made here.
#   hosts.sh WEFT_PERF
set -uo pipefail
perf=$(readlink -f "$1")
export perf
here="$(cd "$(dirname "$0")" && pwd)"
netns="$here/../../scripts/netns-hosts.sh"
export WEFT_NETNS_SET="t$$"
"$netns" check || exit $?

body() {
  local status=0 port=$((29000 + $$ % 1000))
  run_ranks() {  # run_ranks LABEL TIMEOUT weft-perf-arguments...: both hosts, rank = host
    local label=$1 limit=$2
    shift 2
    for h in 0 1; do
      timeout "$limit" "$NETNS" run "$h" env WEFT_COMM_ID="$("$NETNS" addr 0):$port" \
        WEFT_RANK="$h" WEFT_NRANKS=2 WEFT_TIMEOUT_S=10 "$perf" "$@" -t 2 --host \
        >"$TMPDIR/$label.$h.log" 2>&1 &
    done
    local a b
    wait %1; a=$?
    wait %2; b=$?
    port=$((port + 1))
    echo "$a $b"
  }
  for coll in allreduce allgather reducescatter alltoall broadcast; do
    codes=$(run_ranks "$coll" 120 "$coll" -b 8 -e 8M -f 8 -n 3 -w 1 -c 1)
    if [[ $codes != "0 0" ]] || ! grep -q "on *$WEFT_NETNS_SET-h1" "$TMPDIR/$coll.0.log"; then
      echo "FAIL $coll across 2 hosts: exit codes $codes"; tail -n 5 "$TMPDIR/$coll".*.log
      status=1
    else
      echo "ok   $coll across 2 hosts ($(grep -c '^ *[0-9]' "$TMPDIR/$coll.0.log") sizes checked)"
    fi
  done
  # Host 1's cable pulled a second into a long sweep: both ranks fail, neither hangs.
  (sleep 1.5; ip link set "wv-$WEFT_NETNS_SET-1" down) &
  local t0=$SECONDS
  codes=$(run_ranks cut 60 allreduce -b 64M -e 64M -n 1000 -w 1)
  local took=$((SECONDS - t0))
  local a b
  read -r a b <<<"$codes"
  if ((a == 0 || b == 0 || a == 124 || b == 124 || took > 45)); then
    echo "FAIL a pulled link: exit codes $codes after ${took}s (want both failing, no timeout)"
    tail -n 3 "$TMPDIR"/cut.*.log
    status=1
  else
    echo "ok   a pulled link: both ranks failed in ${took}s ($(grep -ho 'timeout[^(]*\|remote error' "$TMPDIR"/cut.*.log | head -1))"
  fi
  return $status
}

TMPDIR=$(mktemp -d)
export TMPDIR
export -f body
"$netns" with 2 10gbit,25gbit -- bash -c body
status=$?
# Nothing left: namespaces, links, state.
left=$( (ip netns list | grep "^$WEFT_NETNS_SET-"; ip -o link | grep -- "-$WEFT_NETNS_SET"; ls "/run/weft-netns/$WEFT_NETNS_SET" 2>/dev/null) | wc -l)
if ((left > 0)); then
  echo "FAIL $left namespace(s), link(s) or state left behind"
  status=1
fi
rm -rf "$TMPDIR"
exit $status
