// Hierarchical all-to-all over N nodes of G ranks: pairwise inside each node (N blocks a message),
// then pairwise between the same-index ranks of the nodes (G blocks a message).
// Steps: 2(G-1) + 2(N-1) + 2. Messages (G-1) + (N-1). Bytes per rank: (2n - N - G)/n.
#include <algorithm>
#include <cmath>

#include "algorithms/algorithm.hpp"
#include "algorithms/patterns.hpp"
#include "algorithms/pricing.hpp"

namespace weft::algo {
namespace {

using enum Buf;

class Hierarchical final : public Algorithm {
 public:
  Hierarchical()
      : Algorithm("hierarchical",
                  "two levels: exchange inside each node of G ranks, then between same-index ranks "
                  "of nodes",
                  {Collective::allToAll}) {}

  // With groups that are the hosts and an even number of them, every host plays every round of
  // the hosts' tournament (each copies its own part in round 0); with an odd number each copies
  // in a round of its own and the hosts' timelines differ.
  bool hostSwapSymmetric(Collective, int n, int groupSize) const override {
    return groupSize >= 1 && n % groupSize == 0 && (n / groupSize) % 2 == 0;
  }

  Status price(Pricing& P) const override {
    if (P.coll != Collective::allToAll) return P.unsupportedHere();
    const int n = P.n, G = P.G, N = P.N;
    const double S = P.S;
    // The executor slices globally: every step runs once per pass, and the largest step (a
    // message or the staging copy of max(G, N) blocks) sets how many passes there are.
    const double passes = P.slices(std::max(G, N) * S / n);
    P.lat += (G - 1) * P.aIntra + (N - 1) * P.aNet;
    P.post = passes * ((G - 1) * P.oIntra + (N - 1) * P.oNet);
    const double across = P.multi ? (N - 1) * (S / N) / std::min(P.bwIntra, P.bwNet) : 0;
    P.bw = P.exchange(S / G, passes) + across;
    // Once several passes are in flight, the exchange inside hosts of one slice runs beside the
    // exchange across hosts of another: the NICs and the GPUs' host links carry them at once.
    P.overlapped = std::max(P.together(S / G), across);
    P.alone = ((G - 1) * (S / G) + (N - 1) * (S / N)) / P.bwAlone;
    // Its N-1 rounds across hosts drift apart on shared NICs as pairwise's do.
    P.lat -= P.drift(N - 1, S / N);
    return {};
  }

 protected:
  // Rank (a, l) = a*G + l. Phase 1 gathers at (a, m) everything node a sends to local index m
  // anywhere: scratch[l*N + b] holds rank (a,l)'s block for (b,m). Phase 2 sends scratch[l*N + c]
  // for all l to (c, m), which stores it as output block (a, l).
  Result<Schedule> generate(Collective, int n, const Params& params) const override {
    const int G = hierarchicalGroupSize(n, params.groupSize);
    if (G < 1 || n % G != 0) {
      return invalidArgument("hierarchical: group size " + std::to_string(params.groupSize) +
                             " does not divide " + std::to_string(n) + " ranks");
    }
    const int N = n / G;
    const auto uG = static_cast<std::uint32_t>(G), uN = static_cast<std::uint32_t>(N);
    Schedule s = Schedule::make(Collective::allToAll, n, "hierarchical", 1);
    s.scratchBlocks = static_cast<std::uint32_t>(n);
    for (int r : ranksToBuild(params, n)) {
      Program& p = s.program(0, r);
      const int a = r / G, l = r % G;
      for (int k = 0; k < G; ++k) {
        const int m = roundPartner(l, k, G);
        BlockList out;
        for (std::uint32_t b = 0; b < uN; ++b)
          out.add(input, b * uG + static_cast<std::uint32_t>(m));
        const BlockList staged = range(scratch, static_cast<std::uint32_t>(m) * uN, uN);
        if (m == l) {
          p.copy(out, staged);
        } else {
          p.send(out, {a * G + m});
          p.recv(a * G + m, staged);
        }
      }
      for (int k = 0; k < N; ++k) {
        const int c = roundPartner(a, k, N);
        BlockList staged;
        for (std::uint32_t j = 0; j < uG; ++j)
          staged.add(scratch, j * uN + static_cast<std::uint32_t>(c));
        const BlockList out = range(output, static_cast<std::uint32_t>(c) * uG, uG);
        if (c == a) {
          p.copy(staged, out);
        } else {
          p.send(staged, {c * G + l});
          p.recv(c * G + l, out);
        }
      }
    }
    return s;
  }
};

}  // namespace

int hierarchicalGroupSize(int nranks, int requested) {
  if (requested > 0) return requested;
  for (int g = 8; g > 1; --g) {
    if (nranks % g == 0) return g;
  }
  return 1;
}

const Algorithm& hierarchicalAlgorithm() {
  static const Hierarchical kHierarchical;
  return kHierarchical;
}

}  // namespace weft::algo
