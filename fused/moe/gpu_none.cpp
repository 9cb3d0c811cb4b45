// Builds without CUDA: MoE on GPU memory is unsupported.
#include "fused/moe/gpu.hpp"

namespace weft::fused::moe {

Result<GpuLayout> dispatchGpuSend(Communicator&, const algo::MoeShape&, const DispatchCall&,
                                  void*) {
  return Status(Code::unsupported, "moe dispatch: GPU buffers, but this build has no CUDA");
}
Status dispatchGpuRecv(Communicator&, GpuLayout&, void*) {
  return Status(Code::unsupported, "moe dispatch: GPU buffers, but this build has no CUDA");
}
Status combineGpuSend(Communicator&, const GpuLayout&, const void*, void*) {
  return Status(Code::unsupported, "moe combine: GPU buffers, but this build has no CUDA");
}
Status combineGpuRecv(Communicator&, const GpuLayout&, void*, void*) {
  return Status(Code::unsupported, "moe combine: GPU buffers, but this build has no CUDA");
}
void forgetGpu(const GpuLayout&) {}

}  // namespace weft::fused::moe
