"""weft's tensor-parallel GEMMs and ring attention as torch.library custom ops (GPU memory, the
current stream, capturable once a call of the shape ran outside the capture), with autograd:

  ag_gemm   C [m, n/s] = allgather(A [m/s, k]) @ B [k, n/s] (+ bias [n/s])
            dA = gemm_rs(dC, Bᵀ); dB = gathered Aᵀ @ dC; dbias = Σ rows of dC
  gemm_rs   C [m/s, n] = reducescatter(A [m, k/s] @ B [k/s, n]) (+ bias [n], rank 0's, once)
            dA, gathered dC = ag_gemm(dC, Bᵀ); dB = Aᵀ @ gathered dC; dbias = Σ rows of the
            gathered dC on every rank (the bias is one tensor replicated over the ranks)
  ring_attention  out, lse of zigzag-sharded packed sequences; backward through
            weftRingAttentionBackward (dq, dk, dv); lse's gradient is dropped

The fp8 GEMMs (ag_gemm_fp8, gemm_rs_fp8) are forward only."""

import ctypes
from typing import Optional, Tuple

import torch
from torch import Tensor

from weft._lib import DTYPES, Attention, AttentionGrads, TpFp8, check, lib

from ._common import dense, entry, ptr, stream_of, type_code

_GEMM_TYPES = (torch.bfloat16, torch.float16, torch.float32)


def _matrices(what, a, b, bias):
    for name, t in (("A", a), ("B", b)):
        if t.dim() != 2:
            raise ValueError(f"weft.torch: {what}: {name} must be 2-D (got {tuple(t.shape)})")
        if not t.is_cuda:
            raise ValueError(f"weft.torch: {what}: {name} must be on a GPU")
    if a.dtype != b.dtype or (bias is not None and bias.dtype != a.dtype):
        raise TypeError(f"weft.torch: {what}: A, B and the bias differ in element type")
    if a.dtype not in _GEMM_TYPES:
        raise TypeError(f"weft.torch: {what}: bf16, f16 or f32, not {a.dtype}")
    return dense(a, "A"), dense(b, "B"), None if bias is None else dense(bias, "bias")


def _empty(shape, like, dtype=None):
    return torch.empty(shape, dtype=dtype or like.dtype, device=like.device)


# ---- all-gather + GEMM ------------------------------------------------------------------------


def _ag_gemm_shapes(a, b, s):
    m, k, nl = a.shape[0] * s, a.shape[1], b.shape[1]
    if b.shape[0] != k:
        raise ValueError(f"weft.torch: ag_gemm: A is [m/s, {k}], B is [{b.shape[0]}, n/s]")
    return m, k, nl


@torch.library.custom_op("weft::ag_gemm", mutates_args=())
def ag_gemm_op(a: Tensor, b: Tensor, bias: Optional[Tensor], comm: int,
               gather: bool) -> Tuple[Tensor, Tensor]:
    e = entry(comm)
    a, b, bias = _matrices("ag_gemm", a, b, bias)
    m, k, nl = _ag_gemm_shapes(a, b, e.size)
    c = _empty((m, nl), a)
    gathered = _empty((m, k) if gather else (0,), a)
    check(lib.weftAllGatherGemm(a.data_ptr(), b.data_ptr(), c.data_ptr(),
                                gathered.data_ptr() if gather else None, ptr(bias), m,
                                nl * e.size, k, type_code(a, "ag_gemm"), None, 0, e.raw(),
                                stream_of(a)))
    return c, gathered


@ag_gemm_op.register_fake
def _(a, b, bias, comm, gather):
    m, k, nl = _ag_gemm_shapes(a, b, entry(comm).size)
    return _empty((m, nl), a), _empty((m, k) if gather else (0,), a)


def _ag_gemm_setup(ctx, inputs, output):
    a, b, bias, ctx.comm, gather = inputs
    ctx.has_bias = bias is not None
    ctx.save_for_backward(a, b, output[1] if gather else None)


def _ag_gemm_backward(ctx, grad_c, _grad_gathered):
    from .collectives import all_gather_op

    a, b, gathered = ctx.saved_tensors
    grad_c = grad_c.contiguous()
    need_a, need_b, need_bias = ctx.needs_input_grad[:3]
    grad_a = grad_b = grad_bias = None
    if need_a:
        grad_a = gemm_rs_op(grad_c, b.t().contiguous(), None, ctx.comm)
    if need_b:
        if gathered is None:
            gathered = all_gather_op(a.contiguous(), ctx.comm, None)
        grad_b = gathered.t() @ grad_c
    if need_bias and ctx.has_bias:
        grad_bias = grad_c.sum(0)
    return grad_a, grad_b, grad_bias, None, None


ag_gemm_op.register_autograd(_ag_gemm_backward, setup_context=_ag_gemm_setup)


# ---- GEMM + reduce-scatter --------------------------------------------------------------------


def _gemm_rs_shapes(a, b, s):
    m, kl, n = a.shape[0], a.shape[1], b.shape[1]
    if b.shape[0] != kl:
        raise ValueError(f"weft.torch: gemm_rs: A is [m, {kl}], B is [{b.shape[0]}, n]")
    if m % s:
        raise ValueError(f"weft.torch: gemm_rs: m ({m}) is not a multiple of the {s} ranks")
    return m, kl, n


@torch.library.custom_op("weft::gemm_rs", mutates_args=())
def gemm_rs_op(a: Tensor, b: Tensor, bias: Optional[Tensor], comm: int) -> Tensor:
    e = entry(comm)
    a, b, bias = _matrices("gemm_rs", a, b, bias)
    m, kl, n = _gemm_rs_shapes(a, b, e.size)
    c = _empty((m // e.size, n), a)
    check(lib.weftGemmReduceScatter(a.data_ptr(), b.data_ptr(), c.data_ptr(), ptr(bias), m, n,
                                    kl * e.size, type_code(a, "gemm_rs"), None, 0, e.raw(),
                                    stream_of(a)))
    return c


@gemm_rs_op.register_fake
def _(a, b, bias, comm):
    s = entry(comm).size
    m, _, n = _gemm_rs_shapes(a, b, s)
    return _empty((m // s, n), a)


def _gemm_rs_setup(ctx, inputs, output):
    a, b, bias, ctx.comm = inputs
    ctx.has_bias = bias is not None
    ctx.save_for_backward(a, b)


def _gemm_rs_backward(ctx, grad_c):
    from .collectives import all_gather_op

    a, b = ctx.saved_tensors
    grad_c = grad_c.contiguous()
    need_a, need_b, need_bias = ctx.needs_input_grad[:3]
    grad_a = grad_b = grad_bias = None
    if need_a:
        grad_a, gathered = ag_gemm_op(grad_c, b.t().contiguous(), None, ctx.comm, True)
    else:
        gathered = all_gather_op(grad_c, ctx.comm, None)
    if need_b:
        grad_b = a.t() @ gathered
    if need_bias and ctx.has_bias:
        grad_bias = gathered.sum(0)
    return grad_a, grad_b, grad_bias, None


gemm_rs_op.register_autograd(_gemm_rs_backward, setup_context=_gemm_rs_setup)


# ---- fp8 (inference) ---------------------------------------------------------------------------


def _fp8(what, a, b_t, a_scale, b_scale, out_dtype, block_scaled):
    if a.dtype != torch.float8_e4m3fn or b_t.dtype != torch.float8_e4m3fn:
        raise TypeError(f"weft.torch: {what}: A and Bᵀ must be torch.float8_e4m3fn")
    if out_dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"weft.torch: {what}: the output is bf16 or f16")
    scales = [None if s is None else dense(s.float(), "scale") for s in (a_scale, b_scale)]
    desc = TpFp8(DTYPES[str(out_dtype).replace("torch.", "")], ptr(scales[0]), ptr(scales[1]),
                 1 if block_scaled else 0, None)
    return dense(a, "A"), dense(b_t, "Bᵀ"), scales, desc


@torch.library.custom_op("weft::ag_gemm_fp8", mutates_args=())
def ag_gemm_fp8_op(a: Tensor, b_t: Tensor, a_scale: Optional[Tensor], b_scale: Optional[Tensor],
                   bias: Optional[Tensor], out_dtype: torch.dtype, block_scaled: bool,
                   comm: int) -> Tensor:
    e = entry(comm)
    a, b_t, _scales, desc = _fp8("ag_gemm_fp8", a, b_t, a_scale, b_scale, out_dtype, block_scaled)
    m, k, nl = a.shape[0] * e.size, a.shape[1], b_t.shape[0]
    c = _empty((m, nl), a, out_dtype)
    bias = None if bias is None else dense(bias, "bias")
    check(lib.weftAllGatherGemmFp8(a.data_ptr(), b_t.data_ptr(), c.data_ptr(), None, ptr(bias), m,
                                   nl * e.size, k, DTYPES["float8_e4m3"], ctypes.byref(desc),
                                   None, 0, e.raw(), stream_of(a)))
    return c


@ag_gemm_fp8_op.register_fake
def _(a, b_t, a_scale, b_scale, bias, out_dtype, block_scaled, comm):
    return _empty((a.shape[0] * entry(comm).size, b_t.shape[0]), a, out_dtype)


@torch.library.custom_op("weft::gemm_rs_fp8", mutates_args=())
def gemm_rs_fp8_op(a: Tensor, b_t: Tensor, a_scale: Optional[Tensor], b_scale: Optional[Tensor],
                   bias: Optional[Tensor], out_dtype: torch.dtype, block_scaled: bool,
                   comm: int) -> Tensor:
    e = entry(comm)
    a, b_t, _scales, desc = _fp8("gemm_rs_fp8", a, b_t, a_scale, b_scale, out_dtype, block_scaled)
    m, kl, n = a.shape[0], a.shape[1], b_t.shape[0]
    c = _empty((m // e.size, n), a, out_dtype)
    bias = None if bias is None else dense(bias, "bias")
    check(lib.weftGemmReduceScatterFp8(a.data_ptr(), b_t.data_ptr(), c.data_ptr(), ptr(bias), m,
                                       n, kl * e.size, DTYPES["float8_e4m3"], ctypes.byref(desc),
                                       None, 0, e.raw(), stream_of(a)))
    return c


@gemm_rs_fp8_op.register_fake
def _(a, b_t, a_scale, b_scale, bias, out_dtype, block_scaled, comm):
    return _empty((a.shape[0] // entry(comm).size, b_t.shape[0]), a, out_dtype)


# ---- ring attention ----------------------------------------------------------------------------


def _attention(q, k, v, out, lse, cu_seqlens, max_seqlen, causal, softmax_scale):
    if q.dim() != 3 or k.dim() != 3 or v.shape != k.shape:
        raise ValueError("weft.torch: ring_attention: q [tokens, heads, head_dim], k and v "
                         "[tokens, kv_heads, head_dim]")
    if cu_seqlens.dtype != torch.int32 or not cu_seqlens.is_cuda:
        raise TypeError("weft.torch: ring_attention: cu_seqlens is int32 on the GPU")
    return Attention(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(),
                     cu_seqlens.data_ptr(), cu_seqlens.numel() - 1, q.shape[0], max_seqlen,
                     q.shape[1], k.shape[1], q.shape[2], type_code(q, "ring_attention"),
                     1 if causal else 0, softmax_scale)


@torch.library.custom_op("weft::ring_attention", mutates_args=())
def ring_attention_op(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, max_seqlen: int,
                      comm: int, causal: bool, softmax_scale: float) -> Tuple[Tensor, Tensor]:
    e = entry(comm)
    q, k, v, cu = (dense(t, n) for t, n in ((q, "q"), (k, "k"), (v, "v"), (cu_seqlens, "cu")))
    out = _empty(q.shape, q)
    lse = _empty((q.shape[1], q.shape[0]), q, torch.float32)
    desc = _attention(q, k, v, out, lse, cu, max_seqlen, causal, softmax_scale)
    check(lib.weftRingAttention(ctypes.byref(desc), None, 0, e.raw(), stream_of(q)))
    return out, lse


@ring_attention_op.register_fake
def _(q, k, v, cu_seqlens, max_seqlen, comm, causal, softmax_scale):
    return _empty(q.shape, q), _empty((q.shape[1], q.shape[0]), q, torch.float32)


@torch.library.custom_op("weft::ring_attention_backward", mutates_args=())
def ring_attention_backward_op(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor,
                               lse: Tensor, cu_seqlens: Tensor, max_seqlen: int, comm: int,
                               causal: bool, softmax_scale: float) -> Tuple[Tensor, Tensor, Tensor]:
    e = entry(comm)
    tensors = [dense(t, "ring_attention_backward") for t in (grad_out, q, k, v, out, lse,
                                                              cu_seqlens)]
    grad_out, q, k, v, out, lse, cu = tensors
    if grad_out.dtype != q.dtype:
        grad_out = grad_out.to(q.dtype)
    dq, dk, dv = _empty(q.shape, q), _empty(k.shape, k), _empty(v.shape, v)
    desc = _attention(q, k, v, out, lse, cu, max_seqlen, causal, softmax_scale)
    grads = AttentionGrads(grad_out.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr())
    check(lib.weftRingAttentionBackward(ctypes.byref(desc), ctypes.byref(grads), None, 0, e.raw(),
                                        stream_of(q)))
    return dq, dk, dv


@ring_attention_backward_op.register_fake
def _(grad_out, q, k, v, out, lse, cu_seqlens, max_seqlen, comm, causal, softmax_scale):
    return _empty(q.shape, q), _empty(k.shape, k), _empty(v.shape, v)


def _ring_setup(ctx, inputs, output):
    q, k, v, cu, ctx.max_seqlen, ctx.comm, ctx.causal, ctx.scale = inputs
    ctx.save_for_backward(q, k, v, output[0], output[1], cu)


def _ring_backward(ctx, grad_out, _grad_lse):
    q, k, v, out, lse, cu = ctx.saved_tensors
    dq, dk, dv = ring_attention_backward_op(grad_out.contiguous(), q, k, v, out, lse, cu,
                                            ctx.max_seqlen, ctx.comm, ctx.causal, ctx.scale)
    return dq, dk, dv, None, None, None, None, None


ring_attention_op.register_autograd(_ring_backward, setup_context=_ring_setup)


def zigzag_local(cu_seqlens, nranks, rank):
    """This rank's share of packed sequences (weftZigzagLocal): its offsets (sequences + 1) and
    each local token's position in its sequence, as CPU int32 tensors, and the longest local
    sequence. Of a sequence of L tokens cut into 2·nranks chunks, rank r holds chunks r and
    2·nranks − 1 − r; L must be a multiple of 2·nranks."""
    cu = [int(c) for c in (cu_seqlens.tolist() if isinstance(cu_seqlens, Tensor) else cu_seqlens)]
    sequences = len(cu) - 1
    if sequences < 1:
        raise ValueError("weft.torch: zigzag_local: cu_seqlens needs at least two offsets")
    local = torch.zeros(sequences + 1, dtype=torch.int32)
    positions = torch.zeros(max(cu[-1] // nranks, 1), dtype=torch.int32)
    full = (ctypes.c_int32 * len(cu))(*cu)
    i32 = ctypes.POINTER(ctypes.c_int32)
    check(lib.weftZigzagLocal(full, sequences, nranks, rank,
                              ctypes.cast(local.data_ptr(), i32),
                              ctypes.cast(positions.data_ptr(), i32)))
    lengths = local[1:] - local[:-1]
    return local, positions[: int(local[-1])], int(lengths.max())


def zigzag_index(cu_seqlens, nranks, rank):
    """The whole packing's token indices that rank holds, in its local order (int64, CPU):
    x_local = x_full[index]."""
    cu = torch.as_tensor(cu_seqlens, dtype=torch.int64).cpu()
    local, positions, _ = zigzag_local(cu, nranks, rank)
    seq = torch.repeat_interleave(torch.arange(len(cu) - 1), (local[1:] - local[:-1]).long())
    return cu[seq] + positions.long()
