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
#include "fused/attention/lse.cuh"
#include "fused/attention/merge.hpp"
#include "fused/attention/mma.cuh"

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
  const int seq = static_cast<int>(blockIdx.z), head = static_cast<int>(blockIdx.y);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4;
  const int bq = a.cuSeqlensQ[seq], bk = a.cuSeqlensK[seq];
  const Span qp = partOf(a.piece.q, a.cuSeqlensQ[seq + 1] - bq);
  const Span kp = partOf(a.piece.kv, a.cuSeqlensK[seq + 1] - bk);
  const int qLen = qp.hi - qp.lo, kLen = kp.hi - kp.lo;
  const int tiles = (qLen + R - 1) / R;
  if (static_cast<int>(blockIdx.x) >= tiles) return;
  // Under the mask the last tiles have the most keys: first.
  const int tile =
      a.piece.causal ? tiles - 1 - static_cast<int>(blockIdx.x) : static_cast<int>(blockIdx.x);
  const int r0 = tile * R, rows = min(R, qLen - r0);
  const int keyEnd = a.piece.causal ? min(kLen, r0 + rows) : kLen;
  const int kvHead = head / (a.heads / a.kvHeads);
  const std::size_t ldq = static_cast<std::size_t>(a.heads) * D;
  const std::size_t ldk = static_cast<std::size_t>(a.kvHeads) * D;
  const T* q =
      static_cast<const T*>(a.q) +
      (static_cast<std::size_t>(bq + qp.lo + r0) * a.heads + static_cast<std::size_t>(head)) * D;
  const T* k =
      static_cast<const T*>(a.k) + (static_cast<std::size_t>(bk + kp.lo) * a.kvHeads + kvHead) * D;
  const T* v =
      static_cast<const T*>(a.v) + (static_cast<std::size_t>(bk + kp.lo) * a.kvHeads + kvHead) * D;
  const int keyTiles = (max(keyEnd, 0) + N - 1) / N;

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
    const T* kb = ks + buf * N * D;
    const T* vb = vs + buf * N * D;
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
        std::uint32_t b[4];
        ldmatrix4(b, kb + swizzled<D>(key, 2 * st + (mi & 1)));
#pragma unroll
        for (int i = 0; i < M; ++i) {
          mma<T>(s[i][2 * np], qa[i], b[0], b[1]);
          mma<T>(s[i][2 * np + 1], qa[i], b[2], b[3]);
        }
      }
    }
    // The mask: keys past the end, and under the causal mask those past the row's own index
    // (tiles inside both need none).
    const int base = kt * N;
    if (base + N > keyEnd || (a.piece.causal && base + N - 1 > r0)) {
#pragma unroll
      for (int i = 0; i < M; ++i) {
#pragma unroll
        for (int n = 0; n < kKeyTiles; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = base + 8 * n + 2 * t + (e & 1), row = rowOf[i][e / 2];
            if (key >= keyEnd || (a.piece.causal && key > row)) s[i][n][e] = -INFINITY;
          }
        }
      }
    }
    // Online softmax: m is the raw scores' maximum; a probability one FMA and one ex2 away.
#pragma unroll
    for (int i = 0; i < M; ++i) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float most = m[i][h];
#pragma unroll
        for (int n = 0; n < kKeyTiles; ++n)
          most = fmaxf(most, fmaxf(s[i][n][2 * h], s[i][n][2 * h + 1]));
        most = quadMax(most);
        const float use = most == -INFINITY ? 0.0f : most * scale;
        const float keep = exp2Fast(m[i][h] * scale - use);
        m[i][h] = most;
        float sum = 0;
#pragma unroll
        for (int n = 0; n < kKeyTiles; ++n) {
          s[i][n][2 * h] = exp2Fast(fmaf(s[i][n][2 * h], scale, -use));
          s[i][n][2 * h + 1] = exp2Fast(fmaf(s[i][n][2 * h + 1], scale, -use));
          sum += s[i][n][2 * h] + s[i][n][2 * h + 1];
        }
        l[i][h] = l[i][h] * keep + sum;
#pragma unroll
        for (int d = 0; d < kDimTiles; ++d) o[i][d][2 * h] *= keep, o[i][d][2 * h + 1] *= keep;
      }
    }
#pragma unroll
    for (int st = 0; st < N / 16; ++st) {
      // The probabilities of keys 16st..16st+15 as A fragments (the accumulators' own layout).
      std::uint32_t p[M][4];
#pragma unroll
      for (int i = 0; i < M; ++i) {
        p[i][0] = pack<T>(s[i][2 * st][0], s[i][2 * st][1]);
        p[i][1] = pack<T>(s[i][2 * st][2], s[i][2 * st][3]);
        p[i][2] = pack<T>(s[i][2 * st + 1][0], s[i][2 * st + 1][1]);
        p[i][3] = pack<T>(s[i][2 * st + 1][2], s[i][2 * st + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < kDimTiles / 2; ++dp) {
        const int mi = lane / 8, key = 16 * st + (mi & 1) * 8 + lane % 8;
        std::uint32_t b[4];
        ldmatrix4T(b, vb + swizzled<D>(key, 2 * dp + mi / 2));
#pragma unroll
        for (int i = 0; i < M; ++i) {
          mma<T>(o[i][2 * dp], p[i], b[0], b[1]);
          mma<T>(o[i][2 * dp + 1], p[i], b[2], b[3]);
        }
      }
    }
    __syncthreads();  // every warp is done with this tile's buffers
  }

#pragma unroll
  for (int i = 0; i < M; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = rowOf[i][h];
      const float sum = quadSum(l[i][h]);
      if (row >= qLen) continue;  // the quad's alike
      const std::size_t token = static_cast<std::size_t>(bq + qp.lo + row);
      const std::size_t at = static_cast<std::size_t>(head) * a.tokensQ + token;
      const std::size_t base = (token * a.heads + head) * D + 2 * t;
      const float lse = sum > 0 ? (m[i][h] * scale + log2f(sum)) * kLn2 : -INFINITY;
      const float inv = sum > 0 ? 1.0f / sum : 0.0f;
      if (!a.merge) {
        T* out = static_cast<T*>(a.out);
#pragma unroll
        for (int d = 0; d < kDimTiles; ++d) {
          const std::uint32_t two = pack<T>(o[i][d][2 * h] * inv, o[i][d][2 * h + 1] * inv);
          memcpy(out + base + 8 * d, &two, sizeof two);
        }
        if (t == 0) a.lse[at] = lse;
        continue;
      }
      if (lse == -INFINITY) continue;  // nothing to merge in
      float* out = static_cast<float*>(a.out);
      const LseMerge w = mergeLse(a.lse[at], lse);
#pragma unroll
      for (int d = 0; d < kDimTiles; ++d) {
        float2* y = reinterpret_cast<float2*>(out + base + 8 * d);
        float2 was = *y;
        if (w.keep == 0) was = make_float2(0, 0);
        *y = make_float2(w.keep * was.x + w.take * o[i][d][2 * h] * inv,
                         w.keep * was.y + w.take * o[i][d][2 * h + 1] * inv);
      }
      __syncwarp(0xFu << (4 * g));  // the quad has read lse[at]
      if (t == 0) a.lse[at] = w.merged;
    }
  }
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

template <typename T>
Status launch(const LocalAttention& a, cudaStream_t stream) {
  return a.dim == 64 ? launchDim<T, 64, 2>(a, stream) : launchDim<T, 128, 2>(a, stream);
}

}  // namespace

Status loadAttentionKernels() {
  if (Status s = loadKernels("attention: loading the kernels", attendKernel<__nv_bfloat16, 64, 2>,
                             attendKernel<__nv_bfloat16, 128, 2>, attendKernel<__half, 64, 2>,
                             attendKernel<__half, 128, 2>);
      !s)
    return s;
  if (Status s = loadBackwardKernels(); !s) return s;
  if (Status s = loadMergeKernels(); !s) return s;
  return loadHeadKernels();
}

Status attendOnDevice(const LocalAttention& a, void* stream) {
  if (Status s = checkLocal(a); !s) return s;
  if (a.sequences == 0 || a.maxSeqlenQ == 0) return {};
  if (a.kernel == algo::AttentionKernel::cudnn) return attendWithCudnn(a, stream);
  const auto s = static_cast<cudaStream_t>(stream);
  return a.type == DataType::bf16 ? launch<__nv_bfloat16>(a, s) : launch<__half>(a, s);
}

}  // namespace weft::fused::attention
