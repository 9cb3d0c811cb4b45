// The element arithmetic every device kernel shares: the compute type of each dtype (narrow
// floats in fp32, rounded to nearest even on store; fp8 saturating) and the four element-wise ops.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "weft/types.hpp"

namespace weft::device {

// Narrow floating types compute in fp32; everything else in its own type.
template <typename T>
struct Compute {
  using type = T;
};
template <>
struct Compute<__half> {
  using type = float;
};
template <>
struct Compute<__nv_bfloat16> {
  using type = float;
};
template <>
struct Compute<__nv_fp8_e4m3> {
  using type = float;
};
template <>
struct Compute<__nv_fp8_e5m2> {
  using type = float;
};

struct Sum {
  template <typename C>
  __device__ static C apply(C x, C y) {
    return x + y;
  }
};
struct Prod {
  template <typename C>
  __device__ static C apply(C x, C y) {
    return x * y;
  }
};
struct Min {
  template <typename C>
  __device__ static C apply(C x, C y) {
    return y < x ? y : x;
  }
};
struct Max {
  template <typename C>
  __device__ static C apply(C x, C y) {
    return x < y ? y : x;
  }
};

template <typename T, typename Op>
__device__ __forceinline__ T combine(T x, T y) {
  using C = typename Compute<T>::type;
  return static_cast<T>(Op::apply(static_cast<C>(x), static_cast<C>(y)));
}

// Calls fn(T{}) with the C++ type of the dtype (a null pointer of it, so any T will do).
template <typename Fn>
__host__ decltype(auto) withType(DataType type, Fn&& fn) {
  switch (type) {
    case DataType::f64:
      return fn(static_cast<double*>(nullptr));
    case DataType::f32:
      return fn(static_cast<float*>(nullptr));
    case DataType::f16:
      return fn(static_cast<__half*>(nullptr));
    case DataType::bf16:
      return fn(static_cast<__nv_bfloat16*>(nullptr));
    case DataType::f8e4m3:
      return fn(static_cast<__nv_fp8_e4m3*>(nullptr));
    case DataType::f8e5m2:
      return fn(static_cast<__nv_fp8_e5m2*>(nullptr));
    case DataType::i8:
      return fn(static_cast<std::int8_t*>(nullptr));
    case DataType::u8:
      return fn(static_cast<std::uint8_t*>(nullptr));
    case DataType::i32:
      return fn(static_cast<std::int32_t*>(nullptr));
    case DataType::u32:
      return fn(static_cast<std::uint32_t*>(nullptr));
    case DataType::i64:
      return fn(static_cast<std::int64_t*>(nullptr));
    case DataType::u64:
      break;
  }
  return fn(static_cast<std::uint64_t*>(nullptr));
}

// Calls fn(Op{}) for an element-wise op; avg reduces as sum.
template <typename Fn>
__host__ decltype(auto) withOp(RedOp op, Fn&& fn) {
  switch (op) {
    case RedOp::prod:
      return fn(Prod{});
    case RedOp::min:
      return fn(Min{});
    case RedOp::max:
      return fn(Max{});
    case RedOp::sum:
    case RedOp::avg:
      break;
  }
  return fn(Sum{});
}

}  // namespace weft::device
