// What NCCL refuses and weft's own API accepts: no CUDA device, and buffers in host memory.
// Without WEFT_NCCL_HOST_MEMORY=1 the NCCL interface fails as NCCL would, so a job on a node
// whose GPU is gone fails at init instead of running, slowly, on host memory.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "nccl/shim.hpp"

namespace weft::nccl {
namespace {

const char* const kOptIn =
    "WEFT_NCCL_HOST_MEMORY=1 lets weft's NCCL interface run on host memory instead";

ncclResult_t cudaFailure(const char* function, cudaError_t e) {
  (void)cudaGetLastError();
  return refuse(ncclUnhandledCudaError, std::string(function) + ": Cuda failure " +
                                            std::to_string(static_cast<int>(e)) + " '" +
                                            cudaGetErrorString(e) + "' (" + kOptIn + ")");
}

}  // namespace

bool hostMemoryAllowed() {
  static const bool allowed = [] {
    const char* v = std::getenv("WEFT_NCCL_HOST_MEMORY");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  return allowed;
}

ncclResult_t callerDevice(const char* function, int* device) {
  *device = -1;
  if (cudaError_t e = cudaGetDevice(device); e != cudaSuccess) {
    *device = -1;
    if (!hostMemoryAllowed()) return cudaFailure(function, e);
    (void)cudaGetLastError();
  }
  return ncclSuccess;
}

ncclResult_t deviceCount(const char* function, int* count) {
  *count = 0;
  cudaError_t e = cudaGetDeviceCount(count);
  if (e == cudaSuccess && *count == 0) e = cudaErrorNoDevice;
  if (e != cudaSuccess) {
    *count = 0;
    if (!hostMemoryAllowed()) return cudaFailure(function, e);
    (void)cudaGetLastError();
  }
  return ncclSuccess;
}

ncclResult_t deviceMemory(const char* function, std::size_t count,
                          std::initializer_list<Buffer> buffers) {
  if (count == 0 || hostMemoryAllowed()) return ncclSuccess;
  for (const Buffer& b : buffers) {
    if (b.pointer == nullptr) continue;  // NCCL ignores some (a non-root's); weft checks the rest
    cudaPointerAttributes a{};
    const cudaError_t e = cudaPointerGetAttributes(&a, b.pointer);
    if (e == cudaSuccess && a.devicePointer != nullptr) continue;
    (void)cudaGetLastError();
    char where[32];
    std::snprintf(where, sizeof where, "%p", b.pointer);
    return refuse(ncclInvalidArgument, std::string(function) + ": " + b.name + " " + where +
                                           " is not a valid pointer: host memory, where NCCL "
                                           "takes device memory (" +
                                           kOptIn + ")");
  }
  return ncclSuccess;
}

}  // namespace weft::nccl
