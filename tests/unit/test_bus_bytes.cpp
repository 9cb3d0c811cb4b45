// Bytes on the wire: each algorithm moves what its analysis says, on every rank.
#include <gtest/gtest.h>

#include <bit>

#include "algorithms/algorithm.hpp"
#include "algorithms/patterns.hpp"
#include "algorithms/verifier.hpp"

namespace weft::algo {
namespace {

VerifyReport costs(const Algorithm& a, Collective c, int n, Params params = {}) {
  const VerifyReport rep = verify(*a.build(c, n, params));
  EXPECT_TRUE(rep.ok()) << rep.message;
  return rep;
}

// Every rank sends exactly `bytes` (as a multiple of the message size).
void expectEveryRank(const VerifyReport& rep, int n, double bytes, const std::string& what) {
  EXPECT_NEAR(rep.maxBytes, bytes, 1e-12) << what;
  EXPECT_NEAR(rep.totalBytes, bytes * n, 1e-9) << what << " (not every rank sends the same)";
}

TEST(BusBytes, RingAllReduceMovesTwoNMinusOneOverN) {
  for (int n = 2; n <= 64; ++n) {
    expectEveryRank(costs(ringAlgorithm(), Collective::allReduce, n), n, 2.0 * (n - 1) / n,
                    "n=" + std::to_string(n));
  }
}

// Memory traffic: each of ring's 2(n - 1) messages of S/n per rank is written into a slot and
// read out of it, each reduce step reads the local operand too, and the last steps write the
// output: (6n - 4) S over all ranks (docs/algorithms.md), the same split over channels.
TEST(BusBytes, RingAllReduceTouchesSixNMinusFourMessagesOfMemory) {
  for (int n = 2; n <= 64; ++n) {
    const VerifyReport rep = costs(ringAlgorithm(), Collective::allReduce, n);
    EXPECT_NEAR(rep.totalMemory, 6.0 * n - 4, 1e-9) << n;
    EXPECT_NEAR(rep.maxMemory, (6.0 * n - 4) / n, 1e-9) << n;
    const Schedule split = splitChannels(*ringAlgorithm().build(Collective::allReduce, n, {}), 3);
    EXPECT_NEAR(verify(split).totalMemory, 6.0 * n - 4, 1e-9) << n;
  }
  // One-shot: each rank reads its input and writes it into n - 1 slots, then reads the input and
  // the n - 1 slots and writes the output: 2n + 1 messages of S per rank.
  for (int n = 2; n <= 16; ++n) {
    EXPECT_NEAR(costs(oneshotAlgorithm(), Collective::allReduce, n).totalMemory,
                double(n) * (2 * n + 1), 1e-9)
        << n;
  }
}

TEST(BusBytes, RingAllGatherAndReduceScatterMoveNMinusOneOverN) {
  for (int n = 2; n <= 64; ++n) {
    for (Collective c : {Collective::allGather, Collective::reduceScatter}) {
      expectEveryRank(costs(ringAlgorithm(), c, n), n, double(n - 1) / n, "n=" + std::to_string(n));
    }
  }
}

TEST(BusBytes, PatMovesExactlyNMinusOneBlocksPerRank) {
  for (int n = 2; n <= 70; ++n) {
    for (int A = 1; A <= n / 2; A *= 2) {
      Params params;
      params.aggregation = A;
      for (Collective c : {Collective::allGather, Collective::reduceScatter}) {
        const Schedule s = *patAlgorithm().build(c, n, params);
        const VerifyReport rep = verify(s);
        ASSERT_TRUE(rep.ok()) << rep.message;
        // One block is 1/n of the message: n-1 blocks per rank, on every rank.
        expectEveryRank(rep, n, double(n - 1) / n,
                        "n=" + std::to_string(n) + " A=" + std::to_string(A));
        const int bundles = (n + A - 1) / A;
        EXPECT_EQ(rep.maxMessages, static_cast<std::uint32_t>(
                                       bundles - 1 + std::countr_zero(static_cast<unsigned>(A))));
      }
    }
  }
}

TEST(BusBytes, TwoShotAndRabenseifnerMatchTheRing) {
  for (int n = 2; n <= 64; ++n) {
    expectEveryRank(costs(twoshotAlgorithm(), Collective::allReduce, n), n, 2.0 * (n - 1) / n,
                    "twoshot n=" + std::to_string(n));
    if (std::has_single_bit(static_cast<unsigned>(n))) {
      expectEveryRank(costs(rhdAlgorithm(), Collective::allReduce, n), n, 2.0 * (n - 1) / n,
                      "rhd n=" + std::to_string(n));
    }
  }
}

TEST(BusBytes, RabenseifnerFoldsPayOneMessageMore) {
  for (int n : {3, 5, 6, 7, 12, 100}) {
    const double p = pow2Floor(static_cast<std::uint32_t>(n));
    EXPECT_NEAR(costs(rhdAlgorithm(), Collective::allReduce, n).maxBytes, 2 * (p - 1) / p + 1,
                1e-12)
        << n;
  }
}

TEST(BusBytes, OneShotSendsTheWholeInputToEveryPeer) {
  for (int n = 2; n <= 32; ++n)
    expectEveryRank(costs(oneshotAlgorithm(), Collective::allReduce, n), n, n - 1, "");
}

TEST(BusBytes, AllToAllVariants) {
  for (int n = 2; n <= 64; ++n) {
    expectEveryRank(costs(pairwiseAlgorithm(), Collective::allToAll, n), n, double(n - 1) / n,
                    "pairwise");
    // Bruck sends every block once per set bit of its rotated index.
    long bits = 0;
    for (int i = 0; i < n; ++i) bits += std::popcount(static_cast<unsigned>(i));
    expectEveryRank(costs(bruckAlgorithm(), Collective::allToAll, n), n, double(bits) / n, "bruck");
    const int G = hierarchicalGroupSize(n, 0), N = n / G;
    expectEveryRank(costs(hierarchicalAlgorithm(), Collective::allToAll, n), n,
                    double(2 * n - N - G) / n, "hierarchical n=" + std::to_string(n));
  }
}

TEST(BusBytes, TreesMoveAtMostTwiceTheMessage) {
  for (int n = 2; n <= 128; ++n) {
    const VerifyReport ar = costs(dbtreeAlgorithm(), Collective::allReduce, n);
    // Even n: a rank is internal in one tree (up once, down twice, half the data each) and a leaf
    // in the other (up once): 2. Odd n: a rank can be internal in both.
    EXPECT_LE(ar.maxBytes, n % 2 == 0 ? 2.0 : 3.0) << n;
    // Total over ranks: each tree edge carries half the message up and half down.
    EXPECT_NEAR(ar.totalBytes, 2.0 * (n - 1), 1e-9) << n;
    EXPECT_NEAR(costs(dbtreeAlgorithm(), Collective::broadcast, n).totalBytes, n - 1.0, 1e-9) << n;
  }
}

TEST(BusBytes, ChainsMoveTheMessageOnce) {
  for (int n = 2; n <= 32; ++n) {
    EXPECT_NEAR(costs(ringAlgorithm(), Collective::broadcast, n).totalBytes, n - 1.0, 1e-12);
    EXPECT_NEAR(costs(ringAlgorithm(), Collective::reduce, n).totalBytes, n - 1.0, 1e-12);
  }
}

}  // namespace
}  // namespace weft::algo
