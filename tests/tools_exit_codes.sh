#!/usr/bin/env bash
# The tools' one convention: --version prints "TOOL VERSION" and exits 0; bad usage exits 2; work
# that fails exits 1.   tools_exit_codes.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
bin=$1 fixture=$2/topology/fixtures/hgx_h100.xml failures=0
expect() {  # expect CODE COMMAND...: the command exits with CODE
  local want=$1
  shift
  "$@" >/dev/null 2>&1
  local got=$?
  if ((got != want)); then
    echo "FAILED: '$*' exited $got, expected $want"
    failures=$((failures + 1))
  fi
}
for tool in weft-perf weft-plan weft-topo weft-config; do
  "$bin/$tool" --version | grep -qx "$tool [0-9]*\.[0-9]*\.[0-9]*" ||
    { echo "FAILED: $tool --version"; failures=$((failures + 1)); }
  expect 0 "$bin/$tool" --version
  expect 0 "$bin/$tool" --help
  expect 2 "$bin/$tool" --no-such-flag
done
expect 2 "$bin/weft-perf"                               # the collective is required
expect 2 "$bin/weft-perf" allreduce -np 0
expect 2 "$bin/weft-perf" allreduce -np 100000
expect 2 "$bin/weft-perf" allreduce -b 8 -e x
expect 2 "$bin/weft-plan" tune --topo "$fixture" --nodes 1 --coll nosuch --sizes 8:8
expect 1 "$bin/weft-plan" tune --topo /nonexistent.xml --nodes 1 --coll allreduce --sizes 8:8
expect 2 "$bin/weft-plan" show --algo ring --coll allreduce --ranks 0
expect 1 "$bin/weft-topo" show --file /nonexistent.xml
expect 2 "$bin/weft-config" --markdown nosuch
expect 1 env WEFT_TIMEOUT_S=-5 "$bin/weft-config"
expect 0 "$bin/weft-membw" handoff 0,0 64K 10          # CPU 0 to itself: there on every machine
expect 2 "$bin/weft-membw" handoff first,second
expect 2 "$bin/weft-membw" handoff 0,0 0
expect 1 "$bin/weft-membw" handoff 0,100000 64K 10    # no such CPU
echo "exit codes: $failures failure(s)"
exit $((failures > 0))
