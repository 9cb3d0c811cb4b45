// What the NCCL interface's sources share: the communicator behind NCCL's handle, and the
// helpers that check a handle and keep ncclGetLastError's text. Internal to libweft_nccl.so
// (its version script exports nccl* and pnccl* only).
//
// The interface builds against any nccl.h from 2.19 on: nccl/CMakeLists.txt reads the functions
// that header declares and defines WEFT_NCCL_HAS_<name> for each (ncclCommShrink:
// WEFT_NCCL_HAS_CommShrink), and only those are defined here.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <cstddef>
#include <initializer_list>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "weft/weft.h"

// pnccl* are the functions; nccl* weak aliases of them.
#define WEFT_NCCL_ALIAS(name) __attribute__((weak, alias("p" #name)))

namespace weft::nccl {

// An operator ncclRedOpCreatePreMulSum made: multiply by the scalar, then sum.
struct PreMulSum {
  bool live = false;
  ncclDataType_t type = ncclFloat32;
  unsigned char value[8] = {};   // ncclScalarHostImmediate: the scalar, read at creation
  const void* device = nullptr;  // ncclScalarDevice: read by each call's kernel
};

}  // namespace weft::nccl

// The communicator NCCL's handle points at: weft's, and how it came to be.
struct ncclComm {
  weftComm_t weft = nullptr;
  int device = -1;  // the CUDA device current at init (NCCL binds a communicator to it)
  // Non-blocking init (ncclConfig_t::blocking = 0): ncclInProgress until the thread is done.
  std::atomic<int> state{ncclSuccess};
  std::thread init;
  std::string initError;
  // Operators of ncclRedOpCreatePreMulSum: op ncclNumOps + k is ops[k].
  std::mutex opsMutex;
  std::vector<weft::nccl::PreMulSum> ops;
  // Calls running on this handle: ncclCommAbort frees it only once they have returned (on host
  // buffers a call blocks until the abort ends it).
  std::atomic<int> inflight{0};
};

namespace weft::nccl {

// Counts a call on a communicator for as long as it runs.
class Flight {
 public:
  explicit Flight(ncclComm_t c) : c_(c) {
    if (c_ != nullptr) c_->inflight.fetch_add(1);
  }
  ~Flight() {
    if (c_ != nullptr) c_->inflight.fetch_sub(1);
  }
  Flight(const Flight&) = delete;
  Flight& operator=(const Flight&) = delete;

 private:
  ncclComm_t c_;
};

// ncclGetLastError's text: the last failure of this process (NCCL keeps one per process).
void remember(const std::string& message);
std::string lastError();
// A weft result as NCCL's; check() also keeps weft's message for ncclGetLastError.
ncclResult_t fromWeft(weftResult_t r);
ncclResult_t check(weftResult_t r, const char* function);
ncclResult_t refuse(ncclResult_t code, const std::string& message);
// ncclInvalidUsage, naming the function and why.
ncclResult_t unsupported(const char* function, const char* why);

// Runs `call` with the communicator's device current (NCCL does its work there), restoring
// the caller's.
template <typename Call>
inline weftResult_t onDevice(ncclComm_t comm, Call call) {
  int current = -1;
  const bool switched = comm->device >= 0 && cudaGetDevice(&current) == cudaSuccess &&
                        current != comm->device && cudaSetDevice(comm->device) == cudaSuccess;
  (void)cudaGetLastError();
  const weftResult_t r = call();
  if (switched) (void)cudaSetDevice(current);
  return r;
}

// WEFT_NCCL_HOST_MEMORY=1: the opt-in to what NCCL refuses, communicators without a CUDA device
// and calls on host memory (weft runs them on the host). Read once per process.
bool hostMemoryAllowed();
// NCCL's failures where weft alone would go on (nccl/device_checks.cpp): the caller's CUDA
// device at init (ncclUnhandledCudaError without one), and buffers in device memory at each call
// (ncclInvalidArgument for host memory). Both pass with the opt-in.
ncclResult_t callerDevice(const char* function, int* device);
ncclResult_t deviceCount(const char* function, int* count);
struct Buffer {
  const char* name;
  const void* pointer;
};
ncclResult_t deviceMemory(const char* function, std::size_t count,
                          std::initializer_list<Buffer> buffers);
// The communicator behind a handle once its init is done: null (with the error set) if the
// handle is null, still initializing, or failed to.
weftComm_t ready(ncclComm_t comm, const char* function, ncclResult_t* err);

}  // namespace weft::nccl
