"""A torch.distributed backend named "weft": a Python ProcessGroup whose collectives are weft's,
so that `dist.init_process_group("weft")` picks weft without the NCCL drop-in.

Every call runs at once, on the current CUDA stream of its tensors' device (or on the host for
CPU tensors), and returns a Work already done: its wait() makes the then current stream wait for
the call (an event recorded after it), its future holds the tensors (CUDA-aware, so callbacks and
DDP's comm hooks see them in stream order). async_op=True changes nothing but that.

Not supported: recv from any source, premul-sum, init_process_group(device_id=...) (PyTorch then
asks the group for a C++ backend it does not have). Tags are ignored (weft matches sends and
receives in order)."""

import torch
import torch.distributed as dist

from ._common import Comm, stream_of

_OPS = None


def _op(opts):
    global _OPS
    if _OPS is None:
        R = dist.ReduceOp
        _OPS = [(R.SUM, "sum"), (R.PRODUCT, "prod"), (R.MIN, "min"), (R.MAX, "max"),
                (R.AVG, "avg")]
    op = getattr(opts, "reduceOp", dist.ReduceOp.SUM) if opts is not None else dist.ReduceOp.SUM
    for red, name in _OPS:
        if op == red:
            return name
    raise ValueError(f"weft: reduce op {op} is not supported (sum, product, min, max, avg)")


class _Done(dist._Work):
    """A call already enqueued: wait() orders the current stream after it."""

    def __init__(self, tensors, result=None):
        super().__init__()
        cuda = [t for t in tensors if t.is_cuda]
        self._event = self._device = None
        if cuda:
            self._device = cuda[0].device
            self._event = torch.cuda.Event()
            self._event.record(torch.cuda.current_stream(self._device))
            devices = sorted({t.device.index for t in cuda})
            self._future = torch.futures.Future(devices=[torch.device("cuda", d) for d in devices])
        else:
            self._future = torch.futures.Future()
        self._future.set_result(tensors if result is None else result)

    def wait(self, timeout=None):
        if self._event is not None:
            torch.cuda.current_stream(self._device).wait_event(self._event)
        return True

    def is_completed(self):
        return True

    def get_future(self):
        return self._future


def _into(dst, fn):
    """fn on a contiguous buffer of dst's values, then the result written back if it was a copy."""
    if dst.is_contiguous():
        fn(dst)
    else:
        tmp = dst.contiguous()
        fn(tmp)
        dst.copy_(tmp)


def _flat(tensors):
    return torch.cat([t.reshape(-1) for t in tensors])


class ProcessGroupWeft(dist.ProcessGroup):
    """torch.distributed's collectives over one weft communicator of the group's ranks."""

    def __init__(self, store, rank, size, timeout=None):
        super().__init__(rank, size)
        self._comm = Comm.from_store(store, rank, size, "weft/backend")
        self._group_name = ""
        self._group_desc = ""

    @property
    def comm(self):
        """The weft communicator (weft.torch.Comm), for weft's own ops over the same ranks."""
        return self._comm

    # Names PyTorch asks of a group.
    def getBackendName(self):
        return "weft"

    def setGroupName(self, name):
        self._group_name = name

    def getGroupName(self):
        return self._group_name

    def setGroupDesc(self, desc):
        self._group_desc = desc

    def getGroupDesc(self):
        return self._group_desc

    def shutdown(self):
        self._comm.destroy()

    def abort(self):
        self._comm.abort()

    # Reductions.
    def allreduce(self, tensors, opts=None):
        op = _op(opts)
        for t in tensors:
            _into(t, lambda b: self._comm.all_reduce(b, op=op, stream=stream_of(b)))
        return _Done(tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def reduce(self, tensors, opts=None):
        op, root = _op(opts), opts.rootRank
        for t in tensors:
            _into(t, lambda b: self._comm.reduce(b, op=op, root=root, stream=stream_of(b)))
        return _Done(tensors)

    def _reduce_scatter_base(self, output, input, opts=None):
        op = _op(opts)
        src = input.contiguous()
        _into(output, lambda b: self._comm.reduce_scatter(src, b, op=op, stream=stream_of(b)))
        return _Done([output])

    reduce_scatter_single = _reduce_scatter_base

    def reduce_scatter(self, outputs, input_lists, opts=None):
        for out, inputs in zip(outputs, input_lists):
            self._reduce_scatter_base(out, _flat(inputs), opts)
        return _Done(outputs)

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        for out, inp in zip(outputs, inputs):
            self._reduce_scatter_base(out, inp, opts)
        return _Done(outputs)

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    # Gathers.
    def _allgather_base(self, output, input, opts=None):
        src = input.contiguous()
        _into(output, lambda b: self._comm.all_gather(src, b, stream=stream_of(b)))
        return _Done([output])

    all_gather_single = _allgather_base

    def allgather(self, output_lists, inputs, opts=None):
        for outs, inp in zip(output_lists, inputs):
            flat = inp.new_empty((len(outs) * inp.numel(),))
            self._allgather_base(flat, inp, opts)
            for part, out in zip(flat.chunk(len(outs)), outs):
                out.copy_(part.view_as(out))
        return _Done([t for outs in output_lists for t in outs])

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        for out, inp in zip(outputs, inputs):
            self._allgather_base(out, inp, opts)
        return _Done(outputs)

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    def gather(self, output_lists, inputs, opts=None):
        root = opts.rootRank
        inp = inputs[0]
        flat = inp.new_empty((self.size() * inp.numel(),))
        self._allgather_base(flat, inp, opts)
        if self.rank() == root:
            for part, out in zip(flat.chunk(self.size()), output_lists[0]):
                out.copy_(part.view_as(out))
        return _Done([inp])

    # Broadcasts and all-to-all.
    def broadcast(self, tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        for t in tensors:
            _into(t, lambda b: self._comm.broadcast(b, root=root, stream=stream_of(b)))
        return _Done(tensors)

    def scatter(self, outputs, input_lists, opts=None):
        root, out = opts.rootRank, outputs[0]
        if self.rank() == root:
            flat = _flat(input_lists[0])
        else:
            flat = out.new_empty((self.size() * out.numel(),))
        self._comm.broadcast(flat, root=root, stream=stream_of(flat))
        out.copy_(flat.chunk(self.size())[self.rank()].view_as(out))
        return _Done(outputs)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        src = input.contiguous()
        n = self.size()
        if not output_split_sizes and not input_split_sizes:
            _into(output, lambda b: self._comm.all_to_all(src, b, stream=stream_of(b)))
            return _Done([output])
        out_rows = list(output_split_sizes) or [output.shape[0] // n] * n
        in_rows = list(input_split_sizes) or [src.shape[0] // n] * n
        row = src[0].numel() if src.shape[0] else 0
        sc, rc = [r * row for r in in_rows], [r * row for r in out_rows]
        sd = [sum(sc[:q]) for q in range(n)]
        rd = [sum(rc[:q]) for q in range(n)]
        _into(output, lambda b: self._comm.all_to_all_v(src, sc, sd, b, rc, rd,
                                                        stream=stream_of(b)))
        return _Done([output])

    all_to_all_single = alltoall_base

    def alltoall(self, outputs, inputs, opts=None):
        n = self.size()
        src = _flat(inputs)
        sc = [t.numel() for t in inputs]
        rc = [t.numel() for t in outputs]
        flat = src.new_empty((sum(rc),))
        self._comm.all_to_all_v(src, sc, [sum(sc[:q]) for q in range(n)], flat, rc,
                                [sum(rc[:q]) for q in range(n)], stream=stream_of(src))
        for part, out in zip(flat.split(rc), outputs):
            out.copy_(part.view_as(out))
        return _Done(outputs)

    # Point to point and barrier.
    def send(self, tensors, dst, tag=0):
        for t in tensors:
            self._comm.send(t.contiguous(), dst, stream=stream_of(t))
        return _Done(tensors)

    def recv(self, tensors, src, tag=0):
        for t in tensors:
            _into(t, lambda b: self._comm.recv(b, src, stream=stream_of(b)))
        return _Done(tensors)

    def recv_anysource(self, tensors, tag=0):
        raise RuntimeError("weft: recv from any source is not supported (name the source rank)")

    def barrier(self, opts=None):
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.current_stream().synchronize()  # the calls before it, done
        self._comm.barrier()
        return _Done([])


def _create(store, rank, size, timeout):
    return ProcessGroupWeft(store, rank, size, timeout)


def register_backend(name="weft"):
    """Registers the backend with torch.distributed (once; later calls do nothing), for CUDA
    and CPU tensors: then dist.init_process_group(name) or dist.new_group(backend=name)."""
    if getattr(dist.Backend, name.upper(), None) is None:
        dist.Backend.register_backend(name, _create, devices=["cuda", "cpu"])
