// One-shot: every rank sends what each peer needs straight to it, in one step, and each rank
// combines what it received. Steps: 2 (send to all, receive from all). Messages n-1 per rank.
// The lowest latency and the most traffic: for small messages.
//   all-reduce: its whole input to every peer, then the sum of all of them. Bytes on the wire per
//     rank: n-1 times the vector.
//   all-gather: its block to every peer, each peer's block received into its place.
//   reduce-scatter: block q of its input to rank q, then the sum of block r of every rank's.
//   all-to-all: block q of its input to rank q, block r of every rank's received into its place.
//   The three move (n-1)/n of the vector per rank, as ring does, in one step instead of n-1.
#include "algorithms/algorithm.hpp"
#include "algorithms/patterns.hpp"
#include "algorithms/pricing.hpp"

namespace weft::algo {
namespace {

using enum Buf;

class OneShot final : public Algorithm {
 public:
  OneShot()
      : Algorithm("oneshot",
                  "all-pairs, one step: each rank gets what it needs from every peer at once "
                  "(small messages)",
                  {Collective::allReduce, Collective::allGather, Collective::reduceScatter,
                   Collective::allToAll}) {}

  bool translationSymmetric(Collective) const override { return true; }

  Status price(Pricing& P) const override { return priceAllPairs(P, true); }

 protected:
  Result<Schedule> generate(Collective coll, int n, const Params& params) const override {
    Schedule s = Schedule::make(coll, n, "oneshot", 1);
    for (int r : ranksToBuild(params, n)) {
      Program& p = s.program(0, r);
      const auto own = static_cast<std::uint32_t>(r);
      const Peers others = allPeersOf(r, n);
      switch (coll) {
        case Collective::allGather:
          p.copy({input, 0}, {output, own});
          if (n > 1) p.send({input, 0}, others);
          for (int q : others) p.recv(q, {output, static_cast<std::uint32_t>(q)});
          break;
        case Collective::reduceScatter:
          for (int q : others) p.send({input, static_cast<std::uint32_t>(q)}, {q});
          if (n == 1) {
            p.copy({input, own}, {output, 0});
          } else {
            p.recvReduceCopy(others, {input, own}, {output, 0});
          }
          break;
        case Collective::allToAll:
          // Every send before any receive: in place, block q leaves before block q arrives.
          p.copy({input, own}, {output, own});
          for (int q : others) p.send({input, static_cast<std::uint32_t>(q)}, {q});
          for (int q : others) p.recv(q, {output, static_cast<std::uint32_t>(q)});
          break;
        default:
          if (n == 1) {
            p.copy({input, 0}, {output, 0});
          } else {
            p.send({input, 0}, others);
            p.recvReduceCopy(others, {input, 0}, {output, 0});
          }
          break;
      }
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
