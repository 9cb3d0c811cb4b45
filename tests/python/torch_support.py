"""Shared by test_torch.py and torch_fused_checks.py: seeded data every rank can regenerate for
any rank (so references need no communication), poisoned allocations, tolerances, and the
directional finite-difference check for ops without float64."""

import zlib

import torch

import weft.torch as wt


class Ctx:
    """One rank's view: its rank, the ranks, its device and a weft communicator's handle."""

    def __init__(self, rank, n, device, comm):
        self.rank, self.n, self.device, self.comm = rank, n, device, comm
        self.h = comm.handle


def gen(tag, rank, shape, dtype=torch.float64, scale=1.0):
    """Rank `rank`'s values for `tag`: the same on every process (a CPU generator, a fixed seed)."""
    g = torch.Generator().manual_seed(zlib.crc32(f"{tag}/{rank}".encode()))
    return torch.randn(shape, generator=g, dtype=torch.float64).mul_(scale).to(dtype)


def poison(nbytes, device):
    """Leaves a freed block of NaN bytes where the caching allocator will hand out the next
    allocation of about this size, so an op that skips part of its output shows it."""
    t = torch.empty(max(int(nbytes), 1), dtype=torch.uint8, device=device)
    t.fill_(0xFF)
    del t


def close(what, actual, expected, tol):
    """max |actual − expected| ≤ tol · max(1, max |expected|), in float64."""
    a, e = actual.detach().double().cpu(), expected.detach().double().cpu()
    if a.shape != e.shape:
        raise AssertionError(f"{what}: shape {tuple(a.shape)}, expected {tuple(e.shape)}")
    if not torch.isfinite(a).all():
        raise AssertionError(f"{what}: non-finite values at {(~torch.isfinite(a)).nonzero()[:4]}")
    err = (a - e).abs().max().item() if a.numel() else 0.0
    limit = tol * max(1.0, e.abs().max().item() if e.numel() else 0.0)
    if err > limit:
        at = (a - e).abs().argmax().item()
        raise AssertionError(f"{what}: error {err:.3g} > {limit:.3g} (at flat {at}: "
                             f"{a.flatten()[at].item():.6g} vs {e.flatten()[at].item():.6g})")


def equal(what, actual, expected):
    if not torch.equal(actual.cpu(), expected.cpu()):
        diff = (actual.cpu() != expected.cpu()).nonzero()[:4].tolist()
        raise AssertionError(f"{what}: differs at {diff}")


def global_sum(ctx, value):
    """Σ over the ranks of a float (float64 on the GPU)."""
    t = torch.tensor([float(value)], dtype=torch.float64, device=ctx.device)
    return wt.all_reduce(t, ctx.h).item()


def directional(ctx, what, fn, inputs, shared=(), h=1e-2, tol=2e-3):
    """Checks fn's gradients against a central difference along a random direction of every
    rank's inputs at once: the loss is Σ over ranks of ⟨V_r, fn_r⟩, so the derivative along U is
    Σ_r Σ_i ⟨grad_ri, U_ri⟩. Inputs at `shared` positions are one tensor replicated over the
    ranks: the same direction everywhere, and their gradient (the whole one on every rank)
    counted once."""
    leaves = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs]
    out = fn(*leaves)
    v = gen(what + "/V", ctx.rank, out.shape).to(out.device, out.dtype)
    dirs = [gen(f"{what}/U{i}", 0 if i in shared else ctx.rank, t.shape).to(t.device, t.dtype)
            if t.is_floating_point() else None for i, t in enumerate(leaves)]
    wrt = [t for t in leaves if t.requires_grad]
    grads = dict(zip(map(id, wrt), torch.autograd.grad(out, wrt, v, allow_unused=True)))
    local = 0.0
    for i, t in enumerate(leaves):
        g = grads.get(id(t))
        if g is None or (i in shared and ctx.rank != 0):
            continue
        local += (g.double() * dirs[i].double()).sum().item()
    analytic = global_sum(ctx, local)

    def loss(step):
        with torch.no_grad():
            moved = [t + step * d if d is not None else t for t, d in zip(leaves, dirs)]
            return global_sum(ctx, (fn(*moved).double() * v.double()).sum().item())

    numeric = (loss(h) - loss(-h)) / (2 * h)
    if abs(numeric - analytic) > tol * max(1.0, abs(analytic)):
        raise AssertionError(f"{what}: directional derivative {analytic:.6g} (autograd) vs "
                             f"{numeric:.6g} (central difference)")
