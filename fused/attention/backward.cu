// The backward pass's checks and delta; its kernels are backward_mma.cu's.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "fused/attention/backward.hpp"
#include "fused/attention/local.hpp"

namespace weft::fused::attention {
namespace {

constexpr int kThreads = 128;

__device__ float warpSum(float x) {
  for (int o = 16; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// A warp a row (token, head).
template <typename T>
__global__ void deltaKernel(const T* out, const T* dOut, std::size_t tokens, int heads, int dim,
                            float* delta) {
  const std::size_t rows = tokens * static_cast<std::size_t>(heads);
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const std::size_t warps = std::size_t{gridDim.x} * (blockDim.x / 32);
  for (std::size_t row = (blockIdx.x * std::size_t{blockDim.x} + threadIdx.x) / 32; row < rows;
       row += warps) {
    const std::size_t at = row * static_cast<std::size_t>(dim);
    float s = 0;
    for (int c = lane; c < dim; c += 32)
      s = fmaf(static_cast<float>(out[at + c]), static_cast<float>(dOut[at + c]), s);
    s = warpSum(s);
    if (lane == 0) delta[(row % heads) * tokens + row / heads] = s;
  }
}

Status launched(const char* what) {
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess)
    return Status(Code::systemError, std::string(what) + ": " + cudaGetErrorString(e));
  return {};
}

}  // namespace

Status checkBackward(const LocalBackward& b) {
  // The forward's checks on the same shape, then the backward's own buffers.
  LocalAttention shape;
  shape.q = b.q, shape.k = b.k, shape.v = b.v, shape.cuSeqlensQ = b.cuSeqlensQ;
  shape.cuSeqlensK = b.cuSeqlensK, shape.sequences = b.sequences, shape.heads = b.heads;
  shape.kvHeads = b.kvHeads, shape.dim = b.dim, shape.type = b.type;
  shape.out = b.dq, shape.lse = const_cast<float*>(b.lse);
  if (Status s = checkLocal(shape); !s) return Status(s.code(), "backward: " + s.message());
  if (b.sequences > 0 &&
      (b.dOut == nullptr || b.delta == nullptr || b.dk == nullptr || b.dv == nullptr))
    return invalidArgument("attention backward: dOut, delta, dk and dv must not be NULL");
  return {};
}

Status computeDelta(const void* out, const void* dOut, DataType type, std::size_t tokens, int heads,
                    int dim, float* delta, void* stream) {
  if (type != DataType::bf16 && type != DataType::f16)
    return invalidArgument("attention delta: " + std::string(name(type)) +
                           " is not attended (bf16 and f16 are)");
  if (heads < 0 || dim < 0)
    return invalidArgument("attention delta: " + std::to_string(heads) + " heads of dim " +
                           std::to_string(dim));
  const std::size_t rows = tokens * static_cast<std::size_t>(heads);
  if (rows == 0) return {};
  if (out == nullptr || dOut == nullptr || delta == nullptr)
    return invalidArgument("attention delta: out, dOut and delta must not be NULL");
  const auto grid = static_cast<unsigned>(
      std::clamp<std::size_t>((rows + kThreads / 32 - 1) / (kThreads / 32), 1, 65535));
  const auto s = static_cast<cudaStream_t>(stream);
  if (type == DataType::bf16)
    deltaKernel<<<grid, kThreads, 0, s>>>(static_cast<const __nv_bfloat16*>(out),
                                          static_cast<const __nv_bfloat16*>(dOut), tokens, heads,
                                          dim, delta);
  else
    deltaKernel<<<grid, kThreads, 0, s>>>(static_cast<const __half*>(out),
                                          static_cast<const __half*>(dOut), tokens, heads, dim,
                                          delta);
  return launched("attention delta");
}

Status attendBackwardOnDevice(const LocalBackward& b, void* stream) {
  if (Status s = checkBackward(b); !s) return s;
  if (b.sequences == 0 || b.maxSeqlenQ == 0 || b.maxSeqlenK == 0) return {};  // no pair
  return attendBackwardMma(b, stream);
}

}  // namespace weft::fused::attention
