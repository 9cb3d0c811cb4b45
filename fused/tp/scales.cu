#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "fused/tp/scales.hpp"

namespace weft::fused::tp {
namespace {

// One thread a value: consecutive threads write consecutive rows of A's (coalesced stores; the
// loads stride by `blocks`, a few KB in all).
__global__ void repackKernel(ScaleRepack r) {
  const std::size_t per = r.rows * r.blocks;
  const std::size_t total = per * static_cast<std::size_t>(r.batches);
  const std::size_t stride = std::size_t{gridDim.x} * blockDim.x;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < total; i += stride) {
    const std::size_t b = i / per, rest = i % per, q = rest / r.rows, row = rest % r.rows;
    const std::size_t to = r.transposed ? q * r.ld + row : row * r.ld + q;
    r.dst[b * r.dstBatch + to] = r.src[b * r.srcBatch + row * r.blocks + q];
  }
}

Status failed(cudaError_t e) {
  return Status(Code::systemError,
                std::string("tensor-parallel fp8 scales: ") + cudaGetErrorString(e));
}

}  // namespace

Status loadScaleKernels() {
  cudaFuncAttributes attr;
  if (cudaError_t e = cudaFuncGetAttributes(&attr, repackKernel); e != cudaSuccess)
    return failed(e);
  return {};
}

Status repackScales(const ScaleRepack& r, void* stream) {
  const std::size_t total = r.rows * r.blocks * static_cast<std::size_t>(r.batches);
  if (total == 0) return {};
  constexpr unsigned kThreads = 256;
  const auto grid =
      static_cast<unsigned>(std::clamp<std::size_t>((total + kThreads - 1) / kThreads, 1, 1024));
  repackKernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(r);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return failed(e);
  return {};
}

}  // namespace weft::fused::tp
