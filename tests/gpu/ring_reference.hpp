// Ring attention's tests' whole-sequence reference, in double: packed sequences of bf16 q, k
// and v; each token's output and log-sum-exp, the gradients of a loss Σ dOut ∘ out; and a
// rank's zigzag shard of a tensor.
#pragma once

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace weft::test {

inline std::uint16_t toBf16(float x) {
  return static_cast<__nv_bfloat16_raw>(__float2bfloat16(x)).x;
}
inline float fromBf16(std::uint16_t b) {
  __nv_bfloat16_raw r;
  r.x = b;
  return __bfloat162float(__nv_bfloat16(r));
}

struct Global {
  std::vector<std::int32_t> cu;  // the whole sequences'
  int heads = 4, kvHeads = 2, dim = 128;
  std::vector<std::uint16_t> q, k, v;  // [tokens, heads or kvHeads, dim], bf16
  std::size_t tokens() const { return static_cast<std::size_t>(cu.back()); }
  double scale() const { return 1.0 / std::sqrt(static_cast<double>(dim)); }
  double qAt(std::size_t t, int h, std::size_t c) const {
    return fromBf16(q[(t * static_cast<std::size_t>(heads) + static_cast<std::size_t>(h)) *
                          static_cast<std::size_t>(dim) +
                      c]);
  }
  double kvAt(const std::vector<std::uint16_t>& x, std::size_t t, int h, std::size_t c) const {
    return fromBf16(x[(t * static_cast<std::size_t>(kvHeads) + static_cast<std::size_t>(h)) *
                          static_cast<std::size_t>(dim) +
                      c]);
  }
  std::size_t sequenceOf(std::size_t t) const {
    std::size_t s = 0;
    while (static_cast<std::size_t>(cu[s + 1]) <= t) ++s;
    return s;
  }

  // Token t (global) head h's softmax weights over the keys it sees (from its sequence's first),
  // its output and lse.
  void reference(std::size_t t, int h, bool causal, std::vector<double>& out, double& lse,
                 std::vector<double>* weights = nullptr) const {
    const std::size_t s = sequenceOf(t), first = static_cast<std::size_t>(cu[s]);
    const auto D = static_cast<std::size_t>(dim);
    const int g = h / (heads / kvHeads);
    std::vector<double> w;
    const std::size_t end = causal ? t + 1 : static_cast<std::size_t>(cu[s + 1]);
    double most = -INFINITY;
    for (std::size_t j = first; j < end; ++j) {
      double dot = 0;
      for (std::size_t c = 0; c < D; ++c) dot += qAt(t, h, c) * kvAt(k, j, g, c);
      w.push_back(dot * scale());
      most = std::max(most, w.back());
    }
    out.assign(D, 0);
    double sum = 0;
    for (double& x : w) sum += (x = std::exp(x - most));
    for (std::size_t x = 0; x < w.size(); ++x) {
      w[x] /= sum;
      for (std::size_t c = 0; c < D; ++c) out[c] += w[x] * kvAt(v, first + x, g, c);
    }
    lse = most + std::log(sum);
    if (weights != nullptr) *weights = std::move(w);
  }

  // The gradients of Σ dOut ∘ out (dOut like q): dq like q, dk and dv like k.
  void gradients(bool causal, const std::vector<float>& dOut, std::vector<double>& dq,
                 std::vector<double>& dk, std::vector<double>& dv) const {
    const auto D = static_cast<std::size_t>(dim);
    dq.assign(q.size(), 0);
    dk.assign(k.size(), 0);
    dv.assign(v.size(), 0);
    std::vector<double> out, p;
    double lse = 0;
    for (std::size_t t = 0; t < tokens(); ++t) {
      const std::size_t first = static_cast<std::size_t>(cu[sequenceOf(t)]);
      for (int h = 0; h < heads; ++h) {
        reference(t, h, causal, out, lse, &p);
        const int g = h / (heads / kvHeads);
        const std::size_t row =
            (t * static_cast<std::size_t>(heads) + static_cast<std::size_t>(h)) * D;
        double delta = 0;
        for (std::size_t c = 0; c < D; ++c) delta += dOut[row + c] * out[c];
        for (std::size_t x = 0; x < p.size(); ++x) {
          const std::size_t j = first + x;
          const std::size_t kr =
              (j * static_cast<std::size_t>(kvHeads) + static_cast<std::size_t>(g)) * D;
          double dp = 0;
          for (std::size_t c = 0; c < D; ++c) dp += dOut[row + c] * kvAt(v, j, g, c);
          const double ds = p[x] * (dp - delta) * scale();
          for (std::size_t c = 0; c < D; ++c) {
            dq[row + c] += ds * kvAt(k, j, g, c);
            dk[kr + c] += ds * qAt(t, h, c);
            dv[kr + c] += p[x] * dOut[row + c];
          }
        }
      }
    }
  }
};

// Rank r's zigzag shard of `all` (rows of `width` values a token): its local token i is the
// global token at its sequence's start plus positions[i].
template <typename T>
std::vector<T> shardOf(const std::vector<T>& all, std::size_t width,
                       const std::vector<std::int32_t>& globalCu,
                       const std::vector<std::int32_t>& localCu,
                       const std::vector<std::int32_t>& positions) {
  std::vector<T> mine(static_cast<std::size_t>(localCu.back()) * width);
  for (std::size_t s = 0; s + 1 < localCu.size(); ++s)
    for (std::int32_t i = localCu[s]; i < localCu[s + 1]; ++i) {
      const auto from =
          static_cast<std::size_t>(globalCu[s] + positions[static_cast<std::size_t>(i)]) * width;
      std::copy_n(all.begin() + static_cast<std::ptrdiff_t>(from), width,
                  mine.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(i) * width));
    }
  return mine;
}

}  // namespace weft::test
