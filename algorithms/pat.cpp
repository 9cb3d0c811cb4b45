// PAT, parallel aggregated trees: every rank's block travels its own binomial tree (all trees are
// translates of one), and messages to the same peer are aggregated A blocks at a time.
// Steps: 2 * ((ceil(n/A) - 1) + log2(A)) send/recv pairs (log2(n) when A = n/2, n-1 when A = 1).
// Bytes on the wire per rank: exactly n-1 blocks, (n-1)/n of the message; at most A blocks a
// message.
//
// Relative block i of rank r is block (r + i) mod n. Block i's tree parent is i - highbit(i), one
// hop of highbit(i) ranks away. Relative blocks are grouped into bundles of A (A a power of two):
// bundle q holds i in [qA, qA + A), and because highbit(i) = highbit(q) * A, a whole bundle goes to
// the same peer in one message, and bundle q's parent is bundle q - highbit(q). Bundle 0's blocks
// form a small binomial tree of their own, done as log2(A) Bruck rounds.
//
// Reduce-scatter walks the bundle tree in post-order (children before parents), so a partial sum
// waits in scratch only while its bundle is on the walk's stack: at most A * ceil(log2(n/A)) + A
// scratch blocks, independent of the message size. All-gather is the exact reverse in time and
// direction, and needs no scratch: every block lands in its final place in the output.
#include <algorithm>
#include <cmath>

#include "algorithms/algorithm.hpp"
#include "algorithms/patterns.hpp"
#include "algorithms/pricing.hpp"

namespace weft::algo {
namespace {

using enum Buf;

struct BundleTree {
  int A;  // blocks per bundle, a power of two
  int n;
  int bundles;  // ceil(n / A)

  BundleTree(int nranks, int aggregation)
      : A(aggregation), n(nranks), bundles((nranks + aggregation - 1) / aggregation) {}

  int size(int q) const { return std::min(A, n - q * A); }
  int distance(int q) const {
    return static_cast<int>(pow2Floor(static_cast<std::uint32_t>(q))) * A;
  }
  int parentOffset(int q) const {
    return q * A - distance(q);
  }  // first relative block of the parent's slice

  // Children of bundle q: q + 2^k for every power of two 2^k > q.
  std::vector<int> children(int q) const {
    std::vector<int> out;
    for (int d = 1; q + d < bundles; d *= 2) {
      if (d > q) out.push_back(q + d);
    }
    return out;
  }

  // Bundles 1.. in post-order: every bundle after all of its children.
  std::vector<int> postOrder() const {
    std::vector<int> order;
    struct Frame {
      int q;
      std::size_t next;
      std::vector<int> kids;
    };
    std::vector<Frame> stack;
    stack.push_back({0, 0, children(0)});
    while (!stack.empty()) {
      Frame& f = stack.back();
      if (f.next < f.kids.size()) {
        const int c = f.kids[f.kids.size() - 1 - f.next++];  // largest subtree first
        stack.push_back({c, 0, children(c)});
      } else {
        if (f.q != 0) order.push_back(f.q);
        stack.pop_back();
      }
    }
    return order;
  }
};

// Partial sums of one rank's relative blocks: in the input until the first contribution arrives,
// then in a scratch slot (relative block 0: the output) until sent.
class Accumulators {
 public:
  Accumulators(int n, int rank) : n_(n), rank_(rank), slot_(static_cast<std::size_t>(n), kNone) {}

  // Where relative block i's partial sum is read from.
  void source(BlockList& list, int i) const {
    const int s = slot_[static_cast<std::size_t>(i)];
    if (s == kNone) {
      list.add(input, block(i));
    } else if (i == 0) {
      list.add(output, 0);
    } else {
      list.add(scratch, static_cast<std::uint32_t>(s));
    }
  }

  // Where relative block i accumulates (allocating a slot the first time).
  void target(BlockList& list, int i) {
    int& s = slot_[static_cast<std::size_t>(i)];
    if (s == kNone) {
      if (i == 0) {
        s = 0;
      } else if (!free_.empty()) {
        s = free_.back();
        free_.pop_back();
      } else {
        s = used_++;
      }
    }
    if (i == 0) {
      list.add(output, 0);
    } else {
      list.add(scratch, static_cast<std::uint32_t>(s));
    }
  }

  void release(int i) {
    int& s = slot_[static_cast<std::size_t>(i)];
    if (i != 0 && s != kNone) free_.push_back(s);
    s = kNone;
  }

  bool started(int i) const { return slot_[static_cast<std::size_t>(i)] != kNone; }
  std::uint32_t block(int i) const { return static_cast<std::uint32_t>(mod(rank_ + i, n_)); }
  int scratchUsed() const { return used_; }

 private:
  static constexpr int kNone = -1;
  int n_, rank_;
  std::vector<int> slot_;
  std::vector<int> free_;
  int used_ = 0;
};

class Pat final : public Algorithm {
 public:
  Pat()
      : Algorithm(
            "pat",
            "parallel aggregated binomial trees: log-depth, n-1 blocks per rank, bounded staging",
            {Collective::allGather, Collective::reduceScatter}) {}

  bool translationSymmetric(Collective) const override { return true; }

  Status price(Pricing& P) const override {
    if (P.coll != Collective::allGather && P.coll != Collective::reduceScatter)
      return P.unsupportedHere();
    const int n = P.n;
    const int A = P.model.patAggregationFor(P.bytes, n);
    P.aggregation = A;
    const int Q = (n + A - 1) / A;
    const double block = P.S / n;
    // The executor slices globally: every step runs once per pass, and the largest message (a
    // full bundle) sets how many passes there are.
    const double passes = P.slices(std::min(A, n) * block);
    // Bundle q moves min(A, n - qA) blocks over distance highbit(q)*A; bundle 0's log2(A)
    // rounds move d blocks over distance d. A distance that is a multiple of the host size stays
    // on the same local GPU index (one rail); any other crosses hosts for some ranks.
    auto over = [&](int dist) {
      return P.multi ? std::min(P.shift(dist), P.bwNet) : P.shift(dist);
    };
    if (P.multi) {
      std::vector<std::pair<int, double>> rounds;
      for (int q = 1; q < Q; ++q) {
        rounds.push_back({static_cast<int>(pow2Floor(static_cast<std::uint32_t>(q))) * A,
                          std::min(A, n - q * A) * block});
      }
      for (int d = 1; d < A; d *= 2) rounds.push_back({d, d * block});
      P.shiftRounds(rounds, passes);
      return {};
    }
    for (int q = 1; q < Q; ++q) {
      const int blocks = std::min(A, n - q * A);
      P.lat += P.aStep;
      P.post += passes * P.oStep;
      P.bw += blocks * block / over(static_cast<int>(pow2Floor(static_cast<std::uint32_t>(q))) * A);
    }
    for (int d = 1; d < A; d *= 2) {
      P.lat += P.aStep;
      P.post += passes * P.oStep;
      P.bw += d * block / over(d);
    }
    return {};
  }

 protected:
  Result<Schedule> generate(Collective coll, int n, const Params& params) const override {
    const int A = patAggregation(n, params.aggregation);
    if (params.aggregation < 0 ||
        (params.aggregation > 0 && params.aggregation > std::max(1, n / 2))) {
      return invalidArgument("pat: aggregation " + std::to_string(params.aggregation) +
                             " outside 1.." + std::to_string(std::max(1, n / 2)) + " for " +
                             std::to_string(n) + " ranks");
    }
    const BundleTree tree(n, A);
    Schedule s = Schedule::make(coll, n, "pat", 1);
    for (int r : ranksToBuild(params, n)) {
      if (coll == Collective::reduceScatter) {
        s.scratchBlocks = std::max(s.scratchBlocks, reduceScatter(s.program(0, r), tree, r));
      } else {
        allGather(s.program(0, r), tree, r);
      }
    }
    return s;
  }

 private:
  // Sends relative blocks [first, first + count) to r + dist, then receives the peer r - dist's
  // same blocks into relative [first - dist, ...), reducing into the partial sums there.
  static void reduceStep(Program& p, Accumulators& acc, int r, int n, int first, int count,
                         int dist) {
    BlockList out;
    for (int i = first; i < first + count; ++i) acc.source(out, i);
    p.send(out, {mod(r + dist, n)});
    for (int i = first; i < first + count; ++i) acc.release(i);
    BlockList src, dst;
    for (int i = first - dist; i < first - dist + count; ++i) {
      acc.source(src, i);
      acc.target(dst, i);
    }
    p.recvReduceCopy({mod(r - dist, n)}, src, dst);
  }

  static std::uint32_t reduceScatter(Program& p, const BundleTree& tree, int r) {
    const int n = tree.n;
    if (n == 1) {
      p.copy({input, 0}, {output, 0});
      return 0;
    }
    Accumulators acc(n, r);
    for (int q : tree.postOrder()) {
      reduceStep(p, acc, r, n, q * tree.A, tree.size(q), tree.distance(q));
    }
    for (int d = tree.A / 2; d >= 1; d /= 2) reduceStep(p, acc, r, n, d, d, d);
    if (!acc.started(0)) p.copy({input, static_cast<std::uint32_t>(r)}, {output, 0});
    return static_cast<std::uint32_t>(acc.scratchUsed());
  }

  // The reduce-scatter reversed: relative blocks [first - dist, ...) go to r - dist, and
  // r + dist's arrive as relative [first, first + count).
  static void gatherStep(Program& p, int r, int n, int first, int count, int dist) {
    BlockList out, in;
    for (int i = first; i < first + count; ++i) {
      out.add(output, static_cast<std::uint32_t>(mod(r + i - dist, n)));
      in.add(output, static_cast<std::uint32_t>(mod(r + i, n)));
    }
    p.send(out, {mod(r - dist, n)});
    p.recv(mod(r + dist, n), in);
  }

  static void allGather(Program& p, const BundleTree& tree, int r) {
    const int n = tree.n;
    p.copy({input, 0}, {output, static_cast<std::uint32_t>(r)});
    if (n == 1) return;
    for (int d = 1; d < tree.A; d *= 2) gatherStep(p, r, n, d, d, d);
    const std::vector<int> order = tree.postOrder();
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      gatherStep(p, r, n, *it * tree.A, tree.size(*it), tree.distance(*it));
    }
  }
};

}  // namespace

int patAggregation(int nranks, int requested) {
  const int most = std::max(1, nranks / 2);
  const int a = requested > 0 ? std::min(requested, most) : std::min(8, most);
  return static_cast<int>(pow2Floor(static_cast<std::uint32_t>(a)));
}

const Algorithm& patAlgorithm() {
  static const Pat kPat;
  return kPat;
}

}  // namespace weft::algo
