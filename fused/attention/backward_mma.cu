// The backward pass on the tensor cores (mma.cuh's pieces, the forward's scheme), and its
// checks (delta: merge.cu). Two kernels,
// each recomputing the probabilities P = 2^(scale·log2e·q·k − lse·log2e) and dP = dO·vᵀ from
// the final log-sum-exp and delta, so neither needs atomics and each keeps its sums in registers:
//   dq: a block of 64 query rows (16 a warp, q and dO fragments in registers), key tiles of 64
//       through shared memory: dS = P ∘ (dP − delta), dq += scale · dS·k.
//   dk, dv: a block of 64 keys of one K/V head (16 a warp), the group's query heads' tiles of 64
//       through shared memory: dv += Pᵀ·dO, dk += scale · (Pᵀ ∘ (dPᵀ − delta))·q.
// P and dP are computed twice (7 GEMM-sized products against FlashAttention-2's 5 with atomics).
#include <cuda_runtime.h>

#include <string>

#include "fused/attention/backward.cuh"
#include "fused/attention/backward.hpp"
#include "fused/attention/backward_wgmma.hpp"
#include "fused/attention/local.hpp"
#include "fused/attention/local_wgmma.hpp"
#include "fused/attention/mma.cuh"

namespace weft::fused::attention {
namespace {

constexpr int kWarps = 4, kThreads = 32 * kWarps, kRows = 16 * kWarps;
// The other side's tile: 64 rows, 32 at head dim 128 (which spills registers at 64).
template <int D>
constexpr int kCols = D == 128 ? 32 : 64;

// The warp's 16 rows' A fragments of a swizzled tile, for dims 16s..16s+15.
template <int D>
__device__ __forceinline__ void aFragment(std::uint32_t (&f)[4], const void* tile, int warp,
                                          int lane, int s) {
  const int mi = lane / 8, r = warp * 16 + (mi & 1) * 8 + lane % 8;
  ldmatrix4(f, static_cast<const std::uint16_t*>(tile) + swizzled<D>(r, 2 * s + mi / 2));
}
// c[n] += a · xᵀ for the tile's 64 rows (as columns of 8): x [row][d], dims 16s..16s+15.
template <typename T, int D>
__device__ __forceinline__ void timesRowsT(float (&c)[kCols<D> / 8][4], const std::uint32_t (&a)[4],
                                           const T* x, int lane, int s) {
#pragma unroll
  for (int np = 0; np < kCols<D> / 16; ++np) {
    const int mi = lane / 8, row = 16 * np + (mi / 2) * 8 + lane % 8;
    std::uint32_t b[4];
    ldmatrix4(b, x + swizzled<D>(row, 2 * s + (mi & 1)));
    mma<T>(c[2 * np], a, b[0], b[1]);
    mma<T>(c[2 * np + 1], a, b[2], b[3]);
  }
}
// o[d] += p · x with p the accumulators c (rows of the warp × the tile's 64 rows): x [row][d].
template <typename T, int D>
__device__ __forceinline__ void timesRows(float (&o)[D / 8][4], const float (&c)[kCols<D> / 8][4],
                                          const T* x, int lane) {
#pragma unroll
  for (int st = 0; st < kCols<D> / 16; ++st) {
    const std::uint32_t p[4] = {
        pack<T>(c[2 * st][0], c[2 * st][1]), pack<T>(c[2 * st][2], c[2 * st][3]),
        pack<T>(c[2 * st + 1][0], c[2 * st + 1][1]), pack<T>(c[2 * st + 1][2], c[2 * st + 1][3])};
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      const int mi = lane / 8, row = 16 * st + (mi & 1) * 8 + lane % 8;
      std::uint32_t b[4];
      ldmatrix4T(b, x + swizzled<D>(row, 2 * dp + mi / 2));
      mma<T>(o[2 * dp], p, b[0], b[1]);
      mma<T>(o[2 * dp + 1], p, b[2], b[3]);
    }
  }
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads) dqKernel(LocalBackward b) {
  constexpr int kDimTiles = D / 8, kSteps = D / 16;
  extern __shared__ __align__(128) unsigned char smem[];
  T* qs = reinterpret_cast<T*>(smem);
  T* dos = qs + kRows * D;
  T* ks = dos + kRows * D;        // two tiles of keys
  T* vs = ks + 2 * kCols<D> * D;  // and of values
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4;
  QueryBlock<T, D> q;
  if (!queryBlock(b, kRows, q)) return;
  const int keyTiles = (q.keyEnd + kCols<D> - 1) / kCols<D>;
  if (keyTiles == 0) return;  // no key: nothing to add
  const T* k = q.k;
  const T* v = q.v;
  loadTile<D, kThreads>(qs, q.q, q.ldq, kRows, q.rows);
  loadTile<D, kThreads>(dos, static_cast<const T*>(b.dOut) + q.at, q.ldq, kRows, q.rows);
  loadTile<D, kThreads>(ks, k, q.ldk, kCols<D>, min(kCols<D>, q.keyEnd));
  loadTile<D, kThreads>(vs, v, q.ldk, kCols<D>, min(kCols<D>, q.keyEnd));
  awaitLoads<2>();
  __syncthreads();
  std::uint32_t qf[kSteps][4], df[kSteps][4];
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    aFragment<D>(qf[s], qs, warp, lane, s);
    aFragment<D>(df[s], dos, warp, lane, s);
  }
  const int rowOf[2] = {q.r0 + warp * 16 + g, q.r0 + warp * 16 + g + 8};  // within the part
  float l2[2], dl[2];
  rowStats(b, q, rowOf, l2, dl);
  const float scale2 = b.scale * kLog2e;
  float dq[kDimTiles][4] = {};

  for (int kt = 0; kt < keyTiles; ++kt) {
    const int buf = kt % 2;
    if (kt + 1 < keyTiles) {
      const int next = (kt + 1) * kCols<D>;
      loadTile<D, kThreads>(ks + (1 - buf) * kCols<D> * D,
                            k + static_cast<std::size_t>(next) * q.ldk, q.ldk, kCols<D>,
                            min(kCols<D>, q.keyEnd - next));
      loadTile<D, kThreads>(vs + (1 - buf) * kCols<D> * D,
                            v + static_cast<std::size_t>(next) * q.ldk, q.ldk, kCols<D>,
                            min(kCols<D>, q.keyEnd - next));
      awaitLoads<2>();
    } else {
      awaitLoads<0>();
    }
    __syncthreads();
    const T* kb = ks + buf * kCols<D> * D;
    const T* vb = vs + buf * kCols<D> * D;
    float s[kCols<D> / 8][4] = {}, dp[kCols<D> / 8][4] = {};
#pragma unroll
    for (int st = 0; st < kSteps; ++st) {
      timesRowsT<T, D>(s, qf[st], kb, lane, st);
      timesRowsT<T, D>(dp, df[st], vb, lane, st);
    }
    const int base = kt * kCols<D>;
    const bool edge = base + kCols<D> > q.keyEnd || (b.piece.causal && base + kCols<D> - 1 > q.r0);
#pragma unroll
    for (int n = 0; n < kCols<D> / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = base + 8 * n + 2 * t + (e & 1), row = rowOf[e / 2];
        const bool out = edge && (key >= q.keyEnd || (b.piece.causal && key > row));
        const float p = out ? 0.0f : exp2Fast(fmaf(s[n][e], scale2, -l2[e / 2]));
        s[n][e] = p * (dp[n][e] - dl[e / 2]);  // dS
      }
    }
    timesRows<T, D>(dq, s, kb, lane);
    __syncthreads();  // every warp is done with this tile's buffers
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (rowOf[h] >= q.qLen) continue;
    addRow(b.dq + q.at + static_cast<std::size_t>(warp * 16 + g + 8 * h) * q.ldq + 2 * t, dq,
           b.scale, h);
  }
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads) dkdvKernel(LocalBackward b) {
  constexpr int kDimTiles = D / 8, kSteps = D / 16;
  extern __shared__ __align__(128) unsigned char smem[];
  T* ks = reinterpret_cast<T*>(smem);
  T* vs = ks + kRows * D;
  T* qs = vs + kRows * D;                                        // two tiles of queries
  T* dos = qs + 2 * kCols<D> * D;                                // and of their dO
  auto* l2s = reinterpret_cast<float*>(dos + 2 * kCols<D> * D);  // two tiles' lse (base 2)
  float* dls = l2s + 2 * kCols<D>;                               // and delta
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4;
  KeyBlock kb;
  if (!keyBlock<D>(b, kRows, kCols<D>, kb)) return;
  const int keyOf[2] = {kb.c0 + warp * 16 + g, kb.c0 + warp * 16 + g + 8};

  // Work item i's queries: head, first query (in the part), its rows' q and dO, lse and delta.
  auto load = [&](int i, int buf) {
    const int head = itemHead(kb, i), first = itemFirst(kb, i, kCols<D>);
    const int valid = min(kCols<D>, kb.qLen - first);
    const std::size_t token = kb.firstQ + static_cast<std::size_t>(first);
    const std::size_t at = (token * b.heads + static_cast<std::size_t>(head)) * D;
    loadTile<D, kThreads>(qs + buf * kCols<D> * D, static_cast<const T*>(b.q) + at, kb.ldq,
                          kCols<D>, valid);
    loadTile<D, kThreads>(dos + buf * kCols<D> * D, static_cast<const T*>(b.dOut) + at, kb.ldq,
                          kCols<D>, valid);
    loadQueryStats<kThreads>(b, head, token, valid, kCols<D>, l2s + buf * kCols<D>,
                             dls + buf * kCols<D>);
  };
  loadTile<D, kThreads>(ks, static_cast<const T*>(b.k) + kb.kvAt, kb.ldk, kRows, kb.keys);
  loadTile<D, kThreads>(vs, static_cast<const T*>(b.v) + kb.kvAt, kb.ldk, kRows, kb.keys);
  load(0, 0);
  const float scale2 = b.scale * kLog2e;
  float dk[kDimTiles][4] = {}, dv[kDimTiles][4] = {};

  for (int i = 0; i < kb.work; ++i) {
    const int buf = i % 2;
    if (i + 1 < kb.work) {
      load(i + 1, 1 - buf);
      awaitLoads<2>();
    } else {
      awaitLoads<0>();
    }
    __syncthreads();
    const T* qb = qs + buf * kCols<D> * D;
    const T* db = dos + buf * kCols<D> * D;
    const float* l2 = l2s + buf * kCols<D>;
    const float* dl = dls + buf * kCols<D>;
    float s[kCols<D> / 8][4] = {}, dp[kCols<D> / 8][4] = {};  // Sᵀ and dPᵀ: keys × queries
#pragma unroll
    for (int st = 0; st < kSteps; ++st) {
      std::uint32_t a[4];
      aFragment<D>(a, ks, warp, lane, st);
      timesRowsT<T, D>(s, a, qb, lane, st);
      aFragment<D>(a, vs, warp, lane, st);
      timesRowsT<T, D>(dp, a, db, lane, st);
    }
    const int first = itemFirst(kb, i, kCols<D>);
    const bool edge = first + kCols<D> > kb.qLen || kb.keys < kRows ||
                      (b.piece.causal && first < kb.c0 + kRows - 1);
#pragma unroll
    for (int n = 0; n < kCols<D> / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = 8 * n + 2 * t + (e & 1), query = first + col, key = keyOf[e / 2];
        const bool out =
            edge && (query >= kb.qLen || key >= kb.kLen || (b.piece.causal && key > query));
        const float p = out ? 0.0f : exp2Fast(fmaf(s[n][e], scale2, -l2[col]));
        s[n][e] = p;                          // Pᵀ
        dp[n][e] = p * (dp[n][e] - dl[col]);  // dSᵀ
      }
    }
    timesRows<T, D>(dv, s, db, lane);
    timesRows<T, D>(dk, dp, qb, lane);
    __syncthreads();  // every warp is done with this tile's buffers
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (keyOf[h] >= kb.kLen) continue;
    const std::size_t row =
        kb.kvAt + static_cast<std::size_t>(warp * 16 + g + 8 * h) * kb.ldk + 2 * t;
    addRow(b.dk + row, dk, b.scale, h);
    addRow(b.dv + row, dv, 1.0f, h);
  }
}

template <typename T, int D>
Status launch(const LocalBackward& b, cudaStream_t stream) {
  constexpr int kDq = (2 * kRows + 4 * kCols<D>)*D * static_cast<int>(sizeof(T));
  constexpr int kDkdv = kDq + 4 * kCols<D> * static_cast<int>(sizeof(float));  // lse, delta
  return launchBackward(b, kThreads, kRows, dqKernel<T, D>, kDq, dkdvKernel<T, D>, kDkdv, stream);
}

}  // namespace

Status loadBackwardKernels() {
#if defined(WEFT_WGMMA_ATTENTION)
  if (wgmmaAttention())
    if (Status s = loadWgmmaBackwardKernels(); !s) return s;
#endif
  return loadKernels("attention backward: loading the kernels", dqKernel<__nv_bfloat16, 64>,
                     dqKernel<__nv_bfloat16, 128>, dqKernel<__half, 64>, dqKernel<__half, 128>,
                     dkdvKernel<__nv_bfloat16, 64>, dkdvKernel<__nv_bfloat16, 128>,
                     dkdvKernel<__half, 64>, dkdvKernel<__half, 128>);
}

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

Status attendBackwardOnDevice(const LocalBackward& b, void* stream) {
  if (Status s = checkBackward(b); !s) return s;
  if (b.sequences == 0 || b.maxSeqlenQ == 0 || b.maxSeqlenK == 0) return {};  // no pair
#if defined(WEFT_WGMMA_ATTENTION)
  if (!b.portable && wgmmaAttention()) return attendBackwardWgmma(b, stream);
#endif
  const auto s = static_cast<cudaStream_t>(stream);
  return withTypeAndDim(b.type, b.dim, [&](auto type, auto dim) {
    return launch<decltype(type), decltype(dim)::value>(b, s);
  });
}

}  // namespace weft::fused::attention
