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

#include "fused/attention/backward.cuh"
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
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4, wg = warp / 4;
  QueryBlock<T, D> q;
  if (!queryBlock(b, kRows, q)) return;
  const int keyTiles = (q.keyEnd + kCols - 1) / kCols;
  if (keyTiles == 0) return;  // no key: nothing to add
  const T* k = q.k;
  const T* v = q.v;
  loadSwizzled<D, kRows>(qs, q.q, q.ldq, q.rows);
  loadSwizzled<D, kRows>(dos, static_cast<const T*>(b.dOut) + q.at, q.ldq, q.rows);
  loadSwizzled<D, kCols>(ks, k, q.ldk, min(kCols, q.keyEnd));
  loadSwizzled<D, kCols>(vs, v, q.ldk, min(kCols, q.keyEnd));
  const int rowOf[2] = {q.r0 + warp * 16 + g, q.r0 + warp * 16 + g + 8};  // within the part
  float l2[2], dl[2];
  rowStats(b, q, rowOf, l2, dl);
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
      loadSwizzled<D, kCols>(ks + (1 - buf) * kCols * D, k + static_cast<std::size_t>(next) * q.ldk,
                             q.ldk, min(kCols, q.keyEnd - next));
      loadSwizzled<D, kCols>(vs + (1 - buf) * kCols * D, v + static_cast<std::size_t>(next) * q.ldk,
                             q.ldk, min(kCols, q.keyEnd - next));
    }
    const std::uint32_t kAt = sharedAddress(ks + buf * kCols * D);
    const std::uint32_t vAt = sharedAddress(vs + buf * kCols * D);
    float s[kCols / 8][4], dp[kCols / 8][4];
    wgmmaFence();
    timesT<T, D, kRows>(s, qAt, 64 * wg, kAt);
    timesT<T, D, kRows>(dp, doAt, 64 * wg, vAt);
    wgmmaWait<1>();  // S
    const int base = kt * kCols;
    const bool edge = base + kCols > q.keyEnd || (b.piece.causal && base + kCols - 1 > q.r0);
#pragma unroll
    for (int n = 0; n < kCols / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = base + 8 * n + 2 * t + (e & 1), row = rowOf[e / 2];
        const bool out = edge && (key >= q.keyEnd || (b.piece.causal && key > row));
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
    if (rowOf[h] >= q.qLen) continue;
    addRow(b.dq + q.at + static_cast<std::size_t>(warp * 16 + g + 8 * h) * q.ldq + 2 * t, dq,
           b.scale, h);
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
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4, wg = warp / 4;
  KeyBlock kb;
  if (!keyBlock<D>(b, kRows, kCols, kb)) return;
  const int keyOf[2] = {kb.c0 + warp * 16 + g, kb.c0 + warp * 16 + g + 8};

  // Work item i's queries: head, first query (in the part), its rows' q and dO, lse and delta.
  auto load = [&](int i, int buf) {
    const int head = itemHead(kb, i), first = itemFirst(kb, i, kCols);
    const int valid = min(kCols, kb.qLen - first);
    const std::size_t token = kb.firstQ + static_cast<std::size_t>(first);
    const std::size_t at = (token * b.heads + static_cast<std::size_t>(head)) * D;
    loadSwizzled<D, kCols>(qs + buf * kCols * D, static_cast<const T*>(b.q) + at, kb.ldq, valid);
    loadSwizzled<D, kCols>(dos + buf * kCols * D, static_cast<const T*>(b.dOut) + at, kb.ldq,
                           valid);
    loadQueryStats<kThreads>(b, head, token, valid, kCols, l2s + buf * kCols, dls + buf * kCols);
  };
  loadSwizzled<D, kRows>(ks, static_cast<const T*>(b.k) + kb.kvAt, kb.ldk, kb.keys);
  loadSwizzled<D, kRows>(vs, static_cast<const T*>(b.v) + kb.kvAt, kb.ldk, kb.keys);
  load(0, 0);
  const float scale2 = b.scale * kLog2e;
  const std::uint32_t kAt = sharedAddress(ks), vAt = sharedAddress(vs);
  float dk[kDimTiles][4] = {}, dv[kDimTiles][4] = {};

  for (int i = 0; i < kb.work; ++i) {
    const int buf = i % 2;
    awaitLoads<0>();
    sharedToAsyncProxy();
    __syncthreads();  // this tile landed everywhere; the other buffers' last readers are done
    if (i + 1 < kb.work) load(i + 1, 1 - buf);
    const std::uint32_t qAt = sharedAddress(qs + buf * kCols * D);
    const std::uint32_t doAt = sharedAddress(dos + buf * kCols * D);
    const float* l2 = l2s + buf * kCols;
    const float* dl = dls + buf * kCols;
    float s[kCols / 8][4], dp[kCols / 8][4];  // Sᵀ and dPᵀ: keys × queries
    wgmmaFence();
    timesT<T, D, kRows>(s, kAt, 64 * wg, qAt);
    timesT<T, D, kRows>(dp, vAt, 64 * wg, doAt);
    const int first = itemFirst(kb, i, kCols);
    const bool edge =
        first + kCols > kb.qLen || kb.keys < kRows || (b.piece.causal && first < kb.c0 + kRows - 1);
    wgmmaWait<1>();  // Sᵀ
#pragma unroll
    for (int n = 0; n < kCols / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = 8 * n + 2 * t + (e & 1), query = first + col, key = keyOf[e / 2];
        const bool out =
            edge && (query >= kb.qLen || key >= kb.kLen || (b.piece.causal && key > query));
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
    if (keyOf[h] >= kb.kLen) continue;
    const std::size_t row =
        kb.kvAt + static_cast<std::size_t>(warp * 16 + g + 8 * h) * kb.ldk + 2 * t;
    addRow(b.dk + row, dk, b.scale, h);
    addRow(b.dv + row, dv, 1.0f, h);
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
  return launchBackward(b, kThreads, kRows, dqWgmmaKernel<T, D>, kDq, dkdvWgmmaKernel<T, D>, kDkdv,
                        stream);
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
  return withTypeAndDim(b.type, b.dim, [&](auto type, auto dim) {
    return launch<decltype(type), decltype(dim)::value>(b, s);
  });
}

}  // namespace weft::fused::attention
