#include "fused/tp/tiles.hpp"

#include <algorithm>
#include <array>
#include <cmath>

namespace weft::fused::tp {
namespace {

#ifdef WEFT_CUBLASLT_TILES
constexpr TileSize kTiles[] = {
#include "cublaslt_tiles.inc"
};
#else
constexpr std::array<TileSize, 0> kTiles{};
#endif

}  // namespace

std::span<const TileSize> cublasLtTiles() {
  return kTiles;
}

const TileSize* tileSize(std::uint32_t id) {
  for (const TileSize& t : kTiles)
    if (t.id == id) return &t;
  return nullptr;
}

namespace {

// The tiles of `batches` m × n GEMMs (t's sides nonzero).
std::size_t tileCount(const TileSize& t, std::size_t m, std::size_t n, int batches) {
  return (n + t.rows - 1) / t.rows * ((m + t.cols - 1) / t.cols) *
         static_cast<std::size_t>(batches);
}

}  // namespace

std::size_t waveCost(const TileSize& t, std::size_t m, std::size_t n, int batches, int sms) {
  if (sms <= 0 || batches <= 0 || t.rows == 0 || t.cols == 0) return 0;
  const auto slots = static_cast<std::size_t>(sms);
  return (tileCount(t, m, n, batches) + slots - 1) / slots * t.rows * t.cols;
}

std::vector<TileSize> fittedTiles(std::span<const TileSize> tiles, std::size_t m, std::size_t n,
                                  int batches, int sms, std::size_t count) {
  if (sms <= 0 || batches <= 0) return {};
  auto cost = [&](const TileSize& t) { return waveCost(t, m, n, batches, sms); };
  std::vector<TileSize> ranked;
  for (const TileSize& t : tiles)
    if (t.rows >= kMinTileSide && t.cols >= kMinTileSide && t.rows * t.cols >= kMinTileArea)
      ranked.push_back(t);
  std::stable_sort(ranked.begin(), ranked.end(), [&](const TileSize& x, const TileSize& y) {
    const std::size_t cx = cost(x), cy = cost(y);
    return cx != cy ? cx < cy : x.rows * x.cols > y.rows * y.cols;
  });
  if (ranked.size() > count) ranked.resize(count);
  return ranked;
}

std::vector<TileSize> fitsBetter(std::span<const TileSize> ranked, const TileSize& own,
                                 std::size_t m, std::size_t n, int batches, int sms) {
  const auto owns = static_cast<double>(waveCost(own, m, n, batches, sms));
  std::vector<TileSize> out;
  if (owns == 0 || tileCount(own, m, n, batches) < static_cast<std::size_t>(sms)) return out;
  for (const TileSize& t : ranked) {
    const auto cost = static_cast<double>(waveCost(t, m, n, batches, sms));
    if (cost > 0 && owns >= kFitGain * cost) out.push_back(t);
  }
  return out;
}

bool pairsShorterSide(const TileSize& t, int x, int y) {
  return (x == 2 && y == 1 && t.rows <= t.cols) || (x == 1 && y == 2 && t.cols <= t.rows);
}

std::vector<TileSize> largestFirst(std::vector<TileSize> tiles) {
  std::stable_sort(tiles.begin(), tiles.end(), [](const TileSize& x, const TileSize& y) {
    return x.rows * x.cols > y.rows * y.cols;
  });
  return tiles;
}

std::pair<int, int> alongShorterSide(const TileSize& t, int size) {
  return t.rows <= t.cols ? std::pair{size, 1} : std::pair{1, size};
}

std::vector<std::size_t> tuningFinalists(std::span<const float> look, std::size_t count) {
  if (look.empty()) return {};
  std::vector<std::size_t> others;
  for (std::size_t i = 1; i < look.size(); ++i)
    if (std::isfinite(look[i])) others.push_back(i);
  std::stable_sort(others.begin(), others.end(),
                   [&](std::size_t x, std::size_t y) { return look[x] < look[y]; });
  if (others.size() > count) others.resize(count);
  others.insert(others.begin(), 0);
  return others;
}

int sustainedRuns(float lookUs, float windowUs, int most) {
  if (!std::isfinite(lookUs) || lookUs <= 0) return 1;
  return std::clamp(static_cast<int>(std::min(windowUs / lookUs + 0.5f, 1e9f)), 1,
                    std::max(1, most));
}

}  // namespace weft::fused::tp
