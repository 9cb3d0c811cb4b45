#!/usr/bin/env python3
"""What fraction of the GPU's memory bandwidth an all-reduce between ranks sharing one GPU uses.

    gpu-memory-fraction.py --plan build/weft-plan --copy-tbs 4.21 perf-allreduce-np2.log ...

Each log is weft-perf's output for one rank count (`weft-perf allreduce -np N ...`, every rank on
one GPU). For every row past the direct kernels' largest call (4 MiB; above it every all-reduce
runs its schedule through the FIFOs), the bytes the algorithm reads and writes through device
memory (`weft-plan verify`'s memory column: sources, destinations, each message into and out of
its FIFO slot) over the measured out-of-place time, as a fraction of the device's copy bandwidth
(read + written, e.g. weft-bench's gpu/memcpy at 1 GiB). The tuner's pick and each forced
algorithm (--algos) get a column.
"""
import argparse
import re
import subprocess
import sys

DIRECT_MAX = 4 << 20


def memory_multiples(plan, nranks):
    """Algorithm -> bytes all ranks read and write, as a multiple of the message size."""
    out = subprocess.run([plan, "verify", "--coll", "allreduce", "--ranks", str(nranks)],
                         check=True, capture_output=True, text=True).stdout
    lines = out.splitlines()
    if not lines or not lines[0].split() or lines[0].split()[-1] != "memory":
        raise SystemExit("weft-plan verify printed no memory column (a build from before it?)")
    table = {}
    for line in lines[1:]:
        fields = line.split()
        if len(fields) > 2 and fields[1] == "allreduce":
            table[fields[0]] = float(fields[-1])  # the last column
    return table


def parse(log):
    """(nranks, forced algorithm names, rows) from one weft-perf log."""
    text = open(log, encoding="utf-8").read()
    ranks = re.search(r"(\d+) rank\(s\)", text)
    forced = re.search(r"# forced algorithms \([^)]*\): (.*)", text)
    names = [a.strip().split("/")[0] for a in forced.group(1).split(",")] if forced else []
    rows = []
    for line in text.splitlines():
        f = line.split()
        if len(f) < 14 or not f[0].isdigit() or not f[1].isdigit():
            continue
        row = {"bytes": int(f[0]), "pick": f[13].split("/")[0], "times": {}}
        row["times"]["pick"] = float(f[5])
        for k, name in enumerate(names):  # time, busbw, #wrong per forced algorithm
            at = 14 + 3 * k
            if at < len(f) and f[at] != "n/a":
                row["times"][name] = float(f[at])
        rows.append(row)
    return int(ranks.group(1)) if ranks else 0, names, rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", required=True, help="the weft-plan binary")
    ap.add_argument("--copy-tbs", type=float, required=True,
                    help="the device's copy bandwidth, TB/s, read + written")
    ap.add_argument("logs", nargs="+")
    a = ap.parse_args()
    for log in a.logs:
        n, names, rows = parse(log)
        if n < 2:
            continue
        mem = memory_multiples(a.plan, n)
        print(f"== {n} ranks on one GPU ({log}): the algorithm's memory traffic over the "
              f"out-of-place time, % of {a.copy_tbs} TB/s")
        print("  size       pick           " + "".join(f"{x:>12}" for x in names))
        for row in rows:
            if row["bytes"] <= DIRECT_MAX:
                continue
            cells = []
            for key in ["pick"] + names:
                algo = row["pick"] if key == "pick" else key
                t = row["times"].get(key)
                if t is None or algo not in mem or t <= 0:
                    cells.append("n/a")
                    continue
                frac = mem[algo] * row["bytes"] / (t * 1e-6) / (a.copy_tbs * 1e12)
                cells.append(f"{100 * frac:.0f} %")
            print(f"  {row['bytes']:>10} {row['pick'] + ' ' + cells[0]:<14} " +
                  "".join(f"{c:>12}" for c in cells[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
