// Selector::planMoeGpu (selector.hpp): MoE dispatch and combine on GPU memory, each mode with each
// channel count priced from the busiest rank's bytes, its kernels and its scans.
// docs/algorithms-fused.md, "MoE dispatch and combine".
#include <algorithm>
#include <cmath>
#include <string>

#include "algorithms/moe_plan.hpp"
#include "algorithms/selector.hpp"

namespace weft::algo {
namespace {

// The busiest rank's share of a call: tokens it sends or receives, its own included (on GPU
// memory its own rows go through its buffer too), and the expert slots it receives.
struct Busiest {
  double tokens = 0, slots = 0;
};

Busiest busiestOf(const MoeShape& s, const MoeTraffic& t) {
  const auto n = static_cast<std::size_t>(t.nranks);
  Busiest b;
  for (std::size_t r = 0; r < n; ++r) {
    std::size_t out = 0, in = 0, slots = 0;
    for (std::size_t q = 0; q < n; ++q) out += t.tokens[r * n + q], in += t.tokens[q * n + r];
    const auto L = static_cast<std::size_t>(s.localExperts());
    for (std::size_t e = r * L; e < (r + 1) * L && e < t.perExpert.size(); ++e)
      slots += t.perExpert[e];
    b.tokens = std::max({b.tokens, static_cast<double>(out), static_cast<double>(in)});
    b.slots = std::max(b.slots, static_cast<double>(slots));
  }
  return b;
}

constexpr int kMostChannels = 4096;

int steps(double items) {
  return static_cast<int>(std::ceil(items / 256.0));
}

}  // namespace

Result<MoeGpuPlan> Selector::planMoeGpu(const MoeShape& s, const MoeTraffic& traffic,
                                        std::optional<bool> lowLatency, int channels,
                                        std::optional<bool> placeFromTable) const {
  if (Status st = checkMoeShape(s); !st) return st;
  const MoeConstants& m = options_.constants.moe;
  const RankGraph& g = tuner_.graph();
  const int n = s.nranks, L = s.localExperts();
  const auto T = static_cast<double>(s.tokens);
  const Busiest b = busiestOf(s, traffic);
  // Rates, read + written: ranks sharing a device share its memory; a rank of its own writes its
  // peers' rows over its links and copies its own through its memory. A device's copies run at
  // rate · B / (B + half_rate_blocks), B the blocks of every rank on it.
  const bool shared = g.deviceCopyGBs > 0;
  const int onDevice = shared ? n : 1;
  const double local = shared ? g.deviceCopyGBs : options_.constants.graphs.deviceCopyGBs;
  const double link = g.allPairsBw > 0 ? g.allPairsBw * std::max(1, n - 1) : g.intraBandwidth;
  const double send = shared || n == 1 || link <= 0 ? local : std::min(local, 2 * link);
  const auto copyUs = [&](double bytes, double rate, double blocks) {
    const double all = blocks * onDevice;
    return bytes / (rate / onDevice * all / (all + m.halfRateBlocks) * 1e3);
  };
  const bool fits = moeTableFits(n, L);
  const int spin = std::max(1, static_cast<int>(m.spinBlocks) / onDevice);
  const double dBytes = static_cast<double>(s.dispatchBytes),
               cBytes = static_cast<double>(s.combineBytes);
  const double encode = s.dispatchBytes < s.combineBytes ? 1 : 0;  // fp8: the encode kernel
  const double waits = (n - 1) * m.peerUs;
  struct Priced {
    double dispatch = 0, combine = 0;
    double total() const { return dispatch + combine; }
  };
  // Dispatch: the rows sent (read, written at the peer), then fanned out (read once, written a
  // slot each); combine: each slot's output read and a token's sum written back, then the
  // ranks' sums read and the token written.
  enum Way { kCounted, kTable, kLowLatency };
  const auto price = [&](Way way, int c) {
    const bool ll = way == kLowLatency;
    const double sendBlocks = ll ? n * std::max(1, c / n) : std::min<double>(T, c);
    const double pairBlocks = std::min<double>(n * T, c), tokenBlocks = std::min<double>(T, c);
    Priced p;
    p.dispatch = copyUs(2 * b.tokens * dBytes, send, sendBlocks) +
                 copyUs((b.tokens + b.slots) * dBytes, local, pairBlocks) + waits;
    p.combine = copyUs((b.slots + b.tokens) * cBytes, send, pairBlocks) +
                copyUs((b.tokens + T) * cBytes, local, tokenBlocks) + waits;
    // Numbering each expert's rows, 256 tokens a step: low latency's blocks scan every token;
    // normal mode counts every chunk at once, then numbers every chunk at once.
    if (ll) {
      p.dispatch += (2 + encode) * m.kernelUs + 2 * m.lowLatencyKernelUs + steps(T) * m.numberUs;
      p.combine += 2 * m.kernelUs;
    } else if (way == kTable) {  // numbered by chunks, placed from the table
      p.dispatch += (8 + encode) * m.kernelUs + 2 * m.chunkUs;
      p.combine += 4 * m.kernelUs;
    } else {  // laid out, then counted and placed by a block per expert
      p.dispatch += (9 + encode) * m.kernelUs +
                    (steps(T) + 2 * std::max<double>(n, steps(b.tokens))) * m.scanUs;
      p.combine += 4 * m.kernelUs;
    }
    return p;
  };
  // Each way's channels: the fewest within 2 % of its fastest.
  struct Best {
    bool offered = false;
    int channels = 0;
    Priced priced;
  };
  const auto best = [&](Way way) {
    Best out;
    if (way != kCounted && !fits) return out;
    const int most = way == kLowLatency ? spin : kMostChannels;
    if (channels > 0) {
      out.offered = true, out.channels = std::min(channels, most);
      out.priced = price(way, out.channels);
      return out;
    }
    double fastest = 0;
    for (int c = 1; c <= most; c *= 2) {
      const double t = price(way, c).total();
      if (fastest == 0 || t < fastest) fastest = t;
    }
    for (int c = 1; c <= most; c *= 2) {
      const Priced p = price(way, c);
      if (p.total() <= 1.02 * fastest) return Best{true, c, p};
    }
    return out;
  };
  const Best counted = best(kCounted), table = best(kTable), ll = best(kLowLatency);
  if ((lowLatency == true || placeFromTable == true) && !ll.offered)
    return Status(Code::unsupported,
                  std::string("moe: ") +
                      (lowLatency == true ? "the low-latency mode" : "placing from the table") +
                      " takes at most " + std::to_string(kMoeLowLatencyMaxLocal) +
                      " experts a rank and " + std::to_string(kMoeLowLatencyMaxTable) +
                      " (ranks × experts a rank); " + std::to_string(n) + " ranks of " +
                      std::to_string(L) + " experts");
  MoeGpuPlan p;
  // Normal mode's placing: from the table where it fits and is cheaper (or forced).
  p.table = placeFromTable.value_or(table.offered && table.priced.total() < counted.priced.total());
  const Best& normal = p.table ? table : counted;
  p.normalUs = normal.priced.total();
  p.lowLatencyUs = ll.offered ? ll.priced.total() : 0;
  p.lowLatency = lowLatency.value_or(!placeFromTable && ll.offered && p.lowLatencyUs < p.normalUs);
  if (p.lowLatency) p.table = true;
  const Best& pick = p.lowLatency ? ll : normal;
  p.channels = pick.channels;
  p.dispatchUs = pick.priced.dispatch, p.combineUs = pick.priced.combine;
  const auto us = [](double v) { return std::to_string(static_cast<long>(std::lround(v))); };
  p.reason = std::string(p.lowLatency ? "low latency"
                         : p.table    ? "normal (table)"
                                      : "normal") +
             ", " + std::to_string(p.channels) + " channels: " + us(pick.priced.total()) + " us";
  if (p.lowLatency) {
    p.reason += " against normal's " + us(p.normalUs);
  } else if (ll.offered) {
    p.reason += " against low latency's " + us(p.lowLatencyUs);
  } else {
    p.reason += " (low latency takes at most " + std::to_string(kMoeLowLatencyMaxLocal) +
                " experts a rank)";
  }
  if (lowLatency || placeFromTable) p.reason += " (mode forced)";
  if (channels > 0) p.reason += " (channels forced)";
  return p;
}

}  // namespace weft::algo
