// Recursive halving then doubling (Rabenseifner) all-reduce; p = largest power of two <= n.
// Halving pairs rank v with v ^ 1 first, so its largest messages (half the data) stay between
// neighbours, inside a host where hosts hold consecutive ranks, and the smallest cross hosts.
// Steps: 2*log2(p) exchanges (send + recv each), plus one fold in and one fold out when n != p.
// Bytes on the wire per rank: 2(p-1)/p, plus 1 for ranks folded in or out (the first 2(n-p) ranks).
#include <algorithm>
#include <cmath>

#include "algorithms/algorithm.hpp"
#include "algorithms/patterns.hpp"
#include "algorithms/pricing.hpp"

namespace weft::algo {
namespace {

using enum Buf;

class HalvingDoubling final : public Algorithm {
 public:
  HalvingDoubling()
      : Algorithm("rhd",
                  "recursive halving reduce-scatter + recursive doubling all-gather (Rabenseifner)",
                  {Collective::allReduce}) {}

  Status price(Pricing& P) const override {
    if (P.coll != Collective::allReduce) return P.unsupportedHere();
    const RankGraph& g = P.g;
    const int n = P.n, G = P.G;
    const double S = P.S;
    const int p2 = static_cast<int>(pow2Floor(static_cast<std::uint32_t>(n)));
    const double passes = P.slices(p2 != n ? S : S / 2);  // the largest message sets the passes
    // The exchange with partner v ^ mask moves S / 2mask: halves go to the nearest ranks.
    auto halfOver = [&](int mask) { return S / (2.0 * mask); };
    if (!P.multi) {
      if (p2 != n) {  // fold in and out: a whole message each way
        P.lat += 2 * P.aStep;
        P.post += 2 * passes * P.oStep;
        P.bw += 2 * S / P.bwStep;
      }
      // One host: every exchange is inside it, at the XOR pattern's share where known. A slice
      // crosses the exchanges one after another; the next slices follow at the pace of the
      // busiest resource: the rank's own port, which every exchange uses, or the slowest
      // exchange's links.
      double inTurn = 0, port = 0, slowest = 0;
      for (int mask = 1; mask < p2; mask *= 2) {
        const bool xorKnown = mask < G && static_cast<std::size_t>(mask) < g.xorBw.size() &&
                              g.xorBw[static_cast<std::size_t>(mask)] < 1e29;
        const double b = xorKnown ? P.pat(g.xorBw[static_cast<std::size_t>(mask)]) : P.bwIntra;
        P.lat += 2 * P.aIntra;
        P.post += 2 * passes * P.oIntra;
        inTurn += 2 * halfOver(mask) / b;
        port += 2 * halfOver(mask) / P.bwIntra;
        slowest = std::max(slowest, 2 * halfOver(mask) / b);
      }
      // Ranks short of a core copy every exchange themselves, in turn (docs/algorithms.md,
      // "Costs").
      const double pace = g.coresPerRank < 1 ? inTurn : std::max(port, slowest);
      P.bw += (inTurn + (passes - 1) * pace) / passes;
      return {};
    }
    // Across hosts, whether an exchange stays inside a host depends on the placement (hosts of
    // 72 cut the hypercube's subcubes). Nothing synchronises the exchanges, so walk the
    // hypercube's critical path: a rank finishes an exchange after itself and its partner are
    // ready, plus its own pair's latency and transfer.
    const int extra = n - p2;
    auto real = [extra](int v) { return v < extra ? 2 * v + 1 : v + extra; };
    // A pair's latency: NICs of one rail are a switch apart, other rails three.
    auto pairLatency = [&](int a, int b) {
      if (a / G == b / G) return P.aIntra;
      const bool sameRail =
          static_cast<int>(g.nicOf.size()) < G ||
          g.nicOf[static_cast<std::size_t>(a % G)] == g.nicOf[static_cast<std::size_t>(b % G)];
      return P.c.hopLatency[P.p][P.net] + (sameRail ? 1 : 3) * g.switchLatency;
    };
    // What the sender spends on its side of an exchange: every pass's postings, and `share` of
    // its bytes.
    auto rate = [&](int a, int b) {
      return a / G == b / G ? P.bwIntra : std::min(P.bwIntra, P.bwNet);
    };
    double share = 1;
    auto ownCost = [&](int a, int b, double moved, bool withPosts, bool withBytes) {
      const bool inside = a / G == b / G;
      return (withPosts ? passes * (inside ? P.oIntra : P.oNet) : 0) +
             (withBytes ? share * moved / rate(a, b) : 0);
    };
    auto pairCost = [&](int a, int b, double moved, bool withPosts, bool withBytes) {
      return pairLatency(a, b) + ownCost(a, b, moved, withPosts, withBytes);
    };
    auto criticalPath = [&](bool withPosts, bool withBytes) {
      std::vector<double> ready(static_cast<std::size_t>(p2), 0), next(ready.size());
      if (p2 != n) {
        for (int v = 0; v < extra; ++v)
          ready[static_cast<std::size_t>(v)] = pairCost(2 * v, 2 * v + 1, S, withPosts, withBytes);
      }
      std::vector<int> masks;
      for (int m = 1; m < p2; m *= 2) masks.push_back(m);       // halving
      for (int m = p2 / 2; m >= 1; m /= 2) masks.push_back(m);  // doubling
      for (int m : masks) {
        for (int v = 0; v < p2; ++v) {
          const int w = v ^ m;
          next[static_cast<std::size_t>(v)] =
              // A rank goes on once its own side is out and its partner's has landed: only the
              // partner's message pays the latency.
              std::max(ready[static_cast<std::size_t>(v)],
                       ready[static_cast<std::size_t>(w)] + pairLatency(real(v), real(w))) +
              ownCost(real(v), real(w), halfOver(m), withPosts, withBytes);
        }
        std::swap(ready, next);
      }
      double worst = 0;
      for (int v = 0; v < p2; ++v) {
        const double fold = v < extra ? pairCost(2 * v, 2 * v + 1, S, withPosts, withBytes) : 0;
        worst = std::max(worst, ready[static_cast<std::size_t>(v)] + fold);
      }
      return worst;
    };
    const double hops = criticalPath(false, false), posted = criticalPath(true, false);
    P.lat = P.base + hops;
    P.post = posted - hops;
    // The first slice's bytes walk the critical path; the next slices follow at the pace of a
    // rank's busier resource, its port inside the host or its way out of it, each carrying its
    // exchanges' parts of a slice in turn (with the large parts inside hosts, the two overlap;
    // not for ranks short of a core, which copy both in turn).
    share = 1 / passes;
    const double first = criticalPath(true, true) - posted;
    double period = 0;
    for (int v = 0; v < p2; ++v) {
      double inside = 0, across = 0;
      auto add = [&](int a, int b, double moved) {
        (a / G == b / G ? inside : across) += share * moved / rate(a, b);
      };
      if (v < extra) add(2 * v, 2 * v + 1, 2 * S);
      for (int m = 1; m < p2; m *= 2) add(real(v), real(v ^ m), 2 * halfOver(m));
      period = std::max(period, g.coresPerRank < 1 ? inside + across : std::max(inside, across));
    }
    P.bw = first + (passes - 1) * period;
    return {};
  }

 protected:
  Result<Schedule> generate(Collective, int n, const Params& params) const override {
    const int p = static_cast<int>(pow2Floor(static_cast<std::uint32_t>(n)));
    const int extra = n - p;  // ranks 0..2*extra-1 pair up: even ones fold into the odd ones
    const auto blocks = static_cast<std::uint32_t>(p);
    Schedule s = Schedule::make(Collective::allReduce, n, "rhd", blocks);
    auto realRank = [extra](int v) { return v < extra ? 2 * v + 1 : v + extra; };
    for (int r : ranksToBuild(params, n)) {
      Program& g = s.program(0, r);
      if (n == 1) {
        g.copy({input, 0}, {output, 0});
        continue;
      }
      Buf acc = input;  // where this rank's partial sums live
      if (r < 2 * extra) {
        if (r % 2 == 0) {
          g.send(range(input, 0, blocks), {r + 1});
          g.recv(r + 1, range(output, 0, blocks));
          continue;
        }
        g.recvReduceCopy({r - 1}, range(input, 0, blocks), range(output, 0, blocks));
        acc = output;
      }
      const int v = r < 2 * extra ? r / 2 : r - extra;
      std::uint32_t lo = 0, count = blocks;
      for (int mask = 1; mask < p; mask *= 2) {
        const int partner = realRank(v ^ mask);
        const std::uint32_t half = count / 2;
        const bool upper = (v & mask) != 0;
        const std::uint32_t keep = upper ? lo + half : lo;
        const std::uint32_t give = upper ? lo : lo + half;
        g.send(range(acc, give, half), {partner});
        g.recvReduceCopy({partner}, range(acc, keep, half), range(output, keep, half));
        acc = output;
        lo = keep;
        count = half;
      }
      for (int mask = p / 2; mask >= 1; mask /= 2) {  // the halving undone, last one first
        const int partner = realRank(v ^ mask);
        g.send(range(output, lo, count), {partner});
        g.recv(partner, range(output, lo ^ count, count));
        lo &= ~count;
        count *= 2;
      }
      if (r < 2 * extra) g.send(range(output, 0, blocks), {r - 1});
    }
    return s;
  }
};

}  // namespace

const Algorithm& rhdAlgorithm() {
  static const HalvingDoubling kRhd;
  return kRhd;
}

}  // namespace weft::algo
