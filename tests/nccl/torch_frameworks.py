"""PyTorch's training frameworks on weft, for tests/nccl/torch_check.py: FSDP2 (fully_shard,
three variants), DTensor tensor and sequence parallelism, DDP with gradients as bucket views and
with the bf16 compression hook, an all-reduce captured in a CUDA graph and replayed among eager
calls on another stream, and collectives interleaved on two user streams (blocking and
async_op=True).

Each check is a function (rank, world, dev) that calls fail() on a mismatch and prints one line
on rank 0. Its reference is computed without collectives, by one process on the whole batch on
the same GPU, so it does not go through weft. Seeds are fixed: every rank builds the same models
and data and issues the same collectives in the same order.

WEFT_TORCH_CHECKS (comma-separated names, default all) selects the checks that run: a check's
name selects it alone, any other name the checks it prefixes ("fsdp2": every fsdp2_* check).

The small helpers fail/close/data live here so torch_check.py can import them (no cycle).
"""
import copy
import gc
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn


def fail(msg):
    print(f"rank {dist.get_rank() if dist.is_initialized() else '?'}: FAIL {msg}", flush=True)
    sys.exit(1)


def close(got, want, what, tol=1e-5):
    got = got.detach().to("cpu", torch.float64)
    want = want.to(torch.float64)
    if got.shape != want.shape or not torch.allclose(got, want, rtol=tol, atol=tol):
        err = (got - want).abs().max().item() if got.shape == want.shape else "shape"
        fail(f"{what}: wrong (max error {err})")


def data(rank, n, seed):
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    return torch.randn(n, generator=g, dtype=torch.float64)


# --- helpers of the checks below --------------------------------------------------------------

def say(rank, line):
    if rank == 0:
        print(line, flush=True)


def max_rel(got, want):
    """Largest elementwise error over the largest magnitude of want (on the device, in fp64)."""
    got = got.detach().to(torch.float64)
    want = want.detach().to(got.device, torch.float64)
    if got.shape != want.shape:
        return float("inf")
    return ((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()


def norm_rel(got, want, scale=None):
    """||got - want|| over ||scale|| (default ||want||), in fp64: a few outlying elements (a ReLU
    whose input sits within rounding of zero) move it little, a wrong reduction a lot."""
    got = got.detach().to(torch.float64)
    want = want.detach().to(got.device, torch.float64)
    if got.shape != want.shape:
        return float("inf")
    scale = want if scale is None else scale.detach().to(got.device, torch.float64)
    return ((got - want).norm() / scale.norm().clamp_min(1e-30)).item()


def ints(rank, n, salt, dev):
    """Small integers in [-8, 8] as fp32, different per rank and salt: sums of up to 4 of them
    are exact, so the results of collectives on them can be compared for equality."""
    i = torch.arange(n, device=dev, dtype=torch.int64)
    return ((i * 7 + rank * 13 + salt * 5) % 17 - 8).to(torch.float32)


def ints_sum(world, n, salt, dev):
    return sum(ints(r, n, salt, dev) for r in range(world))


def exact(got, want, what):
    if got.shape != want.shape or not torch.equal(got, want):
        err = (got - want).abs().max().item() if got.shape == want.shape else "shape"
        fail(f"{what}: wrong (max error {err}, {got.numel()} elements)")


_MESH = {}


def mesh(world):
    """One 1-D CUDA mesh over every rank, made once and shared by FSDP2 and tensor parallelism."""
    from torch.distributed.device_mesh import init_device_mesh
    if world not in _MESH:
        _MESH[world] = init_device_mesh("cuda", (world,))
    return _MESH[world]


def grad_of(p):
    """A parameter's whole gradient: DTensor gradients gathered (a collective on every rank)."""
    from torch.distributed.tensor import DTensor
    return p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad


# --- 1. FSDP2 ---------------------------------------------------------------------------------

FSDP_STEPS = 20
FSDP_PER = 8     # rows per rank; the global batch is world * FSDP_PER
FSDP_LR = 1e-3


def fsdp_model():
    return nn.Sequential(*[nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 256))
                           for _ in range(4)])


def fsdp_expected(model, world, x, y, bf16):
    """The gradients FSDP should hand the optimizer this step: every rank's rows run, here,
    through a copy holding the model's current parameters (gathered), in the compute dtype FSDP
    uses, and the ranks' gradients averaged in fp64. Beside the reference below, this one does
    not drift: it starts from the same parameters at every step, so only the reduction differs."""
    probe = fsdp_model().to(x.device)
    with torch.no_grad():
        for q, p in zip(probe.parameters(), model.parameters()):
            q.copy_(p.full_tensor())
    if bf16:
        probe = probe.to(torch.bfloat16)
    total = [torch.zeros(q.shape, device=x.device, dtype=torch.float64) for q in probe.parameters()]
    for r in range(world):
        rows = slice(r * FSDP_PER, (r + 1) * FSDP_PER)
        probe.zero_grad(set_to_none=True)
        inp = x[rows].to(torch.bfloat16) if bf16 else x[rows]
        ((probe(inp).float() - y[rows]) ** 2).mean().backward()
        for t, q in zip(total, probe.parameters()):
            t += q.grad.to(torch.float64)
    del probe
    return [t / world for t in total]


def fsdp_run(rank, world, dev, label, reshard, bf16):
    """FSDP2 training. Every step's gradients (gathered) against fsdp_expected's, and the ranks'
    mean loss against one process training a copy on the whole batch (the issue's criterion)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    torch.manual_seed(11)
    model = fsdp_model().to(dev)
    ref = copy.deepcopy(model)  # before sharding: the same initial weights
    start = [q.detach().clone() for q in ref.parameters()]
    # Mixed precision: the reference keeps fp32 master weights (ref, its AdamW) and runs forward
    # and backward on a bf16 copy refreshed from them each step, its grads cast to fp32, as
    # FSDP does with param_dtype=bf16, reduce_dtype=fp32.
    ref16 = copy.deepcopy(ref).to(torch.bfloat16) if bf16 else None
    kwargs = {"mesh": mesh(world), "reshard_after_forward": reshard}
    if bf16:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                   reduce_dtype=torch.float32)
    for block in model:
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    opt = torch.optim.AdamW(model.parameters(), lr=FSDP_LR, foreach=True)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=FSDP_LR, foreach=True)
    # Tolerances. Gradients: the same per-rank products summed by weft in fp32 where
    # fsdp_expected sums them in fp64 (~1e-7 relative); in bf16 FSDP's per-rank gradients may
    # come from other kernels than the copy's and round differently (2^-9 per element). Loss:
    # the reference sums the whole batch's products in another order (~1e-6 relative), which
    # AdamW turns into steps of the other sign for elements whose gradient is within rounding of
    # zero; bf16 rounds each rank's 8 rows where the reference rounds once over all rows.
    tol_loss, tol_grad = (2e-2, 1e-2) if bf16 else (1e-3, 1e-5)
    rows = slice(rank * FSDP_PER, (rank + 1) * FSDP_PER)
    worst_loss = worst_grad = worst_param = 0.0
    for step in range(FSDP_STEPS):
        g = torch.Generator().manual_seed(500 + step)
        x = torch.randn(world * FSDP_PER, 256, generator=g).to(dev)
        y = torch.randn(world * FSDP_PER, 256, generator=g).to(dev)
        opt.zero_grad()
        loss = ((model(x[rows]).float() - y[rows]) ** 2).mean()
        loss.backward()
        if bf16:
            with torch.no_grad():
                for q16, q in zip(ref16.parameters(), ref.parameters()):
                    q16.copy_(q)
            ref16.zero_grad(set_to_none=True)
            ref_loss = ((ref16(x.to(torch.bfloat16)).float() - y) ** 2).mean()
            ref_loss.backward()
            for q, q16 in zip(ref.parameters(), ref16.parameters()):
                q.grad = q16.grad.float()
        else:
            ref_opt.zero_grad()
            ref_loss = ((ref(x) - y) ** 2).mean()
            ref_loss.backward()
        # Every step's gradients (AdamW would not see one scaled by a constant, sum for mean,
        # and a few wrong elements barely move the loss).
        expected = fsdp_expected(model, world, x, y, bf16)
        for (name, p), want in zip(model.named_parameters(), expected):
            err = norm_rel(grad_of(p), want)
            worst_grad = max(worst_grad, err)
            if not err <= tol_grad:
                fail(f"fsdp2 {label}: step {step} gradient of {name} off by {err:.3e} in "
                     f"norm (tolerance {tol_grad})")
        del expected
        opt.step()
        ref_opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean, op=dist.ReduceOp.AVG)
        want = ref_loss.item()
        err = abs(mean.item() - want) / abs(want)
        worst_loss = max(worst_loss, err)
        if not err <= tol_loss:
            fail(f"fsdp2 {label}: step {step} loss {mean.item():.7g}, reference {want:.7g} "
                 f"(relative error {err:.3e}, tolerance {tol_loss}; gradients so far within "
                 f"{worst_grad:.1e})")
    with torch.no_grad():  # how far apart AdamW's sign steps took the two: said, not checked
        for (name, p), q, q0 in zip(model.named_parameters(), ref.parameters(), start):
            worst_param = max(worst_param, norm_rel(p.full_tensor(), q, scale=q - q0))
    say(rank, f"ok  fsdp2 {label}: {FSDP_STEPS} AdamW steps, worst relative error: gradients "
              f"{worst_grad:.1e} (tol {tol_grad:g}), loss {worst_loss:.1e} against the whole "
              f"batch (tol {tol_loss:g}); parameters {worst_param:.1e} of their movement apart")
    del model, ref, ref16, opt, ref_opt, start


def fsdp2_reshard(rank, world, dev):
    fsdp_run(rank, world, dev, "reshard_after_forward=True", True, False)


def fsdp2_keep(rank, world, dev):
    fsdp_run(rank, world, dev, "reshard_after_forward=False", False, False)


def fsdp2_bf16(rank, world, dev):
    fsdp_run(rank, world, dev, "mixed precision bf16/fp32", True, True)


# --- 2. DTensor tensor parallelism ------------------------------------------------------------

TP_TOL = 1e-5  # fp32: the rowwise layer's partial sums are added across ranks, in another order


def tp_compare(label, out, ref_out, model, ref):
    worst = max_rel(out, ref_out)
    if not worst <= TP_TOL:
        fail(f"tp {label}: output off by {worst:.3e} of its largest value")
    for (name, p), (ref_name, q) in zip(model.named_parameters(), ref.named_parameters()):
        if name != ref_name:
            fail(f"tp {label}: parameter {name} against the reference's {ref_name}")
        err = max_rel(grad_of(p), q.grad)
        worst = max(worst, err)
        if not err <= TP_TOL:
            fail(f"tp {label}: gradient of {name} off by {err:.3e} of its largest value")
    return worst


def tp_mlp(rank, world, dev):
    """Colwise then rowwise Linear, the same input on every rank: output and gathered gradients
    against the unsharded module."""
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    torch.manual_seed(21)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64)).to(dev)
    ref = copy.deepcopy(model)
    parallelize_module(model, mesh(world), {"0": ColwiseParallel(), "2": RowwiseParallel()})
    g = torch.Generator().manual_seed(22)
    x = torch.randn(8, 64, generator=g).to(dev)
    w = torch.randn(8, 64, generator=g).to(dev)  # the loss weights every output differently
    out = model(x)
    ref_out = ref(x)
    (out * w).sum().backward()
    (ref_out * w).sum().backward()
    worst = tp_compare("colwise/rowwise MLP", out, ref_out, model, ref)
    say(rank, f"ok  tp colwise/rowwise MLP: output and gradients, worst relative error "
              f"{worst:.1e} (tol {TP_TOL:g})")
    del model, ref


def tp_sequence(rank, world, dev):
    """Sequence parallelism: LayerNorm on the rank's slice of the sequence, the MLP's input
    gathered, its output reduce-scattered back to sequence slices; each rank's slice of the
    output and the gathered gradients against the unsharded module on the whole sequence."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)
    torch.manual_seed(23)
    model = nn.Sequential(nn.LayerNorm(64), nn.Linear(64, 256), nn.ReLU(),
                          nn.Linear(256, 64)).to(dev)
    with torch.no_grad():  # not the default ones/zeros; identical on every rank
        model[0].weight.add_(0.1 * torch.randn(64).to(dev))
        model[0].bias.add_(0.1 * torch.randn(64).to(dev))
    ref = copy.deepcopy(model)
    parallelize_module(model, mesh(world), {
        "0": SequenceParallel(),
        "1": ColwiseParallel(input_layouts=Shard(1)),
        "3": RowwiseParallel(output_layouts=Shard(1)),
    })
    batch, seq = 4, 8 * world
    part = slice(rank * (seq // world), (rank + 1) * (seq // world))
    g = torch.Generator().manual_seed(24)
    x = torch.randn(batch, seq, 64, generator=g).to(dev)
    w = torch.randn(batch, seq, 64, generator=g).to(dev)
    # A plain tensor passed to SequenceParallel is taken as this rank's shard of dim 1.
    out = model(x[:, part].contiguous())
    ref_out = ref(x)
    (out * w[:, part]).sum().backward()  # the ranks' losses add up to the reference's
    (ref_out * w).sum().backward()
    worst = tp_compare("sequence parallel", out, ref_out[:, part], model, ref)
    say(rank, f"ok  tp sequence parallel (LayerNorm, seq {seq}): output slice and gradients, "
              f"worst relative error {worst:.1e} (tol {TP_TOL:g})")
    del model, ref


# --- 3. DDP -----------------------------------------------------------------------------------

DDP_PER = 16
DDP_STEPS = 3


def ddp_model():
    # Tanh, not ReLU: gradients continuous in the activations, so the elementwise comparisons
    # cannot trip on an activation within rounding of a kink.
    return nn.Sequential(nn.Linear(128, 512), nn.Tanh(), nn.Linear(512, 512), nn.Tanh(),
                         nn.Linear(512, 16))


def ddp_batch(world, step, dtype, dev):
    g = torch.Generator().manual_seed(600 + step)
    x = torch.randn(world * DDP_PER, 128, generator=g, dtype=torch.float64)
    y = torch.randn(world * DDP_PER, 16, generator=g, dtype=torch.float64)
    return x.to(dev, dtype), y.to(dev, dtype)


def ddp_bucket_view(rank, world, dev):
    """gradient_as_bucket_view=True with 1 MB buckets (the model's 2.6 MB of fp64 fill two or
    three): gradients equal to one process's over the whole batch, and views of the buckets (the
    six gradients share fewer storages)."""
    torch.manual_seed(31)
    model = ddp_model().double().to(dev)
    ref = copy.deepcopy(model)
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[dev.index],
                                              gradient_as_bucket_view=True, bucket_cap_mb=1)
    rows = slice(rank * DDP_PER, (rank + 1) * DDP_PER)
    worst = 0.0
    for step in range(DDP_STEPS):
        x, y = ddp_batch(world, step, torch.float64, dev)
        ddp.zero_grad(set_to_none=False)
        ((ddp(x[rows]) - y[rows]) ** 2).mean().backward()
        ref.zero_grad()
        ((ref(x) - y) ** 2).mean().backward()
        params = list(ddp.module.named_parameters())
        storages = {p.grad.untyped_storage().data_ptr() for _, p in params}
        if len(storages) >= len(params):
            fail(f"DDP bucket view: {len(params)} gradients in {len(storages)} storages, "
                 "not views of the buckets")
        for (name, p), q in zip(params, ref.parameters()):
            err = max_rel(p.grad, q.grad)
            worst = max(worst, err)
            if not err <= 1e-9:
                fail(f"DDP bucket view: step {step} gradient of {name} off by {err:.3e}")
        with torch.no_grad():
            for (_, p), q in zip(params, ref.parameters()):
                p -= 0.05 * p.grad
                q -= 0.05 * q.grad
    say(rank, f"ok  ddp gradient_as_bucket_view: {DDP_STEPS} steps, fp64 gradients within "
              f"{worst:.1e} of the reference (tol 1e-9)")
    del ddp, model, ref


def ddp_bf16_hook(rank, world, dev):
    """The bf16 compression hook on an fp32 model: gradients within bf16 rounding of one
    process's over the whole batch. The hook rounds each rank's bucket to bf16 (2^-9 relative),
    divides by the world size (exact for 2 and 4) and sums in bf16: up to ~3 roundings of values
    no larger than about twice the gradient's largest element, ~1.5% of it at worst."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    tol = 2e-2
    torch.manual_seed(32)
    model = ddp_model().to(dev)
    ref = copy.deepcopy(model)
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[dev.index])
    ddp.register_comm_hook(state=None, hook=default_hooks.bf16_compress_hook)
    rows = slice(rank * DDP_PER, (rank + 1) * DDP_PER)
    worst = 0.0
    for step in range(DDP_STEPS):
        x, y = ddp_batch(world, step, torch.float32, dev)
        with torch.no_grad():  # the same weights each step: only this step's rounding counts
            for p, q in zip(ddp.module.parameters(), ref.parameters()):
                q.copy_(p)
        ddp.zero_grad()
        ((ddp(x[rows]) - y[rows]) ** 2).mean().backward()
        ref.zero_grad()
        ((ref(x) - y) ** 2).mean().backward()
        for (name, p), q in zip(ddp.module.named_parameters(), ref.parameters()):
            err = max_rel(p.grad, q.grad)
            worst = max(worst, err)
            if not err <= tol:
                fail(f"DDP bf16 hook: step {step} gradient of {name} off by {err:.3e} of its "
                     f"largest element (tolerance {tol})")
        with torch.no_grad():
            for p in ddp.module.parameters():
                p -= 0.05 * p.grad
    say(rank, f"ok  ddp bf16_compress_hook: {DDP_STEPS} steps, gradients within {worst:.1e} "
              f"of their largest element (tol {tol:g})")
    del ddp, model, ref


# --- 4. CUDA graph ----------------------------------------------------------------------------

def cuda_graph(rank, world, dev):
    """An all-reduce captured in a CUDA graph, replayed on the default stream while an eager
    all-reduce and all-gather run on another stream that does not wait for the replay (replay
    first on even rounds, the eager calls first on odd ones)."""
    n, m, rounds = 65536, 12289, 6
    cur = torch.cuda.current_stream()
    static = torch.zeros(n, device=dev)
    side = torch.cuda.Stream()
    side.wait_stream(cur)
    with torch.cuda.stream(side):  # warm-up, eager, on a side stream
        for k in range(3):
            static.copy_(ints(rank, n, 100 + k, dev))
            dist.all_reduce(static)
    cur.wait_stream(side)
    torch.cuda.synchronize()
    exact(static, ints_sum(world, n, 102, dev), "CUDA graph: warm-up all_reduce")
    static.copy_(ints(rank, n, 200, dev))
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dist.all_reduce(static)
    torch.cuda.synchronize()
    exact(static, ints(rank, n, 200, dev), "CUDA graph: capture changed the buffer")
    other = torch.cuda.Stream()
    for k in range(rounds):
        salt = 300 + 3 * k
        reduced = ints(rank, m, salt + 1, dev)
        piece = ints(rank, m, salt + 2, dev)
        gathered = torch.empty(world * m, device=dev)
        other.wait_stream(cur)  # the eager inputs are ready; nothing orders it with the replay
        static.copy_(ints(rank, n, salt, dev))
        if k % 2 == 0:
            graph.replay()
        with torch.cuda.stream(other):
            dist.all_reduce(reduced)
            dist.all_gather_into_tensor(gathered, piece)
        if k % 2 == 1:
            graph.replay()
        torch.cuda.synchronize()
        exact(static, ints_sum(world, n, salt, dev), f"CUDA graph: replay {k} all_reduce")
        exact(reduced, ints_sum(world, m, salt + 1, dev), f"CUDA graph: eager all_reduce {k}")
        exact(gathered, torch.cat([ints(r, m, salt + 2, dev) for r in range(world)]),
              f"CUDA graph: eager all_gather {k}")
    del graph
    torch.cuda.synchronize()
    say(rank, f"ok  cuda graph: captured all_reduce replayed {rounds} times among eager "
              f"all_reduce/all_gather on another stream, exact")


# --- 5. two user streams ----------------------------------------------------------------------

def stream_sizes():
    g = torch.Generator().manual_seed(71)
    drawn = torch.randint(1, 300001, (13,), generator=g).tolist()
    return [1, 300000, 3, 4099] + [int(v) for v in drawn]  # 17 rounds of 3 calls


def streams_run(rank, world, dev, async_op):
    """Rounds of all_reduce, all_gather_into_tensor and reduce_scatter_tensor, the first and last
    on one stream and the middle on the other (the streams swap each round), inputs made on the
    default stream that both streams then wait for; checked after a device synchronize."""
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    cur = torch.cuda.current_stream()
    base = 2000 if async_op else 1000
    results, works = [], []
    sizes = stream_sizes()
    for k, n in enumerate(sizes):
        salt = base + 3 * k
        a = ints(rank, n, salt, dev)
        b = ints(rank, n, salt + 1, dev)
        c = ints(rank, world * n, salt + 2, dev)
        gathered = torch.empty(world * n, device=dev)
        piece = torch.empty(n, device=dev)
        s1.wait_stream(cur)
        s2.wait_stream(cur)
        first, second = (s1, s2) if k % 2 == 0 else (s2, s1)
        with torch.cuda.stream(first):
            works.append(dist.all_reduce(a, async_op=async_op))
        with torch.cuda.stream(second):
            works.append(dist.all_gather_into_tensor(gathered, b, async_op=async_op))
        with torch.cuda.stream(first):
            works.append(dist.reduce_scatter_tensor(piece, c, async_op=async_op))
        results.append((n, salt, a, gathered, piece, b, c))  # inputs too: alive until checked
    if async_op:
        for w in works:
            w.wait()
    torch.cuda.synchronize()
    mode = "async_op=True" if async_op else "blocking"
    for k, (n, salt, a, gathered, piece, _, _) in enumerate(results):
        exact(a, ints_sum(world, n, salt, dev), f"two streams {mode}: round {k} all_reduce of {n}")
        exact(gathered, torch.cat([ints(r, n, salt + 1, dev) for r in range(world)]),
              f"two streams {mode}: round {k} all_gather of {n}")
        exact(piece, ints_sum(world, world * n, salt + 2, dev)[rank * n:(rank + 1) * n],
              f"two streams {mode}: round {k} reduce_scatter of {n}")
    say(rank, f"ok  two streams {mode}: {3 * len(sizes)} interleaved collectives of "
              f"{min(sizes)}..{max(sizes)} elements, exact")


def two_streams(rank, world, dev):
    streams_run(rank, world, dev, async_op=False)


def two_streams_async(rank, world, dev):
    streams_run(rank, world, dev, async_op=True)


# --- running them -----------------------------------------------------------------------------

CHECKS = [
    ("fsdp2_reshard", fsdp2_reshard),
    ("fsdp2_keep", fsdp2_keep),
    ("fsdp2_bf16", fsdp2_bf16),
    ("tp_mlp", tp_mlp),
    ("tp_sequence", tp_sequence),
    ("ddp_bucket_view", ddp_bucket_view),
    ("ddp_bf16_hook", ddp_bf16_hook),
    ("cuda_graph", cuda_graph),
    ("two_streams", two_streams),
    ("two_streams_async", two_streams_async),
]


def selected(names):
    """The names WEFT_TORCH_CHECKS picks out of names (all when it is unset or empty)."""
    asked = [a.strip() for a in os.environ.get("WEFT_TORCH_CHECKS", "").split(",") if a.strip()]
    if not asked:
        return list(names)
    chosen = set()
    for a in asked:
        hits = [a] if a in names else [n for n in names if n.startswith(a + "_")]
        if not hits:
            fail(f"WEFT_TORCH_CHECKS: no check named {a!r} (there are: {', '.join(names)})")
        chosen.update(hits)
    return [n for n in names if n in chosen]


def settle():
    """Between checks: drop what the last one made and line the ranks up."""
    gc.collect()
    torch.cuda.synchronize()
    dist.barrier()
