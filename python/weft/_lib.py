"""libweft through ctypes: finding the library, its C types, and its errors as exceptions."""

import ctypes
import ctypes.util
import os

_HERE = os.path.dirname(os.path.abspath(__file__))


def _candidates():
    explicit = os.environ.get("WEFT_LIBRARY")
    if explicit:
        yield explicit
        return
    # Installed: <prefix>/lib[/<multiarch>]/python3/dist-packages/weft beside <prefix>/lib[...].
    for up in (3, 4):
        yield os.path.normpath(os.path.join(_HERE, *([".."] * up), "libweft.so.0"))
    # The build tree: python/weft beside build/lib.
    yield os.path.normpath(os.path.join(_HERE, "..", "..", "build", "lib", "libweft.so.0"))
    yield ctypes.util.find_library("weft") or "libweft.so.0"


def _load():
    tried = []
    for path in _candidates():
        if os.path.sep in path and not os.path.exists(path):
            tried.append(path)
            continue
        try:
            return ctypes.CDLL(path)
        except OSError as e:
            tried.append(f"{path} ({e})")
    raise ImportError("weft: libweft.so.0 not found (set WEFT_LIBRARY); tried " + ", ".join(tried))


lib = _load()

# weft/types.h
DTYPES = {
    "float64": 0, "float32": 1, "float16": 2, "bfloat16": 3, "float8_e4m3": 4, "float8_e5m2": 5,
    "int8": 6, "uint8": 7, "int32": 8, "uint32": 9, "int64": 10, "uint64": 11,
}
ITEMSIZE = {0: 8, 1: 4, 2: 2, 3: 2, 4: 1, 5: 1, 6: 1, 7: 1, 8: 4, 9: 4, 10: 8, 11: 8}
OPS = {"sum": 0, "prod": 1, "min": 2, "max": 3, "avg": 4}
RESULTS = ["success", "invalid argument", "invalid usage", "system error", "internal error",
           "remote error", "timeout", "unsupported", "in progress"]
_P, _S, _I = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


class MoeDispatchArgs(ctypes.Structure):
    _fields_ = [
        ("x", ctypes.c_void_p), ("topkIdx", ctypes.c_void_p), ("topkWeights", ctypes.c_void_p),
        ("tokens", ctypes.c_size_t), ("hidden", ctypes.c_size_t), ("topk", ctypes.c_int),
        ("experts", ctypes.c_int), ("datatype", ctypes.c_int), ("recvX", ctypes.c_void_p),
        ("capacity", ctypes.c_size_t), ("expertCounts", ctypes.c_void_p),
        ("recvSource", ctypes.c_void_p), ("fp8Dispatch", ctypes.c_int),
        ("recvScales", ctypes.c_void_p),
    ]


# weft.h's compressed collectives, tensor-parallel GEMMs and ring attention.
class Compression(ctypes.Structure):
    _fields_ = [("format", _I), ("scale", _I), ("block", _I), ("always", _I)]


class TpFp8(ctypes.Structure):
    _fields_ = [("output", _I), ("aScale", _P), ("bScale", _P), ("scaling", _I),
                ("aScaleGathered", _P)]


class Attention(ctypes.Structure):
    _fields_ = [
        ("q", _P), ("k", _P), ("v", _P), ("out", _P), ("lse", _P), ("cuSeqlens", _P),
        ("sequences", _I), ("tokens", _S), ("maxSeqlen", _S), ("heads", _I), ("kvHeads", _I),
        ("headDim", _I), ("datatype", _I), ("causal", _I), ("softmaxScale", ctypes.c_float),
    ]


class AttentionGrads(ctypes.Structure):
    _fields_ = [("dOut", _P), ("dq", _P), ("dk", _P), ("dv", _P)]


class WeftError(RuntimeError):
    """A weft call's failure: `code` (weftResult_t) and weft's message for it."""

    def __init__(self, code, message):
        self.code = code
        name = RESULTS[code] if 0 <= code < len(RESULTS) else f"result {code}"
        super().__init__(f"{message} ({name})" if message else name)


_PI32 = ctypes.POINTER(ctypes.c_int32)
_SIGNATURES = {
    "weftGetLastError": (ctypes.c_char_p, []),
    "weftGetVersion": (_I, [ctypes.POINTER(_I)]),
    "weftGetUniqueId": (_I, [ctypes.POINTER(UniqueId)]),
    "weftCommInitRank": (_I, [ctypes.POINTER(_P), _I, UniqueId, _I]),
    "weftCommInitAll": (_I, [ctypes.POINTER(_P), _I]),
    "weftCommSplit": (_I, [_P, _I, _I, ctypes.POINTER(_P)]),
    "weftCommDestroy": (_I, [_P]),
    "weftCommAbort": (_I, [_P]),
    "weftCommCount": (_I, [_P, ctypes.POINTER(_I)]),
    "weftCommUserRank": (_I, [_P, ctypes.POINTER(_I)]),
    "weftCommGetAsyncError": (_I, [_P, ctypes.POINTER(_I)]),
    "weftAllReduce": (_I, [_P, _P, _S, _I, _I, _P, _P]),
    "weftAllGather": (_I, [_P, _P, _S, _I, _P, _P]),
    "weftReduceScatter": (_I, [_P, _P, _S, _I, _I, _P, _P]),
    "weftBroadcast": (_I, [_P, _P, _S, _I, _I, _P, _P]),
    "weftReduce": (_I, [_P, _P, _S, _I, _I, _I, _P, _P]),
    "weftAllToAll": (_I, [_P, _P, _S, _I, _P, _P]),
    "weftAllToAllv": (_I, [_P, ctypes.POINTER(_S), ctypes.POINTER(_S), _P, ctypes.POINTER(_S),
                           ctypes.POINTER(_S), _I, _P, _P]),
    "weftSend": (_I, [_P, _S, _I, _I, _P, _P]),
    "weftRecv": (_I, [_P, _S, _I, _I, _P, _P]),
    "weftBarrier": (_I, [_P, _P]),
    "weftGroupStart": (_I, []),
    "weftGroupEnd": (_I, []),
    "weftMoeDispatch": (_I, [ctypes.POINTER(MoeDispatchArgs), ctypes.POINTER(_P), _P, _P]),
    "weftMoeRows": (_I, [_P, ctypes.POINTER(_S)]),
    "weftMoeCombine": (_I, [_P, _P, _P, _P, _P]),
    "weftMoeHandleDestroy": (_I, [_P]),
    "weftGetErrorString": (ctypes.c_char_p, [_I]),
    "weftTypeSize": (_S, [_I]),
    "weftCommDevice": (_I, [_P, ctypes.POINTER(_I)]),
    "weftCommSummary": (ctypes.c_char_p, [_P]),
    "weftCommPlan": (_I, [_P, _I, _S, _I, ctypes.c_char_p, _S]),
    "weftCommRegister": (_I, [_P, _P, _S, ctypes.POINTER(_P)]),
    "weftCommDeregister": (_I, [_P, _P]),
    "weftCompressionParse": (_I, [ctypes.c_char_p, ctypes.POINTER(Compression)]),
    "weftCommSetCompression": (_I, [_P, ctypes.POINTER(Compression)]),
    "weftCommGetCompression": (_I, [_P, ctypes.POINTER(Compression)]),
    "weftAllReduceEx": (_I, [_P, _P, _S, _I, _I, _P, _P, ctypes.POINTER(Compression)]),
    "weftReduceScatterEx": (_I, [_P, _P, _S, _I, _I, _P, _P, ctypes.POINTER(Compression)]),
    "weftAllGatherEx": (_I, [_P, _P, _S, _I, _P, _P, ctypes.POINTER(Compression)]),
    "weftCommPlanEx": (_I, [_P, _I, _S, _I, _I, ctypes.POINTER(Compression), ctypes.c_char_p,
                            _S]),
    "weftAllGatherGemm": (_I, [_P, _P, _P, _P, _P, _S, _S, _S, _I, _P, _S, _P, _P]),
    "weftGemmReduceScatter": (_I, [_P, _P, _P, _P, _S, _S, _S, _I, _P, _S, _P, _P]),
    "weftAllGatherGemmFp8": (_I, [_P, _P, _P, _P, _P, _S, _S, _S, _I, ctypes.POINTER(TpFp8), _P,
                                  _S, _P, _P]),
    "weftGemmReduceScatterFp8": (_I, [_P, _P, _P, _P, _S, _S, _S, _I, ctypes.POINTER(TpFp8), _P,
                                      _S, _P, _P]),
    "weftTpWorkspaceSize": (_I, [_P, _I, _S, _S, _S, _I, ctypes.POINTER(_S)]),
    "weftTpPlan": (_I, [_P, _I, _S, _S, _S, _I, ctypes.c_char_p, _S]),
    "weftRingAttention": (_I, [ctypes.POINTER(Attention), _P, _S, _P, _P]),
    "weftRingAttentionWorkspaceSize": (_I, [ctypes.POINTER(Attention), _P, ctypes.POINTER(_S)]),
    "weftRingAttentionBackward": (_I, [ctypes.POINTER(Attention), ctypes.POINTER(AttentionGrads),
                                       _P, _S, _P, _P]),
    "weftRingAttentionBackwardWorkspaceSize": (_I, [ctypes.POINTER(Attention), _P,
                                                    ctypes.POINTER(_S)]),
    "weftZigzagLocal": (_I, [_PI32, _I, _I, _I, _PI32, _PI32]),
}
for _name, (_res, _args) in _SIGNATURES.items():
    _f = getattr(lib, _name)
    _f.restype, _f.argtypes = _res, _args


def check(result):
    """Raises WeftError for a failed call, with weft's message for it (read at once: it is the
    calling thread's last)."""
    if result != 0:
        message = lib.weftGetLastError()
        raise WeftError(result, message.decode(errors="replace") if message else "")
