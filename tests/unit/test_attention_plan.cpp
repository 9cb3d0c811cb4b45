// Context-parallel attention as the selector prices it (algorithms/attention_plan.hpp): ring,
// Ulysses or the hybrid on ranks sharing one GPU, which wins where, what forces a pick, and what
// rules Ulysses and the hybrid out (heads the ranks or no group divide, one rank); which local
// kernel.
#include <gtest/gtest.h>

#include <algorithm>

#include "algorithms/attention_plan.hpp"
#include "algorithms/rank_graph.hpp"
#include "algorithms/selector.hpp"

namespace weft {
namespace {

algo::Selector sharedGpu(int n) {
  algo::TunerOptions o;
  algo::KernelSet k;
  k.gpu = true;
  k.sameDevice = true;
  k.peerMemory = true;
  return algo::Selector(algo::sameDeviceRankGraph(n), o, k);
}

algo::AttentionShape shape(std::size_t tokens, int n, int heads = 32, int kvHeads = 8) {
  algo::AttentionShape s;
  s.tokens = tokens, s.heads = heads, s.kvHeads = kvHeads, s.dim = 128;
  s.causal = true, s.nranks = n;
  return s;
}

TEST(AttentionPlan, BothArePricedAndTheCheaperIsPicked) {
  const algo::Selector sel = sharedGpu(4);
  for (std::size_t tokens : {64, 1024, 16384}) {
    auto p = sel.planAttention(shape(tokens, 4));
    ASSERT_TRUE(p.isOk()) << p.status().toString();
    EXPECT_GT(p->ringUs, 0);
    EXPECT_GT(p->ulyssesUs, 0);
    EXPECT_GT(p->hybridUs, 0);  // groups of 2
    EXPECT_DOUBLE_EQ(p->estimateUs, std::min({p->ringUs, p->ulyssesUs, p->hybridUs}));
    EXPECT_NE(p->reason.find("the cheaper"), std::string::npos) << p->reason;
    // Either way at least the attention's own time.
    EXPECT_GE(p->estimateUs, p->attentionUs);
  }
}

TEST(AttentionPlan, ForcedPicksAndWhatRulesUlyssesOut) {
  const algo::Selector sel = sharedGpu(4);
  auto ring = sel.planAttention(shape(64, 4), algo::CpAlgo::ring);
  ASSERT_TRUE(ring.isOk());
  EXPECT_EQ(ring->algo, algo::CpAlgo::ring);
  EXPECT_NE(ring->reason.find("forced"), std::string::npos);
  auto uneven = sel.planAttention(shape(64, 4, 3, 3));
  ASSERT_TRUE(uneven.isOk());
  EXPECT_EQ(uneven->algo, algo::CpAlgo::ring);
  EXPECT_EQ(uneven->group, 1);
  EXPECT_EQ(uneven->ulyssesUs, 0);
  EXPECT_EQ(uneven->hybridUs, 0);
  EXPECT_NE(uneven->reason.find("do not split 4 ways"), std::string::npos) << uneven->reason;
  auto forced = sel.planAttention(shape(64, 4, 6, 2), algo::CpAlgo::ulysses);
  ASSERT_TRUE(forced.isOk());
  EXPECT_NE(forced->algo, algo::CpAlgo::ulysses);
  EXPECT_NE(forced->reason.find("forced ulysses, but"), std::string::npos) << forced->reason;
  auto hybrid = sel.planAttention(shape(64, 4), algo::CpAlgo::hybrid);
  ASSERT_TRUE(hybrid.isOk());
  EXPECT_EQ(hybrid->algo, algo::CpAlgo::hybrid);  // 32 and 8 heads: groups of 2
  EXPECT_EQ(hybrid->group, 2);
  auto none = sharedGpu(2).planAttention(shape(64, 2), algo::CpAlgo::hybrid);
  ASSERT_TRUE(none.isOk());
  EXPECT_EQ(none->algo, algo::CpAlgo::ring);
  EXPECT_NE(none->reason.find("forced hybrid, but"), std::string::npos) << none->reason;
  EXPECT_EQ(sharedGpu(1).planAttention(shape(64, 1))->algo, algo::CpAlgo::ring);
  EXPECT_EQ(*algo::parseCpAlgo("ulysses"), algo::CpAlgo::ulysses);
  EXPECT_EQ(*algo::parseCpAlgo("hybrid"), algo::CpAlgo::hybrid);
  EXPECT_EQ(*algo::parseCpAlgo("ulysses"), algo::CpAlgo::ulysses);
  EXPECT_FALSE(algo::parseCpAlgo("zigzag").isOk());
}

// With 6 heads and 2 K/V heads on 4 ranks, Ulysses cannot run but groups of 2 can: the hybrid
// is priced, and its group is 2; forced, it runs in groups of 2. Backward too.
TEST(AttentionPlan, TheHybridWhereOnlyAGroupDividesTheHeads) {
  const algo::Selector sel = sharedGpu(4);
  for (bool backward : {false, true}) {
    algo::AttentionShape s = shape(8192, 4, 6, 2);
    s.backward = backward;
    auto p = sel.planAttention(s);
    ASSERT_TRUE(p.isOk()) << p.status().toString();
    EXPECT_EQ(p->ulyssesUs, 0);
    EXPECT_GT(p->hybridUs, 0);
    EXPECT_NE(p->reason.find("in groups of 2"), std::string::npos) << p->reason;
    EXPECT_DOUBLE_EQ(p->estimateUs, std::min(p->ringUs, p->hybridUs));
    EXPECT_EQ(p->group, p->algo == algo::CpAlgo::hybrid ? 2 : 1);
    auto forced = sel.planAttention(s, algo::CpAlgo::hybrid);
    ASSERT_TRUE(forced.isOk());
    EXPECT_EQ(forced->algo, algo::CpAlgo::hybrid);
    EXPECT_EQ(forced->group, 2);
    EXPECT_DOUBLE_EQ(forced->estimateUs, p->hybridUs);
  }
}

// Backward, Ulysses is a candidate as forward: priced, and picked where cheaper.
TEST(AttentionPlan, UlyssesRunsTheBackwardPassToo) {
  const algo::Selector sel = sharedGpu(4);
  algo::AttentionShape back = shape(16384, 4);
  back.backward = true;
  auto p = sel.planAttention(back);
  ASSERT_TRUE(p.isOk());
  EXPECT_GT(p->ulyssesUs, 0);
  EXPECT_DOUBLE_EQ(p->estimateUs, std::min({p->ringUs, p->ulyssesUs, p->hybridUs}));
  auto forced = sel.planAttention(back, algo::CpAlgo::ulysses);
  EXPECT_EQ(forced->algo, algo::CpAlgo::ulysses);
  EXPECT_EQ(forced->group, 4);
}

// The local kernel: cuDNN's (faster by the constants) where it covers the shape, weft's
// elsewhere and in the backward pass; a forced cuDNN it does not cover stays weft's, saying why.
TEST(AttentionPlan, CudnnsKernelWhereItCovers) {
  const algo::Selector sel = sharedGpu(2);
  algo::AttentionShape s = shape(16384, 2);
  auto weft = sel.planAttention(s);
  ASSERT_TRUE(weft.isOk());
  EXPECT_EQ(weft->kernel, algo::AttentionKernel::weft);
  s.cudnn = true;
  auto cudnn = sel.planAttention(s);
  ASSERT_TRUE(cudnn.isOk());
  EXPECT_EQ(cudnn->kernel, algo::AttentionKernel::cudnn);
  EXPECT_LT(cudnn->attentionUs, weft->attentionUs);
  EXPECT_NE(cudnn->reason.find("cudnn's kernel"), std::string::npos) << cudnn->reason;
  EXPECT_EQ(sel.planAttention(s, std::nullopt, algo::AttentionKernel::weft)->kernel,
            algo::AttentionKernel::weft);
  algo::AttentionShape back = s;
  back.backward = true;
  EXPECT_EQ(sel.planAttention(back)->kernel, algo::AttentionKernel::weft);
  s.cudnn = false;
  auto refused = sel.planAttention(s, std::nullopt, algo::AttentionKernel::cudnn);
  ASSERT_TRUE(refused.isOk());
  EXPECT_EQ(refused->kernel, algo::AttentionKernel::weft);
  EXPECT_NE(refused->reason.find("cuDNN's needs"), std::string::npos) << refused->reason;
  EXPECT_EQ(*algo::parseAttentionKernel("cudnn"), algo::AttentionKernel::cudnn);
  EXPECT_FALSE(algo::parseAttentionKernel("flash").isOk());
}

TEST(AttentionPlan, TheBackwardPassCountsTwoAndAHalfForwards) {
  algo::AttentionShape f = shape(4096, 2);
  algo::AttentionShape b = f;
  b.backward = true;
  EXPECT_DOUBLE_EQ(b.rankFlops(), 2.5 * f.rankFlops());
  // Causal: half of 4 · 4096 · 8192 · 32 · 128.
  EXPECT_DOUBLE_EQ(f.rankFlops(), 0.5 * 4.0 * 4096 * 8192 * 32 * 128);
}

}  // namespace
}  // namespace weft
