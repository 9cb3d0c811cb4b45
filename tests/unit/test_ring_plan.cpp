// Ring attention's layout and schedule (fused/attention/ring_plan.hpp): zigzag shards cover each
// sequence once, and the ring's steps attend every query-key pair the mask allows exactly once,
// with the same work on every rank at every step.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "fused/attention/ring_plan.hpp"

namespace weft::fused::attention {
namespace {

TEST(RingPlan, ZigzagShardsCoverTheSequenceOnce) {
  for (int n : {1, 2, 3, 4, 8}) {
    const std::size_t length = 2 * static_cast<std::size_t>(n) * 5;
    auto z = Zigzag::of(length, n);
    ASSERT_TRUE(z.isOk()) << z.status().toString();
    std::vector<int> seen(length, 0);
    for (int r = 0; r < n; ++r) {
      for (std::size_t i = 0; i < 2 * z->chunk; ++i) ++seen[z->position(r, i)];
      // Local order within each chunk is global order.
      EXPECT_EQ(z->position(r, 1), z->position(r, 0) + 1);
    }
    EXPECT_EQ(seen, std::vector<int>(length, 1)) << n << " ranks";
  }
  EXPECT_EQ(Zigzag::of(7, 1)->position(0, 6), 6u);  // one rank: any length, in order
  auto bad = Zigzag::of(12, 4);
  ASSERT_FALSE(bad.isOk());
  EXPECT_EQ(bad.status().code(), Code::invalidArgument);
  EXPECT_NE(bad.status().message().find("2 x 4"), std::string::npos) << bad.status().message();
}

// Every (rank, step) piece as global query-key pairs: each allowed pair once, no other.
TEST(RingPlan, TheStepsAttendEveryAllowedPairOnceWithEqualWork) {
  for (bool causal : {true, false}) {
    for (int n : {1, 2, 3, 4, 5, 8}) {
      const std::size_t chunk = 3, length = 2 * static_cast<std::size_t>(n) * chunk;
      const Zigzag z = *Zigzag::of(length, n);
      std::vector<int> count(length * length, 0);
      std::size_t least = SIZE_MAX, most = 0;
      auto in = [&](Part p, std::size_t local) {
        return p == Part::all || (p == Part::first) == (local < chunk);
      };
      for (int r = 0; r < n; ++r) {
        for (int s = 0; s < n; ++s) {
          const int source = ((r - s) % n + n) % n;
          const Piece p = ringStep(r, s, n, causal);
          if (p.causal) {
            EXPECT_EQ(source, r) << "only the own block is masked";
          }
          std::size_t work = 0;
          for (std::size_t q = 0; q < 2 * chunk; ++q) {
            for (std::size_t k = 0; k < 2 * chunk; ++k) {
              if (!in(p.q, q) || !in(p.kv, k) || (p.causal && k > q)) continue;
              ++count[z.position(r, q) * length + z.position(source, k)];
              ++work;
            }
          }
          EXPECT_EQ(work, pairs(p, chunk));
          least = std::min(least, work), most = std::max(most, work);
        }
      }
      for (std::size_t q = 0; q < length; ++q) {
        for (std::size_t k = 0; k < length; ++k) {
          ASSERT_EQ(count[q * length + k], !causal || k <= q ? 1 : 0)
              << (causal ? "causal" : "full") << ", " << n << " ranks: query " << q << ", key "
              << k;
        }
      }
      // Within one block's diagonal (the own step's causal square).
      EXPECT_LE(most - least, 2 * chunk) << n << " ranks";
    }
  }
}

TEST(RingPlan, PackedSequencesAreZigzaggedEachOnItsOwn) {
  const std::vector<std::int32_t> cu{0, 8, 8, 24};  // 8 tokens, none, 16
  std::vector<std::int32_t> local(4), positions(12);
  ASSERT_TRUE(zigzagLocal(cu.data(), 3, 2, 1, local.data(), positions.data()).isOk());
  EXPECT_EQ(local, (std::vector<std::int32_t>{0, 4, 4, 12}));
  // Rank 1 of 2: chunks 1 and 2 of 4 in each sequence.
  EXPECT_EQ(positions, (std::vector<std::int32_t>{2, 3, 4, 5, 4, 5, 6, 7, 8, 9, 10, 11}));
  const std::vector<std::int32_t> odd{0, 6};
  Status s = zigzagLocal(odd.data(), 1, 2, 0, local.data(), nullptr);
  EXPECT_EQ(s.code(), Code::invalidArgument);
  EXPECT_NE(s.message().find("sequence 0"), std::string::npos) << s.message();
  const std::vector<std::int32_t> down{0, 8, 4};
  EXPECT_EQ(zigzagLocal(down.data(), 2, 2, 0, local.data(), nullptr).code(), Code::invalidArgument);
  EXPECT_EQ(zigzagLocal(cu.data(), 3, 2, 2, local.data(), nullptr).code(), Code::invalidArgument);
}

}  // namespace
}  // namespace weft::fused::attention
