// Ring: rank r sends to r+1 and receives from r-1; broadcast and reduce run as a pipelined chain.
// Steps: all-reduce 2n-1 (reduce-scatter then all-gather), all-gather and reduce-scatter n, chain
// 1-2. Bytes on the wire per rank: all-reduce 2(n-1)/n, all-gather and reduce-scatter (n-1)/n,
// chain 1.
#include "algorithms/algorithm.hpp"
#include "algorithms/patterns.hpp"

namespace weft::algo {
namespace {

using enum Buf;

class Ring final : public Algorithm {
 public:
  Ring()
      : Algorithm("ring", "bandwidth-optimal ring; broadcast/reduce as a pipelined chain",
                  {Collective::allReduce, Collective::allGather, Collective::reduceScatter,
                   Collective::broadcast, Collective::reduce}) {}

 protected:
  Result<Schedule> generate(Collective coll, int n, const Params& params) const override {
    switch (coll) {
      case Collective::allReduce:
        return allReduce(n, params);
      case Collective::allGather:
        return allGather(n, params);
      case Collective::reduceScatter:
        return reduceScatter(n, params);
      case Collective::broadcast:
        return broadcast(n, params);
      case Collective::reduce:
        return reduce(n, params);
      default:
        return unsupported("ring: unexpected collective");
    }
  }

 private:
  // Block (r - k) travels one hop per step: n-1 reduce steps leave rank r with block r+1 fully
  // reduced, n-1 copy steps hand every finished block around.
  static Schedule allReduce(int n, const Params& params) {
    Schedule s = Schedule::make(Collective::allReduce, n, "ring", static_cast<std::uint32_t>(n));
    for (int r : ranksToBuild(params, n)) {
      Program& p = s.program(0, r);
      if (n == 1) {
        p.copy({input, 0}, {output, 0});
        continue;
      }
      const Peers next{mod(r + 1, n)};
      const int prev = mod(r - 1, n);
      auto blk = [&](int k) { return static_cast<std::uint32_t>(mod(r - k, n)); };
      p.send({input, blk(0)}, next);
      for (int k = 1; k <= n - 2; ++k) p.recvReduceSend({prev}, {input, blk(k)}, next);
      p.recvReduceCopySend({prev}, {input, blk(n - 1)}, {output, blk(n - 1)}, next);
      for (int k = 0; k <= n - 3; ++k) p.recvCopySend(prev, {output, blk(k)}, next);
      p.recv(prev, {output, blk(n - 2)});
    }
    return s;
  }

  static Schedule allGather(int n, const Params& params) {
    Schedule s = Schedule::make(Collective::allGather, n, "ring", 1);
    for (int r : ranksToBuild(params, n)) {
      Program& p = s.program(0, r);
      p.copy({input, 0}, {output, static_cast<std::uint32_t>(r)});
      if (n == 1) continue;
      const Peers next{mod(r + 1, n)};
      const int prev = mod(r - 1, n);
      p.send({input, 0}, next);
      for (int k = 1; k <= n - 2; ++k) {
        p.recvCopySend(prev, {output, static_cast<std::uint32_t>(mod(r - k, n))}, next);
      }
      p.recv(prev, {output, static_cast<std::uint32_t>(mod(r - (n - 1), n))});
    }
    return s;
  }

  // Rank r starts block r-1 so that block r completes at rank r after n-1 hops.
  static Schedule reduceScatter(int n, const Params& params) {
    Schedule s = Schedule::make(Collective::reduceScatter, n, "ring", 1);
    for (int r : ranksToBuild(params, n)) {
      Program& p = s.program(0, r);
      const auto own = static_cast<std::uint32_t>(r);
      if (n == 1) {
        p.copy({input, own}, {output, 0});
        continue;
      }
      const Peers next{mod(r + 1, n)};
      const int prev = mod(r - 1, n);
      p.send({input, static_cast<std::uint32_t>(mod(r - 1, n))}, next);
      for (int k = 1; k <= n - 2; ++k) {
        p.recvReduceSend({prev}, {input, static_cast<std::uint32_t>(mod(r - 1 - k, n))}, next);
      }
      p.recvReduceCopy({prev}, {input, own}, {output, 0});
    }
    return s;
  }

  // Chain root -> root+1 -> ... -> root-1; the executor's slices pipeline it.
  static Schedule broadcast(int n, const Params& params) {
    const int root = params.root;
    Schedule s = Schedule::make(Collective::broadcast, n, "ring", 1);
    for (int r : ranksToBuild(params, n)) {
      Program& p = s.program(0, r);
      const int pos = mod(r - root, n);
      const Peers next{mod(r + 1, n)};
      const int prev = mod(r - 1, n);
      if (pos == 0) {
        p.copy({input, 0}, {output, 0});
        if (n > 1) p.send({input, 0}, next);
      } else if (pos < n - 1) {
        p.recvCopySend(prev, {output, 0}, next);
      } else {
        p.recv(prev, {output, 0});
      }
    }
    return s;
  }

  // Chain root+n-1 -> ... -> root+1 -> root, accumulating on the way.
  static Schedule reduce(int n, const Params& params) {
    const int root = params.root;
    Schedule s = Schedule::make(Collective::reduce, n, "ring", 1);
    for (int r : ranksToBuild(params, n)) {
      Program& p = s.program(0, r);
      const int pos = mod(r - root, n);
      const int up = mod(r + 1, n);
      const Peers down{mod(r - 1, n)};
      if (n == 1) {
        p.copy({input, 0}, {output, 0});
      } else if (pos == 0) {
        p.recvReduceCopy({up}, {input, 0}, {output, 0});
      } else if (pos < n - 1) {
        p.recvReduceSend({up}, {input, 0}, down);
      } else {
        p.send({input, 0}, down);
      }
    }
    return s;
  }
};

}  // namespace

const Algorithm& ringAlgorithm() {
  static const Ring kRing;
  return kRing;
}

}  // namespace weft::algo
