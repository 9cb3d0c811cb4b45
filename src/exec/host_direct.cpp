#include "src/exec/host_direct.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>

#include "src/core/sizes.hpp"
#include "src/exec/host_reduce.hpp"

namespace weft::exec {
namespace {

// The bytes of a piece summed over every peer before the next: the sum stays in L1/L2 between
// the peers' passes.
constexpr std::size_t kChunkBytes = 64 * 1024;
// A thread gets at least this much of a call to move before the call wakes another.
constexpr std::size_t kBytesPerThread = 256 * 1024;

// ThreadSanitizer cannot see the barriers order ranks that are threads of one process: each
// maps every rank's control page at its own address. Every rank hands this word off before it
// arrives and takes it over once it has passed, which is what a barrier orders.
const char barrierWord = 0;

struct Range {
  std::size_t begin = 0, end = 0;
  std::size_t size() const { return end - begin; }
};

// Share t of k of [r.begin, r.end), cut at multiples of v elements (cache lines stay whole).
Range share(Range r, std::size_t t, std::size_t k, std::size_t v) {
  const std::size_t len = r.size();
  auto cut = [&](std::size_t i) { return std::min(r.end, r.begin + roundUp(len * i / k, v)); };
  return {cut(t), cut(t + 1)};
}

bool overlaps(const std::byte* a, std::size_t an, const std::byte* b, std::size_t bn) {
  return an > 0 && bn > 0 && a < b + bn && b < a + an;
}

void copyBytes(std::byte* to, const std::byte* from, std::size_t bytes) {
  if (bytes > 0 && to != from) std::memcpy(to, from, bytes);
}

class Direct {
 public:
  Direct(const DirectCall& c, const DirectGroup& g, DirectState& state)
      : c_(c),
        g_(g),
        state_(state),
        es_(sizeOf(c.type)),
        n_(static_cast<std::size_t>(g.nranks)),
        me_(static_cast<std::size_t>(g.rank)),
        v_(std::max<std::size_t>(1, 64 / sizeOf(c.type))),
        in_(static_cast<const std::byte*>(c.input)),
        out_(static_cast<std::byte*>(c.output)),
        op_(c.op == RedOp::avg ? RedOp::sum : c.op) {}

  Status run() {
    if (!directServes(c_.coll)) return unserved();
    stageInputIfNeeded();
    // The call's threads: as many as its bytes give kBytesPerThread each, at most the group's
    // (or all of them, where the group fixes them).
    const std::size_t blockBytes = c_.count * es_;
    const std::size_t bytes = c_.coll == Collective::allReduce ? blockBytes : n_ * blockBytes;
    const std::size_t most = std::max<std::size_t>(1, g_.threads);
    const std::size_t k =
        g_.fixedThreads ? most : std::clamp<std::size_t>(bytes / kBytesPerThread, 1, most);
    k_ = k;
    const std::uint64_t rounds = state_.rounds;
    std::vector<Status> results(k);
    std::vector<std::uint64_t> roundsRun(k);
    g_.parallel(k, [&](std::size_t t) {
      Thread th{t, rounds};
      results[t] = g_.stages.empty() ? loads(th) : betweenProcesses(th);
      roundsRun[t] = th.round - rounds;
    });
    state_.rounds += roundsRun[0];
    if (!g_.stages.empty()) ++state_.calls;
    for (Status& s : results) {
      if (!s) return s;
    }
    return {};
  }

 private:
  // One of the call's threads: its share index, and (between processes) its round.
  struct Thread {
    std::size_t t;
    std::uint64_t round;
  };

  // ---- Ranks that are threads of one process: loads from the peers' buffers.

  Status loads(Thread& th) {
    if (th.t == 0) {
      transport::ShmControl* mine = g_.controls[me_];
      mine->directInput = reinterpret_cast<std::uintptr_t>(in_);
      mine->directOutput = reinterpret_cast<std::uintptr_t>(out_);
    }
    if (Status s = sync(); !s) return s;
    return loadFromPeers(
        th,
        [&](std::size_t q) {
          return reinterpret_cast<const std::byte*>(g_.controls[q]->directInput);
        },
        [&](std::size_t q) {
          return reinterpret_cast<const std::byte*>(g_.controls[q]->directOutput);
        });
  }

  // Each rank reads what it needs from every rank's input and output, as inputOf(q) and
  // outputOf(q) reach them (this rank's own included), then waits until nobody reads its own.
  template <typename Input, typename Output>
  Status loadFromPeers(Thread& th, Input&& inputOf, Output&& outputOf) {
    const std::size_t t = th.t, k = k_;
    switch (c_.coll) {
      case Collective::allReduce: {
        const std::size_t piece = pieceElems(c_.count);
        const Range r = share(pieceOf(me_, piece, c_.count), t, k, v_);
        sum(out_ + r.begin * es_, in_ + r.begin * es_, r.size(),
            [&](std::size_t q) { return inputOf(q) + r.begin * es_; });
        if (Status s = sync(); !s) return s;
        for (std::size_t j = 1; j < n_; ++j) {
          const std::size_t q = (me_ + j) % n_;
          const Range p = share(pieceOf(q, piece, c_.count), t, k, v_);
          copyBytes(out_ + p.begin * es_, outputOf(q) + p.begin * es_, p.size() * es_);
        }
        break;
      }
      case Collective::reduceScatter: {
        const Range r = share({0, c_.count}, t, k, v_);
        const std::size_t at = (me_ * c_.count + r.begin) * es_;
        sum(out_ + r.begin * es_, in_ + at, r.size(),
            [&](std::size_t q) { return inputOf(q) + at; });
        break;
      }
      default: {  // all-gather, all-to-all
        const bool a2a = c_.coll == Collective::allToAll;
        const Range r = share({0, c_.count}, t, k, v_);
        for (std::size_t j = 0; j < n_; ++j) {
          const std::size_t q = (me_ + j) % n_;
          const std::byte* from = inputOf(q) + ((a2a ? me_ * c_.count : 0) + r.begin) * es_;
          copyBytes(out_ + (q * c_.count + r.begin) * es_, from, r.size() * es_);
        }
        break;
      }
    }
    // Nobody returns while a peer may still read its buffers.
    return sync();
  }

  // ---- Ranks in several processes: their weftHostAlloc buffers in place, or rounds through the
  // stages.

  // A rank whose buffers are not weftHostAlloc memory starts through the stages at once (its
  // first barrier, after its copy-in, is where it publishes its refs); one whose are skips the
  // copy-in and waits at that barrier for the others' refs. Past it every rank sees every
  // rank's: all shared, they load in place; else those that skipped copy in late, and the
  // others wait once more for them (staged(), `early`).
  Status betweenProcesses(Thread& th) {
    const auto [inElems, outElems] = extents();
    const std::size_t inBytes = inElems * es_, outBytes = outElems * es_;
    // All-to-all in place cannot load: peers would still read blocks this rank overwrites.
    const bool inPlaceA2a =
        c_.coll == Collective::allToAll && overlaps(in_, inBytes, out_, outBytes);
    const transport::HostRef inRef =
        inPlaceA2a ? transport::HostRef{} : transport::hostRefOf(in_, inBytes);
    const transport::HostRef outRef = transport::hostRefOf(out_, outBytes);
    transport::ShmControl* mine = g_.controls[me_];
    const std::size_t slot = state_.calls % 2;
    if (th.t == 0) {
      // Written only when they change: peers read them after every first barrier.
      auto publish = [](transport::HostRef& to, const transport::HostRef& ref) {
        if (to.id != ref.id || to.offset != ref.offset || to.allocBytes != ref.allocBytes ||
            to.fd != ref.fd)
          to = ref;
      };
      publish(mine->directRefs[slot][0], inRef);
      publish(mine->directRefs[slot][1], outRef);
    }
    if (inRef.id == 0 || outRef.id == 0) return staged(th, true);
    if (Status s = sync(); !s) return s;
    // Every rank sees the same refs, so every rank takes the same branch.
    if (!everyRankShares()) return staged(th, false);
    if (th.t == 0) {
      peerInputs_.assign(n_, nullptr);
      peerOutputs_.assign(n_, nullptr);
      bool mapped = true;
      for (std::size_t q = 0; q < n_; ++q) {
        if (q == me_) {
          peerInputs_[q] = in_;
          peerOutputs_[q] = out_;
          continue;
        }
        transport::PeerAllocations& views = *state_.peerAllocations;
        const int pid = g_.pids[q];
        peerInputs_[q] = views.view(pid, g_.controls[q]->directRefs[slot][0], inBytes);
        peerOutputs_[q] = views.view(pid, g_.controls[q]->directRefs[slot][1], outBytes);
        mapped = mapped && peerInputs_[q] != nullptr && peerOutputs_[q] != nullptr;
      }
      mine->directViews = mapped ? 1 : 0;
    }
    if (Status s = sync(); !s) return s;
    const bool allMapped = std::all_of(g_.controls.begin(), g_.controls.end(),
                                       [](auto* c) { return c->directViews != 0; });
    if (!allMapped) return staged(th, false);
    if (th.t == 0) ++state_.inPlaceCalls;
    return loadFromPeers(
        th, [&](std::size_t q) { return peerInputs_[q]; },
        [&](std::size_t q) { return peerOutputs_[q]; });
  }

  // Whether every rank's (any rank's) refs of this call name weftHostAlloc memory: read past the
  // call's first barrier.
  bool everyRankShares() const {
    return std::all_of(g_.controls.begin(), g_.controls.end(), [&](auto* c) { return shares(c); });
  }
  bool someRankShares() const {
    return std::any_of(g_.controls.begin(), g_.controls.end(), [&](auto* c) { return shares(c); });
  }
  bool shares(const transport::ShmControl* c) const {
    const auto& refs = c->directRefs[state_.calls % 2];
    return refs[0].id != 0 && refs[1].id != 0;
  }

  // early: this rank copies in before the call's first barrier, where it publishes its refs; if
  // another rank waited there to copy in after it (its buffers weftHostAlloc memory, some
  // rank's not), every early rank waits at one more barrier for those late copies.
  Status staged(Thread& th, bool early) {
    switch (c_.coll) {
      case Collective::allReduce:
        return stagedAllReduce(th, early);
      case Collective::allGather:
        return stagedAllGather(th, early);
      default:  // reduce-scatter, all-to-all
        return stagedBlocks(th, early);
    }
  }

  // After a round's copy-in: the barrier that lets peers read it (the call's first: see staged()).
  Status copiedIn(const Thread& th, std::uint64_t firstRound, bool early) {
    if (Status s = sync(); !s) return s;
    if (early && th.round == firstRound && someRankShares()) return sync();
    return {};
  }

  std::size_t halfBytes() const { return g_.stageBytes / 2 / 64 * 64; }
  // Rank q's half in round `round`.
  std::byte* half(std::size_t q, std::uint64_t round) const {
    return g_.stages[q] + (round % 2) * halfBytes();
  }
  // The most elements a round takes when each rank stages `perElement` of them per element of
  // the round, at least one cache line's worth.
  std::size_t roundElems(std::size_t perElement) const {
    return std::max(v_, halfBytes() / es_ / perElement / v_ * v_);
  }

  // Two-shot in rounds: the input's pieces go through the stage's first part, the sums through
  // its second.
  Status stagedAllReduce(Thread& th, bool early) {
    const std::size_t t = th.t, k = k_;
    // A round of m elements stages m (its pieces) and m / n (the sum of one).
    const std::size_t most =
        std::max(n_ * v_, halfBytes() / es_ * n_ / (n_ + 1) / (n_ * v_) * (n_ * v_));
    const std::size_t sumsAt = roundUp(most * es_, 64);
    const std::uint64_t first = th.round;
    for (std::size_t off = 0; off < c_.count; off += most, ++th.round) {
      const std::size_t m = std::min(most, c_.count - off);
      const std::size_t piece = pieceElems(m);
      const std::byte* in = in_ + off * es_;
      std::byte* out = out_ + off * es_;
      for (std::size_t j = 1; j < n_; ++j) {
        const Range r = share(pieceOf((me_ + j) % n_, piece, m), t, k, v_);
        copyBytes(half(me_, th.round) + r.begin * es_, in + r.begin * es_, r.size() * es_);
      }
      if (Status s = copiedIn(th, first, early); !s) return s;
      const Range mine = pieceOf(me_, piece, m);
      const Range r = share(mine, t, k, v_);
      sum(out + r.begin * es_, in + r.begin * es_, r.size(),
          [&](std::size_t q) { return half(q, th.round) + r.begin * es_; });
      copyBytes(half(me_, th.round) + sumsAt + (r.begin - mine.begin) * es_, out + r.begin * es_,
                r.size() * es_);
      if (Status s = sync(); !s) return s;
      for (std::size_t j = 1; j < n_; ++j) {
        const std::size_t q = (me_ + j) % n_;
        const Range p = pieceOf(q, piece, m);
        const Range pr = share(p, t, k, v_);
        copyBytes(out + pr.begin * es_, half(q, th.round) + sumsAt + (pr.begin - p.begin) * es_,
                  pr.size() * es_);
      }
    }
    return {};
  }

  // Reduce-scatter and all-to-all: a round takes elements [off, off + m) of every block; block q
  // of this rank's input goes to the stage at q * m, and rank q reads it from there.
  Status stagedBlocks(Thread& th, bool early) {
    const std::size_t t = th.t, k = k_;
    const bool a2a = c_.coll == Collective::allToAll;
    const std::size_t most = roundElems(n_);
    const std::uint64_t first = th.round;
    for (std::size_t off = 0; off < c_.count; off += most, ++th.round) {
      const std::size_t m = std::min(most, c_.count - off);
      const Range r = share({0, m}, t, k, v_);
      for (std::size_t j = 1; j < n_; ++j) {
        const std::size_t q = (me_ + j) % n_;
        copyBytes(half(me_, th.round) + (q * m + r.begin) * es_,
                  in_ + (q * c_.count + off + r.begin) * es_, r.size() * es_);
      }
      if (Status s = copiedIn(th, first, early); !s) return s;
      const std::byte* own = in_ + (me_ * c_.count + off + r.begin) * es_;
      auto staged = [&](std::size_t q) { return half(q, th.round) + (me_ * m + r.begin) * es_; };
      if (!a2a) {
        sum(out_ + (off + r.begin) * es_, own, r.size(), staged);
        continue;
      }
      for (std::size_t j = 0; j < n_; ++j) {
        const std::size_t q = (me_ + j) % n_;
        copyBytes(out_ + (q * c_.count + off + r.begin) * es_, q == me_ ? own : staged(q),
                  r.size() * es_);
      }
    }
    return {};
  }

  Status stagedAllGather(Thread& th, bool early) {
    const std::size_t t = th.t, k = k_;
    const std::size_t most = roundElems(1);
    const std::uint64_t first = th.round;
    for (std::size_t off = 0; off < c_.count; off += most, ++th.round) {
      const std::size_t m = std::min(most, c_.count - off);
      const std::byte* in = in_ + off * es_;
      const Range r = share({0, m}, t, k, v_);
      copyBytes(half(me_, th.round) + r.begin * es_, in + r.begin * es_, r.size() * es_);
      if (Status s = copiedIn(th, first, early); !s) return s;
      for (std::size_t j = 0; j < n_; ++j) {
        const std::size_t q = (me_ + j) % n_;
        copyBytes(out_ + (q * c_.count + off + r.begin) * es_,
                  (q == me_ ? in : half(q, th.round)) + r.begin * es_, r.size() * es_);
      }
    }
    return {};
  }

  // ---- Both.

  Status unserved() const {
    return internalError(std::string("the direct path does not serve ") +
                         std::string(name(c_.coll)));
  }

  // Every thread of every rank reaches this point before any goes on. The last of this rank's
  // threads to arrive takes the rank through the barrier over the ranks, then lets the others
  // go; they spin meanwhile (each has a core: the group's threads are at most the rank's).
  Status sync() {
    const std::uint64_t passed = passed_.load(std::memory_order_acquire);
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == k_) {
      arrived_.store(0, std::memory_order_relaxed);
      failure_ = barrier();
      passed_.store(passed + 1, std::memory_order_release);
      return failure_;
    }
    if (Status s =
            g_.waiter->wait([&] { return passed_.load(std::memory_order_acquire) != passed; },
                            "waiting in a direct call's barrier for", static_cast<int>(me_));
        !s)
      return s;
    return failure_;
  }

  // Every rank reaches barrier number ++barriers before any passes it.
  Status barrier() {
    const std::uint64_t n = ++state_.barriers;
    transport::handOff(&barrierWord);
    g_.controls[me_]->directArrived.store(n, std::memory_order_release);
    for (std::size_t q = 0; q < n_; ++q) {
      if (q == me_) continue;
      const auto& arrived = g_.controls[q]->directArrived;
      if (Status s = g_.waiter->wait([&] { return arrived.load(std::memory_order_acquire) >= n; },
                                     "waiting in a direct call's barrier for", static_cast<int>(q));
          !s)
        return s;
    }
    transport::takeOver(&barrierWord);
    return {};
  }

  // Two-shot's pieces of m elements: n of them, whole cache lines each (the last ones may be
  // short or empty).
  std::size_t pieceElems(std::size_t m) const { return roundUp(ceilDiv(m, n_), v_); }
  static Range pieceOf(std::size_t q, std::size_t piece, std::size_t m) {
    return {std::min(m, q * piece), std::min(m, (q + 1) * piece)};
  }

  // to[0, m) = own[0, m) combined with peer(q)[0, m) of every other rank q, a chunk at a time.
  template <typename Peer>
  void sum(std::byte* to, const std::byte* own, std::size_t m, Peer&& peer) const {
    const std::size_t step = std::max(v_, kChunkBytes / es_ / v_ * v_);
    for (std::size_t i = 0; i < m; i += step) {
      const std::size_t len = std::min(step, m - i);
      for (std::size_t j = 1; j < n_; ++j) {
        const std::size_t q = (me_ + j) % n_;
        reduce(to + i * es_, j == 1 ? own + i * es_ : to + i * es_, peer(q) + i * es_, len, c_.type,
               op_);
      }
    }
  }

  // Elements of the call's input and output.
  std::pair<std::size_t, std::size_t> extents() const {
    switch (c_.coll) {
      case Collective::reduceScatter:
        return {n_ * c_.count, c_.count};
      case Collective::allGather:
        return {c_.count, n_ * c_.count};
      case Collective::allToAll:
        return {n_ * c_.count, n_ * c_.count};
      default:
        return {c_.count, c_.count};
    }
  }

  // A private copy of the input where it overlaps the output other than in the collective's
  // in-place layout (where the input may sit inside the output).
  void stageInputIfNeeded() {
    if (in_ == nullptr || out_ == nullptr) return;
    const auto [inElems, outElems] = extents();
    const std::uintptr_t out = reinterpret_cast<std::uintptr_t>(out_), block = me_ * c_.count * es_;
    std::uintptr_t inPlace = out;
    switch (c_.coll) {
      case Collective::reduceScatter:
        inPlace = out - block;
        break;
      case Collective::allGather:
        inPlace = out + block;
        break;
      case Collective::allToAll:
        // Through the stages a round writes only what it has staged or read: in place is safe.
        // Loading from each other, peers still read blocks a rank overwrites.
        inPlace = g_.stages.empty() ? 0 : out;
        break;
      default:
        break;
    }
    if (reinterpret_cast<std::uintptr_t>(in_) == inPlace ||
        !overlaps(in_, inElems * es_, out_, outElems * es_))
      return;
    state_.staging.resize(inElems * es_);
    std::memcpy(state_.staging.data(), in_, inElems * es_);
    in_ = state_.staging.data();
  }

  const DirectCall& c_;
  const DirectGroup& g_;
  DirectState& state_;
  std::size_t es_, n_, me_, v_;
  const std::byte* in_;
  std::byte* out_;
  RedOp op_;
  std::size_t k_ = 1;  // the call's threads
  // Between processes, loading in place: every rank's input and output as mapped here.
  std::vector<const std::byte*> peerInputs_, peerOutputs_;
  std::atomic<std::size_t> arrived_{0};
  std::atomic<std::uint64_t> passed_{0};
  Status failure_;  // the last barrier's, written before passed_ moves
};

}  // namespace

bool directServes(Collective coll) {
  return coll == Collective::allReduce || coll == Collective::allGather ||
         coll == Collective::allToAll || coll == Collective::reduceScatter;
}

Status runDirect(const DirectCall& call, const DirectGroup& group, DirectState& state) {
  return Direct(call, group, state).run();
}

}  // namespace weft::exec
