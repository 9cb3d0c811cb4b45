// The backward pass on Hopper (sm_90a): backward_mma.cu's two kernels on warpgroup products
// (wgmma.cuh), each block two warpgroups of 64 rows over tiles of 64 of the other side through
// 128-byte-swizzled shared memory, the next tile loading (cp.async) while the current one is
// used. Per tile a warpgroup issues the two score-sized products (both operands from shared
// memory), turns the first into P while the second runs, and multiplies P (and dS) from
// registers into its sums, the other side's tile read N-major.
//   dq: 128 queries a block: S = q·kᵀ, dP = dO·vᵀ, dq += dS·k.
//   dk, dv: 128 keys of one K/V head a block, over the group's query heads' tiles:
//       Sᵀ = k·qᵀ, dPᵀ = v·dOᵀ, dv += Pᵀ·dO, dk += dSᵀ·q.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "fused/attention/backward.hpp"
#include "fused/attention/backward_wgmma.hpp"
#include "fused/attention/mma.cuh"
#include "fused/attention/softmax.cuh"
#include "fused/attention/wgmma.cuh"

namespace weft::fused::attention {
namespace {

constexpr int kThreads = 256, kRows = 128, kCols = 64, kRowBytes = 128;

template <int D, int R, typename T>
__device__ __forceinline__ void loadSwizzled(T* s, const T* g, std::size_t ld, int valid) {
  loadRows<D, kThreads>(s, g, ld, R, valid, [](int r, int c) { return swizzled128<R>(r, 8 * c); });
}

// The block's 1024-byte-aligned shared memory (the launch adds the slack).
__device__ __forceinline__ unsigned char* alignedShared(unsigned char* smem) {
  const std::uint32_t at = sharedAddress(smem);
  return smem + ((at + 1023) / 1024 * 1024 - at);
}

// Descriptors of a swizzled tile of R rows: K-major for dims 16s..16s+15 of rows from `row`;
// N-major (transposed) for rows 16s..16s+15.
template <int R>
__device__ __forceinline__ std::uint64_t kMajor(std::uint32_t tile, int row, int s) {
  return descriptor(tile + (s / 4) * R * kRowBytes + row * kRowBytes + (s % 4) * 32, 16, 1024);
}
template <int R>
__device__ __forceinline__ std::uint64_t nMajor(std::uint32_t tile, int s) {
  return descriptor(tile + s * 16 * kRowBytes, R * kRowBytes, 1024);
}

// A row's log-sum-exp in base 2 for the exponent (−inf, no key: +inf, so that P is 0).
__device__ __forceinline__ float lse2(float lse) {
  return lse == -INFINITY ? INFINITY : lse * kLog2e;
}

// c (64 × kCols) = a · bᵀ over the D dims: a the warpgroup's 64 rows (from `row`) of an R-row
// tile, b a kCols-row tile; committed as one group.
template <typename T, int D, int R>
__device__ __forceinline__ void timesT(float (&c)[kCols / 8][4], std::uint32_t a, int row,
                                       std::uint32_t b) {
#pragma unroll
  for (int s = 0; s < D / 16; ++s)
    wgmmaSS<T, kCols>(c, kMajor<R>(a, row, s), kMajor<kCols>(b, 0, s), s > 0);
  wgmmaCommit();
}
// o (64 × D) += p · x: p (64 × kCols) in mma's accumulator layout, x a kCols-row tile; committed
// as one group. f holds p's fragments until the products are waited for.
template <typename T, int D>
__device__ __forceinline__ void times(float (&o)[D / 8][4], std::uint32_t (&f)[kCols / 16][4],
                                      const float (&p)[kCols / 8][4], std::uint32_t x) {
#pragma unroll
  for (int s = 0; s < kCols / 16; ++s) probabilities<T>(f[s], p, s);
  wgmmaFence();
#pragma unroll
  for (int s = 0; s < kCols / 16; ++s) wgmmaRS<T, D>(o, f[s], nMajor<kCols>(x, s), 1);
  wgmmaCommit();
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads, 1) dqWgmmaKernel(LocalBackward b) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kDimTiles = D / 8;
  extern __shared__ __align__(1024) unsigned char smem[];
  T* qs = reinterpret_cast<T*>(alignedShared(smem));
  T* dos = qs + kRows * D;
  T* ks = dos + kRows * D;     // two tiles of keys
  T* vs = ks + 2 * kCols * D;  // and of values
  const int seq = static_cast<int>(blockIdx.z), head = static_cast<int>(blockIdx.y);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4, wg = warp / 4;
  const int bq = b.cuSeqlensQ[seq], bk = b.cuSeqlensK[seq];
  const Span qp = partOf(b.piece.q, b.cuSeqlensQ[seq + 1] - bq);
  const Span kp = partOf(b.piece.kv, b.cuSeqlensK[seq + 1] - bk);
  const int qLen = qp.hi - qp.lo, kLen = kp.hi - kp.lo;
  const int tiles = (qLen + kRows - 1) / kRows;
  if (static_cast<int>(blockIdx.x) >= tiles) return;
  const int tile =
      b.piece.causal ? tiles - 1 - static_cast<int>(blockIdx.x) : static_cast<int>(blockIdx.x);
  const int r0 = tile * kRows, rows = min(kRows, qLen - r0);
  const int keyEnd = b.piece.causal ? min(kLen, r0 + rows) : kLen;
  const int keyTiles = (max(keyEnd, 0) + kCols - 1) / kCols;
  if (keyTiles == 0) return;  // no key: nothing to add
  const int kvHead = head / (b.heads / b.kvHeads);
  const std::size_t ldq = static_cast<std::size_t>(b.heads) * D;
  const std::size_t ldk = static_cast<std::size_t>(b.kvHeads) * D;
  const std::size_t at =
      (static_cast<std::size_t>(bq + qp.lo + r0) * b.heads + static_cast<std::size_t>(head)) * D;
  const std::size_t kvAt = (static_cast<std::size_t>(bk + kp.lo) * b.kvHeads + kvHead) * D;
  const T* k = static_cast<const T*>(b.k) + kvAt;
  const T* v = static_cast<const T*>(b.v) + kvAt;

  loadSwizzled<D, kRows>(qs, static_cast<const T*>(b.q) + at, ldq, rows);
  loadSwizzled<D, kRows>(dos, static_cast<const T*>(b.dOut) + at, ldq, rows);
  loadSwizzled<D, kCols>(ks, k, ldk, min(kCols, keyEnd));
  loadSwizzled<D, kCols>(vs, v, ldk, min(kCols, keyEnd));
  const int rowOf[2] = {r0 + warp * 16 + g, r0 + warp * 16 + g + 8};  // within the part
  float l2[2], dl[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const bool in = rowOf[h] < qLen;
    const std::size_t row = static_cast<std::size_t>(head) * b.tokensQ +
                            static_cast<std::size_t>(bq + qp.lo + rowOf[h]);
    l2[h] = in ? lse2(b.lse[row]) : INFINITY;
    dl[h] = in ? b.delta[row] : 0.0f;
  }
  const float scale2 = b.scale * kLog2e;
  const std::uint32_t qAt = sharedAddress(qs), doAt = sharedAddress(dos);
  float dq[kDimTiles][4] = {};

  for (int kt = 0; kt < keyTiles; ++kt) {
    const int buf = kt % 2;
    awaitLoads<0>();
    sharedToAsyncProxy();
    __syncthreads();  // this tile landed everywhere; the other buffers' last readers are done
    if (kt + 1 < keyTiles) {
      const int next = (kt + 1) * kCols;
      loadSwizzled<D, kCols>(ks + (1 - buf) * kCols * D, k + static_cast<std::size_t>(next) * ldk,
                             ldk, min(kCols, keyEnd - next));
      loadSwizzled<D, kCols>(vs + (1 - buf) * kCols * D, v + static_cast<std::size_t>(next) * ldk,
                             ldk, min(kCols, keyEnd - next));
    }
    const std::uint32_t kAt = sharedAddress(ks + buf * kCols * D);
    const std::uint32_t vAt = sharedAddress(vs + buf * kCols * D);
    float s[kCols / 8][4], dp[kCols / 8][4];
    wgmmaFence();
    timesT<T, D, kRows>(s, qAt, 64 * wg, kAt);
    timesT<T, D, kRows>(dp, doAt, 64 * wg, vAt);
    wgmmaWait<1>();  // S
    const int base = kt * kCols;
    const bool edge = base + kCols > keyEnd || (b.piece.causal && base + kCols - 1 > r0);
#pragma unroll
    for (int n = 0; n < kCols / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = base + 8 * n + 2 * t + (e & 1), row = rowOf[e / 2];
        const bool out = edge && (key >= keyEnd || (b.piece.causal && key > row));
        s[n][e] = out ? 0.0f : exp2Fast(fmaf(s[n][e], scale2, -l2[e / 2]));  // P
      }
    }
    wgmmaWait<0>();  // dP
#pragma unroll
    for (int n = 0; n < kCols / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] *= dp[n][e] - dl[e / 2];  // dS
    }
    std::uint32_t f[kCols / 16][4];
    times<T, D>(dq, f, s, kAt);
    wgmmaWait<0>();
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (rowOf[h] >= qLen) continue;
    float* out = b.dq + at + static_cast<std::size_t>(warp * 16 + g + 8 * h) * ldq + 2 * t;
#pragma unroll
    for (int d = 0; d < kDimTiles; ++d) {
      float2* y = reinterpret_cast<float2*>(out + 8 * d);
      const float2 was = *y;
      *y = make_float2(was.x + b.scale * dq[d][2 * h], was.y + b.scale * dq[d][2 * h + 1]);
    }
  }
#else
  (void)b;
  __trap();  // built for sm_90a only
#endif
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads, 1) dkdvWgmmaKernel(LocalBackward b) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kDimTiles = D / 8;
  extern __shared__ __align__(1024) unsigned char smem[];
  T* ks = reinterpret_cast<T*>(alignedShared(smem));
  T* vs = ks + kRows * D;
  T* qs = vs + kRows * D;                                     // two tiles of queries
  T* dos = qs + 2 * kCols * D;                                // and of their dO
  auto* l2s = reinterpret_cast<float*>(dos + 2 * kCols * D);  // two tiles' lse (base 2)
  float* dls = l2s + 2 * kCols;                               // and delta
  const int seq = static_cast<int>(blockIdx.z), kvHead = static_cast<int>(blockIdx.y);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4, wg = warp / 4;
  const int bq = b.cuSeqlensQ[seq], bk = b.cuSeqlensK[seq];
  const Span qp = partOf(b.piece.q, b.cuSeqlensQ[seq + 1] - bq);
  const Span kp = partOf(b.piece.kv, b.cuSeqlensK[seq + 1] - bk);
  const int qLen = qp.hi - qp.lo, kLen = kp.hi - kp.lo;
  const int c0 = static_cast<int>(blockIdx.x) * kRows;  // the block's first key, in the part
  if (c0 >= kLen) return;
  const int keys = min(kRows, kLen - c0);
  // Under the mask a key is seen by the queries from its own index on.
  const int qStart = b.piece.causal ? c0 : 0;
  const int qTiles = qLen > qStart ? (qLen - qStart + kCols - 1) / kCols : 0;
  const int group = b.heads / b.kvHeads;
  const int work = group * qTiles;  // (head, query tile) pairs
  if (work == 0) return;
  const std::size_t ldq = static_cast<std::size_t>(b.heads) * D;
  const std::size_t ldk = static_cast<std::size_t>(b.kvHeads) * D;
  const std::size_t kvAt =
      (static_cast<std::size_t>(bk + kp.lo + c0) * b.kvHeads + static_cast<std::size_t>(kvHead)) *
      D;
  const int keyOf[2] = {c0 + warp * 16 + g, c0 + warp * 16 + g + 8};

  // Work item i's queries: head, first query (in the part), its rows' q and dO, lse and delta.
  auto load = [&](int i, int buf) {
    const int head = kvHead * group + i / qTiles, first = qStart + (i % qTiles) * kCols;
    const int valid = min(kCols, qLen - first);
    const std::size_t token = static_cast<std::size_t>(bq + qp.lo + first);
    const std::size_t at = (token * b.heads + static_cast<std::size_t>(head)) * D;
    loadSwizzled<D, kCols>(qs + buf * kCols * D, static_cast<const T*>(b.q) + at, ldq, valid);
    loadSwizzled<D, kCols>(dos + buf * kCols * D, static_cast<const T*>(b.dOut) + at, ldq, valid);
    for (int x = static_cast<int>(threadIdx.x); x < kCols; x += kThreads) {
      const std::size_t row =
          static_cast<std::size_t>(head) * b.tokensQ + token + static_cast<std::size_t>(x);
      l2s[buf * kCols + x] = x < valid ? lse2(b.lse[row]) : INFINITY;
      dls[buf * kCols + x] = x < valid ? b.delta[row] : 0.0f;
    }
  };
  loadSwizzled<D, kRows>(ks, static_cast<const T*>(b.k) + kvAt, ldk, keys);
  loadSwizzled<D, kRows>(vs, static_cast<const T*>(b.v) + kvAt, ldk, keys);
  load(0, 0);
  const float scale2 = b.scale * kLog2e;
  const std::uint32_t kAt = sharedAddress(ks), vAt = sharedAddress(vs);
  float dk[kDimTiles][4] = {}, dv[kDimTiles][4] = {};

  for (int i = 0; i < work; ++i) {
    const int buf = i % 2;
    awaitLoads<0>();
    sharedToAsyncProxy();
    __syncthreads();  // this tile landed everywhere; the other buffers' last readers are done
    if (i + 1 < work) load(i + 1, 1 - buf);
    const std::uint32_t qAt = sharedAddress(qs + buf * kCols * D);
    const std::uint32_t doAt = sharedAddress(dos + buf * kCols * D);
    const float* l2 = l2s + buf * kCols;
    const float* dl = dls + buf * kCols;
    float s[kCols / 8][4], dp[kCols / 8][4];  // Sᵀ and dPᵀ: keys × queries
    wgmmaFence();
    timesT<T, D, kRows>(s, kAt, 64 * wg, qAt);
    timesT<T, D, kRows>(dp, vAt, 64 * wg, doAt);
    const int first = qStart + (i % qTiles) * kCols;
    const bool edge =
        first + kCols > qLen || keys < kRows || (b.piece.causal && first < c0 + kRows - 1);
    wgmmaWait<1>();  // Sᵀ
#pragma unroll
    for (int n = 0; n < kCols / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = 8 * n + 2 * t + (e & 1), query = first + col, key = keyOf[e / 2];
        const bool out = edge && (query >= qLen || key >= kLen || (b.piece.causal && key > query));
        s[n][e] = out ? 0.0f : exp2Fast(fmaf(s[n][e], scale2, -l2[col]));  // Pᵀ
      }
    }
    std::uint32_t pf[kCols / 16][4], sf[kCols / 16][4];
    times<T, D>(dv, pf, s, doAt);
    wgmmaWait<1>();  // dPᵀ
#pragma unroll
    for (int n = 0; n < kCols / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) dp[n][e] = s[n][e] * (dp[n][e] - dl[8 * n + 2 * t + (e & 1)]);
    }
    times<T, D>(dk, sf, dp, qAt);
    wgmmaWait<0>();
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (keyOf[h] >= kLen) continue;
    const std::size_t row = kvAt + static_cast<std::size_t>(warp * 16 + g + 8 * h) * ldk + 2 * t;
#pragma unroll
    for (int d = 0; d < kDimTiles; ++d) {
      float2* y = reinterpret_cast<float2*>(b.dk + row + 8 * d);
      float2 was = *y;
      *y = make_float2(was.x + b.scale * dk[d][2 * h], was.y + b.scale * dk[d][2 * h + 1]);
      y = reinterpret_cast<float2*>(b.dv + row + 8 * d);
      was = *y;
      *y = make_float2(was.x + dv[d][2 * h], was.y + dv[d][2 * h + 1]);
    }
  }
#else
  (void)b;
  __trap();  // built for sm_90a only
#endif
}

template <typename T, int D>
Status launch(const LocalBackward& b, cudaStream_t stream) {
  constexpr int kTile = D * static_cast<int>(sizeof(T));
  constexpr int kDq = (2 * kRows + 4 * kCols) * kTile + 1024;
  constexpr int kDkdv = kDq + 4 * kCols * static_cast<int>(sizeof(float));
  if (Status s = allowShared(dqWgmmaKernel<T, D>, kDq, "attention backward"); !s) return s;
  if (Status s = allowShared(dkdvWgmmaKernel<T, D>, kDkdv, "attention backward"); !s) return s;
  const auto seqs = static_cast<unsigned>(b.sequences);
  dqWgmmaKernel<T, D><<<dim3(static_cast<unsigned>((b.maxSeqlenQ + kRows - 1) / kRows),
                             static_cast<unsigned>(b.heads), seqs),
                        kThreads, kDq, stream>>>(b);
  dkdvWgmmaKernel<T, D><<<dim3(static_cast<unsigned>((b.maxSeqlenK + kRows - 1) / kRows),
                               static_cast<unsigned>(b.kvHeads), seqs),
                          kThreads, kDkdv, stream>>>(b);
  return launched("attention backward");
}

}  // namespace

Status loadWgmmaBackwardKernels() {
  return loadKernels("attention backward: loading the kernels", dqWgmmaKernel<__nv_bfloat16, 64>,
                     dqWgmmaKernel<__nv_bfloat16, 128>, dqWgmmaKernel<__half, 64>,
                     dqWgmmaKernel<__half, 128>, dkdvWgmmaKernel<__nv_bfloat16, 64>,
                     dkdvWgmmaKernel<__nv_bfloat16, 128>, dkdvWgmmaKernel<__half, 64>,
                     dkdvWgmmaKernel<__half, 128>);
}

Status attendBackwardWgmma(const LocalBackward& b, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  if (b.type == DataType::bf16)
    return b.dim == 64 ? launch<__nv_bfloat16, 64>(b, s) : launch<__nv_bfloat16, 128>(b, s);
  return b.dim == 64 ? launch<__half, 64>(b, s) : launch<__half, 128>(b, s);
}

}  // namespace weft::fused::attention
