#!/usr/bin/env python3
"""A small model trained with PyTorch DDP on weft instead of NCCL: weft's libweft_nccl.so answers
as libnccl.so.2, so PyTorch needs no change. Every rank may use GPU 0 (weft lets ranks share a
GPU; start MPS so their kernels run side by side):

  LD_PRELOAD=$PWD/build/nccl/libweft_nccl.so \\
      python3 -m torch.distributed.run --standalone --nproc_per_node=2 examples/ddp_train.py

Fits y = A x + b from noisy samples; the loss printed by rank 0 falls toward the noise's 0.01.
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn


def main():
    device = torch.device("cuda", int(os.environ.get("WEFT_EXAMPLE_DEVICE", "0")))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    truth = nn.Linear(64, 16)
    model = nn.parallel.DistributedDataParallel(nn.Linear(64, 16).to(device),
                                                device_ids=[device.index])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1 + rank)  # each rank its own samples
    for step in range(200):
        x = torch.randn(256, 64, generator=gen)
        y = truth(x).detach() + 0.1 * torch.randn(256, 16, generator=gen)
        loss = ((model(x.to(device)) - y.to(device)) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()  # DDP averages the gradients over the ranks here, through weft
        optimizer.step()
        if step % 50 == 0 or step == 199:
            mean = loss.detach().clone()
            dist.all_reduce(mean, op=dist.ReduceOp.AVG)
            if rank == 0:
                print(f"step {step:3d}: loss {mean.item():.4f} ({world} ranks)", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
