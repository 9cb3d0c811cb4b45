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
  if (chunks == kTpFusedInPlace) return "fused:inplace";
  return chunks == 1 ? "unfused" : "chunked:" + std::to_string(chunks);
}

Result<int> parseTpChunks(std::string_view text) {
  if (text == "unfused") return 1;
  if (text == "fused") return kTpFused;
  if (text == "fused:inplace") return kTpFusedInPlace;
  constexpr std::string_view prefix = "chunked:";
  int k = 0;
  if (text.substr(0, prefix.size()) == prefix) {
    const std::string_view digits = text.substr(prefix.size());
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), k);
    if (ec == std::errc() && end == digits.data() + digits.size() && k >= 1 && k <= 64) return k;
  }
  return invalidArgument(
      "'" + std::string(text) +
      "' is not a tensor-parallel variant (unfused, chunked:K with K 1-64, fused, "
      "fused:inplace)");
}

std::vector<TpPiece> tpFusedPieces(TpOp op, int nranks, int rank, double copyUs, double blockUs,
                                   int most) {
  // The peers' blocks in the order their copies go: the run after `rank`, then the run before.
  const int n = std::max(1, nranks), after = n - 1 - rank;
  auto block = [&](int i) { return i < after ? rank + 1 + i : i - after; };
  const int cap = most > 0 ? most : n;
  auto runEnd = [&](int i) { return std::min(i < after ? after : n - 1, i + cap); };
  // How many copies `budget` µs holds (at least one).
  auto fit = [&](double budget) {
    return copyUs <= 0 ? n : std::max(1, static_cast<int>(budget / copyUs + 1e-9));
  };
  std::vector<TpPiece> pieces;
  if (op == TpOp::allGatherGemm) {
    // Copy i is done at (i + 2) copies (this rank's own block into its buffer goes first, beside
    // the own GEMM).
    pieces.push_back({rank, 1});
    double t = blockUs;
    for (int i = 0; i < n - 1;) {
      int j = i + 1;
      while (j < runEnd(i) && (j + 2) * copyUs <= t) ++j;
      t = std::max(t, (j + 1) * copyUs) + (j - i) * blockUs;
      pieces.push_back({block(i), j - i});
      i = j;
    }
    return pieces;
  }
  // Backwards from the own block's GEMM: each GEMM hides the copies of the one before it.
  pieces.push_back({rank, 1});
  double budget = blockUs;
  for (int i = n - 1; i > 0;) {
    const int start = i > after ? after : 0;  // the run holding copy i - 1
    const int count = std::min({i - start, fit(budget), cap});
    pieces.push_back({block(i - count), count});
    budget = count * blockUs;
    i -= count;
  }
  std::reverse(pieces.begin(), pieces.end());
  return pieces;
}

std::vector<TpPiece> tpInPlacePieces(int nranks) {
  return {{0, std::max(1, nranks)}};
}

Result<TpPlan> Selector::planTp(const TpShape& s, int forcedChunks) const {
  const auto n = static_cast<std::size_t>(std::max(1, s.nranks));
  const std::size_t rows = s.m / n;  // one rank's block
  const bool ag = s.op == TpOp::allGatherGemm;
  const Collective coll = ag ? Collective::allGather : Collective::reduceScatter;
  const GemmConstants& gc = options_.constants.gemm;
  // The ranks on one device share its tensor cores; a GEMM's ramp and tail (half_gflop) cost it
  // what they cost alone: the other ranks' GEMMs fill the SMs it leaves.
  const double device = (s.valueBytes == 1 ? gc.fp8Tflops : gc.tflops) * 1e12;
  const double sharing = kernels_.sameDevice ? static_cast<double>(n) : 1.0;
  const double rate = device / sharing;
  // A GEMM of `r` rows in all: all-gather's B has cols/n columns, reduce-scatter's A k/n. It
  // takes the longer of its multiplies and its bytes (A and B read, C written) at the memory's
  // rate, which the ranks on the device share too: a small M reads B for few flops.
  const double inner = static_cast<double>(s.k) / (ag ? 1.0 : static_cast<double>(n));
  const double outer = static_cast<double>(s.cols) / (ag ? static_cast<double>(n) : 1.0);
  const double memory = gc.memoryGBs * 1e3 / sharing;  // bytes a µs
  auto gemmRowsUs = [&](std::size_t r) {
    const double rs = static_cast<double>(r);
    const double flops = 2.0 * rs * outer * inner;
    const double bytes = (rs * inner + inner * outer) * static_cast<double>(s.valueBytes) +
                         rs * outer * static_cast<double>(s.cBytes());
    return gc.launchUs +
           std::max((flops / rate + gc.halfGflop * 1e9 / device) * 1e6, bytes / memory);
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
  // In place where the ranks share the device: their buffers are its memory, read at its rate.
  const bool inPlace = fusable && kernels_.sameDevice;
  std::string note;
  std::vector<int> ks;  // chunks of at least a row of every rank's block, or a fused form
  if (tpFused(forcedChunks) && !fusable) {
    note = " (fused needs 2-" + std::to_string(kTpFusedMaxRanks) +
           " ranks on one host that map each other's memory)";
    ks.push_back(1);
  } else if (tpFused(forcedChunks) || forcedChunks > 0) {
    ks.push_back(tpFused(forcedChunks)
                     ? forcedChunks
                     : static_cast<int>(std::clamp<std::size_t>(
                           forcedChunks, 1, std::max<std::size_t>(s.mostChunks(), 1))));
  } else {
    for (int k : {1, 2, 4, 8, 16})
      if (k == 1 || static_cast<std::size_t>(k) <= s.mostChunks()) ks.push_back(k);
    if (fusable) ks.push_back(kTpFused);
    if (inPlace) ks.push_back(kTpFusedInPlace);
  }
  double fusedCopy = 0, fusedBlock = 0;
  for (int k : ks) {
    double us = 0;
    Result<Plan> p = *whole;
    if (tpFused(k)) {
      // One block's copy by the copy engine: an all-gather's (n - 1) of them (of A's blocks,
      // or of the partial C's). Each rank's GEMMs as tpFusedPieces groups them; the slowest
      // rank's time.
      auto moved = ag ? whole : plan(Collective::allGather, rows * n * s.cols * s.cBytes());
      if (!moved) return moved.status();
      // A block's share of the all-gather. In place that is the whole wait: every rank's own
      // block into its buffer and every peer's flag, as the direct all-gather does it. The copy
      // engine's copies of the other form, where the ranks share a device: every rank's reads
      // and writes a block at once through its memory (not the all-gather's FIFO slots).
      const double share = moved->estimateUs / static_cast<double>(n - 1);
      const double blockBytes = static_cast<double>(rows * (ag ? s.k : s.cols) * s.commBytes());
      const double copy =
          k == kTpFusedInPlace || !kernels_.sameDevice
              ? share
              : options_.constants.graphs.deviceHopLatencyUs +
                    2 * blockBytes * sharing / (options_.constants.graphs.deviceCopyGBs * 1e3);
      const double block = gemmRowsUs(rows);
      auto gemm = [&](int blocks) { return gemmRowsUs(rows * static_cast<std::size_t>(blocks)); };
      // GEMM + reduce-scatter's sum reads the n blocks and writes one (its device's memory
      // shared by the ranks on it).
      const double bytes = static_cast<double>((n + 1) * rows * s.cols * s.cBytes());
      const double sum =
          gc.launchUs + bytes * sharing / (options_.constants.graphs.deviceCopyGBs * 1e3);
      // The copies take the memory the GEMMs beside them read: each slows them by its time
      // times copy_slowdown - 1 (n for an all-gather, its own block's included; in place none:
      // the all-gather's own copy goes before its GEMM).
      const double copies = k == kTpFusedInPlace ? 0.0
                            : ag                 ? static_cast<double>(n)
                                                 : static_cast<double>(n - 1);
      const double slowed = copies * copy * (gc.copySlowdown - 1);
      // Each rank waits for every peer's "ready" flag at once: where the ranks share a device,
      // an all-peers wait as two-shot's (RankGraph::deviceAllPeersUs per peer past one).
      const double allPeers =
          tuner_.graph().deviceAllPeersUs * std::max(0.0, static_cast<double>(n) - 2);
      for (int r = 0; r < static_cast<int>(n); ++r) {
        const auto pieces = k == kTpFusedInPlace
                                ? tpInPlacePieces(static_cast<int>(n))
                                : tpFusedPieces(s.op, static_cast<int>(n), r, copy, block);
        double t = 0, copiesEnd = 0;
        int copied = 1;
        for (const TpPiece& piece : pieces) {
          if (k == kTpFusedInPlace) {
            // The all-gather's blocks are in once their owners' copies are, side by side; the
            // reduce-scatter's sum (below) waits for every rank's GEMM, alike.
            if (ag) t = std::max(t, copy);
            t += gemm(piece.count);
          } else if (ag) {
            // This rank's block goes into its shared buffer on the side stream beside its own
            // GEMM, then the peers' blocks; a piece's GEMM waits for its blocks' copies, one after
            // another: no SM spent on moving.
            if (piece.first != r) {
              copied += piece.count;
              t = std::max(t, copy * copied);
            }
            t += gemm(piece.count);
          } else {
            // A piece's blocks copied to their owners once its GEMM is done, beside the next.
            t += gemm(piece.count);
            if (piece.first != r)
              copiesEnd = std::max(copiesEnd, t) + copy * static_cast<double>(piece.count);
          }
        }
        us = std::max(us, (ag ? t : std::max(t, copiesEnd) + sum) + slowed + allPeers);
      }
      fusedCopy = copy;
      fusedBlock = block;
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
      best.copyUs = tpFused(k) ? fusedCopy : 0;
      best.blockUs = tpFused(k) ? fusedBlock : 0;
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
