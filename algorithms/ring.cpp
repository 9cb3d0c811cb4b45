// Ring: each rank sends to the next in the ring and receives from the one before; broadcast and
// reduce run as a pipelined chain. With ranks grouped in hosts, each channel's ring enters and
// leaves the hosts through different GPUs.
// Steps: all-reduce 2n-1 (reduce-scatter then all-gather), all-gather and reduce-scatter n, chain
// 1-2. Bytes on the wire per rank: all-reduce 2(n-1)/n, all-gather and reduce-scatter (n-1)/n,
// chain 1.
#include <algorithm>
#include <cmath>

#include "algorithms/algorithm.hpp"
#include "algorithms/patterns.hpp"
#include "algorithms/pricing.hpp"

namespace weft::algo {
namespace {

using enum Buf;

class Ring final : public Algorithm {
 public:
  Ring()
      : Algorithm("ring", "bandwidth-optimal ring; broadcast/reduce as a pipelined chain",
                  {Collective::allReduce, Collective::allGather, Collective::reduceScatter,
                   Collective::broadcast, Collective::reduce}) {}

  // The rotated rings keep the same order on every host (chains are rooted: not symmetric).
  bool translationSymmetric(Collective c) const override {
    return c == Collective::allReduce || c == Collective::allGather ||
           c == Collective::reduceScatter;
  }

  Status price(Pricing& P) const override {
    double steps = 0, moved = 0;
    switch (P.coll) {
      case Collective::allReduce:
        steps = 2.0 * (P.n - 1);
        moved = 2.0 * (P.n - 1) / P.n;
        break;
      case Collective::allGather:
      case Collective::reduceScatter:
        steps = P.n - 1;
        moved = double(P.n - 1) / P.n;
        break;
      case Collective::broadcast:
      case Collective::reduce:
        steps = P.n - 1;
        moved = 1;
        break;
      default:
        return P.unsupportedHere();
    }
    // Each host's ranks are consecutive in every ring: n - N hops inside hosts, N across. Each
    // channel's ring leaves a host through a different GPU (rotated rings), so the crossings use
    // min(channels, G) GPUs' NICs, up to all of the host's.
    const RankGraph& g = P.g;
    const std::size_t ci = static_cast<std::size_t>(
        std::clamp(P.channels, 1, static_cast<int>(g.ringIntraBw.size())) - 1);
    const double intraBw = P.multi ? P.pat(g.ringIntraBw[ci]) : P.shift(1);
    const double netBw =
        P.multi ? g.ringCrossBw[ci] * P.c.bandwidthScale[P.net] * P.eff * kBytesPerUsPerGBs
                : intraBw;
    const double crossings = P.multi ? P.N : 0, inside = P.n - crossings;
    if (P.coll == Collective::broadcast || P.coll == Collective::reduce) {
      // A pipelined chain: the first slice crosses every hop, the rest follow at the slowest.
      P.lat += inside * (P.aIntra + P.oIntra) + crossings * (P.aNet + P.oNet);
      P.bw = moved * P.S / (P.multi ? std::min(intraBw, netBw) : intraBw);
      P.post = (P.slices(P.S) - 1) * P.oStep;
      return {};
    }
    // Per step every rank forwards one block. The ring runs at the slower of its busiest rank
    // (back-to-back sends over its link) and its cycle (a block's hop latency and transfer,
    // averaged over the ring): the latency of a fast hop hides behind a slow one. Channels share
    // a rank's NVSwitch port but post their messages independently: while one posts, the others
    // keep the port busy, so a step takes the longer of one channel's postings and transfer
    // alone on the port, and the whole block over it. Host crossings differ: each rotated
    // channel leaves through its own GPU's NIC (channels share one only past G of them), so
    // nothing hides a channel's postings there.
    const double block = moved * P.S / steps;
    const double C = P.channels;
    const double busyIntra =
        std::max(P.slices(block) * P.oIntra + block / C / intraBw, block / intraBw);
    const double nicsUsed = std::min(C, static_cast<double>(std::max(1, P.G)));
    const double busyNet =
        P.multi ? std::max(P.slices(block) * P.oNet + block / C / (netBw / nicsUsed), block / netBw)
                : 0;
    const double cycle = (inside * (P.aIntra + busyIntra) + crossings * (P.aNet + busyNet)) / P.n;
    const double period = std::max({busyIntra, busyNet, cycle});
    P.lat += steps * (period - std::max(busyIntra, busyNet));
    P.bw = steps * std::max(busyIntra, busyNet);
    return {};
  }

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
  // The rank order of one channel. With G ranks per host and several channels, channel c visits
  // each host's ranks starting at local index c, so every channel leaves a host through a
  // different GPU and NIC (NCCL builds its rings per channel the same way); otherwise 0..n-1.
  struct Order {
    std::vector<int> rankAt, posOf;
    Order(int n, int G, int c)
        : rankAt(static_cast<std::size_t>(n)), posOf(static_cast<std::size_t>(n)) {
      for (int r = 0; r < n; ++r) {
        const int pos = G > 1 ? (r / G) * G + mod(r % G - c, G) : r;
        rankAt[static_cast<std::size_t>(pos)] = r;
        posOf[static_cast<std::size_t>(r)] = pos;
      }
    }
    int at(int pos) const {
      return rankAt[static_cast<std::size_t>(mod(pos, static_cast<int>(rankAt.size())))];
    }
  };

  // How many channels the generator lays out itself: rotated rings need hosts to rotate within.
  static int ownChannels(int n, const Params& params) {
    const int G = params.groupSize;
    return (params.channels > 1 && G > 1 && n > G && n % G == 0) ? params.channels : 1;
  }

  template <typename Fill>
  static Schedule rings(Collective coll, int n, std::uint32_t blocksPerSegment,
                        const Params& params, Fill fill) {
    const int channels = ownChannels(n, params);
    Schedule s =
        Schedule::make(coll, n, "ring", blocksPerSegment, static_cast<std::uint32_t>(channels));
    s.partsPerBlock = static_cast<std::uint32_t>(channels);
    for (int c = 0; c < channels; ++c) {
      s.channels[static_cast<std::size_t>(c)].part = static_cast<std::uint32_t>(c);
      const Order order(n, channels > 1 ? params.groupSize : 1, c);
      for (int r : ranksToBuild(params, n))
        fill(s.program(static_cast<std::size_t>(c), r), order, r);
    }
    return s;
  }

  // Block (p - k) travels one hop per step, p the rank's position: n-1 reduce steps leave the
  // rank with block p+1 fully reduced, n-1 copy steps hand every finished block around.
  static Schedule allReduce(int n, const Params& params) {
    return rings(Collective::allReduce, n, static_cast<std::uint32_t>(n), params,
                 [n](Program& p, const Order& o, int r) {
                   if (n == 1) {
                     p.copy({input, 0}, {output, 0});
                     return;
                   }
                   const int pos = o.posOf[static_cast<std::size_t>(r)];
                   const Peers next{o.at(pos + 1)};
                   const int prev = o.at(pos - 1);
                   auto blk = [&](int k) { return static_cast<std::uint32_t>(mod(pos - k, n)); };
                   p.send({input, blk(0)}, next);
                   for (int k = 1; k <= n - 2; ++k) p.recvReduceSend({prev}, {input, blk(k)}, next);
                   p.recvReduceCopySend({prev}, {input, blk(n - 1)}, {output, blk(n - 1)}, next);
                   for (int k = 0; k <= n - 3; ++k) p.recvCopySend(prev, {output, blk(k)}, next);
                   p.recv(prev, {output, blk(n - 2)});
                 });
  }

  // Position p receives, at step k, the block of the rank k places before it.
  static Schedule allGather(int n, const Params& params) {
    return rings(Collective::allGather, n, 1, params, [n](Program& p, const Order& o, int r) {
      p.copy({input, 0}, {output, static_cast<std::uint32_t>(r)});
      if (n == 1) return;
      const int pos = o.posOf[static_cast<std::size_t>(r)];
      const Peers next{o.at(pos + 1)};
      const int prev = o.at(pos - 1);
      p.send({input, 0}, next);
      for (int k = 1; k <= n - 2; ++k)
        p.recvCopySend(prev, {output, static_cast<std::uint32_t>(o.at(pos - k))}, next);
      p.recv(prev, {output, static_cast<std::uint32_t>(o.at(pos - (n - 1)))});
    });
  }

  // Position p starts the block of the rank before it, so each block completes at its owner
  // after n-1 hops.
  static Schedule reduceScatter(int n, const Params& params) {
    return rings(Collective::reduceScatter, n, 1, params, [n](Program& p, const Order& o, int r) {
      const auto own = static_cast<std::uint32_t>(r);
      if (n == 1) {
        p.copy({input, own}, {output, 0});
        return;
      }
      const int pos = o.posOf[static_cast<std::size_t>(r)];
      const Peers next{o.at(pos + 1)};
      const int prev = o.at(pos - 1);
      p.send({input, static_cast<std::uint32_t>(o.at(pos - 1))}, next);
      for (int k = 1; k <= n - 2; ++k)
        p.recvReduceSend({prev}, {input, static_cast<std::uint32_t>(o.at(pos - 1 - k))}, next);
      p.recvReduceCopy({prev}, {input, own}, {output, 0});
    });
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
