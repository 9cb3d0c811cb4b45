// The fp8 codecs' device pieces (codec_kernel.cu's; for kernels that fuse the codecs with
// other work too): eight values a thread, loaded and stored 16 or
// 32 bytes at a time where aligned; a block's scale by the host's arithmetic (codec_math.hpp) and
// the element conversions by CUDA's, which the host's (src/exec/numeric.hpp) match. CUDA only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "fused/fp8/codec.hpp"
#include "fused/fp8/codec_math.hpp"

namespace weft::fused::fp8::dev {

constexpr int kVec = 8;  // values a thread codes
constexpr int kThreads = 256;
constexpr std::uint32_t kNaN = 0x7fc00000u;  // what a non-finite block decodes to

// A value type's widening to float and rounding back (to nearest even).
template <typename T>
struct Value;
template <>
struct Value<float> {
  static __device__ inline float widen(float v) { return v; }
  static __device__ inline float narrow(float v) { return v; }
};
template <>
struct Value<__half> {
  static __device__ inline float widen(__half v) { return __half2float(v); }
  static __device__ inline __half narrow(float v) { return __float2half_rn(v); }
};
template <>
struct Value<__nv_bfloat16> {
  static __device__ inline float widen(__nv_bfloat16 v) { return __bfloat162float(v); }
  static __device__ inline __nv_bfloat16 narrow(float v) { return __float2bfloat16_rn(v); }
};

template <bool E4m3>
__device__ inline std::uint8_t toElement(float y) {
  return __nv_cvt_float_to_fp8(y, __NV_SATFINITE, E4m3 ? __NV_E4M3 : __NV_E5M2);
}

template <bool E4m3>
__device__ inline float fromElement(std::uint8_t q) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(q, E4m3 ? __NV_E4M3 : __NV_E5M2);
  return __half2float(__half(h));
}

// Eight values from `p` at element i (count in all): vectorized where whole and aligned.
template <typename T>
__device__ inline void load8(const T* p, std::size_t i, std::size_t count, bool aligned, float* v) {
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

// Eight values at i of a block of values into fp8 elements and (the group's leader) its scale:
// every lane of the warp calls it (the group finds the block's largest magnitude together);
// `active` lanes store.
template <bool E4m3, int Block, bool E8m0>
__device__ inline void encode8(const float* v, std::size_t i, bool active, std::size_t kept,
                               std::uint8_t* elements, std::uint8_t* scales, bool aligned) {
  constexpr int kGroup = Block / kVec;  // lanes sharing a block of values
  float amax = 0;
  int finite = 1;
  for (int j = 0; j < kVec; ++j) {
    finite &= isfinite(v[j]) ? 1 : 0;
    amax = fmaxf(amax, fabsf(v[j]));
  }
  for (int o = kGroup / 2; o > 0; o /= 2) {
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    finite &= __shfl_xor_sync(0xffffffffu, finite, o);
  }
  if (!active || i >= kept) return;
  const std::size_t b = i / Block;
  const bool leader = (i / kVec) % kGroup == 0;
  std::uint8_t q[kVec];
  constexpr float kMax = E4m3 ? 448.0f : 57344.0f;
  if (!finite) {
    for (int j = 0; j < kVec; ++j) q[j] = 0x7f;
    if (leader) {
      if constexpr (E8m0) {
        scales[b] = 0xff;
      } else {
        for (int k = 0; k < 4; ++k) scales[4 * b + k] = static_cast<std::uint8_t>(kNaN >> (8 * k));
      }
    }
  } else if constexpr (E8m0) {
    const int k = e8m0Exponent(amax, E4m3);
    const float inverse = scalbnf(1.0f, -k);  // exact: v * 2^-k rounds as scalbn(v, -k) does
    for (int j = 0; j < kVec; ++j) q[j] = toElement<E4m3>(v[j] * inverse);
    if (leader) scales[b] = static_cast<std::uint8_t>(k + 127);
  } else {
    const float s = f32Scale(amax, kMax);
    for (int j = 0; j < kVec; ++j) q[j] = toElement<E4m3>(v[j] / s);
    if (leader) {
      const std::uint32_t bits = __float_as_uint(s);
      for (int k = 0; k < 4; ++k) scales[4 * b + k] = static_cast<std::uint8_t>(bits >> (8 * k));
    }
  }
  if (aligned && i + kVec <= kept) {
    uint2 packed;
    std::uint8_t* p = reinterpret_cast<std::uint8_t*>(&packed);
    for (int j = 0; j < kVec; ++j) p[j] = q[j];
    *reinterpret_cast<uint2*>(elements + i) = packed;
  } else {
    for (int j = 0; j < kVec && i + j < kept; ++j) elements[i + j] = q[j];
  }
}

// Eight decoded values at i of a segment (elements past `kept` read as zero).
template <bool E4m3, int Block, bool E8m0>
__device__ inline void decode8(const std::uint8_t* elements, const std::uint8_t* scales,
                               std::size_t i, std::size_t kept, bool aligned, float* v) {
  const std::size_t b = i / Block;
  std::uint8_t q[kVec];
  if (aligned && i + kVec <= kept) {
    const uint2 packed = *reinterpret_cast<const uint2*>(elements + i);
    const std::uint8_t* p = reinterpret_cast<const std::uint8_t*>(&packed);
    for (int j = 0; j < kVec; ++j) q[j] = p[j];
  } else {
    for (int j = 0; j < kVec; ++j) q[j] = i + j < kept ? elements[i + j] : 0;
  }
  if constexpr (E8m0) {
    const std::uint8_t code = scales[b];
    const float scale = code == 0xff ? __uint_as_float(kNaN) : scalbnf(1.0f, code - 127);
    for (int j = 0; j < kVec; ++j)
      v[j] = code == 0xff ? scale : __fmul_rn(fromElement<E4m3>(q[j]), scale);
  } else {
    std::uint32_t bits = 0;
    for (int k = 0; k < 4; ++k) bits |= static_cast<std::uint32_t>(scales[4 * b + k]) << (8 * k);
    const float s = __uint_as_float(bits);
    for (int j = 0; j < kVec; ++j)
      v[j] = isnan(s) ? __uint_as_float(kNaN) : __fmul_rn(fromElement<E4m3>(q[j]), s);
  }
}

// Eight values of type T stored at i of `out`, `valid` values there in all.
template <typename T>
__device__ inline void store8(T* out, std::size_t i, std::size_t valid, bool aligned,
                              const float* v) {
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

__device__ inline std::size_t threadIndex() {
  return static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

inline bool alignedTo(const void* p, std::size_t bytes) {
  return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}

inline Status launched(const char* what) {
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

}  // namespace weft::fused::fp8::dev
