// Two-shot all-reduce: all-pairs reduce-scatter (rank r owns block r), then all-pairs all-gather.
// Steps: 2(n-1) + 2. Messages 2(n-1) per rank.
// Bytes on the wire per rank: 2(n-1)/n, with a depth of two hops (mid-size, tensor parallel).
#include "algorithms/algorithm.hpp"
#include "algorithms/patterns.hpp"
#include "algorithms/pricing.hpp"

namespace weft::algo {
namespace {

using enum Buf;

class TwoShot final : public Algorithm {
 public:
  TwoShot()
      : Algorithm("twoshot",
                  "all-pairs reduce-scatter then all-pairs all-gather (mid-size, tensor parallel)",
                  {Collective::allReduce}) {}

  bool translationSymmetric(Collective) const override { return true; }

  Status price(Pricing& P) const override { return priceAllPairs(P, false); }
  bool waitsOnEveryPeer() const override { return true; }

 protected:
  Result<Schedule> generate(Collective, int n, const Params& params) const override {
    Schedule s = Schedule::make(Collective::allReduce, n, "twoshot", static_cast<std::uint32_t>(n));
    for (int r : ranksToBuild(params, n)) {
      Program& p = s.program(0, r);
      const auto own = static_cast<std::uint32_t>(r);
      if (n == 1) {
        p.copy({input, 0}, {output, 0});
        continue;
      }
      for (int k = 1; k < n; ++k) {
        const int q = mod(r + k, n);
        p.send({input, static_cast<std::uint32_t>(q)}, {q});
      }
      const Peers others = allPeersOf(r, n);
      p.recvReduceCopy(others, {input, own}, {output, own});
      p.send({output, own}, others);
      for (int k = 1; k < n; ++k) {
        const int q = mod(r - k, n);
        p.recv(q, {output, static_cast<std::uint32_t>(q)});
      }
    }
    return s;
  }
};

}  // namespace

const Algorithm& twoshotAlgorithm() {
  static const TwoShot kTwoShot;
  return kTwoShot;
}

}  // namespace weft::algo
