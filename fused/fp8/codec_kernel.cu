// The fp8 codecs' kernels (codec_device.hpp). Sixteen values a thread encode, eight decode,
// loaded and stored 8 to 32 bytes at a time where aligned; a block's scale by the host's arithmetic
// (codec_math.hpp) and the element conversions by CUDA's, which the host's (src/exec/numeric.hpp)
// match.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "fused/fp8/codec_device.hpp"
#include "fused/fp8/codec_math.hpp"

namespace weft::fused::fp8 {
namespace {

constexpr int kVec = 8;         // values a thread sums, and a load or store's worth
constexpr int kEncodeVec = 16;  // values a thread encodes: two 16-byte loads, one store
constexpr int kDecodeVec = 8;   // and decodes: one 8-byte load, one 16-byte store (16 values a
                                // thread, stored in two halves, ran 13 % slower)
constexpr int kThreads = 256;
constexpr std::uint32_t kNaN = 0x7fc00000u;  // what a non-finite block decodes to

// A value type's widening to float and rounding back (to nearest even).
template <typename T>
struct Value;
template <>
struct Value<float> {
  static __device__ float widen(float v) { return v; }
  static __device__ float narrow(float v) { return v; }
};
template <>
struct Value<__half> {
  static __device__ float widen(__half v) { return __half2float(v); }
  static __device__ __half narrow(float v) { return __float2half_rn(v); }
};
template <>
struct Value<__nv_bfloat16> {
  static __device__ float widen(__nv_bfloat16 v) { return __bfloat162float(v); }
  static __device__ __nv_bfloat16 narrow(float v) { return __float2bfloat16_rn(v); }
};

template <bool E4m3>
__device__ std::uint8_t toElement(float y) {
  return __nv_cvt_float_to_fp8(y, __NV_SATFINITE, E4m3 ? __NV_E4M3 : __NV_E5M2);
}

// Eight values from `p` at element i (count in all): vectorized where whole and aligned.
template <typename T>
__device__ void load8(const T* p, std::size_t i, std::size_t count, bool aligned, float* v) {
  if (aligned && i + kVec <= count) {
    if constexpr (sizeof(T) == 4) {
      const float4 a = reinterpret_cast<const float4*>(p + i)[0];
      const float4 b = reinterpret_cast<const float4*>(p + i)[1];
      v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z,
      v[7] = b.w;
    } else {
      const uint4 raw = *reinterpret_cast<const uint4*>(p + i);
      const T* t = reinterpret_cast<const T*>(&raw);
      for (int j = 0; j < kVec; ++j) v[j] = Value<T>::widen(t[j]);
    }
    return;
  }
  for (int j = 0; j < kVec; ++j) v[j] = i + j < count ? Value<T>::widen(p[i + j]) : 0.0f;
}

// Two values as their elements, the first in the low byte (one conversion instruction).
template <bool E4m3>
__device__ std::uint32_t toElements2(float a, float b) {
  return __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, E4m3 ? __NV_E4M3 : __NV_E5M2);
}

// N values at i of a block of values into fp8 elements and (the group's leader) its scale:
// every lane of the warp calls it (the group finds the block's largest magnitude together);
// `active` lanes store. The largest magnitude travels as bits, ordered as the magnitudes are:
// at or past infinity's, a value of the block was not finite.
template <bool E4m3, int Block, bool E8m0, int N>
__device__ void encodeValues(const float* v, std::size_t i, bool active, std::size_t kept,
                             std::uint8_t* elements, std::uint8_t* scales, bool aligned) {
  static_assert(N == 8 || N == 16, "8 or 16 values a thread");
  constexpr int kGroup = Block / N;  // lanes sharing a block of values
  std::uint32_t most = 0;
  for (int j = 0; j < N; ++j) most = max(most, __float_as_uint(v[j]) & 0x7fffffffu);
  for (int o = kGroup / 2; o > 0; o /= 2) most = max(most, __shfl_xor_sync(0xffffffffu, most, o));
  if (!active || i >= kept) return;
  const std::size_t b = i / Block;
  const bool leader = (i / N) % kGroup == 0;
  std::uint32_t words[N / 4];
  if (most >= 0x7f800000u) {
    for (int w = 0; w < N / 4; ++w) words[w] = 0x7f7f7f7fu;
    if (leader) {
      if constexpr (E8m0) {
        scales[b] = 0xff;
      } else {
        for (int k = 0; k < 4; ++k) scales[4 * b + k] = static_cast<std::uint8_t>(kNaN >> (8 * k));
      }
    }
  } else {
    // Both schemes multiply by the scale's reciprocal: exact for E8M0's powers of two (v · 2^-k
    // rounds as scalbn(v, -k) does), one IEEE reciprocal a block for f32 scales (codec.cpp too).
    float scale = 1, inverse;
    const float amax = __uint_as_float(most);
    if constexpr (E8m0) {
      const int k = e8m0Exponent(amax, E4m3);
      inverse = scalbnf(1.0f, -k);
      if (leader) scales[b] = static_cast<std::uint8_t>(k + 127);
    } else {
      scale = f32Scale(amax, E4m3 ? 448.0f : 57344.0f);
      inverse = __frcp_rn(scale);
      if (leader) {
        const std::uint32_t bits = __float_as_uint(scale);
        for (int k = 0; k < 4; ++k) scales[4 * b + k] = static_cast<std::uint8_t>(bits >> (8 * k));
      }
    }
    float x[N];
    if (reciprocalFinite(inverse)) {
      for (int j = 0; j < N; ++j) x[j] = __fmul_rn(v[j], inverse);
    } else {  // a block of subnormals (codec_math.hpp)
      for (int j = 0; j < N; ++j) x[j] = __fdiv_rn(v[j], scale);
    }
    for (int w = 0; w < N / 4; ++w) {
      words[w] = toElements2<E4m3>(x[4 * w], x[4 * w + 1]) |
                 toElements2<E4m3>(x[4 * w + 2], x[4 * w + 3]) << 16;
    }
  }
  if (aligned && i + N <= kept) {
    if constexpr (N == 16) {
      *reinterpret_cast<uint4*>(elements + i) = make_uint4(words[0], words[1], words[2], words[3]);
    } else {
      *reinterpret_cast<uint2*>(elements + i) = make_uint2(words[0], words[1]);
    }
  } else {
    for (int j = 0; j < N && i + j < kept; ++j)
      elements[i + j] = static_cast<std::uint8_t>(words[j / 4] >> (8 * (j % 4)));
  }
}

// N decoded values at i of a segment (elements past `kept` read as zero), two elements a
// conversion. 16 a thread, the output in two halves, ran slower (docs/perf-fused.md).
template <bool E4m3, int Block, bool E8m0, int N>
__device__ void decodeValues(const std::uint8_t* elements, const std::uint8_t* scales,
                             std::size_t i, std::size_t kept, bool aligned, float* v) {
  static_assert(N == 8, "8 values a thread: one 8-byte load");
  const std::size_t b = i / Block;
  std::uint32_t words[N / 4];
  if (aligned && i + N <= kept) {
    const uint2 packed = *reinterpret_cast<const uint2*>(elements + i);
    words[0] = packed.x, words[1] = packed.y;
  } else {
    for (int w = 0; w < N / 4; ++w) words[w] = 0;
    for (int j = 0; j < N && i + j < kept; ++j)
      words[j / 4] |= static_cast<std::uint32_t>(elements[i + j]) << (8 * (j % 4));
  }
  float scale;
  bool nan;
  if constexpr (E8m0) {
    const std::uint8_t code = scales[b];
    nan = code == 0xff;
    scale = scalbnf(1.0f, code - 127);
  } else {
    std::uint32_t bits = 0;
    for (int k = 0; k < 4; ++k) bits |= static_cast<std::uint32_t>(scales[4 * b + k]) << (8 * k);
    scale = __uint_as_float(bits);
    nan = isnan(scale);
  }
  for (int w = 0; w < N / 4; ++w) {
    for (int h = 0; h < 2; ++h) {
      const auto pair = static_cast<__nv_fp8x2_storage_t>(words[w] >> (16 * h));
      const float2 f =
          __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pair, E4m3 ? __NV_E4M3 : __NV_E5M2)));
      v[4 * w + 2 * h] = __fmul_rn(f.x, scale);
      v[4 * w + 2 * h + 1] = __fmul_rn(f.y, scale);
    }
  }
  if (nan) {
    for (int j = 0; j < N; ++j) v[j] = __uint_as_float(kNaN);
  }
}

// Eight values of type T stored at i of `out`, `valid` values there in all.
template <typename T>
__device__ void store8(T* out, std::size_t i, std::size_t valid, bool aligned, const float* v) {
  if (aligned && i + kVec <= valid) {
    if constexpr (sizeof(T) == 4) {
      reinterpret_cast<float4*>(out + i)[0] = make_float4(v[0], v[1], v[2], v[3]);
      reinterpret_cast<float4*>(out + i)[1] = make_float4(v[4], v[5], v[6], v[7]);
    } else {
      uint4 raw;
      T* t = reinterpret_cast<T*>(&raw);
      for (int j = 0; j < kVec; ++j) t[j] = Value<T>::narrow(v[j]);
      *reinterpret_cast<uint4*>(out + i) = raw;
    }
  } else {
    for (int j = 0; j < kVec && i + j < valid; ++j) out[i + j] = Value<T>::narrow(v[j]);
  }
}

__device__ std::size_t threadIndex() {
  return static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

bool alignedTo(const void* p, std::size_t bytes) {
  return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}

Status launched(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return {};
  return Status(Code::systemError, std::string(what) + ": " + cudaGetErrorString(e));
}

// Calls f with the kernel's value type, element format and scheme as template arguments.
template <typename F>
Status dispatch(const Codec& c, DataType type, F f) {
  auto byScheme = [&](auto tag) -> Status {
    using T = decltype(tag);
    const bool e4m3 = c.element == Element::e4m3;
    if (c.scale == ScaleKind::e8m0)
      return e4m3 ? f(T{}, std::true_type{}, std::integral_constant<int, 32>{}, std::true_type{})
                  : f(T{}, std::false_type{}, std::integral_constant<int, 32>{}, std::true_type{});
    return e4m3 ? f(T{}, std::true_type{}, std::integral_constant<int, 128>{}, std::false_type{})
                : f(T{}, std::false_type{}, std::integral_constant<int, 128>{}, std::false_type{});
  };
  switch (type) {
    case DataType::f32:
      return byScheme(float{});
    case DataType::f16:
      return byScheme(__half{});
    case DataType::bf16:
      return byScheme(__nv_bfloat16{});
    default:
      return invalidArgument("fp8 " + c.name() + ": " + std::string(name(type)) +
                             " cannot be compressed (bf16, f16 and f32 can)");
  }
}

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

// Segment s is blockIdx.y: no division of a thread's index (docs/perf-fused.md, "FP8 codecs against
// the device's copy").
template <typename T, bool E4m3, int Block, bool E8m0>
__global__ void encodeKernel(const T* in, Layout l, std::uint8_t* out, bool aligned) {
  const std::size_t s = blockIdx.y, i = threadIndex() * kEncodeVec;
  const bool active = i < l.padded;
  float v[kEncodeVec];
  for (int h = 0; h < kEncodeVec; h += kVec)
    load8(in + s * l.stride, i + h, l.valid(s), aligned, v + h);
  std::uint8_t* elements = out + s * l.segmentBytes;
  encodeValues<E4m3, Block, E8m0, kEncodeVec>(v, i, active, l.kept, elements, elements + l.kept,
                                              aligned);
}

template <typename T, bool E4m3, int Block, bool E8m0>
__global__ void decodeKernel(const std::uint8_t* in, Layout l, T* out, bool aligned) {
  const std::size_t s = blockIdx.y, i = threadIndex() * kDecodeVec;
  if (i >= l.valid(s)) return;
  const std::uint8_t* elements = in + s * l.segmentBytes;
  float v[kDecodeVec];
  decodeValues<E4m3, Block, E8m0, kDecodeVec>(elements, elements + l.kept, i, l.kept, aligned, v);
  for (int h = 0; h < kDecodeVec; h += kVec)
    store8(out + s * l.stride, i + h, l.valid(s), aligned, v + h);
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
      decodeValues<E4m3, Block, E8m0, kVec>(elements, elements + l.padded, i, l.padded, aligned, v);
      for (int j = 0; j < kVec; ++j) sum[j] = __fadd_rn(sum[j], v[j]);
    }
    if (divisor != 1.0f) {
      for (int j = 0; j < kVec; ++j) sum[j] = __fdiv_rn(sum[j], divisor);
    }
  }
  if (encoded != nullptr) {
    encodeValues<E4m3, Block, E8m0, kVec>(sum, i, active, l.padded, encoded, encoded + l.padded,
                                          aligned);
  } else if (active && i < outCount) {
    store8(out, i, outCount, aligned, sum);
  }
}

// A row of thread blocks per segment (segments are ranks: far below gridDim.y's 65535), each
// thread `vec` values.
dim3 gridFor(const Layout& l, int vec = kVec) {
  const std::size_t threads = l.padded / static_cast<std::size_t>(vec);
  return dim3(static_cast<unsigned>((threads + kThreads - 1) / kThreads),
              static_cast<unsigned>(l.segments));
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
    const bool aligned = alignedTo(in, 16) && alignedTo(out, kEncodeVec) &&
                         (l.stride * sizeof(T)) % 16 == 0 && l.segmentBytes % kEncodeVec == 0;
    encodeKernel<T, decltype(e4m3)::value, decltype(block)::value, decltype(e8m0)::value>
        <<<gridFor(l, kEncodeVec), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
            static_cast<const T*>(in), l, reinterpret_cast<std::uint8_t*>(out), aligned);
    return launched("fp8 encode");
  });
}

Status decodeWith(const Codec& codec, DataType type, const std::byte* in, const Layout& l,
                  void* out, void* stream) {
  if (l.count == 0) return {};
  return dispatch(codec, type, [&](auto t, auto e4m3, auto block, auto e8m0) -> Status {
    using T = decltype(t);
    const bool aligned = alignedTo(in, kDecodeVec) && alignedTo(out, 16) &&
                         (l.stride * sizeof(T)) % 16 == 0 && l.segmentBytes % kDecodeVec == 0;
    decodeKernel<T, decltype(e4m3)::value, decltype(block)::value, decltype(e8m0)::value>
        <<<gridFor(l, kDecodeVec), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
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
