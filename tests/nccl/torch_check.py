#!/usr/bin/env python3
"""PyTorch on weft through libweft_nccl.so: run by torchrun, local rank r on GPU r mod the GPU
count (on one GPU every rank shares GPU 0, which weft allows), with LD_PRELOAD naming the
library (scripts/torch-check.sh does all that).

Each rank checks, against a reference computed on the CPU in float64: all_reduce (sum, avg,
max, premul_sum), all_gather_into_tensor, reduce_scatter_tensor, all_to_all_single, broadcast,
send/recv around a ring, barrier and a new_group of the even ranks; then a few DDP steps of a
small model, whose gradients must equal those of one process over the whole batch. It also
checks that NCCL's functions, as the process resolves them, are weft's (PyTorch maps its own
libnccl.so.2 too, by path, and must not call it). Then the frameworks of torch_frameworks.py:
FSDP2, DTensor tensor/sequence parallelism, DDP bucket views and bf16 compression, a CUDA graph
replaying an all-reduce, collectives on two user streams. WEFT_TORCH_CHECKS (comma-separated
names, e.g. "fsdp2,cuda_graph") runs only those; "collectives" and "ddp" name the checks here.
Exit 0 when all holds.
"""
import ctypes
import os

import torch
import torch.distributed as dist
import torch.nn as nn

import torch_frameworks
from torch_frameworks import close, data, fail


def check_maps():
    """weft's library is mapped, and NCCL's functions as the process resolves them (the global
    scope, where LD_PRELOAD comes first: what libtorch_cuda's calls bind to) are weft's. PyTorch
    also maps its own libnccl.so.2 by path at import; its functions must go unused."""
    maps = open("/proc/self/maps").read()
    libs = {line.split()[-1] for line in maps.splitlines() if "nccl" in line.split()[-1]}
    weft = [lib for lib in libs if "libweft_nccl" in lib]
    if not weft:
        fail(f"libweft_nccl.so is not mapped (NCCL libraries mapped: {sorted(libs)})")
    glob = ctypes.CDLL(None)
    ours = ctypes.CDLL(weft[0])
    for name in ("ncclCommInitRankConfig", "ncclAllReduce", "ncclGroupEnd", "ncclCommAbort"):
        got = ctypes.cast(getattr(glob, name), ctypes.c_void_p).value
        want = ctypes.cast(getattr(ours, name), ctypes.c_void_p).value
        if got != want:
            fail(f"{name} resolves outside weft (mapped: {sorted(libs)})")


def collectives(rank, world, dev):
    n = 4099
    # all_reduce: sum, avg, max.
    for op, ref in ((dist.ReduceOp.SUM, lambda xs: sum(xs)),
                    (dist.ReduceOp.AVG, lambda xs: sum(xs) / world),
                    (dist.ReduceOp.MAX, lambda xs: torch.stack(xs).max(0).values)):
        t = data(rank, n, 1).to(dev, torch.float32)
        dist.all_reduce(t, op=op)
        close(t, ref([data(r, n, 1).float().double() for r in range(world)]), f"all_reduce {op}")
    # PREMUL_SUM (ncclRedOpCreatePreMulSum): each rank's input times the factor, then summed.
    if hasattr(dist, "_make_nccl_premul_sum"):
        t = data(rank, n, 8).to(dev, torch.float32)
        dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5))
        close(t, 0.5 * sum(data(r, n, 8).float().double() for r in range(world)), "premul_sum")
    # all_gather_into_tensor.
    out = torch.empty(world * n, device=dev)
    dist.all_gather_into_tensor(out, data(rank, n, 2).to(dev, torch.float32))
    close(out, torch.cat([data(r, n, 2).float().double() for r in range(world)]), "all_gather")
    # reduce_scatter_tensor: rank r gets piece r of the sum.
    piece = torch.empty(n, device=dev)
    dist.reduce_scatter_tensor(piece, data(rank, world * n, 3).to(dev, torch.float32))
    total = sum(data(r, world * n, 3).float().double() for r in range(world))
    close(piece, total[rank * n:(rank + 1) * n], "reduce_scatter", tol=1e-4)
    # all_to_all_single: block q of rank r goes to rank q.
    src = data(rank, world * n, 4).to(dev, torch.float32)
    dst = torch.empty_like(src)
    dist.all_to_all_single(dst, src)
    want = torch.cat([data(q, world * n, 4).float().double()[rank * n:(rank + 1) * n]
                      for q in range(world)])
    close(dst, want, "all_to_all_single")
    # broadcast from the last rank.
    t = data(rank, n, 5).to(dev, torch.float32)
    dist.broadcast(t, src=world - 1)
    close(t, data(world - 1, n, 5).float().double(), "broadcast")
    # send/recv around a ring (batched, as PyTorch groups them).
    send = data(rank, n, 6).to(dev, torch.float32)
    recv = torch.empty_like(send)
    ops = [dist.P2POp(dist.isend, send, (rank + 1) % world),
           dist.P2POp(dist.irecv, recv, (rank - 1) % world)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    close(recv, data((rank - 1) % world, n, 6).float().double(), "send/recv")
    dist.barrier()
    # new_group of the even ranks: an all_reduce inside it.
    evens = list(range(0, world, 2))
    group = dist.new_group(evens)
    if rank in evens:
        t = data(rank, n, 7).to(dev, torch.float32)
        dist.all_reduce(t, group=group)
        close(t, sum(data(r, n, 7).float().double() for r in evens), "new_group all_reduce")
    dist.barrier()


def ddp(rank, world, dev):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8)).double()
    reference = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8)).double()
    reference.load_state_dict(model.state_dict())
    ddp_model = nn.parallel.DistributedDataParallel(model.to(dev), device_ids=[dev.index])
    per = 16
    for step in range(3):
        g = torch.Generator().manual_seed(100 + step)
        x = torch.randn(world * per, 32, generator=g, dtype=torch.float64)
        y = torch.randn(world * per, 8, generator=g, dtype=torch.float64)
        ddp_model.zero_grad()
        loss = ((ddp_model(x[rank * per:(rank + 1) * per].to(dev)) -
                 y[rank * per:(rank + 1) * per].to(dev)) ** 2).mean()
        loss.backward()
        reference.zero_grad()
        ((reference(x) - y) ** 2).mean().backward()
        for (name, p), q in zip(ddp_model.module.named_parameters(), reference.parameters()):
            close(p.grad, q.grad, f"DDP step {step} gradient of {name}", tol=1e-9)
        with torch.no_grad():
            for p, q in zip(ddp_model.module.parameters(), reference.parameters()):
                p -= 0.1 * p.grad
                q -= 0.1 * q.grad


def main():
    # One process per GPU where there are enough (as NCCL wants); on fewer GPUs ranks share
    # them (weft lets them; on one GPU every rank is on GPU 0).
    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device("cuda", local % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev)
    rank, world = dist.get_rank(), dist.get_world_size()
    # WEFT_TORCH_REFERENCE=1: the same checks on PyTorch's own NCCL (no LD_PRELOAD), to tell
    # weft's errors from the checks' own.
    if os.environ.get("WEFT_TORCH_REFERENCE") != "1":
        check_maps()
    checks = [("collectives", collectives), ("ddp", ddp)] + torch_frameworks.CHECKS
    chosen = torch_frameworks.selected([name for name, _ in checks])
    for name, check in checks:
        if name in chosen:
            check(rank, world, dev)
            torch_frameworks.settle()
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank} of {world}: every check passed ({len(chosen)} checks; "
          f"{os.environ.get('LD_PRELOAD', '')})", flush=True)


if __name__ == "__main__":
    main()
