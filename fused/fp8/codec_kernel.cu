// The fp8 codecs' kernels (codec_device.hpp), from the device pieces of codec_device.cuh.
#include <cstdint>

#include "fused/fp8/codec_device.cuh"
#include "fused/fp8/codec_device.hpp"

namespace weft::fused::fp8 {
namespace {

using namespace dev;  // NOLINT: this file is the device pieces' first user

// Where a kernel's values and bytes lie (codec.hpp's Segments; the single buffer of
// encodeOnDevice is one segment whose scales follow its `count` elements).
struct Layout {
  std::size_t segments, stride, count;
  std::size_t padded;        // values a segment codes: its threads cover them
  std::size_t kept;          // element bytes a segment stores; its scales follow them
  std::size_t segmentBytes;  // from one segment's bytes to the next's
  __device__ std::size_t valid(std::size_t s) const {
    const std::size_t begin = s * stride;
    return begin >= count ? 0 : (count - begin < stride ? count - begin : stride);
  }
};

template <typename T, bool E4m3, int Block, bool E8m0>
__global__ void encodeKernel(const T* in, Layout l, std::uint8_t* out, bool aligned) {
  const std::size_t perSegment = l.padded / kVec;
  const std::size_t t = threadIndex();
  const std::size_t s = t / perSegment, i = (t % perSegment) * kVec;
  const bool active = s < l.segments;
  float v[kVec];
  load8(active ? in + s * l.stride : in, i, active ? l.valid(s) : 0, aligned, v);
  std::uint8_t* elements = out + (active ? s : 0) * l.segmentBytes;
  encode8<E4m3, Block, E8m0>(v, i, active, l.kept, elements, elements + l.kept, aligned);
}

template <typename T, bool E4m3, int Block, bool E8m0>
__global__ void decodeKernel(const std::uint8_t* in, Layout l, T* out, bool aligned) {
  const std::size_t perSegment = l.padded / kVec;
  const std::size_t t = threadIndex();
  const std::size_t s = t / perSegment, i = (t % perSegment) * kVec;
  if (s >= l.segments || i >= l.valid(s)) return;
  const std::uint8_t* elements = in + s * l.segmentBytes;
  float v[kVec];
  decode8<E4m3, Block, E8m0>(elements, elements + l.kept, i, l.kept, aligned, v);
  store8(out + s * l.stride, i, l.valid(s), aligned, v);
}

// The shares of `in` summed in share order (then divided), stored as values of T (out) or
// encoded as one share (encoded).
template <typename T, bool E4m3, int Block, bool E8m0>
__global__ void sumKernel(const std::uint8_t* in, Layout l, float divisor, T* out,
                          std::size_t outCount, std::uint8_t* encoded, bool aligned) {
  const std::size_t i = threadIndex() * kVec;
  const bool active = i < l.padded;
  float sum[kVec] = {0, 0, 0, 0, 0, 0, 0, 0};
  if (active) {
    for (std::size_t s = 0; s < l.segments; ++s) {
      const std::uint8_t* elements = in + s * l.segmentBytes;
      float v[kVec];
      decode8<E4m3, Block, E8m0>(elements, elements + l.padded, i, l.padded, aligned, v);
      for (int j = 0; j < kVec; ++j) sum[j] = __fadd_rn(sum[j], v[j]);
    }
    if (divisor != 1.0f) {
      for (int j = 0; j < kVec; ++j) sum[j] = __fdiv_rn(sum[j], divisor);
    }
  }
  if (encoded != nullptr) {
    encode8<E4m3, Block, E8m0>(sum, i, active, l.padded, encoded, encoded + l.padded, aligned);
  } else if (active && i < outCount) {
    store8(out, i, outCount, aligned, sum);
  }
}

unsigned gridFor(const Layout& l) {
  const std::size_t threads = l.segments * (l.padded / kVec);
  return static_cast<unsigned>((threads + kThreads - 1) / kThreads);
}

Layout single(const Codec& c, std::size_t count) {
  const auto block = static_cast<std::size_t>(c.block);
  return {1, count, count, (count + block - 1) / block * block, count, 0};
}

Layout segmented(const Segments& seg) {
  return {seg.segments, seg.stride, seg.count, seg.padded, seg.padded, seg.segmentBytes};
}

Status encodeWith(const Codec& codec, DataType type, const void* in, const Layout& l,
                  std::byte* out, void* stream) {
  if (l.count == 0) return {};
  return dispatch(codec, type, [&](auto t, auto e4m3, auto block, auto e8m0) -> Status {
    using T = decltype(t);
    const bool aligned = alignedTo(in, 16) && alignedTo(out, 8) &&
                         (l.stride * sizeof(T)) % 16 == 0 && l.segmentBytes % 8 == 0;
    encodeKernel<T, decltype(e4m3)::value, decltype(block)::value, decltype(e8m0)::value>
        <<<gridFor(l), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
            static_cast<const T*>(in), l, reinterpret_cast<std::uint8_t*>(out), aligned);
    return launched("fp8 encode");
  });
}

Status decodeWith(const Codec& codec, DataType type, const std::byte* in, const Layout& l,
                  void* out, void* stream) {
  if (l.count == 0) return {};
  return dispatch(codec, type, [&](auto t, auto e4m3, auto block, auto e8m0) -> Status {
    using T = decltype(t);
    const bool aligned = alignedTo(in, 8) && alignedTo(out, 16) &&
                         (l.stride * sizeof(T)) % 16 == 0 && l.segmentBytes % 8 == 0;
    decodeKernel<T, decltype(e4m3)::value, decltype(block)::value, decltype(e8m0)::value>
        <<<gridFor(l), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
            reinterpret_cast<const std::uint8_t*>(in), l, static_cast<T*>(out), aligned);
    return launched("fp8 decode");
  });
}

Status sumWith(const Codec& codec, const std::byte* in, const Segments& seg, float divisor,
               DataType type, void* out, std::size_t outCount, std::byte* encoded, void* stream) {
  if (seg.padded == 0) return {};
  Layout l = segmented(seg);
  return dispatch(codec, type, [&](auto t, auto e4m3, auto block, auto e8m0) -> Status {
    using T = decltype(t);
    const bool aligned = alignedTo(in, 16) && alignedTo(out, 16) && alignedTo(encoded, 16);
    Layout one = l;
    one.segments = 1;
    sumKernel<T, decltype(e4m3)::value, decltype(block)::value, decltype(e8m0)::value>
        <<<gridFor(one), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
            reinterpret_cast<const std::uint8_t*>(in), l, divisor, static_cast<T*>(out), outCount,
            reinterpret_cast<std::uint8_t*>(encoded), aligned);
    return launched("fp8 sum");
  });
}

}  // namespace

Status encodeOnDevice(const Codec& codec, DataType type, const void* in, std::size_t count,
                      std::byte* out, void* stream) {
  return encodeWith(codec, type, in, single(codec, count), out, stream);
}

Status decodeOnDevice(const Codec& codec, DataType type, const std::byte* in, std::size_t count,
                      void* out, void* stream) {
  return decodeWith(codec, type, in, single(codec, count), out, stream);
}

Status encodeSegmentsOnDevice(const Codec& codec, DataType type, const void* in,
                              const Segments& seg, std::byte* out, void* stream) {
  return encodeWith(codec, type, in, segmented(seg), out, stream);
}

Status decodeSegmentsOnDevice(const Codec& codec, DataType type, const std::byte* in,
                              const Segments& seg, void* out, void* stream) {
  return decodeWith(codec, type, in, segmented(seg), out, stream);
}

Status sumSegmentsOnDevice(const Codec& codec, const std::byte* in, const Segments& seg,
                           float divisor, DataType type, void* out, std::size_t outCount,
                           void* stream) {
  return sumWith(codec, in, seg, divisor, type, out, outCount, nullptr, stream);
}

Status sumEncodeOnDevice(const Codec& codec, const std::byte* in, const Segments& seg,
                         float divisor, std::byte* out, void* stream) {
  // The sums are encoded from f32: the kernel's value type is float, its output unused.
  return sumWith(codec, in, seg, divisor, DataType::f32, nullptr, 0, out, stream);
}

}  // namespace weft::fused::fp8
