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
  const std::size_t rows = m / static_cast<std::size_t>(std::max(1, nranks));
  const auto parts = static_cast<std::size_t>(chunks), i = static_cast<std::size_t>(c);
  return rows / parts + (i < rows % parts ? 1 : 0);
}

std::string TpPlan::name() const {
  return chunks == 1 ? "unfused" : "chunked:" + std::to_string(chunks);
}

Result<int> parseTpChunks(std::string_view text) {
  if (text == "unfused") return 1;
  constexpr std::string_view prefix = "chunked:";
  int k = 0;
  if (text.substr(0, prefix.size()) == prefix) {
    const std::string_view digits = text.substr(prefix.size());
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), k);
    if (ec == std::errc() && end == digits.data() + digits.size() && k >= 1 && k <= 64) return k;
  }
  return invalidArgument("'" + std::string(text) +
                         "' is not a tensor-parallel variant (unfused, chunked:K with K 1-64)");
}

Result<TpPlan> Selector::planTp(const TpShape& s, int forcedChunks) const {
  const auto n = static_cast<std::size_t>(std::max(1, s.nranks));
  const std::size_t rows = s.m / n;  // one rank's block
  const bool ag = s.op == TpOp::allGatherGemm;
  const Collective coll = ag ? Collective::allGather : Collective::reduceScatter;
  const GemmConstants& gc = options_.constants.gemm;
  // The ranks on one device share its tensor cores.
  const double rate = gc.tflops * 1e12 / (kernels_.sameDevice ? static_cast<double>(n) : 1.0);
  // A GEMM of `r` rows of every rank: all-gather's B has cols/n columns, reduce-scatter's A
  // k/n columns.
  auto gemmUs = [&](std::size_t r) {
    const double flops = 2.0 * static_cast<double>(r * n) * static_cast<double>(s.cols) *
                         static_cast<double>(s.k) / static_cast<double>(n);
    return gc.launchUs + (flops + gc.halfGflop * 1e9) / rate * 1e6;
  };
  // The collective of `r` rows of every rank: the whole message, as plan() counts it.
  auto commPlan = [&](std::size_t r) {
    return plan(coll, r * n * (ag ? s.k : s.cols) * s.valueBytes);
  };
  auto whole = commPlan(rows);
  if (!whole) return whole.status();
  TpPlan best;
  best.gemmUs = gemmUs(rows);
  best.commUs = whole->estimateUs;
  best.sequentialUs = best.gemmUs + best.commUs;
  // Chunks of at least a row of every rank's block.
  std::vector<int> ks;
  if (forcedChunks > 0) {
    ks.push_back(
        static_cast<int>(std::clamp<std::size_t>(forcedChunks, 1, std::max<std::size_t>(rows, 1))));
  } else {
    for (int k : {1, 2, 4, 8, 16})
      if (k == 1 || static_cast<std::size_t>(k) <= rows) ks.push_back(k);
  }
  for (int k : ks) {
    const std::size_t r = s.chunkRows(k, 0);
    auto p = commPlan(r);
    if (!p) return p.status();
    const double a = p->estimateUs, g = gemmUs(r);
    // The first chunk's collective (all-gather) or GEMM (reduce-scatter) runs alone, then each
    // overlaps the other's next chunk, then the last GEMM or collective runs alone.
    const double us = k == 1 ? a + g : a + g + (k - 1) * std::max(a, g) * gc.overlapSlowdown;
    if (k == ks.front() || us < best.estimateUs) {
      best.chunks = k;
      best.estimateUs = us;
      best.comm = *p;
    }
  }
  const std::size_t candidates = ks.size();
  auto us = [](double t) { return std::to_string(static_cast<long>(t + 0.5)) + " us"; };
  best.reason =
      best.name() + " " + us(best.estimateUs) + " (GEMM " + us(best.gemmUs) + ", " +
      std::string(weft::name(coll)) + " " + us(best.commUs) + " " + whole->algorithm +
      "; sequential " + us(best.sequentialUs) + "): " +
      (forcedChunks > 0 ? std::string("forced") : "cheapest of " + std::to_string(candidates));
  return best;
}

}  // namespace weft::algo
