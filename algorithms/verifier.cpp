#include "algorithms/verifier.hpp"

#include <algorithm>
#include <cstring>
#include <deque>
#include <limits>
#include <sstream>
#include <unordered_map>
#include <vector>

namespace weft::algo {

std::string_view name(Fault f) {
  switch (f) {
    case Fault::none: return "ok";
    case Fault::invalidStep: return "invalid step";
    case Fault::deadlock: return "deadlock";
    case Fault::unmatchedSend: return "unmatched send";
    case Fault::sizeMismatch: return "size mismatch";
    case Fault::undefinedRead: return "undefined read";
    case Fault::doubleCount: return "double count";
    case Fault::wrongResult: return "wrong result";
    case Fault::forbiddenWrite: return "forbidden write";
  }
  return "?";
}

namespace {

struct Interval {
  std::uint32_t lo, hi;  // [lo, hi)
};

// Contribution sets, interned: a value is a 32-bit id, equal sets have equal ids, and copies are
// free. Contribution ids are block * nranks + rank, so the partial sums of rings and trees
// (contiguous rank ranges of one block) stay one or two intervals.
class ValueTable {
 public:
  static constexpr std::uint32_t kUndefined = 0;
  static constexpr std::uint32_t kOverlap = std::numeric_limits<std::uint32_t>::max();

  ValueTable() { entries_.push_back({0, 0, kNone}); }

  std::uint32_t range(std::uint32_t lo, std::uint32_t hi) {
    const Interval iv{lo, hi};
    return intern(&iv, 1);
  }

  // Union of two defined sets, or kOverlap if they share a contribution.
  std::uint32_t unite(std::uint32_t a, std::uint32_t b) {
    const std::uint64_t key = a < b ? (std::uint64_t{a} << 32 | b) : (std::uint64_t{b} << 32 | a);
    if (auto it = memo_.find(key); it != memo_.end()) return it->second;
    const auto x = get(a);
    const auto y = get(b);
    merged_.clear();
    std::size_t i = 0, j = 0;
    bool overlap = false;
    while (i < x.size() || j < y.size()) {
      Interval next;
      if (j == y.size() || (i < x.size() && x[i].lo < y[j].lo)) {
        next = x[i++];
      } else {
        next = y[j++];
      }
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
    const std::uint32_t id = overlap ? kOverlap : intern(merged_.data(), merged_.size());
    memo_.emplace(key, id);
    return id;
  }

  std::span<const Interval> get(std::uint32_t id) const {
    const Entry& e = entries_[id];
    return {pool_.data() + e.offset, e.length};
  }

  // "{r0.in1, r2.in1..r5.in1}" with at most a few items.
  std::string render(std::span<const Interval> set, int nranks) const {
    std::ostringstream os;
    os << "{";
    std::size_t shown = 0;
    for (const Interval& iv : set) {
      if (shown++ == 4) {
        os << ", ...";
        break;
      }
      if (shown > 1) os << ", ";
      os << label(iv.lo, nranks);
      if (iv.hi - iv.lo > 1) os << ".." << label(iv.hi - 1, nranks);
    }
    os << "}";
    return os.str();
  }

  static std::string label(std::uint32_t c, int nranks) {
    const auto n = static_cast<std::uint32_t>(nranks);
    return "r" + std::to_string(c % n) + ".in" + std::to_string(c / n);
  }

 private:
  static constexpr std::uint32_t kNone = std::numeric_limits<std::uint32_t>::max();
  struct Entry {
    std::uint32_t offset, length, next;  // next: the following id with the same hash
  };

  std::uint32_t intern(const Interval* data, std::size_t n) {
    std::uint64_t h = 1469598103934665603ull;
    for (std::size_t i = 0; i < n; ++i) {
      h = (h ^ data[i].lo) * 1099511628211ull;
      h = (h ^ data[i].hi) * 1099511628211ull;
    }
    auto [it, inserted] = heads_.try_emplace(h, kNone);
    for (std::uint32_t id = it->second; id != kNone; id = entries_[id].next) {
      const Entry& e = entries_[id];
      if (e.length == n && std::memcmp(pool_.data() + e.offset, data, n * sizeof(Interval)) == 0) {
        return id;
      }
    }
    const auto id = static_cast<std::uint32_t>(entries_.size());
    entries_.push_back({static_cast<std::uint32_t>(pool_.size()), static_cast<std::uint32_t>(n),
                        it->second});
    pool_.insert(pool_.end(), data, data + n);
    it->second = id;
    return id;
  }

  std::vector<Interval> pool_;
  std::vector<Entry> entries_;
  std::unordered_map<std::uint64_t, std::uint32_t> heads_;
  std::unordered_map<std::uint64_t, std::uint32_t> memo_;
  std::vector<Interval> merged_;
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
      return fail(report, "schedule has nranks, blocksPerSegment and partsPerBlock that must be >= 1");
    }
    for (std::size_t c = 0; c < s_.channels.size(); ++c) {
      const ChannelSchedule& ch = s_.channels[c];
      if (ch.part >= s_.partsPerBlock) return fail(report, "channel " + std::to_string(c) + " part out of range");
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
    for (std::size_t i = 0; i < peers.size(); ++i) {
      const int q = peers[i];
      if (q < 0 || q >= s_.nranks) return "peer " + std::to_string(q) + " out of range";
      if (q == rank) return "peer is the rank itself (use copy)";
      for (std::size_t j = 0; j < i; ++j) {
        if (peers[j] == q) return "peer " + std::to_string(q) + " listed twice";
      }
    }
    return {};
  }

  std::string checkStep(const Program& p, const Step& st, int rank) const {
    const StepTraits t = traits(st.kind);
    if (t.recvs != (st.nrecv > 0)) return t.recvs ? "no recv peer" : "recv peers on a step that does not receive";
    if (t.sends != (st.nsend > 0)) return t.sends ? "no send peer" : "send peers on a step that does not send";
    if (t.readsSrc != (st.nsrc > 0)) return t.readsSrc ? "no source blocks" : "source blocks on a step that reads none";
    if (t.writesDst != (st.ndst > 0)) return t.writesDst ? "no destination blocks" : "destination blocks on a step that writes none";
    if (t.recvs && !t.reduces && st.nrecv != 1) return "copies from more than one recv peer";
    if (auto why = checkSpans(p.src(st), false); !why.empty()) return why;
    if (auto why = checkSpans(p.dst(st), true); !why.empty()) return why;
    if (auto why = checkPeers(p.recvPeers(st), rank); !why.empty()) return why;
    if (auto why = checkPeers(p.sendPeers(st), rank); !why.empty()) return why;
    if (st.nsrc > 0 && st.ndst > 0) {
      std::uint32_t a = 0, b = 0;
      for (const Span& sp : p.src(st)) a += sp.count;
      for (const Span& sp : p.dst(st)) b += sp.count;
      if (a != b) return "source has " + std::to_string(a) + " blocks, destination " + std::to_string(b);
    }
    return {};
  }

  const Schedule& s_;
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
        if (!s.program(c, r).steps().empty()) procs_.push_back({c, r, 0});
      }
    }
    for (std::uint32_t r = 0; r < n_; ++r) {
      for (std::uint32_t b = 0; b < inBlocks_; ++b) {
        const std::uint32_t v = values_.range(b * n_ + r, b * n_ + r + 1);
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
  };
  struct Message {
    std::size_t senderStep = 0;
    std::vector<std::uint32_t> values;
  };
  struct Conn {
    std::deque<Message> queue;
    std::size_t recvWaiter = kNobody;
    std::size_t sendWaiter = kNobody;
  };
  static constexpr std::size_t kNobody = std::numeric_limits<std::size_t>::max();

  std::size_t slot(std::uint32_t r, Buf buf, std::uint32_t b, int slice) const {
    std::uint32_t local = 0;
    switch (buf) {
      case Buf::input: local = aliasInput(r, b); break;
      case Buf::output: local = inBlocks_ + b; break;
      case Buf::scratch: local = inBlocks_ + outBlocks_ + b; break;
    }
    return std::size_t{r} * perRank_ + std::size_t{perSlice_} * static_cast<std::uint32_t>(slice) + local;
  }

  // Where input block b lives: in place, inside the output buffer as the collective defines.
  std::uint32_t aliasInput(std::uint32_t r, std::uint32_t b) const {
    if (!opt_.inPlace) return b;
    const std::uint32_t bps = s_.blocksPerSegment;
    switch (s_.coll) {
      case Collective::allGather: return inBlocks_ + r * bps + b;
      case Collective::reduceScatter:
        return (b >= r * bps && b < (r + 1) * bps) ? inBlocks_ + (b - r * bps) : b;
      default: return inBlocks_ + b;
    }
  }

  Conn& conn(std::size_t channel, int from, int to) {
    const std::uint64_t key = (std::uint64_t{channel} * n_ + static_cast<std::uint32_t>(from)) * n_ +
                              static_cast<std::uint32_t>(to);
    return conns_[key];
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
      for (int q : prog.recvPeers(st)) {
        Conn& c = conn(pr.channel, q, pr.rank);
        if (c.queue.empty()) {
          c.recvWaiter = pid;
          return true;
        }
      }
      for (int q : prog.sendPeers(st)) {
        Conn& c = conn(pr.channel, pr.rank, q);
        if (c.queue.size() >= static_cast<std::size_t>(opt_.capacity)) {
          c.sendWaiter = pid;
          return true;
        }
      }
      const std::string here = where(pr.rank, pr.channel, si, st.kind);
      const std::uint32_t nb = prog.blocks(st);
      vals_.assign(nb, ValueTable::kUndefined);
      if (t.readsSrc) {
        std::uint32_t k = 0;
        for (const Span& sp : prog.src(st)) {
          for (std::uint32_t i = 0; i < sp.count; ++i, ++k) {
            vals_[k] = store_[slot(r, sp.buf, sp.at(i), slice)];
            if (vals_[k] == ValueTable::kUndefined) {
              return fault(report, Fault::undefinedRead,
                           here + " reads " + std::string(name(sp.buf)) + " block " +
                               std::to_string(sp.at(i)) + " before anything was written there");
            }
          }
        }
      }
      for (int q : prog.recvPeers(st)) {
        Conn& c = conn(pr.channel, q, pr.rank);
        const Message& msg = c.queue.front();
        if (msg.values.size() != nb) {
          return fault(report, Fault::sizeMismatch,
                       here + " expects " + std::to_string(nb) + " blocks from rank " +
                           std::to_string(q) + ", whose step " + std::to_string(msg.senderStep) +
                           " sent " + std::to_string(msg.values.size()));
        }
        for (std::uint32_t k = 0; k < nb; ++k) {
          if (t.reduces) {
            vals_[k] = values_.unite(vals_[k], msg.values[k]);
            if (vals_[k] == ValueTable::kOverlap) {
              return fault(report, Fault::doubleCount,
                           here + " reduces data from rank " + std::to_string(q) +
                               " that already holds some of the same contributions");
            }
          } else {
            vals_[k] = msg.values[k];
          }
        }
        c.queue.pop_front();
        wake(c.sendWaiter, ready);
      }
      if (st.kind == StepKind::reduceLocal) {
        std::uint32_t k = 0;
        for (const Span& sp : prog.dst(st)) {
          for (std::uint32_t i = 0; i < sp.count; ++i, ++k) {
            const std::uint32_t d = store_[slot(r, sp.buf, sp.at(i), slice)];
            if (d == ValueTable::kUndefined) {
              return fault(report, Fault::undefinedRead,
                           here + " accumulates into " + std::string(name(sp.buf)) + " block " +
                               std::to_string(sp.at(i)) + " that was never written");
            }
            vals_[k] = values_.unite(d, vals_[k]);
            if (vals_[k] == ValueTable::kOverlap) {
              return fault(report, Fault::doubleCount,
                           here + " adds contributions that " + std::string(name(sp.buf)) +
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
                         here + " writes the output buffer of a non-root rank of reduce");
          }
          for (std::uint32_t i = 0; i < sp.count; ++i, ++k) {
            store_[slot(r, sp.buf, sp.at(i), slice)] = vals_[k];
          }
        }
      }
      for (int q : prog.sendPeers(st)) {
        Conn& c = conn(pr.channel, pr.rank, q);
        c.queue.push_back({si, vals_});
        wake(c.recvWaiter, ready);
      }
      ++pr.pc;
    }
    return true;
  }

  bool finish(VerifyReport& report) {
    std::vector<std::string> blocked;
    for (const Proc& pr : procs_) {
      const Program& prog = s_.program(pr.channel, pr.rank);
      const std::size_t nsteps = prog.steps().size();
      if (pr.pc >= nsteps * static_cast<std::uint32_t>(opt_.slices)) continue;
      const Step& st = prog.steps()[pr.pc % nsteps];
      std::string waits;
      for (int q : prog.recvPeers(st)) {
        if (conn(pr.channel, q, pr.rank).queue.empty()) {
          waits = "waits for a message from rank " + std::to_string(q);
          break;
        }
      }
      if (waits.empty()) {
        for (int q : prog.sendPeers(st)) {
          if (conn(pr.channel, pr.rank, q).queue.size() >= static_cast<std::size_t>(opt_.capacity)) {
            waits = "waits for room to send to rank " + std::to_string(q);
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
    for (auto& [key, c] : conns_) {
      if (c.queue.empty()) continue;
      const std::uint64_t to = key % n_, from = (key / n_) % n_, channel = key / n_ / n_;
      return fault(report, Fault::unmatchedSend,
                   "rank " + std::to_string(from) + " channel " + std::to_string(channel) +
                       " step " + std::to_string(c.queue.front().senderStep) + " sent a message to rank " +
                       std::to_string(to) + " that was never received");
    }
    return checkOutputs(report);
  }

  std::uint32_t expected(std::uint32_t r, std::uint32_t j) {
    const std::uint32_t bps = s_.blocksPerSegment;
    const auto root = static_cast<std::uint32_t>(s_.root);
    switch (s_.coll) {
      case Collective::allReduce:
      case Collective::reduce: return values_.range(j * n_, j * n_ + n_);
      case Collective::broadcast: return values_.range(j * n_ + root, j * n_ + root + 1);
      case Collective::allGather: {
        const std::uint32_t c = (j % bps) * n_ + j / bps;
        return values_.range(c, c + 1);
      }
      case Collective::reduceScatter: {
        const std::uint32_t b = r * bps + j;
        return values_.range(b * n_, b * n_ + n_);
      }
      case Collective::allToAll:
      case Collective::allToAllv: {
        const std::uint32_t c = (r * bps + j % bps) * n_ + j / bps;
        return values_.range(c, c + 1);
      }
      case Collective::sendRecv: {
        const std::uint32_t c = j * n_ + (r + n_ - 1) % n_;
        return values_.range(c, c + 1);
      }
    }
    return ValueTable::kUndefined;
  }

  bool checkOutputs(VerifyReport& report) {
    for (std::uint32_t r = 0; r < n_; ++r) {
      if (s_.coll == Collective::reduce && r != static_cast<std::uint32_t>(s_.root)) continue;
      for (std::uint32_t j = 0; j < outBlocks_; ++j) {
        const std::uint32_t want = expected(r, j);
        for (int sl = 0; sl < opt_.slices; ++sl) {
          const std::uint32_t got = store_[slot(r, Buf::output, j, sl)];
          if (got == want) continue;
          std::ostringstream os;
          os << "rank " << r << " output block " << j << " (pass " << sl << ") holds "
             << (got == ValueTable::kUndefined ? std::string("nothing")
                                               : values_.render(values_.get(got), s_.nranks))
             << ", expected " << values_.render(values_.get(want), s_.nranks);
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
  std::vector<std::uint32_t> store_;
  std::vector<Proc> procs_;
  std::unordered_map<std::uint64_t, Conn> conns_;
  std::vector<std::uint32_t> vals_;
};

void measure(const Schedule& s, VerifyReport& report) {
  const double unit = 1.0 / (double(s.messageBlocks()) * s.partsPerBlock);
  for (int r = 0; r < s.nranks; ++r) {
    std::uint32_t steps = 0, messages = 0;
    std::uint64_t blocks = 0;
    for (std::size_t c = 0; c < s.channels.size(); ++c) {
      const Program& p = s.program(c, r);
      steps += static_cast<std::uint32_t>(p.steps().size());
      for (const Step& st : p.steps()) {
        if (st.nsend == 0) continue;
        const std::uint32_t nb = p.blocks(st);
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
    report.totalSteps += steps;
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
    ValueTable values;
    Simulator sim(schedule, options, part, values);
    if (!sim.run(report)) return report;
  }
  return report;
}

}  // namespace weft::algo
