// Ranks whose kernels share one GPU as the cost model prices them (docs/algorithms-gpu.md): the
// bulk calls' flag chains behind their bytes, the direct kernels at their own memory traffic,
// the copy rate scaled by the device's peak, and the fused copies at a block's traffic.
#include <gtest/gtest.h>

#include <algorithm>

#include "algorithms/overlap.hpp"
#include "algorithms/rank_graph.hpp"
#include "algorithms/selector.hpp"

namespace weft {
namespace {

constexpr std::size_t kMiB = 1u << 20;
// An H100 SXM's peak as CUDA reports it: 2619 MHz, both edges, 5120 bits.
constexpr double kH100PeakGBs = 2619e6 * 2 * 5120 / 8 / 1e9;

algo::Estimate estimate(const algo::Selector& s, const char* algorithm, Collective coll,
                        std::size_t bytes) {
  auto e =
      s.tuner().model().estimate(algorithm, coll, bytes, algo::Protocol::simple, s.tuner().graph());
  EXPECT_TRUE(e.isOk()) << e.status().toString();
  return e.isOk() ? *e : algo::Estimate{};
}

// Past the first pass a bulk call's flag chains run while its bytes move: where the bytes are
// the longer, the flags add one pass's chain whatever the size (they added a chain a pass).
TEST(SharedDevice, BulkFlagsHideBehindTheBytes) {
  const algo::Selector s = algo::sharedGpuSelectorFor(2, 132, {}, false);
  const algo::Estimate mid = estimate(s, "ring", Collective::allGather, 16 * kMiB);
  const algo::Estimate big = estimate(s, "ring", Collective::allGather, 256 * kMiB);
  EXPECT_GT(big.bandwidthUs, 15 * mid.bandwidthUs);
  EXPECT_NEAR(big.latencyUs, mid.latencyUs, 1e-9);
  EXPECT_NEAR(big.timeUs, big.latencyUs + big.bandwidthUs, 1e-9);
  // Where the chains are the longer (8 ranks, 16 channels: 64 passes of a 7-hop chain), the
  // bytes hide behind them instead: one pass's latency (at 64 KiB) and 63 more chains.
  const algo::Selector eight = algo::sharedGpuSelectorFor(8, 132, {}, false);
  const algo::Estimate chains = estimate(eight, "ring", Collective::allGather, 256 * kMiB);
  const algo::Estimate one = estimate(eight, "ring", Collective::allGather, 64 * 1024);
  const double base = eight.tuner().model().constants().baseLatency[1];
  const double chain = one.latencyUs - base;
  ASSERT_GT(chain, 0);
  ASSERT_GT(63 * chain, chains.bandwidthUs);
  EXPECT_NEAR(chains.timeUs, one.latencyUs + 63 * chain, 1e-6);
}

// The direct kernels copy each input into a slab that is read from memory once and write the
// outputs: all-gather n + 3 messages in all, reduce-scatter 3n + 1, all-to-all and one-shot
// all-reduce 4n, two-shot 4n + 2; the selector prices them so where they serve.
TEST(SharedDevice, DirectKernelsAtTheirOwnTraffic) {
  using algo::CostModel;
  EXPECT_EQ(CostModel::directTraffic(Collective::allGather, false, 8), 11);
  EXPECT_EQ(CostModel::directTraffic(Collective::reduceScatter, false, 4), 13);
  EXPECT_EQ(CostModel::directTraffic(Collective::allToAll, false, 4), 16);
  EXPECT_EQ(CostModel::directTraffic(Collective::allReduce, false, 2), 8);
  EXPECT_EQ(CostModel::directTraffic(Collective::allReduce, true, 8), 34);
  EXPECT_LT(CostModel::directTraffic(Collective::broadcast, false, 8), 0);
  for (int n : {2, 4, 8}) {
    const algo::Selector s = algo::sharedGpuSelectorFor(n, 132, {}, false);
    const algo::RankGraph& g = s.tuner().graph();
    const std::size_t bytes = 4 * kMiB * static_cast<std::size_t>(n);  // 4 MiB a rank: direct
    auto plan = s.plan(Collective::allGather, bytes);
    ASSERT_TRUE(plan.isOk());
    EXPECT_EQ(plan->kernel, algo::Kernel::gpuDirect) << n;
    auto direct =
        s.tuner().model().directEstimate(Collective::allGather, bytes, plan->protocol, g, false);
    ASSERT_TRUE(direct.isOk());
    EXPECT_NEAR(plan->estimateUs, direct->timeUs, 1e-9);
    const algo::Estimate fifo = estimate(s, "oneshot", Collective::allGather, bytes);
    const double traffic = CostModel::memoryTraffic("oneshot", Collective::allGather, n);
    auto same = s.tuner().model().directEstimate(Collective::allGather, bytes,
                                                 algo::Protocol::simple, g, false);
    ASSERT_TRUE(same.isOk());
    EXPECT_NEAR(same->bandwidthUs / fifo.bandwidthUs, (n + 3) / traffic, 1e-9) << n;
  }
  // A rank a GPU: the direct kernel keeps the schedule's price (its bytes cross links).
  const algo::Selector links = algo::gpuSelectorOn(
      algo::uniformRankGraph(4, topo::PathClass::nvl, 100, 100), false, {}, true, 4 * kMiB);
  auto apart = links.plan(Collective::allGather, 16 * kMiB);
  ASSERT_TRUE(apart.isOk());
  ASSERT_EQ(apart->kernel, algo::Kernel::gpuDirect);
  auto schedule = links.tuner().model().estimate("oneshot", Collective::allGather, 16 * kMiB,
                                                 apart->protocol, links.tuner().graph());
  ASSERT_TRUE(schedule.isOk());
  EXPECT_NEAR(apart->estimateUs, schedule->timeUs, 1e-9);
}

// The device's copies, like its GEMMs' reads, run at the H200's fraction of any device's peak
// where no tuning file gives the rate; the shared graph is made of the scaled rate.
TEST(SharedDevice, CopyRateScalesWithThePeak) {
  const algo::CostConstants c;
  const double scale = kH100PeakGBs / algo::GemmConstants::kH200PeakMemoryGBs;
  EXPECT_NEAR(algo::gpuConstants(c, true, false, kH100PeakGBs).graphs.deviceCopyGBs,
              c.graphs.deviceCopyGBs * scale, 1e-9);
  EXPECT_EQ(algo::gpuConstants(c, true, true, kH100PeakGBs).graphs.deviceCopyGBs,
            c.graphs.deviceCopyGBs);
  EXPECT_EQ(algo::gpuConstants(c, true, false, 0).graphs.deviceCopyGBs, c.graphs.deviceCopyGBs);
  const algo::Selector h100 = algo::sharedGpuSelectorFor(4, 132, {}, false, kH100PeakGBs);
  EXPECT_NEAR(h100.tuner().graph().deviceCopyGBs, c.graphs.deviceCopyGBs * scale, 1e-9);
  const algo::Selector h200 = algo::sharedGpuSelectorFor(4, 132, {}, false);
  const algo::Estimate slow = estimate(h100, "ring", Collective::allGather, 256 * kMiB);
  const algo::Estimate fast = estimate(h200, "ring", Collective::allGather, 256 * kMiB);
  EXPECT_NEAR(slow.bandwidthUs * scale, fast.bandwidthUs, 1e-6);
}

// A fused call's copy on a shared device is every rank's copy engine moving one block at once,
// read and written, after its flag's wait; across GPUs, a block's share of the all-gather.
TEST(SharedDevice, FusedCopiesAtABlocksTraffic) {
  const int n = 4;
  const std::size_t m = 16384;
  const algo::TpShape s{algo::TpOp::allGatherGemm, m, 28672, 8192, 2, n};
  algo::TunerOptions o;
  algo::KernelSet k;
  k.gpu = true;
  k.sameDevice = true;
  k.peerMemory = true;
  const algo::Selector sel(algo::sameDeviceRankGraph(n, {}, o.constants.graphs), o, k);
  auto fused = sel.planTp(s, algo::kTpFused);
  ASSERT_TRUE(fused.isOk()) << fused.status().toString();
  const double block = static_cast<double>(m / n * s.k * s.valueBytes);
  const algo::GraphConstants& g = o.constants.graphs;
  EXPECT_NEAR(fused->copyUs, g.deviceHopLatencyUs + 2 * block * n / (g.deviceCopyGBs * 1e3), 1e-9);
  // Less than a block's share of the all-gather, which goes through the FIFO slots.
  EXPECT_LT(fused->copyUs, fused->commUs);
}

}  // namespace
}  // namespace weft
