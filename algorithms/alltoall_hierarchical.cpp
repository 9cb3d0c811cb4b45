// Hierarchical all-to-all over N nodes of G ranks: pairwise inside each node (N blocks a message),
// then pairwise between the same-index ranks of the nodes (G blocks a message).
// Steps: 2(G-1) + 2(N-1) + 2. Messages (G-1) + (N-1). Bytes per rank: (2n - N - G)/n.
#include "algorithms/algorithm.hpp"
#include "algorithms/patterns.hpp"

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
