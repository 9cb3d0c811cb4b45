#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <string>

#include "fused/attention/local.hpp"
#include "fused/attention/lse.cuh"

namespace weft::fused::attention {
namespace {

// A block: kRows query rows of one sequence and head, a warp kRowsPerWarp of them; keys in
// tiles of 32 (a lane each for the scores, then every lane sums the tile into its columns of
// the output), online softmax in f32.
constexpr int kWarps = 4, kRowsPerWarp = 4, kRows = kWarps * kRowsPerWarp, kKeys = 32;

struct Span {
  int lo, hi;  // within the sequence
};

__device__ Span partOf(Part p, int length) {
  const int half = length / 2;
  if (p == Part::first) return {0, half};
  if (p == Part::second) return {half, length};
  return {0, length};
}

__device__ float warpMax(float x) {
  for (int o = 16; o > 0; o /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ float warpSum(float x) {
  for (int o = 16; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

template <typename T, int D>
__global__ void __launch_bounds__(kWarps * 32) attendKernel(LocalAttention a) {
  constexpr int kCols = D / 32;  // of the output, a lane's
  __shared__ float qs[kRows][D];
  __shared__ float ks[kKeys][D + 1];  // + 1: lane j's row of keys in its own banks
  __shared__ float vs[kKeys][D];
  const int seq = static_cast<int>(blockIdx.z), head = static_cast<int>(blockIdx.y);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int bq = a.cuSeqlensQ[seq], bk = a.cuSeqlensK[seq];
  const Span qp = partOf(a.piece.q, a.cuSeqlensQ[seq + 1] - bq);
  const Span kp = partOf(a.piece.kv, a.cuSeqlensK[seq + 1] - bk);
  const int first = qp.lo + static_cast<int>(blockIdx.x) * kRows;
  if (first >= qp.hi) return;
  const int rows = min(kRows, qp.hi - first);
  const int kvHead = head / (a.heads / a.kvHeads);
  const T* q = static_cast<const T*>(a.q);
  const T* k = static_cast<const T*>(a.k);
  const T* v = static_cast<const T*>(a.v);
  for (int x = static_cast<int>(threadIdx.x); x < kRows * D; x += kWarps * 32) {
    const int r = x / D, c = x % D;
    qs[r][c] = r < rows
                   ? static_cast<float>(
                         q[(static_cast<std::size_t>(bq + first + r) * a.heads + head) * D + c])
                   : 0.0f;
  }
  float m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][kCols];
  for (int r = 0; r < kRowsPerWarp; ++r) {
    m[r] = -INFINITY, l[r] = 0;
    for (int c = 0; c < kCols; ++c) acc[r][c] = 0;
  }
  // Under the mask the block's last row sees keys up to its own index in the part.
  const int last = a.piece.causal ? min(kp.hi, kp.lo + (first + rows - 1 - qp.lo) + 1) : kp.hi;
  for (int t = kp.lo; t < last; t += kKeys) {
    __syncthreads();  // the tiles' last readers are done (and the queries are in)
    for (int x = static_cast<int>(threadIdx.x); x < kKeys * D; x += kWarps * 32) {
      const int j = x / D, c = x % D;
      const bool in = t + j < last;
      const std::size_t at = (static_cast<std::size_t>(bk + t + j) * a.kvHeads + kvHead) * D + c;
      ks[j][c] = in ? static_cast<float>(k[at]) : 0.0f;
      vs[j][c] = in ? static_cast<float>(v[at]) : 0.0f;
    }
    __syncthreads();
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int row = warp * kRowsPerWarp + r;  // of the block
      if (row >= rows) break;                   // the warp's alike
      const int key = t + lane;
      const bool allowed = key < last && (!a.piece.causal || key - kp.lo <= first + row - qp.lo);
      float s = -INFINITY;
      if (allowed) {
        float dot = 0;
#pragma unroll 16
        for (int c = 0; c < D; ++c) dot = fmaf(qs[row][c], ks[lane][c], dot);
        s = dot * a.scale;
      }
      const float mNew = fmaxf(m[r], warpMax(s));
      if (mNew == -INFINITY) continue;  // no key of this row yet
      const float p = allowed ? expf(s - mNew) : 0.0f;
      const float keep = m[r] == -INFINITY ? 0.0f : expf(m[r] - mNew);
      l[r] = l[r] * keep + warpSum(p);
      m[r] = mNew;
#pragma unroll
      for (int c = 0; c < kCols; ++c) acc[r][c] *= keep;
      for (int j = 0; j < kKeys; ++j) {
        const float pj = __shfl_sync(0xffffffffu, p, j);
#pragma unroll
        for (int c = 0; c < kCols; ++c) acc[r][c] = fmaf(pj, vs[j][lane + 32 * c], acc[r][c]);
      }
    }
  }
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int row = warp * kRowsPerWarp + r;
    if (row >= rows) break;
    const std::size_t token = static_cast<std::size_t>(bq + first + row);
    const std::size_t at = static_cast<std::size_t>(head) * a.tokensQ + token;
    const std::size_t o = (token * a.heads + head) * D;
    const float lse = l[r] > 0 ? m[r] + logf(l[r]) : -INFINITY;
    if (!a.merge) {
      T* out = static_cast<T*>(a.out);
#pragma unroll
      for (int c = 0; c < kCols; ++c)
        out[o + lane + 32 * c] = static_cast<T>(l[r] > 0 ? acc[r][c] / l[r] : 0.0f);
      if (lane == 0) a.lse[at] = lse;
      continue;
    }
    if (lse == -INFINITY) continue;  // nothing to merge in
    float* out = static_cast<float*>(a.out);
    const LseMerge w = mergeLse(a.lse[at], lse);
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      float* y = out + o + lane + 32 * c;
      *y = (w.keep == 0 ? 0.0f : w.keep * *y) + w.take * acc[r][c] / l[r];
    }
    __syncwarp();  // every lane has read lse[at]
    if (lane == 0) a.lse[at] = w.merged;
  }
}

template <typename T>
Status launch(const LocalAttention& a, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((a.maxSeqlenQ + kRows - 1) / kRows),
                  static_cast<unsigned>(a.heads), static_cast<unsigned>(a.sequences));
  if (a.dim == 64) {
    attendKernel<T, 64><<<grid, kWarps * 32, 0, stream>>>(a);
  } else {
    attendKernel<T, 128><<<grid, kWarps * 32, 0, stream>>>(a);
  }
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess)
    return Status(Code::systemError, std::string("attention: ") + cudaGetErrorString(e));
  return {};
}

}  // namespace

Status attendOnDevice(const LocalAttention& a, void* stream) {
  if (Status s = checkLocal(a); !s) return s;
  if (a.sequences == 0 || a.maxSeqlenQ == 0) return {};
  const auto s = static_cast<cudaStream_t>(stream);
  return a.type == DataType::bf16 ? launch<__nv_bfloat16>(a, s) : launch<__half>(a, s);
}

}  // namespace weft::fused::attention
