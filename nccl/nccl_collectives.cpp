// The NCCL interface's collectives (nccl_shim.cpp has the communicators): each checks its
// arguments as NCCL does, maps NCCL's types and operators to weft's (a PreMulSum's multiply done
// first), and runs weft's call with the communicator's device current. Their nccl* weak aliases
// are here too, beside the functions they alias.
#include <cstring>
#include <string>
#include <vector>

#include "nccl/premulsum.hpp"
#include "nccl/shim.hpp"

using namespace weft::nccl;  // NOLINT(google-build-using-namespace): this library's own helpers

namespace {

bool typeOf(ncclDataType_t t, weftDataType_t* out) {
  switch (t) {
    case ncclInt8:
      *out = weftInt8;
      return true;
    case ncclUint8:
      *out = weftUint8;
      return true;
    case ncclInt32:
      *out = weftInt32;
      return true;
    case ncclUint32:
      *out = weftUint32;
      return true;
    case ncclInt64:
      *out = weftInt64;
      return true;
    case ncclUint64:
      *out = weftUint64;
      return true;
    case ncclFloat16:
      *out = weftFloat16;
      return true;
    case ncclFloat32:
      *out = weftFloat32;
      return true;
    case ncclFloat64:
      *out = weftFloat64;
      return true;
    case ncclBfloat16:
      *out = weftBfloat16;
      return true;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 24, 0)  // fp8 types from 2.24
    case ncclFloat8e4m3:
      *out = weftFloat8e4m3;
      return true;
    case ncclFloat8e5m2:
      *out = weftFloat8e5m2;
      return true;
#endif
    default:
      return false;
  }
}

bool opOf(ncclRedOp_t op, weftRedOp_t* out) {
  switch (op) {
    case ncclSum:
      *out = weftSum;
      return true;
    case ncclProd:
      *out = weftProd;
      return true;
    case ncclMin:
      *out = weftMin;
      return true;
    case ncclMax:
      *out = weftMax;
      return true;
    case ncclAvg:
      *out = weftAvg;
      return true;
    default:
      return false;
  }
}

// The collective's arguments in weft's terms; false with the error set when one is bad.
bool prepare(ncclComm_t comm, ncclDataType_t type, const char* function, weftComm_t* w,
             weftDataType_t* t, ncclResult_t* err) {
  *w = ready(comm, function, err);
  if (*w == nullptr) return false;
  if (!typeOf(type, t)) {
    *err = refuse(ncclInvalidArgument,
                  std::string(function) + ": invalid datatype " + std::to_string(type));
    return false;
  }
  return true;
}

// A call's reduction: weft's operator, and the multiply before it for a PreMulSum operator.
struct Reduction {
  weftRedOp_t op = weftSum;
  bool premul = false;
  PreMulSum pre;
};

bool reduction(ncclComm_t comm, ncclRedOp_t op, ncclDataType_t type, const char* function,
               Reduction* r, ncclResult_t* err) {
  if (opOf(op, &r->op)) return true;
  const auto k = static_cast<std::size_t>(op) - static_cast<std::size_t>(ncclNumOps);
  if (static_cast<int>(op) >= static_cast<int>(ncclNumOps)) {
    std::lock_guard<std::mutex> lock(comm->opsMutex);
    if (k < comm->ops.size() && comm->ops[k].live) {
      if (comm->ops[k].type != type) {
        *err =
            refuse(ncclInvalidArgument, std::string(function) + ": operator " + std::to_string(op) +
                                            " was made for another datatype");
        return false;
      }
      r->op = weftSum;
      r->premul = true;
      r->pre = comm->ops[k];
      return true;
    }
  }
  *err = refuse(ncclInvalidArgument,
                std::string(function) + ": invalid reduction operation " + std::to_string(op));
  return false;
}

bool onGpu(const void* p) {
  cudaPointerAttributes a{};
  if (p == nullptr || cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

// Runs call(input) with `send` multiplied first where the reduction is a PreMulSum: into host
// scratch for host buffers, or into stream-ordered device scratch (freed on the stream after
// the call) for GPU buffers.
template <typename Call>
weftResult_t premultiplied(const Reduction& r, const void* send, std::size_t count,
                           weftDataType_t t, cudaStream_t stream, const char* function, Call call) {
  if (!r.premul || count == 0) return call(send);
  const std::size_t bytes = count * weftTypeSize(t);
  if (!onGpu(send)) {
    unsigned char scalar[8] = {};
    std::memcpy(scalar, r.pre.value, sizeof scalar);
    if (r.pre.device != nullptr &&
        cudaMemcpy(scalar, r.pre.device, weftTypeSize(t), cudaMemcpyDefault) != cudaSuccess) {
      (void)cudaGetLastError();
      remember(std::string(function) + ": reading the PreMulSum scalar failed");
      return weftSystemError;
    }
    std::vector<unsigned char> scaled(bytes);
    weft::nccl::scaleOnHost(scaled.data(), send, count, static_cast<weft::DataType>(t), scalar);
    return call(scaled.data());
  }
  void* scaled = nullptr;
  if (cudaError_t e = cudaMallocAsync(&scaled, bytes, stream); e != cudaSuccess) {
    (void)cudaGetLastError();
    remember(std::string(function) + ": scratch for the PreMulSum: " + cudaGetErrorString(e));
    return weftSystemError;
  }
  weftResult_t result = weftSuccess;
  if (cudaError_t e = weft::nccl::scaleOnDevice(scaled, send, count, static_cast<weft::DataType>(t),
                                                r.pre.device == nullptr ? r.pre.value : nullptr,
                                                r.pre.device, stream);
      e != cudaSuccess) {
    remember(std::string(function) + ": the PreMulSum multiply: " + cudaGetErrorString(e));
    result = weftSystemError;
  } else {
    result = call(scaled);
  }
  (void)cudaFreeAsync(scaled, stream);
  return result;
}

// A call on typed buffers that reduces nothing: its arguments checked, then call(comm, type) with
// the communicator's device current.
template <typename Call>
ncclResult_t typed(ncclComm_t comm, ncclDataType_t datatype, const char* function, Call call) {
  const Flight flight(comm);
  ncclResult_t err = ncclSuccess;
  weftComm_t w;
  weftDataType_t t;
  if (!prepare(comm, datatype, function, &w, &t, &err)) return err;
  return check(onDevice(comm, [&] { return call(w, t); }), function);
}

// A reducing collective: its arguments checked, a PreMulSum's multiply done first, then
// call(comm, input, type, op) with the communicator's device current. The input holds `count`
// elements, times the ranks where `perRank` (reduce-scatter's).
template <typename Call>
ncclResult_t reducing(ncclComm_t comm, const void* sendbuff, std::size_t count, bool perRank,
                      ncclDataType_t datatype, ncclRedOp_t op, cudaStream_t stream,
                      const char* function, Call call) {
  const Flight flight(comm);
  ncclResult_t err = ncclSuccess;
  weftComm_t w;
  weftDataType_t t;
  Reduction r;
  if (!prepare(comm, datatype, function, &w, &t, &err) ||
      !reduction(comm, op, datatype, function, &r, &err))
    return err;
  int n = 1;
  if (perRank) (void)weftCommCount(w, &n);
  const std::size_t inputCount = count * static_cast<std::size_t>(n);
  return check(onDevice(comm,
                        [&] {
                          return premultiplied(
                              r, sendbuff, inputCount, t, stream, function,
                              [&](const void* in) { return call(w, in, t, r.op); });
                        }),
               function);
}

}  // namespace

#if defined(WEFT_NCCL_HAS_Gather) || defined(WEFT_NCCL_HAS_Scatter)
namespace {

// Gather and scatter: the root's n receives (sends) and every rank's send (receive) to it, in
// one group, as NCCL documents them. `many` is the root's buffer of n pieces, `one` this rank's.
ncclResult_t rooted(bool gather, const void* sendbuff, void* recvbuff, size_t count,
                    ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream,
                    const char* function) {
  if (ncclResult_t r =
          deviceMemory(function, count, {{"sendbuff", sendbuff}, {"recvbuff", recvbuff}});
      r != ncclSuccess)
    return r;
  const Flight flight(comm);
  ncclResult_t err = ncclSuccess;
  weftComm_t w;
  weftDataType_t t;
  if (!prepare(comm, datatype, function, &w, &t, &err)) return err;
  int n = 0, me = 0;
  (void)weftCommCount(w, &n);
  (void)weftCommUserRank(w, &me);
  if (root < 0 || root >= n)
    return refuse(ncclInvalidArgument, std::string(function) + ": root " + std::to_string(root) +
                                           " of " + std::to_string(n) + " ranks");
  const size_t bytes = count * weftTypeSize(t);
  auto* many = static_cast<char*>(gather ? recvbuff : const_cast<void*>(sendbuff));
  void* one = gather ? const_cast<void*>(sendbuff) : recvbuff;
  return check(onDevice(comm,
                        [&] {
                          weftResult_t r = weftGroupStart();
                          if (r != weftSuccess) return r;
                          for (int q = 0; me == root && q < n && r == weftSuccess; ++q) {
                            r = gather ? weftRecv(many + q * bytes, count, t, q, w, stream)
                                       : weftSend(many + q * bytes, count, t, q, w, stream);
                          }
                          if (r == weftSuccess) {
                            r = gather ? weftSend(one, count, t, root, w, stream)
                                       : weftRecv(one, count, t, root, w, stream);
                          }
                          const weftResult_t end = weftGroupEnd();
                          return r != weftSuccess ? r : end;
                        }),
               function);
}

}  // namespace
#endif

extern "C" {

ncclResult_t pncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                       ncclScalarResidence_t residence, ncclComm_t comm) {
  weftDataType_t t;
  if (comm == nullptr || op == nullptr || scalar == nullptr)
    return refuse(ncclInvalidArgument, "ncclRedOpCreatePreMulSum: op, scalar or comm is NULL");
  if (!typeOf(datatype, &t))
    return refuse(ncclInvalidArgument,
                  "ncclRedOpCreatePreMulSum: invalid datatype " + std::to_string(datatype));
  if (residence != ncclScalarHostImmediate && residence != ncclScalarDevice)
    return refuse(ncclInvalidArgument,
                  "ncclRedOpCreatePreMulSum: invalid residence " + std::to_string(residence));
  PreMulSum p;
  p.live = true;
  p.type = datatype;
  if (residence == ncclScalarHostImmediate) {
    std::memcpy(p.value, scalar, weftTypeSize(t));
  } else {
    p.device = scalar;
  }
  std::lock_guard<std::mutex> lock(comm->opsMutex);
  std::size_t k = 0;
  while (k < comm->ops.size() && comm->ops[k].live) ++k;
  if (k == comm->ops.size()) comm->ops.push_back(p);
  comm->ops[k] = p;
  *op = static_cast<ncclRedOp_t>(static_cast<std::size_t>(ncclNumOps) + k);
  return ncclSuccess;
}

ncclResult_t pncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  if (comm == nullptr) return refuse(ncclInvalidArgument, "ncclRedOpDestroy: comm is NULL");
  const auto k = static_cast<std::size_t>(op) - static_cast<std::size_t>(ncclNumOps);
  std::lock_guard<std::mutex> lock(comm->opsMutex);
  if (static_cast<int>(op) < static_cast<int>(ncclNumOps) || k >= comm->ops.size() ||
      !comm->ops[k].live)
    return refuse(ncclInvalidArgument, "ncclRedOpDestroy: op " + std::to_string(op) +
                                           " was not created on this communicator");
  comm->ops[k].live = false;
  return ncclSuccess;
}

ncclResult_t pncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                            ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                            cudaStream_t stream) {
  if (ncclResult_t r =
          deviceMemory("ncclAllReduce", count, {{"sendbuff", sendbuff}, {"recvbuff", recvbuff}});
      r != ncclSuccess)
    return r;
  return reducing(comm, sendbuff, count, false, datatype, op, stream, "ncclAllReduce",
                  [&](weftComm_t w, const void* in, weftDataType_t t, weftRedOp_t o) {
                    return weftAllReduceEx(in, recvbuff, count, t, o, w, stream, nullptr);
                  });
}

ncclResult_t pncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                            ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  if (ncclResult_t r = deviceMemory("ncclAllGather", sendcount,
                                    {{"sendbuff", sendbuff}, {"recvbuff", recvbuff}});
      r != ncclSuccess)
    return r;
  return typed(comm, datatype, "ncclAllGather", [&](weftComm_t w, weftDataType_t t) {
    return weftAllGather(sendbuff, recvbuff, sendcount, t, w, stream);
  });
}

ncclResult_t pncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                cudaStream_t stream) {
  if (ncclResult_t r = deviceMemory("ncclReduceScatter", recvcount,
                                    {{"sendbuff", sendbuff}, {"recvbuff", recvbuff}});
      r != ncclSuccess)
    return r;
  return reducing(comm, sendbuff, recvcount, true, datatype, op, stream, "ncclReduceScatter",
                  [&](weftComm_t w, const void* in, weftDataType_t t, weftRedOp_t o) {
                    return weftReduceScatterEx(in, recvbuff, recvcount, t, o, w, stream, nullptr);
                  });
}

ncclResult_t pncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                            ncclDataType_t datatype, int root, ncclComm_t comm,
                            cudaStream_t stream) {
  if (ncclResult_t r =
          deviceMemory("ncclBroadcast", count, {{"sendbuff", sendbuff}, {"recvbuff", recvbuff}});
      r != ncclSuccess)
    return r;
  return typed(comm, datatype, "ncclBroadcast", [&](weftComm_t w, weftDataType_t t) {
    return weftBroadcast(sendbuff, recvbuff, count, t, root, w, stream);
  });
}

ncclResult_t pncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root,
                        ncclComm_t comm, cudaStream_t stream) {
  return pncclBroadcast(buff, buff, count, datatype, root, comm, stream);
}

ncclResult_t pncclReduce(const void* sendbuff, void* recvbuff, size_t count,
                         ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                         cudaStream_t stream) {
  if (ncclResult_t r =
          deviceMemory("ncclReduce", count, {{"sendbuff", sendbuff}, {"recvbuff", recvbuff}});
      r != ncclSuccess)
    return r;
  return reducing(comm, sendbuff, count, false, datatype, op, stream, "ncclReduce",
                  [&](weftComm_t w, const void* in, weftDataType_t t, weftRedOp_t o) {
                    return weftReduce(in, recvbuff, count, t, o, root, w, stream);
                  });
}

#if defined(WEFT_NCCL_HAS_AlltoAll)
ncclResult_t pncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  if (ncclResult_t r =
          deviceMemory("ncclAlltoAll", count, {{"sendbuff", sendbuff}, {"recvbuff", recvbuff}});
      r != ncclSuccess)
    return r;
  return typed(comm, datatype, "ncclAlltoAll", [&](weftComm_t w, weftDataType_t t) {
    return weftAllToAll(sendbuff, recvbuff, count, t, w, stream);
  });
}
#endif

ncclResult_t pncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                       ncclComm_t comm, cudaStream_t stream) {
  if (ncclResult_t r = deviceMemory("ncclSend", count, {{"sendbuff", sendbuff}}); r != ncclSuccess)
    return r;
  return typed(comm, datatype, "ncclSend", [&](weftComm_t w, weftDataType_t t) {
    return weftSend(sendbuff, count, t, peer, w, stream);
  });
}

ncclResult_t pncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                       ncclComm_t comm, cudaStream_t stream) {
  if (ncclResult_t r = deviceMemory("ncclRecv", count, {{"recvbuff", recvbuff}}); r != ncclSuccess)
    return r;
  return typed(comm, datatype, "ncclRecv", [&](weftComm_t w, weftDataType_t t) {
    return weftRecv(recvbuff, count, t, peer, w, stream);
  });
}

#if defined(WEFT_NCCL_HAS_Gather)
ncclResult_t pncclGather(const void* sendbuff, void* recvbuff, size_t count,
                         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream) {
  return rooted(true, sendbuff, recvbuff, count, datatype, root, comm, stream, "ncclGather");
}
#endif

#if defined(WEFT_NCCL_HAS_Scatter)
ncclResult_t pncclScatter(const void* sendbuff, void* recvbuff, size_t count,
                          ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream) {
  return rooted(false, sendbuff, recvbuff, count, datatype, root, comm, stream, "ncclScatter");
}
#endif

// The weak aliases: what programs built against nccl.h call.
ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t*, void*, ncclDataType_t, ncclScalarResidence_t,
                                      ncclComm_t) WEFT_NCCL_ALIAS(ncclRedOpCreatePreMulSum);
ncclResult_t ncclRedOpDestroy(ncclRedOp_t, ncclComm_t) WEFT_NCCL_ALIAS(ncclRedOpDestroy);
ncclResult_t ncclAllReduce(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                           cudaStream_t) WEFT_NCCL_ALIAS(ncclAllReduce);
ncclResult_t ncclAllGather(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t)
    WEFT_NCCL_ALIAS(ncclAllGather);
ncclResult_t ncclReduceScatter(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                               cudaStream_t) WEFT_NCCL_ALIAS(ncclReduceScatter);
ncclResult_t ncclBroadcast(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t,
                           cudaStream_t) WEFT_NCCL_ALIAS(ncclBroadcast);
ncclResult_t ncclBcast(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t)
    WEFT_NCCL_ALIAS(ncclBcast);
ncclResult_t ncclReduce(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t,
                        cudaStream_t) WEFT_NCCL_ALIAS(ncclReduce);
#if defined(WEFT_NCCL_HAS_AlltoAll)
ncclResult_t ncclAlltoAll(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t)
    WEFT_NCCL_ALIAS(ncclAlltoAll);
#endif
#if defined(WEFT_NCCL_HAS_Gather)
ncclResult_t ncclGather(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t)
    WEFT_NCCL_ALIAS(ncclGather);
#endif
#if defined(WEFT_NCCL_HAS_Scatter)
ncclResult_t ncclScatter(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t)
    WEFT_NCCL_ALIAS(ncclScatter);
#endif
ncclResult_t ncclSend(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t)
    WEFT_NCCL_ALIAS(ncclSend);
ncclResult_t ncclRecv(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t)
    WEFT_NCCL_ALIAS(ncclRecv);

}  // extern "C"
