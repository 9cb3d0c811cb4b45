// weft.h's MoE dispatch and combine entry points, compiled into libweft beside
// src/core/c_api.cpp and sharing its handles and errors (src/core/c_api_calls.hpp).
#include <memory>
#include <string>

#include "fused/moe/gpu.hpp"
#include "fused/moe/host.hpp"
#include "src/core/c_api_calls.hpp"
#include "src/exec/cuda_executor.hpp"

using namespace weft::capi;  // NOLINT: the entry points below are its users

// A dispatch's layout, and the communicator whose combine may take it.
struct weftMoeHandle {
  weftComm_t comm = nullptr;
  bool gpu = false;
  weft::fused::moe::MoeLayout layout;     // host memory's
  weft::fused::moe::GpuLayout gpuLayout;  // GPU memory's
  bool combined = false;
};

namespace {

// Host memory only: a GPU buffer is refused before anything moves.
weft::Status onHost(const char* what, std::initializer_list<const void*> buffers) {
  for (const void* p : buffers) {
    if (p != nullptr && weft::exec::isDevicePointer(p))
      return weft::Status(weft::Code::unsupported,
                          std::string(what) + ": GPU buffers are not supported yet (host memory)");
  }
  return {};
}

}  // namespace

extern "C" {

weftResult_t weftMoeDispatch(const weftMoeDispatchArgs* args, weftMoeHandle_t* handle,
                             weftComm_t comm, void* stream) {
  const char* what = "weftMoeDispatch";
  if (args == nullptr || handle == nullptr)
    return invalid(std::string(what) + ": args and handle must not be NULL");
  *handle = nullptr;
  if (!validType(args->datatype))
    return invalid(std::string(what) + ": invalid datatype " +
                   std::to_string(static_cast<int>(args->datatype)));
  // GPU memory where recv_x is: then every buffer is, and the call runs on `stream`.
  const bool gpu = weft::exec::isDevicePointer(args->recvX);
  if (!gpu) {
    if (weftResult_t r = checkStream(stream, what); r != weftSuccess) return r;
  }
  if (gGroupDepth > 0) return fail(weftInvalidUsage, std::string(what) + ": not inside a group");
  auto h = std::make_unique<weftMoeHandle>();
  h->comm = comm;
  h->gpu = gpu;
  const weftResult_t r = withComm(comm, what, [&](weft::Communicator& c) -> weft::Status {
    const auto shape = weft::algo::MoeShape::of(args->tokens, args->hidden, args->topk,
                                                args->experts, c.size(), false);
    weft::fused::moe::DispatchCall call;
    call.x = args->x, call.topkIdx = args->topkIdx, call.topkWeights = args->topkWeights;
    call.type = static_cast<weft::DataType>(args->datatype);
    call.recvX = args->recvX, call.capacity = args->capacity;
    call.expertCounts = args->expertCounts, call.recvSource = args->recvSource;
    if (args->fp8Dispatch != 0 && args->fp8Dispatch != 1)
      return weft::invalidArgument(std::string(what) + ": fp8Dispatch must be 0 or 1");
    call.fp8 = args->fp8Dispatch == 1, call.recvScales = args->recvScales;
    if (gpu) {
      auto layout = weft::fused::moe::dispatchGpu(c, shape, call, stream);
      if (!layout) return layout.status();
      h->gpuLayout = std::move(*layout);
      return {};
    }
    if (weft::Status s = onHost(what, {args->x, args->topkIdx, args->topkWeights, args->recvX,
                                       args->expertCounts, args->recvSource, args->recvScales});
        !s)
      return s;
    auto layout = weft::fused::moe::dispatchHost(c, shape, call);
    if (!layout) return layout.status();
    h->layout = std::move(*layout);
    return {};
  });
  if (r == weftSuccess) *handle = h.release();
  return r;
}

weftResult_t weftMoeRows(weftMoeHandle_t handle, size_t* rows) {
  if (handle == nullptr || rows == nullptr)
    return invalid("weftMoeRows: handle and rows must not be NULL");
  *rows = handle->gpu ? handle->gpuLayout.rows : handle->layout.rows;
  return weftSuccess;
}

weftResult_t weftMoeCombine(weftMoeHandle_t handle, const void* expertOut, void* out,
                            weftComm_t comm, void* stream) {
  const char* what = "weftMoeCombine";
  if (handle == nullptr) return invalid(std::string(what) + ": handle is NULL");
  if (handle->comm != comm)
    return invalid(std::string(what) + ": the handle is another communicator's dispatch");
  if (!handle->gpu) {
    if (weftResult_t r = checkStream(stream, what); r != weftSuccess) return r;
  }
  if (gGroupDepth > 0) return fail(weftInvalidUsage, std::string(what) + ": not inside a group");
  return withComm(comm, what, [&](weft::Communicator& c) -> weft::Status {
    if (handle->gpu) {
      weft::Status s = weft::fused::moe::combineGpu(c, handle->gpuLayout, expertOut, out, stream);
      handle->combined = handle->combined || s.isOk();
      return s;
    }
    if (weft::Status s = onHost(what, {expertOut, out}); !s) return s;
    return weft::fused::moe::combineHost(c, handle->layout, expertOut, out);
  });
}

weftResult_t weftMoeHandleDestroy(weftMoeHandle_t handle) {
  if (handle != nullptr && handle->gpu && !handle->combined)
    weft::fused::moe::forgetGpu(handle->gpuLayout);
  delete handle;
  return weftSuccess;
}

}  // extern "C"
