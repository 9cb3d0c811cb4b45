#!/usr/bin/env python3
"""Runs weft-perf and checks what it printed the way scripts written for nccl-tests read it.

  check_run.py [options] -- weft-perf allreduce -np 2 ...

--table        every table row parses with the row regex below (a prefix match: weft's extra
               columns follow nccl-tests' thirteen), every checked #wrong is 0, and the footer
               lines parse with the usual "# Avg bus bandwidth" and "# Out of bounds" regexes
--strict       rows must have exactly nccl-tests' thirteen columns (weft-perf --plain)
--rows N       exactly N table rows
--json FILE    FILE is valid JSON with one object per row and the fields weft-perf documents
--svg FILE     FILE is an SVG document with at least one polyline
--tuning FILE  FILE is a tuning file as --calibrate writes it: the keys it measures, each a
               positive number, "measured_on" and "comment", and nothing else
--exit N       the exit status must be N (default 0)
--expect RE    stdout must match RE (repeatable)
--expect-err RE  stderr must match RE (repeatable)
--needs-gpu    a run that says it needs a GPU and finds none (exit 2, "needs a GPU") is skipped:
               exit 77, which ctest reads as skipped (SKIP_RETURN_CODE)
--env-ranks N  launch N copies with WEFT_COMM_ID/WEFT_RANK/WEFT_NRANKS instead of one; the
               checks apply to process 0's output
"""
import argparse
import json
import os
import re
import socket
import subprocess
import sys
import xml.etree.ElementTree as ET

# What parsers of nccl-tests output match (the footer regexes are the common ones verbatim).
ROW = re.compile(
    r"^\s*(\d+)\s+(\d+)\s+(\w+)\s+(\w+)\s+(-?\d+)"
    r"\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\S+)"
    r"\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\S+)")
STRICT_ROW = re.compile(ROW.pattern + r"\s*$")
AVG = re.compile(r"#\s*Avg bus bandwidth\s*:\s*([\d.]+)")
OOB = re.compile(r"#\s*Out of bounds values\s*:\s*(\d+)\s*(OK|FAILED)?")


def fail(message, output=""):
    sys.stdout.write(output)
    print(f"check_run: FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def run(command, env_ranks):
    if env_ranks == 0:
        p = subprocess.run(command, capture_output=True, text=True, timeout=110)
        return p.returncode, p.stdout, p.stderr
    with socket.socket() as s:  # a free port for process 0's rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(env_ranks):
        env = dict(os.environ, WEFT_COMM_ID=f"127.0.0.1:{port}", WEFT_RANK=str(rank),
                   WEFT_NRANKS=str(env_ranks))
        procs.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    outputs = [p.communicate(timeout=110) for p in procs]
    code = max(p.returncode for p in procs)
    return code, outputs[0][0], "".join(o[1] for o in outputs)


def check_table(out, strict):
    rows = []
    for line in out.splitlines():
        if not line or line.startswith("#"):
            continue
        m = (STRICT_ROW if strict else ROW).match(line)
        if not m:
            fail(f"row does not parse: {line!r}", out)
        rows.append(m)
        # Scripts also split on whitespace and take column 7 as the out-of-place busbw.
        float(line.split()[7])
        for wrong in (m.group(9), m.group(13)):
            if wrong not in ("0", "N/A"):
                fail(f"#wrong is {wrong}: {line!r}", out)
    avg, oob = AVG.search(out), OOB.search(out)
    if not avg or not oob:
        fail("no '# Avg bus bandwidth' or '# Out of bounds values' line", out)
    if oob.group(1) != "0" or oob.group(2) != "OK":
        fail("out of bounds values reported", out)
    mean = sum(float(m.group(8)) + float(m.group(12)) for m in rows) / max(1, 2 * len(rows))
    if abs(mean - float(avg.group(1))) > 0.01 + 0.01 * mean:
        fail(f"avg bus bandwidth {avg.group(1)} is not the rows' mean {mean}", out)
    return rows


def check_json(path, out):
    with open(path) as f:
        doc = json.load(f)
    if doc.get("tool") != "weft-perf" or not isinstance(doc.get("rows"), list) or not doc["rows"]:
        fail(f"{path}: no rows", out)
    for row in doc["rows"]:
        for key in ("collective", "size", "count", "type", "op", "root", "oop", "ip", "algo",
                    "peer_time_us", "forced"):
            if key not in row:
                fail(f"{path}: row without {key}: {row}", out)
        for side in ("oop", "ip"):
            for key in ("time_us", "algbw", "busbw", "wrong"):
                if key not in row[side]:
                    fail(f"{path}: {side} without {key}", out)
        if "/" not in row["algo"]:
            fail(f"{path}: algo is not algorithm/protocol: {row['algo']}", out)
        for label, forced in row["forced"].items():
            if label not in doc["algos"] or "plan" not in forced or "oop" not in forced:
                fail(f"{path}: bad forced entry {label}: {forced}", out)
    return doc


# What weft-perf --calibrate measures (the host link class, pcie, only; and the host codec).
TUNING_KEYS = {
    ("base_latency_us", "ll"), ("base_latency_us", "simple"),
    ("hop_latency_us", "ll", "pcie"), ("hop_latency_us", "simple", "pcie"),
    ("message_overhead_us", "ll", "pcie"), ("message_overhead_us", "simple", "pcie"),
    ("bandwidth_scale", "pcie"), ("codecs", "host_gbs"),
}


def check_tuning(path, out):
    with open(path) as f:
        doc = json.load(f)

    def leaves(node, prefix):
        if isinstance(node, dict):
            for key, value in node.items():
                yield from leaves(value, prefix + (key,))
        else:
            yield prefix, node

    found = {}
    for key, value in doc.items():
        if key in ("comment", "measured_on"):
            continue
        found.update(leaves(value, (key,)))
    if set(found) != TUNING_KEYS:
        fail(f"{path}: keys {sorted(found)}, expected {sorted(TUNING_KEYS)}", out)
    for key, value in found.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            fail(f"{path}: {'.'.join(key)} is {value!r}, not a positive number", out)
    where = doc.get("measured_on", {})
    for key in ("host", "date", "nranks", "transport"):
        if key not in where:
            fail(f"{path}: measured_on has no {key}", out)
    if not doc.get("comment"):
        fail(f"{path}: no comment", out)


def check_svg(path, out):
    root = ET.parse(path).getroot()
    if not root.tag.endswith("svg") or not root.findall(".//{http://www.w3.org/2000/svg}polyline"):
        fail(f"{path}: not an SVG plot with lines", out)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--table", action="store_true")
    parser.add_argument("--strict", action="store_true")
    parser.add_argument("--rows", type=int)
    parser.add_argument("--json")
    parser.add_argument("--svg")
    parser.add_argument("--tuning")
    parser.add_argument("--exit", type=int, default=0)
    parser.add_argument("--expect", action="append", default=[])
    parser.add_argument("--expect-err", action="append", default=[])
    parser.add_argument("--env-ranks", type=int, default=0)
    parser.add_argument("--needs-gpu", action="store_true")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    for path in (args.json, args.svg, args.tuning):
        if path and os.path.exists(path):
            os.remove(path)
    code, out, err = run(command, args.env_ranks)
    sys.stderr.write(err)
    if args.needs_gpu and code == 2 and "needs a GPU" in err:
        print("check_run: skipped: no GPU here")
        sys.exit(77)
    if code != args.exit:
        fail(f"exit status {code}, expected {args.exit}", out)
    for pattern in args.expect:
        if not re.search(pattern, out, re.MULTILINE):
            fail(f"output does not match {pattern!r}", out)
    for pattern in args.expect_err:
        if not re.search(pattern, err, re.MULTILINE):
            fail(f"stderr does not match {pattern!r}", out)
    if args.table or args.strict:
        rows = check_table(out, args.strict)
        if args.rows is not None and len(rows) != args.rows:
            fail(f"{len(rows)} rows, expected {args.rows}", out)
    if args.json:
        doc = check_json(args.json, out)
        if args.rows is not None and len(doc["rows"]) != args.rows:
            fail(f"{len(doc['rows'])} JSON rows, expected {args.rows}", out)
    if args.svg:
        check_svg(args.svg, out)
    if args.tuning:
        check_tuning(args.tuning, out)
    sys.stdout.write(out)
    print("check_run: ok")


if __name__ == "__main__":
    main()
