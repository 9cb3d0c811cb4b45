// The wave-fitted tiles the tensor-parallel GEMMs' tuning times beside cuBLASLt's heuristic
// (fused/tp/tiles.hpp): the least idle last wave first, ties to the larger tile, small tiles
// left out; which of them an untuned GEMM runs instead of the heuristic's, and with which
// clusters; the tile sizes read from the toolkit's cublasLt.h (CUDA builds); and which
// candidates tuning times sustained, how many runs each.
#include <gtest/gtest.h>

#include <limits>
#include <vector>

#include "fused/tp/tiles.hpp"

namespace weft::fused::tp {
namespace {

std::vector<std::uint32_t> ids(const std::vector<TileSize>& tiles) {
  std::vector<std::uint32_t> out;
  for (const TileSize& t : tiles) out.push_back(t.id);
  return out;
}

// Some of cuBLASLt's Hopper tiles (its ids), rows along n.
const std::vector<TileSize> kSome = {
    {24, 256, 128}, {407, 128, 152}, {459, 192, 104}, {29, 128, 160}, {137, 80, 256},
    {20, 128, 128}, {248, 320, 128}, {201, 176, 128}, {1, 64, 64},    {60, 96, 96}};

TEST(TpTiles, TheLeastIdleLastWaveFirst) {
  // m 1024, n 7168 on 132 SMs: 128 × 152 tiles are 392, 2.97 waves (3 × 19456 of area), before
  // 192 × 104 (380, 3 × 19968), then 128 × 160 (3 × 20480; 80 × 256 too, but too thin), then the
  // heuristic's 256 × 128 (2 × 32768) before 128 × 128 (4 × 16384), the larger of equal cost.
  EXPECT_EQ(ids(fittedTiles(kSome, 1024, 7168, 1, 132, 4)),
            (std::vector<std::uint32_t>{407, 459, 29, 24}));
  // m 2048: 320 × 128 tiles are 2.79 waves (3 × 40960); 176 × 128 ones 4.97 (5 × 22528).
  const std::vector<TileSize> two = fittedTiles(kSome, 2048, 7168, 1, 132, 10);
  const auto at = [&](std::uint32_t id) {
    for (std::size_t i = 0; i < two.size(); ++i)
      if (two[i].id == id) return i;
    return two.size();
  };
  EXPECT_EQ(two.front().id, 201u);
  EXPECT_LT(at(201), at(248));
}

TEST(TpTiles, BatchesCountAsRows) {
  // Four batches of 256 rows fill the SMs as 1024 rows do where the tiles' columns divide 256.
  const std::vector<TileSize> dividing = {
      {20, 128, 128}, {24, 256, 128}, {201, 176, 128}, {137, 80, 256}, {248, 320, 128}};
  EXPECT_EQ(ids(fittedTiles(dividing, 256, 7168, 4, 132, 5)),
            ids(fittedTiles(dividing, 1024, 7168, 1, 132, 5)));
  // Not where they do not: 4 batches of 200 rows pad each batch to whole tiles (128 × 128 ones:
  // 448, 4 waves; for 800 rows 392, 3 waves, the first of all).
  EXPECT_NE(ids(fittedTiles(kSome, 200, 7168, 4, 132, 10)),
            ids(fittedTiles(kSome, 800, 7168, 1, 132, 10)));
  EXPECT_EQ(fittedTiles(kSome, 800, 7168, 1, 132, 1).front().id, 20u);
}

TEST(TpTiles, EqualCostsGoToTheLargerTile) {
  const std::vector<TileSize> tied = {{1, 128, 128}, {2, 256, 128}};
  // m 1024, n 7168 on 132 SMs: both cost 65536 (4 waves of 128 × 128, 2 of 256 × 128).
  EXPECT_EQ(ids(fittedTiles(tied, 1024, 7168, 1, 132, 2)), (std::vector<std::uint32_t>{2, 1}));
}

TEST(TpTiles, SmallTilesAndNoSmsLeaveNone) {
  for (const TileSize& t : fittedTiles(kSome, 1024, 7168, 1, 132, 100)) {
    EXPECT_GE(t.rows, kMinTileSide);
    EXPECT_GE(t.cols, kMinTileSide);
    EXPECT_GE(t.rows * t.cols, kMinTileArea) << t.id;
  }
  EXPECT_EQ(fittedTiles(kSome, 1024, 7168, 1, 132, 100).size(), kSome.size() - 3);  // 80 × 256 too
  EXPECT_TRUE(fittedTiles(kSome, 1024, 7168, 1, 0, 4).empty());
  EXPECT_TRUE(fittedTiles(kSome, 1024, 7168, 0, 132, 4).empty());
  EXPECT_EQ(fittedTiles(kSome, 1024, 7168, 1, 132, 2).size(), 2u);
}

TEST(TpTiles, WaveCostIsWholeWavesTimesArea) {
  // 2048 × 7168 of 320 × 128 tiles: 23 × 16 = 368 tiles, 3 waves of 132; 176 × 128: 41 × 16 =
  // 656, 5 waves.
  EXPECT_EQ(waveCost({248, 320, 128}, 2048, 7168, 1, 132), 3u * 320 * 128);
  EXPECT_EQ(waveCost({201, 176, 128}, 2048, 7168, 1, 132), 5u * 176 * 128);
  EXPECT_EQ(waveCost({201, 176, 128}, 512, 7168, 4, 132), 5u * 176 * 128);
  EXPECT_EQ(waveCost({201, 176, 128}, 2048, 7168, 1, 0), 0u);
  EXPECT_EQ(waveCost({201, 176, 128}, 2048, 7168, 0, 132), 0u);
  EXPECT_EQ(waveCost({}, 2048, 7168, 1, 132), 0u);
}

TEST(TpTiles, UntunedATileFitsWhereItBeatsTheOwnByTheGain) {
  const std::vector<TileSize> ranked = fittedTiles(kSome, 2048, 7168, 1, 132, 4);
  // The heuristic's 320 × 128 takes 122880 slots, 1.09 × 176 × 128's 112640: that one first,
  // then those under 122880 / kFitGain (117029): 128 × 128's 114688 (7 waves).
  const std::vector<TileSize> better = fitsBetter(ranked, {248, 320, 128}, 2048, 7168, 1, 132);
  ASSERT_FALSE(better.empty());
  EXPECT_EQ(better.front().id, 201u);
  for (const TileSize& t : better)
    EXPECT_GE(static_cast<double>(waveCost({248, 320, 128}, 2048, 7168, 1, 132)),
              kFitGain * static_cast<double>(waveCost(t, 2048, 7168, 1, 132)))
        << t.id;
  // At 4096 rows the heuristic's 256 × 128 takes 1.02 × the best's: it stays.
  EXPECT_TRUE(
      fitsBetter(fittedTiles(kSome, 4096, 7168, 1, 132, 4), {24, 256, 128}, 4096, 7168, 1, 132)
          .empty());
  // Its own tile never fits better than itself, and without SMs none does.
  EXPECT_TRUE(fitsBetter(std::vector<TileSize>{{24, 256, 128}}, {24, 256, 128}, 1024, 7168, 1, 132)
                  .empty());
  EXPECT_TRUE(fitsBetter(ranked, {248, 320, 128}, 2048, 7168, 1, 0).empty());
  // 128 rows of 256 × 128 tiles are 28, less than one wave: the heuristic's tile stays, though
  // 128 × 128 ones take half its slots. Four batches of 256 rows of 320 × 128 tiles are 216, 2
  // waves: 256 × 128 ones (264, 2 waves) take 0.8 × its slots.
  EXPECT_TRUE(
      fitsBetter(fittedTiles(kSome, 128, 7168, 1, 132, 4), {24, 256, 128}, 128, 7168, 1, 132)
          .empty());
  EXPECT_FALSE(
      fitsBetter(fittedTiles(kSome, 256, 8448, 4, 132, 4), {248, 320, 128}, 256, 8448, 4, 132)
          .empty());
}

TEST(TpTiles, ClustersPairTilesAlongTheirShorterSide) {
  const TileSize wide{201, 176, 128}, tall{422, 128, 296}, square{20, 128, 128};
  EXPECT_TRUE(pairsShorterSide(wide, 1, 2));
  EXPECT_FALSE(pairsShorterSide(wide, 2, 1));
  EXPECT_TRUE(pairsShorterSide(tall, 2, 1));
  EXPECT_FALSE(pairsShorterSide(tall, 1, 2));
  EXPECT_TRUE(pairsShorterSide(square, 2, 1));
  EXPECT_TRUE(pairsShorterSide(square, 1, 2));
  for (const TileSize& t : {wide, tall, square}) {  // the clusters the second pass gives it
    const auto [x, y] = alongShorterSide(t, 2);
    EXPECT_TRUE(pairsShorterSide(t, x, y)) << t.id;
  }
  EXPECT_EQ(alongShorterSide(wide, 4), (std::pair{1, 4}));
  EXPECT_EQ(alongShorterSide(tall, 4), (std::pair{4, 1}));
  EXPECT_EQ(alongShorterSide(square, 2), (std::pair{2, 1}));
  for (const TileSize& t : {wide, tall, square}) {  // 1 × 1, others, none: never
    EXPECT_FALSE(pairsShorterSide(t, 1, 1)) << t.id;
    EXPECT_FALSE(pairsShorterSide(t, 2, 2)) << t.id;
    EXPECT_FALSE(pairsShorterSide(t, 0, 3)) << t.id;
  }
}

TEST(TpTiles, LargestFirstKeepsTheOrderOfEqualAreas) {
  const std::vector<TileSize> ranked = {
      {201, 176, 128}, {242, 296, 128}, {167, 112, 256}, {221, 224, 128}};
  EXPECT_EQ(ids(largestFirst(ranked)), (std::vector<std::uint32_t>{242, 167, 221, 201}));
  EXPECT_TRUE(largestFirst({}).empty());
}

TEST(TpTuning, FinalistsAreTheFirstAndTheFastestOthersThatRan) {
  constexpr float kFailed = std::numeric_limits<float>::infinity();
  const std::vector<float> look = {5, 3, kFailed, 1, 4, 2};
  EXPECT_EQ(tuningFinalists(look, 3), (std::vector<std::size_t>{0, 3, 5, 1}));
  EXPECT_EQ(tuningFinalists(look, 10), (std::vector<std::size_t>{0, 3, 5, 1, 4}));
  EXPECT_EQ(tuningFinalists(look, 0), (std::vector<std::size_t>{0}));
  // The heuristic's first stays, failed or not (its time is the bar); ties keep their order.
  EXPECT_EQ(tuningFinalists(std::vector<float>{kFailed, 2, 1}, 4),
            (std::vector<std::size_t>{0, 2, 1}));
  EXPECT_EQ(tuningFinalists(std::vector<float>{5, 2, 2}, 4), (std::vector<std::size_t>{0, 1, 2}));
  EXPECT_TRUE(tuningFinalists({}, 4).empty());
}

TEST(TpTuning, SustainedRunsFillTheWindow) {
  EXPECT_EQ(sustainedRuns(700, 15000, 200), 21);
  EXPECT_EQ(sustainedRuns(10, 15000, 200), 200);   // at most `most`
  EXPECT_EQ(sustainedRuns(20000, 15000, 200), 1);  // at least one
  EXPECT_EQ(sustainedRuns(std::numeric_limits<float>::infinity(), 15000, 200), 1);
  EXPECT_EQ(sustainedRuns(0, 15000, 200), 1);
  EXPECT_EQ(sustainedRuns(1e-30f, 15000, 200), 200);
  EXPECT_EQ(sustainedRuns(700, 15000, 0), 1);
}

TEST(TpTiles, SizesReadFromTheToolkit) {
  if (cublasLtTiles().empty()) GTEST_SKIP() << "built without CUDA";
  EXPECT_GT(cublasLtTiles().size(), 600u);  // CUDA 13's cublasLt.h names 634
  for (const TileSize& want : {TileSize{20, 128, 128}, TileSize{24, 256, 128},
                               TileSize{407, 128, 152}, TileSize{1, 8, 8}}) {
    const TileSize* got = tileSize(want.id);
    ASSERT_NE(got, nullptr) << want.id;
    EXPECT_EQ(*got, want);
  }
  EXPECT_EQ(tileSize(0), nullptr);  // CUBLASLT_MATMUL_TILE_UNDEFINED
}

}  // namespace
}  // namespace weft::fused::tp
