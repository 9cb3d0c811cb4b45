// libweft_nccl.so: NCCL's C API over weft, so a program built against nccl.h (PyTorch's
// ProcessGroupNCCL, nccl-tests) runs on weft unchanged: its SONAME is libnccl.so.2, every pncclX
// of the nccl.h it was built against (2.19 to 2.28; nccl/shim.hpp) is the function and ncclX a
// weak alias of it (as NCCL exports them, so a profiler may interpose either). What weft does not
// do yet returns ncclInvalidUsage with a message naming the function (ncclGetLastError), never a
// silent success. Here: errors, communicators, registration and groups; the collectives are in
// nccl_collectives.cpp, the device-memory checks in device_checks.cpp, the device API's host
// functions in nccl_device_api.cpp.
#include <cstdio>
#include <cstring>

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

}  // namespace

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
