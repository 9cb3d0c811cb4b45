// The fp8 codecs on the GPU: the host codec's bytes (codec.hpp), bit for bit, stream-ordered.
// Each thread codes 8 consecutive values; the threads of a block of values find its largest
// magnitude together (4 of them for blocks of 32, 16 for 128). Unsupported (an error) in builds
// without CUDA.
#pragma once

#include <cstddef>

#include "fused/fp8/codec.hpp"

namespace weft::fused::fp8 {

// `in` and `out` are device memory; `stream` a cudaStream_t (null: the default stream).
Status encodeOnDevice(const Codec& codec, DataType type, const void* in, std::size_t count,
                      std::byte* out, void* stream);
Status decodeOnDevice(const Codec& codec, DataType type, const std::byte* in, std::size_t count,
                      void* out, void* stream);

}  // namespace weft::fused::fp8
