"""weft from Python: communicators and collectives over libweft's C ABI (weft.h), through ctypes.

Buffers are anything contiguous that exposes its memory: NumPy arrays, array.array, bytearray
and memoryviews (host memory), CuPy arrays and objects with __cuda_array_interface__, and
PyTorch tensors on the CPU or a GPU. GPU calls run on `stream` (a cudaStream_t as an int, or an
object with .cuda_stream or .ptr; by default PyTorch's current stream where PyTorch is loaded,
else the legacy default stream). Every failure raises WeftError with weft's message.
docs/api.md, "Python".
"""

import contextlib
import ctypes
import os
import sys
import threading

from ._lib import DTYPES, ITEMSIZE, OPS, MoeDispatchArgs, UniqueId, WeftError, check, lib

__all__ = ["Comm", "MoeHandle", "WeftError", "group", "unique_id", "version"]

_FORMATS = {"f": "float32", "d": "float64", "e": "float16", "b": "int8", "B": "uint8"}
_INTS = {("i", 4): "int32", ("I", 4): "uint32", ("l", 8): "int64", ("L", 8): "uint64",
         ("q", 8): "int64", ("Q", 8): "uint64", ("l", 4): "int32", ("L", 4): "uint32"}
_TYPESTRS = {"f8": "float64", "f4": "float32", "f2": "float16", "i1": "int8", "u1": "uint8",
             "i4": "int32", "u4": "uint32", "i8": "int64", "u8": "uint64"}


def version():
    v = ctypes.c_int()
    check(lib.weftGetVersion(ctypes.byref(v)))
    return v.value


def unique_id():
    """A new communicator id (128 bytes) to hand to every rank; this process listens for them."""
    u = UniqueId()
    check(lib.weftGetUniqueId(ctypes.byref(u)))
    return ctypes.string_at(ctypes.addressof(u), ctypes.sizeof(u))  # every byte, NULs too


class _Buffer:
    __slots__ = ("ptr", "nbytes", "dtype", "device", "keep")

    def __init__(self, ptr, nbytes, dtype, device, keep):
        self.ptr, self.nbytes, self.dtype, self.device, self.keep = ptr, nbytes, dtype, device, keep

    def count(self):
        return self.nbytes // ITEMSIZE[DTYPES[self.dtype]]


def _dtype_name(dtype, found, what):
    name = dtype or found
    if name is None:
        raise TypeError(f"weft: {what}: its element type is unknown; pass dtype=")
    name = str(name).replace("torch.", "")
    if name not in DTYPES:
        raise TypeError(f"weft: {what}: element type {name!r} is not one of {sorted(DTYPES)}")
    return name


def _buffer(obj, dtype=None, writable=False, what="buffer"):
    if obj is None:
        raise TypeError(f"weft: {what} is None")
    if type(obj).__module__.startswith("torch"):  # a tensor (bf16 has no array interface)
        if not obj.is_contiguous():
            raise ValueError(f"weft: {what} is not contiguous")
        name = _dtype_name(dtype, str(obj.dtype), what)
        return _Buffer(obj.data_ptr(), obj.numel() * obj.element_size(), name, obj.is_cuda, obj)
    for attr, device in (("__cuda_array_interface__", True), ("__array_interface__", False)):
        face = getattr(obj, attr, None)
        if face is None:
            continue
        if face.get("strides") is not None:
            raise ValueError(f"weft: {what} is not contiguous")
        ptr, readonly = face["data"]
        if writable and readonly:
            raise TypeError(f"weft: {what} is read-only")
        count = 1
        for d in face["shape"]:
            count *= d
        name = _dtype_name(dtype, _TYPESTRS.get(face["typestr"][1:]), what)
        return _Buffer(ptr, count * ITEMSIZE[DTYPES[name]], name, device, obj)
    view = memoryview(obj)
    if not view.c_contiguous:
        raise ValueError(f"weft: {what} is not contiguous")
    if writable and view.readonly:
        raise TypeError(f"weft: {what} is read-only")
    found = _FORMATS.get(view.format) or _INTS.get((view.format, view.itemsize))
    name = _dtype_name(dtype, found, what)
    view = view.cast("B")
    if view.readonly:  # a read-only input: read from a copy
        keep = (ctypes.c_char * view.nbytes).from_buffer_copy(view)
    else:
        keep = (ctypes.c_char * view.nbytes).from_buffer(view)
    return _Buffer(ctypes.addressof(keep), view.nbytes, name, False, (obj, keep))


def _stream(stream, device):
    if not device:
        if stream not in (None, 0):
            raise ValueError("weft: a stream was given with host buffers")
        return None
    if stream is None:
        torch = sys.modules.get("torch")
        return torch.cuda.current_stream().cuda_stream if torch is not None else 0
    if isinstance(stream, int):
        return stream
    for attr in ("cuda_stream", "ptr"):
        if hasattr(stream, attr):
            return int(getattr(stream, attr))
    raise TypeError("weft: stream must be an int, or have .cuda_stream or .ptr")


def _op(op):
    if op not in OPS:
        raise ValueError(f"weft: op {op!r} is not one of {sorted(OPS)}")
    return OPS[op]


_group = threading.local()  # this thread's open groups, and the buffers their calls hold


def _hold(*buffers):
    """Inside a group the calls run at its end: their buffers (and any copies) live till then."""
    if getattr(_group, "depth", 0) > 0:
        _group.keep.extend(buffers)


@contextlib.contextmanager
def group():
    """NCCL's groups: the calls inside run together at the end (sends and receives progress
    together)."""
    check(lib.weftGroupStart())
    if getattr(_group, "depth", 0) == 0:
        _group.keep = []
    _group.depth = getattr(_group, "depth", 0) + 1
    try:
        yield
    finally:
        _group.depth -= 1
        try:
            check(lib.weftGroupEnd())
        finally:
            if _group.depth == 0:
                _group.keep = []


class Comm:
    """A communicator: rank `rank` of `nranks` joining `uid` (from unique_id() on one rank)."""

    def __init__(self, nranks, uid, rank, _handle=None):
        self._h = ctypes.c_void_p(_handle)
        if _handle is None:
            if len(uid) != 128:
                raise ValueError("weft: a unique id is 128 bytes (weft.unique_id())")
            u = UniqueId()
            ctypes.memmove(ctypes.addressof(u), bytes(uid), ctypes.sizeof(u))
            check(lib.weftCommInitRank(ctypes.byref(self._h), nranks, u, rank))

    @classmethod
    def from_environment(cls, rank=None, nranks=None):
        """Rank `rank` of `nranks` meeting at WEFT_COMM_ID (host:port, where rank 0 listens):
        every rank computes the same id from it, so nothing is passed around. rank and nranks
        default to WEFT_RANK and WEFT_NRANKS (else RANK and WORLD_SIZE, as torchrun sets)."""
        if not os.environ.get("WEFT_COMM_ID"):
            raise ValueError("weft: Comm.from_environment needs WEFT_COMM_ID=host:port")

        def setting(value, names, what):
            for name in names:
                if value is None and os.environ.get(name):
                    value = int(os.environ[name])
            if value is None:
                raise ValueError(f"weft: Comm.from_environment: no {what} (set {' or '.join(names)})")
            return value

        rank = setting(rank, ("WEFT_RANK", "RANK"), "rank")
        nranks = setting(nranks, ("WEFT_NRANKS", "WORLD_SIZE"), "rank count")
        return cls(nranks, unique_id(), rank)

    @classmethod
    def init_all(cls, nranks):
        """Every rank in this process (then drive each from its own thread)."""
        hs = (ctypes.c_void_p * nranks)()
        check(lib.weftCommInitAll(hs, nranks))
        return [cls(nranks, None, r, _handle=hs[r]) for r in range(nranks)]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.destroy()

    def _handle(self):
        if not self._h.value:
            raise WeftError(2, "weft: the communicator was destroyed")
        return self._h

    @property
    def rank(self):
        v = ctypes.c_int()
        check(lib.weftCommUserRank(self._handle(), ctypes.byref(v)))
        return v.value

    @property
    def size(self):
        v = ctypes.c_int()
        check(lib.weftCommCount(self._handle(), ctypes.byref(v)))
        return v.value

    def split(self, color, key):
        """Collective: a communicator of the ranks passing the same color, ranked by key;
        None for a negative color."""
        h = ctypes.c_void_p()
        check(lib.weftCommSplit(self._handle(), color if color >= 0 else -1, key,
                                ctypes.byref(h)))
        return Comm(0, None, 0, _handle=h.value) if h.value else None

    def destroy(self):
        if self._h.value:
            h, self._h = self._h, ctypes.c_void_p()
            check(lib.weftCommDestroy(h))

    def abort(self):
        if self._h.value:
            h, self._h = self._h, ctypes.c_void_p()
            check(lib.weftCommAbort(h))

    def summary(self):
        """One line: ranks, memory, transport, channels (weftCommSummary)."""
        text = lib.weftCommSummary(self._handle())
        return text.decode(errors="replace") if text else ""

    def register(self, buf):
        """Registers `buf` (GPU memory) for the low-latency path (weftCommRegister): when one rank
        passes a registered buffer to a collective every rank must, at the same offset. Returns
        the handle deregister takes."""
        b = _buffer(buf, "uint8", False, "register")
        h = ctypes.c_void_p()
        check(lib.weftCommRegister(self._handle(), b.ptr, b.nbytes, ctypes.byref(h)))
        return h.value

    def deregister(self, handle):
        """Waits for the communicator's enqueued GPU work, then forgets the buffer."""
        check(lib.weftCommDeregister(self._handle(), handle))

    def async_error(self):
        """What stopped a GPU call after it was enqueued, or None."""
        v = ctypes.c_int()
        check(lib.weftCommGetAsyncError(self._handle(), ctypes.byref(v)))
        return WeftError(v.value, "") if v.value else None

    # Collectives. recv None: in place (into send).
    def _pair(self, send, recv, dtype, what):
        s = _buffer(send, dtype, recv is None, what + "'s send")
        r = s if recv is None else _buffer(recv, dtype, True, what + "'s recv")
        if r.dtype != s.dtype or r.device != s.device:
            raise TypeError(f"weft: {what}: send and recv differ in element type or memory")
        _hold(s, r)
        return s, r

    def _sizes(self, what, have, want):
        if have != want:
            raise ValueError(f"weft: {what}: recv holds {have} bytes, the call needs {want}")

    def all_reduce(self, send, recv=None, op="sum", stream=None, dtype=None):
        s, r = self._pair(send, recv, dtype, "all_reduce")
        self._sizes("all_reduce", r.nbytes, s.nbytes)
        check(lib.weftAllReduce(s.ptr, r.ptr, s.count(), DTYPES[s.dtype], _op(op), self._handle(),
                                _stream(stream, s.device)))
        return recv if recv is not None else send

    def all_gather(self, send, recv, stream=None, dtype=None):
        s, r = self._pair(send, recv, dtype, "all_gather")
        self._sizes("all_gather", r.nbytes, s.nbytes * self.size)
        check(lib.weftAllGather(s.ptr, r.ptr, s.count(), DTYPES[s.dtype], self._handle(),
                                _stream(stream, s.device)))
        return recv

    def reduce_scatter(self, send, recv, op="sum", stream=None, dtype=None):
        s, r = self._pair(send, recv, dtype, "reduce_scatter")
        self._sizes("reduce_scatter", r.nbytes * self.size, s.nbytes)
        check(lib.weftReduceScatter(s.ptr, r.ptr, r.count(), DTYPES[s.dtype], _op(op),
                                    self._handle(), _stream(stream, s.device)))
        return recv

    def broadcast(self, send, recv=None, root=0, stream=None, dtype=None):
        s, r = self._pair(send, recv, dtype, "broadcast")
        self._sizes("broadcast", r.nbytes, s.nbytes)
        check(lib.weftBroadcast(s.ptr, r.ptr, s.count(), DTYPES[s.dtype], root, self._handle(),
                                _stream(stream, s.device)))
        return recv if recv is not None else send

    def reduce(self, send, recv=None, root=0, op="sum", stream=None, dtype=None):
        s, r = self._pair(send, recv, dtype, "reduce")
        self._sizes("reduce", r.nbytes, s.nbytes)
        check(lib.weftReduce(s.ptr, r.ptr, s.count(), DTYPES[s.dtype], _op(op), root,
                             self._handle(), _stream(stream, s.device)))
        return recv if recv is not None else send

    def all_to_all(self, send, recv, stream=None, dtype=None):
        s, r = self._pair(send, recv, dtype, "all_to_all")
        self._sizes("all_to_all", r.nbytes, s.nbytes)
        check(lib.weftAllToAll(s.ptr, r.ptr, s.count() // self.size, DTYPES[s.dtype],
                               self._handle(), _stream(stream, s.device)))
        return recv

    def all_to_all_v(self, send, send_counts, send_displs, recv, recv_counts, recv_displs,
                     stream=None, dtype=None):
        """Counts and displacements in elements, one per rank, as MPI_Alltoallv."""
        s, r = self._pair(send, recv, dtype, "all_to_all_v")
        n = self.size
        lists = [send_counts, send_displs, recv_counts, recv_displs]
        if any(len(x) != n for x in lists):
            raise ValueError(f"weft: all_to_all_v: counts and displacements need {n} entries each")
        for counts, displs, buf, side in ((send_counts, send_displs, s, "send"),
                                          (recv_counts, recv_displs, r, "recv")):
            if any(c < 0 or d < 0 or d + c > buf.count() for c, d in zip(counts, displs)):
                raise ValueError(f"weft: all_to_all_v: a {side} count and displacement run past "
                                 f"the buffer's {buf.count()} elements")
        arrays = [(ctypes.c_size_t * n)(*x) for x in lists]
        check(lib.weftAllToAllv(s.ptr, arrays[0], arrays[1], r.ptr, arrays[2], arrays[3],
                                DTYPES[s.dtype], self._handle(), _stream(stream, s.device)))
        return recv

    def send(self, buf, peer, stream=None, dtype=None):
        b = _buffer(buf, dtype, False, "send")
        _hold(b)
        check(lib.weftSend(b.ptr, b.count(), DTYPES[b.dtype], peer, self._handle(),
                           _stream(stream, b.device)))

    def recv(self, buf, peer, stream=None, dtype=None):
        b = _buffer(buf, dtype, True, "recv")
        _hold(b)
        check(lib.weftRecv(b.ptr, b.count(), DTYPES[b.dtype], peer, self._handle(),
                           _stream(stream, b.device)))
        return buf

    def barrier(self, stream=None):
        check(lib.weftBarrier(self._handle(), stream))

    def moe_dispatch(self, x, topk_idx, topk_weights, experts, recv_x, expert_counts,
                     recv_source=None, recv_scales=None, stream=None, dtype=None):
        """MoE dispatch (weftMoeDispatch): x [tokens, hidden], topk_idx [tokens, k] (int64, -1
        drops a slot), topk_weights [tokens, k] (float32), recv_x [capacity, hidden],
        expert_counts [experts / ranks] (int32), recv_source optional [capacity, 2] (int32).
        tokens is x's first dimension; hidden, k and capacity follow from the buffers' sizes.
        With recv_scales [capacity, ceil(hidden / 128)] (float32) the rows travel as fp8 e4m3
        (recv_x then [capacity, hidden] bytes) with one scale per 128 values; host memory.
        Returns the handle combine takes."""
        bx = _buffer(x, dtype, False, "moe_dispatch's x")
        bi = _buffer(topk_idx, "int64", False, "topk_idx")
        bw = _buffer(topk_weights, "float32", False, "topk_weights")
        fp8 = recv_scales is not None
        br = _buffer(recv_x, "uint8" if fp8 else bx.dtype, True, "recv_x")
        bsc = _buffer(recv_scales, "float32", True, "recv_scales") if fp8 else None
        bc = _buffer(expert_counts, "int32", True, "expert_counts")
        bs = None if recv_source is None else _buffer(recv_source, "int32", True, "recv_source")
        tokens = _rows(x, bx)
        if tokens == 0 or bi.count() % tokens or bx.count() % tokens:
            raise ValueError("weft: moe_dispatch: x and topk_idx need [tokens, ...] shapes "
                             "(a 2-D x and topk_idx)")
        hidden, topk = bx.count() // tokens, bi.count() // tokens
        row = hidden if fp8 else hidden * ITEMSIZE[DTYPES[bx.dtype]]
        a = MoeDispatchArgs(bx.ptr, bi.ptr, bw.ptr, tokens, hidden, topk, experts,
                            DTYPES[bx.dtype], br.ptr, br.nbytes // row, bc.ptr,
                            bs.ptr if bs else None, 1 if fp8 else 0, bsc.ptr if fp8 else None)
        if fp8 and bsc.count() < a.capacity * ((hidden + 127) // 128):
            raise ValueError("weft: moe_dispatch: recv_scales needs capacity x ceil(hidden/128) "
                             "floats")
        h = ctypes.c_void_p()
        check(lib.weftMoeDispatch(ctypes.byref(a), ctypes.byref(h), self._handle(),
                                  _stream(stream, bx.device)))
        return MoeHandle(h.value, self, (x, topk_idx, topk_weights, recv_x, expert_counts))

    def moe_combine(self, handle, expert_out, out, stream=None):
        """MoE combine (weftMoeCombine): out [tokens, hidden] = Σ weight · expert_out row."""
        be = _buffer(expert_out, None, False, "expert_out")
        bo = _buffer(out, be.dtype, True, "out")
        check(lib.weftMoeCombine(handle._h, be.ptr, bo.ptr, self._handle(),
                                 _stream(stream, be.device)))
        return out


def _rows(obj, buf):
    shape = getattr(obj, "shape", None)
    if shape is not None and len(shape) >= 1:
        return int(shape[0])
    raise ValueError("weft: moe_dispatch: x must have a shape (tokens, hidden)")


class MoeHandle:
    """A dispatch's layout; combine takes it. Freed when collected (or by close())."""

    def __init__(self, handle, comm, keep):
        self._h, self._comm, self._keep = ctypes.c_void_p(handle), comm, keep

    @property
    def rows(self):
        v = ctypes.c_size_t()
        check(lib.weftMoeRows(self._h, ctypes.byref(v)))
        return v.value

    def close(self):
        if self._h.value:
            h, self._h = self._h, ctypes.c_void_p()
            check(lib.weftMoeHandleDestroy(h))

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass
