// MoE dispatch and combine as the selector prices them (algorithms/moe_plan.hpp): a routing
// table's per-rank token lists (a token once per rank, dropped slots, bad indices refused), the
// traffic of every rank, simulated routings (uniform and Zipf-skewed), and the estimates
// growing with the busiest rank's bytes.
#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "algorithms/cost_model.hpp"
#include "algorithms/moe_plan.hpp"
#include "algorithms/rank_graph.hpp"
#include "algorithms/selector.hpp"

namespace weft {
namespace {

using algo::MoeShape;

// Four ranks, 8 experts (2 a rank), top-3.
MoeShape small(std::size_t tokens) {
  return MoeShape::of(tokens, 256, 3, 8, 4, false);
}

TEST(MoePlan, ATokenGoesOnceToEachRankOfItsExperts) {
  // Token 0: experts 0, 1 (rank 0) and 6 (rank 3); token 1: 2 (rank 1), dropped, 3 (rank 1);
  // token 2: all dropped; token 3: 7, 5, 4 (ranks 3, 2, 2).
  const std::vector<std::int64_t> idx{0, 1, 6, 2, -1, 3, -1, -1, -1, 7, 5, 4};
  auto r = algo::routeTokens(small(4), idx.data());
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  EXPECT_EQ(r->dropped, 4u);
  EXPECT_EQ(r->toRank(0), 1u);
  EXPECT_EQ(r->toRank(1), 1u);
  EXPECT_EQ(r->toRank(2), 1u);
  EXPECT_EQ(r->toRank(3), 2u);
  EXPECT_EQ(r->tokens, (std::vector<std::int32_t>{0, 1, 3, 0, 3}));
  EXPECT_EQ(r->perExpert, (std::vector<std::size_t>{1, 1, 1, 1, 1, 1, 1, 1}));
}

TEST(MoePlan, BadRoutingsAreRefused) {
  const MoeShape s = small(1);
  const std::vector<std::int64_t> high{0, 1, 8}, low{0, -2, 1}, twice{3, 1, 3};
  auto a = algo::routeTokens(s, high.data());
  ASSERT_FALSE(a.isOk());
  EXPECT_NE(a.status().message().find("expert 8"), std::string::npos) << a.status().message();
  EXPECT_FALSE(algo::routeTokens(s, low.data()).isOk());
  auto b = algo::routeTokens(s, twice.data());
  ASSERT_FALSE(b.isOk());
  EXPECT_NE(b.status().message().find("twice"), std::string::npos);
  EXPECT_FALSE(algo::checkMoeShape(MoeShape::of(1, 256, 3, 6, 4, false)).isOk());  // 6 / 4
  EXPECT_FALSE(algo::checkMoeShape(MoeShape::of(1, 256, 9, 8, 4, false)).isOk());  // top-9 of 8
  EXPECT_FALSE(algo::parseRouting("zipf:x").isOk());
  EXPECT_FALSE(algo::parseRouting("normal").isOk());
  EXPECT_TRUE(algo::parseRouting("zipf:1.5")->zipf);
}

// Every simulated token takes top-k distinct experts: the slots add up; uniform routing
// spreads the traffic nearly evenly, Zipf's concentrates it on the popular experts' ranks.
TEST(MoePlan, SimulatedRoutingsAddUpAndSkewAsTheyShould) {
  const MoeShape s = MoeShape::of(2048, 7168, 8, 64, 8, true);
  algo::Routing uniform;
  const algo::MoeTraffic u = algo::simulateRouting(s, uniform);
  std::size_t slots = 0;
  for (std::size_t c : u.perExpert) slots += c;
  EXPECT_EQ(slots, s.tokens * 8 * 8);
  // A token reaches at most min(k, ranks) ranks, at least one.
  for (int r = 0; r < 8; ++r) {
    std::size_t out = 0;
    for (int q = 0; q < 8; ++q) out += u.tokens[static_cast<std::size_t>(r * 8 + q)];
    EXPECT_GE(out, s.tokens);
    EXPECT_LE(out, s.tokens * 8);
  }
  EXPECT_LT(u.skew(), 1.1);
  auto zipf = algo::parseRouting("zipf:1.5");
  const algo::MoeTraffic z = algo::simulateRouting(s, *zipf);
  EXPECT_GT(z.skew(), u.skew() + 0.2);
  std::set<std::size_t> counts(z.perExpert.begin(), z.perExpert.end());
  EXPECT_GT(*counts.rbegin(), 10 * *counts.begin() + 1);  // popular against rare experts
  // Seeded: the same routing again.
  EXPECT_EQ(algo::simulateRouting(s, *zipf).tokens, z.tokens);
}

TEST(MoePlan, TheEstimatesFollowTheBusiestRank) {
  algo::TunerOptions o;
  algo::KernelSet k;
  k.gpu = true;
  k.sameDevice = true;
  k.peerMemory = true;
  const algo::Selector sel(algo::sameDeviceRankGraph(8), o, k);
  const MoeShape s = MoeShape::of(4096, 7168, 8, 64, 8, true);
  algo::Routing uniform;
  const algo::MoeTraffic u = algo::simulateRouting(s, uniform);
  auto pu = sel.planMoe(s, u);
  ASSERT_TRUE(pu.isOk()) << pu.status().toString();
  EXPECT_GT(pu->dispatchUs, 0);
  EXPECT_GT(pu->combineUs, pu->dispatchUs);  // bf16 back, fp8 out
  EXPECT_EQ(pu->busiestBytes, u.busiest() * s.dispatchBytes);
  const algo::MoeTraffic z = algo::simulateRouting(s, *algo::parseRouting("zipf:2"));
  auto pz = sel.planMoe(s, z);
  ASSERT_TRUE(pz.isOk());
  EXPECT_GT(z.busiest(), u.busiest());
  EXPECT_GT(pz->dispatchUs, pu->dispatchUs);
  // One rank: nothing crosses.
  const MoeShape one = MoeShape::of(64, 256, 2, 4, 1, false);
  const algo::Selector alone(algo::sameDeviceRankGraph(1), o, k);
  auto p1 = alone.planMoe(one, algo::simulateRouting(one, uniform));
  ASSERT_TRUE(p1.isOk());
  EXPECT_EQ(p1->dispatchUs, 0);
}

// Across hosts on host memory: the hierarchical path sends a token once per host, so it wins
// where tokens go to several ranks of a host (top-8 of 64 experts on 4 ranks a host) and loses
// its second exchange where each goes to one rank (top-1); forcing picks either.
TEST(MoePlan, AcrossHostsTheHierarchicalPathWhereTokensShareAHost) {
  const algo::Placement placement = algo::Placement::regular(8, 2, 0);
  const algo::Selector sel(algo::hostRankGraph(placement, 1.25), algo::TunerOptions{},
                           algo::KernelSet{});
  const auto rails = algo::Rails::of(placement.hostOf);
  ASSERT_TRUE(rails.has_value());
  EXPECT_EQ(rails->peer(1, 1), 5);
  EXPECT_FALSE(algo::Rails::of({0, 0, 1}).has_value());  // hosts of unequal rank counts
  EXPECT_FALSE(algo::Rails::of({0, 0}).has_value());     // one host
  algo::Routing uniform;
  const MoeShape wide = MoeShape::of(4096, 7168, 8, 64, 8, false);
  const algo::MoeTraffic t8 = algo::simulateRouting(wide, uniform, rails);
  ASSERT_EQ(t8.toHost.size(), 16u);
  auto p8 = sel.planMoe(wide, t8);
  ASSERT_TRUE(p8.isOk()) << p8.status().toString();
  EXPECT_TRUE(p8->hierarchical) << p8->reason;
  EXPECT_LT(p8->hierarchicalUs, p8->flatUs);
  EXPECT_DOUBLE_EQ(p8->dispatchUs + p8->combineUs, p8->hierarchicalUs);
  const MoeShape narrow = MoeShape::of(64, 256, 1, 64, 8, false);
  auto p1 = sel.planMoe(narrow, algo::simulateRouting(narrow, uniform, rails));
  ASSERT_TRUE(p1.isOk());
  EXPECT_FALSE(p1->hierarchical) << p1->reason;
  auto forced = sel.planMoe(narrow, algo::simulateRouting(narrow, uniform, rails), true);
  ASSERT_TRUE(forced.isOk());
  EXPECT_TRUE(forced->hierarchical);
  EXPECT_NE(forced->reason.find("forced"), std::string::npos) << forced->reason;
}

// The fastest way measured on the H200 under MPS (2, 4 and 8 ranks sharing it; hidden 7168,
// top-8 of 64 experts; docs/perf-fused.md, "Modes and channels") is the one the defaults pick.
TEST(MoePlan, OnOneSharedGpuTheDefaultsPickTheWayMeasuredFastest) {
  struct Measured {
    int ranks;
    std::size_t tokens;
    bool lowLatency;
  };
  for (const Measured m :
       {Measured{2, 1, true}, Measured{2, 128, true}, Measured{2, 4096, false},
        Measured{4, 1, true}, Measured{4, 128, false}, Measured{4, 4096, false},
        Measured{8, 1, true}, Measured{8, 128, false}, Measured{8, 4096, false}}) {
    SCOPED_TRACE(std::to_string(m.ranks) + " ranks, " + std::to_string(m.tokens) + " tokens");
    algo::KernelSet k;
    k.gpu = k.sameDevice = k.peerMemory = true;
    const algo::Selector sel(algo::sameDeviceRankGraph(m.ranks), algo::TunerOptions{}, k);
    const MoeShape s = MoeShape::of(m.tokens, 7168, 8, 64, m.ranks, false);
    auto p = sel.planMoeGpu(s, algo::simulateRouting(s, algo::Routing{}));
    ASSERT_TRUE(p.isOk()) << p.status().toString();
    EXPECT_EQ(p->lowLatency, m.lowLatency) << p->reason;
    EXPECT_TRUE(p->table) << p->reason;  // normal mode placed from the table
  }
}

// On GPU memory: each mode's channels are the fewest within 2 % of its fastest, the pick is the
// cheaper mode, low latency keeps its spinning blocks under the device's share and is not
// offered past 64 experts a rank, and forcing either is said.
TEST(MoePlan, OnGpuMemoryTheCheaperModeOnTheFewestChannelsThatKeepItsPace) {
  algo::KernelSet k;
  k.gpu = k.sameDevice = k.peerMemory = true;
  const algo::Selector sel(algo::sameDeviceRankGraph(8), algo::TunerOptions{}, k);
  algo::Routing uniform;
  for (std::size_t tokens : {1, 128, 4096}) {
    SCOPED_TRACE(tokens);
    MoeShape s = MoeShape::of(tokens, 7168, 8, 64, 8, false);
    const algo::MoeTraffic t = algo::simulateRouting(s, uniform);
    auto p = sel.planMoeGpu(s, t);
    ASSERT_TRUE(p.isOk()) << p.status().toString();
    EXPECT_GT(p->normalUs, 0);
    EXPECT_GT(p->lowLatencyUs, 0);
    EXPECT_EQ(p->lowLatency, p->lowLatencyUs < p->normalUs) << p->reason;
    EXPECT_DOUBLE_EQ(p->dispatchUs + p->combineUs, p->lowLatency ? p->lowLatencyUs : p->normalUs);
    if (p->lowLatency) {
      EXPECT_LE(p->channels, 256 / 8);  // spin_blocks over the ranks sharing the GPU
    }
    // Half the channels is slower (by more than 2 % of the fastest); the same forced cost the same.
    auto same = sel.planMoeGpu(s, t, p->lowLatency, p->channels);
    ASSERT_TRUE(same.isOk());
    EXPECT_DOUBLE_EQ(same->dispatchUs + same->combineUs, p->dispatchUs + p->combineUs);
    EXPECT_NE(same->reason.find("forced"), std::string::npos) << same->reason;
    if (p->channels > 1) {
      auto half = sel.planMoeGpu(s, t, p->lowLatency, p->channels / 2);
      ASSERT_TRUE(half.isOk());
      EXPECT_GT(half->dispatchUs + half->combineUs, p->dispatchUs + p->combineUs);
    }
  }
  // More tokens take more channels.
  const MoeShape few = MoeShape::of(1, 7168, 8, 64, 8, false),
                 many = MoeShape::of(4096, 7168, 8, 64, 8, false);
  auto pf = sel.planMoeGpu(few, algo::simulateRouting(few, uniform), false);
  auto pm = sel.planMoeGpu(many, algo::simulateRouting(many, uniform), false);
  ASSERT_TRUE(pf.isOk() && pm.isOk());
  EXPECT_LT(pf->channels, pm->channels);
  auto auto4096 = sel.planMoeGpu(many, algo::simulateRouting(many, uniform));
  ASSERT_TRUE(auto4096.isOk());
  EXPECT_FALSE(auto4096->lowLatency) << auto4096->reason;
  // 128 experts a rank: normal only.
  const MoeShape wide = MoeShape::of(128, 1024, 8, 256, 2, false);
  const algo::Selector two(algo::sameDeviceRankGraph(2), algo::TunerOptions{}, k);
  auto pw = two.planMoeGpu(wide, algo::simulateRouting(wide, uniform));
  ASSERT_TRUE(pw.isOk());
  EXPECT_FALSE(pw->lowLatency);
  EXPECT_EQ(pw->lowLatencyUs, 0);
  EXPECT_FALSE(pw->table);
  auto refused = two.planMoeGpu(wide, algo::simulateRouting(wide, uniform), true);
  EXPECT_EQ(refused.status().code(), Code::unsupported);
  auto noTable = two.planMoeGpu(wide, algo::simulateRouting(wide, uniform), false, 0, true);
  EXPECT_EQ(noTable.status().code(), Code::unsupported);
  // Normal mode's placing at 8 ranks and 4096 tokens, as measured on the H200: from the table.
  EXPECT_TRUE(auto4096->table) << auto4096->reason;
  // The tuning file's "moe" section.
  auto c = algo::CostConstants::fromJson(
      R"({"moe": {"kernel_us": 2.5, "half_rate_blocks": 60, "peer_us": 3, "chunk_us": 7}})", "t");
  ASSERT_TRUE(c.isOk()) << c.status().toString();
  EXPECT_EQ(c->moe.kernelUs, 2.5);
  EXPECT_EQ(c->moe.halfRateBlocks, 60);
  auto again = algo::CostConstants::fromJson(c->toJson(), "again");
  ASSERT_TRUE(again.isOk());
  EXPECT_EQ(again->moe.halfRateBlocks, 60);
  EXPECT_EQ(again->moe.peerUs, 3);
  EXPECT_EQ(again->moe.chunkUs, 7);
  EXPECT_FALSE(algo::CostConstants::fromJson(R"({"moe": {"kernel": 1}})", "bad").isOk());
}

}  // namespace
}  // namespace weft
