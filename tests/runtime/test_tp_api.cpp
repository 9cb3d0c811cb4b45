// The tensor-parallel calls' C API where no GPU takes them (as on CI): shapes, types, buffers
// and workspaces checked before anything runs, host buffers refused, the plan and the workspace
// answered from the model alone, WEFT_TP_OVERLAP forcing the plan and a bad value failing init.
// tests/gpu/test_gpu_tp.cpp runs the calls on a GPU.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "algorithms/selector.hpp"
#include "tests/runtime/harness.hpp"
#include "weft/weft.h"

namespace weft::test {
namespace {

template <typename Body>
void onTwoRanks(Body body) {
  std::vector<weftComm_t> comms(2);
  ASSERT_EQ(weftCommInitAll(comms.data(), 2), weftSuccess) << weftGetLastError();
  onEveryRank(2, [&](int r) { body(comms[static_cast<std::size_t>(r)]); });
  for (weftComm_t c : comms) EXPECT_EQ(weftCommDestroy(c), weftSuccess);
}

void expectRefused(weftResult_t got, weftResult_t want, const char* needle) {
  EXPECT_EQ(got, want) << needle;
  EXPECT_NE(std::string(weftGetLastError()).find(needle), std::string::npos) << weftGetLastError();
}

TEST(TpApi, BadCallsAreRefusedAndChangeNothing) {
  onTwoRanks([](weftComm_t comm) {
    std::vector<std::uint16_t> a(64 * 64), b(64 * 64), c(64 * 64, 0x7fc0);
    const std::vector<std::uint16_t> before = c;
    expectRefused(weftAllGatherGemm(a.data(), b.data(), c.data(), nullptr, nullptr, 65, 64, 64,
                                    weftBfloat16, nullptr, 0, comm, nullptr),
                  weftInvalidArgument, "m = 65");
    expectRefused(weftGemmReduceScatter(a.data(), b.data(), c.data(), nullptr, 64, 64, 63,
                                        weftBfloat16, nullptr, 0, comm, nullptr),
                  weftInvalidArgument, "k = 63");
    expectRefused(weftAllGatherGemm(a.data(), b.data(), c.data(), nullptr, nullptr, 64, 64, 64,
                                    weftFloat64, nullptr, 0, comm, nullptr),
                  weftInvalidArgument, "f64");
    expectRefused(weftAllGatherGemm(a.data(), b.data(), c.data(), nullptr, nullptr, 64, 64, 64,
                                    static_cast<weftDataType_t>(99), nullptr, 0, comm, nullptr),
                  weftInvalidArgument, "invalid datatype");
    expectRefused(weftGemmReduceScatter(a.data(), nullptr, c.data(), nullptr, 64, 64, 64,
                                        weftBfloat16, nullptr, 0, comm, nullptr),
                  weftInvalidArgument, "NULL");
    expectRefused(weftGemmReduceScatter(a.data(), b.data(), c.data(), nullptr, 64, 64, 64,
                                        weftBfloat16, c.data(), 16, comm, nullptr),
                  weftInvalidArgument, "too small");
    expectRefused(weftGemmReduceScatter(a.data(), b.data(), c.data(), nullptr, 64, 64, 64,
                                        weftBfloat16, nullptr, 16, comm, nullptr),
                  weftInvalidArgument, "workspace is NULL");
    // fp8: e4m3 A and B into bf16 or f16 through the Fp8 calls, k a rank a multiple of 16.
    expectRefused(weftAllGatherGemm(a.data(), b.data(), c.data(), nullptr, nullptr, 64, 64, 64,
                                    weftFloat8e4m3, nullptr, 0, comm, nullptr),
                  weftInvalidArgument, "f8e4m3 into f8e4m3");
    const weftTpFp8 fp8{weftBfloat16, nullptr, nullptr, weftTpFp8PerTensor, nullptr};
    expectRefused(weftAllGatherGemmFp8(a.data(), b.data(), c.data(), nullptr, nullptr, 64, 64, 64,
                                       weftFloat8e5m2, &fp8, nullptr, 0, comm, nullptr),
                  weftInvalidArgument, "must be weftFloat8e4m3");
    expectRefused(weftGemmReduceScatterFp8(a.data(), b.data(), c.data(), nullptr, 64, 64, 48,
                                           weftFloat8e4m3, &fp8, nullptr, 0, comm, nullptr),
                  weftInvalidArgument, "multiple of 16");
    alignas(16) float scales[8] = {};
    const weftTpFp8 unaligned{weftBfloat16, scales, scales + 1, weftTpFp8PerTensor, nullptr};
    expectRefused(weftGemmReduceScatterFp8(a.data(), b.data(), c.data(), nullptr, 64, 64, 64,
                                           weftFloat8e4m3, &unaligned, nullptr, 0, comm, nullptr),
                  weftInvalidArgument, "multiples of 16 bytes");
    expectRefused(weftGemmReduceScatterFp8(a.data(), b.data(), c.data(), nullptr, 64, 60, 64,
                                           weftFloat8e4m3, &fp8, nullptr, 0, comm, nullptr),
                  weftInvalidArgument, "multiple of 8");
    expectRefused(weftGemmReduceScatterFp8(a.data(), b.data(), c.data() + 1, nullptr, 64, 64, 64,
                                           weftFloat8e4m3, &fp8, nullptr, 0, comm, nullptr),
                  weftInvalidArgument, "multiples of 16 bytes");
    const weftTpFp8 intoFp8{weftFloat8e4m3, nullptr, nullptr, weftTpFp8PerTensor, nullptr};
    expectRefused(weftGemmReduceScatterFp8(a.data(), b.data(), c.data(), nullptr, 64, 64, 64,
                                           weftFloat8e4m3, &intoFp8, nullptr, 0, comm, nullptr),
                  weftInvalidArgument, "into f8e4m3");
    expectRefused(weftGemmReduceScatterFp8(a.data(), b.data(), c.data(), nullptr, 64, 64, 64,
                                           weftFloat8e4m3, nullptr, nullptr, 0, comm, nullptr),
                  weftInvalidArgument, "fp8 is NULL");
    // Block scales: both given, a rank's rows a multiple of 4, the gathered scales all-gather's.
    const weftTpFp8 noScales{weftBfloat16, nullptr, scales, weftTpFp8Block128, nullptr};
    expectRefused(weftAllGatherGemmFp8(a.data(), b.data(), c.data(), nullptr, nullptr, 64, 64, 64,
                                       weftFloat8e4m3, &noScales, nullptr, 0, comm, nullptr),
                  weftInvalidArgument, "needs A's and B's scales");
    const weftTpFp8 blocks{weftBfloat16, scales, scales + 4, weftTpFp8Block128, scales};
    expectRefused(weftAllGatherGemmFp8(a.data(), b.data(), c.data(), nullptr, nullptr, 60, 64, 64,
                                       weftFloat8e4m3, &blocks, nullptr, 0, comm, nullptr),
                  weftInvalidArgument, "multiple of 4");
    expectRefused(weftGemmReduceScatterFp8(a.data(), b.data(), c.data(), nullptr, 64, 64, 64,
                                           weftFloat8e4m3, &blocks, nullptr, 0, comm, nullptr),
                  weftInvalidArgument, "gathered scales");
    const weftTpFp8 badScaling{weftBfloat16, scales, scales + 4, static_cast<weftTpFp8Scaling_t>(7),
                               nullptr};
    expectRefused(weftGemmReduceScatterFp8(a.data(), b.data(), c.data(), nullptr, 64, 64, 64,
                                           weftFloat8e4m3, &badScaling, nullptr, 0, comm, nullptr),
                  weftInvalidArgument, "invalid fp8 scaling");
    // Host buffers: not what these calls take (with or without a GPU here).
    const weftResult_t host = weftAllGatherGemm(a.data(), b.data(), c.data(), nullptr, nullptr, 64,
                                                64, 64, weftBfloat16, nullptr, 0, comm, nullptr);
    EXPECT_NE(host, weftSuccess);
    EXPECT_EQ(c, before);
    ASSERT_EQ(weftGroupStart(), weftSuccess);
    expectRefused(weftAllGatherGemm(a.data(), b.data(), c.data(), nullptr, nullptr, 64, 64, 64,
                                    weftBfloat16, nullptr, 0, comm, nullptr),
                  weftInvalidUsage, "group");
    ASSERT_EQ(weftGroupEnd(), weftSuccess);
  });
}

TEST(TpApi, ThePlanAndTheWorkspaceNeedNoGpu) {
  onTwoRanks([](weftComm_t comm) {
    char plan[32] = {};
    ASSERT_EQ(weftTpPlan(comm, weftTpGemmReduceScatter, 4096, 8192, 28672, weftBfloat16, plan,
                         sizeof plan),
              weftSuccess)
        << weftGetLastError();
    const std::string p(plan);
    EXPECT_TRUE(p == "unfused" || p == "fused" || p == "fused:inplace" ||
                p.rfind("chunked:", 0) == 0)
        << p;
    std::size_t bytes = 0;
    ASSERT_EQ(
        weftTpWorkspaceSize(comm, weftTpAllGatherGemm, 4096, 8192, 1024, weftBfloat16, &bytes),
        weftSuccess);
    EXPECT_GE(bytes, std::size_t{4096} * 1024 * 2 + (std::size_t{32} << 20));
    // fp8 calls stage A's fp8 values (all-gather) or C's bf16 ones (reduce-scatter), and keep
    // room for block scales: two floats (gathered, repacked) a 128-value block of A's rows, and
    // a little more.
    auto expectScaleRoom = [](std::size_t room, std::size_t blocks) {
      EXPECT_GE(room, 2 * 4096 * blocks * sizeof(float));
      EXPECT_LE(room, 3 * 4096 * (blocks + 1) * sizeof(float));
    };
    std::size_t fp8Bytes = 0;
    ASSERT_EQ(
        weftTpWorkspaceSize(comm, weftTpAllGatherGemm, 4096, 8192, 1024, weftFloat8e4m3, &fp8Bytes),
        weftSuccess);
    expectScaleRoom(fp8Bytes + std::size_t{4096} * 1024 - bytes, 1024 / 128);
    std::size_t rsBf16 = 0, rsFp8 = 0;
    ASSERT_EQ(
        weftTpWorkspaceSize(comm, weftTpGemmReduceScatter, 4096, 8192, 1024, weftBfloat16, &rsBf16),
        weftSuccess);
    ASSERT_EQ(weftTpWorkspaceSize(comm, weftTpGemmReduceScatter, 4096, 8192, 1024, weftFloat8e4m3,
                                  &rsFp8),
              weftSuccess);
    expectScaleRoom(rsFp8 - rsBf16, 1024 / 2 / 128);
    ASSERT_EQ(weftTpPlan(comm, weftTpGemmReduceScatter, 4096, 8192, 28672, weftFloat8e4m3, plan,
                         sizeof plan),
              weftSuccess)
        << weftGetLastError();
    expectRefused(
        weftTpPlan(comm, weftTpAllGatherGemm, 4095, 8192, 1024, weftBfloat16, plan, sizeof plan),
        weftInvalidArgument, "does not divide");
    expectRefused(
        weftTpWorkspaceSize(comm, static_cast<weftTpOp_t>(7), 64, 64, 64, weftBfloat16, &bytes),
        weftInvalidArgument, "invalid op");
  });
}

// Ranks as threads without a device of their own are priced as sharing one, as weft-plan tp
// --share prices them (docs/perf-tp.md fits the slowdowns with it): the same pick at every M.
TEST(TpApi, ThePlanIsWeftPlansForRanksSharingADevice) {
  const algo::Selector shared = algo::sharedGpuSelectorFor(2, 132, algo::TunerOptions{}, false);
  onTwoRanks([&](weftComm_t comm) {
    for (weftTpOp_t op : {weftTpAllGatherGemm, weftTpGemmReduceScatter}) {
      const bool ag = op == weftTpAllGatherGemm;
      const std::size_t n = ag ? 28672 : 8192, k = ag ? 8192 : 28672;
      for (std::size_t m : {128, 1024, 4096, 16384}) {
        char plan[32] = {};
        ASSERT_EQ(weftTpPlan(comm, op, m, n, k, weftBfloat16, plan, sizeof plan), weftSuccess)
            << weftGetLastError();
        const algo::TpShape shape{
            ag ? algo::TpOp::allGatherGemm : algo::TpOp::gemmReduceScatter, m, n, k, 2, 2};
        auto want = shared.planTp(shape);
        ASSERT_TRUE(want.isOk()) << want.status().toString();
        EXPECT_EQ(std::string(plan), want->name()) << m << " " << want->reason;
      }
    }
  });
}

TEST(TpApi, WeftTpOverlapForcesThePlanAndABadValueFailsInit) {
  for (const char* forced : {"unfused", "chunked:4"}) {
    setenv("WEFT_TP_OVERLAP", forced, 1);
    onTwoRanks([&](weftComm_t comm) {
      char plan[32] = {};
      ASSERT_EQ(
          weftTpPlan(comm, weftTpAllGatherGemm, 4096, 8192, 1024, weftBfloat16, plan, sizeof plan),
          weftSuccess);
      EXPECT_EQ(std::string(plan), forced);
    });
  }
  // Both operations have the fused variants for ranks of one host.
  for (const char* fused : {"fused", "fused:inplace"}) {
    setenv("WEFT_TP_OVERLAP", fused, 1);
    onTwoRanks([&](weftComm_t comm) {
      for (weftTpOp_t op : {weftTpAllGatherGemm, weftTpGemmReduceScatter}) {
        char plan[32] = {};
        ASSERT_EQ(weftTpPlan(comm, op, 4096, 8192, 1024, weftBfloat16, plan, sizeof plan),
                  weftSuccess);
        EXPECT_EQ(std::string(plan), fused);
      }
    });
  }
  setenv("WEFT_TP_OVERLAP", "chunked:0", 1);
  std::vector<weftComm_t> comms(2);
  EXPECT_EQ(weftCommInitAll(comms.data(), 2), weftInvalidArgument);
  EXPECT_NE(std::string(weftGetLastError()).find("WEFT_TP_OVERLAP"), std::string::npos);
  unsetenv("WEFT_TP_OVERLAP");
}

}  // namespace
}  // namespace weft::test
