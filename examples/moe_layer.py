#!/usr/bin/env python3
"""An expert-parallel MoE layer trained a few steps: a router picks each token's top-2 experts,
weft.torch.moe_dispatch sends the token to the ranks holding them, each rank runs its experts
(a two-layer FFN each) on the rows it received, and weft.torch.moe_combine brings back the
weighted sum. Autograd reaches every part: the experts (local to their rank), the router through
the combine weights, and the input through dispatch. The router is replicated, so its gradient
is averaged over the ranks; the experts are not.

  PYTHONPATH=python WEFT_LIBRARY=build/lib/libweft.so.0 \\
      python3 -m torch.distributed.run --standalone --nproc_per_node=2 examples/moe_layer.py

The loss printed by rank 0 falls as the layer fits its target.
"""
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F

import weft.torch as wt

HIDDEN, FFN, TOKENS, EXPERTS_PER_RANK, TOPK, STEPS = 128, 256, 64, 2, 2, 40


class Experts(torch.nn.Module):
    """This rank's experts: expert e's FFN applied to its rows of recv_x."""

    def __init__(self, count, device):
        super().__init__()
        self.w1 = torch.nn.Parameter(torch.randn(count, HIDDEN, FFN, device=device) / HIDDEN ** 0.5)
        self.w2 = torch.nn.Parameter(torch.randn(count, FFN, HIDDEN, device=device) / FFN ** 0.5)

    def forward(self, rows, counts):
        out, at = [], 0
        for e, c in enumerate(counts.tolist()):
            out.append(F.gelu(rows[at:at + c] @ self.w1[e]) @ self.w2[e])
            at += c
        out.append(rows[at:] * 0)  # the rows no slot filled
        return torch.cat(out)


def main():
    local = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local % torch.cuda.device_count())
    torch.cuda.set_device(device)
    dist.init_process_group("gloo")
    comm = wt.Comm.from_process_group()
    rank, s, h = comm.rank, comm.size, comm.handle
    experts = EXPERTS_PER_RANK * s
    torch.manual_seed(0)
    router = torch.nn.Linear(HIDDEN, experts, bias=False, device=device)  # the same everywhere
    torch.manual_seed(1 + rank)
    mine = Experts(EXPERTS_PER_RANK, device)  # this rank's own
    x = torch.randn(TOKENS, HIDDEN, device=device)  # every rank the same token count (GPU)
    target = torch.sin(x.roll(1, 1)) * 0.5
    opt = torch.optim.Adam([*router.parameters(), *mine.parameters()], lr=3e-3)
    for step in range(STEPS):
        scores = router(x).softmax(-1)
        weights, idx = scores.topk(TOPK, -1)
        d = wt.moe_dispatch(x, idx, weights, experts, capacity=s * TOKENS * TOPK, comm=h)
        y = wt.moe_combine(d, mine(d.recv_x, d.expert_counts))
        loss = ((y - target) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        for p in router.parameters():
            wt.all_reduce_(p.grad, h, op="avg")
        opt.step()
        mean = wt.all_reduce(loss.detach(), h, op="avg").item()
        if rank == 0 and (step % 10 == 0 or step == STEPS - 1):
            rows = d.expert_counts.tolist()
            print(f"[rank 0] step {step:2d}: loss {mean:.5f} ({experts} experts over {s} ranks; "
                  f"rows at rank 0's experts {rows})", flush=True)
    comm.destroy()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
