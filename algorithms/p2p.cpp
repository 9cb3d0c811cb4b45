// Send/recv as a schedule: rank r sends its buffer to r+1 and receives r-1's (the nccl-tests
// sendrecv pattern). Steps: 2 (send, then recv). Bytes on the wire per rank: 1.
#include "algorithms/algorithm.hpp"
#include "algorithms/patterns.hpp"
#include "algorithms/pricing.hpp"

namespace weft::algo {
namespace {

using enum Buf;

class PointToPoint final : public Algorithm {
 public:
  PointToPoint() : Algorithm("p2p", "one send and one recv per rank", {Collective::sendRecv}) {}

  bool translationSymmetric(Collective) const override { return true; }

  Status price(Pricing& P) const override {
    if (P.coll != Collective::sendRecv) return P.unsupportedHere();
    P.lat += P.aStep;
    P.post = P.slices(P.S) * P.oStep;
    P.bw = P.S / (P.multi ? P.bwStep : P.shift(1));
    return {};
  }

 protected:
  Result<Schedule> generate(Collective, int n, const Params& params) const override {
    Schedule s = Schedule::make(Collective::sendRecv, n, "p2p", 1);
    for (int r : ranksToBuild(params, n)) {
      Program& p = s.program(0, r);
      if (n == 1) {
        p.copy({input, 0}, {output, 0});
        continue;
      }
      p.send({input, 0}, {mod(r + 1, n)});
      p.recv(mod(r - 1, n), {output, 0});
    }
    return s;
  }
};

}  // namespace

const Algorithm& p2pAlgorithm() {
  static const PointToPoint kP2p;
  return kP2p;
}

}  // namespace weft::algo
