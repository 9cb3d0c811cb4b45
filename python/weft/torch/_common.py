"""What weft.torch's ops share: the registry that names communicators by an int (an op cannot
take a Python object), communicators made from a torch.distributed process group, element types,
streams and compression settings."""

import ctypes
import itertools
import threading

import torch

import weft
from weft._lib import DTYPES, OPS, Compression, check, lib

_TORCH_NAMES = {"float8_e4m3": "float8_e4m3fn"}
TYPE_CODES = {}
for _name, _code in DTYPES.items():
    _t = getattr(torch, _TORCH_NAMES.get(_name, _name), None)
    if isinstance(_t, torch.dtype):
        TYPE_CODES[_t] = _code


def type_code(t, what):
    code = TYPE_CODES.get(t.dtype)
    if code is None:
        raise TypeError(f"weft.torch: {what}: element type {t.dtype} is not one weft moves "
                        f"({', '.join(sorted(str(d) for d in TYPE_CODES))})")
    return code


def op_code(op):
    code = OPS.get(op)
    if code is None:
        raise ValueError(f"weft.torch: op {op!r} is not one of {sorted(OPS)}")
    return code


_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def stream_of(t):
    """The current CUDA stream of t's device as an int, or None for host memory."""
    if not t.is_cuda:
        return None
    if _raw_stream is not None:
        return _raw_stream(t.device.index)
    return torch.cuda.current_stream(t.device).cuda_stream


try:
    from torch.utils._python_dispatch import _get_current_dispatch_mode
except ImportError:  # then every call goes through the dispatcher
    _get_current_dispatch_mode = None


def direct(x):
    """Whether an op on x may run its kernel without the dispatcher: eager, a plain tensor, no
    autograd to record, no dispatch mode (fake tensors, tracing) to see the call."""
    return (not torch.compiler.is_compiling() and type(x) is torch.Tensor
            and not (x.requires_grad and torch.is_grad_enabled())
            and _get_current_dispatch_mode is not None and _get_current_dispatch_mode() is None)


def dense(t, what):
    """t as one contiguous block at a 16-byte multiple (the fused calls' rule; a copy if not)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"weft.torch: {what} must be a tensor, not {type(t).__name__}")
    if not t.is_contiguous() or t.data_ptr() % 16:
        t = t.clone(memory_format=torch.contiguous_format)
    return t


def ptr(t):
    return None if t is None else t.data_ptr()


class Entry:
    """A registered communicator and what the ops ask of it without calling weft."""

    __slots__ = ("comm", "rank", "size")

    def __init__(self, comm):
        self.comm, self.rank, self.size = comm, comm.rank, comm.size

    def raw(self):
        return self.comm._handle()  # raises once the communicator is destroyed


_lock = threading.Lock()
_entries = {}
_ids = itertools.count(1)


def handle_of(comm):
    """The int that names `comm` in weft's torch ops (registering it on first use). An int is
    taken as a handle already."""
    if isinstance(comm, int):
        entry(comm)
        return comm
    h = getattr(comm, "_torch_handle", None)
    if h is not None and h in _entries:
        return h
    if not isinstance(comm, weft.Comm):
        raise TypeError("weft.torch: expected a weft.Comm or its handle, got "
                        f"{type(comm).__name__}")
    e = Entry(comm)
    with _lock:
        h = next(_ids)
        _entries[h] = e
    comm._torch_handle = h
    return h


def entry(h):
    e = _entries.get(h)
    if e is None:
        raise ValueError(f"weft.torch: no communicator has handle {h} (weft.torch.handle_of(comm) "
                         "registers one; a destroyed one is forgotten)")
    return e


def forget(comm):
    h = getattr(comm, "_torch_handle", None)
    with _lock:
        _entries.pop(h, None)


class Comm(weft.Comm):
    """weft.Comm with an int `handle` for the torch ops, and made from a process group."""

    @property
    def handle(self):
        return handle_of(self)

    def destroy(self):
        forget(self)
        super().destroy()

    def abort(self):
        forget(self)
        super().abort()

    @classmethod
    def from_process_group(cls, group=None):
        """A communicator of `group`'s ranks (default: the world), ranked as the group ranks
        them. Collective over the group: every member calls it, in the same order as its other
        calls of this for the group. Its rank 0 makes the id (so WEFT_COMM_ID is honoured) and
        hands it over through torch.distributed's store under a key counted per group."""
        import torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d

        if group is None:
            group = c10d._get_default_group()
        rank, size = dist.get_rank(group), dist.get_world_size(group)
        if rank < 0:
            raise ValueError("weft.torch: this process is not a member of the group")
        name = c10d._world.pg_names.get(group, "default")
        with _lock:
            count = _groups_made[name] = _groups_made.get(name, 0) + 1
        key = f"weft/comm/{name}/{count}"
        return cls.from_store(c10d._get_default_store(), rank, size, key)

    @classmethod
    def from_store(cls, store, rank, size, key="weft/comm"):
        """A communicator whose rank 0 puts the id in a torch.distributed Store under `key`."""
        if rank == 0:
            uid = weft.unique_id()
            store.set(key, uid)
        else:
            uid = bytes(store.get(key))
        comm = cls(size, uid, rank)
        handle_of(comm)
        return comm


_groups_made = {}


def comm_from_process_group(group=None):
    """Comm.from_process_group as a function."""
    return Comm.from_process_group(group)


_compressions = {}


def compression_ptr(text):
    """A weftCompression for `text` ("fp8e4m3:32", "e5m2:128:always", ...), parsed once; None for
    "default" (the communicator's own, WEFT_COMPRESS)."""
    if text == "default":
        return None
    c = _compressions.get(text)
    if c is None:
        c = Compression()
        check(lib.weftCompressionParse(text.encode(), ctypes.byref(c)))
        _compressions[text] = c
    return ctypes.byref(c)
