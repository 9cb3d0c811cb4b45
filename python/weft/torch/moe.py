"""MoE dispatch and combine (weftMoeDispatch, weftMoeCombine) as torch.library custom ops, on
GPU or host memory, with autograd. The experts split evenly over the ranks in order; dispatch
sends each token's row to the ranks of its top-k experts (recv_x [capacity, hidden], grouped by
local expert, each expert's rows in (source rank, token) order; rows past expert_counts' sum
are zero), combine brings back out [tokens, hidden] = Σ over a token's slots of weight · the
expert's output row.

Autograd, with tokens T, slots k and the rows R a rank received:
- combine → expert_out: the gradient's rows dispatched again (the same routing, so the same
  layout), each scaled by its slot's weight. → topk_weights: per slot, ⟨grad_out[t], the
  expert's output row⟩, computed where the row is and sent home by a reduce-scatter of a
  [ranks · T · k] table (each entry written by one rank). The weights of every rank reach
  every rank through one all-gather of [T, k] (small beside the rows).
- dispatch → x: Σ over a token's rows of their gradient, which is a combine with unit weights.
  Combine's backward leaves its dispatch (unit weights) open for this; where it cannot be used
  (dispatch's output did not reach a combine, or another dispatch came between), a fresh
  dispatch of zeros with unit weights gives the layout.
- expert_counts, recv_source and the handle are integers: not differentiable. topk_idx is not.
On GPU memory the backward calls wait on the host (outside a capture, dispatch checks its
routing), so the backward is not capturable; the forward is, once a call of the shape ran. Every
rank must take the same path (the same ops in the same order), as for any collective."""

import itertools
import weakref
from typing import NamedTuple, Tuple

import torch
from torch import Tensor

from ._common import dense, entry, handle_of, stream_of

_ids = itertools.count(1)
_forward = {}  # handle id -> (comm handle, weft.MoeHandle): dispatched, not combined yet
_pending = {}  # comm handle -> (forward handle id, weft.MoeHandle): combine's backward dispatch


def _release(hid):
    item = _forward.pop(hid, None)
    if item is not None:
        item[1].close()


def _flush(comm, gpu):
    """Before a dispatch: closes combine's backward dispatch still waiting on this communicator
    and, on GPU memory, any dispatch of it never combined (weft takes a GPU dispatch only after
    the previous one was combined or closed; outside a capture closing one is safe, as each
    dispatch waited for every rank's)."""
    item = _pending.pop(comm, None)
    if item is not None:
        item[1].close()
    if gpu:
        for hid in [hid for hid, (c, _) in _forward.items() if c == comm]:
            _release(hid)


def _routing(what, x, topk_idx, topk_weights, experts, size):
    if x.dim() != 2 or topk_idx.dim() != 2 or topk_weights.shape != topk_idx.shape:
        raise ValueError(f"weft.torch: {what}: x [tokens, hidden], topk_idx and topk_weights "
                         "[tokens, k]")
    if topk_idx.shape[0] != x.shape[0]:
        raise ValueError(f"weft.torch: {what}: x has {x.shape[0]} tokens, topk_idx "
                         f"{topk_idx.shape[0]}")
    if experts % size:
        raise ValueError(f"weft.torch: {what}: {experts} experts do not split over {size} ranks")
    return (dense(x, "x"), dense(topk_idx.to(torch.int64), "topk_idx"),
            dense(topk_weights.to(torch.float32), "topk_weights"))


def _dispatch(e, comm, x, idx, w, experts, capacity):
    _flush(comm, x.is_cuda)
    recv = torch.zeros((capacity, x.shape[1]), dtype=x.dtype, device=x.device)
    counts = torch.empty(experts // e.size, dtype=torch.int32, device=x.device)
    source = torch.empty((capacity, 2), dtype=torch.int32, device=x.device)
    h = e.comm.moe_dispatch(x, idx, w, experts, recv, counts, source, stream=stream_of(x))
    return recv, counts, source, h


def _combine(e, h, expert_out, tokens):
    out = torch.empty((tokens, expert_out.shape[1]), dtype=expert_out.dtype,
                      device=expert_out.device)
    e.comm.moe_combine(h, expert_out, out, stream=stream_of(expert_out))
    h.close()
    return out


# ---- dispatch ----------------------------------------------------------------------------------


@torch.library.custom_op("weft::moe_dispatch", mutates_args=())
def moe_dispatch_op(x: Tensor, topk_idx: Tensor, topk_weights: Tensor, experts: int,
                    capacity: int, comm: int) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    e = entry(comm)
    x, idx, w = _routing("moe_dispatch", x, topk_idx, topk_weights, experts, e.size)
    recv, counts, source, h = _dispatch(e, comm, x, idx, w, experts, capacity)
    hid = next(_ids)
    _forward[hid] = (comm, h)
    handle = torch.tensor(hid, dtype=torch.int64)
    weakref.finalize(handle, _release, hid)  # a dispatch never combined is closed with it
    return recv, counts, source, handle


@moe_dispatch_op.register_fake
def _(x, topk_idx, topk_weights, experts, capacity, comm):
    e = entry(comm)
    return (x.new_empty((capacity, x.shape[1])),
            x.new_empty((experts // e.size,), dtype=torch.int32),
            x.new_empty((capacity, 2), dtype=torch.int32),
            torch.empty((), dtype=torch.int64, device="cpu"))


def _dispatch_setup(ctx, inputs, output):
    _, topk_idx, _, ctx.experts, _, ctx.comm = inputs
    ctx.save_for_backward(topk_idx, output[3])


def _dispatch_backward(ctx, grad_recv, _counts, _source, _handle):
    if not ctx.needs_input_grad[0]:  # a combine's backward dispatch left open is closed later
        return None, None, None, None, None, None
    topk_idx, handle = ctx.saved_tensors
    grad_x = moe_dispatch_backward_op(handle, grad_recv.contiguous(), topk_idx, ctx.experts,
                                      ctx.comm)
    return grad_x, None, None, None, None, None


@torch.library.custom_op("weft::moe_dispatch_backward", mutates_args=())
def moe_dispatch_backward_op(handle: Tensor, grad_recv: Tensor, topk_idx: Tensor, experts: int,
                             comm: int) -> Tensor:
    e = entry(comm)
    tokens = topk_idx.shape[0]
    g = dense(grad_recv, "grad_recv")
    item = _pending.pop(comm, None)
    if item is not None and item[0] == int(handle):
        h = item[1]
    else:
        if item is not None:
            item[1].close()
        zeros = g.new_zeros((tokens, g.shape[1]))
        idx = dense(topk_idx.to(torch.int64), "topk_idx")
        ones = torch.ones(idx.shape, dtype=torch.float32, device=g.device)
        h = _dispatch(e, comm, zeros, idx, ones, experts, g.shape[0])[3]
    return _combine(e, h, g, tokens)


@moe_dispatch_backward_op.register_fake
def _(handle, grad_recv, topk_idx, experts, comm):
    return grad_recv.new_empty((topk_idx.shape[0], grad_recv.shape[1]))


moe_dispatch_op.register_autograd(_dispatch_backward, setup_context=_dispatch_setup)


# ---- combine -----------------------------------------------------------------------------------


@torch.library.custom_op("weft::moe_combine", mutates_args=())
def moe_combine_op(handle: Tensor, expert_out: Tensor, topk_idx: Tensor, topk_weights: Tensor,
                   expert_counts: Tensor, recv_source: Tensor, comm: int) -> Tensor:
    """out = Σ weight · expert_out over each token's slots, with the weights dispatch was given
    (topk_idx, topk_weights, expert_counts and recv_source are there for the backward)."""
    e = entry(comm)
    hid = int(handle)
    item = _forward.pop(hid, None)
    if item is None:
        raise ValueError("weft.torch: moe_combine: the handle's dispatch was combined already, "
                         "or closed by a later dispatch on the communicator (GPU memory)")
    return _combine(e, item[1], dense(expert_out, "expert_out"), topk_idx.shape[0])


@moe_combine_op.register_fake
def _(handle, expert_out, topk_idx, topk_weights, expert_counts, recv_source, comm):
    return expert_out.new_empty((topk_idx.shape[0], expert_out.shape[1]))


def _combine_setup(ctx, inputs, output):
    handle, expert_out, idx, w, counts, source, ctx.comm = inputs
    ctx.save_for_backward(handle, expert_out, idx, w, counts, source)


def _combine_backward(ctx, grad_out):
    handle, expert_out, idx, w, counts, source = ctx.saved_tensors
    grad_expert_out, grad_w = moe_combine_backward_op(handle, grad_out.contiguous(), expert_out,
                                                      idx, w, counts, source, ctx.comm)
    return None, grad_expert_out, None, grad_w, None, None, None


def _rows_of(e, idx, w, counts, source, capacity):
    """Per received row: whether it holds a slot, the slot's place (source · T + token) · k + j
    in a [ranks, T, k] table, and the slot's weight."""
    n, tokens, k = e.size, idx.shape[0], idx.shape[1]
    stream = stream_of(idx)
    all_idx = idx.new_empty((n * tokens, k))
    all_w = w.new_empty((n * tokens, k))
    e.comm.all_gather(idx, all_idx, stream=stream)
    e.comm.all_gather(w, all_w, stream=stream)
    local = counts.numel()
    rows = torch.arange(capacity, device=idx.device)
    expert = torch.searchsorted(counts.long().cumsum(0), rows, right=True)
    valid = expert < local
    src = source[:, 0].long().clamp(0, n - 1)
    tok = source[:, 1].long().clamp(0, max(tokens - 1, 0))
    flat = torch.where(valid, src * tokens + tok, torch.zeros_like(src))
    match = all_idx[flat] == (e.rank * local + expert).unsqueeze(1)
    valid = valid & match.any(1)
    slot = match.int().argmax(1)
    weight = (all_w[flat] * match).sum(1)
    place = torch.where(valid, flat * k + slot, torch.full_like(flat, n * tokens * k))
    return valid, place, weight


@torch.library.custom_op("weft::moe_combine_backward", mutates_args=())
def moe_combine_backward_op(handle: Tensor, grad_out: Tensor, expert_out: Tensor,
                            topk_idx: Tensor, topk_weights: Tensor, expert_counts: Tensor,
                            recv_source: Tensor, comm: int) -> Tuple[Tensor, Tensor]:
    e = entry(comm)
    n, (tokens, k), capacity = e.size, topk_idx.shape, expert_out.shape[0]
    idx = dense(topk_idx.to(torch.int64), "topk_idx")
    w = dense(topk_weights.to(torch.float32), "topk_weights")
    g = dense(grad_out.to(expert_out.dtype), "grad_out")
    ones = torch.ones(idx.shape, dtype=torch.float32, device=g.device)
    rows, _, _, h = _dispatch(e, comm, g, idx, ones, expert_counts.numel() * n, capacity)
    _pending[comm] = (int(handle), h)  # dispatch's backward combines through it
    valid, place, weight = _rows_of(e, idx, w, expert_counts, recv_source, capacity)
    rows = rows.float()
    keep = valid.unsqueeze(1)
    grad_expert_out = torch.where(keep, rows * weight.unsqueeze(1), 0.0).to(expert_out.dtype)
    dots = torch.where(valid, (rows * expert_out.float()).sum(1), 0.0)
    table = torch.zeros(n * tokens * k + 1, dtype=torch.float32, device=g.device)
    table.scatter_add_(0, place, dots)
    grad_w = torch.empty((tokens, k), dtype=torch.float32, device=g.device)
    e.comm.reduce_scatter(table[: n * tokens * k], grad_w, stream=stream_of(g))
    return grad_expert_out, grad_w


@moe_combine_backward_op.register_fake
def _(handle, grad_out, expert_out, topk_idx, topk_weights, expert_counts, recv_source, comm):
    return (expert_out.new_empty(expert_out.shape),
            expert_out.new_empty(topk_idx.shape, dtype=torch.float32))


moe_combine_op.register_autograd(_combine_backward, setup_context=_combine_setup)


# ---- the functions -----------------------------------------------------------------------------


class MoeDispatch(NamedTuple):
    """What dispatch returns and combine takes back."""

    recv_x: Tensor  # [capacity, hidden]: the rows, by local expert
    expert_counts: Tensor  # [experts / ranks] int32: each local expert's rows
    recv_source: Tensor  # [capacity, 2] int32: each row's source rank and token
    handle: Tensor  # the layout combine needs (an int64 scalar on the CPU)
    topk_idx: Tensor
    topk_weights: Tensor
    comm: int


def moe_dispatch(x, topk_idx, topk_weights, experts, capacity, comm):
    """Sends each token of x [tokens, hidden] to the ranks of its top-k experts (topk_idx
    [tokens, k], int64, −1 drops a slot; topk_weights [tokens, k], combine's weights). capacity:
    the most rows this rank may receive (rows past it are every rank's error). GPU memory needs
    the same tokens on every rank and rows of 16-byte multiples. Each dispatch is combined (or
    dropped) before the next dispatch on the communicator."""
    h = handle_of(comm)
    topk_weights = topk_weights.to(torch.float32)
    recv, counts, source, handle = moe_dispatch_op(x, topk_idx, topk_weights, experts, capacity, h)
    return MoeDispatch(recv, counts, source, handle, topk_idx, topk_weights, h)


def moe_combine(dispatched, expert_out):
    """out [tokens, hidden] = Σ over each token's slots of weight · the expert's output row
    (expert_out laid out as dispatched.recv_x), in f32, the ranks' parts summed in rank order."""
    d = dispatched
    return moe_combine_op(d.handle, expert_out, d.topk_idx, d.topk_weights, d.expert_counts,
                          d.recv_source, d.comm)
