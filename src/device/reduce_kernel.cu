#include "src/device/reduce_kernel.hpp"

#include "src/device/arith.cuh"

#include <cstdint>
#include <string>

static_assert(__cplusplus >= 202002L, "weft's CUDA code is compiled as C++20");

namespace weft::device {
namespace {

// 16-byte vectors when every pointer allows it, then a scalar tail. Loads are read-only and do
// not alias stores of the same thread, so dst may alias a or b.
template <typename T, typename Op>
__global__ void reduceKernel(T* dst, const T* a, const T* b, std::size_t count, bool vectorized) {
  constexpr std::size_t kPerVec = sizeof(uint4) / sizeof(T);
  const std::size_t tid = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x;
  const std::size_t stride = std::size_t{gridDim.x} * blockDim.x;
  const std::size_t nvec = vectorized ? count / kPerVec : 0;
  for (std::size_t i = tid; i < nvec; i += stride) {
    const uint4 va = reinterpret_cast<const uint4*>(a)[i];
    const uint4 vb = reinterpret_cast<const uint4*>(b)[i];
    uint4 vd;
    const T* ea = reinterpret_cast<const T*>(&va);
    const T* eb = reinterpret_cast<const T*>(&vb);
    T* ed = reinterpret_cast<T*>(&vd);
#pragma unroll
    for (std::size_t k = 0; k < kPerVec; ++k) ed[k] = combine<T, Op>(ea[k], eb[k]);
    reinterpret_cast<uint4*>(dst)[i] = vd;
  }
  for (std::size_t i = nvec * kPerVec + tid; i < count; i += stride)
    dst[i] = combine<T, Op>(a[i], b[i]);
}

bool aligned16(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
}

template <typename T, typename Op>
Status launch(void* dst, const void* a, const void* b, std::size_t count, cudaStream_t stream) {
  constexpr std::size_t kPerVec = sizeof(uint4) / sizeof(T);
  const bool vectorized = aligned16(dst) && aligned16(a) && aligned16(b);
  const std::size_t work = vectorized ? count / kPerVec + kPerVec : count;
  constexpr unsigned kThreads = 256;
  const auto blocks =
      static_cast<unsigned>(std::min<std::size_t>((work + kThreads - 1) / kThreads, 4096));
  reduceKernel<T, Op><<<blocks, kThreads, 0, stream>>>(
      static_cast<T*>(dst), static_cast<const T*>(a), static_cast<const T*>(b), count, vectorized);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return {Code::systemError,
            std::string("reduce kernel launch failed: ") + cudaGetErrorString(err)};
  }
  return {};
}

// One dispatch over dtype x op: a single templated body serves every pair.
template <typename Op>
Status launchFor(DataType type, void* dst, const void* a, const void* b, std::size_t count,
                 cudaStream_t s) {
  switch (type) {
    case DataType::f64:
      return launch<double, Op>(dst, a, b, count, s);
    case DataType::f32:
      return launch<float, Op>(dst, a, b, count, s);
    case DataType::f16:
      return launch<__half, Op>(dst, a, b, count, s);
    case DataType::bf16:
      return launch<__nv_bfloat16, Op>(dst, a, b, count, s);
    case DataType::f8e4m3:
      return launch<__nv_fp8_e4m3, Op>(dst, a, b, count, s);
    case DataType::f8e5m2:
      return launch<__nv_fp8_e5m2, Op>(dst, a, b, count, s);
    case DataType::i8:
      return launch<std::int8_t, Op>(dst, a, b, count, s);
    case DataType::u8:
      return launch<std::uint8_t, Op>(dst, a, b, count, s);
    case DataType::i32:
      return launch<std::int32_t, Op>(dst, a, b, count, s);
    case DataType::u32:
      return launch<std::uint32_t, Op>(dst, a, b, count, s);
    case DataType::i64:
      return launch<std::int64_t, Op>(dst, a, b, count, s);
    case DataType::u64:
      return launch<std::uint64_t, Op>(dst, a, b, count, s);
  }
  return invalidArgument("reduce: invalid data type " + std::to_string(static_cast<int>(type)));
}

}  // namespace

Status reduce(void* dst, const void* a, const void* b, std::size_t count, DataType type, RedOp op,
              void* stream) {
  if (count == 0) return {};
  if (dst == nullptr || a == nullptr || b == nullptr) {
    return invalidArgument("reduce: null buffer with count " + std::to_string(count));
  }
  const auto s = static_cast<cudaStream_t>(stream);
  switch (op) {
    case RedOp::sum:
      return launchFor<Sum>(type, dst, a, b, count, s);
    case RedOp::prod:
      return launchFor<Prod>(type, dst, a, b, count, s);
    case RedOp::min:
      return launchFor<Min>(type, dst, a, b, count, s);
    case RedOp::max:
      return launchFor<Max>(type, dst, a, b, count, s);
    case RedOp::avg:
      break;
  }
  return invalidArgument("reduce: op " + std::string(name(op)) +
                         " is not element-wise (avg is sum, then a scale by 1/nranks)");
}

}  // namespace weft::device
