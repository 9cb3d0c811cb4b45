"""test_torch.py's checks of the fused ops: the tensor-parallel GEMMs, ring attention, MoE
dispatch and combine, and the compressed all-reduce, each against a float64 reference every rank
computes from every rank's regenerated data (forward, and the gradients of the loss
Σ_r ⟨V_r, output_r⟩), plus a central-difference check of the gradients in float32."""

import torch

import weft.torch as wt

from torch_support import close, directional, gen


def _leaves(ts):
    return [t.detach().clone().requires_grad_() for t in ts]


def _tp(ctx, dtype):
    n, r, h, dev = ctx.n, ctx.rank, ctx.h, ctx.device
    tol = 3e-2 if dtype == torch.bfloat16 else 1e-5

    def rounded(tag, q, shape):
        return gen(tag, q, shape).to(dtype).double()

    # ag_gemm: C_r [m, n/s] = [A_0; …; A_{n-1}] @ B_r + bias_r.
    ml, k, nl = 8, 64, 32
    A = _leaves(rounded("ag/A", q, (ml, k)) for q in range(n))
    B = _leaves(rounded("ag/B", q, (k, nl)) for q in range(n))
    bias = _leaves(rounded("ag/b", q, (nl,)) for q in range(n))
    V = [gen("ag/V", q, (ml * n, nl)) for q in range(n)]
    C = [torch.cat(A) @ B[q] + bias[q] for q in range(n)]
    sum((c * v).sum() for c, v in zip(C, V)).backward()
    a, b, bi = (t.detach().to(dev, dtype).requires_grad_() for t in (A[r], B[r], bias[r]))
    c = wt.ag_gemm(a, b, h, bias=bi)
    close(f"ag_gemm {dtype}", c, C[r], tol)
    c.backward(V[r].to(dev, dtype))
    for what, got, want in (("dA", a.grad, A[r].grad), ("dB", b.grad, B[r].grad),
                            ("dbias", bi.grad, bias[r].grad)):
        close(f"ag_gemm {dtype} {what}", got, want, tol)
    _, gathered = wt.ag_gemm(a.detach(), b.detach(), h, return_gathered=True)
    close(f"ag_gemm {dtype} gathered A", gathered, torch.cat(A), 0)

    # gemm_rs: C_r = rows r of Σ_q A_q @ B_q + bias (one bias, the same on every rank).
    m, kl, nn = 8 * n, 32, 64
    A = _leaves(rounded("rs/A", q, (m, kl)) for q in range(n))
    B = _leaves(rounded("rs/B", q, (kl, nn)) for q in range(n))
    (bias,) = _leaves([rounded("rs/b", 0, (nn,))])
    V = [gen("rs/V", q, (m // n, nn)) for q in range(n)]
    full = sum(A[q] @ B[q] for q in range(n)) + bias
    (full * torch.cat(V)).sum().backward()
    a, b, bi = (t.detach().to(dev, dtype).requires_grad_() for t in (A[r], B[r], bias))
    c = wt.gemm_rs(a, b, h, bias=bi)
    close(f"gemm_rs {dtype}", c, full[r * m // n:(r + 1) * m // n], tol)
    c.backward(V[r].to(dev, dtype))
    for what, got, want in (("dA", a.grad, A[r].grad), ("dB", b.grad, B[r].grad),
                            ("dbias", bi.grad, bias.grad)):
        close(f"gemm_rs {dtype} {what}", got, want, tol)


def check_tp(ctx):
    n, r, h, dev = ctx.n, ctx.rank, ctx.h, ctx.device
    for dtype in (torch.float32, torch.bfloat16):
        _tp(ctx, dtype)
    f32 = dict(dtype=torch.float32, device=dev)
    directional(ctx, "ag_gemm", lambda a, b, bias: wt.ag_gemm(a, b, h, bias=bias),
                [gen("fd/A", r, (8, 32)).to(**f32), gen("fd/B", r, (32, 16)).to(**f32),
                 gen("fd/b", r, (16,)).to(**f32)])
    directional(ctx, "gemm_rs", lambda a, b, bias: wt.gemm_rs(a, b, h, bias=bias),
                [gen("fd/A2", r, (8 * n, 16)).to(**f32), gen("fd/B2", r, (16, 32)).to(**f32),
                 gen("fd/b2", 0, (32,)).to(**f32)], shared=(2,))
    # A tensor-parallel MLP (column- then row-parallel) replayed from a CUDA graph.
    x = torch.zeros(4, 64, **f32)
    w1, w2 = gen("g/w1", r, (64, 32)).to(**f32), gen("g/w2", r, (32, 64)).to(**f32)
    mlp = lambda: wt.gemm_rs(torch.relu(wt.ag_gemm(x, w1, h)), w2, h)  # noqa: E731
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        mlp()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph, capture_error_mode="thread_local"):
        y = mlp()
    W1 = [gen("g/w1", q, (64, 32)) for q in range(n)]
    W2 = [gen("g/w2", q, (32, 64)) for q in range(n)]
    for it in range(2):
        X = [gen(f"g/x{it}", q, (4, 64)).float().double() for q in range(n)]
        x.copy_(X[r])
        graph.replay()
        torch.cuda.synchronize()
        full = sum(torch.relu(torch.cat(X) @ W1[q].float().double()) @ W2[q].float().double()
                   for q in range(n))
        close(f"TP MLP graph replay {it}", y, full[4 * r:4 * r + 4], 1e-5)


def _attention_reference(q, k, v, cu, causal):
    """Packed causal attention in float64 (grouped heads), and lse [heads, tokens]."""
    heads, group = q.shape[1], q.shape[1] // k.shape[1]
    scale = q.shape[2] ** -0.5
    outs, lses = [], []
    for s in range(len(cu) - 1):
        lo, hi = cu[s], cu[s + 1]
        qs = q[lo:hi].transpose(0, 1)
        ks = k[lo:hi].transpose(0, 1).repeat_interleave(group, 0)
        vs = v[lo:hi].transpose(0, 1).repeat_interleave(group, 0)
        scores = qs @ ks.transpose(1, 2) * scale
        if causal:
            mask = torch.ones(hi - lo, hi - lo, dtype=torch.bool).triu(1)
            scores = scores.masked_fill(mask, float("-inf"))
        lses.append(torch.logsumexp(scores, -1))
        outs.append((torch.softmax(scores, -1) @ vs).transpose(0, 1))
    assert lses[0].shape[0] == heads
    return torch.cat(outs), torch.cat(lses, 1)


def check_attention(ctx):
    n, r, h, dev = ctx.n, ctx.rank, ctx.h, ctx.device
    cu = [0, 4 * n, 4 * n + 6 * n]
    tokens, heads, kv, dim = cu[-1], 4, 2, 64
    for causal in (True, False):
        Q, K, Vv = (gen(f"att/{t}", 0, (tokens, hh, dim)).to(torch.bfloat16).double()
                    .requires_grad_() for t, hh in (("q", heads), ("k", kv), ("v", kv)))
        out_ref, lse_ref = _attention_reference(Q, K, Vv, cu, causal)
        dout = gen("att/dout", 0, out_ref.shape).to(torch.bfloat16).double()
        (out_ref * dout).sum().backward()
        index = wt.zigzag_index(cu, n, r)
        local_cu, positions, longest = wt.zigzag_local(cu, n, r)
        assert positions.numel() == index.numel() == tokens // n, (positions, index)
        q, k, v = (t.detach()[index].to(dev, torch.bfloat16).requires_grad_() for t in (Q, K, Vv))
        out, lse = wt.ring_attention(q, k, v, local_cu.to(dev), longest, h, causal=causal)
        what = f"ring_attention causal={causal}"
        close(f"{what} out", out, out_ref.detach()[index], 2e-2)
        close(f"{what} lse", lse, lse_ref.detach()[:, index], 1e-2)
        out.backward(dout[index].to(dev, torch.bfloat16))
        for name, got, ref in (("dq", q.grad, Q.grad), ("dk", k.grad, K.grad),
                               ("dv", v.grad, Vv.grad)):
            close(f"{what} {name}", got, ref[index], 3e-2)


def _routing(q, tokens, experts, topk):
    """Rank q's routing: topk distinct experts per token; token 0 drops its last slot, token 1
    every slot."""
    idx = torch.stack([torch.randperm(experts, generator=torch.Generator().manual_seed(
        1000 * q + t))[:topk] for t in range(tokens)])
    idx[0, -1] = -1
    idx[1, :] = -1
    return idx


def _moe(ctx, device, steps=2):
    n, r, h = ctx.n, ctx.rank, ctx.h
    experts, topk, tokens, hidden = 2 * n, 2, 8, 32
    local = experts // n
    W = gen("moe/W", 0, (experts, hidden, hidden), scale=0.2)
    for step in range(steps):
        X = _leaves(gen(f"moe/x{step}", q, (tokens, hidden)).float().double() for q in range(n))
        P = _leaves(gen(f"moe/p{step}", q, (tokens, topk)).abs().float().double()
                    for q in range(n))
        I = [_routing(q, tokens, experts, topk) for q in range(n)]
        (Wr,) = _leaves([W])
        V = [gen(f"moe/V{step}", q, (tokens, hidden)) for q in range(n)]
        total = 0
        for q in range(n):
            slots = [(I[q][:, j:j + 1] >= 0) * P[q][:, j:j + 1] *
                     torch.einsum("th,thk->tk", X[q], Wr[I[q][:, j].clamp(min=0)])
                     for j in range(topk)]
            out_q = sum(slots)
            total = total + (out_q * V[q]).sum()
            if q == r:
                out_ref = out_q
        total.backward()
        x = X[r].detach().float().to(device).requires_grad_()
        w = P[r].detach().float().to(device).requires_grad_()
        wl = W[r * local:(r + 1) * local].float().to(device).requires_grad_()
        d = wt.moe_dispatch(x, I[r].to(device), w, experts, n * tokens * topk, h)
        counts = d.expert_counts.tolist()
        parts, at = [], 0
        for e, c in enumerate(counts):
            parts.append(d.recv_x[at:at + c] @ wl[e])
            at += c
        parts.append(d.recv_x[at:] * 0)
        out = wt.moe_combine(d, torch.cat(parts))
        what = f"moe on {device}, step {step}"
        close(f"{what} out", out, out_ref, 1e-5)
        out.backward(V[r].float().to(device))
        close(f"{what} dx", x.grad, X[r].grad, 1e-5)
        close(f"{what} dweights", w.grad, P[r].grad, 1e-5)
        close(f"{what} dexperts", wl.grad, Wr.grad[r * local:(r + 1) * local], 1e-5)
    # dispatch's gradient where no combine follows: local expert e's rows weighted by c_e.
    x = X[r].detach().float().to(device).requires_grad_()
    d = wt.moe_dispatch(x, I[r].to(device), P[r].detach().float().to(device), experts,
                        n * tokens * topk, h)
    c = gen("moe/c", 0, (experts, hidden)).float()
    rows = torch.repeat_interleave(torch.arange(local), d.expert_counts.cpu().long())
    weight = torch.zeros(d.recv_x.shape)
    weight[:rows.numel()] = c[r * local + rows]
    (d.recv_x * weight.to(device)).sum().backward()
    want = sum((I[r][:, j:j + 1] >= 0) * c[I[r][:, j].clamp(min=0)] for j in range(topk))
    close(f"moe on {device}: dispatch alone, dx", x.grad, want, 1e-6)
    del d  # its dispatch, never combined, is closed with it


def check_moe(ctx):
    _moe(ctx, ctx.device)
    _moe(ctx, "cpu", steps=1)
    n, r, h = ctx.n, ctx.rank, ctx.h
    experts, tokens, hidden = 2 * n, 8, 16
    idx = _routing(r, tokens, experts, 2).to(ctx.device)

    def layer(x, w, wl):
        d = wt.moe_dispatch(x, idx, w, experts, n * tokens * 2, h)
        local = torch.searchsorted(d.expert_counts.long().cumsum(0),
                                   torch.arange(d.recv_x.shape[0], device=x.device), right=True)
        y = torch.einsum("rh,rhk->rk", d.recv_x, wl[local.clamp(max=wl.shape[0] - 1)])
        return wt.moe_combine(d, y)

    f32 = dict(dtype=torch.float32, device=ctx.device)
    directional(ctx, "moe", layer, [gen("fd/mx", r, (tokens, hidden)).to(**f32),
                                    gen("fd/mw", r, (tokens, 2)).abs().to(**f32),
                                    gen("fd/mW", r, (experts // n, hidden, hidden)).to(**f32)])


def check_compressed(ctx):
    """The compressed all-reduce within its documented bound, every rank the same bits."""
    n, r, h, dev = ctx.n, ctx.rank, ctx.h, ctx.device
    count, block = 4096, 32
    for dtype in (torch.bfloat16, torch.float32):
        X = [gen("cmp/x", q, (count,), scale=1 + q).to(dtype).double() for q in range(n)]
        out = wt.all_reduce_compressed(X[r].to(dev, dtype), h, "fp8e4m3:32:always")
        exact = sum(X)

        def per_block(t):
            return t.abs().view(-1, block).max(1).values.repeat_interleave(block)

        # E4M3 (3 mantissa bits): a quantization is off by at most 2⁻⁴ of its block's largest
        # magnitude; the result's own type rounds once more.
        bound = 2 ** -4 * (sum(per_block(x) for x in X) + per_block(exact)) * 1.01
        bound += exact.abs() * (2 ** -8 if dtype == torch.bfloat16 else 2 ** -23) + 1e-30
        err = (out.double().cpu() - exact).abs()
        if (err > bound).any():
            at = (err - bound).argmax().item()
            raise AssertionError(f"compressed all_reduce {dtype}: error {err[at]:.4g} over the "
                                 f"bound {bound[at]:.4g} at {at}")
        bits = out.view(torch.uint8)
        every = wt.all_gather(bits.unsqueeze(0).contiguous(), h)
        assert (every == every[0]).all(), f"compressed all_reduce {dtype}: ranks differ"
    # Autograd runs the gradient's all-reduce uncompressed.
    x = gen("cmp/g", r, (256,)).float().to(dev).requires_grad_()
    wt.all_reduce_compressed(x, h, "fp8e4m3:32:always").backward(torch.ones_like(x))
    close("compressed all_reduce gradient", x.grad, torch.full((256,), float(n)), 0)


CHECKS = [("tp", check_tp), ("attention", check_attention), ("moe", check_moe),
          ("compressed", check_compressed)]
