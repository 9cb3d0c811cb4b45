"""The collectives as torch.library custom ops (namespace weft), on CUDA tensors on the current
stream or CPU tensors on the host, with fake (meta) kernels for torch.compile and autograd:

  all_reduce          sum, avg: the same all-reduce of the gradient; prod, min, max: not
                      differentiable (backward raises)
  all_reduce_inplace  not differentiable (mutates its input)
  all_gather (dim 0)  reduce-scatter (sum) of the gradient
  reduce_scatter      all-gather of the gradient (avg: divided by the ranks)
  all_to_all          the all-to-all back, splits swapped
  broadcast           reduce (sum) of the gradient to the root; zero elsewhere
  reduce              broadcast of the root's gradient

Compression (fp8 on the wire) is an argument of all_reduce, all_gather and reduce_scatter; its
backward runs uncompressed. Every op returns a new tensor (custom ops may not alias inputs)."""

import ctypes
import math
from typing import List, Optional

import torch
from torch import Tensor

from weft._lib import check, lib

from ._common import compression_ptr, direct, entry, op_code, stream_of, type_code


_KERNELS = {}  # op name -> (its Python kernel, the registered op, whether it writes x)


def _op(name, mutates=()):
    """torch.library.custom_op("weft::<name>"), its kernel kept for call()."""

    def register(fn):
        op = torch.library.custom_op(f"weft::{name}", fn, mutates_args=mutates)
        _KERNELS[name] = (fn, getattr(torch.ops.weft, name).default, bool(mutates))
        return op

    return register


def call(name, x, *args):
    """torch.ops.weft.<name>(x, *args). An eager call with nothing to record runs the op's
    kernel itself, skipping the dispatcher's ~20 µs (docs/perf.md; the same code runs)."""
    kernel, op, writes = _KERNELS[name]
    if not direct(x):
        return op(x, *args)
    if writes:  # as the dispatcher would: autograd sees x changed if it saved it
        torch.autograd.graph.increment_version(x)
    return kernel(x, *args)


def _contig(x, what, rows=True):
    """x as one block; `rows`: the op cuts dim 0, so there must be one."""
    if rows and x.dim() == 0:
        raise ValueError(f"weft.torch: {what}: needs at least one dimension")
    return x.contiguous()


def _new(x, rows=None):
    shape = x.shape if rows is None else (rows, *x.shape[1:])
    return torch.empty(shape, dtype=x.dtype, device=x.device)


def _rows(x, n, what):
    if x.shape[0] % n:
        raise ValueError(f"weft.torch: {what}: dim 0 ({x.shape[0]}) is not a multiple of the "
                         f"{n} ranks")
    return x.shape[0] // n


def _grad(g):
    return g.contiguous()


# ---- all_reduce -------------------------------------------------------------------------------


def _run_all_reduce(x, out, comm, op, compression):
    e = entry(comm)
    args = (x.data_ptr(), out.data_ptr(), x.numel(), type_code(x, "all_reduce"), op_code(op),
            e.raw(), stream_of(x))
    if compression is None:
        check(lib.weftAllReduce(*args))
    else:
        check(lib.weftAllReduceEx(*args, compression_ptr(compression)))


@_op("all_reduce")
def all_reduce_op(x: Tensor, comm: int, op: str, compression: Optional[str]) -> Tensor:
    x = _contig(x, "all_reduce", rows=False)
    out = _new(x)
    _run_all_reduce(x, out, comm, op, compression)
    return out


@all_reduce_op.register_fake
def _(x, comm, op, compression):
    return _new(x)


def _all_reduce_setup(ctx, inputs, output):
    _, ctx.comm, ctx.op, _ = inputs


def _all_reduce_backward(ctx, grad):
    if ctx.op not in ("sum", "avg"):
        raise RuntimeError(f"weft.torch: all_reduce with op {ctx.op!r} is not differentiable")
    return all_reduce_op(_grad(grad), ctx.comm, ctx.op, None), None, None, None


all_reduce_op.register_autograd(_all_reduce_backward, setup_context=_all_reduce_setup)


@_op("all_reduce_inplace", mutates=("x",))
def all_reduce_inplace_op(x: Tensor, comm: int, op: str, compression: Optional[str]) -> None:
    if not x.is_contiguous():
        raise ValueError("weft.torch: all_reduce_: the tensor is not contiguous")
    _run_all_reduce(x, x, comm, op, compression)


@all_reduce_inplace_op.register_fake
def _(x, comm, op, compression):
    return None


# ---- all_gather, reduce_scatter ----------------------------------------------------------------


@_op("all_gather")
def all_gather_op(x: Tensor, comm: int, compression: Optional[str]) -> Tensor:
    e = entry(comm)
    x = _contig(x, "all_gather")
    out = _new(x, x.shape[0] * e.size)
    args = (x.data_ptr(), out.data_ptr(), x.numel(), type_code(x, "all_gather"), e.raw(),
            stream_of(x))
    if compression is None:
        check(lib.weftAllGather(*args))
    else:
        check(lib.weftAllGatherEx(*args, compression_ptr(compression)))
    return out


@all_gather_op.register_fake
def _(x, comm, compression):
    return _new(x, x.shape[0] * entry(comm).size)


def _all_gather_setup(ctx, inputs, output):
    ctx.comm = inputs[1]


def _all_gather_backward(ctx, grad):
    return reduce_scatter_op(_grad(grad), ctx.comm, "sum", None), None, None


all_gather_op.register_autograd(_all_gather_backward, setup_context=_all_gather_setup)


@_op("reduce_scatter")
def reduce_scatter_op(x: Tensor, comm: int, op: str, compression: Optional[str]) -> Tensor:
    e = entry(comm)
    x = _contig(x, "reduce_scatter")
    out = _new(x, _rows(x, e.size, "reduce_scatter"))
    args = (x.data_ptr(), out.data_ptr(), out.numel(), type_code(x, "reduce_scatter"),
            op_code(op), e.raw(), stream_of(x))
    if compression is None:
        check(lib.weftReduceScatter(*args))
    else:
        check(lib.weftReduceScatterEx(*args, compression_ptr(compression)))
    return out


@reduce_scatter_op.register_fake
def _(x, comm, op, compression):
    return _new(x, _rows(x, entry(comm).size, "reduce_scatter"))


def _reduce_scatter_setup(ctx, inputs, output):
    _, ctx.comm, ctx.op, _ = inputs


def _reduce_scatter_backward(ctx, grad):
    if ctx.op not in ("sum", "avg"):
        raise RuntimeError(f"weft.torch: reduce_scatter with op {ctx.op!r} is not differentiable")
    g = all_gather_op(_grad(grad), ctx.comm, None)
    if ctx.op == "avg":
        g = g / entry(ctx.comm).size
    return g, None, None, None


reduce_scatter_op.register_autograd(_reduce_scatter_backward, setup_context=_reduce_scatter_setup)


# ---- all_to_all --------------------------------------------------------------------------------


def _splits(x, n, out_splits, in_splits):
    """Per-rank element counts and displacements; empty splits: dim 0 cut evenly."""
    if not out_splits and not in_splits:
        return None
    if len(out_splits) != n or len(in_splits) != n:
        raise ValueError(f"weft.torch: all_to_all: out_splits and in_splits need {n} entries "
                         "each (or both empty)")
    if sum(in_splits) != x.shape[0]:
        raise ValueError(f"weft.torch: all_to_all: in_splits sum to {sum(in_splits)}, dim 0 is "
                         f"{x.shape[0]}")
    row = math.prod(x.shape[1:])
    return [[c * row for c in s] for s in (in_splits, out_splits)]


def _displs(counts):
    out, at = [], 0
    for c in counts:
        out.append(at)
        at += c
    return out


@_op("all_to_all")
def all_to_all_op(x: Tensor, comm: int, out_splits: List[int], in_splits: List[int]) -> Tensor:
    e = entry(comm)
    x = _contig(x, "all_to_all")
    cuts = _splits(x, e.size, out_splits, in_splits)
    code, stream = type_code(x, "all_to_all"), stream_of(x)
    if cuts is None:
        _rows(x, e.size, "all_to_all")
        out = _new(x)
        check(lib.weftAllToAll(x.data_ptr(), out.data_ptr(), x.numel() // e.size, code, e.raw(),
                               stream))
        return out
    out = _new(x, sum(out_splits))
    arrays = [(ctypes.c_size_t * e.size)(*v) for v in
              (cuts[0], _displs(cuts[0]), cuts[1], _displs(cuts[1]))]
    check(lib.weftAllToAllv(x.data_ptr(), arrays[0], arrays[1], out.data_ptr(), arrays[2],
                            arrays[3], code, e.raw(), stream))
    return out


@all_to_all_op.register_fake
def _(x, comm, out_splits, in_splits):
    if not out_splits:
        return _new(x)
    return _new(x, sum(out_splits))


def _all_to_all_setup(ctx, inputs, output):
    _, ctx.comm, ctx.out_splits, ctx.in_splits = inputs


def _all_to_all_backward(ctx, grad):
    return all_to_all_op(_grad(grad), ctx.comm, ctx.in_splits, ctx.out_splits), None, None, None


all_to_all_op.register_autograd(_all_to_all_backward, setup_context=_all_to_all_setup)


# ---- broadcast, reduce -------------------------------------------------------------------------


@_op("broadcast")
def broadcast_op(x: Tensor, comm: int, root: int) -> Tensor:
    e = entry(comm)
    x = _contig(x, "broadcast", rows=False)
    out = _new(x)
    check(lib.weftBroadcast(x.data_ptr(), out.data_ptr(), x.numel(), type_code(x, "broadcast"),
                            root, e.raw(), stream_of(x)))
    return out


@broadcast_op.register_fake
def _(x, comm, root):
    return _new(x)


def _broadcast_setup(ctx, inputs, output):
    _, ctx.comm, ctx.root = inputs


def _broadcast_backward(ctx, grad):
    return reduce_op(_grad(grad), ctx.comm, ctx.root, "sum"), None, None


broadcast_op.register_autograd(_broadcast_backward, setup_context=_broadcast_setup)


@_op("reduce")
def reduce_op(x: Tensor, comm: int, root: int, op: str) -> Tensor:
    """The reduction on rank `root`; zeros on the others."""
    e = entry(comm)
    x = _contig(x, "reduce", rows=False)
    out = _new(x)
    check(lib.weftReduce(x.data_ptr(), out.data_ptr(), x.numel(), type_code(x, "reduce"),
                         op_code(op), root, e.raw(), stream_of(x)))
    if e.rank != root:
        out.zero_()  # a non-root's receive buffer is not written
    return out


@reduce_op.register_fake
def _(x, comm, root, op):
    return _new(x)


def _reduce_setup(ctx, inputs, output):
    _, ctx.comm, ctx.root, ctx.op = inputs


def _reduce_backward(ctx, grad):
    if ctx.op not in ("sum", "avg"):
        raise RuntimeError(f"weft.torch: reduce with op {ctx.op!r} is not differentiable")
    g = broadcast_op(_grad(grad), ctx.comm, ctx.root)
    if ctx.op == "avg":
        g = g / entry(ctx.comm).size
    return g, None, None, None


reduce_op.register_autograd(_reduce_backward, setup_context=_reduce_setup)
