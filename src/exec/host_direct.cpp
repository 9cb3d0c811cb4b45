#include "src/exec/host_direct.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "src/core/sizes.hpp"
#include "src/exec/host_reduce.hpp"

namespace weft::exec {
namespace {

// The bytes of a peer's piece read into cache at a time to be summed: small enough to stay in
// L1/L2 between the read and the sum, large enough that a read's system call is a small part of
// it (a prototype on the H200 machine's 16 cores: 64 KiB beat 16 KiB and 256 KiB at 1-128 MB).
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

class Direct {
 public:
  Direct(const DirectCall& c, const DirectGroup& g, std::uint64_t& barriers,
         std::vector<std::byte>& staging)
      : c_(c),
        g_(g),
        barriers_(barriers),
        staging_(staging),
        es_(sizeOf(c.type)),
        n_(static_cast<std::size_t>(g.nranks)),
        me_(static_cast<std::size_t>(g.rank)),
        v_(std::max<std::size_t>(1, 64 / sizeOf(c.type))),
        in_(static_cast<const std::byte*>(c.input)),
        out_(static_cast<std::byte*>(c.output)),
        op_(c.op == RedOp::avg ? RedOp::sum : c.op) {}

  Status run() {
    stageInputIfNeeded();
    transport::ShmControl* mine = g_.controls[me_];
    mine->directInput = reinterpret_cast<std::uintptr_t>(in_);
    mine->directOutput = reinterpret_cast<std::uintptr_t>(out_);
    if (Status s = barrier(); !s) return s;
    for (std::size_t q = 0; q < n_; ++q) {
      inputs_.push_back(g_.controls[q]->directInput);
      outputs_.push_back(g_.controls[q]->directOutput);
    }
    Status s;
    switch (c_.coll) {
      case Collective::allReduce:
        s = allReduce();
        break;
      case Collective::reduceScatter:
        s = parallel(c_.count * es_, [&](std::size_t t, std::size_t k) {
          return sum(share({0, c_.count}, t, k, v_), in_ + me_ * c_.count * es_, me_ * c_.count);
        });
        break;
      case Collective::allGather:
        s = parallel(n_ * c_.count * es_, [&](std::size_t t, std::size_t k) {
          return gather([&](std::size_t q) { return inputs_[q]; }, t, k);
        });
        break;
      case Collective::allToAll:
        s = parallel(n_ * c_.count * es_, [&](std::size_t t, std::size_t k) {
          return gather([&](std::size_t q) { return inputs_[q] + me_ * c_.count * es_; }, t, k);
        });
        break;
      default:
        return internalError(std::string("the direct path does not serve ") +
                             std::string(name(c_.coll)));
    }
    if (!s) return s;
    // Nobody returns while a peer may still read its buffers.
    return barrier();
  }

 private:
  // Every rank reaches barrier number ++barriers_ before any passes it.
  Status barrier() {
    const std::uint64_t n = ++barriers_;
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

  // The input's and output's extents, and where the input may sit inside the output (the
  // collective's in-place layout).
  void stageInputIfNeeded() {
    if (in_ == nullptr || out_ == nullptr) return;
    std::size_t inElems = c_.count, outElems = c_.count;
    const std::uintptr_t out = reinterpret_cast<std::uintptr_t>(out_), block = me_ * c_.count * es_;
    std::uintptr_t inPlace = out;
    switch (c_.coll) {
      case Collective::reduceScatter:
        inElems = n_ * c_.count;
        inPlace = out - block;
        break;
      case Collective::allGather:
        outElems = n_ * c_.count;
        inPlace = out + block;
        break;
      case Collective::allToAll:
        inElems = outElems = n_ * c_.count;
        inPlace = 0;  // a rank overwrites blocks its peers still read
        break;
      default:
        break;
    }
    if (reinterpret_cast<std::uintptr_t>(in_) == inPlace ||
        !overlaps(in_, inElems * es_, out_, outElems * es_))
      return;
    staging_.resize(inElems * es_);
    std::memcpy(staging_.data(), in_, inElems * es_);
    in_ = staging_.data();
  }

  // Runs fn(t, k) on k threads: as many as `bytes` gives kBytesPerThread each, at most the
  // group's.
  template <typename Fn>
  Status parallel(std::size_t bytes, Fn&& fn) {
    const std::size_t k =
        std::clamp<std::size_t>(bytes / kBytesPerThread, 1, std::max<std::size_t>(1, g_.threads));
    std::vector<Status> results(k);
    g_.parallel(k, [&](std::size_t t) { results[t] = fn(t, k); });
    for (Status& s : results) {
      if (!s) return s;
    }
    return {};
  }

  // Rank q's bytes at `from` (this rank's own memory included: its PeerMemory is local).
  Status read(std::size_t q, std::byte* to, std::uint64_t from, std::size_t bytes) const {
    return bytes == 0 ? Status{} : (*g_.memory)[q].read(to, from, bytes);
  }

  // Elements `r` of the call's reduced segment: this rank's own input at `mine` (elements
  // r.begin.. of it) combined with every peer's input at element `at` + r.begin.., into the
  // output at r.begin. Peers' chunks are read into a buffer that stays in cache, unless the
  // peer is a thread of this process (then summed where they lie).
  Status sum(Range r, const std::byte* mine, std::size_t at) const {
    thread_local std::vector<std::byte> chunk;
    chunk.resize(kChunkBytes);
    const std::size_t step = std::max<std::size_t>(v_, kChunkBytes / es_ / v_ * v_);
    for (std::size_t i = r.begin; i < r.end; i += step) {
      const std::size_t m = std::min(step, r.end - i);
      std::byte* acc = out_ + i * es_;
      const std::byte* first = mine + i * es_;
      for (std::size_t k = 1; k < n_; ++k) {
        const std::size_t q = (me_ + k) % n_;
        const std::uint64_t from = inputs_[q] + (at + i) * es_;
        const std::byte* src = reinterpret_cast<const std::byte*>(from);
        if (!(*g_.memory)[q].local()) {
          if (Status s = (*g_.memory)[q].read(chunk.data(), from, m * es_); !s) return s;
          src = chunk.data();
        }
        reduce(acc, k == 1 ? first : acc, src, m, c_.type, op_);
      }
    }
    return {};
  }

  // Share t of k of every block of the output: block q comes from rank q's address blockOf(q).
  template <typename BlockOf>
  Status gather(BlockOf&& blockOf, std::size_t t, std::size_t k) const {
    for (std::size_t j = 0; j < n_; ++j) {
      const std::size_t q = (me_ + j) % n_;
      const Range r = share({0, c_.count}, t, k, v_);
      std::byte* to = out_ + (q * c_.count + r.begin) * es_;
      const std::uint64_t from = blockOf(q) + r.begin * es_;
      if (q == me_ && reinterpret_cast<const std::byte*>(from) == to) continue;  // in place
      if (Status s = read(q, to, from, r.size() * es_); !s) return s;
    }
    return {};
  }

  // Two-shot: rank r sums piece r of every input into its output, then every rank reads the
  // other pieces from their owners' outputs.
  Status allReduce() {
    const std::size_t piece = roundUp(ceilDiv(c_.count, n_), v_);
    auto pieceOf = [&](std::size_t r) {
      return Range{std::min(c_.count, r * piece), std::min(c_.count, (r + 1) * piece)};
    };
    const std::size_t bytes = c_.count * es_;
    if (Status s = parallel(bytes,
                            [&](std::size_t t, std::size_t k) {
                              return sum(share(pieceOf(me_), t, k, v_), in_, 0);
                            });
        !s)
      return s;
    if (Status s = barrier(); !s) return s;
    return parallel(bytes, [&](std::size_t t, std::size_t k) {
      for (std::size_t j = 1; j < n_; ++j) {
        const std::size_t q = (me_ + j) % n_;
        const Range r = share(pieceOf(q), t, k, v_);
        if (Status s = read(q, out_ + r.begin * es_, outputs_[q] + r.begin * es_, r.size() * es_);
            !s)
          return s;
      }
      return Status{};
    });
  }

  const DirectCall& c_;
  const DirectGroup& g_;
  std::uint64_t& barriers_;
  std::vector<std::byte>& staging_;
  std::size_t es_, n_, me_, v_;
  const std::byte* in_;
  std::byte* out_;
  RedOp op_;
  std::vector<std::uint64_t> inputs_, outputs_;  // by rank, as published
};

}  // namespace

bool directServes(Collective coll, bool threadsOfOneProcess) {
  return coll == Collective::allReduce || coll == Collective::allGather ||
         coll == Collective::allToAll || (coll == Collective::reduceScatter && threadsOfOneProcess);
}

Status runDirect(const DirectCall& call, const DirectGroup& group, std::uint64_t& barriers,
                 std::vector<std::byte>& staging) {
  return Direct(call, group, barriers, staging).run();
}

}  // namespace weft::exec
