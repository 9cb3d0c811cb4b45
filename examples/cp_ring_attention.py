#!/usr/bin/env python3
"""A context-parallel training step: each rank holds its zigzag share of packed sequences
(weft.torch.zigzag_local: chunks r and 2s − 1 − r of each sequence cut in 2s, which balances
causal attention's work) and runs an attention block whose attention is weft's ring attention,
forward and backward. The block's weights are replicated, so their gradients are averaged over
the ranks before the optimizer step; RoPE takes each local token's position in its sequence.

  PYTHONPATH=python WEFT_LIBRARY=build/lib/libweft.so.0 \\
      python3 -m torch.distributed.run --standalone --nproc_per_node=2 examples/cp_ring_attention.py

The loss printed by rank 0 (over every rank's tokens) falls as the block learns its target.
"""
import os

import torch
import torch.distributed as dist

import weft.torch as wt

D, HEADS, KV_HEADS, HEAD_DIM, STEPS = 256, 8, 2, 64, 30


def rope(x, positions):
    """Rotary embedding of x [tokens, heads, head_dim] by each token's position."""
    half = x.shape[-1] // 2
    freq = 10000 ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)
    angle = positions.float()[:, None, None] * freq
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * angle.cos() - b * angle.sin(), a * angle.sin() + b * angle.cos()], -1)


def main():
    local = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local % torch.cuda.device_count())
    torch.cuda.set_device(device)
    dist.init_process_group("gloo")
    comm = wt.Comm.from_process_group()
    rank, s, h = comm.rank, comm.size, comm.handle
    lengths = [2 * s * 96, 2 * s * 64, 2 * s * 32]  # each a multiple of 2 · ranks
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    index = wt.zigzag_index(cu, s, rank)  # the packing's tokens this rank holds
    local_cu, positions, longest = wt.zigzag_local(cu, s, rank)
    local_cu, positions = local_cu.to(device), positions.to(device)

    torch.manual_seed(0)  # the same data and initial weights on every rank
    x_all = torch.randn(cu[-1], D, device=device)
    target_all = torch.randn(cu[-1], D, device=device) * 0.1
    x, target = x_all[index.to(device)], target_all[index.to(device)]
    wq = torch.nn.Linear(D, HEADS * HEAD_DIM, bias=False, device=device)
    wkv = torch.nn.Linear(D, 2 * KV_HEADS * HEAD_DIM, bias=False, device=device)
    wo = torch.nn.Linear(HEADS * HEAD_DIM, D, bias=False, device=device)
    params = [*wq.parameters(), *wkv.parameters(), *wo.parameters()]
    opt = torch.optim.Adam(params, lr=3e-3)

    for step in range(STEPS):
        q = rope(wq(x).view(-1, HEADS, HEAD_DIM), positions)
        k, v = wkv(x).view(-1, 2 * KV_HEADS, HEAD_DIM).split(KV_HEADS, 1)
        k = rope(k, positions)
        attn, _ = wt.ring_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), local_cu, longest,
                                    h, causal=True)
        out = wo(attn.float().flatten(1))
        loss = ((out - target) ** 2).sum() / (cu[-1] * D)  # this rank's share of the mean
        opt.zero_grad()
        loss.backward()  # ring attention's backward: K/V blocks travel the ring with their grads
        for p in params:  # replicated weights: the gradient over every rank's tokens
            wt.all_reduce_(p.grad, h)
        opt.step()
        total = wt.all_reduce(loss.detach(), h).item()
        if rank == 0 and (step % 10 == 0 or step == STEPS - 1):
            print(f"[rank 0] step {step:2d}: loss {total:.5f} ({s} ranks, {cu[-1]} tokens in "
                  f"{len(lengths)} sequences, {index.numel()} here)", flush=True)
    comm.destroy()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
