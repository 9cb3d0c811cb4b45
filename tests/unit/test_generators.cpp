// Every generator, every collective it implements, verified at every rank count 1..64 and a few
// larger ones, out of place and in place, at several roots; then each parameter swept.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "algorithms/algorithm.hpp"
#include "algorithms/patterns.hpp"
#include "algorithms/verifier.hpp"

namespace weft::algo {
namespace {

struct Case {
  std::string algo;
  Collective coll;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.algo << " " << name(c.coll);
}

std::vector<Case> allCases() {
  std::vector<Case> out;
  for (const Algorithm* a : algorithms()) {
    for (Collective c : a->collectives()) out.push_back({std::string(a->name()), c});
  }
  return out;
}

std::string caseName(const testing::TestParamInfo<Case>& info) {
  return info.param.algo + "_" + std::string(name(info.param.coll));
}

std::vector<int> rankCounts() {
  std::vector<int> out;
  for (int n = 1; n <= 64; ++n) out.push_back(n);
  for (int n : {96, 127, 128}) out.push_back(n);
  return out;
}

// Verifies one schedule both ways; returns "" or what failed.
std::string check(const Algorithm& a, Collective coll, int n, const Params& params,
                  VerifyOptions opt = {}) {
  auto s = a.build(coll, n, params);
  if (!s) return "build: " + s.status().toString();
  for (bool inPlace : {false, true}) {
    opt.inPlace = inPlace;
    const VerifyReport rep = verify(*s, opt);
    if (!rep.ok()) {
      return std::string(inPlace ? "in-place " : "") + std::string(name(rep.fault)) + ": " +
             rep.message;
    }
  }
  return {};
}

class EveryGenerator : public testing::TestWithParam<Case> {};

TEST_P(EveryGenerator, VerifiesAtEveryRankCount) {
  const Algorithm& a = *findAlgorithm(GetParam().algo);
  for (int n : rankCounts()) {
    std::vector<int> roots{0};
    if (hasRoot(GetParam().coll)) roots = {0, n / 2, n - 1};
    for (int root : roots) {
      Params params;
      params.root = root;
      EXPECT_EQ(check(a, GetParam().coll, n, params), "") << "n=" << n << " root=" << root;
    }
  }
}

TEST_P(EveryGenerator, SurvivesChannelSplitsAndRepeatedSlices) {
  const Algorithm& a = *findAlgorithm(GetParam().algo);
  for (int n : {1, 2, 3, 7, 8, 13}) {
    for (int channels : {2, 4}) {
      Params params;
      params.channels = channels;
      EXPECT_EQ(check(a, GetParam().coll, n, params), "") << "n=" << n << " channels=" << channels;
    }
    for (int slices : {1, 3}) {
      VerifyOptions opt;
      opt.slices = slices;
      EXPECT_EQ(check(a, GetParam().coll, n, {}, opt), "") << "n=" << n << " slices=" << slices;
    }
  }
}

TEST_P(EveryGenerator, IsDeterministic) {
  const Algorithm& a = *findAlgorithm(GetParam().algo);
  const Schedule x = *a.build(GetParam().coll, 11);
  const Schedule y = *a.build(GetParam().coll, 11);
  for (int r = 0; r < 11; ++r) EXPECT_EQ(describe(x, r), describe(y, r));
}

INSTANTIATE_TEST_SUITE_P(Algorithms, EveryGenerator, testing::ValuesIn(allCases()), caseName);

TEST(Pat, EveryAggregationAtEveryRankCount) {
  for (int n = 2; n <= 48; ++n) {
    for (int A = 1; A <= n / 2; ++A) {  // non powers of two round down
      Params params;
      params.aggregation = A;
      for (Collective c : {Collective::allGather, Collective::reduceScatter}) {
        EXPECT_EQ(check(patAlgorithm(), c, n, params), "") << "n=" << n << " A=" << A;
      }
    }
  }
}

TEST(Pat, MessagesAndScratchAreBoundedByTheAggregation) {
  for (int n : {5, 16, 33, 64, 100, 255}) {
    for (int A = 1; A <= n / 2; A *= 2) {
      Params params;
      params.aggregation = A;
      const Schedule rs = *patAlgorithm().build(Collective::reduceScatter, n, params);
      const VerifyReport rep = verify(rs);
      ASSERT_TRUE(rep.ok()) << rep.message;
      EXPECT_LE(rep.maxMessageBlocks, static_cast<std::uint32_t>(A)) << "n=" << n << " A=" << A;
      // One bundle of partial sums per level of the bundle tree, plus bundle 0's own.
      const int bundles = (n + A - 1) / A;
      EXPECT_LE(rs.scratchBlocks,
                static_cast<std::uint32_t>(A * (ceilLog2(static_cast<std::uint32_t>(bundles)) + 1)))
          << "n=" << n << " A=" << A;
      const Schedule ag = *patAlgorithm().build(Collective::allGather, n, params);
      EXPECT_EQ(ag.scratchBlocks, 0u);
      EXPECT_LE(verify(ag).maxMessageBlocks, static_cast<std::uint32_t>(A));
    }
  }
}

TEST(Pat, RejectsAggregationOutOfRange) {
  Params params;
  params.aggregation = 5;
  EXPECT_EQ(patAlgorithm().build(Collective::allGather, 8, params).status().code(),
            Code::invalidArgument);
  params.aggregation = -1;
  EXPECT_EQ(patAlgorithm().build(Collective::allGather, 8, params).status().code(),
            Code::invalidArgument);
}

TEST(Hierarchical, EveryGroupSizeThatDividesTheRanks) {
  for (int n = 1; n <= 48; ++n) {
    for (int G = 1; G <= n; ++G) {
      if (n % G != 0) continue;
      Params params;
      params.groupSize = G;
      EXPECT_EQ(check(hierarchicalAlgorithm(), Collective::allToAll, n, params), "")
          << "n=" << n << " G=" << G;
    }
  }
}

TEST(RoundPartner, EveryPairMeetsOnceAndEvenCountsNeverIdle) {
  for (int m = 1; m <= 33; ++m) {
    std::vector<std::vector<int>> met(static_cast<std::size_t>(m),
                                      std::vector<int>(static_cast<std::size_t>(m), 0));
    for (int k = 0; k < m; ++k) {
      int fixed = 0;
      for (int x = 0; x < m; ++x) {
        const int y = roundPartner(x, k, m);
        ASSERT_GE(y, 0);
        ASSERT_LT(y, m);
        EXPECT_EQ(roundPartner(y, k, m), x) << "m=" << m << " round " << k << " is an involution";
        ++met[static_cast<std::size_t>(x)][static_cast<std::size_t>(y)];
        fixed += y == x;
      }
      // Even counts: round 0 is everyone's own, and every other round a perfect matching.
      const int expected = m % 2 == 1 ? 1 : (k == 0 ? m : 0);
      EXPECT_EQ(fixed, expected) << "m=" << m << " round " << k;
    }
    for (const auto& row : met) {
      for (int times : row) EXPECT_EQ(times, 1) << "m=" << m;
    }
  }
}

TEST(Hierarchical, NoRankRunsAheadInAnEvenExchange) {
  // With even host and group counts every rank copies its own part in the first round of each
  // phase and exchanges in every other: all ranks run the same sequence of step kinds, so none
  // skips a round mid-phase and runs into its next partner's current exchange (which made the
  // simulator see contention the model did not).
  for (const auto& [n, G] : {std::pair{64, 8}, std::pair{16, 4}, std::pair{24, 2}}) {
    Params params;
    params.groupSize = G;
    const Schedule s = *hierarchicalAlgorithm().build(Collective::allToAll, n, params);
    auto kinds = [&](int r) {
      std::vector<StepKind> out;
      for (const Step& st : s.program(0, r).steps()) out.push_back(st.kind);
      return out;
    };
    const auto first = kinds(0);
    ASSERT_EQ(first.front(), StepKind::copy);
    for (int r = 1; r < n; ++r) EXPECT_EQ(kinds(r), first) << "n=" << n << " G=" << G << " r=" << r;
  }
}

TEST(Hierarchical, RejectsAGroupSizeThatDoesNotDivide) {
  Params params;
  params.groupSize = 3;
  const auto s = hierarchicalAlgorithm().build(Collective::allToAll, 8, params);
  EXPECT_EQ(s.status().code(), Code::invalidArgument);
  EXPECT_NE(s.status().message().find("does not divide"), std::string::npos);
}

TEST(Pairwise, EveryGroupSizeWithRoundsOfOneKind) {
  for (int n = 1; n <= 40; ++n) {
    for (int G = 1; G <= n; ++G) {
      if (n % G != 0) continue;
      Params params;
      params.groupSize = G;
      for (Collective c : {Collective::allToAll, Collective::allToAllv}) {
        EXPECT_EQ(check(pairwiseAlgorithm(), c, n, params), "") << "n=" << n << " G=" << G;
      }
      // With hosts and host sizes even, every exchange of a round is inside hosts or every one
      // is across: the i-th exchange of all ranks is of the same kind, and no rank idles.
      if (n / G % 2 != 0 || G % 2 != 0) continue;
      const Schedule s = *pairwiseAlgorithm().build(Collective::allToAll, n, params);
      std::vector<std::vector<int>> partners(static_cast<std::size_t>(n));
      for (int r = 0; r < n; ++r) {
        const Program& p = s.program(0, r);
        for (const Step& st : p.steps()) {
          for (int q : p.sendPeers(st)) partners[static_cast<std::size_t>(r)].push_back(q);
        }
        ASSERT_EQ(partners[static_cast<std::size_t>(r)].size(), static_cast<std::size_t>(n - 1));
      }
      for (int i = 0; i < n - 1; ++i) {
        std::set<bool> kinds;
        for (int r = 0; r < n; ++r)
          kinds.insert(partners[static_cast<std::size_t>(r)][static_cast<std::size_t>(i)] / G ==
                       r / G);
        EXPECT_EQ(kinds.size(), 1u) << "n=" << n << " G=" << G << " exchange " << i;
      }
    }
  }
}

TEST(Ring, RotatedChannelsLeaveEachHostThroughDifferentRanks) {
  for (int G : {2, 4, 8}) {
    for (int hosts : {1, 2, 3, 8}) {
      const int n = G * hosts;
      for (int channels : {2, 3, 8}) {
        Params params;
        params.groupSize = G;
        params.channels = channels;
        for (Collective c :
             {Collective::allReduce, Collective::allGather, Collective::reduceScatter}) {
          EXPECT_EQ(check(ringAlgorithm(), c, n, params), "")
              << "G=" << G << " hosts=" << hosts << " channels=" << channels;
        }
        if (hosts < 2) continue;
        // Which rank of host 0 sends to host 1 on each channel.
        const Schedule s = *ringAlgorithm().build(Collective::allGather, n, params);
        std::set<int> exits;
        for (std::size_t ch = 0; ch < s.channels.size(); ++ch) {
          for (int r = 0; r < G; ++r) {
            const Program& p = s.program(ch, r);
            for (const Step& st : p.steps()) {
              for (int q : p.sendPeers(st)) {
                if (q >= G) exits.insert(r);
              }
            }
          }
        }
        EXPECT_EQ(exits.size(), static_cast<std::size_t>(std::min(channels, G)))
            << "G=" << G << " channels=" << channels;
      }
    }
  }
}

TEST(DoubleBinaryTree, EveryRankIsALeafInExactlyOneTreeWhenNIsEven) {
  for (int n = 2; n <= 128; n += 2) {
    const Schedule s = *dbtreeAlgorithm().build(Collective::allReduce, n);
    for (int r = 0; r < n; ++r) {
      int leafIn = 0;
      for (std::size_t t = 0; t < 2; ++t) {
        const Program& p = s.program(t, r);
        // A leaf sends its input up and then only receives.
        if (p.steps().size() == 2 && p.steps()[0].kind == StepKind::send) ++leafIn;
      }
      EXPECT_EQ(leafIn, 1) << "n=" << n << " rank " << r;
    }
  }
}

TEST(Registry, BuildRejectsBadRequests) {
  EXPECT_EQ(ringAlgorithm().build(Collective::allReduce, 0).status().code(), Code::invalidArgument);
  Params params;
  params.root = 4;
  EXPECT_EQ(ringAlgorithm().build(Collective::broadcast, 4, params).status().code(),
            Code::invalidArgument);
  EXPECT_EQ(bruckAlgorithm().build(Collective::allReduce, 4).status().code(), Code::unsupported);
  params = {};
  params.channels = 0;
  EXPECT_EQ(ringAlgorithm().build(Collective::allReduce, 4, params).status().code(),
            Code::invalidArgument);
  EXPECT_EQ(findAlgorithm("nosuch"), nullptr);
  EXPECT_EQ(findAlgorithm("ring"), &ringAlgorithm());
}

TEST(Registry, EveryCollectiveHasAnAlgorithm) {
  for (Collective c : kAllCollectives) {
    bool found = false;
    for (const Algorithm* a : algorithms()) found = found || a->supports(c);
    EXPECT_TRUE(found) << name(c);
  }
}

}  // namespace
}  // namespace weft::algo
