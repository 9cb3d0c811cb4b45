// Pairwise all-to-all: the local copy, then rounds of exchanges, one block each way, in which
// every rank's partner is of the same kind (all inside hosts, or all across). Steps: 2(n-1) + 1.
// Messages n-1 per rank. Bytes on the wire per rank: (n-1)/n. Serves all-to-all-v.
#include <algorithm>
#include <cmath>

#include "algorithms/algorithm.hpp"
#include "algorithms/patterns.hpp"
#include "algorithms/pricing.hpp"

namespace weft::algo {
namespace {

using enum Buf;

// The rounds of a round-robin tournament on m players, identity first. Round 0 pairs everyone
// with themselves. With m even, rounds 1..m-1 are the circle method's perfect matchings
// (reflection on m-1 players, the one it fixes meeting player m-1); with m odd, rounds 1..m are
// reflections, each fixing one player, who sits the round out. Every round is an involution, and
// each pair of distinct players meets in exactly one round.
int roundsOf(int m) {
  return m % 2 == 0 ? m : m + 1;
}

// The partner of x in round k, or -1 where x sits the round out.
int opponent(int x, int k, int m) {
  if (k == 0) return x;
  if (m % 2 == 1) {
    const int q = mod(k - 1 - x, m);
    return q == x ? -1 : q;
  }
  const int last = m - 1;
  if (x == last) return k - 1;
  const int q = mod(2 * (k - 1) - x, last);
  return q == x ? last : q;
}

// The ranks a host holds: the group size where it divides the ranks, else 1.
int hostSize(int n, int groupSize) {
  return groupSize > 1 && n % groupSize == 0 ? groupSize : 1;
}

class Pairwise final : public Algorithm {
 public:
  Pairwise()
      : Algorithm("pairwise", "n-1 pairwise exchanges, one block each; serves all-to-all-v",
                  {Collective::allToAll, Collective::allToAllv}) {}

  // With an even number of hosts every host plays every round of the hosts' tournament (with
  // an odd number each sits one out, a different one per host, and the hosts' timelines differ).
  // (All-to-all-v's counts differ per pair, so only all-to-all.)
  bool hostSwapSymmetric(Collective coll, int n, int groupSize) const override {
    return coll == Collective::allToAll && (n / hostSize(n, groupSize)) % 2 == 0;
  }

  Status price(Pricing& P) const override {
    if (P.coll != Collective::allToAll && P.coll != Collective::allToAllv)
      return P.unsupportedHere();
    const int n = P.n, G = P.G;
    const double S = P.S;
    // Nothing synchronises the exchanges: a rank pays its G-1 host peers at host speed and the
    // n-G others at network speed.
    const double passes = P.slices(S / n);
    P.lat += (G - 1) * P.aIntra + (n - G) * P.aNet;
    P.post = passes * ((G - 1) * P.oIntra + (n - G) * P.oNet);
    const double across = P.multi ? (n - G) * (S / n) / std::min(P.bwIntra, P.bwNet) : 0;
    P.bw = P.exchange(S / n, passes) + across;
    P.overlapped = std::max(P.together(S / n), across);
    P.alone = (n - 1) * (S / n) / P.bwAlone;
    // Ranks that share a NIC drift apart over the rounds across hosts: while one waits out its
    // partner's latency, the others' blocks keep the NIC busy. Each round's partner differs, so
    // they never drift far. How much of a round hides depends on how the sharing is replayed: of
    // the smaller of its latency and its bytes on the NIC, about half with the links shared at
    // every instant (weft-plan tune --fluid), about an eighth in the three time-averaged passes
    // of the grids; the model takes kDriftHidden, between the two.
    P.lat -= P.drift(n - G, S / n);
    return {};
  }

 protected:
  // Ranks are (host a, local l) with G = the group size. A round is a pair of tournament rounds,
  // one over hosts and one over local indices, the hosts' identity round first: the exchanges
  // inside hosts, then those across, and within a round every flow crosses the same kind of
  // link, so no rank finishes a round early and runs into its next partner's current one. A
  // pair of involutions is an involution, so both sides of a pair agree on the round, and each
  // exchange moves the same block index both ways: sending before receiving keeps the in-place
  // form correct.
  Result<Schedule> generate(Collective coll, int n, const Params& params) const override {
    const int G = hostSize(n, params.groupSize);
    const int N = n / G;
    Schedule s = Schedule::make(coll, n, "pairwise", 1);
    for (int r : ranksToBuild(params, n)) {
      Program& p = s.program(0, r);
      const int a = r / G, l = r % G;
      const auto own = static_cast<std::uint32_t>(r);
      p.copy({input, own}, {output, own});
      for (int j = 0; j < roundsOf(N); ++j) {
        const int b = opponent(a, j, N);
        if (b < 0) continue;
        for (int k = 0; k < roundsOf(G); ++k) {
          const int m = opponent(l, k, G);
          if (m < 0 || (j == 0 && k == 0)) continue;
          const int q = b * G + m;
          const auto blk = static_cast<std::uint32_t>(q);
          p.send({input, blk}, {q});
          p.recv(q, {output, blk});
        }
      }
    }
    return s;
  }
};

}  // namespace

const Algorithm& pairwiseAlgorithm() {
  static const Pairwise kPairwise;
  return kPairwise;
}

}  // namespace weft::algo
