// One-shot all-reduce: every rank sends its whole input to every other rank and reduces locally.
// Steps: 2 (send to all, reduce from all). Messages n-1 per rank.
// Bytes on the wire per rank: n-1 (the lowest latency and the most traffic: for small messages).
#include "algorithms/algorithm.hpp"
#include "algorithms/patterns.hpp"

namespace weft::algo {
namespace {

using enum Buf;

class OneShot final : public Algorithm {
 public:
  OneShot()
      : Algorithm("oneshot",
                  "all-pairs, one step: each rank reduces every peer's full input (small messages)",
                  {Collective::allReduce}) {}

  bool translationSymmetric(Collective) const override { return true; }

 protected:
  Result<Schedule> generate(Collective, int n, const Params& params) const override {
    Schedule s = Schedule::make(Collective::allReduce, n, "oneshot", 1);
    for (int r : ranksToBuild(params, n)) {
      Program& p = s.program(0, r);
      if (n == 1) {
        p.copy({input, 0}, {output, 0});
        continue;
      }
      const Peers others = allPeersOf(r, n);
      p.send({input, 0}, others);
      p.recvReduceCopy(others, {input, 0}, {output, 0});
    }
    return s;
  }
};

}  // namespace

const Algorithm& oneshotAlgorithm() {
  static const OneShot kOneShot;
  return kOneShot;
}

}  // namespace weft::algo
