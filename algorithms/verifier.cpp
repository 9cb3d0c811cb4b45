#include "algorithms/verifier.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <sstream>
#include <unordered_map>
#include <vector>

namespace weft::algo {

std::string_view name(Fault f) {
  switch (f) {
    case Fault::none:
      return "ok";
    case Fault::invalidStep:
      return "invalid step";
    case Fault::deadlock:
      return "deadlock";
    case Fault::unmatchedSend:
      return "unmatched send";
    case Fault::sizeMismatch:
      return "size mismatch";
    case Fault::undefinedRead:
      return "undefined read";
    case Fault::doubleCount:
      return "double count";
    case Fault::wrongResult:
      return "wrong result";
    case Fault::forbiddenWrite:
      return "forbidden write";
  }
  return "?";
}

namespace {

struct Interval {
  std::uint64_t lo, hi;  // [lo, hi) of contribution ids
};

using Value = std::uint64_t;

// Contribution sets as 64-bit values. A contribution id is block * nranks + rank. The sets that
// rings, trees and all-pairs schedules build are one cyclic run of ranks within one block; those
// are encoded inline (tag bit, block, first rank, length), so copies and most unions touch no
// table. Every other set is interned: equal sets always get equal values, inline sets are never
// interned, so comparing results is comparing numbers.
class ValueTable {
 public:
  static constexpr Value kUndefined = 0;
  static constexpr Value kOverlap = ~Value{0} >> 1;  // never a valid table id or inline value

  explicit ValueTable(std::uint32_t nranks) : n_(nranks) { entries_.push_back({0, 0, kNone}); }

  Value singleton(std::uint64_t block, std::uint32_t rank) { return cyclic(block, rank, 1); }
  Value wholeBlock(std::uint64_t block) { return cyclic(block, 0, n_); }

  // Union of two defined sets, or kOverlap if they share a contribution.
  Value unite(Value a, Value b) {
    if (isInline(a) && isInline(b) && blockOf(a) == blockOf(b)) {
      const std::uint32_t s1 = startOf(a), l1 = lenOf(a), s2 = startOf(b), l2 = lenOf(b);
      const std::uint32_t d12 = (s2 + n_ - s1) % n_, d21 = (s1 + n_ - s2) % n_;
      if (l1 + l2 > n_ || d12 < l1 || d21 < l2) return kOverlap;
      if (d12 == l1) return cyclic(blockOf(a), s1, l1 + l2);
      if (d21 == l2) return cyclic(blockOf(a), s2, l1 + l2);
    }
    expand(a, x_);
    expand(b, y_);
    merged_.clear();
    std::size_t i = 0, j = 0;
    bool overlap = false;
    while (i < x_.size() || j < y_.size()) {
      const Interval next =
          (j == y_.size() || (i < x_.size() && x_[i].lo < y_[j].lo)) ? x_[i++] : y_[j++];
      if (!merged_.empty() && next.lo < merged_.back().hi) {
        overlap = true;
        break;
      }
      if (!merged_.empty() && next.lo == merged_.back().hi) {
        merged_.back().hi = next.hi;
      } else {
        merged_.push_back(next);
      }
    }
    return overlap ? kOverlap : canonical(merged_);
  }

  // "{r0.in1, r2.in1..r5.in1}" with at most a few items.
  std::string render(Value v) {
    std::vector<Interval> set;
    expand(v, set);
    std::ostringstream os;
    os << "{";
    std::size_t shown = 0;
    for (const Interval& iv : set) {
      if (shown++ == 4) {
        os << ", ...";
        break;
      }
      if (shown > 1) os << ", ";
      os << label(iv.lo);
      if (iv.hi - iv.lo > 1) os << ".." << label(iv.hi - 1);
    }
    os << "}";
    return os.str();
  }

 private:
  static constexpr std::uint32_t kNone = ~std::uint32_t{0};
  static constexpr Value kInline = Value{1} << 63;
  static constexpr int kLenBits = 21, kStartBits = 21, kBlockBits = 21;
  struct Entry {
    std::uint64_t offset, length;
    std::uint32_t next;  // the following id with the same hash
  };

  static bool isInline(Value v) { return (v & kInline) != 0; }
  static std::uint32_t lenOf(Value v) {
    return static_cast<std::uint32_t>(v & ((1u << kLenBits) - 1));
  }
  static std::uint32_t startOf(Value v) {
    return static_cast<std::uint32_t>((v >> kLenBits) & ((1u << kStartBits) - 1));
  }
  static std::uint64_t blockOf(Value v) { return (v & ~kInline) >> (kLenBits + kStartBits); }

  std::string label(std::uint64_t c) const {
    return "r" + std::to_string(c % n_) + ".in" + std::to_string(c / n_);
  }

  // Ranks start, start+1, ... (len of them, wrapping at n) of one block.
  Value cyclic(std::uint64_t block, std::uint32_t start, std::uint32_t len) {
    if (len == n_) start = 0;
    if (n_ < (1u << kStartBits) && block < (std::uint64_t{1} << kBlockBits)) {
      return kInline | block << (kLenBits + kStartBits) | Value{start} << kLenBits | len;
    }
    std::vector<Interval> set;
    const std::uint64_t base = block * n_;
    if (start + len <= n_) {
      set.push_back({base + start, base + start + len});
    } else {
      set.push_back({base, base + (start + len - n_)});
      set.push_back({base + start, base + n_});
    }
    return intern(set);
  }

  void expand(Value v, std::vector<Interval>& out) const {
    out.clear();
    if (isInline(v)) {
      const std::uint64_t base = blockOf(v) * n_;
      const std::uint32_t s = startOf(v), l = lenOf(v);
      if (s + l <= n_) {
        out.push_back({base + s, base + s + l});
      } else {
        out.push_back({base, base + (s + l - n_)});
        out.push_back({base + s, base + n_});
      }
      return;
    }
    const Entry& e = entries_[v];
    out.assign(pool_.begin() + static_cast<std::ptrdiff_t>(e.offset),
               pool_.begin() + static_cast<std::ptrdiff_t>(e.offset + e.length));
  }

  // The inline form when the set is one cyclic run inside one block, else the interned id.
  Value canonical(const std::vector<Interval>& set) {
    const std::uint64_t block = set.front().lo / n_;
    const std::uint64_t base = block * n_;
    const bool oneBlock = set.back().hi <= base + n_;
    if (oneBlock && set.size() == 1) {
      return cyclic(block, static_cast<std::uint32_t>(set[0].lo - base),
                    static_cast<std::uint32_t>(set[0].hi - set[0].lo));
    }
    if (oneBlock && set.size() == 2 && set[0].lo == base && set[1].hi == base + n_) {
      return cyclic(block, static_cast<std::uint32_t>(set[1].lo - base),
                    static_cast<std::uint32_t>((set[1].hi - set[1].lo) + (set[0].hi - set[0].lo)));
    }
    return intern(set);
  }

  Value intern(const std::vector<Interval>& set) {
    std::uint64_t h = 1469598103934665603ull;
    for (const Interval& iv : set) {
      h = (h ^ iv.lo) * 1099511628211ull;
      h = (h ^ iv.hi) * 1099511628211ull;
    }
    auto [it, inserted] = heads_.try_emplace(h, kNone);
    for (std::uint32_t id = it->second; id != kNone; id = entries_[id].next) {
      const Entry& e = entries_[id];
      if (e.length == set.size() &&
          std::equal(
              set.begin(), set.end(), pool_.begin() + static_cast<std::ptrdiff_t>(e.offset),
              [](const Interval& a, const Interval& b) { return a.lo == b.lo && a.hi == b.hi; })) {
        return id;
      }
    }
    const auto id = static_cast<std::uint32_t>(entries_.size());
    entries_.push_back({pool_.size(), set.size(), it->second});
    pool_.insert(pool_.end(), set.begin(), set.end());
    it->second = id;
    return id;
  }

  std::uint32_t n_;
  std::vector<Interval> pool_;
  std::vector<Entry> entries_;
  std::unordered_map<std::uint64_t, std::uint32_t> heads_;
  std::vector<Interval> x_, y_, merged_;
};

std::string where(int rank, std::size_t channel, std::size_t step, StepKind kind) {
  std::ostringstream os;
  os << "rank " << rank << " channel " << channel << " step " << step << " (" << name(kind) << ")";
  return os.str();
}

// Checks operands, peers and block ranges without running anything.
class StaticChecker {
 public:
  explicit StaticChecker(const Schedule& s) : s_(s) {}

  bool check(VerifyReport& report) {
    if (s_.nranks < 1 || s_.blocksPerSegment < 1 || s_.partsPerBlock < 1) {
      return fail(report,
                  "schedule has nranks, blocksPerSegment and partsPerBlock that must be >= 1");
    }
    for (std::size_t c = 0; c < s_.channels.size(); ++c) {
      const ChannelSchedule& ch = s_.channels[c];
      if (ch.part >= s_.partsPerBlock)
        return fail(report, "channel " + std::to_string(c) + " part out of range");
      if (ch.ranks.size() != static_cast<std::size_t>(s_.nranks)) {
        return fail(report, "channel " + std::to_string(c) + " does not have one program per rank");
      }
      for (int r = 0; r < s_.nranks; ++r) {
        const Program& p = s_.program(c, r);
        for (std::size_t i = 0; i < p.steps().size(); ++i) {
          std::string why = checkStep(p, p.steps()[i], r);
          if (!why.empty()) return fail(report, where(r, c, i, p.steps()[i].kind) + ": " + why);
        }
      }
    }
    return true;
  }

 private:
  static bool fail(VerifyReport& report, std::string message) {
    report.fault = Fault::invalidStep;
    report.message = std::move(message);
    return false;
  }

  std::string checkSpans(std::span<const Span> spans, bool isDst) const {
    for (const Span& sp : spans) {
      if (sp.count == 0) return "empty span";
      if (sp.count > 1 && sp.stride == 0) return "span with stride 0";
      const std::uint32_t limit = sp.buf == Buf::input    ? s_.inputBlocks()
                                  : sp.buf == Buf::output ? s_.outputBlocks()
                                                          : s_.scratchBlocks;
      const std::int64_t last = std::int64_t{sp.first} + std::int64_t{sp.count - 1} * sp.stride;
      const std::int64_t lo = std::min<std::int64_t>(sp.first, last);
      const std::int64_t hi = std::max<std::int64_t>(sp.first, last);
      if (lo < 0 || hi >= limit) {
        return std::string(name(sp.buf)) + " block " + std::to_string(lo < 0 ? lo : hi) +
               " out of range (" + std::to_string(limit) + " blocks)";
      }
      if (isDst && sp.buf == Buf::input) return "writes the input buffer";
    }
    return {};
  }

  std::string checkPeers(std::span<const int> peers, int rank) const {
    for (int q : peers) {
      if (q < 0 || q >= s_.nranks) return "peer " + std::to_string(q) + " out of range";
      if (q == rank) return "peer is the rank itself (use copy)";
    }
    sorted_.assign(peers.begin(), peers.end());
    std::sort(sorted_.begin(), sorted_.end());
    const auto dup = std::adjacent_find(sorted_.begin(), sorted_.end());
    if (dup != sorted_.end()) return "peer " + std::to_string(*dup) + " listed twice";
    return {};
  }

  std::string checkStep(const Program& p, const Step& st, int rank) const {
    const StepTraits t = traits(st.kind);
    if (t.recvs != (st.nrecv > 0))
      return t.recvs ? "no recv peer" : "recv peers on a step that does not receive";
    if (t.sends != (st.nsend > 0))
      return t.sends ? "no send peer" : "send peers on a step that does not send";
    if (t.readsSrc != (st.nsrc > 0))
      return t.readsSrc ? "no source blocks" : "source blocks on a step that reads none";
    if (t.writesDst != (st.ndst > 0))
      return t.writesDst ? "no destination blocks"
                         : "destination blocks on a step that writes none";
    if (t.recvs && !t.reduces && st.nrecv != 1) return "copies from more than one recv peer";
    if (auto why = checkSpans(p.src(st), false); !why.empty()) return why;
    if (auto why = checkSpans(p.dst(st), true); !why.empty()) return why;
    if (auto why = checkPeers(p.recvPeers(st), rank); !why.empty()) return why;
    if (auto why = checkPeers(p.sendPeers(st), rank); !why.empty()) return why;
    if (st.nsrc > 0 && st.ndst > 0) {
      std::uint32_t a = 0, b = 0;
      for (const Span& sp : p.src(st)) a += sp.count;
      for (const Span& sp : p.dst(st)) b += sp.count;
      if (a != b)
        return "source has " + std::to_string(a) + " blocks, destination " + std::to_string(b);
    }
    return {};
  }

  const Schedule& s_;
  mutable std::vector<int> sorted_;
};

// Runs the programs of one part (the channels that move that part of every block).
class Simulator {
 public:
  Simulator(const Schedule& s, const VerifyOptions& opt, std::uint32_t part, ValueTable& values)
      : s_(s), opt_(opt), values_(values), n_(static_cast<std::uint32_t>(s.nranks)) {
    inBlocks_ = s.inputBlocks();
    outBlocks_ = s.outputBlocks();
    perSlice_ = inBlocks_ + outBlocks_ + s.scratchBlocks;
    perRank_ = perSlice_ * static_cast<std::uint32_t>(opt.slices);
    store_.assign(std::size_t{perRank_} * n_, ValueTable::kUndefined);
    for (std::size_t c = 0; c < s.channels.size(); ++c) {
      if (s.channels[c].part != part) continue;
      for (int r = 0; r < s.nranks; ++r) {
        if (!s.program(c, r).steps().empty()) procs_.push_back({c, r, 0, 0, 0});
      }
    }
    numberConnections();
    for (std::uint32_t r = 0; r < n_; ++r) {
      for (std::uint32_t b = 0; b < inBlocks_; ++b) {
        const Value v = values_.singleton(b, r);
        for (int sl = 0; sl < opt.slices; ++sl) store_[slot(r, Buf::input, b, sl)] = v;
      }
    }
  }

  bool run(VerifyReport& report) {
    std::vector<std::size_t> ready(procs_.size());
    for (std::size_t i = 0; i < procs_.size(); ++i) ready[i] = procs_.size() - 1 - i;
    while (!ready.empty()) {
      const std::size_t pid = ready.back();
      ready.pop_back();
      if (!advance(pid, ready, report)) return false;
    }
    return finish(report);
  }

 private:
  struct Proc {
    std::size_t channel;
    int rank;
    std::uint64_t pc;  // slice * steps + step
    // Peers of the current step already seen ready. Only this process takes from its inbound
    // FIFOs and puts into its outbound ones, so a peer once ready stays ready until the step runs.
    std::uint32_t recvsReady = 0;
    std::uint32_t sendsReady = 0;
  };
  struct Message {
    std::size_t senderStep = 0;
    std::vector<Value> values;
  };
  // A bounded FIFO whose message buffers are reused, so steady state allocates nothing.
  struct Conn {
    std::uint64_t key = 0;  // (channel * n + from) * n + to
    std::vector<Message> slots;
    std::size_t head = 0, count = 0;
    std::size_t recvWaiter = kNobody;
    std::size_t sendWaiter = kNobody;

    bool empty() const { return count == 0; }
    const Message& front() const { return slots[head]; }
    void pop() {
      head = (head + 1) % slots.size();
      --count;
    }
    Message& push() {
      ++count;
      return slots[(head + count - 1) % slots.size()];
    }
  };
  static constexpr std::size_t kNobody = std::numeric_limits<std::size_t>::max();

  std::size_t slot(std::uint32_t r, Buf buf, std::uint32_t b, int slice) const {
    std::uint32_t local = 0;
    switch (buf) {
      case Buf::input:
        local = aliasInput(r, b);
        break;
      case Buf::output:
        local = inBlocks_ + b;
        break;
      case Buf::scratch:
        local = inBlocks_ + outBlocks_ + b;
        break;
    }
    return std::size_t{r} * perRank_ + std::size_t{perSlice_} * static_cast<std::uint32_t>(slice) +
           local;
  }

  // Where input block b lives: in place, inside the output buffer as the collective defines.
  std::uint32_t aliasInput(std::uint32_t r, std::uint32_t b) const {
    if (!opt_.inPlace) return b;
    const std::uint32_t bps = s_.blocksPerSegment;
    switch (s_.coll) {
      case Collective::allGather:
        return inBlocks_ + r * bps + b;
      case Collective::reduceScatter:
        return (b >= r * bps && b < (r + 1) * bps) ? inBlocks_ + (b - r * bps) : b;
      default:
        return inBlocks_ + b;
    }
  }

  std::uint64_t connKey(std::size_t channel, int from, int to) const {
    return (std::uint64_t{channel} * n_ + static_cast<std::uint32_t>(from)) * n_ +
           static_cast<std::uint32_t>(to);
  }

  // Gives every (channel, sender, receiver) pair a dense id once, so running a step indexes
  // vectors instead of hashing.
  void numberConnections() {
    std::unordered_map<std::uint64_t, std::uint32_t> ids;
    auto idOf = [&](std::uint64_t key) {
      auto [it, inserted] = ids.try_emplace(key, static_cast<std::uint32_t>(conns_.size()));
      if (inserted) {
        conns_.emplace_back();
        conns_.back().key = key;
        conns_.back().slots.resize(static_cast<std::size_t>(opt_.capacity));
      }
      return it->second;
    };
    connIds_.resize(procs_.size());
    for (std::size_t pid = 0; pid < procs_.size(); ++pid) {
      const Proc& pr = procs_[pid];
      const Program& prog = s_.program(pr.channel, pr.rank);
      std::vector<std::uint32_t>& table = connIds_[pid];
      table.resize(prog.peerPoolSize());
      for (const Step& st : prog.steps()) {
        const auto recvs = prog.recvPeers(st);
        for (std::size_t k = 0; k < recvs.size(); ++k) {
          table[st.peerBegin + k] = idOf(connKey(pr.channel, recvs[k], pr.rank));
        }
        const auto sends = prog.sendPeers(st);
        for (std::size_t k = 0; k < sends.size(); ++k) {
          table[st.peerBegin + st.nrecv + k] = idOf(connKey(pr.channel, pr.rank, sends[k]));
        }
      }
    }
  }

  Conn& recvConn(std::size_t pid, const Step& st, std::size_t k) {
    return conns_[connIds_[pid][st.peerBegin + k]];
  }
  Conn& sendConn(std::size_t pid, const Step& st, std::size_t k) {
    return conns_[connIds_[pid][st.peerBegin + st.nrecv + k]];
  }

  static void wake(std::size_t& waiter, std::vector<std::size_t>& ready) {
    if (waiter != kNobody) {
      ready.push_back(waiter);
      waiter = kNobody;
    }
  }

  bool fault(VerifyReport& report, Fault f, std::string message) {
    report.fault = f;
    report.message = std::move(message);
    return false;
  }

  // Runs process pid until it blocks or ends. Returns false on a fault.
  bool advance(std::size_t pid, std::vector<std::size_t>& ready, VerifyReport& report) {
    Proc& pr = procs_[pid];
    const Program& prog = s_.program(pr.channel, pr.rank);
    const std::size_t nsteps = prog.steps().size();
    const std::uint64_t total = std::uint64_t{nsteps} * static_cast<std::uint32_t>(opt_.slices);
    const auto r = static_cast<std::uint32_t>(pr.rank);
    while (pr.pc < total) {
      const std::size_t si = pr.pc % nsteps;
      const int slice = static_cast<int>(pr.pc / nsteps);
      const Step& st = prog.steps()[si];
      const StepTraits t = traits(st.kind);
      for (; pr.recvsReady < st.nrecv; ++pr.recvsReady) {
        Conn& c = recvConn(pid, st, pr.recvsReady);
        if (c.empty()) {
          c.recvWaiter = pid;
          return true;
        }
      }
      for (; pr.sendsReady < st.nsend; ++pr.sendsReady) {
        Conn& c = sendConn(pid, st, pr.sendsReady);
        if (c.count == c.slots.size()) {
          c.sendWaiter = pid;
          return true;
        }
      }
      pr.recvsReady = pr.sendsReady = 0;
      auto here = [&] { return where(pr.rank, pr.channel, si, st.kind); };
      const std::uint32_t nb = prog.blocks(st);
      vals_.assign(nb, ValueTable::kUndefined);
      if (t.readsSrc) {
        std::uint32_t k = 0;
        for (const Span& sp : prog.src(st)) {
          for (std::uint32_t i = 0; i < sp.count; ++i, ++k) {
            vals_[k] = store_[slot(r, sp.buf, sp.at(i), slice)];
            if (vals_[k] == ValueTable::kUndefined) {
              return fault(report, Fault::undefinedRead,
                           here() + " reads " + std::string(name(sp.buf)) + " block " +
                               std::to_string(sp.at(i)) + " before anything was written there");
            }
          }
        }
      }
      for (std::size_t k = 0; k < st.nrecv; ++k) {
        const int q = prog.recvPeers(st)[k];
        Conn& c = recvConn(pid, st, k);
        const Message& msg = c.front();
        if (msg.values.size() != nb) {
          return fault(report, Fault::sizeMismatch,
                       here() + " expects " + std::to_string(nb) + " blocks from rank " +
                           std::to_string(q) + ", whose step " + std::to_string(msg.senderStep) +
                           " sent " + std::to_string(msg.values.size()));
        }
        for (std::uint32_t i = 0; i < nb; ++i) {
          if (t.reduces) {
            vals_[i] = values_.unite(vals_[i], msg.values[i]);
            if (vals_[i] == ValueTable::kOverlap) {
              return fault(report, Fault::doubleCount,
                           here() + " reduces data from rank " + std::to_string(q) +
                               " that already holds some of the same contributions");
            }
          } else {
            vals_[i] = msg.values[i];
          }
        }
        c.pop();
        wake(c.sendWaiter, ready);
      }
      if (st.kind == StepKind::reduceLocal) {
        std::uint32_t k = 0;
        for (const Span& sp : prog.dst(st)) {
          for (std::uint32_t i = 0; i < sp.count; ++i, ++k) {
            const Value d = store_[slot(r, sp.buf, sp.at(i), slice)];
            if (d == ValueTable::kUndefined) {
              return fault(report, Fault::undefinedRead,
                           here() + " accumulates into " + std::string(name(sp.buf)) + " block " +
                               std::to_string(sp.at(i)) + " that was never written");
            }
            vals_[k] = values_.unite(d, vals_[k]);
            if (vals_[k] == ValueTable::kOverlap) {
              return fault(report, Fault::doubleCount,
                           here() + " adds contributions that " + std::string(name(sp.buf)) +
                               " block " + std::to_string(sp.at(i)) + " already holds");
            }
          }
        }
      }
      if (t.writesDst) {
        std::uint32_t k = 0;
        for (const Span& sp : prog.dst(st)) {
          if (s_.coll == Collective::reduce && sp.buf == Buf::output && pr.rank != s_.root) {
            return fault(report, Fault::forbiddenWrite,
                         here() + " writes the output buffer of a non-root rank of reduce");
          }
          for (std::uint32_t i = 0; i < sp.count; ++i, ++k) {
            store_[slot(r, sp.buf, sp.at(i), slice)] = vals_[k];
          }
        }
      }
      for (std::size_t k = 0; k < st.nsend; ++k) {
        Conn& c = sendConn(pid, st, k);
        Message& m = c.push();
        m.senderStep = si;
        m.values.assign(vals_.begin(), vals_.end());
        wake(c.recvWaiter, ready);
      }
      ++pr.pc;
    }
    return true;
  }

  bool finish(VerifyReport& report) {
    std::vector<std::string> blocked;
    for (std::size_t pid = 0; pid < procs_.size(); ++pid) {
      const Proc& pr = procs_[pid];
      const Program& prog = s_.program(pr.channel, pr.rank);
      const std::size_t nsteps = prog.steps().size();
      if (pr.pc >= nsteps * static_cast<std::uint32_t>(opt_.slices)) continue;
      const Step& st = prog.steps()[pr.pc % nsteps];
      std::string waits;
      for (std::size_t k = 0; k < st.nrecv; ++k) {
        if (recvConn(pid, st, k).empty()) {
          waits = "waits for a message from rank " + std::to_string(prog.recvPeers(st)[k]);
          break;
        }
      }
      if (waits.empty()) {
        for (std::size_t k = 0; k < st.nsend; ++k) {
          const Conn& c = sendConn(pid, st, k);
          if (c.count == c.slots.size()) {
            waits = "waits for room to send to rank " + std::to_string(prog.sendPeers(st)[k]);
            break;
          }
        }
      }
      blocked.push_back(where(pr.rank, pr.channel, pr.pc % nsteps, st.kind) + " " + waits);
    }
    if (!blocked.empty()) {
      std::string msg = std::to_string(blocked.size()) + " program(s) blocked: ";
      for (std::size_t i = 0; i < blocked.size() && i < 3; ++i) msg += (i ? "; " : "") + blocked[i];
      return fault(report, Fault::deadlock, msg);
    }
    for (const Conn& c : conns_) {
      if (c.empty()) continue;
      const std::uint64_t to = c.key % n_, from = (c.key / n_) % n_, channel = c.key / n_ / n_;
      return fault(report, Fault::unmatchedSend,
                   "rank " + std::to_string(from) + " channel " + std::to_string(channel) +
                       " step " + std::to_string(c.front().senderStep) +
                       " sent a message to rank " + std::to_string(to) +
                       " that was never received");
    }
    return checkOutputs(report);
  }

  Value expected(std::uint32_t r, std::uint32_t j) {
    const std::uint32_t bps = s_.blocksPerSegment;
    const auto root = static_cast<std::uint32_t>(s_.root);
    switch (s_.coll) {
      case Collective::allReduce:
      case Collective::reduce:
        return values_.wholeBlock(j);
      case Collective::broadcast:
        return values_.singleton(j, root);
      case Collective::allGather:
        return values_.singleton(j % bps, j / bps);
      case Collective::reduceScatter:
        return values_.wholeBlock(std::uint64_t{r} * bps + j);
      case Collective::allToAll:
      case Collective::allToAllv:
        return values_.singleton(std::uint64_t{r} * bps + j % bps, j / bps);
      case Collective::sendRecv:
        return values_.singleton(j, (r + n_ - 1) % n_);
    }
    return ValueTable::kUndefined;
  }

  bool checkOutputs(VerifyReport& report) {
    for (std::uint32_t r = 0; r < n_; ++r) {
      if (s_.coll == Collective::reduce && r != static_cast<std::uint32_t>(s_.root)) continue;
      for (std::uint32_t j = 0; j < outBlocks_; ++j) {
        const Value want = expected(r, j);
        for (int sl = 0; sl < opt_.slices; ++sl) {
          const Value got = store_[slot(r, Buf::output, j, sl)];
          if (got == want) continue;
          std::ostringstream os;
          os << "rank " << r << " output block " << j << " (pass " << sl << ") holds "
             << (got == ValueTable::kUndefined ? std::string("nothing") : values_.render(got))
             << ", expected " << values_.render(want);
          return fault(report, Fault::wrongResult, os.str());
        }
      }
    }
    return true;
  }

  const Schedule& s_;
  const VerifyOptions& opt_;
  ValueTable& values_;
  std::uint32_t n_;
  std::uint32_t inBlocks_ = 0, outBlocks_ = 0, perSlice_ = 0, perRank_ = 0;
  std::vector<Value> store_;
  std::vector<Proc> procs_;
  std::vector<Conn> conns_;
  std::vector<std::vector<std::uint32_t>> connIds_;  // per process, parallel to its peer pool
  std::vector<Value> vals_;
};

void measure(const Schedule& s, VerifyReport& report) {
  const double unit = 1.0 / (double(s.messageBlocks()) * s.partsPerBlock);
  for (int r = 0; r < s.nranks; ++r) {
    std::uint32_t steps = 0, messages = 0;
    std::uint64_t blocks = 0, touched = 0, folded = 0;
    for (std::size_t c = 0; c < s.channels.size(); ++c) {
      const Program& p = s.program(c, r);
      steps += static_cast<std::uint32_t>(p.steps().size());
      for (const Step& st : p.steps()) {
        const std::uint32_t nb = p.blocks(st);
        const StepTraits t = traits(st.kind);
        const std::uint64_t reads = (t.readsSrc ? 1u : 0u) + (t.recvs ? st.nrecv : 0u) +
                                    (st.kind == StepKind::reduceLocal ? 1u : 0u);
        const std::uint64_t writes = (t.writesDst ? 1u : 0u) + (t.sends ? st.nsend : 0u);
        touched += (reads + writes) * nb;
        if (t.reduces && reads > 1) folded += (reads - 1) * nb;
        if (st.nsend == 0) continue;
        messages += st.nsend;
        blocks += std::uint64_t{st.nsend} * nb;
        report.maxMessageBlocks = std::max(report.maxMessageBlocks, nb);
      }
    }
    const double bytes = double(blocks) * unit;
    report.maxSteps = std::max(report.maxSteps, steps);
    report.maxMessages = std::max(report.maxMessages, messages);
    report.maxBytes = std::max(report.maxBytes, bytes);
    report.totalBytes += bytes;
    report.maxMemory = std::max(report.maxMemory, double(touched) * unit);
    report.totalMemory += double(touched) * unit;
    report.maxReduced = std::max(report.maxReduced, double(folded) * unit);
  }
}

}  // namespace

VerifyReport verify(const Schedule& schedule, const VerifyOptions& options) {
  VerifyReport report;
  if (options.slices < 1 || options.capacity < 1) {
    report.fault = Fault::invalidStep;
    report.message = "slices and capacity must be >= 1";
    return report;
  }
  if (!StaticChecker(schedule).check(report)) return report;
  measure(schedule, report);
  for (std::uint32_t part = 0; part < schedule.partsPerBlock; ++part) {
    ValueTable values(static_cast<std::uint32_t>(schedule.nranks));
    Simulator sim(schedule, options, part, values);
    if (!sim.run(report)) return report;
  }
  return report;
}

}  // namespace weft::algo
