// Builds without CUDA: the device codecs are unavailable.
#include "fused/fp8/codec_device.hpp"

namespace weft::fused::fp8 {

Status encodeOnDevice(const Codec&, DataType, const void*, std::size_t, std::byte*, void*) {
  return Status(Code::unsupported, "fp8 encode on the GPU: this build has no CUDA");
}

Status decodeOnDevice(const Codec&, DataType, const std::byte*, std::size_t, void*, void*) {
  return Status(Code::unsupported, "fp8 decode on the GPU: this build has no CUDA");
}

}  // namespace weft::fused::fp8
