// The compressed all-reduce kernel of a build without CUDA: never launched (no GPU buffers).
#include "fused/fp8/compressed_kernel.hpp"

namespace weft::fused::fp8 {

std::size_t compressedTwoShotMostElems(const Codec&, std::size_t, int) {
  return 0;
}

Status launchCompressedTwoShot(const device::LaunchArgs&, int, const Codec&, DataType, float,
                               void*) {
  return Status(Code::unsupported, "fp8 all-reduce on the GPU: this build has no CUDA");
}

}  // namespace weft::fused::fp8
