// Double binary tree: two complementary binary trees, each carrying half of the data.
// Steps: 2 per tree (up, then down) on each of 2 channels; depth ~log2(n) hops each way.
// Bytes on the wire per rank: all-reduce <= 2 (internal in one tree, a leaf in the other),
// broadcast/reduce <= 2.
#include <algorithm>
#include <cmath>

#include "algorithms/algorithm.hpp"
#include "algorithms/patterns.hpp"
#include "algorithms/pricing.hpp"

namespace weft::algo {
namespace {

using enum Buf;

// One tree laid over the ranks: position -> rank and back.
struct PlacedTree {
  std::vector<TreeNode> nodes;  // by position
  std::vector<int> rankAt;      // position -> rank
  std::vector<int> posOf;       // rank -> position

  PlacedTree(int n, const std::vector<int>& positionOfRank)
      : nodes(binaryTree(n)), rankAt(static_cast<std::size_t>(n)), posOf(positionOfRank) {
    for (int r = 0; r < n; ++r)
      rankAt[static_cast<std::size_t>(posOf[static_cast<std::size_t>(r)])] = r;
  }
  const TreeNode& node(int rank) const {
    return nodes[static_cast<std::size_t>(posOf[static_cast<std::size_t>(rank)])];
  }
  int parent(int rank) const {
    const int up = node(rank).parent;
    return up < 0 ? -1 : rankAt[static_cast<std::size_t>(up)];
  }
  Peers children(int rank) const {
    Peers out;
    for (int c : node(rank).children) out.push_back(rankAt[static_cast<std::size_t>(c)]);
    return out;
  }
};

// The two trees of all-reduce: the second is the first mirrored (n even: every rank is a leaf in
// exactly one tree, since the first tree's leaves are the odd positions) or shifted by one (n odd).
std::vector<int> allReducePositions(int n, int tree) {
  std::vector<int> pos(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    pos[static_cast<std::size_t>(r)] = tree == 0 ? r : (n % 2 == 0 ? n - 1 - r : mod(r - 1, n));
  }
  return pos;
}

// Rooted trees for broadcast and reduce: position 0 is the root in both; the second tree moves
// the other ranks by one (n even) or mirrors them (n odd) so most leaves of one are inner nodes
// of the other.
std::vector<int> rootedPositions(int n, int root, int tree) {
  std::vector<int> pos(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    const int p = mod(r - root, n);
    int q = p;
    if (tree == 1 && p != 0) q = n % 2 == 0 ? (p % (n - 1)) + 1 : n - p;
    pos[static_cast<std::size_t>(r)] = q;
  }
  return pos;
}

class DoubleBinaryTree final : public Algorithm {
 public:
  DoubleBinaryTree()
      : Algorithm("dbtree", "two complementary binary trees, half the data each; log-depth latency",
                  {Collective::allReduce, Collective::broadcast, Collective::reduce}) {}

  Status price(Pricing& P) const override {
    const RankGraph& g = P.g;
    // Depth: the in-order tree climbs log2(G) levels inside a host, then log2(N) across hosts.
    // aNet charges two fabric switches, between a rail's one and three across rails: each hop
    // pays its own.
    const double depth = g.treeHopsInside * (P.aIntra + P.oIntra) +
                         g.treeHopsAcross * (P.aNet + P.oNet) +
                         (2 * g.treeHopsCrossRail - g.treeHopsAcross) * g.switchLatency;
    // Every edge of both trees carries half the data each way; edges share links as the tree
    // pattern says (four flows per GPU on a switch: up once, down twice, and the other tree's
    // up).
    const double edge = P.G > 1 ? P.pat(g.treeBw) : 1e300;
    const double bwEdge = P.multi ? std::min(edge, P.bwNet / 4) : edge;
    const double bwTree = 4 * bwEdge;
    const double posting = (P.slices(P.S / 2) - 1) * 4 * P.oStep;  // four messages a slice
    // The first slice fills the pipeline hop by hop, and on every hop it travels with the same
    // slice of the tree's other channels.
    const double fillHop = double(P.chunk) * P.channels;
    const double fill =
        g.treeHopsAcross * fillHop / (P.multi ? std::min(P.bwIntra, P.bwNet) : P.bwIntra) +
        g.treeHopsInside * fillHop / (P.G > 1 ? P.shift(1) : 1e300);
    if (P.coll == Collective::allReduce) {
      P.lat += 2 * (depth + fill);
      P.bw = (P.S / 2) / bwEdge;
      P.post = posting;
    } else if (P.coll == Collective::broadcast || P.coll == Collective::reduce) {
      P.lat += depth + fill;
      P.bw = P.S / bwTree;
      P.post = posting / 2;
    } else {
      return P.unsupportedHere();
    }
    return {};
  }

 protected:
  Result<Schedule> generate(Collective coll, int n, const Params& params) const override {
    Schedule s = Schedule::make(coll, n, "dbtree", 2, 2);
    for (int t = 0; t < 2; ++t) {
      const PlacedTree tree(n, coll == Collective::allReduce ? allReducePositions(n, t)
                                                             : rootedPositions(n, params.root, t));
      const auto b = static_cast<std::uint32_t>(t);
      for (int r : ranksToBuild(params, n)) {
        Program& p = s.program(static_cast<std::size_t>(t), r);
        if (n == 1) {
          p.copy({input, b}, {output, b});
          continue;
        }
        const int up = tree.parent(r);
        const Peers kids = tree.children(r);
        switch (coll) {
          case Collective::allReduce:
            allReduceSteps(p, b, up, kids);
            break;
          case Collective::broadcast:
            broadcastSteps(p, b, up, kids);
            break;
          default:
            reduceSteps(p, b, up, kids);
            break;
        }
      }
    }
    return s;
  }

 private:
  // Up the tree reducing, down the tree copying; the root turns the data around in one step.
  static void allReduceSteps(Program& p, std::uint32_t b, int up, const Peers& kids) {
    if (up < 0) {
      p.recvReduceCopySend(kids, {input, b}, {output, b}, kids);
    } else if (kids.empty()) {
      p.send({input, b}, {up});
      p.recv(up, {output, b});
    } else {
      p.recvReduceSend(kids, {input, b}, {up});
      p.recvCopySend(up, {output, b}, kids);
    }
  }

  static void broadcastSteps(Program& p, std::uint32_t b, int up, const Peers& kids) {
    if (up < 0) {
      p.copy({input, b}, {output, b});
      p.send({input, b}, kids);
    } else if (kids.empty()) {
      p.recv(up, {output, b});
    } else {
      p.recvCopySend(up, {output, b}, kids);
    }
  }

  static void reduceSteps(Program& p, std::uint32_t b, int up, const Peers& kids) {
    if (up < 0) {
      p.recvReduceCopy(kids, {input, b}, {output, b});
    } else if (kids.empty()) {
      p.send({input, b}, {up});
    } else {
      p.recvReduceSend(kids, {input, b}, {up});
    }
  }
};

}  // namespace

const Algorithm& dbtreeAlgorithm() {
  static const DoubleBinaryTree kTree;
  return kTree;
}

}  // namespace weft::algo
