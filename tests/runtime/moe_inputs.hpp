// MoE tests' inputs through the public API: a rank's tokens (f32 values), their experts (distinct
// in a token, a slot dropped now and then) and weights, made alike wherever they are made from
// the same seed.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace weft::test {

struct MoeInputs {
  std::vector<float> x;
  std::vector<std::int64_t> idx;
  std::vector<float> w;
};

inline MoeInputs moeInputsOf(unsigned seed, std::size_t tokens, std::size_t hidden, int experts,
                             int topk) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0, 1);
  std::uniform_real_distribution<float> weight(0.1f, 1);
  MoeInputs in;
  in.x.resize(tokens * hidden);
  for (auto& v : in.x) v = normal(rng);
  for (std::size_t t = 0; t < tokens; ++t) {
    std::vector<std::int64_t> all(static_cast<std::size_t>(experts));
    for (int e = 0; e < experts; ++e) all[static_cast<std::size_t>(e)] = e;
    std::shuffle(all.begin(), all.end(), rng);
    for (int j = 0; j < topk; ++j) {
      in.idx.push_back(t % 5 == 2 && j == 1 ? -1 : all[static_cast<std::size_t>(j)]);
      in.w.push_back(weight(rng));
    }
  }
  return in;
}

}  // namespace weft::test
