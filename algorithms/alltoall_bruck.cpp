// Bruck all-to-all: rotate into scratch, ceil(log2 n) rounds moving the blocks whose index has
// bit k set by 2^k ranks, rotate back. Steps: 2 ceil(log2 n) + 2. Messages ceil(log2 n) per rank.
// Bytes on the wire per rank: bitsum(n)/n (about log2(n)/2): more bytes, far fewer messages.
#include <algorithm>
#include <cmath>

#include "algorithms/algorithm.hpp"
#include "algorithms/patterns.hpp"
#include "algorithms/pricing.hpp"

namespace weft::algo {
namespace {

using enum Buf;

class Bruck final : public Algorithm {
 public:
  Bruck()
      : Algorithm("bruck",
                  "log2(n) rounds of aggregated blocks via a rotated scratch copy (small blocks)",
                  {Collective::allToAll}) {}

  bool translationSymmetric(Collective) const override { return true; }

  Status price(Pricing& P) const override {
    if (P.coll != Collective::allToAll) return P.unsupportedHere();
    const int n = P.n;
    const double S = P.S;
    // The rotations into and out of scratch copy all n blocks: they set the passes.
    const double passes = P.slices(S);
    // Blocks whose index has bit d set.
    auto moved = [&](int d) {
      return (std::floor(double(n) / (2.0 * d)) * d + std::max(0.0, double(n % (2 * d)) - d)) *
             (S / n);
    };
    std::vector<std::pair<int, double>> rounds;
    for (int d = 1; d < n; d *= 2) rounds.push_back({d, moved(d)});
    P.shifts(rounds, passes);
    return {};
  }

 protected:
  // Scratch slot i of rank r starts as r's block for rank r+i. Round k forwards every slot whose
  // index has bit k set by 2^k ranks; a slot's index is the sum of the hops it makes, so slot i of
  // rank r ends up holding rank (r-i)'s block for r, which the final copy puts in place.
  Result<Schedule> generate(Collective, int n, const Params& params) const override {
    const auto un = static_cast<std::uint32_t>(n);
    Schedule s = Schedule::make(Collective::allToAll, n, "bruck", 1);
    s.scratchBlocks = un;
    for (int r : ranksToBuild(params, n)) {
      Program& p = s.program(0, r);
      if (n == 1) {
        p.copy({input, 0}, {output, 0});
        continue;
      }
      BlockList rotated;
      for (int i = 0; i < n; ++i) rotated.add(input, static_cast<std::uint32_t>(mod(r + i, n)));
      p.copy(rotated, range(scratch, 0, un));
      for (int d = 1; d < n; d *= 2) {
        BlockList moving;
        for (int i = 0; i < n; ++i) {
          if (i & d) moving.add(scratch, static_cast<std::uint32_t>(i));
        }
        p.send(moving, {mod(r + d, n)});
        p.recv(mod(r - d, n), moving);
      }
      BlockList back;
      for (int i = 0; i < n; ++i) back.add(output, static_cast<std::uint32_t>(mod(r - i, n)));
      p.copy(range(scratch, 0, un), back);
    }
    return s;
  }
};

}  // namespace

const Algorithm& bruckAlgorithm() {
  static const Bruck kBruck;
  return kBruck;
}

}  // namespace weft::algo
