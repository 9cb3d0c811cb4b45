// cuBLASLt's tile sizes, and which of a GEMM's tiles leave the least of their last wave idle
// (tp/gemm.cpp times those beside its heuristic's candidates; docs/perf-tp-gemms.md,
// "Wave-fitted tiles").
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace weft::fused::tp {

// One of cuBLASLt's tiles (cublasLtMatmulTile_t): its rows run along the row-major GEMM's n (its
// column-major Cᵀ's rows), its columns along m.
struct TileSize {
  std::uint32_t id = 0, rows = 0, cols = 0;
  bool operator==(const TileSize&) const = default;
};

// Every tile the CUDA toolkit's cublasLt.h names, read from it at build time; none in builds
// without CUDA.
std::span<const TileSize> cublasLtTiles();

// The tile with cuBLASLt's id `id`, or null where cublasLtTiles() has none.
const TileSize* tileSize(std::uint32_t id);

// The smallest tiles worth timing: smaller or thinner ones load A and B more a value, and took
// 1.1-2.1 x the heuristic's first where timed (docs/perf-tp-gemms.md, "Sustained tuning").
inline constexpr std::uint32_t kMinTileSide = 96, kMinTileArea = 128 * 128;

// What `batches` m × n GEMMs of tile `t` on `sms` SMs take of them: their waves (each SM a tile
// at a time), whole, times the tile's area (0 without SMs or batches).
std::size_t waveCost(const TileSize& t, std::size_t m, std::size_t n, int batches, int sms);

// Of `tiles`, at most `count` for `batches` m × n GEMMs on `sms` SMs, least idle first (by
// waveCost); of equal cost the larger tile.
std::vector<TileSize> fittedTiles(std::span<const TileSize> tiles, std::size_t m, std::size_t n,
                                  int batches, int sms, std::size_t count);

// Untuned, a GEMM runs a wave-fitted tile instead of the heuristic's own where the own takes
// kFitGain × its waveCost or more: 2048 × 7168 rows of 320 × 128 tiles on 132 SMs take 1.09 ×
// 176 × 128 ones' (docs/perf-tp-gemms.md, "Wave-fitted tiles, untuned").
inline constexpr double kFitGain = 1.05;

// Of `ranked` (fittedTiles' order), those that fit `batches` m × n GEMMs on `sms` SMs better than
// `own` by kFitGain, in that order; none where `own`'s tiles fill the SMs less than once (one
// partial wave whatever the tile: no such shape was measured).
std::vector<TileSize> fitsBetter(std::span<const TileSize> ranked, const TileSize& own,
                                 std::size_t m, std::size_t n, int batches, int sms);

// Whether a cluster of x × y tiles (x along the tiles' rows, y along their columns) pairs them
// along their shorter side: the fitted tiles untuned run only with such a cluster. Timed in
// tuning, 176 × 128 and 296 × 128 tiles took 0.89-0.97 × the heuristic's first with 1 × 2, and
// 1.02-1.44 × with 1 × 1 or 2 × 1; 128 × 296 ones 0.90 with 2 × 1, 1.20-1.21 with 1 × 2
// (docs/perf-tp-gemms.md, "Wave-fitted tiles, untuned").
bool pairsShorterSide(const TileSize& t, int x, int y);

// `tiles`, the larger first (of equal area, in their order): the untuned GEMM's tile where it
// leaves the heuristic's cluster and kernel option. Of the tiles that fit 1024 × 14336 better
// than its heuristic's, paired along their shorter side, 176 × 128 ones took 1.01-1.03 × the
// heuristic's time sustained, 296 × 128 ones 0.99-1.00 and 112 × 256 ones 0.98-0.99
// (docs/perf-tp-gemms.md, "Every configuration, sustained").
std::vector<TileSize> largestFirst(std::vector<TileSize> tiles);

// A cluster of `size` tiles along `t`'s shorter side, as {x, y}: {size, 1} where its rows are no
// longer than its columns, else {1, size}.
std::pair<int, int> alongShorterSide(const TileSize& t, int size);

// Tuning's finalists (tp/gemm.cpp): of a brief look's mean times a candidate (infinite: it
// failed), the heuristic's first (0) and the `count` fastest others that ran, fastest first.
std::vector<std::size_t> tuningFinalists(std::span<const float> look, std::size_t count);

// The runs that take about `windowUs` of a GEMM the look timed at `lookUs` (1 to `most`).
int sustainedRuns(float lookUs, float windowUs, int most);

}  // namespace weft::fused::tp
