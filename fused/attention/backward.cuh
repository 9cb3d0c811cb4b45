// The backward kernels' shared pieces (backward_mma.cu, backward_wgmma.cu): a dk/dv block's keys
// and the query tiles they meet, the queries' log-sum-exp and delta, and the f32 sums' updates.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>

#include "fused/attention/backward.hpp"
#include "fused/attention/mma.cuh"

namespace weft::fused::attention {

// A row's log-sum-exp in base 2 for the exponent (−inf, no key: +inf, so that P is 0).
__device__ __forceinline__ float lse2(float lse) {
  return lse == -INFINITY ? INFINITY : lse * kLog2e;
}

// A dq block's rows' (row[h] within the part) lse in base 2 and delta; rows past the part's
// queries +inf and 0.
template <typename T, int D>
__device__ __forceinline__ void rowStats(const LocalBackward& b, const QueryBlock<T, D>& q,
                                         const int (&row)[2], float (&l2)[2], float (&dl)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const bool in = row[h] < q.qLen;
    const std::size_t at =
        static_cast<std::size_t>(q.head) * b.tokensQ + q.first + static_cast<std::size_t>(row[h]);
    l2[h] = in ? lse2(b.lse[at]) : INFINITY;
    dl[h] = in ? b.delta[at] : 0.0f;
  }
}

// A dk/dv block (blockIdx: block, K/V head, sequence): R keys from c0 of one K/V head, and the
// work it meets, (query head of its group, tile of Cols queries) pairs.
struct KeyBlock {
  int kvHead, c0, keys, kLen, qLen;
  int qStart, qTiles, group, work;  // under the mask a key meets the queries from its own on
  std::size_t ldq, ldk, kvAt;       // kvAt: the block's first key's offset (elements)
  std::size_t firstQ;               // the part's first query token
};
// False where the block has no key or no work.
template <int D>
__device__ __forceinline__ bool keyBlock(const LocalBackward& b, int R, int Cols, KeyBlock& k) {
  const int seq = static_cast<int>(blockIdx.z);
  k.kvHead = static_cast<int>(blockIdx.y);
  const int bq = b.cuSeqlensQ[seq], bk = b.cuSeqlensK[seq];
  const Span qp = partOf(b.piece.q, b.cuSeqlensQ[seq + 1] - bq);
  const Span kp = partOf(b.piece.kv, b.cuSeqlensK[seq + 1] - bk);
  k.qLen = qp.hi - qp.lo, k.kLen = kp.hi - kp.lo;
  k.c0 = static_cast<int>(blockIdx.x) * R;
  if (k.c0 >= k.kLen) return false;
  k.keys = min(R, k.kLen - k.c0);
  k.qStart = b.piece.causal ? k.c0 : 0;
  k.qTiles = k.qLen > k.qStart ? (k.qLen - k.qStart + Cols - 1) / Cols : 0;
  k.group = b.heads / b.kvHeads;
  k.work = k.group * k.qTiles;
  k.ldq = static_cast<std::size_t>(b.heads) * D;
  k.ldk = static_cast<std::size_t>(b.kvHeads) * D;
  k.kvAt = (static_cast<std::size_t>(bk + kp.lo + k.c0) * b.kvHeads + k.kvHead) * D;
  k.firstQ = static_cast<std::size_t>(bq + qp.lo);
  return k.work > 0;
}
// Work item i's query head and first query (within the part).
__device__ __forceinline__ int itemHead(const KeyBlock& k, int i) {
  return k.kvHead * k.group + i / k.qTiles;
}
__device__ __forceinline__ int itemFirst(const KeyBlock& k, int i, int Cols) {
  return k.qStart + (i % k.qTiles) * Cols;
}
// Its Cols queries' lse (base 2) and delta into shared memory (past `valid`: +inf and 0).
template <int Threads>
__device__ __forceinline__ void loadQueryStats(const LocalBackward& b, int head, std::size_t token,
                                               int valid, int Cols, float* l2s, float* dls) {
  for (int x = static_cast<int>(threadIdx.x); x < Cols; x += Threads) {
    const std::size_t at =
        static_cast<std::size_t>(head) * b.tokensQ + token + static_cast<std::size_t>(x);
    l2s[x] = x < valid ? lse2(b.lse[at]) : INFINITY;
    dls[x] = x < valid ? b.delta[at] : 0.0f;
  }
}

// row += scale · x for a thread's row h of its warp's 16 (mma's accumulator layout): `row` the
// f32 row's column 2t.
template <int Tiles>
__device__ __forceinline__ void addRow(float* row, const float (&x)[Tiles][4], float scale, int h) {
#pragma unroll
  for (int d = 0; d < Tiles; ++d) {
    float2* y = reinterpret_cast<float2*>(row + 8 * d);
    const float2 was = *y;
    *y = make_float2(was.x + scale * x[d][2 * h], was.y + scale * x[d][2 * h + 1]);
  }
}

// Launches a pair of kernels: dq by blocks of `rows` queries of a head, dk/dv by blocks of `rows`
// keys of a K/V head, each with its dynamic shared memory.
inline Status launchBackward(const LocalBackward& b, int threads, int rows,
                             void (*dq)(LocalBackward), int dqBytes, void (*dkdv)(LocalBackward),
                             int dkdvBytes, cudaStream_t stream) {
  if (Status s = allowShared(dq, dqBytes, "attention backward"); !s) return s;
  if (Status s = allowShared(dkdv, dkdvBytes, "attention backward"); !s) return s;
  const auto seqs = static_cast<unsigned>(b.sequences), r = static_cast<unsigned>(rows);
  const auto blocks = [&](std::size_t n) { return static_cast<unsigned>((n + r - 1) / r); };
  const auto t = static_cast<unsigned>(threads);
  dq<<<dim3(blocks(b.maxSeqlenQ), static_cast<unsigned>(b.heads), seqs), t, dqBytes, stream>>>(b);
  dkdv<<<dim3(blocks(b.maxSeqlenK), static_cast<unsigned>(b.kvHeads), seqs), t, dkdvBytes,
         stream>>>(b);
  return launched("attention backward");
}

}  // namespace weft::fused::attention
