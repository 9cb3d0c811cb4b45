// Pairwise all-to-all: n-1 exchanges, one block each way, with partner (k - r) mod n at step k.
// Steps: 2(n-1) + 1 (send and recv per exchange, one local copy). Messages n-1 per rank.
// Bytes on the wire per rank: (n-1)/n. Serves all-to-all-v: each block goes straight to its owner.
#include "algorithms/algorithm.hpp"
#include "algorithms/patterns.hpp"

namespace weft::algo {
namespace {

using enum Buf;

class Pairwise final : public Algorithm {
 public:
  Pairwise()
      : Algorithm("pairwise", "n-1 pairwise exchanges, one block each; serves all-to-all-v",
                  {Collective::allToAll, Collective::allToAllv}) {}

 protected:
  // Partner (k - r) mod n is an involution for every k, so both sides of a pair agree on the
  // step, and each exchange moves the same block index both ways: sending before receiving
  // keeps the in-place form correct.
  Result<Schedule> generate(Collective coll, int n, const Params& params) const override {
    Schedule s = Schedule::make(coll, n, "pairwise", 1);
    for (int r : ranksToBuild(params, n)) {
      Program& p = s.program(0, r);
      for (int k = 0; k < n; ++k) {
        const int q = mod(k - r, n);
        const auto b = static_cast<std::uint32_t>(q);
        if (q == r) {
          p.copy({input, b}, {output, b});
        } else {
          p.send({input, b}, {q});
          p.recv(q, {output, b});
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
