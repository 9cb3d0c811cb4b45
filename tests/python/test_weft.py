"""The Python layer (python/weft) on host memory, ranks as processes: every collective against
values computed here, in and out of place; all-to-all-v, send/recv in a group, split; MoE
dispatch and combine; and the errors, raised before anything moves or carrying weft's message.
Buffers are array.array and memoryviews (NumPy too where it is installed). Run by ctest with
WEFT_LIBRARY and PYTHONPATH set."""

import array
import multiprocessing
import os
import sys
import traceback
import unittest

N = 3


def _rank_main(name, rank, n, uid, results):
    try:
        import weft

        with weft.Comm(n, uid, rank) as comm:
            globals()[name](comm, rank, n)
        results.put((rank, None))
    except BaseException:  # noqa: BLE001 - reported to the parent
        results.put((rank, traceback.format_exc()))


def run_ranks(testcase, name, n=N):
    import weft

    ctx = multiprocessing.get_context("spawn")
    uid = weft.unique_id()
    results = ctx.Queue()
    procs = [ctx.Process(target=_rank_main, args=(name, r, n, uid, results)) for r in range(n)]
    for p in procs:
        p.start()
    failures = []
    for _ in range(n):
        rank, error = results.get(timeout=120)
        if error:
            failures.append(f"rank {rank}:\n{error}")
    for p in procs:
        p.join(30)
    testcase.assertEqual(failures, [], "\n".join(failures))


def values(rank, count, typecode="f"):
    return array.array(typecode, [(rank + 1) * 10 + i % 7 for i in range(count)])


def collectives(comm, rank, n):
    count = 11
    # all-reduce, out of place and in place; every op on int32.
    out = array.array("f", [0.0] * count)
    comm.all_reduce(values(rank, count), out)
    assert list(out) == [sum((r + 1) * 10 + i % 7 for r in range(n)) for i in range(count)], out
    buf = values(rank, count, "i")
    comm.all_reduce(buf, op="max")
    assert list(buf) == [n * 10 + i % 7 for i in range(count)], buf
    doubles = array.array("d", [rank + 0.5] * 4)
    comm.all_reduce(doubles, op="prod")
    want = 1.0
    for r in range(n):
        want *= r + 0.5
    assert list(doubles) == [want] * 4, doubles
    # all-gather, reduce-scatter, broadcast, reduce, all-to-all.
    gathered = array.array("f", [0.0] * (count * n))
    comm.all_gather(values(rank, count), gathered)
    assert list(gathered) == sum((list(values(r, count)) for r in range(n)), []), gathered
    scattered = array.array("f", [0.0] * count)
    comm.reduce_scatter(array.array("f", [1.0] * (count * n)), scattered)
    assert list(scattered) == [float(n)] * count, scattered
    b = values(rank, count)
    comm.broadcast(b, root=1)
    assert list(b) == list(values(1, count)), b
    r = array.array("f", [0.0] * count)
    comm.reduce(values(rank, count), r, root=0, op="min")
    if rank == 0:
        assert list(r) == list(values(0, count)), r
    send = array.array("i", [rank * 100 + q for q in range(n) for _ in range(2)])
    recv = array.array("i", [0] * (2 * n))
    comm.all_to_all(send, recv)
    assert list(recv) == [q * 100 + rank for q in range(n) for _ in range(2)], recv
    # all-to-all-v: rank q gets q + 1 elements from each rank.
    sc = [q + 1 for q in range(n)]
    sd = [sum(sc[:q]) for q in range(n)]
    vsend = array.array("i", [rank * 1000 + q for q in range(n) for _ in range(q + 1)])
    rc = [rank + 1] * n
    rd = [q * (rank + 1) for q in range(n)]
    vrecv = array.array("i", [-1] * sum(rc))
    comm.all_to_all_v(vsend, sc, sd, vrecv, rc, rd)
    assert list(vrecv) == [s * 1000 + rank for s in range(n) for _ in range(rank + 1)], vrecv
    # A ring of sends and receives in a group.
    got = array.array("f", [0.0] * 5)
    import weft

    with weft.group():
        comm.send(values(rank, 5), (rank + 1) % n)
        comm.recv(got, (rank + n - 1) % n)
    assert list(got) == list(values((rank + n - 1) % n, 5)), got
    comm.barrier()
    # A read-only input (bytes) and a 2-D memoryview.
    ro = memoryview(bytes(values(rank, 4))).cast("f")  # read-only
    out = memoryview(bytearray(16)).cast("f", (2, 2))
    comm.all_reduce(ro, out)
    assert out.tolist() == [[float(sum((r + 1) * 10 + i for r in range(n))) for i in (0, 1)],
                            [float(sum((r + 1) * 10 + i for r in range(n))) for i in (2, 3)]]


def split(comm, rank, n):
    sub = comm.split(rank % 2, rank)
    assert sub is not None and sub.size == len(range(rank % 2, n, 2)), sub
    buf = array.array("i", [rank])
    sub.all_reduce(buf)
    assert buf[0] == sum(range(rank % 2, n, 2)), buf
    sub.destroy()
    assert comm.split(-1, 0) is None  # every rank takes part; a negative color gets none


def errors(comm, rank, n):
    import weft

    def raises(kind, fn, text):
        try:
            fn()
        except kind as e:
            assert text in str(e), f"{text!r} not in {e!r}"
            return e
        raise AssertionError(f"no {kind.__name__} ({text})")

    f = array.array("f", [1.0] * 4)
    raises(ValueError, lambda: comm.all_reduce(f, op="xor"), "op 'xor'")
    raises(ValueError, lambda: comm.all_gather(f, array.array("f", [0.0] * 5)), "recv holds 20")
    raises(TypeError, lambda: comm.all_reduce(f, bytes(16)), "read-only")
    raises(TypeError, lambda: comm.all_reduce(f, array.array("i", [0] * 4)), "differ")
    raises(TypeError, lambda: comm.all_reduce(array.array("h", [1, 2])), "unknown")
    raises(ValueError, lambda: comm.all_reduce(f, stream=5), "stream was given with host")
    e = raises(weft.WeftError, lambda: comm.broadcast(f, root=n), "root")
    assert e.code == 1, e.code  # weftInvalidArgument
    # The communicator is still usable after refused calls.
    comm.all_reduce(f)
    assert list(f) == [float(n)] * 4, f
    sub = comm.split(0, rank)
    sub.destroy()
    raises(weft.WeftError, lambda: sub.all_reduce(f), "destroyed")


def moe(comm, rank, n):
    experts, topk, tokens, hidden = 2 * n, 2, 6, 4
    L = experts // n
    x = memoryview(bytearray(tokens * hidden * 4)).cast("f", (tokens, hidden))
    idx = memoryview(bytearray(tokens * topk * 8)).cast("q", (tokens, topk))
    w = memoryview(bytearray(tokens * topk * 4)).cast("f", (tokens, topk))
    routes = {}
    for s in range(n):
        routes[s] = [((t + s) % experts, (t + s + 1 + t % 2) % experts) for t in range(tokens)]
    for t in range(tokens):
        for c in range(hidden):
            x[t, c] = rank * 100 + t * 10 + c
        for j in range(topk):
            idx[t, j] = routes[rank][t][j]
            w[t, j] = 0.5 + j
    capacity = n * tokens * topk
    recv = memoryview(bytearray(capacity * hidden * 4)).cast("f", (capacity, hidden))
    counts = array.array("i", [0] * L)
    source = array.array("i", [0] * (2 * capacity))
    import weft

    h = comm.moe_dispatch(x, idx, w, experts, recv, counts, source)
    want = [[(s, t) for s in range(n) for t in range(tokens) if rank * L + e in routes[s][t]]
            for e in range(L)]
    assert list(counts) == [len(rows) for rows in want], counts
    row = 0
    for rows in want:
        for s, t in rows:
            assert (source[2 * row], source[2 * row + 1]) == (s, t), (row, s, t)
            assert recv[row, 0] == s * 100 + t * 10, (row, recv[row, 0])
            row += 1
    assert h.rows == row
    # Identity experts: out = sum of the weights of the token's slots, times x.
    out = memoryview(bytearray(tokens * hidden * 4)).cast("f", (tokens, hidden))
    comm.moe_combine(h, recv, out)
    for t in range(tokens):
        assert out[t, 1] == (0.5 + 1.5) * x[t, 1], (t, out[t, 1], x[t, 1])
    h.close()
    # fp8 dispatch: e4m3 rows and a scale per 128 values; every value here is exact in e4m3
    # times its block's scale where the block's largest is a power of two times 448's.
    hidden8 = 128
    x8 = memoryview(bytearray(tokens * hidden8 * 4)).cast("f", (tokens, hidden8))
    for t in range(tokens):
        for c in range(hidden8):
            x8[t, c] = 0.0
        x8[t, 0] = 448.0  # the block's largest: scale 1
        x8[t, 1] = float(rank + 1)
    recv8 = bytearray(capacity * hidden8)
    scales = array.array("f", [0.0] * capacity)
    h8 = comm.moe_dispatch(x8, idx, w, experts, recv8, counts, recv_scales=scales)
    assert h8.rows == row, (h8.rows, row)
    for r8 in range(row):
        assert scales[r8] == 1.0, scales[r8]
        src = source[2 * r8]
        assert recv8[r8 * hidden8 + 1] == {1: 0x38, 2: 0x40, 3: 0x44, 4: 0x48}[src + 1], recv8[r8 * hidden8 + 1]
    h8.close()


def with_numpy(comm, rank, n):
    import numpy as np

    x = np.arange(12, dtype=np.float32).reshape(3, 4) + rank
    out = np.full_like(x, np.nan)
    comm.all_reduce(x, out)
    np.testing.assert_array_equal(out, n * np.arange(12, dtype=np.float32).reshape(3, 4) +
                                  sum(range(n)))
    h = np.full(5, rank + 1, dtype=np.float16)
    comm.all_reduce(h, op="max")
    assert (h == n).all(), h
    g = np.zeros((n, 2), dtype=np.int64)
    comm.all_gather(np.array([rank, -rank], dtype=np.int64), g)
    np.testing.assert_array_equal(g, [[r, -r] for r in range(n)])
    rs = np.zeros(2, dtype=np.float64)
    comm.reduce_scatter(np.ones(2 * n, dtype=np.float64), rs)
    assert (rs == n).all(), rs
    strided = x[:, ::2]  # not contiguous: refused before the call
    try:
        comm.all_reduce(strided)
    except ValueError as e:
        assert "contiguous" in str(e), e
    else:
        raise AssertionError("a strided array was taken")


def _env_rank_main(rank, n, port, results):
    try:
        os.environ.update(WEFT_COMM_ID=f"127.0.0.1:{port}", WEFT_RANK=str(rank), WEFT_NRANKS=str(n))
        import weft

        with weft.Comm.from_environment() as comm:
            assert (comm.rank, comm.size) == (rank, n), (comm.rank, comm.size)
            collectives(comm, rank, n)
        results.put((rank, None))
    except BaseException:  # noqa: BLE001 - reported to the parent
        results.put((rank, traceback.format_exc()))


class PythonLayer(unittest.TestCase):
    def test_from_environment(self):
        import socket

        import weft

        with socket.socket() as s:  # a free port for rank 0 to listen on
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        ctx = multiprocessing.get_context("spawn")
        results = ctx.Queue()
        procs = [ctx.Process(target=_env_rank_main, args=(r, 2, port, results)) for r in range(2)]
        for p in procs:
            p.start()
        errors = [e for _ in procs for (_, e) in [results.get(timeout=120)] if e]
        for p in procs:
            p.join(30)
        self.assertEqual(errors, [], "\n".join(errors))
        saved = os.environ.pop("WEFT_COMM_ID", None)
        try:
            with self.assertRaises(ValueError):
                weft.Comm.from_environment(0, 1)
        finally:
            if saved is not None:
                os.environ["WEFT_COMM_ID"] = saved

    def test_numpy(self):
        try:
            import numpy  # noqa: F401
        except ImportError:
            self.skipTest("NumPy is not installed (Debian: python3-numpy)")
        run_ranks(self, "with_numpy")

    def test_collectives(self):
        run_ranks(self, "collectives")

    def test_split(self):
        run_ranks(self, "split", 4)

    def test_errors(self):
        run_ranks(self, "errors", 2)

    def test_moe(self):
        run_ranks(self, "moe")

    def test_one_rank_and_threads(self):
        import threading

        import weft

        comms = weft.Comm.init_all(2)
        outs = [array.array("f", [0.0] * 3) for _ in comms]

        def body(r):
            comms[r].all_reduce(values(r, 3), outs[r])

        threads = [threading.Thread(target=body, args=(r,)) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for c in comms:
            self.assertEqual(c.size, 2)
            c.destroy()
        self.assertEqual(list(outs[0]), [10.0 + 20.0 + 2 * (i % 7) for i in range(3)])
        self.assertGreater(weft.version(), 0)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    unittest.main()
