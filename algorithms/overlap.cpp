#include "algorithms/overlap.hpp"

#include <algorithm>
#include <charconv>
#include <vector>

#include "algorithms/selector.hpp"

namespace weft::algo {

std::string_view name(TpOp op) {
  return op == TpOp::allGatherGemm ? "all-gather + GEMM" : "GEMM + reduce-scatter";
}

std::size_t TpShape::chunkRows(int chunks, int c) const {
  const std::size_t grains = mostChunks();
  const auto parts = static_cast<std::size_t>(chunks), i = static_cast<std::size_t>(c);
  return (grains / parts + (i < grains % parts ? 1 : 0)) * std::max<std::size_t>(rowGrain, 1);
}

std::size_t TpShape::mostChunks() const {
  return m / static_cast<std::size_t>(std::max(1, nranks)) / std::max<std::size_t>(rowGrain, 1);
}

std::string TpPlan::name() const {
  if (chunks == kTpFused) return "fused";
  return chunks == 1 ? "unfused" : "chunked:" + std::to_string(chunks);
}

Result<int> parseTpChunks(std::string_view text) {
  if (text == "unfused") return 1;
  if (text == "fused") return kTpFused;
  constexpr std::string_view prefix = "chunked:";
  int k = 0;
  if (text.substr(0, prefix.size()) == prefix) {
    const std::string_view digits = text.substr(prefix.size());
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), k);
    if (ec == std::errc() && end == digits.data() + digits.size() && k >= 1 && k <= 64) return k;
  }
  return invalidArgument(
      "'" + std::string(text) +
      "' is not a tensor-parallel variant (unfused, chunked:K with K 1-64, fused)");
}

Result<TpPlan> Selector::planTp(const TpShape& s, int forcedChunks) const {
  const auto n = static_cast<std::size_t>(std::max(1, s.nranks));
  const std::size_t rows = s.m / n;  // one rank's block
  const bool ag = s.op == TpOp::allGatherGemm;
  const Collective coll = ag ? Collective::allGather : Collective::reduceScatter;
  const GemmConstants& gc = options_.constants.gemm;
  // The ranks on one device share its tensor cores.
  const double rate = (s.valueBytes == 1 ? gc.fp8Tflops : gc.tflops) * 1e12 /
                      (kernels_.sameDevice ? static_cast<double>(n) : 1.0);
  // A GEMM of `r` rows in all: all-gather's B has cols/n columns, reduce-scatter's A k/n.
  auto gemmRowsUs = [&](std::size_t r) {
    const double flops = 2.0 * static_cast<double>(r) * static_cast<double>(s.cols) *
                         static_cast<double>(s.k) / static_cast<double>(n);
    return gc.launchUs + (flops + gc.halfGflop * 1e9) / rate * 1e6;
  };
  // The collective of `r` rows of every rank: the whole message, as plan() counts it.
  auto commPlan = [&](std::size_t r) {
    return plan(coll, r * n * (ag ? s.k : s.cols) * s.commBytes());
  };
  auto whole = commPlan(rows);
  if (!whole) return whole.status();
  TpPlan best;
  best.gemmUs = gemmRowsUs(rows * n);
  best.commUs = whole->estimateUs;
  best.sequentialUs = best.gemmUs + best.commUs;
  // The fused variants run where the ranks map each other's memory.
  const bool fusable = kernels_.peerMemory && n > 1 && s.nranks <= kTpFusedMaxRanks;
  std::string note;
  std::vector<int> ks;  // chunks of at least a row of every rank's block, or kTpFused
  if (forcedChunks == kTpFused && !fusable) {
    note = " (fused needs 2-" + std::to_string(kTpFusedMaxRanks) +
           " ranks on one host that map each other's memory)";
    ks.push_back(1);
  } else if (forcedChunks == kTpFused || forcedChunks > 0) {
    ks.push_back(forcedChunks == kTpFused
                     ? kTpFused
                     : static_cast<int>(std::clamp<std::size_t>(
                           forcedChunks, 1, std::max<std::size_t>(s.mostChunks(), 1))));
  } else {
    for (int k : {1, 2, 4, 8, 16})
      if (k == 1 || static_cast<std::size_t>(k) <= s.mostChunks()) ks.push_back(k);
    if (fusable) ks.push_back(kTpFused);
  }
  for (int k : ks) {
    double us = 0;
    Result<Plan> p = *whole;
    if (k == kTpFused) {
      // One block's copy by the copy engine: an all-gather's (n - 1) of them (of A's blocks,
      // or of the partial C's).
      auto moved = ag ? whole : plan(Collective::allGather, rows * n * s.cols * s.cBytes());
      if (!moved) return moved.status();
      const double copy = moved->estimateUs / static_cast<double>(n - 1);
      const double block = gemmRowsUs(rows);
      if (ag) {
        // This rank's block goes into its shared buffer, then its GEMM; block j's GEMM waits
        // for its copy (j copies of a block in a row): no SM spent on moving.
        us = copy + block;
        for (std::size_t j = 1; j < n; ++j)
          us = std::max(us, copy * static_cast<double>(j + 1)) + block;
      } else {
        // Each peer's block, GEMM then copy to its owner beside the next GEMM; this rank's
        // block last; then the sum reads the n blocks and writes one (its device's memory
        // shared by the ranks on it).
        double gemms = 0, copies = 0;
        for (std::size_t j = 1; j < n; ++j) {
          gemms += block;
          copies = std::max(copies, gemms) + copy;
        }
        const double bytes = static_cast<double>((n + 1) * rows * s.cols * s.cBytes());
        const double share = kernels_.sameDevice ? static_cast<double>(n) : 1.0;
        us = std::max(gemms + block, copies) + gc.launchUs +
             bytes * share / (options_.constants.graphs.deviceCopyGBs * 1e3);
      }
    } else {
      const std::size_t r = s.chunkRows(k, 0);
      p = commPlan(r);
      if (!p) return p.status();
      const double a = p->estimateUs, g = gemmRowsUs(r * n);
      // The first chunk's collective (all-gather) or GEMM (reduce-scatter) runs alone, then
      // each overlaps the other's next chunk, then the last GEMM or collective runs alone.
      us = k == 1 ? a + g : a + g + (k - 1) * std::max(a, g) * gc.overlapSlowdown;
    }
    if (k == ks.front() || us < best.estimateUs) {
      best.chunks = k;
      best.estimateUs = us;
      best.comm = *p;
    }
  }
  auto us = [](double t) { return std::to_string(static_cast<long>(t + 0.5)) + " us"; };
  best.reason = best.name() + " " + us(best.estimateUs) + " (GEMM " + us(best.gemmUs) + ", " +
                std::string(weft::name(coll)) + " " + us(best.commUs) + " " + whole->algorithm +
                "; sequential " + us(best.sequentialUs) + "): " +
                (forcedChunks != 0 ? std::string("forced") + note
                                   : "cheapest of " + std::to_string(ks.size()));
  return best;
}

}  // namespace weft::algo
