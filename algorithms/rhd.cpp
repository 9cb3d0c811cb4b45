// Recursive halving then doubling (Rabenseifner) all-reduce; p = largest power of two <= n.
// Steps: 2*log2(p) exchanges (send + recv each), plus one fold in and one fold out when n != p.
// Bytes on the wire per rank: 2(p-1)/p, plus 1 for ranks folded in or out (the first 2(n-p) ranks).
#include "algorithms/algorithm.hpp"
#include "algorithms/patterns.hpp"

namespace weft::algo {
namespace {

using enum Buf;

class HalvingDoubling final : public Algorithm {
 public:
  HalvingDoubling()
      : Algorithm("rhd",
                  "recursive halving reduce-scatter + recursive doubling all-gather (Rabenseifner)",
                  {Collective::allReduce}) {}

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
      for (int mask = p / 2; mask >= 1; mask /= 2) {
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
      for (int mask = 1; mask < p; mask *= 2) {
        const int partner = realRank(v ^ mask);
        const auto m = static_cast<std::uint32_t>(mask);
        g.send(range(output, lo, count), {partner});
        g.recv(partner, range(output, lo ^ m, count));
        lo &= ~m;
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
