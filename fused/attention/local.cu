// weft's own attention kernel on the tensor cores (mma.sync m16n8k16, f32 accumulate), in the
// manner of FlashAttention-2: a block of kRows queries of one sequence and head, a warp 32 rows
// of them (two 16-row tiles); keys and values in tiles of kKeys through shared
// memory, the next tile loading (cp.async) while the current one is attended; online softmax in
// f32 in base 2. Shared-memory rows are 16-byte chunks XOR-swizzled by row, so that ldmatrix's
// eight rows fall in distinct banks.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "fused/attention/backward.hpp"
#include "fused/attention/cudnn.hpp"
#include "fused/attention/heads.hpp"
#include "fused/attention/local.hpp"
#include "fused/attention/local_wgmma.hpp"
#include "fused/attention/merge.hpp"
#include "fused/attention/mma.cuh"
#include "fused/attention/softmax.cuh"

namespace weft::fused::attention {
namespace {

constexpr int kWarps = 4, kThreads = 32 * kWarps;
// A warp's rows: M tiles of 16 (each K/V fragment read from shared memory serves all M); keys
// in tiles of 64. At head dim 128 the scores and the output then spill 164 bytes a thread to
// L1, and still ran 4-7 % faster than tiles of 32 (docs/perf-fused.md, "The local kernels").
template <int M>
constexpr int kRows = 16 * M* kWarps;
constexpr int kKeys = 64;

// A thread's share of mma's 16-row tiles: rows g and g + 8 of each of its warp's 16-row tiles
// (h = 0, 1), columns 2t and 2t + 1 of each 8-column tile (g = lane / 4, t = lane % 4).
template <typename T, int D, int M>
__global__ void __launch_bounds__(kThreads) attendKernel(LocalAttention a) {
  constexpr int kSteps = D / 16, N = kKeys, kKeyTiles = N / 8, kDimTiles = D / 8;
  constexpr int R = kRows<M>;
  extern __shared__ __align__(128) unsigned char smem[];
  T* qs = reinterpret_cast<T*>(smem);
  T* ks = qs + R * D;      // two tiles of N keys
  T* vs = ks + 2 * N * D;  // and of their values
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4;
  QueryBlock<T, D> b;
  if (!queryBlock(a, R, b)) return;
  const T *q = b.q, *k = b.k, *v = b.v;
  const std::size_t ldq = b.ldq, ldk = b.ldk;
  const int r0 = b.r0, rows = b.rows, keyEnd = b.keyEnd;
  const int keyTiles = (keyEnd + N - 1) / N;

  loadTile<D, kThreads>(qs, q, ldq, R, rows);
  if (keyTiles > 0) {
    loadTile<D, kThreads>(ks, k, ldk, N, min(N, keyEnd));
    loadTile<D, kThreads>(vs, v, ldk, N, min(N, keyEnd));
    awaitLoads<2>();
  } else {
    awaitLoads<0>();
  }
  __syncthreads();
  // The warp's queries as mma's A fragments (matrix j of ldmatrix's four from lanes 8j..8j+7),
  // read from shared memory at each step (the registers hold the scores and the output).
  const int qRow = warp * 16 * M + ((lane / 8) & 1) * 8 + lane % 8, qHalf = lane / 16;
  float o[M][kDimTiles][4] = {};
  float m[M][2], l[M][2];
  int rowOf[M][2];  // within the part
#pragma unroll
  for (int i = 0; i < M; ++i) {
    for (int h = 0; h < 2; ++h) {
      m[i][h] = -INFINITY, l[i][h] = 0;
      rowOf[i][h] = r0 + warp * 16 * M + 16 * i + g + 8 * h;
    }
  }
  const float scale = a.scale * kLog2e;

  for (int kt = 0; kt < keyTiles; ++kt) {
    const int buf = kt % 2;
    if (kt + 1 < keyTiles) {  // the other buffers were last read before the previous barrier
      const int next = (kt + 1) * N;
      loadTile<D, kThreads>(ks + (1 - buf) * N * D, k + static_cast<std::size_t>(next) * ldk, ldk,
                            N, min(N, keyEnd - next));
      loadTile<D, kThreads>(vs + (1 - buf) * N * D, v + static_cast<std::size_t>(next) * ldk, ldk,
                            N, min(N, keyEnd - next));
      awaitLoads<2>();
    } else {
      awaitLoads<0>();
    }
    __syncthreads();
    const T* kt0 = ks + buf * N * D;
    const T* vt0 = vs + buf * N * D;
    float s[M][kKeyTiles][4] = {};
#pragma unroll
    for (int st = 0; st < kSteps; ++st) {
      std::uint32_t qa[M][4];
#pragma unroll
      for (int i = 0; i < M; ++i) ldmatrix4(qa[i], qs + swizzled<D>(qRow + 16 * i, 2 * st + qHalf));
#pragma unroll
      for (int np = 0; np < kKeyTiles / 2; ++np) {
        // Keys 16np..16np+15, dims 16st..16st+15: B fragments of two 8-key tiles.
        const int mi = lane / 8, key = 16 * np + (mi / 2) * 8 + lane % 8;
        std::uint32_t f[4];
        ldmatrix4(f, kt0 + swizzled<D>(key, 2 * st + (mi & 1)));
#pragma unroll
        for (int i = 0; i < M; ++i) {
          mma<T>(s[i][2 * np], qa[i], f[0], f[1]);
          mma<T>(s[i][2 * np + 1], qa[i], f[2], f[3]);
        }
      }
    }
    // The mask where the tile is not inside both the keys and (causal) every row's own index.
    const int base = kt * N;
    if (base + N > keyEnd || (a.piece.causal && base + N - 1 > r0)) {
#pragma unroll
      for (int i = 0; i < M; ++i) maskScores(s[i], base, keyEnd, a.piece.causal, rowOf[i], t);
    }
#pragma unroll
    for (int i = 0; i < M; ++i) softmaxStep(s[i], o[i], m[i], l[i], scale);
#pragma unroll
    for (int st = 0; st < N / 16; ++st) {
      std::uint32_t p[M][4];
#pragma unroll
      for (int i = 0; i < M; ++i) probabilities<T>(p[i], s[i], st);
#pragma unroll
      for (int dp = 0; dp < kDimTiles / 2; ++dp) {
        const int mi = lane / 8, key = 16 * st + (mi & 1) * 8 + lane % 8;
        std::uint32_t f[4];
        ldmatrix4T(f, vt0 + swizzled<D>(key, 2 * dp + mi / 2));
#pragma unroll
        for (int i = 0; i < M; ++i) {
          mma<T>(o[i][2 * dp], p[i], f[0], f[1]);
          mma<T>(o[i][2 * dp + 1], p[i], f[2], f[3]);
        }
      }
    }
    __syncthreads();  // every warp is done with this tile's buffers
  }

#pragma unroll
  for (int i = 0; i < M; ++i)
    finishRows<T, kDimTiles>(a, o[i], m[i], l[i], rowOf[i], b.qLen, b.first, b.head, scale, g, t);
}

template <typename T, int D, int M>
Status launchDim(const LocalAttention& a, cudaStream_t stream) {
  constexpr int kSmem = (kRows<M> + 4 * kKeys) * D * static_cast<int>(sizeof(T));
  if (Status s = allowShared(attendKernel<T, D, M>, kSmem, "attention"); !s) return s;
  const dim3 grid(static_cast<unsigned>((a.maxSeqlenQ + kRows<M> - 1) / kRows<M>),
                  static_cast<unsigned>(a.heads), static_cast<unsigned>(a.sequences));
  attendKernel<T, D, M><<<grid, kThreads, kSmem, stream>>>(a);
  return launched("attention");
}

}  // namespace

Status loadAttentionKernels() {
  if (Status s = loadKernels("attention: loading the kernels", attendKernel<__nv_bfloat16, 64, 2>,
                             attendKernel<__nv_bfloat16, 128, 2>, attendKernel<__half, 64, 2>,
                             attendKernel<__half, 128, 2>);
      !s)
    return s;
#if defined(WEFT_WGMMA_ATTENTION)
  if (wgmmaAttention())
    if (Status s = loadWgmmaAttentionKernels(); !s) return s;
#endif
  if (Status s = loadBackwardKernels(); !s) return s;
  if (Status s = loadMergeKernels(); !s) return s;
  return loadHeadKernels();
}

Status attendOnDevice(const LocalAttention& a, void* stream) {
  if (Status s = checkLocal(a); !s) return s;
  if (a.sequences == 0 || a.maxSeqlenQ == 0) return {};
  if (a.kernel == algo::AttentionKernel::cudnn) return attendWithCudnn(a, stream);
#if defined(WEFT_WGMMA_ATTENTION)
  if (!a.portable && wgmmaAttention()) return attendWgmma(a, stream);
#endif
  const auto s = static_cast<cudaStream_t>(stream);
  return withTypeAndDim(a.type, a.dim, [&](auto type, auto dim) {
    return launchDim<decltype(type), decltype(dim)::value, 2>(a, s);
  });
}

}  // namespace weft::fused::attention
