// weft's own attention kernel on the tensor cores (mma.sync m16n8k16, f32 accumulate), in the
// manner of FlashAttention-2: a block of kRows queries of one sequence and head, a warp 16 rows
// of them, its queries' fragments in registers; keys and values in tiles of kKeys through shared
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

#include "fused/attention/local.hpp"
#include "fused/attention/lse.cuh"
#include "fused/attention/mma.cuh"

namespace weft::fused::attention {
namespace {

constexpr int kWarps = 4, kThreads = 32 * kWarps, kRows = 16 * kWarps, kKeys = 64;
// A thread's share of mma's 16-row tiles: rows g and g + 8 of its warp's 16 (h = 0, 1), columns
// 2t and 2t + 1 of each 8-column tile (g = lane / 4, t = lane % 4).
template <typename T, int D>
__global__ void __launch_bounds__(kThreads) attendKernel(LocalAttention a) {
  constexpr int kSteps = D / 16, kKeyTiles = kKeys / 8, kDimTiles = D / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  T* qs = reinterpret_cast<T*>(smem);
  T* ks = qs + kRows * D;      // two tiles of kKeys keys
  T* vs = ks + 2 * kKeys * D;  // and of their values
  const int seq = static_cast<int>(blockIdx.z), head = static_cast<int>(blockIdx.y);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4;
  const int bq = a.cuSeqlensQ[seq], bk = a.cuSeqlensK[seq];
  const Span qp = partOf(a.piece.q, a.cuSeqlensQ[seq + 1] - bq);
  const Span kp = partOf(a.piece.kv, a.cuSeqlensK[seq + 1] - bk);
  const int qLen = qp.hi - qp.lo, kLen = kp.hi - kp.lo;
  const int tiles = (qLen + kRows - 1) / kRows;
  if (static_cast<int>(blockIdx.x) >= tiles) return;
  // Under the mask the last tiles have the most keys: first.
  const int tile =
      a.piece.causal ? tiles - 1 - static_cast<int>(blockIdx.x) : static_cast<int>(blockIdx.x);
  const int r0 = tile * kRows, rows = min(kRows, qLen - r0);
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
  const int keyTiles = (max(keyEnd, 0) + kKeys - 1) / kKeys;

  loadTile<D, kThreads>(qs, q, ldq, kRows, rows);
  if (keyTiles > 0) {
    loadTile<D, kThreads>(ks, k, ldk, kKeys, min(kKeys, keyEnd));
    loadTile<D, kThreads>(vs, v, ldk, kKeys, min(kKeys, keyEnd));
    awaitLoads<2>();
  } else {
    awaitLoads<0>();
  }
  __syncthreads();
  // The warp's queries as mma's A fragments: matrix j of ldmatrix's four from lanes 8j..8j+7.
  std::uint32_t qf[kSteps][4];
  {
    const int mi = lane / 8, r = warp * 16 + (mi & 1) * 8 + lane % 8;
#pragma unroll
    for (int s = 0; s < kSteps; ++s) ldmatrix4(qf[s], qs + swizzled<D>(r, 2 * s + mi / 2));
  }
  float o[kDimTiles][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0, 0};
  const float scale = a.scale * kLog2e;
  const int rowOf[2] = {r0 + warp * 16 + g, r0 + warp * 16 + g + 8};  // within the part

  for (int kt = 0; kt < keyTiles; ++kt) {
    const int buf = kt % 2;
    if (kt + 1 < keyTiles) {  // the other buffers were last read before the previous barrier
      const int next = (kt + 1) * kKeys;
      loadTile<D, kThreads>(ks + (1 - buf) * kKeys * D, k + static_cast<std::size_t>(next) * ldk,
                            ldk, kKeys, min(kKeys, keyEnd - next));
      loadTile<D, kThreads>(vs + (1 - buf) * kKeys * D, v + static_cast<std::size_t>(next) * ldk,
                            ldk, kKeys, min(kKeys, keyEnd - next));
      awaitLoads<2>();
    } else {
      awaitLoads<0>();
    }
    __syncthreads();
    const T* kb = ks + buf * kKeys * D;
    const T* vb = vs + buf * kKeys * D;
    float s[kKeyTiles][4] = {};
#pragma unroll
    for (int st = 0; st < kSteps; ++st) {
#pragma unroll
      for (int np = 0; np < kKeyTiles / 2; ++np) {
        // Keys 16np..16np+15, dims 16st..16st+15: B fragments of two 8-key tiles.
        const int mi = lane / 8, key = 16 * np + (mi / 2) * 8 + lane % 8;
        std::uint32_t b[4];
        ldmatrix4(b, kb + swizzled<D>(key, 2 * st + (mi & 1)));
        mma<T>(s[2 * np], qf[st], b[0], b[1]);
        mma<T>(s[2 * np + 1], qf[st], b[2], b[3]);
      }
    }
    // The mask: keys past the end, and under the causal mask those past the row's own index.
    const int base = kt * kKeys;
    const bool edge = base + kKeys > keyEnd || (a.piece.causal && base + kKeys - 1 > r0);
#pragma unroll
    for (int n = 0; n < kKeyTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = base + 8 * n + 2 * t + (e & 1), row = rowOf[e / 2];
        const bool out = key >= keyEnd || (a.piece.causal && key > row);
        s[n][e] = edge && out ? -INFINITY : s[n][e] * scale;
      }
    }
    float keep[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float most = m[h];
#pragma unroll
      for (int n = 0; n < kKeyTiles; ++n) most = fmaxf(most, fmaxf(s[n][2 * h], s[n][2 * h + 1]));
      most = quadMax(most);
      const float use = most == -INFINITY ? 0.0f : most;
      keep[h] = exp2f(m[h] - use);
      m[h] = most;
      float sum = 0;
#pragma unroll
      for (int n = 0; n < kKeyTiles; ++n) {
        s[n][2 * h] = exp2f(s[n][2 * h] - use);
        s[n][2 * h + 1] = exp2f(s[n][2 * h + 1] - use);
        sum += s[n][2 * h] + s[n][2 * h + 1];
      }
      l[h] = l[h] * keep[h] + sum;
    }
#pragma unroll
    for (int d = 0; d < kDimTiles; ++d) {
      o[d][0] *= keep[0], o[d][1] *= keep[0];
      o[d][2] *= keep[1], o[d][3] *= keep[1];
    }
#pragma unroll
    for (int st = 0; st < kKeys / 16; ++st) {
      // The probabilities of keys 16st..16st+15 as A fragments (the accumulators' own layout).
      const std::uint32_t p[4] = {
          pack<T>(s[2 * st][0], s[2 * st][1]), pack<T>(s[2 * st][2], s[2 * st][3]),
          pack<T>(s[2 * st + 1][0], s[2 * st + 1][1]), pack<T>(s[2 * st + 1][2], s[2 * st + 1][3])};
#pragma unroll
      for (int dp = 0; dp < kDimTiles / 2; ++dp) {
        const int mi = lane / 8, key = 16 * st + (mi & 1) * 8 + lane % 8;
        std::uint32_t b[4];
        ldmatrix4T(b, vb + swizzled<D>(key, 2 * dp + mi / 2));
        mma<T>(o[2 * dp], p, b[0], b[1]);
        mma<T>(o[2 * dp + 1], p, b[2], b[3]);
      }
    }
    __syncthreads();  // every warp is done with this tile's buffers
  }

#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = rowOf[h];
    const float sum = quadSum(l[h]);
    if (row >= qLen) continue;  // the quad's alike
    const std::size_t token = static_cast<std::size_t>(bq + qp.lo + row);
    const std::size_t at = static_cast<std::size_t>(head) * a.tokensQ + token;
    const std::size_t base = (token * a.heads + head) * D + 2 * t;
    const float lse = sum > 0 ? (m[h] + log2f(sum)) * kLn2 : -INFINITY;
    const float inv = sum > 0 ? 1.0f / sum : 0.0f;
    if (!a.merge) {
      T* out = static_cast<T*>(a.out);
#pragma unroll
      for (int d = 0; d < kDimTiles; ++d) {
        const std::uint32_t two = pack<T>(o[d][2 * h] * inv, o[d][2 * h + 1] * inv);
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
      *y = make_float2(w.keep * was.x + w.take * o[d][2 * h] * inv,
                       w.keep * was.y + w.take * o[d][2 * h + 1] * inv);
    }
    __syncwarp(0xFu << (4 * g));  // the quad has read lse[at]
    if (t == 0) a.lse[at] = w.merged;
  }
}

template <typename T, int D>
Status launchDim(const LocalAttention& a, cudaStream_t stream) {
  constexpr int kSmem = (kRows + 4 * kKeys) * D * static_cast<int>(sizeof(T));
  // Per device, so every call (it costs a microsecond).
  if (cudaError_t e = cudaFuncSetAttribute(attendKernel<T, D>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
      e != cudaSuccess)
    return Status(Code::systemError, std::string("attention: ") + cudaGetErrorString(e));
  const dim3 grid(static_cast<unsigned>((a.maxSeqlenQ + kRows - 1) / kRows),
                  static_cast<unsigned>(a.heads), static_cast<unsigned>(a.sequences));
  attendKernel<T, D><<<grid, kThreads, kSmem, stream>>>(a);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess)
    return Status(Code::systemError, std::string("attention: ") + cudaGetErrorString(e));
  return {};
}

template <typename T>
Status launch(const LocalAttention& a, cudaStream_t stream) {
  return a.dim == 64 ? launchDim<T, 64>(a, stream) : launchDim<T, 128>(a, stream);
}

}  // namespace

Status attendOnDevice(const LocalAttention& a, void* stream) {
  if (Status s = checkLocal(a); !s) return s;
  if (a.sequences == 0 || a.maxSeqlenQ == 0) return {};
  const auto s = static_cast<cudaStream_t>(stream);
  return a.type == DataType::bf16 ? launch<__nv_bfloat16>(a, s) : launch<__half>(a, s);
}

}  // namespace weft::fused::attention
