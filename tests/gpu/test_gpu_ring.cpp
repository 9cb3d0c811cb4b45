// Ring attention (weftRingAttention), ranks as threads sharing the GPU: every rank's zigzag shard
// of packed sequences, attended around the ring, against attention in double over the whole
// sequences; causal and not, grouped K/V heads, ragged and empty sequences; by the ring, by
// Ulysses and by the hybrid.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "tests/gpu/gpu_harness.hpp"
#include "tests/gpu/ring_reference.hpp"
#include "weft/weft.hpp"

namespace weft::test {
namespace {

// n ranks' calls (of `heads` and `kvHeads`) against attention over the whole sequences: packed
// ones, or one (which cuDNN's kernel covers, where it loads).
void expectWholeAttention(int n, int heads, int kvHeads, bool oneSequence = false) {
  const auto N = static_cast<std::size_t>(n);
  auto comms = threadRanks(n);
  ASSERT_EQ(comms.size(), N);
  Streams streams(n);
  std::mt19937 rng(40 + n);
  std::normal_distribution<float> normal(0, 1);
  Global g;
  g.heads = heads, g.kvHeads = kvHeads;
  const auto chunkTokens = [&](int c) { return static_cast<std::int32_t>(2 * n * c); };
  g.cu = {0, chunkTokens(5), chunkTokens(5), chunkTokens(6),
          chunkTokens(22)};  // 10n, none, 2n, 32n
  if (oneSequence) g.cu = {0, chunkTokens(40)};
  for (auto* x : {&g.q, &g.k, &g.v}) {
    x->resize(g.tokens() * static_cast<std::size_t>((x == &g.q ? g.heads : g.kvHeads) * g.dim));
    for (auto& b : *x) b = toBf16(normal(rng));
  }
  const int sequences = static_cast<int>(g.cu.size()) - 1;
  for (bool causal : {false, true}) {
    std::vector<std::vector<std::uint16_t>> outs(N);
    std::vector<std::vector<float>> lses(N);
    std::vector<std::vector<std::int32_t>> positions(N);
    std::size_t local = 0;
    RanksMeet ranks(n);
    onEveryRank(n, [&](int r) {
      RanksMeet::Meet done(ranks);
      const auto R = static_cast<std::size_t>(r);
      std::vector<std::int32_t> cu(g.cu.size());
      positions[R].resize(g.tokens());
      ASSERT_EQ(weftZigzagLocal(g.cu.data(), sequences, n, r, cu.data(), positions[R].data()),
                weftSuccess)
          << weftGetLastError();
      const auto tokens = static_cast<std::size_t>(cu.back());
      positions[R].resize(tokens);
      if (r == 0) local = tokens;
      const auto row = static_cast<std::size_t>(g.dim);
      const auto q = shardOf(g.q, row * g.heads, g.cu, cu, positions[R]);
      const auto k = shardOf(g.k, row * g.kvHeads, g.cu, cu, positions[R]);
      const auto v = shardOf(g.v, row * g.kvHeads, g.cu, cu, positions[R]);
      void *dq, *dk, *dv, *dout, *dcu;
      float* dlse;
      const std::size_t outBytes = tokens * static_cast<std::size_t>(g.heads * g.dim) * 2;
      ASSERT_EQ(cudaMalloc(&dq, q.size() * 2 + 16), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&dk, k.size() * 2 + 16), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&dv, v.size() * 2 + 16), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&dout, outBytes + 16), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&dlse, tokens * static_cast<std::size_t>(g.heads) * 4 + 16),
                cudaSuccess);
      ASSERT_EQ(cudaMalloc(&dcu, cu.size() * 4), cudaSuccess);
      cudaMemcpy(dq, q.data(), q.size() * 2, cudaMemcpyHostToDevice);
      cudaMemcpy(dk, k.data(), k.size() * 2, cudaMemcpyHostToDevice);
      cudaMemcpy(dv, v.data(), v.size() * 2, cudaMemcpyHostToDevice);
      cudaMemcpy(dcu, cu.data(), cu.size() * 4, cudaMemcpyHostToDevice);
      cudaMemsetAsync(dout, 0xFF, outBytes, streams[r]);  // poisoned, before the call
      std::size_t maxSeqlen = 0;
      for (int s = 0; s < sequences; ++s)
        maxSeqlen = std::max<std::size_t>(maxSeqlen, static_cast<std::size_t>(cu[s + 1] - cu[s]));
      const weftAttention a{dq,           dk,
                            dv,           dout,
                            dlse,         static_cast<const std::int32_t*>(dcu),
                            sequences,    tokens,
                            maxSeqlen,    g.heads,
                            g.kvHeads,    g.dim,
                            weftBfloat16, causal ? 1 : 0,
                            0.0f};
      EXPECT_EQ(weftRingAttention(&a, nullptr, 0, comms[R].handle(), streams[r]), weftSuccess)
          << weftGetLastError();
      EXPECT_EQ(cudaStreamSynchronize(streams[r]), cudaSuccess);
      EXPECT_TRUE(comms[R].asyncError().isOk()) << comms[R].asyncError().toString();
      done.meet();  // before anything that could wait for the whole device
      outs[R].resize(outBytes / 2);
      lses[R].resize(tokens * static_cast<std::size_t>(g.heads));
      cudaMemcpy(outs[R].data(), dout, outBytes, cudaMemcpyDeviceToHost);
      cudaMemcpy(lses[R].data(), dlse, lses[R].size() * 4, cudaMemcpyDeviceToHost);
      for (void* p : {dq, dk, dv, dout, static_cast<void*>(dlse), dcu}) (void)cudaFree(p);
    });
    // Every rank's every token against the whole sequence's attention; the wrong rows counted
    // by rank, head and chunk (first or second of the rank's share) for the failure's message.
    int bad = 0;
    std::vector<int> wrongRows(N * static_cast<std::size_t>(g.heads) * 2, 0);
    std::vector<double> want;
    double wantLse = 0;
    const auto D = static_cast<std::size_t>(g.dim);
    for (std::size_t r = 0; r < N; ++r) {
      std::vector<std::int32_t> cu(g.cu.size());
      ASSERT_EQ(weftZigzagLocal(g.cu.data(), sequences, n, static_cast<int>(r), cu.data(), nullptr),
                weftSuccess);
      for (int s = 0; s < sequences; ++s) {
        for (std::int32_t i = cu[s]; i < cu[s + 1]; ++i) {
          const auto t = static_cast<std::size_t>(g.cu[s] + positions[r][i]);
          const auto li = static_cast<std::size_t>(i);
          const bool second = 2 * (i - cu[s]) >= cu[s + 1] - cu[s];
          for (int h = 0; h < g.heads; ++h) {
            const int before = bad;
            g.reference(t, h, causal, want, wantLse);
            const float gotLse = lses[r][static_cast<std::size_t>(h) * local + li];
            if (!(std::fabs(gotLse - wantLse) <= 1e-4 * (1 + std::fabs(wantLse))) && bad++ < 3)
              ADD_FAILURE() << n << " ranks, rank " << r << " token " << t << " head " << h
                            << ": lse " << gotLse << ", expected " << wantLse;
            for (std::size_t c = 0; c < D; ++c) {
              const double got =
                  fromBf16(outs[r][(li * g.heads + static_cast<std::size_t>(h)) * D + c]);
              if (!(std::fabs(got - want[c]) <= 8e-3 * (1 + std::fabs(want[c]))) && bad++ < 3)
                ADD_FAILURE() << n << " ranks, rank " << r << " token " << t << " head " << h
                              << " [" << c << "]: " << got << ", expected " << want[c]
                              << (causal ? " (causal)" : "");
            }
            if (bad != before)
              ++wrongRows[(r * static_cast<std::size_t>(g.heads) + static_cast<std::size_t>(h)) *
                              2 +
                          (second ? 1 : 0)];
          }
        }
      }
    }
    std::string rows;
    for (std::size_t x = 0; x < wrongRows.size(); ++x) {
      if (wrongRows[x] == 0) continue;
      rows += " rank " + std::to_string(x / 2 / static_cast<std::size_t>(g.heads)) + " head " +
              std::to_string(x / 2 % static_cast<std::size_t>(g.heads)) +
              (x % 2 == 0 ? " first: " : " second: ") + std::to_string(wrongRows[x]) + ";";
    }
    EXPECT_EQ(bad, 0) << (causal ? "causal" : "full") << " at " << n
                      << " ranks; wrong rows:" << rows;
  }
}

class GpuRingAttention : public ::testing::TestWithParam<int> {};

TEST_P(GpuRingAttention, MatchesAttentionOverTheWholeSequences) {
  SKIP_WITHOUT_GPU();
  ASSERT_EQ(setenv("WEFT_CP_ATTENTION", "ring", 1), 0);
  expectWholeAttention(GetParam(), 4, 2);
  unsetenv("WEFT_CP_ATTENTION");
}

TEST_P(GpuRingAttention, MatchesAttentionOverOneSequence) {
  SKIP_WITHOUT_GPU();
  ASSERT_EQ(setenv("WEFT_CP_ATTENTION", "ring", 1), 0);
  expectWholeAttention(GetParam(), 4, 2, true);
  unsetenv("WEFT_CP_ATTENTION");
}

// Ulysses forced (WEFT_CP_ATTENTION, read as the communicators start): the same results.
class GpuUlyssesAttention : public ::testing::TestWithParam<int> {};

TEST_P(GpuUlyssesAttention, MatchesAttentionOverTheWholeSequences) {
  SKIP_WITHOUT_GPU();
  ASSERT_EQ(setenv("WEFT_CP_ATTENTION", "ulysses", 1), 0);
  expectWholeAttention(GetParam(), 2 * GetParam(), GetParam());
  expectWholeAttention(GetParam(), 2 * GetParam(), GetParam(), true);
  unsetenv("WEFT_CP_ATTENTION");
}

// The hybrid forced: Ulysses in groups of 2, the ring across the groups.
TEST(GpuHybridAttention, MatchesAttentionOverTheWholeSequences) {
  SKIP_WITHOUT_GPU();
  ASSERT_EQ(setenv("WEFT_CP_ATTENTION", "hybrid", 1), 0);
  expectWholeAttention(4, 4, 2);
  expectWholeAttention(4, 4, 2, true);
  unsetenv("WEFT_CP_ATTENTION");
}

INSTANTIATE_TEST_SUITE_P(Ranks, GpuUlyssesAttention, ::testing::Values(2, 4),
                         [](const ::testing::TestParamInfo<int>& p) {
                           return std::to_string(p.param) + "ranks";
                         });

INSTANTIATE_TEST_SUITE_P(Ranks, GpuRingAttention, ::testing::Values(1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& p) {
                           return std::to_string(p.param) + "ranks";
                         });

}  // namespace
}  // namespace weft::test
