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
  // The next half the handle takes. On host memory dispatch's send does the whole dispatch, and
  // combine's receive the whole combine (with the expert outputs its send was given).
  enum class Next { dispatchRecv, combineSend, combineRecv, done } next = Next::dispatchRecv;
  const void* expertOut = nullptr;
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

weftResult_t weftMoeDispatchSend(const weftMoeDispatchArgs* args, weftMoeHandle_t* handle,
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
      auto layout = weft::fused::moe::dispatchGpuSend(c, shape, call, stream);
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

namespace {

// The handle's checks before one of its halves: `next` is the half asked for.
weftResult_t ready(weftMoeHandle_t handle, weftComm_t comm, void* stream, weftMoeHandle::Next next,
                   const char* what) {
  if (handle == nullptr) return invalid(std::string(what) + ": handle is NULL");
  if (handle->comm != comm)
    return invalid(std::string(what) + ": the handle is another communicator's dispatch");
  if (!handle->gpu) {
    if (weftResult_t r = checkStream(stream, what); r != weftSuccess) return r;
  }
  if (gGroupDepth > 0) return fail(weftInvalidUsage, std::string(what) + ": not inside a group");
  if (handle->next != next) {
    static const char* const kNext[] = {"weftMoeDispatchRecv", "weftMoeCombineSend",
                                        "weftMoeCombineRecv", "nothing (it was combined)"};
    return fail(weftInvalidUsage, std::string(what) + ": out of order; the handle awaits " +
                                      kNext[static_cast<int>(handle->next)]);
  }
  return weftSuccess;
}

}  // namespace

weftResult_t weftMoeDispatchRecv(weftMoeHandle_t handle, weftComm_t comm, void* stream) {
  const char* what = "weftMoeDispatchRecv";
  if (weftResult_t r = ready(handle, comm, stream, weftMoeHandle::Next::dispatchRecv, what);
      r != weftSuccess)
    return r;
  const weftResult_t r = withComm(comm, what, [&](weft::Communicator& c) -> weft::Status {
    if (!handle->gpu) return {};  // the send did it all
    return weft::fused::moe::dispatchGpuRecv(c, handle->gpuLayout, stream);
  });
  if (r == weftSuccess) handle->next = weftMoeHandle::Next::combineSend;
  return r;
}

weftResult_t weftMoeDispatch(const weftMoeDispatchArgs* args, weftMoeHandle_t* handle,
                             weftComm_t comm, void* stream) {
  if (weftResult_t r = weftMoeDispatchSend(args, handle, comm, stream); r != weftSuccess) return r;
  if (weftResult_t r = weftMoeDispatchRecv(*handle, comm, stream); r != weftSuccess) {
    (void)weftMoeHandleDestroy(*handle);  // keeps the error's text: it sets none
    *handle = nullptr;
    return r;
  }
  return weftSuccess;
}

weftResult_t weftMoeRows(weftMoeHandle_t handle, size_t* rows) {
  if (handle == nullptr || rows == nullptr)
    return invalid("weftMoeRows: handle and rows must not be NULL");
  *rows = handle->gpu ? handle->gpuLayout.rows : handle->layout.rows;
  return weftSuccess;
}

weftResult_t weftMoeCombineSend(weftMoeHandle_t handle, const void* expertOut, weftComm_t comm,
                                void* stream) {
  const char* what = "weftMoeCombine";
  if (weftResult_t r = ready(handle, comm, stream, weftMoeHandle::Next::combineSend, what);
      r != weftSuccess)
    return r;
  const weftResult_t r = withComm(comm, what, [&](weft::Communicator& c) -> weft::Status {
    if (!handle->gpu) {
      if (expertOut == nullptr && handle->layout.rows > 0)
        return weft::invalidArgument(std::string(what) + ": expert_out is NULL");
      return onHost(what, {expertOut});
    }
    return weft::fused::moe::combineGpuSend(c, handle->gpuLayout, expertOut, stream);
  });
  if (r == weftSuccess) {
    handle->expertOut = expertOut;
    handle->next = weftMoeHandle::Next::combineRecv;
  }
  return r;
}

weftResult_t weftMoeCombineRecv(weftMoeHandle_t handle, void* out, weftComm_t comm, void* stream) {
  const char* what = "weftMoeCombineRecv";
  if (weftResult_t r = ready(handle, comm, stream, weftMoeHandle::Next::combineRecv, what);
      r != weftSuccess)
    return r;
  const weftResult_t r = withComm(comm, what, [&](weft::Communicator& c) -> weft::Status {
    if (handle->gpu) return weft::fused::moe::combineGpuRecv(c, handle->gpuLayout, out, stream);
    if (weft::Status s = onHost(what, {out}); !s) return s;
    return weft::fused::moe::combineHost(c, handle->layout, handle->expertOut, out);
  });
  if (r == weftSuccess) handle->next = weftMoeHandle::Next::done;
  return r;
}

weftResult_t weftMoeCombine(weftMoeHandle_t handle, const void* expertOut, void* out,
                            weftComm_t comm, void* stream) {
  if (weftResult_t r = weftMoeCombineSend(handle, expertOut, comm, stream); r != weftSuccess)
    return r;
  return weftMoeCombineRecv(handle, out, comm, stream);
}

weftResult_t weftMoeHandleDestroy(weftMoeHandle_t handle) {
  if (handle != nullptr && handle->gpu && handle->next != weftMoeHandle::Next::done)
    weft::fused::moe::forgetGpu(handle->gpuLayout);
  delete handle;
  return weftSuccess;
}

}  // extern "C"
