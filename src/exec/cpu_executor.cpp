#include "src/exec/cpu_executor.hpp"

#include <algorithm>
#include <cstring>

#include "src/exec/host_reduce.hpp"

namespace weft::exec {
namespace {

using algo::Buf;
using algo::Span;
using algo::StepKind;

std::size_t ceilDiv(std::size_t a, std::size_t b) {
  return b == 0 ? 0 : (a + b - 1) / b;
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
        esize_(sizeOf(b.type)) {}

  Status run() {
    for (std::size_t pass = 0; pass < g_.passes; ++pass) {
      offset_ = part_ * g_.partElems + pass * g_.sliceElems;
      room_ = std::min(g_.sliceElems, g_.partElems - pass * g_.sliceElems);
      for (const algo::Step& st : p_.steps()) {
        if (Status x = step(st); !x) return x;
      }
    }
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

  Status step(const algo::Step& st) {
    const algo::StepTraits t = algo::traits(st.kind);
    const auto recvPeers = p_.recvPeers(st);
    const auto sendPeers = p_.sendPeers(st);
    msgs_.clear();
    slots_.clear();
    for (int q : recvPeers) {
      auto m = links_.from[static_cast<std::size_t>(q)]->receive(w_);
      if (!m) return m.status();
      msgs_.push_back(m->data());
    }
    for (int q : sendPeers) {
      auto slot = links_.to[static_cast<std::size_t>(q)]->acquire(w_);
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
          for (std::byte* slot : slots_) copy(slot + at, src.at, src.elems);
          break;
        case StepKind::recv:
          copy(dst.at, msgs_[0] + at, dst.elems);
          break;
        case StepKind::recvCopySend:
          copy(dst.at, msgs_[0] + at, dst.elems);
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
    for (int q : sendPeers) links_.to[static_cast<std::size_t>(q)]->post(nblocks * stride);
    for (int q : recvPeers) links_.from[static_cast<std::size_t>(q)]->release();
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
};

}  // namespace

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
  g.blockElems = ceilDiv(count, s.blocksPerSegment);
  g.partElems = ceilDiv(g.blockElems, s.partsPerBlock);
  const std::size_t perBlock = messageBytes / (std::size_t{maxBlocks} * sizeOf(type));
  g.sliceElems = std::max<std::size_t>(1, std::min(g.partElems, perBlock));
  g.passes = g.partElems == 0 ? 0 : ceilDiv(g.partElems, g.sliceElems);
  g.scratchElems = std::size_t{s.scratchBlocks} * g.blockElems;
  return g;
}

Status runChannel(const algo::Schedule& s, std::size_t channel, int rank, const Geometry& g,
                  const Buffers& b, const ChannelLinks& links, const transport::Waiter& w) {
  return Runner(s, channel, rank, g, b, links, w).run();
}

}  // namespace weft::exec
