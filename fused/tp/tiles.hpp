// cuBLASLt's tile sizes, and which of a GEMM's tiles leave the least of their last wave idle
// (tp/gemm.cpp times those beside its heuristic's candidates; docs/perf-tp-gemms.md,
// "Wave-fitted tiles").
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
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

// Of `tiles`, at most `count` for `batches` m × n GEMMs on `sms` SMs, least idle first: by
// their waves (each SM a tile at a time), whole, times the tile's area; of equal cost the larger
// tile.
std::vector<TileSize> fittedTiles(std::span<const TileSize> tiles, std::size_t m, std::size_t n,
                                  int batches, int sms, std::size_t count);

// Tuning's finalists (tp/gemm.cpp): of a brief look's mean times a candidate (infinite: it
// failed), the heuristic's first (0) and the `count` fastest others that ran, fastest first.
std::vector<std::size_t> tuningFinalists(std::span<const float> look, std::size_t count);

// The runs that take about `windowUs` of a GEMM the look timed at `lookUs` (1 to `most`).
int sustainedRuns(float lookUs, float windowUs, int most);

}  // namespace weft::fused::tp
