// The compression option (algorithms/compression.hpp) and how the selector prices a compressed
// call (algorithms/selector.hpp): the text forms, what is refused, and the pick between the
// compressed variant and the call as it is, from the codec's speed in the tuning constants.
#include <gtest/gtest.h>

#include <string>

#include "algorithms/compression.hpp"
#include "algorithms/rank_graph.hpp"
#include "algorithms/selector.hpp"
#include "fused/fp8/codec.hpp"

namespace weft {
namespace {

TEST(Compression, TextFormsParseAndNameThemselves) {
  auto c = parseCompression("fp8e4m3:32");
  ASSERT_TRUE(c.isOk());
  EXPECT_EQ(c->format, weftCompressFp8E4M3);
  EXPECT_EQ(c->scale, weftScaleE8M0);
  EXPECT_EQ(c->block, 32);
  EXPECT_EQ(c->always, 0);
  EXPECT_EQ(compressionName(*c), "e4m3:32");
  c = parseCompression("e5m2:128:always");
  ASSERT_TRUE(c.isOk());
  EXPECT_EQ(c->scale, weftScaleF32);
  EXPECT_EQ(compressionName(*c), "e5m2:128:always");
  for (const char* none : {"", "none"}) {
    c = parseCompression(none);
    ASSERT_TRUE(c.isOk());
    EXPECT_FALSE(compresses(*c));
  }
  for (const char* bad :
       {"fp8", "e4m3:", "e4m3:64", "fp16:32", "e4m3:32:yes", "e4m3:32:always:x"}) {
    const auto r = parseCompression(bad);
    ASSERT_FALSE(r.isOk()) << bad;
    EXPECT_EQ(r.status().code(), Code::invalidArgument);
    EXPECT_NE(r.status().message().find("FORMAT:BLOCK"), std::string::npos);
  }
}

TEST(Compression, WhatCannotBeCompressedIsNamed) {
  weftCompression c{weftCompressFp8E4M3, weftScaleF32, 32, 0};
  auto s = checkCompression(c, "call");
  EXPECT_EQ(s.code(), Code::invalidArgument);
  EXPECT_NE(s.message().find("a block of 32 with f32 scales is not supported"), std::string::npos)
      << s.message();
  c = {weftCompressNone, weftScaleE8M0, 0, 0};  // off: nothing else is looked at
  EXPECT_TRUE(checkCompression(c, "call").isOk());
  EXPECT_TRUE(compressible(Collective::allGather, DataType::bf16, RedOp::max, "x").isOk());
  EXPECT_FALSE(compressible(Collective::allReduce, DataType::bf16, RedOp::prod, "x").isOk());
  EXPECT_FALSE(compressible(Collective::reduceScatter, DataType::f64, RedOp::sum, "x").isOk());
  EXPECT_FALSE(compressible(Collective::broadcast, DataType::f32, RedOp::sum, "x").isOk());
}

algo::CodecShape e4m3Over32() {
  algo::CodecShape s;
  s.name = "e4m3:32";
  s.block = 32;
  s.scaleBytes = 1;
  s.valueBytes = 2;
  return s;
}

TEST(Compression, TheSelectorsSegmentsAreTheCodecsSegments) {
  const algo::CodecShape shape = e4m3Over32();
  const auto codec = fused::fp8::Codec::parse("e4m3:32");
  ASSERT_TRUE(codec.isOk());
  for (std::size_t values : {1, 31, 32, 33, 1000, 4096, 100003}) {
    const auto seg = fused::fp8::Segments::of(*codec, 4, values, 4 * values);
    EXPECT_EQ(shape.segmentBytes(values), seg.segmentBytes) << values;
    EXPECT_EQ(seg.segmentBytes % 16, 0u);
  }
}

// Host memory of 8 ranks on one host: the codec's speed decides.
algo::Selector hostSelector(double codecGBs) {
  algo::TunerOptions o;
  o.constants.codecs.hostGBs = codecGBs;
  algo::KernelSet k;
  return algo::Selector(algo::sharedMemoryRankGraph(8, o.constants.graphs), o, k);
}

TEST(Compression, TheSelectorPicksTheCheaperWayAndSaysWhy) {
  const std::size_t bytes = 64u << 20;
  for (Collective coll :
       {Collective::allReduce, Collective::reduceScatter, Collective::allGather}) {
    // A codec far faster than the copies: half the bytes win.
    auto fast = hostSelector(1e6).planCompressed(coll, bytes, e4m3Over32());
    ASSERT_TRUE(fast.isOk());
    EXPECT_EQ(fast->codec, "e4m3:32") << fast->reason;
    EXPECT_EQ(fast->algorithm, "compressed");
    EXPECT_NE(fast->reason.find("uncompressed"), std::string::npos) << fast->reason;
    // A slow one: the call as it is, and the reason names what compressing would have cost.
    auto slow = hostSelector(0.01).planCompressed(coll, bytes, e4m3Over32());
    ASSERT_TRUE(slow.isOk());
    EXPECT_TRUE(slow->codec.empty());
    EXPECT_NE(slow->reason.find("uncompressed (e4m3:32 would take"), std::string::npos)
        << slow->reason;
    EXPECT_EQ(slow->algorithm, hostSelector(0.01).plan(coll, bytes)->algorithm);
    // Asked for always: compressed whatever it costs.
    auto always = hostSelector(0.01).planCompressed(coll, bytes, e4m3Over32(), true);
    ASSERT_TRUE(always.isOk());
    EXPECT_EQ(always->codec, "e4m3:32");
    EXPECT_GT(always->estimateUs, slow->estimateUs);
  }
  EXPECT_FALSE(hostSelector(1).planCompressed(Collective::allToAll, bytes, e4m3Over32()).isOk());
}

// Ranks sharing one H200 under the default constants: compressing lost at every measured size
// (docs/perf-fused.md, "Compressed all-reduce, ranks sharing one H200"), so it is never picked.
TEST(Compression, RanksSharingOneDeviceKeepThePlainAllReduce) {
  for (int n : {2, 4, 8}) {
    algo::KernelSet k;
    k.gpu = true;
    k.sameDevice = true;
    k.peerMemory = true;
    const algo::Selector sel(algo::sameDeviceRankGraph(n), algo::TunerOptions{}, k);
    for (std::size_t bytes = 64u << 10; bytes <= (256u << 20); bytes *= 4) {
      auto p = sel.planCompressed(Collective::allReduce, bytes, e4m3Over32());
      ASSERT_TRUE(p.isOk());
      EXPECT_TRUE(p->codec.empty()) << n << " ranks, " << bytes << " B: " << p->reason;
    }
  }
  // The pick is the price's: a codec a hundred times faster would be taken at 8 ranks, 256 MB.
  algo::KernelSet k;
  k.gpu = k.sameDevice = k.peerMemory = true;
  algo::TunerOptions fast;
  fast.constants.codecs.deviceGBs *= 100;
  const algo::Selector sel(algo::sameDeviceRankGraph(8), fast, k);
  auto p = sel.planCompressed(Collective::allReduce, 256u << 20, e4m3Over32());
  ASSERT_TRUE(p.isOk());
  EXPECT_EQ(p->codec, "e4m3:32") << p->reason;
}

TEST(Compression, TheTuningFileCarriesTheCodecsSpeed) {
  auto c = algo::CostConstants::fromJson(
      R"({"codecs": {"host_gbs": 7.5, "device_gbs": 2500, "device_launch_us": 3}})", "test");
  ASSERT_TRUE(c.isOk()) << c.status().toString();
  EXPECT_EQ(c->codecs.hostGBs, 7.5);
  EXPECT_EQ(c->codecs.deviceGBs, 2500);
  auto again = algo::CostConstants::fromJson(c->toJson(), "again");
  ASSERT_TRUE(again.isOk());
  EXPECT_EQ(again->codecs.deviceLaunchUs, 3);
  auto bad = algo::CostConstants::fromJson(R"({"codecs": {"host_gb": 1}})", "bad");
  ASSERT_FALSE(bad.isOk());
  EXPECT_NE(bad.status().message().find("codecs.host_gb"), std::string::npos);
}

}  // namespace
}  // namespace weft
