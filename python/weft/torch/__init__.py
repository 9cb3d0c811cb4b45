"""weft for PyTorch: communicators from process groups, weft's collectives and fused operations
as torch.library custom ops (torch.ops.weft.*: CUDA graphs, torch.compile, autograd), and a
torch.distributed backend named "weft". Importing it imports torch; `import weft` does not.

    import weft.torch as wt
    dist.init_process_group("nccl")                # or: wt.register_backend(); ...("weft")
    comm = wt.Comm.from_process_group()            # collective over the group
    y = wt.all_reduce(x, comm)                     # on x's device's current stream
    c = wt.ag_gemm(a_shard, w_shard, comm)         # C = allgather(A) @ W, differentiable

A communicator cannot be an op's argument, so the ops take an int that names it
(`comm.handle`, or weft.torch.handle_of(any weft.Comm)); the functions below take either.
Inside torch.compile pass the int. docs/api.md, "Python", has the autograd contract."""

import torch

from . import collectives as _c
from . import fused as _f
from ._common import Comm, comm_from_process_group, entry, handle_of, stream_of
from .backend import ProcessGroupWeft, register_backend
from .fused import zigzag_index, zigzag_local
from .moe import MoeDispatch, moe_combine, moe_dispatch

__all__ = [
    "Comm", "MoeDispatch", "ProcessGroupWeft", "ag_gemm", "ag_gemm_fp8", "all_gather",
    "all_reduce", "all_reduce_", "all_reduce_compressed", "all_to_all", "broadcast",
    "comm_from_process_group", "gemm_rs", "gemm_rs_fp8", "handle_of", "moe_combine",
    "moe_dispatch", "recv", "reduce", "reduce_scatter", "register_backend", "ring_attention",
    "send", "zigzag_index", "zigzag_local",
]


def all_reduce(x, comm, op="sum", compression=None):
    """A new tensor: the reduction of x over the ranks (op sum, prod, min, max, avg)."""
    return _c.call("all_reduce", x, handle_of(comm), op, compression)


def all_reduce_(x, comm, op="sum", compression=None):
    """In place (x contiguous); not differentiable. Returns x."""
    _c.call("all_reduce_inplace", x, handle_of(comm), op, compression)
    return x


def all_reduce_compressed(x, comm, compression="fp8e4m3:32", op="sum"):
    """All-reduce whose values cross between ranks as fp8 with one scale per block
    (weftAllReduceEx): bf16, f16 or f32; sum or avg; "fp8e4m3:32" (E4M3, a power-of-two scale per
    32 values), "e5m2:128" (E5M2, an f32 scale per 128), either with ":always" to compress every
    call (else the selector compresses where that is priced cheaper), or "default" for the
    communicator's own (WEFT_COMPRESS). Another type or op is weft's invalid argument.

    The error contract (docs/api.md, "Compressed collectives"): element i of the result differs
    from the exact sum by at most Σᵣ Bᵣᵢ + B′ᵢ, plus f32 accumulation (n · 2⁻²³ · Σᵣ|xᵣᵢ|) and
    the output type's rounding. Bᵣᵢ = scaleᵣ · 2^(eᵣᵢ − m − 1) bounds the quantization of rank r's
    value (scaleᵣ its block's scale, eᵣᵢ = ⌊log2(|xᵣᵢ| / scaleᵣ)⌋ but at least the element's
    smallest normal exponent, m = 3 for E4M3 and 2 for E5M2; f32 scales add |xᵣᵢ| · 2⁻²²) and
    B′ᵢ the same for the reduced value in its block: about 2⁻⁴ (E4M3) or 2⁻³ (E5M2) of each
    block's largest magnitude per quantization. For avg the first term is divided by n. Every rank gets the same bits; a block
    with a NaN or an infinity on any rank becomes NaN.

    Autograd: the gradient is all-reduced uncompressed (the quantization is taken as the
    identity)."""
    return _c.call("all_reduce", x, handle_of(comm), op, compression)


def all_gather(x, comm, compression=None):
    """The ranks' x stacked along dim 0 (rank order)."""
    return _c.call("all_gather", x, handle_of(comm), compression)


def reduce_scatter(x, comm, op="sum", compression=None):
    """This rank's part (dim 0 cut in ranks' parts) of the reduction of x over the ranks."""
    return _c.call("reduce_scatter", x, handle_of(comm), op, compression)


def all_to_all(x, comm, out_splits=None, in_splits=None):
    """Part q of x (dim 0; in_splits rows each, or even parts) goes to rank q; the result holds
    what each rank sent this one, in rank order (out_splits rows from each)."""
    return _c.call("all_to_all", x, handle_of(comm), list(out_splits or []),
                   list(in_splits or []))


def broadcast(x, comm, root=0):
    """A new tensor holding root's x on every rank."""
    return _c.call("broadcast", x, handle_of(comm), root)


def reduce(x, comm, root=0, op="sum"):
    """The reduction on root; zeros elsewhere."""
    return _c.call("reduce", x, handle_of(comm), root, op)


def send(x, peer, comm):
    """Eager point to point on the current stream (not an op: no autograd, no compile)."""
    entry(handle_of(comm)).comm.send(x.contiguous(), peer, stream=stream_of(x))


def recv(x, peer, comm):
    """Receives into x (contiguous) from peer; returns x."""
    entry(handle_of(comm)).comm.recv(x, peer, stream=stream_of(x))
    return x


def ag_gemm(a, b, comm, bias=None, return_gathered=False):
    """Column-parallel: C [m, n/s] = allgather(A [m/s, k]) @ B [k, n/s] (+ bias [n/s]), row-major
    bf16, f16 or f32 on the GPU. With return_gathered, (C, the gathered A [m, k])."""
    gather = return_gathered or (torch.is_grad_enabled() and b.requires_grad)
    c, gathered = _f.ag_gemm_op(a, b, bias, handle_of(comm), gather)
    return (c, gathered) if return_gathered else c


def gemm_rs(a, b, comm, bias=None):
    """Row-parallel: C [m/s, n] = reducescatter(A [m, k/s] @ B [k/s, n]) (+ bias [n], the same on
    every rank, added once)."""
    return _f.gemm_rs_op(a, b, bias, handle_of(comm))


def ag_gemm_fp8(a, b_t, comm, a_scale=None, b_scale=None, bias=None, out_dtype=torch.bfloat16,
                block_scaled=False):
    """weftAllGatherGemmFp8: e4m3 A [m/s, k] and Bᵀ [n/s, k]; C [m, n/s] of out_dtype = scaled
    A·B (+ bias). Scales: one float each (per tensor; a_scale the same on every rank), or with
    block_scaled DeepSeek-V3's 128-blocks (docs/api.md). Forward only."""
    return _f.ag_gemm_fp8_op(a, b_t, a_scale, b_scale, bias, out_dtype, block_scaled,
                             handle_of(comm))


def gemm_rs_fp8(a, b_t, comm, a_scale=None, b_scale=None, bias=None, out_dtype=torch.bfloat16,
                block_scaled=False):
    """weftGemmReduceScatterFp8: e4m3 A [m, k/s] and Bᵀ [n, k/s]; C [m/s, n]. Forward only."""
    return _f.gemm_rs_fp8_op(a, b_t, a_scale, b_scale, bias, out_dtype, block_scaled,
                             handle_of(comm))


def ring_attention(q, k, v, cu_seqlens, max_seqlen, comm, causal=True, softmax_scale=0.0):
    """Context-parallel attention over this rank's zigzag shard (zigzag_local) of packed
    sequences: q [tokens, heads, head_dim], k and v [tokens, kv_heads, head_dim] (bf16 or f16,
    head_dim 64 or 128), cu_seqlens the local offsets (int32 on the GPU), max_seqlen the longest
    local sequence. Returns (out like q, lse [heads, tokens] f32). softmax_scale 0: 1/√head_dim.
    Differentiable in q, k and v."""
    return _f.ring_attention_op(q, k, v, cu_seqlens, int(max_seqlen), handle_of(comm),
                                bool(causal), float(softmax_scale))

