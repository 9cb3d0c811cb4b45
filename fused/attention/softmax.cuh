// The forward kernels' steps (local.cu, local_wgmma.cu) on a warp's 16 rows in mma's
// accumulator layout (rows g and g + 8, columns 2t and 2t + 1 of each 8-column tile): the mask,
// the online softmax in f32 in base 2, and the last step: the output divided by its sum and the
// log-sum-exp written, or merged into the f32 partials.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "fused/attention/local.hpp"
#include "fused/attention/lse.cuh"
#include "fused/attention/mma.cuh"

namespace weft::fused::attention {

// Scores s of keys base.. (8-key tiles) masked to −inf: keys from keyEnd, and under the causal mask
// those past the row's own index (row[h] within the part).
template <int Keys>
__device__ __forceinline__ void maskScores(float (&s)[Keys][4], int base, int keyEnd, bool causal,
                                           const int (&row)[2], int t) {
#pragma unroll
  for (int n = 0; n < Keys; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = base + 8 * n + 2 * t + (e & 1);
      if (key >= keyEnd || (causal && key > row[e / 2])) s[n][e] = -INFINITY;
    }
  }
}

// One tile of keys into the running softmax: s becomes the probabilities (unnormalized, against
// the new maximum), o is rescaled to it, m keeps the raw scores' maximum (a probability one FMA
// and one ex2 away: `scale` is the scores' times log2 e), l a thread's share of the sums.
template <int Keys, int Tiles>
__device__ __forceinline__ void softmaxStep(float (&s)[Keys][4], float (&o)[Tiles][4],
                                            float (&m)[2], float (&l)[2], float scale) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float most = m[h];
#pragma unroll
    for (int n = 0; n < Keys; ++n) most = fmaxf(most, fmaxf(s[n][2 * h], s[n][2 * h + 1]));
    most = quadMax(most);
    const float use = most == -INFINITY ? 0.0f : most * scale;
    const float keep = exp2Fast(m[h] * scale - use);
    m[h] = most;
    float sum = 0;
#pragma unroll
    for (int n = 0; n < Keys; ++n) {
      s[n][2 * h] = exp2Fast(fmaf(s[n][2 * h], scale, -use));
      s[n][2 * h + 1] = exp2Fast(fmaf(s[n][2 * h + 1], scale, -use));
      sum += s[n][2 * h] + s[n][2 * h + 1];
    }
    l[h] = l[h] * keep + sum;
#pragma unroll
    for (int d = 0; d < Tiles; ++d) o[d][2 * h] *= keep, o[d][2 * h + 1] *= keep;
  }
}

// The probabilities of keys 16st..16st+15 as mma's (and wgmma's register) A fragment.
template <typename T, int Keys>
__device__ __forceinline__ void probabilities(std::uint32_t (&p)[4], const float (&s)[Keys][4],
                                              int st) {
  p[0] = pack<T>(s[2 * st][0], s[2 * st][1]);
  p[1] = pack<T>(s[2 * st][2], s[2 * st][3]);
  p[2] = pack<T>(s[2 * st + 1][0], s[2 * st + 1][1]);
  p[3] = pack<T>(s[2 * st + 1][2], s[2 * st + 1][3]);
}

// o: the rows' unnormalized outputs (D = 8 · Tiles), m their raw scores' maxima, l a thread's
// share of their sums; row[h] within the part, `first` the part's first token.
template <typename T, int Tiles>
__device__ __forceinline__ void finishRows(const LocalAttention& a, const float (&o)[Tiles][4],
                                           const float (&m)[2], const float (&l)[2],
                                           const int (&row)[2], int qLen, std::size_t first,
                                           int head, float scale, int g, int t) {
  constexpr int D = 8 * Tiles;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float sum = quadSum(l[h]);
    if (row[h] >= qLen) continue;  // the quad's alike
    const std::size_t token = first + static_cast<std::size_t>(row[h]);
    const std::size_t at = static_cast<std::size_t>(head) * a.tokensQ + token;
    const std::size_t base = (token * a.heads + head) * D + 2 * t;
    const float lse = sum > 0 ? (m[h] * scale + log2f(sum)) * kLn2 : -INFINITY;
    const float inv = sum > 0 ? 1.0f / sum : 0.0f;
    if (!a.merge) {
      T* out = static_cast<T*>(a.out);
#pragma unroll
      for (int d = 0; d < Tiles; ++d) {
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
    for (int d = 0; d < Tiles; ++d) {
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

}  // namespace weft::fused::attention
