// What the fused operations' GPU runs share: CUDA's errors as a Status, a stream waiting for
// another's work so far, the check that a caller's pointer is GPU memory, and the workspace a
// call runs in.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "src/core/communicator.hpp"
#include "weft/status.hpp"

namespace weft::fused {

// A CUDA call's result: ok, or systemError "<what>: <CUDA's words>".
inline Status cudaStatus(const std::string& what, cudaError_t e) {
  if (e == cudaSuccess) return {};
  return Status(Code::systemError, what + ": " + cudaGetErrorString(e));
}
// Loads `kernels` now (cudaFuncGetAttributes), so that none loads lazily at a launch while a
// peer's spinning kernel waits for this rank (../shared/DEVICE.md); the first failure, as
// "<what>: <CUDA's words>".
template <typename... Kernel>
Status loadKernels(const std::string& what, Kernel... kernels) {
  cudaFuncAttributes attr{};
  cudaError_t e = cudaSuccess;
  for (const void* f : {reinterpret_cast<const void*>(kernels)...}) {
    if (e == cudaSuccess) e = cudaFuncGetAttributes(&attr, f);
  }
  return cudaStatus(what, e);
}
// Whether the kernels just launched started.
inline Status launched(const std::string& what) {
  return cudaStatus(what, cudaGetLastError());
}

// `after` waits for what `before` has enqueued so far (through `e`).
inline Status follow(cudaStream_t after, cudaStream_t before, cudaEvent_t e) {
  cudaError_t r = cudaEventRecord(e, before);
  if (r == cudaSuccess) r = cudaStreamWaitEvent(after, e, 0);
  if (r != cudaSuccess)
    return Status(Code::systemError, std::string("ordering streams: ") + cudaGetErrorString(r));
  return {};
}

// Null, or memory the GPU reaches; else invalid, "<who>: <role> is not GPU memory".
inline Status onDevice(const void* p, const char* who, const char* role) {
  if (p == nullptr) return {};
  auto device = [p] {
    cudaPointerAttributes a{};
    const bool ok = cudaPointerGetAttributes(&a, p) == cudaSuccess && a.devicePointer != nullptr;
    if (!ok) (void)cudaGetLastError();
    return ok;
  };
  // A thread whose first CUDA call this is has no context yet, and the query then knows no
  // device memory: cudaFree(nullptr) makes the current device's context current, then again.
  if (device() || (cudaFree(nullptr) == cudaSuccess && device())) return {};
  return invalidArgument(std::string(who) + ": " + role + " is not GPU memory");
}

// A communicator's side stream for a fused operation, and the events that fork it from the
// caller's stream, order the two between steps and join them again.
struct SideStream {
  cudaStream_t stream = nullptr;
  cudaEvent_t fork = nullptr, chunk = nullptr, join = nullptr;
  SideStream() = default;
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;
  Status create() {
    cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    for (cudaEvent_t* ev : {&fork, &chunk, &join})
      if (e == cudaSuccess) e = cudaEventCreateWithFlags(ev, cudaEventDisableTiming);
    if (e != cudaSuccess)
      return Status(Code::systemError, std::string("side stream: ") + cudaGetErrorString(e));
    return {};
  }
  // Waits for the stream's work, then frees it (again: nothing).
  void destroy() {
    if (stream != nullptr) (void)cudaStreamSynchronize(stream);
    for (cudaEvent_t* ev : {&fork, &chunk, &join}) {
      if (*ev != nullptr) (void)cudaEventDestroy(*ev);
      *ev = nullptr;
    }
    if (stream != nullptr) (void)cudaStreamDestroy(stream);
    stream = nullptr;
  }
  ~SideStream() { destroy(); }
};

// The caller's workspace (`given`), or `bytes` of the communicator's.
inline Result<std::byte*> workspaceOr(Communicator& comm, void* given, std::size_t bytes) {
  if (given != nullptr) return static_cast<std::byte*>(given);
  return comm.workspace(bytes, true);
}

}  // namespace weft::fused
