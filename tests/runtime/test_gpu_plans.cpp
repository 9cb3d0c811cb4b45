// What the GPU tuner plans for ranks that share one GPU, asked through weftCommPlanMemory: no GPU
// is needed to plan. The protocol small calls keep, the direct kernels' reach, and the picks that
// tuning files and WEFT_ALGO force.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

#include "tests/runtime/harness.hpp"

namespace weft::test {
namespace {

// The GPU tuner's plan ("algorithm/protocol") for a float32 call of `bytes` (count bytes / 4).
std::string gpuPlanOf(weftComm_t h, weftCollective_t c, std::size_t bytes) {
  char buf[128] = {};
  EXPECT_EQ(weftCommPlanMemory(h, c, bytes / 4, weftFloat32, weftGpuMemory, buf, sizeof buf),
            weftSuccess);
  return std::string(buf);
}

// On GPU memory the ll protocol serves small calls only (past 64 KiB the bulk one runs), unless
// WEFT_PROTO forces it or the call is a one-shot all-reduce for the direct kernel.
TEST(Arguments, GpuPlansKeepTheLowLatencyProtocolForSmallCalls) {
  auto planOf = gpuPlanOf;
  for (int n : {4, 8}) {
    std::vector<Comm> comms = makeComms(n);
    weftComm_t h = comms[0].handle();
    for (std::size_t bytes : {std::size_t{8}, std::size_t{16} << 10})
      EXPECT_NE(planOf(h, weftCollAllReduce, bytes).find("/ll"), std::string::npos) << bytes;
    for (weftCollective_t c : {weftCollAllReduce, weftCollAllGather, weftCollReduceScatter}) {
      for (std::size_t bytes : {std::size_t{256} << 10, std::size_t{2} << 20}) {
        const std::string plan = planOf(h, c, bytes);
        // The direct kernels (one-shot, two-shot up to their limit) use no protocol.
        if (plan.rfind("oneshot/", 0) == 0 || plan.rfind("twoshot/", 0) == 0) continue;
        EXPECT_NE(plan.find("/simple"), std::string::npos)
            << n << " ranks, " << bytes << ": " << plan;
      }
    }
  }
  setenv("WEFT_PROTO", "ll", 1);
  std::vector<Comm> forced = makeComms(4);
  unsetenv("WEFT_PROTO");
  EXPECT_NE(planOf(forced[0].handle(), weftCollAllReduce, 2 << 20).find("/ll"), std::string::npos);
}

// What the GPU tuner picks for an all-reduce of ranks sharing one GPU (no GPU needed to plan):
// the direct kernels (one-shot to 128 KiB, and at any size to 4 ranks; two-shot beyond on 8), in
// rounds of their slabs up to a limit by rank count (4 on 2 ranks, 16 on 4, 64 on 8); past it,
// the fastest measured on the H200 (docs/perf-gpu.md, 2026-11-30): ring (two-shot through
// the FIFOs 4-20 % slower once ring's forwarding steps read each message once; the double
// binary tree, which the model priced ahead at 8 MB, 1.1-2.1x slower). Before a device is set
// up the plans take 4 MiB rounds.
TEST(Arguments, GpuAllReducePlansFollowTheDirectKernelAndMemoryTraffic) {
  auto planOf = [](weftComm_t h, std::size_t bytes) {
    return gpuPlanOf(h, weftCollAllReduce, bytes);
  };
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  struct Expect {
    int n;
    std::vector<std::size_t> oneShot, twoShot, ring;
  };
  const std::vector<Expect> expects = {
      {2, {8, 64 << 10, 2 * kMiB, 16 * kMiB}, {}, {32 * kMiB, 256 * kMiB}},
      {4, {8, 64 << 10, 2 * kMiB, 64 * kMiB}, {}, {128 * kMiB, 256 * kMiB}},
      {8, {8, 64 << 10, 128 << 10}, {256 << 10, 2 * kMiB, 8 * kMiB, 256 * kMiB}, {512 * kMiB}},
  };
  for (const Expect& e : expects) {
    std::vector<Comm> comms = makeComms(e.n);
    weftComm_t h = comms[0].handle();
    for (std::size_t bytes : e.oneShot)
      EXPECT_EQ(planOf(h, bytes).rfind("oneshot/", 0), 0u) << e.n << " ranks, " << bytes;
    for (std::size_t bytes : e.twoShot)
      EXPECT_EQ(planOf(h, bytes).rfind("twoshot/", 0), 0u) << e.n << " ranks, " << bytes;
    for (std::size_t bytes : e.ring)
      EXPECT_EQ(planOf(h, bytes), "ring/simple") << e.n << " ranks, " << bytes;
  }
  // WEFT_GPU_DIRECT=N: at most N rounds (4 MiB each before a device is set up), then ring.
  for (const auto& [rounds, bytes, direct] :
       std::vector<std::tuple<const char*, std::size_t, bool>>{{"1", 4 * kMiB, true},
                                                               {"1", 8 * kMiB, false},
                                                               {"3", 12 * kMiB, true},
                                                               {"3", 16 * kMiB, false}}) {
    setenv("WEFT_GPU_DIRECT", rounds, 1);
    std::vector<Comm> c = makeComms(8);
    unsetenv("WEFT_GPU_DIRECT");
    const std::string plan = planOf(c[0].handle(), bytes);
    const bool isDirect = plan.rfind("oneshot/", 0) == 0 || plan.rfind("twoshot/", 0) == 0;
    EXPECT_EQ(isDirect, direct) << "WEFT_GPU_DIRECT=" << rounds << ", " << bytes << ": " << plan;
  }
  // An algorithm forced by WEFT_ALGO stays forced at small sizes.
  setenv("WEFT_ALGO", "twoshot", 1);
  std::vector<Comm> forced = makeComms(4);
  unsetenv("WEFT_ALGO");
  EXPECT_EQ(planOf(forced[0].handle(), 64 << 10).rfind("twoshot/", 0), 0u);
}

// The GPU tuning files weft-perf --calibrate --gpu wrote on the machines perf/tuning/ names:
// with one, the GPU tuner makes the picks whose regret docs/perf-gpu.md records (the calibration's
// "after" column, sizes as weft-perf's: an all-reduce's buffer, the others' larger buffer). A
// direct kernel's protocol is its schedule's cheaper one, which the kernel does not use.
TEST(Arguments, GpuTuningFilesKeepTheirMeasuredPicks) {
  struct Case {
    const char* file;
    int n;
    // By collective (all-reduce, all-gather, reduce-scatter, all-to-all), at 64 KiB, 1 MiB,
    // 16 MiB and 256 MiB.
    std::vector<std::vector<const char*>> picks;
  };
  const std::vector<Case> cases = {
      {"h200x2-nvlink.json",
       2,
       {{"oneshot/ll", "oneshot/ll", "oneshot/simple", "ring/simple"},
        {"oneshot/ll", "oneshot/ll", "oneshot/simple", "ring/simple"},
        {"oneshot/ll", "oneshot/ll", "ring/simple", "ring/simple"},
        {"oneshot/ll", "oneshot/ll", "pairwise/simple", "pairwise/simple"}}},
      {"h200-8procs-mps.json",
       8,
       {{"oneshot/ll", "twoshot/ll", "twoshot/simple", "twoshot/simple"},
        {"oneshot/ll", "oneshot/ll", "oneshot/simple", "oneshot/simple"},
        {"oneshot/ll", "oneshot/ll", "ring/simple", "ring/simple"},
        {"oneshot/ll", "oneshot/ll", "pairwise/simple", "pairwise/simple"}}},
  };
  const weftCollective_t colls[] = {weftCollAllReduce, weftCollAllGather, weftCollReduceScatter,
                                    weftCollAllToAll};
  const std::size_t sizes[] = {64 << 10, 1 << 20, 16 << 20, std::size_t{256} << 20};
  for (const Case& c : cases) {
    const std::string path = std::string(WEFT_SOURCE_DIR) + "/perf/tuning/" + c.file;
    setenv("WEFT_TUNING_FILE", path.c_str(), 1);
    std::vector<Comm> comms = makeComms(c.n);
    unsetenv("WEFT_TUNING_FILE");
    for (std::size_t k = 0; k < 4; ++k) {
      for (std::size_t i = 0; i < 4; ++i) {
        // weft-perf's size is the larger buffer; a call's count is per rank or per peer.
        const std::size_t bytes =
            colls[k] == weftCollAllReduce ? sizes[i] : sizes[i] / static_cast<std::size_t>(c.n);
        EXPECT_EQ(gpuPlanOf(comms[0].handle(), colls[k], bytes), c.picks[k][i])
            << c.file << ", collective " << colls[k] << ", " << sizes[i] << " B";
      }
    }
  }
}

// All-gather, reduce-scatter and all-to-all on GPU memory take the direct one-shot kernel while
// each rank's input fits: on 2 ranks 8 MiB; beyond, all-gather's the rounds (as all-reduce's: 4
// MiB each before a device is set up; 64 rounds on 8 ranks), the other two's 4 MiB; their schedules
// through the FIFOs beyond; a forced algorithm keeps its own.
TEST(Arguments, GpuBlockCollectivesTakeTheDirectKernelWhileTheInputFits) {
  auto planOf = gpuPlanOf;
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  for (int n : {2, 8}) {
    std::vector<Comm> comms = makeComms(n);
    weftComm_t h = comms[0].handle();
    const std::size_t rounds = n == 2 ? 4 : 64;
    const auto N = static_cast<std::size_t>(n);
    // The count a rank passes is per block: an all-gather's input is one block, a
    // reduce-scatter's or all-to-all's one per rank.
    auto input = [&](weftCollective_t c, std::size_t block) {
      return c == weftCollAllGather ? block : block * N;
    };
    for (std::size_t block :
         {std::size_t{64}, std::size_t{64} << 10, 4 * kMiB * rounds / 8, 4 * kMiB * rounds}) {
      for (weftCollective_t c : {weftCollAllGather, weftCollReduceScatter, weftCollAllToAll}) {
        const std::string plan = planOf(h, c, block);
        const std::size_t most = n == 2                   ? 8 * kMiB
                                 : c != weftCollAllGather ? 4 * kMiB
                                                          : 4 * kMiB * rounds;
        const bool fits = input(c, block) <= most;
        EXPECT_EQ(plan.rfind("oneshot/", 0) == 0, fits)
            << n << " ranks, collective " << c << ", block " << block << ": " << plan;
      }
    }
    // Past the rounds, one-shot through the FIFOs is not taken (unmeasured on GPU).
    for (weftCollective_t c : {weftCollAllGather, weftCollReduceScatter, weftCollAllToAll}) {
      const std::string plan = planOf(h, c, 8 * kMiB * rounds);
      EXPECT_NE(plan.rfind("oneshot/", 0), 0u) << n << " ranks, collective " << c << ": " << plan;
    }
  }
  setenv("WEFT_ALGO", "ring", 1);
  std::vector<Comm> forced = makeComms(4);
  unsetenv("WEFT_ALGO");
  EXPECT_EQ(planOf(forced[0].handle(), weftCollAllGather, 64 << 10).rfind("ring/", 0), 0u);
}

}  // namespace
}  // namespace weft::test
