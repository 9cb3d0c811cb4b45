// libweft_nccl.so: NCCL's C API over weft, so a program built against nccl.h (PyTorch's
// ProcessGroupNCCL, nccl-tests) runs on weft unchanged: its SONAME is libnccl.so.2, every pncclX
// of the nccl.h it was built against (2.19 to 2.28; nccl/shim.hpp) is the function and ncclX a
// weak alias of it (as NCCL exports them, so a profiler may interpose either). What weft does not
// do yet returns ncclInvalidUsage with a message naming the function (ncclGetLastError), never a
// silent success. The device API's host functions are in nccl_device_api.cpp.
#include <cstdio>
#include <cstring>

#include "nccl/premulsum.hpp"
#include "nccl/shim.hpp"
#include "src/core/log.hpp"

using namespace weft::nccl;  // NOLINT(google-build-using-namespace): this library's own helpers

namespace weft::nccl {
namespace {
std::mutex gErrorMutex;
std::string gError;
}  // namespace

void remember(const std::string& message) {
  std::lock_guard<std::mutex> lock(gErrorMutex);
  gError = message;
}

std::string lastError() {
  std::lock_guard<std::mutex> lock(gErrorMutex);
  return gError;
}

ncclResult_t fromWeft(weftResult_t r) {
  switch (r) {
    case weftSuccess:
      return ncclSuccess;
    case weftInvalidArgument:
      return ncclInvalidArgument;
    case weftInvalidUsage:
    case weftUnsupported:
      return ncclInvalidUsage;
    case weftSystemError:
      return ncclSystemError;
    case weftRemoteError:
    case weftTimeout:  // a peer that never answered: what NCCL reports as a remote failure
      return ncclRemoteError;
    case weftInProgress:
      return ncclInProgress;
    default:
      return ncclInternalError;
  }
}

// Passes a weft result through, keeping its message for ncclGetLastError.
ncclResult_t check(weftResult_t r, const char* function) {
  if (r != weftSuccess) remember(std::string(function) + ": " + weftGetLastError());
  return fromWeft(r);
}

// A failure of the interface itself, printed at WARN where it happens (weft's own failures are
// printed by libweft) and kept for ncclGetLastError.
ncclResult_t refuse(ncclResult_t code, const std::string& message) {
  weftLogLine(static_cast<int>(weft::log::Level::warn), weft::log::kAll, message.c_str());
  remember(message);
  return code;
}

ncclResult_t unsupported(const char* function, const char* why) {
  return refuse(ncclInvalidUsage,
                std::string(function) + " is not supported by weft's NCCL interface yet: " + why);
}

weftComm_t ready(ncclComm_t comm, const char* function, ncclResult_t* err) {
  if (comm == nullptr) {
    *err = refuse(ncclInvalidArgument, std::string(function) + ": comm is NULL");
    return nullptr;
  }
  const int state = comm->state.load();
  if (state == ncclInProgress) {
    *err = refuse(ncclInProgress, std::string(function) +
                                      ": the communicator is still being "
                                      "initialized (ncclCommGetAsyncError)");
    return nullptr;
  }
  if (comm->weft == nullptr) {
    *err = refuse(state != ncclSuccess ? static_cast<ncclResult_t>(state) : ncclInvalidUsage,
                  std::string(function) + ": the communicator's init failed: " + comm->initError);
    return nullptr;
  }
  return comm->weft;
}

}  // namespace weft::nccl

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

// Checks a config by its size, magic and version fields, as NCCL does; fills `blocking`.
ncclResult_t readConfig(const ncclConfig_t* config, const char* function, bool* blocking) {
  *blocking = true;
  if (config == nullptr) return ncclSuccess;
  if (config->magic != 0xcafebeef || config->size < offsetof(ncclConfig_t, blocking) + sizeof(int))
    return refuse(ncclInvalidArgument,
                  std::string(function) + ": the config was not made with NCCL_CONFIG_INITIALIZER");
  if (config->blocking != NCCL_CONFIG_UNDEF_INT) *blocking = config->blocking != 0;
  return ncclSuccess;
}

ncclResult_t initRank(ncclComm_t* out, int nranks, const ncclUniqueId& id, int rank,
                      const ncclConfig_t* config, const char* function) {
  static_assert(sizeof(ncclUniqueId) == sizeof(weftUniqueId), "unique ids of one size");
  if (out == nullptr) return refuse(ncclInvalidArgument, std::string(function) + ": comm is NULL");
  bool blocking = true;
  if (ncclResult_t r = readConfig(config, function, &blocking); r != ncclSuccess) return r;
  int device = -1;
  if (ncclResult_t r = callerDevice(function, &device); r != ncclSuccess) return r;
  auto* c = new ncclComm();
  c->device = device;
  weftUniqueId wid;
  std::memcpy(&wid, &id, sizeof wid);
  auto join = [c, nranks, wid, rank, function] {
    // The init thread works on the caller's device, as every later call will.
    if (c->device >= 0) (void)cudaSetDevice(c->device);
    const weftResult_t r = weftCommInitRank(&c->weft, nranks, wid, rank);
    if (r != weftSuccess) {
      c->initError = weftGetLastError();
      remember(std::string(function) + ": " + c->initError);
    }
    c->state.store(fromWeft(r));
  };
  *out = c;
  if (blocking) {
    join();
    if (c->weft == nullptr) {
      const auto r = static_cast<ncclResult_t>(c->state.load());
      delete c;
      *out = nullptr;
      return r;
    }
    return ncclSuccess;
  }
  c->state.store(ncclInProgress);
  c->init = std::thread(join);
  return ncclInProgress;
}

// Runs `call` with the communicator's device current (NCCL does its work there), restoring
// the caller's.
template <typename Call>
weftResult_t onDevice(ncclComm_t comm, Call call) {
  int current = -1;
  const bool switched = comm->device >= 0 && cudaGetDevice(&current) == cudaSuccess &&
                        current != comm->device && cudaSetDevice(comm->device) == cudaSuccess;
  (void)cudaGetLastError();
  const weftResult_t r = call();
  if (switched) (void)cudaSetDevice(current);
  return r;
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

ncclResult_t pncclGetVersion(int* version) {
  if (version == nullptr) return refuse(ncclInvalidArgument, "ncclGetVersion: version is NULL");
  // The version of the nccl.h this was built against, so frameworks' version gates take the
  // paths of the API it defines, with weft's own patch level.
  *version = NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, WEFT_VERSION_PATCH);
  return ncclSuccess;
}

const char* pncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
      return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
      return "internal error - please report this issue to the weft developers";
    case ncclInvalidArgument:
      return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
      return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
    default:
      return "unknown result code";
  }
}

const char* pncclGetLastError(ncclComm_t) {
  // A copy per thread, so the pointer stays valid while other threads fail.
  thread_local std::string copy;
  copy = lastError();
  return copy.c_str();
}

ncclResult_t pncclGetUniqueId(ncclUniqueId* uniqueId) {
  if (uniqueId == nullptr) return refuse(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
  weftUniqueId id;
  const weftResult_t r = weftGetUniqueId(&id);
  if (r == weftSuccess) std::memcpy(uniqueId, &id, sizeof id);
  return check(r, "ncclGetUniqueId");
}

ncclResult_t pncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  return initRank(comm, nranks, commId, rank, nullptr, "ncclCommInitRank");
}

ncclResult_t pncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                     ncclConfig_t* config) {
  return initRank(comm, nranks, commId, rank, config, "ncclCommInitRankConfig");
}

#if defined(WEFT_NCCL_HAS_CommInitRankScalable)
ncclResult_t pncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                       ncclUniqueId* commIds, ncclConfig_t* config) {
  // Several ids spread NCCL's bootstrap; weft's rendezvous needs one: the first.
  if (nId < 1 || commIds == nullptr)
    return refuse(ncclInvalidArgument, "ncclCommInitRankScalable: no unique id given");
  return initRank(newcomm, nranks, commIds[0], myrank, config, "ncclCommInitRankScalable");
}
#endif

ncclResult_t pncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  if (comms == nullptr || ndev < 1)
    return refuse(ncclInvalidArgument, "ncclCommInitAll: comms is NULL or ndev < 1");
  int devices = 0;
  if (ncclResult_t r = deviceCount("ncclCommInitAll", &devices); r != ncclSuccess) return r;
  // Every rank in this process, rank i on devlist[i] (or device i). As with NCCL, one thread
  // may drive them all inside ncclGroupStart/End (weft runs each communicator's part of a group
  // on a thread of its own); outside a group each rank's calls need their own thread.
  std::vector<weftComm_t> weftComms(static_cast<std::size_t>(ndev));
  const weftResult_t r = weftCommInitAll(weftComms.data(), ndev);
  if (r != weftSuccess) return check(r, "ncclCommInitAll");
  for (int i = 0; i < ndev; ++i) {
    auto* c = new ncclComm();
    c->weft = weftComms[static_cast<std::size_t>(i)];
    c->device = devlist != nullptr ? devlist[i] : i;
    comms[i] = c;
  }
  return ncclSuccess;
}

ncclResult_t pncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                            ncclConfig_t* config) {
  const Flight flight(comm);
  ncclResult_t err = ncclSuccess;
  weftComm_t w = ready(comm, "ncclCommSplit", &err);
  if (w == nullptr) return err;
  if (newcomm == nullptr) return refuse(ncclInvalidArgument, "ncclCommSplit: newcomm is NULL");
  bool blocking = true;
  if (ncclResult_t r = readConfig(config, "ncclCommSplit", &blocking); r != ncclSuccess) return r;
  // A split is collective and quick: done before returning even where non-blocking was asked.
  weftComm_t child = nullptr;
  const weftResult_t r =
      weftCommSplit(w, color == NCCL_SPLIT_NOCOLOR ? WEFT_SPLIT_NOCOLOR : color, key, &child);
  if (r != weftSuccess) return check(r, "ncclCommSplit");
  if (child == nullptr) {
    *newcomm = nullptr;
    return ncclSuccess;
  }
  auto* c = new ncclComm();
  c->weft = child;
  c->device = comm->device;
  *newcomm = c;
  return ncclSuccess;
}

ncclResult_t pncclCommFinalize(ncclComm_t comm) {
  // weft's calls need no flushing beyond their streams: the communicator stays usable for
  // destroy. A non-blocking init still running is waited for.
  if (comm == nullptr) return refuse(ncclInvalidArgument, "ncclCommFinalize: comm is NULL");
  if (comm->init.joinable()) comm->init.join();
  return ncclSuccess;
}

ncclResult_t pncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  if (comm->init.joinable()) comm->init.join();
  const weftResult_t r = comm->weft != nullptr ? weftCommDestroy(comm->weft) : weftSuccess;
  delete comm;
  return check(r, "ncclCommDestroy");
}

ncclResult_t pncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  if (comm->init.joinable()) comm->init.join();
  weftResult_t r = weftSuccess;
  if (comm->weft != nullptr) {
    // Every rank's current and later calls end with an error; this handle's own are waited
    // for before it is freed (NCCL's abort may come from another thread mid-call).
    r = weftCommAbort(comm->weft);
    while (comm->inflight.load() != 0) std::this_thread::yield();
    const weftResult_t d = weftCommDestroy(comm->weft);
    if (r == weftSuccess) r = d;
  }
  delete comm;
  return check(r, "ncclCommAbort");
}

#if defined(WEFT_NCCL_HAS_CommRevoke)
ncclResult_t pncclCommRevoke(ncclComm_t, int) {
  return unsupported("ncclCommRevoke", "use ncclCommAbort");
}
#endif

#if defined(WEFT_NCCL_HAS_CommShrink)
ncclResult_t pncclCommShrink(ncclComm_t, int*, int, ncclComm_t*, ncclConfig_t*, int) {
  return unsupported("ncclCommShrink",
                     "use ncclCommSplit with the excluded ranks' color "
                     "NCCL_SPLIT_NOCOLOR");
}
#endif

ncclResult_t pncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  if (comm == nullptr || asyncError == nullptr)
    return refuse(ncclInvalidArgument, "ncclCommGetAsyncError: comm or asyncError is NULL");
  const int state = comm->state.load();
  if (state != ncclSuccess || comm->weft == nullptr) {
    *asyncError = static_cast<ncclResult_t>(state);
    return ncclSuccess;
  }
  weftResult_t async = weftSuccess;
  const weftResult_t r = weftCommGetAsyncError(comm->weft, &async);
  if (r != weftSuccess) return check(r, "ncclCommGetAsyncError");
  if (async != weftSuccess) remember(std::string("async error: ") + weftGetLastError());
  *asyncError = fromWeft(async);
  return ncclSuccess;
}

ncclResult_t pncclCommCount(const ncclComm_t comm, int* count) {
  const Flight flight(comm);
  ncclResult_t err = ncclSuccess;
  weftComm_t w = ready(comm, "ncclCommCount", &err);
  return w == nullptr ? err : check(weftCommCount(w, count), "ncclCommCount");
}

ncclResult_t pncclCommCuDevice(const ncclComm_t comm, int* device) {
  if (comm == nullptr || device == nullptr)
    return refuse(ncclInvalidArgument, "ncclCommCuDevice: comm or device is NULL");
  *device = comm->device;
  return ncclSuccess;
}

ncclResult_t pncclCommUserRank(const ncclComm_t comm, int* rank) {
  const Flight flight(comm);
  ncclResult_t err = ncclSuccess;
  weftComm_t w = ready(comm, "ncclCommUserRank", &err);
  return w == nullptr ? err : check(weftCommUserRank(w, rank), "ncclCommUserRank");
}

ncclResult_t pncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle) {
  const Flight flight(comm);
  ncclResult_t err = ncclSuccess;
  weftComm_t w = ready(comm, "ncclCommRegister", &err);
  if (w == nullptr) return err;
  return check(onDevice(comm, [&] { return weftCommRegister(w, buff, size, handle); }),
               "ncclCommRegister");
}

ncclResult_t pncclCommDeregister(const ncclComm_t comm, void* handle) {
  const Flight flight(comm);
  ncclResult_t err = ncclSuccess;
  weftComm_t w = ready(comm, "ncclCommDeregister", &err);
  return w == nullptr ? err : check(weftCommDeregister(w, handle), "ncclCommDeregister");
}

#if defined(WEFT_NCCL_HAS_CommWindowRegister)
ncclResult_t pncclCommWindowRegister(ncclComm_t, void*, size_t, ncclWindow_t*, int) {
  return unsupported("ncclCommWindowRegister", "symmetric windows (use ncclCommRegister)");
}
#endif

#if defined(WEFT_NCCL_HAS_CommWindowDeregister)
ncclResult_t pncclCommWindowDeregister(ncclComm_t, ncclWindow_t) {
  return unsupported("ncclCommWindowDeregister", "symmetric windows (use ncclCommDeregister)");
}
#endif

ncclResult_t pncclMemAlloc(void** ptr, size_t size) {
  if (ptr == nullptr) return refuse(ncclInvalidArgument, "ncclMemAlloc: ptr is NULL");
  if (cudaError_t e = cudaMalloc(ptr, size); e != cudaSuccess) {
    (void)cudaGetLastError();
    return refuse(ncclUnhandledCudaError,
                  std::string("ncclMemAlloc: cudaMalloc failed: ") + cudaGetErrorString(e));
  }
  return ncclSuccess;
}

ncclResult_t pncclMemFree(void* ptr) {
  if (cudaError_t e = cudaFree(ptr); e != cudaSuccess) {
    (void)cudaGetLastError();
    return refuse(ncclUnhandledCudaError,
                  std::string("ncclMemFree: cudaFree failed: ") + cudaGetErrorString(e));
  }
  return ncclSuccess;
}

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
                    return weftAllReduce(in, recvbuff, count, t, o, w, stream);
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
                    return weftReduceScatter(in, recvbuff, recvcount, t, o, w, stream);
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

ncclResult_t pncclGroupStart() {
  return check(weftGroupStart(), "ncclGroupStart");
}

ncclResult_t pncclGroupEnd() {
  return check(weftGroupEnd(), "ncclGroupEnd");
}

#if defined(WEFT_NCCL_HAS_GroupSimulateEnd)
ncclResult_t pncclGroupSimulateEnd(ncclSimInfo_t*) {
  return unsupported("ncclGroupSimulateEnd", "weft-plan tune prices calls without running them");
}
#endif

#if defined(WEFT_NCCL_HAS_ResetDebugInit)
// NCCL_DEBUG is read at every communicator's creation: there is no state to reset.
void pncclResetDebugInit() {}

#endif

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
ncclResult_t ncclGetVersion(int*) WEFT_NCCL_ALIAS(ncclGetVersion);
const char* ncclGetErrorString(ncclResult_t) WEFT_NCCL_ALIAS(ncclGetErrorString);
const char* ncclGetLastError(ncclComm_t) WEFT_NCCL_ALIAS(ncclGetLastError);
ncclResult_t ncclGetUniqueId(ncclUniqueId*) WEFT_NCCL_ALIAS(ncclGetUniqueId);
ncclResult_t ncclCommInitRank(ncclComm_t*, int, ncclUniqueId, int)
    WEFT_NCCL_ALIAS(ncclCommInitRank);
ncclResult_t ncclCommInitRankConfig(ncclComm_t*, int, ncclUniqueId, int, ncclConfig_t*)
    WEFT_NCCL_ALIAS(ncclCommInitRankConfig);
#if defined(WEFT_NCCL_HAS_CommInitRankScalable)
ncclResult_t ncclCommInitRankScalable(ncclComm_t*, int, int, int, ncclUniqueId*, ncclConfig_t*)
    WEFT_NCCL_ALIAS(ncclCommInitRankScalable);
#endif
ncclResult_t ncclCommInitAll(ncclComm_t*, int, const int*) WEFT_NCCL_ALIAS(ncclCommInitAll);
ncclResult_t ncclCommSplit(ncclComm_t, int, int, ncclComm_t*, ncclConfig_t*)
    WEFT_NCCL_ALIAS(ncclCommSplit);
ncclResult_t ncclCommFinalize(ncclComm_t) WEFT_NCCL_ALIAS(ncclCommFinalize);
ncclResult_t ncclCommDestroy(ncclComm_t) WEFT_NCCL_ALIAS(ncclCommDestroy);
ncclResult_t ncclCommAbort(ncclComm_t) WEFT_NCCL_ALIAS(ncclCommAbort);
#if defined(WEFT_NCCL_HAS_CommRevoke)
ncclResult_t ncclCommRevoke(ncclComm_t, int) WEFT_NCCL_ALIAS(ncclCommRevoke);
#endif
#if defined(WEFT_NCCL_HAS_CommShrink)
ncclResult_t ncclCommShrink(ncclComm_t, int*, int, ncclComm_t*, ncclConfig_t*, int)
    WEFT_NCCL_ALIAS(ncclCommShrink);
#endif
ncclResult_t ncclCommGetAsyncError(ncclComm_t, ncclResult_t*)
    WEFT_NCCL_ALIAS(ncclCommGetAsyncError);
ncclResult_t ncclCommCount(const ncclComm_t, int*) WEFT_NCCL_ALIAS(ncclCommCount);
ncclResult_t ncclCommCuDevice(const ncclComm_t, int*) WEFT_NCCL_ALIAS(ncclCommCuDevice);
ncclResult_t ncclCommUserRank(const ncclComm_t, int*) WEFT_NCCL_ALIAS(ncclCommUserRank);
ncclResult_t ncclCommRegister(const ncclComm_t, void*, size_t, void**)
    WEFT_NCCL_ALIAS(ncclCommRegister);
ncclResult_t ncclCommDeregister(const ncclComm_t, void*) WEFT_NCCL_ALIAS(ncclCommDeregister);
#if defined(WEFT_NCCL_HAS_CommWindowRegister)
ncclResult_t ncclCommWindowRegister(ncclComm_t, void*, size_t, ncclWindow_t*, int)
    WEFT_NCCL_ALIAS(ncclCommWindowRegister);
#endif
#if defined(WEFT_NCCL_HAS_CommWindowDeregister)
ncclResult_t ncclCommWindowDeregister(ncclComm_t, ncclWindow_t)
    WEFT_NCCL_ALIAS(ncclCommWindowDeregister);
#endif
ncclResult_t ncclMemAlloc(void**, size_t) WEFT_NCCL_ALIAS(ncclMemAlloc);
ncclResult_t ncclMemFree(void*) WEFT_NCCL_ALIAS(ncclMemFree);
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
ncclResult_t ncclGroupStart() WEFT_NCCL_ALIAS(ncclGroupStart);
ncclResult_t ncclGroupEnd() WEFT_NCCL_ALIAS(ncclGroupEnd);
#if defined(WEFT_NCCL_HAS_GroupSimulateEnd)
ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t*) WEFT_NCCL_ALIAS(ncclGroupSimulateEnd);
#endif
#if defined(WEFT_NCCL_HAS_ResetDebugInit)
void ncclResetDebugInit() WEFT_NCCL_ALIAS(ncclResetDebugInit);
// NCCL exports this internal name too (no pnccl twin).
void ncclResetDebugInitInternal() __attribute__((weak, alias("pncclResetDebugInit")));
#endif

}  // extern "C"
