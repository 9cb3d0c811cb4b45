#!/usr/bin/env python3
"""Reads the timelines WEFT_GPU_TRACE=PREFIX leaves (PREFIX.0, PREFIX.1, ...: one per rank) and
prints where a schedule kernel's time went, in microseconds of the device's %globaltimer (one
clock for every rank sharing the GPU).

  scripts/gpu-trace.py PREFIX [--steps]

Per call (the calls every rank recorded): how long it took from the first block's start to the
last block's end, how far apart the ranks' kernels started and ended, the gap on each rank
since its previous call ended, and the blocks' mean time waiting and moving. With --steps, the
last full call step by step: the mean and largest wait and the mean move over every rank and
block.
"""
import array
import glob
import sys
from collections import defaultdict

MAGIC = 0x3143525454464557


def load(path):
    words = array.array("Q")
    with open(path, "rb") as f:
        words.frombytes(f.read())
    if len(words) < 8 or words[0] != MAGIC:
        sys.exit(f"{path}: not a WEFT_GPU_TRACE file")
    rank, nranks, channels, per, ncalls, launched, header = words[1:8]
    blocks = []  # (call, channel, start, end, steps [(begin, waited, moved)])
    for slot in range(ncalls):
        for ch in range(channels):
            at = 8 + (slot * channels + ch) * per
            rec = words[at:at + per]
            if rec[1] == 0 or rec[2] == 0:
                continue  # never ran (or still running when the file was written)
            nsteps = min(rec[3], (per - header) // 3)
            steps = [tuple(rec[header + 3 * k:header + 3 * k + 3]) for k in range(nsteps)]
            blocks.append((rec[0], ch, rec[1], rec[2], steps))
    return rank, nranks, blocks


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    prefix = sys.argv[1]
    per_step = "--steps" in sys.argv[2:]
    files = sorted((p for p in glob.glob(prefix + ".*") if p.rsplit(".", 1)[1].isdigit()),
                   key=lambda p: int(p.rsplit(".", 1)[1]))
    if not files:
        sys.exit(f"no files {prefix}.RANK")
    # calls[call][rank] = [blocks]
    calls = defaultdict(lambda: defaultdict(list))
    nranks = 0
    for path in files:
        rank, n, blocks = load(path)
        nranks = max(nranks, n)
        for b in blocks:
            calls[b[0]][rank].append(b)
    full = [c for c in sorted(calls) if len(calls[c]) == nranks]
    if not full:
        sys.exit("no call that every rank recorded")
    us = 1e-3
    print(f"{nranks} ranks, {len(full)} calls every rank recorded (times in us)")
    print(f"{'call':>6} {'total':>9} {'starts':>8} {'ends':>8} {'gap':>8} "
          f"{'wait':>9} {'move':>9} {'steps':>6}")
    prev_end = {}
    for c in full:
        starts = {r: min(b[2] for b in bs) for r, bs in calls[c].items()}
        ends = {r: max(b[3] for b in bs) for r, bs in calls[c].items()}
        total = (max(ends.values()) - min(starts.values())) * us
        gaps = [(starts[r] - prev_end[r]) * us for r in starts if r in prev_end]
        waits, moves, nsteps = [], [], []
        for bs in calls[c].values():
            for b in bs:
                waits.append(sum(s[1] - s[0] for s in b[4]) * us)
                moves.append(sum(s[2] - s[1] for s in b[4]) * us)
                nsteps.append(len(b[4]))
        gap = f"{sum(gaps) / len(gaps):8.1f}" if gaps else f"{'':>8}"
        print(f"{c:>6} {total:9.1f} {(max(starts.values()) - min(starts.values())) * us:8.1f} "
              f"{(max(ends.values()) - min(ends.values())) * us:8.1f} {gap} "
              f"{sum(waits) / len(waits):9.1f} {sum(moves) / len(moves):9.1f} "
              f"{max(nsteps):>6}")
        prev_end = ends
    if per_step:
        c = full[-1]
        first = min(b[2] for bs in calls[c].values() for b in bs)
        rows = defaultdict(lambda: [[], [], []])  # step -> waits, moves, ends after `first`
        for bs in calls[c].values():
            for b in bs:
                for k, s in enumerate(b[4]):
                    rows[k][0].append((s[1] - s[0]) * us)
                    rows[k][1].append((s[2] - s[1]) * us)
                    rows[k][2].append((s[2] - first) * us)
        print(f"\ncall {c} step by step (over every rank and block):")
        print(f"{'step':>5} {'wait':>8} {'max wait':>9} {'move':>8} {'done by':>9}")
        for k in sorted(rows):
            w, m, e = rows[k]
            print(f"{k:>5} {sum(w) / len(w):8.1f} {max(w):9.1f} {sum(m) / len(m):8.1f} "
                  f"{max(e):9.1f}")


if __name__ == "__main__":
    main()
