// The tensor-parallel operations as the selector prices them (algorithms/overlap.hpp): unfused
// where the collective is small beside the GEMM or the GEMM too small to cut, chunks where the
// two are comparable, the forced variant as forced; the tuning file's "gemm"; the chunks' GEMM
// shapes the runtime runs (fused/tp/overlap.hpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "algorithms/overlap.hpp"
#include "algorithms/rank_graph.hpp"
#include "algorithms/selector.hpp"
#include "fused/tp/overlap.hpp"

namespace weft {
namespace {

// Ranks sharing one device, with a GEMM rate of `tflops` (and an all-peers wait of
// `allPeersUs` where not negative).
algo::Selector gpuSelector(int n, double tflops, bool peerMemory = false, bool sameDevice = true,
                           double allPeersUs = -1) {
  algo::TunerOptions o;
  o.constants.gemm.tflops = tflops;
  if (allPeersUs >= 0) o.constants.graphs.deviceAllPeersUs = allPeersUs;
  algo::KernelSet k;
  k.gpu = true;
  k.sameDevice = sameDevice;
  k.peerMemory = peerMemory;
  return algo::Selector(algo::sameDeviceRankGraph(n, {}, o.constants.graphs), o, k);
}

algo::TpShape shape(algo::TpOp op, std::size_t m, int n) {
  const bool ag = op == algo::TpOp::allGatherGemm;
  return {op, m, ag ? 28672u : 8192u, ag ? 8192u : 28672u, 2, n};
}

TEST(TpOverlap, UnfusedWhereTheCollectiveIsSmallChunksWhereItIsNot) {
  for (algo::TpOp op : {algo::TpOp::allGatherGemm, algo::TpOp::gemmReduceScatter}) {
    // The H200's GEMM rate: the collective is a few percent of the GEMM, cutting only adds.
    auto fast = gpuSelector(4, 700).planTp(shape(op, 16384, 4));
    ASSERT_TRUE(fast.isOk()) << fast.status().toString();
    EXPECT_EQ(fast->name(), "unfused") << fast->reason;
    EXPECT_NEAR(fast->estimateUs, fast->sequentialUs, 1e-9);
    EXPECT_NE(fast->reason.find("sequential"), std::string::npos) << fast->reason;
    // A GEMM as slow as the collective: chunks hide one behind the other.
    auto slow = gpuSelector(4, fast->gemmUs / fast->commUs * 700).planTp(shape(op, 16384, 4));
    ASSERT_TRUE(slow.isOk());
    EXPECT_GT(slow->chunks, 1) << slow->reason;
    EXPECT_LT(slow->estimateUs, slow->sequentialUs);
    EXPECT_GE(slow->estimateUs, std::max(slow->gemmUs, slow->commUs));
    // Forced: that many chunks, whatever they cost; never more than a block has rows.
    auto forced = gpuSelector(4, 700).planTp(shape(op, 16384, 4), 4);
    ASSERT_TRUE(forced.isOk());
    EXPECT_EQ(forced->name(), "chunked:4");
    EXPECT_NE(forced->reason.find("forced"), std::string::npos);
    EXPECT_GT(forced->estimateUs, fast->estimateUs);
    auto tiny = gpuSelector(4, 700).planTp(shape(op, 8, 4), 16);
    ASSERT_TRUE(tiny.isOk());
    EXPECT_EQ(tiny->chunks, 2);
  }
}

// The fused variants: candidates where the ranks map each other's memory, priced between the
// GEMM alone and the sequential call; forced elsewhere they are unfused, saying why.
TEST(TpOverlap, FusedWhereTheRanksMapEachOthersMemory) {
  const auto ag = shape(algo::TpOp::allGatherGemm, 16384, 4);
  auto base = gpuSelector(4, 700).planTp(ag);
  ASSERT_TRUE(base.isOk());
  // A GEMM twice as slow as the collective: the copies beside it (slowing it) hide.
  const double tflops = base->gemmUs / base->commUs * 700 / 2;
  auto slow = gpuSelector(4, tflops, true).planTp(ag);
  ASSERT_TRUE(slow.isOk());
  auto fused = gpuSelector(4, tflops, true).planTp(ag, algo::kTpFused);
  ASSERT_TRUE(fused.isOk());
  EXPECT_EQ(fused->name(), "fused");
  EXPECT_LT(fused->estimateUs, fused->sequentialUs);
  EXPECT_GE(fused->estimateUs, fused->gemmUs);
  EXPECT_LE(slow->estimateUs, fused->estimateUs) << slow->reason;
  EXPECT_NE(slow->reason.find("cheapest of 7"), std::string::npos) << slow->reason;
  auto noPeers = gpuSelector(4, tflops, false).planTp(ag, algo::kTpFused);
  ASSERT_TRUE(noPeers.isOk());
  EXPECT_EQ(noPeers->name(), "unfused");
  EXPECT_NE(noPeers->reason.find("map each other's memory"), std::string::npos) << noPeers->reason;
  // GEMM + reduce-scatter: fused too, its sum past the last GEMM; a candidate of the same pick.
  const auto rsShape = shape(algo::TpOp::gemmReduceScatter, 16384, 4);
  auto rs = gpuSelector(4, tflops, true).planTp(rsShape, algo::kTpFused);
  ASSERT_TRUE(rs.isOk());
  EXPECT_EQ(rs->name(), "fused");
  EXPECT_LT(rs->estimateUs, rs->sequentialUs);
  EXPECT_GT(rs->estimateUs, rs->gemmUs);
  auto rsPick = gpuSelector(4, tflops, true).planTp(rsShape);
  ASSERT_TRUE(rsPick.isOk());
  EXPECT_LE(rsPick->estimateUs, rs->estimateUs);
  EXPECT_NE(rsPick->reason.find("cheapest of 7"), std::string::npos) << rsPick->reason;
  auto rsNoPeers = gpuSelector(4, tflops, false).planTp(rsShape, algo::kTpFused);
  ASSERT_TRUE(rsNoPeers.isOk());
  EXPECT_EQ(rsNoPeers->name(), "unfused");
}

// In place: a candidate where the ranks share the device (no copies, a GEMM a block), priced
// between the GEMM alone and the sequential call; not offered across devices, though forced it
// runs wherever the ranks map each other's memory.
TEST(TpOverlap, InPlaceWhereTheRanksShareTheDevice) {
  for (algo::TpOp op : {algo::TpOp::allGatherGemm, algo::TpOp::gemmReduceScatter}) {
    const auto s = shape(op, 16384, 4);
    auto base = gpuSelector(4, 700).planTp(s);
    ASSERT_TRUE(base.isOk());
    const double tflops = base->gemmUs / base->commUs * 700;
    auto in = gpuSelector(4, tflops, true).planTp(s, algo::kTpFusedInPlace);
    ASSERT_TRUE(in.isOk());
    EXPECT_EQ(in->name(), "fused:inplace");
    EXPECT_EQ(in->chunks, algo::kTpFusedInPlace);
    EXPECT_GE(in->estimateUs, in->gemmUs);
    EXPECT_LT(in->estimateUs, in->sequentialUs);
    // One GEMM of every row: all-gather's after the ranks' own copies, side by side;
    // reduce-scatter's before the sum.
    EXPECT_EQ(algo::tpInPlacePieces(4), (std::vector<algo::TpPiece>{{0, 4}}));
    // Every rank waits for its three peers' blocks at once: an all-peers wait for each peer
    // past the first.
    const double allPeers = 2 * algo::sameDeviceRankGraph(4).deviceAllPeersUs;
    ASSERT_GT(allPeers, 0);
    if (op == algo::TpOp::allGatherGemm) {
      EXPECT_NEAR(in->estimateUs, in->copyUs + in->gemmUs + allPeers, 1e-6);
    } else {
      EXPECT_GT(in->estimateUs, in->gemmUs);
      EXPECT_LT(in->estimateUs, in->gemmUs + in->commUs);
    }
    auto pick = gpuSelector(4, tflops, true).planTp(s);
    ASSERT_TRUE(pick.isOk());
    EXPECT_LE(pick->estimateUs, in->estimateUs);
    auto apart = gpuSelector(4, tflops, true, false).planTp(s);
    ASSERT_TRUE(apart.isOk());
    EXPECT_NE(apart->reason.find("cheapest of 6"), std::string::npos) << apart->reason;
    EXPECT_NE(apart->chunks, algo::kTpFusedInPlace);
    auto forcedApart = gpuSelector(4, tflops, true, false).planTp(s, algo::kTpFusedInPlace);
    ASSERT_TRUE(forcedApart.isOk());
    EXPECT_EQ(forcedApart->name(), "fused:inplace");
    auto noPeers = gpuSelector(4, tflops, false).planTp(s, algo::kTpFusedInPlace);
    ASSERT_TRUE(noPeers.isOk());
    EXPECT_EQ(noPeers->name(), "unfused");
  }
}

// Ranks sharing a device: a fused form's wait for every peer's block is priced as two-shot's,
// per peer past one (docs/perf-tp.md, "Small M"). Where it costs more than the all-gather the
// in-place form saves (four ranks at 128 rows, a dear wait), the pick is unfused; two ranks wait
// for one peer, at no such cost.
TEST(TpOverlap, AllPeersWaitPricedWhereRanksShareTheDevice) {
  auto selector = [](int n, double allPeersUs) {
    return gpuSelector(n, algo::GemmConstants{}.tflops, true, true, allPeersUs);
  };
  for (algo::TpOp op : {algo::TpOp::allGatherGemm, algo::TpOp::gemmReduceScatter}) {
    const auto s4 = shape(op, 128, 4), s2 = shape(op, 128, 2);
    auto free4 = selector(4, 0).planTp(s4, algo::kTpFusedInPlace);
    auto dear4 = selector(4, 30).planTp(s4, algo::kTpFusedInPlace);
    ASSERT_TRUE(free4.isOk() && dear4.isOk());
    EXPECT_NEAR(dear4->estimateUs - free4->estimateUs, 2 * 30, 1e-6);
    auto pick = selector(4, 0).planTp(s4);
    ASSERT_TRUE(pick.isOk());
    EXPECT_EQ(pick->name(), "fused:inplace") << pick->reason;
    pick = selector(4, 30).planTp(s4);
    ASSERT_TRUE(pick.isOk());
    EXPECT_EQ(pick->name(), "unfused") << pick->reason;
    auto free2 = selector(2, 0).planTp(s2, algo::kTpFusedInPlace);
    auto dear2 = selector(2, 30).planTp(s2, algo::kTpFusedInPlace);
    ASSERT_TRUE(free2.isOk() && dear2.isOk());
    EXPECT_NEAR(dear2->estimateUs, free2->estimateUs, 1e-6);
  }
}

// fp8 A and B: the GEMM at the fp8 rate, all-gather moving A's single bytes, reduce-scatter
// still C's two; the chunks' GEMMs read B transposed.
// A fused call's GEMMs: copies far cheaper than a block's GEMM, whole runs of blocks (three
// GEMMs at most); as dear, a block each; every block once, the own block alone, first
// (all-gather) or last (reduce-scatter).
TEST(TpOverlap, FusedPiecesMergeTheBlocksTheCopiesAllow) {
  using P = std::vector<algo::TpPiece>;
  const auto ag = algo::TpOp::allGatherGemm, rs = algo::TpOp::gemmReduceScatter;
  EXPECT_EQ(algo::tpFusedPieces(ag, 4, 0, 1, 100), (P{{0, 1}, {1, 3}}));
  EXPECT_EQ(algo::tpFusedPieces(ag, 4, 1, 1, 100), (P{{1, 1}, {2, 2}, {0, 1}}));
  EXPECT_EQ(algo::tpFusedPieces(ag, 4, 3, 1, 100), (P{{3, 1}, {0, 3}}));
  EXPECT_EQ(algo::tpFusedPieces(ag, 4, 1, 1, 1), (P{{1, 1}, {2, 1}, {3, 1}, {0, 1}}));
  EXPECT_EQ(algo::tpFusedPieces(rs, 4, 0, 1, 100), (P{{1, 3}, {0, 1}}));
  EXPECT_EQ(algo::tpFusedPieces(rs, 4, 1, 1, 100), (P{{2, 2}, {0, 1}, {1, 1}}));
  EXPECT_EQ(algo::tpFusedPieces(rs, 4, 3, 1, 100), (P{{0, 3}, {3, 1}}));
  EXPECT_EQ(algo::tpFusedPieces(rs, 4, 1, 1, 1), (P{{2, 1}, {3, 1}, {0, 1}, {1, 1}}));
  // Between: a copy half a block's GEMM, 8 ranks: the runs grow as the GEMMs before them do.
  EXPECT_EQ(algo::tpFusedPieces(ag, 8, 0, 1, 2), (P{{0, 1}, {1, 1}, {2, 2}, {4, 4}}));
  EXPECT_EQ(algo::tpFusedPieces(rs, 8, 7, 1, 2), (P{{0, 1}, {1, 4}, {5, 2}, {7, 1}}));
  EXPECT_EQ(algo::tpFusedPieces(ag, 1, 0, 1, 1), (P{{0, 1}}));
  // At most `most` blocks a GEMM, whatever the copies cost.
  EXPECT_EQ(algo::tpFusedPieces(ag, 8, 2, 0, 1, 2), (P{{2, 1}, {3, 2}, {5, 2}, {7, 1}, {0, 2}}));
  EXPECT_EQ(algo::tpFusedPieces(rs, 8, 2, 0, 1, 2), (P{{3, 1}, {4, 2}, {6, 2}, {0, 2}, {2, 1}}));
  for (algo::TpOp op : {ag, rs}) {
    for (int n = 1; n <= 9; ++n) {
      for (int r = 0; r < n; ++r) {
        for (double ratio : {0.0, 0.1, 0.3, 0.5, 1.0, 3.0}) {
          const int most = ratio == 0.1 ? 2 : 0;
          const P pieces = algo::tpFusedPieces(op, n, r, ratio, 1, most);
          std::vector<int> seen(static_cast<std::size_t>(n));
          for (const algo::TpPiece& p : pieces) {
            ASSERT_GE(p.count, 1);
            if (most > 0) {
              ASSERT_LE(p.count, most);
            }
            ASSERT_LE(p.first + p.count, n);
            for (int j = p.first; j < p.first + p.count; ++j) ++seen[static_cast<std::size_t>(j)];
          }
          EXPECT_EQ(seen, std::vector<int>(static_cast<std::size_t>(n), 1)) << n << " " << r;
          const algo::TpPiece own = op == ag ? pieces.front() : pieces.back();
          EXPECT_EQ(own, (algo::TpPiece{r, 1}));
          if (ratio == 0) {
            EXPECT_LE(pieces.size(), 3u);
          }
        }
      }
    }
  }
}

TEST(TpOverlap, Fp8GemmsArePricedAtTheirRateAndBytes) {
  algo::TunerOptions o;
  o.constants.gemm.tflops = 700;
  o.constants.gemm.fp8Tflops = 1400;
  algo::KernelSet k;
  k.gpu = true;
  k.sameDevice = true;
  const algo::Selector sel(algo::sameDeviceRankGraph(4), o, k);
  for (algo::TpOp op : {algo::TpOp::allGatherGemm, algo::TpOp::gemmReduceScatter}) {
    const algo::TpShape bf16 = shape(op, 16384, 4);
    algo::TpShape fp8 = bf16;
    fp8.valueBytes = 1;
    fp8.outBytes = 2;
    auto b = sel.planTp(bf16), f = sel.planTp(fp8);
    ASSERT_TRUE(b.isOk() && f.isOk());
    const double launch = o.constants.gemm.launchUs;
    EXPECT_LT(f->gemmUs - launch, 0.51 * (b->gemmUs - launch)) << f->reason;
    if (op == algo::TpOp::allGatherGemm) {
      EXPECT_LT(f->commUs, 0.75 * b->commUs);
    } else {
      EXPECT_DOUBLE_EQ(f->commUs, b->commUs);
    }
    const fused::tp::ChunkGemm c =
        fused::tp::chunkGemm(fp8, DataType::f8e4m3, DataType::bf16, 2, 1);
    EXPECT_TRUE(c.shape.bTransposed);
    EXPECT_EQ(c.shape.ldb, c.shape.k);
    EXPECT_EQ(c.shape.out, DataType::bf16);
  }
}

// A GEMM takes at least its bytes over the device's memory rate, shared by the ranks on it: at
// 128 rows B's read, many times its multiplies; at 16384 rows the multiplies. Each chunk reads B
// again. The rate follows the device's peak unless a tuning file gives it.
TEST(TpOverlap, SmallGemmsArePricedAtTheMemorysRate) {
  const algo::GemmConstants gc;
  for (int n : {2, 4}) {
    for (std::size_t m : {128, 16384}) {
      // All-gather + GEMM: A [m, k], B [k, cols / n], C [m, cols / n]; bf16.
      const double rows = static_cast<double>(m), k = 8192, cols = 28672.0 / n;
      const double bytes = (rows * k + k * cols + rows * cols) * 2;
      const double flopsUs = 2 * rows * cols * k / 700e12 * 1e6;
      const double rampUs = gc.halfGflop * 1e9 / 700e12 * 1e6;
      for (bool shared : {true, false}) {
        const double sharing = shared ? n : 1;
        auto p = gpuSelector(n, 700, false, shared).planTp(shape(algo::TpOp::allGatherGemm, m, n));
        ASSERT_TRUE(p.isOk()) << p.status().toString();
        const double memoryUs = bytes * sharing / (gc.memoryGBs * 1e3);
        const double multipliesUs = flopsUs * sharing + rampUs;
        EXPECT_NEAR(p->gemmUs, gc.launchUs + std::max(multipliesUs, memoryUs), 1e-6);
        // Ranks sharing a device: 128 rows is B's read, 16384 the multiplies.
        if (shared) {
          EXPECT_EQ(memoryUs > multipliesUs, m == 128) << n << " " << m;
        }
      }
    }
    // Four chunks read B four times.
    const double b = 8192 * 28672.0 / n * 2;
    auto chunks = gpuSelector(n, 700).planTp(shape(algo::TpOp::allGatherGemm, 128, n), 4);
    ASSERT_TRUE(chunks.isOk());
    EXPECT_GT(chunks->estimateUs, 4 * b * n / (gc.memoryGBs * 1e3)) << chunks->reason;
  }
  // An H100 SXM's peak (2619 MHz, 5120 bits) scales the H200's rate, where no tuning file says.
  const double h100 = 2619e6 * 2 * 5120 / 8 / 1e9;
  const algo::CostConstants c;
  EXPECT_NEAR(algo::gpuConstants(c, true, false, h100).gemm.memoryGBs,
              c.gemm.memoryGBs * h100 / algo::GemmConstants::kH200PeakMemoryGBs, 1e-9);
  EXPECT_NEAR(algo::GemmConstants::kH200PeakMemoryGBs, 4814, 0.5);
  EXPECT_EQ(algo::gpuConstants(c, false, false, 0).gemm.memoryGBs, c.gemm.memoryGBs);
  EXPECT_EQ(algo::gpuConstants(c, true, true, h100).gemm.memoryGBs, c.gemm.memoryGBs);
  auto h100Pick = algo::sharedGpuSelectorFor(2, 132, {}, false, h100)
                      .planTp(shape(algo::TpOp::allGatherGemm, 128, 2));
  auto h200Pick = algo::sharedGpuSelectorFor(2, 132, {}, false)
                      .planTp(shape(algo::TpOp::allGatherGemm, 128, 2));
  ASSERT_TRUE(h100Pick.isOk() && h200Pick.isOk());
  EXPECT_NEAR(h100Pick->gemmUs - gc.launchUs,
              (h200Pick->gemmUs - gc.launchUs) * algo::GemmConstants::kH200PeakMemoryGBs / h100,
              1e-6);
}

TEST(TpOverlap, VariantsParseAndTheTuningFileCarriesTheGemmRate) {
  EXPECT_EQ(*algo::parseTpChunks("unfused"), 1);
  EXPECT_EQ(*algo::parseTpChunks("chunked:4"), 4);
  EXPECT_EQ(*algo::parseTpChunks("fused"), algo::kTpFused);
  EXPECT_EQ(*algo::parseTpChunks("fused:inplace"), algo::kTpFusedInPlace);
  EXPECT_FALSE(algo::parseTpChunks("fused:").isOk());
  for (const char* bad : {"chunked:0", "chunked:65", "chunked:", "chunked:2x", "fuse", ""})
    EXPECT_FALSE(algo::parseTpChunks(bad).isOk()) << bad;
  auto c = algo::CostConstants::fromJson(
      R"({"gemm": {"tflops": 650, "fp8_tflops": 1200, "half_gflop": 4, "launch_us": 6,
                   "overlap_slowdown": 1.3, "copy_slowdown": 1.2, "memory_gbs": 3000}})",
      "test");
  ASSERT_TRUE(c.isOk()) << c.status().toString();
  EXPECT_EQ(c->gemm.tflops, 650);
  auto again = algo::CostConstants::fromJson(c->toJson(), "again");
  ASSERT_TRUE(again.isOk());
  EXPECT_EQ(again->gemm.overlapSlowdown, 1.3);
  EXPECT_EQ(again->gemm.copySlowdown, 1.2);
  EXPECT_EQ(again->gemm.memoryGBs, 3000);
  EXPECT_EQ(again->gemm.halfGflop, 4);
  EXPECT_EQ(again->gemm.fp8Tflops, 1200);
  auto bad = algo::CostConstants::fromJson(R"({"gemm": {"tflop": 1}})", "bad");
  ASSERT_FALSE(bad.isOk());
  EXPECT_NE(bad.status().message().find("gemm.tflop"), std::string::npos);
}

// The chunks cover every row of every rank's block once, in the places the call's buffers hold
// them: the GEMM's row t of batch b reads the A row and writes the C row of one gathered row,
// staged rank by rank (each rank's `rows`, `step` apart from `first`).
TEST(TpOverlap, ChunkGemmsCoverEveryRowOnce) {
  for (algo::TpOp op : {algo::TpOp::allGatherGemm, algo::TpOp::gemmReduceScatter}) {
    const bool ag = op == algo::TpOp::allGatherGemm;
    const std::size_t n = 3;
    for (std::size_t block : {37, 36}) {
      const algo::TpShape s{op, n * block, 12, 24, 2, static_cast<int>(n)};
      for (int chunks : {1, 2, 3, 4, 5}) {
        std::vector<int> seen(s.m, 0);
        std::size_t rows = 0;
        for (int i = 0; i < chunks; ++i) {
          const fused::tp::ChunkGemm c =
              fused::tp::chunkGemm(s, DataType::bf16, DataType::bf16, chunks, i);
          const fused::tp::GemmShape& g = c.shape;
          EXPECT_EQ(c.start, rows);
          rows += c.rows;
          // An all-gather's chunks interleave where they divide the block evenly: one GEMM.
          const bool even = c.rows * static_cast<std::size_t>(chunks) == block;
          EXPECT_EQ(c.step, ag && even ? static_cast<std::size_t>(chunks) : 1u);
          EXPECT_EQ(g.batches, chunks == 1 || (ag && even) ? 1 : static_cast<int>(n));
          EXPECT_EQ(g.n, ag ? s.cols / n : s.cols);
          EXPECT_EQ(g.k, ag ? s.k : s.k / n);
          for (std::size_t b = 0; b < static_cast<std::size_t>(g.batches); ++b) {
            for (std::size_t t = 0; t < g.m; ++t) {
              const std::size_t a = c.aOffset + b * g.strideA + t * g.lda;
              const std::size_t d = c.cOffset + b * g.strideC + t * g.ldc;
              ASSERT_EQ(a % g.k, 0u);
              ASSERT_EQ(d % g.n, 0u);
              // The staged row (all-gather: of A; reduce-scatter: of C) and the caller's.
              const std::size_t staged = (ag ? a / g.k : d / g.n) - c.start * n;
              const std::size_t own = ag ? d / g.n : a / g.k;
              const std::size_t r = staged / c.rows, j = staged % c.rows;
              ASSERT_LT(r, n);
              EXPECT_EQ(own, r * block + c.first + c.step * j) << chunks << " " << i;
              ASSERT_LT(own, s.m);
              ++seen[own];
            }
          }
        }
        EXPECT_EQ(rows, block) << chunks;
        EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), static_cast<std::ptrdiff_t>(s.m))
            << chunks;
      }
    }
  }
}

// Block-scaled fp8 GEMMs take rows 4 at a time: chunks cut a rank's rows in whole grains, and
// no more chunks than grains are planned.
TEST(TpOverlap, BlockScaledChunksTakeWholeGrainsOfRows) {
  algo::TpShape s{algo::TpOp::gemmReduceScatter, 2 * 36, 64, 256, 1, 2, 2, 4};
  EXPECT_EQ(s.mostChunks(), 9u);
  std::vector<std::size_t> rows;
  for (int i = 0; i < 2; ++i) rows.push_back(s.chunkRows(2, i));
  EXPECT_EQ(rows, (std::vector<std::size_t>{20, 16}));
  for (int chunks : {3, 4, 9}) {
    std::size_t sum = 0;
    for (int i = 0; i < chunks; ++i) {
      EXPECT_EQ(s.chunkRows(chunks, i) % 4, 0u);
      sum += s.chunkRows(chunks, i);
    }
    EXPECT_EQ(sum, 36u);
  }
  s.m = 2 * 8;  // two grains a rank: forced to 16 chunks, two
  auto plan = gpuSelector(2, 700).planTp(s, 16);
  ASSERT_TRUE(plan.isOk()) << plan.status().toString();
  EXPECT_EQ(plan->chunks, 2) << plan->reason;
}

TEST(TpOverlap, WorkspaceAndShapesAreChecked) {
  fused::tp::TpCall x;
  int dummy = 0;
  x.a = x.b = x.c = &dummy;
  x.m = 64, x.cols = 64, x.k = 64;
  EXPECT_TRUE(fused::tp::checkTp(x, 2, 1).isOk());
  x.cols = 63;
  EXPECT_FALSE(fused::tp::checkTp(x, 2, 1).isOk());
  x.op = algo::TpOp::gemmReduceScatter;  // its n is not split; its k is
  EXPECT_TRUE(fused::tp::checkTp(x, 2, 1).isOk());
  x.k = 63;
  EXPECT_NE(fused::tp::checkTp(x, 2, 1).message().find("k = 63"), std::string::npos);
  x.k = 64;
  x.type = DataType::f64;
  EXPECT_FALSE(fused::tp::checkTp(x, 2, 1).isOk());
  x.type = DataType::bf16;
  auto need = fused::tp::workspaceBytes(x.shape(2), 1);
  ASSERT_TRUE(need.isOk());
  x.workspace = &dummy;
  x.workspaceBytes = *need - 1;
  EXPECT_NE(fused::tp::checkTp(x, 2, 1).message().find("too small"), std::string::npos);
  x.workspaceBytes = *need;
  EXPECT_TRUE(fused::tp::checkTp(x, 2, 1).isOk());
  x.m = std::size_t{1} << 62;
  EXPECT_FALSE(fused::tp::workspaceBytes(x.shape(2), 1).isOk());
}

// WEFT_TP_GEMM_STREAMS=2: a second cuBLASLt workspace, and (block-scaled fp8) room apart for the
// repacked scales of every chunk the second stream runs; a workspace for one stream is refused.
TEST(TpOverlap, TwoGemmStreamsHaveTheirOwnWorkspace) {
  constexpr std::size_t mib32 = std::size_t{32} << 20;
  alignas(16) static float buf[4] = {};
  for (auto op : {algo::TpOp::allGatherGemm, algo::TpOp::gemmReduceScatter}) {
    for (int n : {1, 2, 3, 8}) {
      const auto N = static_cast<std::size_t>(n);
      for (std::size_t m : {std::size_t{96}, std::size_t{1000}, std::size_t{4096}}) {
        fused::tp::TpCall x;
        x.op = op;
        x.a = x.b = x.c = buf;
        x.scales.a = x.scales.b = buf;
        x.m = m / (4 * N) * 4 * N, x.cols = 256 * N, x.k = 384 * N;
        x.type = DataType::f8e4m3;
        x.blockScales = true;
        const algo::TpShape s = x.shape(n);
        auto one = fused::tp::workspaceLayout(s, 1), two = fused::tp::workspaceLayout(s, 2);
        ASSERT_TRUE(one.isOk() && two.isOk());
        EXPECT_EQ(one->staging, mib32);
        EXPECT_EQ(two->staging, 2 * mib32);
        EXPECT_EQ(one->chunkPackedScales, one->tileScales);  // none with one stream
        const std::size_t depth = op == algo::TpOp::allGatherGemm ? s.k : s.k / N;
        for (int k = 1; k <= 8 && static_cast<std::size_t>(k) <= s.mostChunks(); ++k) {
          for (int i = 0; i < k; ++i) {
            const std::size_t rows = k == 1 ? s.m : s.chunkRows(k, i);
            const std::size_t floats =
                (k == 1 ? 1 : N) * fused::tp::Gemms::blockScaleFloats(rows, depth);
            const bool second = k > 1 && i % 2 == 1;
            const std::size_t room = second ? two->tileScales - two->chunkPackedScales
                                            : two->chunkPackedScales - two->packedScales;
            EXPECT_LE(floats * sizeof(float), room)
                << "n " << n << " m " << s.m << " chunk " << i << " of " << k;
          }
        }
        x.workspace = buf;
        x.workspaceBytes = one->total;
        EXPECT_TRUE(fused::tp::checkTp(x, n, 1).isOk()) << fused::tp::checkTp(x, n, 1).message();
        EXPECT_NE(fused::tp::checkTp(x, n, 2).message().find("too small"), std::string::npos);
        x.workspaceBytes = two->total;
        EXPECT_TRUE(fused::tp::checkTp(x, n, 2).isOk());
      }
    }
  }
}

// Unset, the chunks' GEMMs take two streams for GEMM + reduce-scatter and one for all-gather +
// GEMM; WEFT_TP_GEMM_STREAMS sets both.
TEST(TpOverlap, GemmStreamsByOperationUnlessSet) {
  using algo::TpOp;
  unsetenv("WEFT_TP_GEMM_STREAMS");
  auto byOp = Config::fromEnvironment();
  ASSERT_TRUE(byOp.isOk()) << byOp.status().message();
  EXPECT_EQ(fused::tp::gemmStreams(*byOp, TpOp::allGatherGemm), 1);
  EXPECT_EQ(fused::tp::gemmStreams(*byOp, TpOp::gemmReduceScatter), 2);
  for (int set : {1, 2}) {
    setenv("WEFT_TP_GEMM_STREAMS", std::to_string(set).c_str(), 1);
    auto c = Config::fromEnvironment();
    unsetenv("WEFT_TP_GEMM_STREAMS");
    ASSERT_TRUE(c.isOk()) << c.status().message();
    for (auto op : {TpOp::allGatherGemm, TpOp::gemmReduceScatter})
      EXPECT_EQ(fused::tp::gemmStreams(*c, op), set);
  }
  setenv("WEFT_TP_GEMM_STREAMS", "3", 1);
  EXPECT_FALSE(Config::fromEnvironment().isOk());
  unsetenv("WEFT_TP_GEMM_STREAMS");
}

}  // namespace
}  // namespace weft
