#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "fused/tp/sum.hpp"
#include "src/device/arith.cuh"

namespace weft::fused::tp {
namespace {

// 16-byte vectors where the blocks allow them, then a scalar tail; f32 sums in block order.
template <typename T>
__global__ void sumKernel(T* out, const BlockList blocks, std::size_t values, bool vectorized) {
  constexpr int kPerVec = sizeof(uint4) / sizeof(T);
  const std::size_t tid = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x;
  const std::size_t stride = std::size_t{gridDim.x} * blockDim.x;
  const std::size_t nvec = vectorized ? values / kPerVec : 0;
  for (std::size_t i = tid; i < nvec; i += stride) {
    float acc[kPerVec] = {};
    for (int b = 0; b < blocks.count; ++b) {
      const uint4 v = static_cast<const uint4*>(blocks.at[b])[i];
      const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
      for (int x = 0; x < kPerVec; ++x) acc[x] += static_cast<float>(e[x]);
    }
    uint4 o;
    T* e = reinterpret_cast<T*>(&o);
#pragma unroll
    for (int x = 0; x < kPerVec; ++x) e[x] = static_cast<T>(acc[x]);
    reinterpret_cast<uint4*>(out)[i] = o;
  }
  for (std::size_t i = nvec * kPerVec + tid; i < values; i += stride) {
    float acc = 0;
    for (int b = 0; b < blocks.count; ++b)
      acc += static_cast<float>(static_cast<const T*>(blocks.at[b])[i]);
    out[i] = static_cast<T>(acc);
  }
}

// The types the GEMMs produce (Gemms::supports).
template <typename T>
constexpr bool kSummed =
    std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half> || std::is_same_v<T, float>;

Status failed(cudaError_t e) {
  return Status(Code::systemError, std::string("tensor-parallel sum: ") + cudaGetErrorString(e));
}

template <typename T>
Status launch(void* out, const BlockList& blocks, std::size_t values, cudaStream_t stream) {
  constexpr std::size_t kPerVec = sizeof(uint4) / sizeof(T);
  auto aligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  bool vectorized = aligned(out) && values % kPerVec == 0;
  for (int b = 0; b < blocks.count; ++b) vectorized = vectorized && aligned(blocks.at[b]);
  const std::size_t work = vectorized ? values / kPerVec : values;
  constexpr unsigned kThreads = 256;
  const auto grid =
      static_cast<unsigned>(std::clamp<std::size_t>((work + kThreads - 1) / kThreads, 1, 2048));
  sumKernel<T><<<grid, kThreads, 0, stream>>>(static_cast<T*>(out), blocks, values, vectorized);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return failed(e);
  return {};
}

}  // namespace

Status loadSumKernels() {
  for (DataType type : {DataType::bf16, DataType::f16, DataType::f32}) {
    const cudaError_t e = device::withType(type, [](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      if constexpr (kSummed<T>) {
        cudaFuncAttributes attr;
        return cudaFuncGetAttributes(&attr, sumKernel<T>);
      }
      return cudaSuccess;
    });
    if (e != cudaSuccess) return failed(e);
  }
  return {};
}

Status sumBlocks(void* out, const BlockList& blocks, std::size_t values, DataType type,
                 void* stream) {
  if (blocks.count < 1 || blocks.count > BlockList::kMost)
    return invalidArgument("tensor-parallel sum: " + std::to_string(blocks.count) + " blocks");
  return device::withType(type, [&](auto* tag) -> Status {
    using T = std::remove_pointer_t<decltype(tag)>;
    if constexpr (kSummed<T>)
      return launch<T>(out, blocks, values, static_cast<cudaStream_t>(stream));
    return invalidArgument("tensor-parallel sum: " + std::string(name(type)) +
                           " is not summed here");
  });
}

Status sumBlocks(void* out, const void* blocks, int count, std::size_t values, DataType type,
                 void* stream) {
  if (count < 1 || count > BlockList::kMost)
    return invalidArgument("tensor-parallel sum: " + std::to_string(count) + " blocks");
  BlockList list;
  const std::size_t bytes = values * sizeOf(type);
  for (int b = 0; b < count; ++b)
    list.at[list.count++] =
        static_cast<const std::byte*>(blocks) + static_cast<std::size_t>(b) * bytes;
  return sumBlocks(out, list, values, type, stream);
}

}  // namespace weft::fused::tp
