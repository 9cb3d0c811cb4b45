// The fp8 codecs on the GPU: the host codec's bytes (codec.hpp), bit for bit, stream-ordered.
// Each thread encodes 16 consecutive values (decodes 8); the threads of a block of values find
// its largest magnitude together. Unsupported (an error) in builds without CUDA.
#pragma once

#include <cstddef>

#include "fused/fp8/codec.hpp"

namespace weft::fused::fp8 {

// `in` and `out` are device memory; `stream` a cudaStream_t (null: the default stream).
Status encodeOnDevice(const Codec& codec, DataType type, const void* in, std::size_t count,
                      std::byte* out, void* stream);
Status decodeOnDevice(const Codec& codec, DataType type, const std::byte* in, std::size_t count,
                      void* out, void* stream);
// encodeSegments, decodeSegments (codec.hpp) on the device.
Status encodeSegmentsOnDevice(const Codec& codec, DataType type, const void* in,
                              const Segments& seg, std::byte* out, void* stream);
Status decodeSegmentsOnDevice(const Codec& codec, DataType type, const std::byte* in,
                              const Segments& seg, void* out, void* stream);
// sumSegments on the device, the sums then stored as the first `outCount` values of `type` at
// `out` (reduce-scatter's share), or encoded as one share of seg.padded values at `out`
// (sumEncodeOnDevice: all-reduce's second quantization, no f32 in memory between).
Status sumSegmentsOnDevice(const Codec& codec, const std::byte* in, const Segments& seg,
                           float divisor, DataType type, void* out, std::size_t outCount,
                           void* stream);
Status sumEncodeOnDevice(const Codec& codec, const std::byte* in, const Segments& seg,
                         float divisor, std::byte* out, void* stream);

}  // namespace weft::fused::fp8
