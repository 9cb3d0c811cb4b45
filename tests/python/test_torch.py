"""weft.torch on a GPU machine: the torch.distributed backend (dist.init_process_group("weft"),
with DDP), communicators from a process group, every collective op against float64 references
on fresh random data with poisoned outputs, the ops inside a CUDA graph and under
torch.compile(fullgraph=True), autograd by torch.autograd.gradcheck in float64, and the fused ops
(torch_fused_checks.py). Ranks are processes sharing the GPUs (rank r on GPU r mod the count).

  torchrun --nproc-per-node 2 tests/python/test_torch.py
  python3 tests/python/test_torch.py --nprocs 4        # spawns the ranks itself

With PYTHONPATH=python and libweft found (WEFT_LIBRARY, or build/lib).
WEFT_TORCH_OPS_CHECKS=a,b runs only those checks. Exit 77 (skipped) without PyTorch or a CUDA
device; 0 when every rank passed.
"""

import os
import socket
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))


def skip(why):
    print(f"test_torch: SKIP: {why}", flush=True)
    sys.exit(77)


# ---- the backend -------------------------------------------------------------------------------


def check_backend(ctx):
    import torch
    import torch.distributed as dist

    from torch_support import close, equal, gen, poison

    n, r, dev = ctx.n, ctx.rank, ctx.device
    assert dist.get_backend() == "weft", dist.get_backend()
    for device, dtype, op, name in ((dev, torch.float32, dist.ReduceOp.SUM, "sum"),
                                    (dev, torch.bfloat16, dist.ReduceOp.MAX, "max"),
                                    (dev, torch.float64, dist.ReduceOp.AVG, "avg"),
                                    ("cpu", torch.float32, dist.ReduceOp.SUM, "sum")):
        xs = [gen("b/ar", q, (37, 3)).to(dtype).double() for q in range(n)]
        t = xs[r].to(device, dtype)
        dist.all_reduce(t, op=op)
        ref = {"sum": sum(xs), "max": torch.stack(xs).max(0).values, "avg": sum(xs) / n}[name]
        close(f"all_reduce {dtype} {name} on {device}", t, ref, 1e-2 if dtype == torch.bfloat16
              else 1e-6)
    xs = [gen("b/ag", q, (5, 4)).float() for q in range(n)]
    poison(4 * 20 * n, dev)
    out = torch.empty(5 * n, 4, device=dev)
    dist.all_gather_into_tensor(out, xs[r].to(dev))
    equal("all_gather_into_tensor", out, torch.cat(xs))
    outs = [torch.full((5, 4), float("nan"), device=dev) for _ in range(n)]
    dist.all_gather(outs, xs[r].to(dev))
    equal("all_gather (list)", torch.cat(outs), torch.cat(xs))
    ys = [gen("b/rs", q, (3 * n, 2)).float() for q in range(n)]
    out = torch.full((3, 2), float("nan"), device=dev)
    dist.reduce_scatter_tensor(out, ys[r].to(dev))
    close("reduce_scatter_tensor", out, sum(y.double() for y in ys)[3 * r:3 * r + 3], 1e-6)
    out = torch.full((3, 2), float("nan"), device=dev)
    dist.reduce_scatter(out, list(ys[r].to(dev).chunk(n)))
    close("reduce_scatter (list)", out, sum(y.double() for y in ys)[3 * r:3 * r + 3], 1e-6)
    # all-to-all: even, then rank r sends (r + q) % n + 1 rows to q.
    zs = [gen("b/a2a", q, (2 * n, 3)).float() for q in range(n)]
    out = torch.full((2 * n, 3), float("nan"), device=dev)
    dist.all_to_all_single(out, zs[r].to(dev))
    equal("all_to_all_single", out, torch.cat([zs[q][2 * r:2 * r + 2] for q in range(n)]))
    sizes = [[(s + q) % n + 1 for q in range(n)] for s in range(n)]
    us = [gen("b/a2av", s, (sum(sizes[s]), 3)).float() for s in range(n)]
    out = torch.full((sum(sizes[q][r] for q in range(n)), 3), float("nan"), device=dev)
    dist.all_to_all_single(out, us[r].to(dev), [sizes[q][r] for q in range(n)], sizes[r])
    want = torch.cat([us[q][sum(sizes[q][:r]):sum(sizes[q][:r + 1])] for q in range(n)])
    equal("all_to_all_single (uneven)", out, want)
    outs = [torch.empty(sizes[q][r], 3, device=dev) for q in range(n)]
    dist.all_to_all(outs, list(us[r].to(dev).split(sizes[r])))
    equal("all_to_all (lists)", torch.cat(outs), want)
    b = gen("b/bc", r, (9,)).float().to(dev)
    dist.broadcast(b, src=n - 1)
    equal("broadcast", b, gen("b/bc", n - 1, (9,)).float())
    t = gen("b/red", r, (6,)).float().to(dev)
    dist.reduce(t, dst=0)
    if r == 0:
        close("reduce", t, sum(gen("b/red", q, (6,)).float().double() for q in range(n)), 1e-6)
    # A ring, even ranks sending first (a lone send on a stream waits for its receive).
    got = torch.full((4,), float("nan"), device=dev)
    mine = gen("b/p2p", r, (4,)).float().to(dev)
    if r % 2 == 0:
        dist.send(mine, (r + 1) % n)
        dist.recv(got, (r - 1) % n)
    else:
        dist.recv(got, (r - 1) % n)
        dist.send(mine, (r + 1) % n)
    equal("send/recv ring", got, gen("b/p2p", (r - 1) % n, (4,)).float())
    work = dist.all_reduce(torch.ones(8, device=dev), async_op=True)
    work.wait()
    dist.barrier()
    g = [torch.empty(3, device=dev) for _ in range(n)] if r == 0 else None
    dist.gather(gen("b/g", r, (3,)).float().to(dev), g, dst=0)
    if r == 0:
        want = torch.stack([gen("b/g", q, (3,)).float() for q in range(n)])
        equal("gather", torch.stack(g), want)
    s = torch.empty(3, device=dev)
    parts = [gen("b/s", q, (3,)).float().to(dev) for q in range(n)] if r == 0 else None
    dist.scatter(s, parts, src=0)
    equal("scatter", s, gen("b/s", r, (3,)).float())


def check_ddp(ctx):
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    from torch_support import close, gen

    n, r, dev = ctx.n, ctx.rank, ctx.device
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 8).to(dev)
    twin = torch.nn.Linear(16, 8).double()
    twin.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    ddp = DDP(model, device_ids=[dev.index])
    ddp(gen("ddp/x", r, (4, 16)).float().to(dev)).pow(2).sum().backward()
    for q in range(n):
        twin(gen("ddp/x", q, (4, 16)).float().double()).pow(2).sum().backward()
    close("DDP weight gradient", model.weight.grad, twin.weight.grad / n, 1e-5)
    close("DDP bias gradient", model.bias.grad, twin.bias.grad / n, 1e-5)


# ---- communicators and collective ops ----------------------------------------------------------


def check_from_process_group(ctx):
    import torch

    import weft.torch as wt

    extra = wt.Comm.from_process_group()  # a second one: the store key is counted
    handle = extra.handle
    x = torch.full((5,), float(ctx.rank + 1), device=ctx.device)
    try:
        assert (extra.rank, extra.size) == (ctx.rank, ctx.n), (extra.rank, extra.size)
        assert handle != ctx.h
        y = wt.all_reduce(x, extra)
        assert (y == ctx.n * (ctx.n + 1) / 2).all(), y
    finally:
        extra.destroy()
    try:
        wt.all_reduce(x, handle)
    except ValueError as e:
        assert "no communicator" in str(e), e
    else:
        raise AssertionError("a destroyed communicator's handle was taken")
    # A subgroup (a second weft process group) and a communicator of its ranks.
    import torch.distributed as dist

    members = list(range(0, ctx.n, 2)) if ctx.n >= 4 else list(range(ctx.n))
    group = dist.new_group(members)  # every rank takes part
    if ctx.rank in members:
        t = torch.ones(3, device=ctx.device)
        dist.all_reduce(t, group=group)
        assert (t == len(members)).all(), t
        sub = wt.Comm.from_process_group(group)
        assert (sub.rank, sub.size) == (members.index(ctx.rank), len(members))
        y = wt.all_reduce(torch.full((4,), float(ctx.rank), device=ctx.device), sub)
        assert (y == sum(members)).all(), y
        sub.destroy()


def _collectives(ctx, device, dtype):
    import torch

    import weft.torch as wt

    from torch_support import close, equal, gen, poison

    n, r, h = ctx.n, ctx.rank, ctx.h
    exact = not dtype.is_floating_point
    tol = 0 if exact else (2e-2 if dtype == torch.bfloat16 else 1e-6)
    tag = f"c/{dtype}/{device}"

    def data(name, q, shape):
        x = gen(f"{tag}/{name}", q, shape, scale=20.0 if exact else 1.0)
        return x.round().to(dtype) if exact else x.to(dtype)

    def check(what, actual, expected):
        if exact:
            equal(f"{what} {dtype} on {device}", actual, expected.to(dtype))
        else:
            close(f"{what} {dtype} on {device}", actual, expected, tol)

    xs = [data("x", q, (6 * n, 5)) for q in range(n)]
    x = xs[r].to(device)
    d = [t.double() for t in xs]
    nbytes = x.numel() * x.element_size()
    ops = ["sum", "max", "min"] + ([] if exact else ["avg"])
    refs = {"sum": sum(d), "max": torch.stack(d).max(0).values, "min": torch.stack(d).min(0).values,
            "avg": sum(d) / n}
    for op in ops:
        poison(nbytes, device)
        check(f"all_reduce {op}", wt.all_reduce(x, h, op), refs[op])
    y = x.clone()
    assert wt.all_reduce_(y, h) is y
    check("all_reduce_", y, refs["sum"])
    equal("all_reduce left its input", x, xs[r])
    poison(nbytes * n, device)
    check("all_gather", wt.all_gather(x, h), torch.cat(d))
    poison(nbytes // n, device)
    check("reduce_scatter", wt.reduce_scatter(x, h), refs["sum"][6 * r:6 * r + 6])
    poison(nbytes, device)
    check("all_to_all", wt.all_to_all(x, h), torch.cat([dq[6 * r:6 * r + 6] for dq in d]))
    sizes = [[(s + q) % n + 1 for q in range(n)] for s in range(n)]
    us = [data("u", s, (sum(sizes[s]), 5)) for s in range(n)]
    got = wt.all_to_all(us[r].to(device), h, [sizes[q][r] for q in range(n)], sizes[r])
    check("all_to_all (uneven)", got, torch.cat(
        [us[q][sum(sizes[q][:r]):sum(sizes[q][:r + 1])].double() for q in range(n)]))
    poison(nbytes, device)
    check("broadcast", wt.broadcast(x, h, root=n - 1), d[n - 1])
    poison(nbytes, device)
    check("reduce", wt.reduce(x, h, root=1 % n), refs["sum"] if r == 1 % n else 0 * d[0])


def check_collectives(ctx):
    import torch

    import weft.torch as wt

    for dtype in (torch.float32, torch.bfloat16, torch.float64, torch.int32):
        _collectives(ctx, ctx.device, dtype)
    scalar = wt.all_reduce(torch.tensor(float(ctx.rank + 1), device=ctx.device), ctx.h)
    assert scalar.dim() == 0 and scalar.item() == ctx.n * (ctx.n + 1) / 2, scalar
    # In place on a tensor autograd saved: its backward must see the change (as the dispatcher's
    # version counter shows it), also where the call skips the dispatcher.
    b = torch.ones(4, device=ctx.device, requires_grad=True) * 1
    loss = (b * b).sum()
    with torch.no_grad():
        wt.all_reduce_(b, ctx.h)
    try:
        loss.backward()
    except RuntimeError as e:
        assert "modified by an inplace operation" in str(e), e
    else:
        raise AssertionError("autograd missed all_reduce_ writing a saved tensor")
    _collectives(ctx, "cpu", torch.float32)
    _collectives(ctx, "cpu", torch.int64)


def check_graph(ctx):
    """The ops captured into a CUDA graph and replayed on new values; the all-reduce's input a
    registered buffer (the low-latency path)."""
    import torch

    import weft.torch as wt

    from torch_support import close, gen

    n, r, h, dev = ctx.n, ctx.rank, ctx.h, ctx.device
    x = torch.zeros(8 * n, 16, device=dev)
    reg = ctx.comm.register(x)

    def step():
        a = wt.all_reduce(x, h)
        b = wt.reduce_scatter(wt.all_gather(x, h), h)
        return a, b, wt.all_to_all(x, h), wt.broadcast(x, h, 0)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # each size's first call sets up outside the capture
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        outs = step()
    for it in range(3):
        xs = [gen(f"g/{it}", q, x.shape).float().double() for q in range(n)]
        x.copy_(xs[r])
        for o in outs:
            o.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        total = sum(xs)
        close(f"graph all_reduce, replay {it}", outs[0], total, 1e-6)
        close(f"graph all_gather+reduce_scatter, replay {it}", outs[1], n * xs[r], 1e-6)
        close(f"graph all_to_all, replay {it}", outs[2],
              torch.cat([xq[8 * r:8 * r + 8] for xq in xs]), 0)
        close(f"graph broadcast, replay {it}", outs[3], xs[0], 0)
    del graph
    ctx.comm.deregister(reg)


def check_compile(ctx):
    import torch

    import weft.torch as wt
    from weft.torch import collectives as c

    from torch_support import close, gen

    n, r, h, dev = ctx.n, ctx.rank, ctx.h, ctx.device
    x = gen("k/x", r, (4 * n, 8)).float().to(dev)

    def f(x):
        a = torch.ops.weft.all_reduce(x, h, "sum", None)
        b = wt.reduce_scatter(wt.all_gather(x * 2, h), h)
        return torch.relu(a) + b + wt.all_to_all(x, h, [], [])

    compiled = torch.compile(f, fullgraph=True)
    close("compiled collectives", compiled(x), f(x), 1e-6)
    # Compiled with autograd through the backward formulas.
    w = gen("k/w", r, (8, 8)).float().to(dev)

    def g(x, w):
        return (wt.all_gather(x @ w, h) ** 2).sum() + wt.all_reduce(x, h, "avg").sum()

    xs = [x.clone().requires_grad_() for _ in range(2)]
    torch.compile(g, fullgraph=True)(xs[0], w).backward()
    g(xs[1], w).backward()
    close("compiled backward", xs[0].grad, xs[1].grad, 1e-5)
    # The ops' registrations: schema, fake kernels against the real ones, autograd.
    y = x.clone().requires_grad_()
    utils = ("test_schema", "test_autograd_registration", "test_faketensor")
    for op, args in ((c.all_reduce_op, (y, h, "sum", None)), (c.all_gather_op, (y, h, None)),
                     (c.reduce_scatter_op, (y, h, "sum", None)),
                     (c.all_to_all_op, (y, h, [], [])), (c.broadcast_op, (y, h, 0)),
                     (c.reduce_op, (y, h, 0, "sum"))):
        torch.library.opcheck(op, args, test_utils=utils)


def check_gradcheck(ctx):
    """torch.autograd.gradcheck in float64 of every differentiable collective. gradcheck sees
    one function of one input on every rank: the whole input (every rank's part, the same tensor
    everywhere), each rank's op applied to its part, and every rank's output gathered; the
    wrappers' backward sums the parts' gradients over the ranks and keeps its own output's."""
    import torch

    import weft.torch as wt

    from torch_support import gen

    n, r, h = ctx.n, ctx.rank, ctx.h

    class Part(torch.autograd.Function):
        @staticmethod
        def forward(fctx, whole):
            return whole[r].clone()

        @staticmethod
        def backward(fctx, grad):
            whole = grad.new_zeros((n, *grad.shape))
            whole[r] = grad
            return wt.all_reduce(whole, h)

    class Whole(torch.autograd.Function):
        @staticmethod
        def forward(fctx, part):
            return wt.all_gather(part.unsqueeze(0).contiguous(), h)

        @staticmethod
        def backward(fctx, grad):
            return grad[r].contiguous()

    sizes = [[(s + q) % n + 1 for q in range(n)] for s in range(n)]
    cases = {
        "all_reduce sum": (lambda t: wt.all_reduce(t, h), (2 * n, 2)),
        "all_reduce avg": (lambda t: wt.all_reduce(t, h, "avg"), (2 * n, 2)),
        "all_gather": (lambda t: wt.all_gather(t, h), (2, 2)),
        "reduce_scatter sum": (lambda t: wt.reduce_scatter(t, h), (2 * n, 2)),
        "reduce_scatter avg": (lambda t: wt.reduce_scatter(t, h, "avg"), (2 * n, 2)),
        "all_to_all": (lambda t: wt.all_to_all(t, h), (2 * n, 2)),
        "all_to_all uneven": (lambda t: wt.all_to_all(
            t, h, [sizes[q][r] for q in range(n)], sizes[r]), (sum(sizes[0]), 2)),
        "broadcast": (lambda t: wt.broadcast(t, h, n - 1), (3, 2)),
        "reduce": (lambda t: wt.reduce(t, h, 0), (3, 2)),
    }
    for name, (op, shape) in cases.items():
        whole = gen(f"gc/{name}", 0, (n, *shape)).to(ctx.device).requires_grad_()
        fn = lambda w, op=op: Whole.apply(op(Part.apply(w)))  # noqa: E731
        if not torch.autograd.gradcheck(fn, (whole,), eps=1e-6, atol=1e-7, rtol=1e-6):
            raise AssertionError(f"gradcheck {name}")


# ---- the runner --------------------------------------------------------------------------------


def checks():
    import torch_fused_checks as fused

    return [("backend", check_backend), ("from_process_group", check_from_process_group),
            ("collectives", check_collectives), ("graph", check_graph),
            ("gradcheck", check_gradcheck), ("compile", check_compile)] + fused.CHECKS + [
            ("ddp", check_ddp)]


def rank_main():
    import torch
    import torch.distributed as dist

    import weft.torch as wt

    from torch_support import Ctx

    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)) %
                          torch.cuda.device_count())
    torch.cuda.set_device(device)
    wt.register_backend()
    dist.init_process_group("weft", rank=rank, world_size=n)
    ctx = Ctx(rank, n, device, wt.Comm.from_process_group())
    only = [c for c in os.environ.get("WEFT_TORCH_OPS_CHECKS", "").split(",") if c]
    failed = None
    for name, fn in checks():
        if only and name not in only:
            continue
        t0 = time.time()
        try:
            fn(ctx)
            torch.cuda.synchronize()
            if rank == 0:
                print(f"ok {name} ({n} ranks, {time.time() - t0:.1f} s)", flush=True)
        except Exception:  # noqa: BLE001 - reported, then the rank stops (its peers time out)
            failed = name
            print(f"FAIL {name} rank {rank}\n{traceback.format_exc()}", flush=True)
            break
    if failed is None:
        ctx.comm.destroy()
        dist.destroy_process_group()
        print(f"rank {rank}: every check passed", flush=True)
    sys.stdout.flush()
    os._exit(1 if failed else 0)  # a failed rank's peers may still wait on it


def spawn(nprocs):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(nprocs):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(nprocs), LOCAL_RANK=str(r),
                   LOCAL_WORLD_SIZE=str(nprocs), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__)], env=env))
    codes = [p.wait() for p in procs]
    bad = [r for r, c in enumerate(codes) if c != 0]
    if bad:
        print(f"test_torch: ranks {bad} failed (exit codes {codes})", flush=True)
        return 1
    print(f"test_torch: {nprocs} ranks passed", flush=True)
    return 0


def main():
    try:
        import torch
    except ImportError:
        skip("PyTorch is not installed")
    if not torch.cuda.is_available():
        skip("PyTorch has no CUDA device")
    sys.path.insert(0, HERE)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        rank_main()
    nprocs = 2
    if "--nprocs" in sys.argv:
        nprocs = int(sys.argv[sys.argv.index("--nprocs") + 1])
    sys.exit(spawn(nprocs))


if __name__ == "__main__":
    main()
