// The device codecs of a build without CUDA: every call says why it cannot run.
#include "fused/fp8/codec_device.hpp"

namespace weft::fused::fp8 {
namespace {
Status none() {
  return Status(Code::unsupported, "fp8 codecs on the GPU: this build has no CUDA");
}
}  // namespace

Status encodeOnDevice(const Codec&, DataType, const void*, std::size_t, std::byte*, void*) {
  return none();
}
Status decodeOnDevice(const Codec&, DataType, const std::byte*, std::size_t, void*, void*) {
  return none();
}
Status encodeSegmentsOnDevice(const Codec&, DataType, const void*, const Segments&, std::byte*,
                              void*) {
  return none();
}
Status decodeSegmentsOnDevice(const Codec&, DataType, const std::byte*, const Segments&, void*,
                              void*) {
  return none();
}
Status sumSegmentsOnDevice(const Codec&, const std::byte*, const Segments&, float, DataType, void*,
                           std::size_t, void*) {
  return none();
}
Status sumEncodeOnDevice(const Codec&, const std::byte*, const Segments&, float, std::byte*,
                         void*) {
  return none();
}

}  // namespace weft::fused::fp8
