#!/usr/bin/env python3
"""Python's cost on top of weft's C API for a small all-reduce: the same call (COUNT floats on
a registered buffer, the low-latency path) made through
  - the raw ctypes function (weftAllReduce with the pointers and stream prepared once),
  - weft.Comm.all_reduce (the ctypes layer: buffers described on each call),
  - torch.ops.weft.all_reduce (the custom op: dispatcher, a new output tensor) and
    torch.ops.weft.all_reduce_inplace,
  - weft.torch.all_reduce and all_reduce_ (eager with nothing to record: the op's kernel
    without the dispatcher),
  - a CUDA graph of GRAPH_CALLS custom-op calls, replayed (Python out of the loop).
For each it prints µs per call twice: the host's time to issue the call (no waiting, so the
Python and driver cost) and the time per call with the GPU's work (one synchronize at the end);
and the custom op's host time above the raw call's. docs/perf.md keeps the numbers.

  PYTHONPATH=python WEFT_LIBRARY=build/lib/libweft.so.0 \\
      python3 -m torch.distributed.run --standalone --nproc_per_node=2 perf/py_overhead.py \\
      [--count 1024] [--iters 1000]
"""
import argparse
import os
import time

import torch
import torch.distributed as dist

import weft.torch as wt
from weft._lib import DTYPES, OPS, check, lib

GRAPH_CALLS = 100


def timed(comm, fn, iters):
    """(host µs a call to issue, µs a call with the GPU's work), every rank in step."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    comm.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    issued = time.perf_counter()
    torch.cuda.synchronize()
    done = time.perf_counter()
    comm.barrier()
    return (issued - start) / iters * 1e6, (done - start) / iters * 1e6


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=1024)
    parser.add_argument("--iters", type=int, default=1000)
    args = parser.parse_args()
    local = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local % torch.cuda.device_count())
    torch.cuda.set_device(device)
    dist.init_process_group("gloo")
    comm = wt.Comm.from_process_group()
    h = comm.handle
    x = torch.zeros(args.count, device=device)  # zeros: in-place sums stay zeros
    out = torch.zeros_like(x)
    reg = comm.register(x)
    stream = torch.cuda.current_stream().cuda_stream
    raw = comm._handle()
    f32, total = DTYPES["float32"], OPS["sum"]
    xp, op_ = x.data_ptr(), out.data_ptr()

    def raw_call():
        check(lib.weftAllReduce(xp, op_, args.count, f32, total, raw, stream))

    rows = [
        ("raw ctypes weftAllReduce", raw_call),
        ("weft.Comm.all_reduce", lambda: comm.all_reduce(x, out, stream=stream)),
        ("torch.ops.weft.all_reduce", lambda: torch.ops.weft.all_reduce(x, h, "sum", None)),
        ("torch.ops.weft.all_reduce_inplace",
         lambda: torch.ops.weft.all_reduce_inplace(out, h, "sum", None)),
        ("weft.torch.all_reduce", lambda: wt.all_reduce(x, h)),
        ("weft.torch.all_reduce_", lambda: wt.all_reduce_(out, h)),
    ]
    results = [(name, *timed(comm, fn, args.iters)) for name, fn in rows]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        for _ in range(GRAPH_CALLS):
            torch.ops.weft.all_reduce(x, h, "sum", None)
    host, gpu = timed(comm, graph.replay, max(args.iters // GRAPH_CALLS, 5))
    results.append((f"CUDA graph of {GRAPH_CALLS} op calls", host / GRAPH_CALLS,
                    gpu / GRAPH_CALLS))
    if comm.rank == 0:
        print(f"[rank 0] all-reduce of {args.count} floats, {comm.size} ranks, registered input; "
              f"µs per call (host to issue / with the GPU's work):", flush=True)
        for name, host, gpu in results:
            print(f"[rank 0]   {name:36s} {host:8.2f} µs {gpu:8.2f} µs", flush=True)
        host = {name: t for name, t, _ in results}
        base = host["raw ctypes weftAllReduce"]
        print(f"[rank 0] above the raw call, host µs: weft.torch.all_reduce "
              f"{host['weft.torch.all_reduce'] - base:.2f} (in place "
              f"{host['weft.torch.all_reduce_'] - base:.2f}); through the dispatcher "
              f"{host['torch.ops.weft.all_reduce'] - base:.2f} (in place "
              f"{host['torch.ops.weft.all_reduce_inplace'] - base:.2f}); graph replay "
              f"{results[-1][1]:.2f} a call", flush=True)
    del graph
    comm.deregister(reg)
    comm.destroy()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
