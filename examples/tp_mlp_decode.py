#!/usr/bin/env python3
"""A tensor-parallel MLP stack decoding tokens with weft's fused GEMMs, one CUDA graph a token.

Each rank holds a slice of every layer: the up projection's columns (W_up [d, f/s]) and the down
projection's rows (W_down [f/s, d]). The batch's hidden states are cut by rows over the ranks
(sequence parallel), so a layer is
    h = gelu(allgather(x) @ W_up)       weft.torch.ag_gemm  (all-gather overlapped with the GEMM)
    x = x + reducescatter(h @ W_down)   weft.torch.gemm_rs  (the GEMM overlapped with the RS)
A decode step (every layer) is captured once into a CUDA graph and replayed for each token, its
output fed back as the next input; the first step is checked against eager execution.

  PYTHONPATH=python WEFT_LIBRARY=build/lib/libweft.so.0 \\
      python3 -m torch.distributed.run --standalone --nproc_per_node=2 examples/tp_mlp_decode.py

Ranks may share one GPU (start MPS so their kernels run side by side).
"""
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import weft.torch as wt

LAYERS, D, FFN, BATCH, TOKENS = 4, 1024, 4096, 8, 64


def main():
    local = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local % torch.cuda.device_count())
    torch.cuda.set_device(device)
    dist.init_process_group("gloo")  # the store that hands weft its id
    comm = wt.Comm.from_process_group()
    rank, s = comm.rank, comm.size
    assert FFN % s == 0 and BATCH % s == 0
    gen = torch.Generator(device=device).manual_seed(1234 + rank)  # each rank its own slices
    bf16 = dict(dtype=torch.bfloat16, device=device)
    w_up = [torch.randn(D, FFN // s, generator=gen, **bf16) / D ** 0.5 for _ in range(LAYERS)]
    w_down = [torch.randn(FFN // s, D, generator=gen, **bf16) / FFN ** 0.5 for _ in range(LAYERS)]
    h = comm.handle

    def step(x):
        for up, down in zip(w_up, w_down):
            x = x + wt.gemm_rs(F.gelu(wt.ag_gemm(x, up, h)), down, h)
        return x

    x = torch.randn(BATCH // s, D, generator=gen, **bf16)  # this rank's rows of the batch
    with torch.no_grad():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            eager = step(x)  # each shape's first call sets weft up outside the capture
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            out = step(x)
        graph.replay()
        torch.cuda.synchronize()
        diff = (out.float() - eager.float()).abs().max().item()
        scale = eager.float().abs().max().item()
        assert diff <= 1e-2 * max(1.0, scale), f"graph and eager differ by {diff} (of {scale})"
        start = time.perf_counter()
        for _ in range(TOKENS):
            x.copy_(out)  # the next token's input is this one's output
            graph.replay()
        torch.cuda.synchronize()
        per_token = (time.perf_counter() - start) / TOKENS * 1e6
    if rank == 0:
        print(f"[rank 0] {LAYERS} layers, d {D}, ffn {FFN} over {s} ranks, batch {BATCH}: graph "
              f"replay {per_token:.0f} µs a token; graph − eager on the first token: {diff:.3g}",
              flush=True)
        print(f"[rank 0] plans: ag_gemm {tp_plan(comm, 0, BATCH, FFN, D)}, gemm_rs "
              f"{tp_plan(comm, 1, BATCH, D, FFN)}", flush=True)
    comm.destroy()
    dist.destroy_process_group()


def tp_plan(comm, op, m, n, k):
    """weftTpPlan: how weft runs such a call ("unfused", "chunked:4", "fused")."""
    import ctypes

    from weft._lib import DTYPES, check, lib

    buf = ctypes.create_string_buffer(64)
    check(lib.weftTpPlan(comm._handle(), op, m, n, k, DTYPES["bfloat16"], buf, len(buf)))
    return buf.value.decode()


if __name__ == "__main__":
    main()
