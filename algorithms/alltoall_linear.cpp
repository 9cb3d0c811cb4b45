// Linear all-to-all: the local copy, then every block out at once (to r+1, ..., r+n-1), then every
// block in (from r-1, ..., r-n+1). Steps: 2(n-1) + 1. Messages n-1 per rank. Bytes on the wire
// per rank: (n-1)/n, as pairwise's, but no round waits for another: every flow is in flight
// together, which keeps links busy that pairwise's rounds leave idle while a partner's latency
// passes (Open MPI's basic linear, its pick for few ranks and large blocks).
#include <algorithm>
#include <utility>
#include <vector>

#include "algorithms/algorithm.hpp"
#include "algorithms/patterns.hpp"
#include "algorithms/pricing.hpp"

namespace weft::algo {
namespace {

using enum Buf;

class Linear final : public Algorithm {
 public:
  Linear()
      : Algorithm("linear", "every block sent at once, then every block received",
                  {Collective::allToAll}) {}

  bool translationSymmetric(Collective) const override { return true; }

  // On host memory a send to another host is handed to UCX (or a TCP lane) and the rank goes on.
  // GPU kernels copy their sends one after another, so there linear is n-1 shifts by d, each a
  // block (the simulator replayed it up to 4.9x slower than pairwise across two HGX H200s);
  // unmeasured on GPUs, the selector leaves it to WEFT_ALGO there.
  Status price(Pricing& P) const override {
    if (P.coll != Collective::allToAll) return P.unsupportedHere();
    if (!P.g.hostMemory) return priceShifts(P);
    const int n = P.n, G = P.G;
    const double S = P.S;
    // One latency of each kind the rank's flows cross and every message posted; the copies to
    // the host's ranks one after another, and the blocks across hosts on the rank's share of its
    // NIC beside them (a rank short of a core takes turns between the two).
    const double passes = P.slices(S / n);
    P.lat += G > 1 && P.multi ? std::max(P.aIntra, P.aNet) : P.aStep;
    P.post = passes * ((G - 1) * P.oIntra + (n - G) * P.oNet);
    const double inside = P.together(S / n);
    const double across = P.multi ? (n - G) * (S / n) / std::min(P.bwIntra, P.bwNet) : 0;
    P.bw = P.g.coresPerRank < 1 ? inside + across : std::max(inside, across);
    P.alone = (n - 1) * (S / n) / P.bwAlone;
    return {};
  }

 private:
  static Status priceShifts(Pricing& P) {
    const int n = P.n;
    const double block = P.S / n;
    const double passes = P.slices(block);
    std::vector<std::pair<int, double>> rounds;
    for (int d = 1; d < n; ++d) rounds.push_back({d, block});
    P.shifts(rounds, passes);
    return {};
  }

 protected:
  // Sending every block before receiving any keeps the in-place form correct: each pass sends a
  // slice of every block before it overwrites any.
  Result<Schedule> generate(Collective, int n, const Params& params) const override {
    Schedule s = Schedule::make(Collective::allToAll, n, "linear", 1);
    for (int r : ranksToBuild(params, n)) {
      Program& p = s.program(0, r);
      p.copy({input, static_cast<std::uint32_t>(r)}, {output, static_cast<std::uint32_t>(r)});
      for (int d = 1; d < n; ++d) {
        const int q = mod(r + d, n);
        p.send({input, static_cast<std::uint32_t>(q)}, {q});
      }
      for (int d = 1; d < n; ++d) {
        const int q = mod(r - d, n);
        p.recv(q, {output, static_cast<std::uint32_t>(q)});
      }
    }
    return s;
  }
};

}  // namespace

const Algorithm& linearAlgorithm() {
  static const Linear kLinear;
  return kLinear;
}

}  // namespace weft::algo
