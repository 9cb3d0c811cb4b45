#include "src/exec/cpu_executor.hpp"

#include <algorithm>
#include <cstring>

#include "src/core/sizes.hpp"
#include "src/exec/host_reduce.hpp"

namespace weft::exec {
namespace {

using algo::Buf;
using algo::Span;
using algo::StepKind;

// A reference message holds one of these per block: where the sender's piece is, and its length.
struct Reference {
  std::uint64_t address;
  std::uint64_t elems;
};

bool copiesOut(StepKind k) {
  return k == StepKind::recv || k == StepKind::recvCopySend;
}

// One block's slice on this channel and pass: where it is and how many elements it really has.
struct Piece {
  std::byte* at = nullptr;
  std::size_t elems = 0;
};

class Runner {
 public:
  Runner(const algo::Schedule& s, std::size_t channel, int rank, const Geometry& g,
         const Buffers& b, const ChannelLinks& links, const transport::Waiter& w)
      : s_(s),
        p_(s.program(channel, rank)),
        part_(s.channels[channel].part),
        g_(g),
        b_(b),
        links_(links),
        w_(w),
        esize_(sizeOf(b.type)) {
    if (b.singleCopy && b.byReference != nullptr && links.readsMe != nullptr)
      byReference_ = &(*b.byReference)[channel][static_cast<std::size_t>(rank)];
    if (b.direct != nullptr) direct_ = &(*b.direct)[channel][static_cast<std::size_t>(rank)];
    staging_ = links.staging != nullptr ? links.staging : &ownStaging_;
    staging_->reset();
    const auto* in = static_cast<const std::byte*>(b.input);
    const auto* out = static_cast<const std::byte*>(b.output);
    inputStable_ =
        in == nullptr || out == nullptr || in + b.inputBytes <= out || out + b.outputBytes <= in;
  }

  Status run() {
    for (std::size_t pass = 0; pass < g_.passes; ++pass) {
      offset_ = part_ * g_.partElems + pass * g_.sliceElems;
      room_ = std::min(g_.sliceElems, g_.partElems - pass * g_.sliceElems);
      std::size_t index = 0;
      for (const algo::Step& st : p_.steps()) {
        if (Status x = step(st, index++); !x) return x;
      }
    }
    // The peers may still be reading pieces this rank named: they are the caller's once read.
    for (const auto& [c, peer] : named_) {
      transport::Connection* conn = c;
      if (Status x = w_.wait([conn] { return conn->drained(); },
                             "waiting for a single-copy read by", peer);
          !x)
        return x;
    }
    for (const std::byte* at : handedOff_) transport::takeOver(at);
    return {};
  }

 private:
  Piece piece(Buf buf, std::uint32_t block) const {
    if (buf == Buf::scratch) {
      const std::size_t len = offset_ < g_.blockElems ? g_.blockElems - offset_ : 0;
      const std::size_t n = std::min(len, room_);
      return {n == 0 ? nullptr : b_.scratch + (block * g_.blockElems + offset_) * esize_, n};
    }
    const std::size_t B = s_.blocksPerSegment;
    const std::size_t seg = block / B, kb = block % B;
    const std::size_t start = kb * g_.blockElems;
    const std::size_t blockLen = b_.count > start ? std::min(g_.blockElems, b_.count - start) : 0;
    const std::size_t len = offset_ < blockLen ? blockLen - offset_ : 0;
    const std::size_t n = std::min(len, room_);
    if (n == 0) return {};
    auto* base = buf == Buf::input ? static_cast<std::byte*>(const_cast<void*>(b_.input))
                                   : static_cast<std::byte*>(b_.output);
    return {base + (seg * b_.count + start + offset_) * esize_, n};
  }

  // Blocks of a span list, in order.
  static void blocksOf(std::span<const Span> spans,
                       std::vector<std::pair<Buf, std::uint32_t>>& out) {
    out.clear();
    for (const Span& sp : spans) {
      for (std::uint32_t i = 0; i < sp.count; ++i) out.emplace_back(sp.buf, sp.at(i));
    }
  }

  // Whether this step sends references: marked in the schedule, every receiver can read this
  // rank, and (when it names input) the input is not also the output.
  bool sendsReferences(const algo::Step& st, std::size_t index,
                       std::span<const int> sendPeers) const {
    if (byReference_ == nullptr || index >= byReference_->size() || (*byReference_)[index] == 0)
      return false;
    for (int q : sendPeers) {
      if ((*links_.readsMe)[static_cast<std::size_t>(q)] == 0) return false;
      if (links_.refuses != nullptr &&
          transport::refusesReferences((*links_.refuses)[static_cast<std::size_t>(q)]))
        return false;
    }
    if (!inputStable_) {
      for (const Span& sp : st.kind == StepKind::send ? p_.src(st) : p_.dst(st)) {
        if (sp.buf == Buf::input) return false;
      }
    }
    return true;
  }

  // Reads block j's piece named by a reference message from `peer` into `to`.
  Status readReference(int peer, const std::byte* msg, std::size_t j, const Piece& to) const {
    Reference r{};
    std::memcpy(&r, msg + j * sizeof(Reference), sizeof r);
    const std::size_t n = std::min<std::size_t>(to.elems, r.elems);
    if (n == 0) return {};
    const transport::PeerMemory& memory = (*links_.memory)[static_cast<std::size_t>(peer)];
    if (links_.reads == nullptr) return memory.read(to.at, r.address, n * esize_);
    return links_.reads->read(memory, to.at, r.address, n * esize_);
  }

  void writeReference(std::size_t j, const Piece& piece) {
    if (piece.at != nullptr) {
      transport::handOff(piece.at);
      handedOff_.push_back(piece.at);
    }
    const Reference r{reinterpret_cast<std::uintptr_t>(piece.at), piece.elems};
    for (std::byte* slot : slots_) std::memcpy(slot + j * sizeof(Reference), &r, sizeof r);
  }

  // Sends `piece` (of the step's one block, in `buf`) to every peer in directTo_, and has the
  // call's end wait for it to leave. From a private copy where it names input that is also
  // output, which a later step may write before the send has read it.
  Status sendDirect(const Piece& piece, Buf buf) {
    if (directTo_.empty() || piece.elems == 0) return {};
    const std::size_t bytes = piece.elems * esize_;
    const std::byte* from = piece.at;
    if (!inputStable_ && buf == Buf::input) {
      std::byte* copy = staging_->take(bytes);
      std::memcpy(copy, piece.at, bytes);
      from = copy;
    }
    for (int q : directTo_) {
      transport::Connection* c = links_.to[static_cast<std::size_t>(q)];
      if (Status x = c->sendDirect(from, bytes, w_); !x) return x;
      drainAtEnd(c, q);
    }
    return {};
  }

  // The call's end waits until `c` (to peer q) is drained: its peer has what it names.
  void drainAtEnd(transport::Connection* c, int q) {
    if (std::find_if(named_.begin(), named_.end(), [c](const auto& e) { return e.first == c; }) ==
        named_.end())
      named_.emplace_back(c, q);
  }

  Status receiveDirect(const Piece& piece) const {
    if (piece.elems == 0) return {};
    return links_.from[static_cast<std::size_t>(directFrom_)]->receiveDirect(
        piece.at, piece.elems * esize_, w_);
  }

  Status step(const algo::Step& st, std::size_t index) {
    const algo::StepTraits t = algo::traits(st.kind);
    const auto recvPeers = p_.recvPeers(st);
    const auto sendPeers = p_.sendPeers(st);
    msgs_.clear();
    slots_.clear();
    directTo_.clear();
    directFrom_ = -1;
    const std::uint8_t direct =
        direct_ != nullptr && index < direct_->size() ? (*direct_)[index] : 0;
    bool referenced = false;  // a received message is a reference
    for (int q : recvPeers) {
      transport::Connection* c = links_.from[static_cast<std::size_t>(q)];
      if ((direct & kReceivesDirect) != 0 && c->direct()) {
        directFrom_ = q;
        continue;
      }
      auto m = c->receive(w_);
      if (!m) return m.status();
      msgs_.push_back(m->data());
      referenced = referenced || c->isReference();
    }
    if (referenced && !copiesOut(st.kind)) {
      return internalError("rank " + std::to_string(w_.rank()) +
                           ": a single-copy reference reached a step that reduces it");
    }
    const bool names = t.sends && sendsReferences(st, index, sendPeers);
    for (int q : sendPeers) {
      transport::Connection* c = links_.to[static_cast<std::size_t>(q)];
      if ((direct & kSendsDirect) != 0 && c->direct()) {
        directTo_.push_back(q);
        continue;
      }
      auto slot = c->acquire(w_);
      if (!slot) return slot.status();
      slots_.push_back(*slot);
    }
    blocksOf(p_.src(st), src_);
    blocksOf(p_.dst(st), dst_);
    const std::size_t nblocks = std::max(src_.size(), dst_.size());
    const std::size_t stride = g_.sliceElems * esize_;
    const DataType type = b_.type;
    const RedOp op = b_.op == RedOp::avg ? RedOp::sum : b_.op;
    for (std::size_t j = 0; j < nblocks; ++j) {
      const Piece src = t.readsSrc ? piece(src_[j].first, src_[j].second) : Piece{};
      const Piece dst = t.writesDst ? piece(dst_[j].first, dst_[j].second) : Piece{};
      const std::size_t at = j * stride;
      switch (st.kind) {
        case StepKind::send:
          if (Status x = sendDirect(src, src_[j].first); !x) return x;
          if (names) {
            writeReference(j, src);
            break;
          }
          for (std::byte* slot : slots_) copy(slot + at, src.at, src.elems);
          break;
        case StepKind::recv:
          if (directFrom_ >= 0) {
            if (Status x = receiveDirect(dst); !x) return x;
            break;
          }
          if (referenced) {
            if (Status x = readReference(recvPeers[0], msgs_[0], j, dst); !x) return x;
            break;
          }
          copy(dst.at, msgs_[0] + at, dst.elems);
          break;
        case StepKind::recvCopySend:
          if (directFrom_ >= 0 || !directTo_.empty()) {
            // Every onward message is as long as this rank's block (directSteps): only its
            // elements go on, from the output.
            Status x = directFrom_ >= 0 ? receiveDirect(dst)
                       : referenced     ? readReference(recvPeers[0], msgs_[0], j, dst)
                                        : Status{};
            if (directFrom_ < 0 && !referenced) copy(dst.at, msgs_[0] + at, dst.elems);
            if (x.isOk()) x = sendDirect(dst, dst_[j].first);
            if (!x) return x;
            if (names) {
              writeReference(j, dst);
              break;
            }
            for (std::byte* slot : slots_) copy(slot + at, dst.at, dst.elems);
            break;
          }
          if (referenced && names) {
            if (Status x = readReference(recvPeers[0], msgs_[0], j, dst); !x) return x;
            writeReference(j, dst);
            break;
          }
          if (referenced) {
            // Bytes onward: read the named piece into the first slot, which then serves as the
            // message would have.
            const Piece whole{slots_[0] + at, g_.sliceElems};
            if (Status x = readReference(recvPeers[0], msgs_[0], j, whole); !x) return x;
            copy(dst.at, whole.at, dst.elems);
            for (std::size_t k = 1; k < slots_.size(); ++k)
              std::memcpy(slots_[k] + at, whole.at, stride);
            break;
          }
          copy(dst.at, msgs_[0] + at, dst.elems);
          if (names) {
            writeReference(j, dst);
            break;
          }
          // Forward the whole slice: a downstream block may be longer than this rank's.
          for (std::byte* slot : slots_) std::memcpy(slot + at, msgs_[0] + at, stride);
          break;
        case StepKind::recvReduceSend: {
          std::byte* acc = slots_[0] + at;
          combine(acc, src, at, type, op);
          for (std::size_t k = 1; k < slots_.size(); ++k) copy(slots_[k] + at, acc, src.elems);
          break;
        }
        case StepKind::recvReduceCopy:
        case StepKind::recvReduceCopySend: {
          const Piece both{dst.at, std::min(src.elems, dst.elems)};
          if (both.elems > 0) {
            reduce(both.at, src.at, msgs_[0] + at, both.elems, type, op);
            for (std::size_t k = 1; k < msgs_.size(); ++k)
              reduce(both.at, both.at, msgs_[k] + at, both.elems, type, op);
          }
          for (std::byte* slot : slots_) copy(slot + at, both.at, both.elems);
          break;
        }
        case StepKind::copy:
          if (dst.at != src.at) copy(dst.at, src.at, std::min(src.elems, dst.elems));
          break;
        case StepKind::reduceLocal: {
          const std::size_t n = std::min(src.elems, dst.elems);
          if (n > 0) reduce(dst.at, dst.at, src.at, n, type, op);
          break;
        }
      }
    }
    for (int q : sendPeers) {
      if (std::find(directTo_.begin(), directTo_.end(), q) != directTo_.end()) continue;
      transport::Connection* c = links_.to[static_cast<std::size_t>(q)];
      if (names) {
        c->postReference(nblocks * sizeof(Reference));
        drainAtEnd(c, q);
      } else {
        c->post(nblocks * stride);
      }
    }
    for (int q : recvPeers) {
      if (q != directFrom_) links_.from[static_cast<std::size_t>(q)]->release();
    }
    return {};
  }

  // acc = src (+) every received message, over src's elements.
  void combine(std::byte* acc, const Piece& src, std::size_t at, DataType type, RedOp op) {
    if (src.elems == 0) return;
    reduce(acc, src.at, msgs_[0] + at, src.elems, type, op);
    for (std::size_t k = 1; k < msgs_.size(); ++k)
      reduce(acc, acc, msgs_[k] + at, src.elems, type, op);
  }

  void copy(std::byte* to, const std::byte* from, std::size_t elems) const {
    if (elems > 0) std::memmove(to, from, elems * esize_);
  }

  const algo::Schedule& s_;
  const algo::Program& p_;
  std::size_t part_;
  const Geometry& g_;
  const Buffers& b_;
  const ChannelLinks& links_;
  const transport::Waiter& w_;
  std::size_t esize_;
  std::size_t offset_ = 0, room_ = 0;
  std::vector<const std::byte*> msgs_;
  std::vector<std::byte*> slots_;
  std::vector<std::pair<Buf, std::uint32_t>> src_, dst_;
  const std::vector<std::uint8_t>* byReference_ = nullptr;
  bool inputStable_ = true;  // the input does not overlap the output
  std::vector<std::pair<transport::Connection*, int>> named_;  // sent references this call
  std::vector<const std::byte*> handedOff_;  // the pieces they name (ThreadSanitizer's view)
  const std::vector<std::uint8_t>* direct_ = nullptr;  // this rank's DirectSteps
  std::vector<int> directTo_;                          // the step's peers sent to direct
  int directFrom_ = -1;                                // the step's peer received from direct
  StagingArena ownStaging_;                            // where the channel keeps none
  StagingArena* staging_ = nullptr;                    // private copies direct sends read
};

// Whether a step after step i of `p` writes a block that step i sends (its source, or what a
// step that receives and sends on wrote).
bool writtenLater(const algo::Program& p, std::size_t i) {
  const auto& steps = p.steps();
  const algo::Step& st = steps[i];
  const auto named = st.kind == StepKind::send ? p.src(st) : p.dst(st);
  for (std::size_t later = i + 1; later < steps.size(); ++later) {
    if (!algo::traits(steps[later].kind).writesDst) continue;
    for (const Span& w : p.dst(steps[later])) {
      for (const Span& nm : named) {
        if (w.buf != nm.buf) continue;
        for (std::uint32_t a = 0; a < w.count; ++a) {
          for (std::uint32_t b = 0; b < nm.count; ++b) {
            if (w.at(a) == nm.at(b)) return true;
          }
        }
      }
    }
  }
  return false;
}

}  // namespace

std::byte* StagingArena::take(std::size_t bytes) {
  bytes = roundUp(bytes, 64);
  while (chunk_ < chunks_.size() && used_ + bytes > chunks_[chunk_].size()) {
    ++chunk_;
    used_ = 0;
  }
  if (chunk_ == chunks_.size()) chunks_.emplace_back(std::max(bytes, kChunkBytes));
  std::byte* at = chunks_[chunk_].data() + used_;
  used_ += bytes;
  return at;
}

ReferenceSteps referenceSteps(const algo::Schedule& s) {
  ReferenceSteps out(s.channels.size());
  for (std::size_t c = 0; c < s.channels.size(); ++c) {
    const auto& ranks = s.channels[c].ranks;
    const std::size_t n = ranks.size();
    // kinds[q][r]: the kinds of q's steps that receive from r, in order (FIFO order per pair).
    std::vector<std::vector<std::vector<StepKind>>> kinds(n, std::vector<std::vector<StepKind>>(n));
    for (std::size_t q = 0; q < n; ++q) {
      for (const algo::Step& st : ranks[q].steps()) {
        for (int r : ranks[q].recvPeers(st))
          kinds[q][static_cast<std::size_t>(r)].push_back(st.kind);
      }
    }
    out[c].resize(n);
    for (std::size_t r = 0; r < n; ++r) {
      const algo::Program& p = ranks[r];
      const auto& steps = p.steps();
      out[c][r].assign(steps.size(), 0);
      std::vector<std::size_t> sent(n, 0);
      for (std::size_t i = 0; i < steps.size(); ++i) {
        const algo::Step& st = steps[i];
        const auto to = p.sendPeers(st);
        if (to.empty()) continue;
        bool ok = st.kind == StepKind::send || st.kind == StepKind::recvCopySend;
        for (int q : to) {
          const auto& list = kinds[static_cast<std::size_t>(q)][r];
          const std::size_t k = sent[static_cast<std::size_t>(q)]++;
          ok = ok && k < list.size() && copiesOut(list[k]);
        }
        // The named pieces must stay as they are for the rest of the pass.
        out[c][r][i] = ok && !writtenLater(p, i) ? 1 : 0;
      }
    }
  }
  return out;
}

DirectSteps directSteps(const algo::Schedule& s) {
  DirectSteps out(s.channels.size());
  const std::uint32_t B = std::max<std::uint32_t>(1, s.blocksPerSegment);
  for (std::size_t c = 0; c < s.channels.size(); ++c) {
    const auto& ranks = s.channels[c].ranks;
    const std::size_t n = ranks.size();
    // recvAt[q][r]: q's steps that receive from r, in order (FIFO order per pair).
    std::vector<std::vector<std::vector<std::size_t>>> recvAt(
        n, std::vector<std::vector<std::size_t>>(n));
    for (std::size_t q = 0; q < n; ++q) {
      const auto& steps = ranks[q].steps();
      for (std::size_t j = 0; j < steps.size(); ++j) {
        for (int r : ranks[q].recvPeers(steps[j]))
          recvAt[q][static_cast<std::size_t>(r)].push_back(j);
      }
    }
    // The one block of the caller's buffers a step names, as its place in a segment; -1: none.
    auto blockOf = [&](const algo::Program& p, const algo::Step& st, bool source) -> long {
      const auto spans = source ? p.src(st) : p.dst(st);
      if (p.blocks(st) != 1 || spans.empty() || spans[0].buf == Buf::scratch) return -1;
      return static_cast<long>(spans[0].at(0) % B);
    };
    // Each sending step's messages: (receiver, receiving step).
    struct Message {
      std::size_t r, i, q, j;
    };
    std::vector<Message> messages;
    std::vector<std::vector<std::uint8_t>> sends(n), receives(n);
    for (std::size_t r = 0; r < n; ++r) {
      const algo::Program& p = ranks[r];
      const auto& steps = p.steps();
      sends[r].assign(steps.size(), 0);
      receives[r].assign(steps.size(), 0);
      std::vector<std::size_t> sent(n, 0);
      for (std::size_t i = 0; i < steps.size(); ++i) {
        const algo::Step& st = steps[i];
        const auto to = p.sendPeers(st);
        if (to.empty()) continue;
        const bool forwards = st.kind == StepKind::recvCopySend;
        const long from = blockOf(p, st, st.kind == StepKind::send);
        bool ok = (st.kind == StepKind::send || forwards) && from >= 0 && !writtenLater(p, i);
        for (int q : to) {
          const auto Q = static_cast<std::size_t>(q);
          const auto& list = recvAt[Q][r];
          const std::size_t k = sent[Q]++;
          if (k >= list.size()) {
            ok = false;
            continue;
          }
          messages.push_back({r, i, Q, list[k]});
          const algo::Step& theirs = ranks[Q].steps()[list[k]];
          ok = ok && copiesOut(theirs.kind) && blockOf(ranks[Q], theirs, false) == from;
        }
        sends[r][i] = ok ? 1 : 0;
      }
    }
    // Receives follow their senders; a step that receives direct and sends on must send direct.
    for (bool changed = true; changed;) {
      changed = false;
      for (auto& row : receives) std::fill(row.begin(), row.end(), 0);
      for (const Message& m : messages) receives[m.q][m.j] |= sends[m.r][m.i];
      for (const Message& m : messages) {
        const algo::Step& st = ranks[m.q].steps()[m.j];
        if (sends[m.r][m.i] != 0 && st.kind == StepKind::recvCopySend && sends[m.q][m.j] == 0) {
          sends[m.r][m.i] = 0;
          changed = true;
        }
      }
    }
    out[c].resize(n);
    for (std::size_t r = 0; r < n; ++r) {
      out[c][r].resize(sends[r].size());
      for (std::size_t i = 0; i < sends[r].size(); ++i) {
        out[c][r][i] = static_cast<std::uint8_t>((sends[r][i] != 0 ? kSendsDirect : 0) |
                                                 (receives[r][i] != 0 ? kReceivesDirect : 0));
      }
    }
  }
  return out;
}

std::uint32_t maxStepBlocks(const algo::Schedule& s) {
  std::uint32_t most = 1;
  for (const algo::ChannelSchedule& ch : s.channels) {
    for (const algo::Program& p : ch.ranks) {
      for (const algo::Step& st : p.steps()) most = std::max(most, p.blocks(st));
    }
  }
  return most;
}

Geometry Geometry::of(const algo::Schedule& s, std::size_t count, DataType type,
                      std::uint32_t maxBlocks, std::size_t messageBytes) {
  Geometry g;
  // Blocks, parts and slices start on 16-byte multiples of their segment, so a segment that
  // starts on one keeps every piece aligned for 16-byte vectors (a cut at any element would
  // send the GPU kernel's copies to its scalar path: 4 ranks at 24 channels ran at 55 GB/s
  // where 32 channels ran at 188). Rounding up only empties trailing pieces; a slice rounds
  // down, so a message still fits its slot.
  const std::size_t v = std::max<std::size_t>(1, 16 / sizeOf(type));
  g.blockElems = roundUp(ceilDiv(count, s.blocksPerSegment), v);
  g.partElems = roundUp(ceilDiv(g.blockElems, s.partsPerBlock), v);
  const std::size_t perBlock = messageBytes / (std::size_t{maxBlocks} * sizeOf(type));
  const std::size_t fits = perBlock >= v ? perBlock / v * v : perBlock;
  g.sliceElems = std::max<std::size_t>(1, std::min(g.partElems, fits));
  g.passes = g.partElems == 0 ? 0 : ceilDiv(g.partElems, g.sliceElems);
  g.scratchElems = std::size_t{s.scratchBlocks} * g.blockElems;
  return g;
}

Status runChannel(const algo::Schedule& s, std::size_t channel, int rank, const Geometry& g,
                  const Buffers& b, const ChannelLinks& links, const transport::Waiter& w) {
  return Runner(s, channel, rank, g, b, links, w).run();
}

}  // namespace weft::exec
