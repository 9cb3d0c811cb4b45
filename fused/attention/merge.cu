#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>

#include "fused/attention/backward.hpp"
#include "fused/attention/lse.cuh"
#include "fused/attention/merge.hpp"
#include "fused/cuda_steps.hpp"
#include "src/device/arith.cuh"

namespace weft::fused::attention {
namespace {

constexpr unsigned kThreads = 256;  // a warp a row

template <typename T>
__global__ void mergeKernel(float* out, float* lse, const T* block, const float* blockLse,
                            MergeShape s) {
  const std::size_t rows = s.tokens * s.heads;
  const unsigned lane = threadIdx.x % 32;
  const std::size_t warps = std::size_t{gridDim.x} * (blockDim.x / 32);
  for (std::size_t row = (blockIdx.x * std::size_t{blockDim.x} + threadIdx.x) / 32; row < rows;
       row += warps) {
    const std::size_t t = row / s.heads, h = row % s.heads, at = h * s.tokens + t;
    float& kept = lse[h * (s.lseStride != 0 ? s.lseStride : s.tokens) + t];
    const float l = s.fresh ? -INFINITY : kept, b = blockLse[at];
    float* o = out + row * s.dim;
    if (b == -INFINITY) {  // the block attended no key for this row
      if (s.fresh) {
        for (std::size_t d = lane; d < s.dim; d += 32) o[d] = 0;
        if (lane == 0) kept = -INFINITY;
      }
      continue;
    }
    const LseMerge w = mergeLse(l, b);
    const T* ob = block + row * s.dim;
    for (std::size_t d = lane; d < s.dim; d += 32)
      o[d] = (w.keep == 0 ? 0.0f : w.keep * o[d]) + w.take * static_cast<float>(ob[d]);
    __syncwarp();  // every lane has read its lse
    if (lane == 0) kept = w.merged;
  }
}

// delta of a row (token, head): Σ_c out · dOut, a warp a row.
template <typename T>
__global__ void deltaKernel(const T* out, const T* dOut, MergeShape s, float* delta) {
  const std::size_t rows = s.tokens * s.heads;
  const unsigned lane = threadIdx.x % 32;
  const std::size_t warps = std::size_t{gridDim.x} * (blockDim.x / 32);
  for (std::size_t row = (blockIdx.x * std::size_t{blockDim.x} + threadIdx.x) / 32; row < rows;
       row += warps) {
    const std::size_t at = row * s.dim;
    float sum = 0;
    for (std::size_t c = lane; c < s.dim; c += 32)
      sum = fmaf(static_cast<float>(out[at + c]), static_cast<float>(dOut[at + c]), sum);
    for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) delta[(row % s.heads) * s.tokens + row / s.heads] = sum;
  }
}

__global__ void resetKernel(float* out, std::size_t values, float* lse, std::size_t rows) {
  const std::size_t stride = std::size_t{gridDim.x} * blockDim.x;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < values;
       i += stride) {
    out[i] = 0;
    if (i < rows) lse[i] = -INFINITY;
  }
}

template <typename T>
__global__ void finishKernel(T* out, const float* partials, std::size_t values) {
  const std::size_t stride = std::size_t{gridDim.x} * blockDim.x;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < values; i += stride)
    out[i] = static_cast<T>(partials[i]);
}

unsigned gridOf(std::size_t work) {
  return static_cast<unsigned>(std::clamp<std::size_t>((work + kThreads - 1) / kThreads, 1, 4096));
}
// A warp a row.
unsigned rowGridOf(std::size_t rows) {
  return static_cast<unsigned>(
      std::clamp<std::size_t>((rows + kThreads / 32 - 1) / (kThreads / 32), 1, 65535));
}

template <typename T>
constexpr bool kMerged =
    std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half> || std::is_same_v<T, float>;

}  // namespace

Status loadMergeKernels() {
  return loadKernels("attention merges: loading the kernels", resetKernel,
                     finishKernel<__nv_bfloat16>, finishKernel<__half>, mergeKernel<__nv_bfloat16>,
                     mergeKernel<__half>, mergeKernel<float>, deltaKernel<__nv_bfloat16>,
                     deltaKernel<__half>);
}

Status resetPartials(float* out, float* lse, const MergeShape& shape, void* stream) {
  const std::size_t rows = shape.tokens * shape.heads, values = rows * shape.dim;
  if (values == 0) return {};
  resetKernel<<<gridOf(values), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(out, values, lse,
                                                                                  rows);
  return launched("attention partials");
}

Status finishPartials(void* out, const float* partials, DataType type, const MergeShape& shape,
                      void* stream) {
  const std::size_t values = shape.tokens * shape.heads * shape.dim;
  if (values == 0) return {};
  return device::withType(type, [&](auto* tag) -> Status {
    using T = std::remove_pointer_t<decltype(tag)>;
    if constexpr (kMerged<T> && !std::is_same_v<T, float>) {
      finishKernel<<<gridOf(values), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
          static_cast<T*>(out), partials, values);
      return launched("attention output");
    }
    return invalidArgument("attention: " + std::string(name(type)) + " outputs are not written");
  });
}

Status mergeOnDevice(float* out, float* lse, const void* blockOut, const float* blockLse,
                     DataType type, const MergeShape& shape, void* stream) {
  const std::size_t rows = shape.tokens * shape.heads;
  if (rows == 0 || shape.dim == 0) return {};
  return device::withType(type, [&](auto* tag) -> Status {
    using T = std::remove_pointer_t<decltype(tag)>;
    if constexpr (kMerged<T>) {
      mergeKernel<T><<<rowGridOf(rows), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
          out, lse, static_cast<const T*>(blockOut), blockLse, shape);
      return launched("attention merge");
    }
    return invalidArgument("attention merge: " + std::string(name(type)) +
                           " outputs are not merged (bf16, f16 and f32 are)");
  });
}

Status computeDelta(const void* out, const void* dOut, DataType type, std::size_t tokens, int heads,
                    int dim, float* delta, void* stream) {
  if (type != DataType::bf16 && type != DataType::f16)
    return invalidArgument("attention delta: " + std::string(name(type)) +
                           " is not attended (bf16 and f16 are)");
  if (heads < 0 || dim < 0)
    return invalidArgument("attention delta: " + std::to_string(heads) + " heads of dim " +
                           std::to_string(dim));
  const MergeShape shape{tokens, static_cast<std::size_t>(heads), static_cast<std::size_t>(dim)};
  const std::size_t rows = shape.tokens * shape.heads;
  if (rows == 0) return {};
  if (out == nullptr || dOut == nullptr || delta == nullptr)
    return invalidArgument("attention delta: out, dOut and delta must not be NULL");
  return device::withType(type, [&](auto* tag) -> Status {
    using T = std::remove_pointer_t<decltype(tag)>;
    if constexpr (kMerged<T> && !std::is_same_v<T, float>) {
      deltaKernel<T><<<rowGridOf(rows), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
          static_cast<const T*>(out), static_cast<const T*>(dOut), shape, delta);
    }
    return launched("attention delta");
  });
}

}  // namespace weft::fused::attention
