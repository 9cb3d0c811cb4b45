// The schedule IR: an algorithm as data.
//
// For every channel and rank, an ordered list of Steps over logical blocks of three buffers
// (the user's input and output, and a scratch area). A Step names its peers and block lists,
// never bytes: the executor cuts each buffer into segments (one per rank for the gathered or
// scattered side, see segments()), each segment into blocksPerSegment blocks, each block into
// partsPerBlock parts (one per channel copy), and streams a channel's whole step list once per
// slice of its part. Schedules are independent of message size, so they are built once per
// (collective, nranks, algorithm, parameters) and cached.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include "weft/types.hpp"

namespace weft::algo {

enum class Buf : std::uint8_t { input, output, scratch };

// Blocks first, first + stride, ..., count of them, all in one buffer. The stride may be negative
// (a rotation read backwards).
struct Span {
  Buf buf = Buf::input;
  std::uint32_t first = 0;
  std::uint32_t count = 0;
  std::int32_t stride = 1;

  std::uint32_t at(std::uint32_t i) const {
    return static_cast<std::uint32_t>(static_cast<std::int64_t>(first) +
                                      static_cast<std::int64_t>(i) * stride);
  }
  std::uint32_t last() const { return at(count - 1); }
  bool operator==(const Span&) const = default;
};

// An ordered list of blocks. Adding blocks one at a time folds runs with a constant stride into
// one Span, so generators can think in single blocks and still emit compact steps.
class BlockList {
 public:
  BlockList() = default;
  BlockList(Buf buf, std::uint32_t block) { add(buf, block); }

  BlockList& add(Buf buf, std::uint32_t block);
  BlockList& addRange(Buf buf, std::uint32_t first, std::uint32_t count);
  BlockList& append(const BlockList& other);

  const std::vector<Span>& spans() const { return spans_; }
  std::uint32_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

 private:
  std::vector<Span> spans_;
  std::uint32_t size_ = 0;
};

// Blocks [first, first + count) of a buffer.
inline BlockList range(Buf buf, std::uint32_t first, std::uint32_t count) {
  return BlockList().addRange(buf, first, count);
}

// The primitives a kernel needs. "Reduce" combines the received data with the local source
// operand; "Copy" writes the result to the destination; "Send" forwards it to the send peers.
enum class StepKind : std::uint8_t {
  send,                // src -> send peers
  recv,                // recv peer -> dst
  recvReduceSend,      // src (+) recv peers -> send peers
  recvCopySend,        // recv peer -> dst and send peers
  recvReduceCopy,      // src (+) recv peers -> dst
  recvReduceCopySend,  // src (+) recv peers -> dst and send peers
  copy,                // src -> dst
  reduceLocal,         // dst (+) src -> dst
};
inline constexpr int kNumStepKinds = 8;

struct StepTraits {
  bool recvs;  // takes one message from each recv peer
  bool sends;  // puts one message to each send peer
  bool readsSrc;
  bool writesDst;
  bool reduces;
};

constexpr StepTraits traits(StepKind k) {
  switch (k) {
    case StepKind::send:
      return {false, true, true, false, false};
    case StepKind::recv:
      return {true, false, false, true, false};
    case StepKind::recvReduceSend:
      return {true, true, true, false, true};
    case StepKind::recvCopySend:
      return {true, true, false, true, false};
    case StepKind::recvReduceCopy:
      return {true, false, true, true, true};
    case StepKind::recvReduceCopySend:
      return {true, true, true, true, true};
    case StepKind::copy:
      return {false, false, true, true, false};
    case StepKind::reduceLocal:
      return {false, false, true, true, true};
  }
  return {};
}

std::string_view name(StepKind k);
std::string_view name(Buf b);

// Offsets into the owning Program's pools: steps stay small and flat (cheap to copy to a GPU).
struct Step {
  StepKind kind = StepKind::send;
  std::uint32_t peerBegin = 0;  // recv peers, then send peers
  std::uint32_t nrecv = 0;
  std::uint32_t nsend = 0;
  std::uint32_t srcBegin = 0;
  std::uint32_t nsrc = 0;
  std::uint32_t dstBegin = 0;
  std::uint32_t ndst = 0;
};

using Peers = std::vector<int>;

// One rank's steps on one channel.
class Program {
 public:
  const std::vector<Step>& steps() const { return steps_; }
  std::vector<Step>& mutableSteps() { return steps_; }  // for mutation tests and transforms
  std::span<const int> recvPeers(const Step& s) const {
    return {peers_.data() + s.peerBegin, s.nrecv};
  }
  std::span<const int> sendPeers(const Step& s) const {
    return {peers_.data() + s.peerBegin + s.nrecv, s.nsend};
  }
  std::span<int> mutableSendPeers(const Step& s) {
    return {peers_.data() + s.peerBegin + s.nrecv, s.nsend};
  }
  std::span<const Span> src(const Step& s) const { return {spans_.data() + s.srcBegin, s.nsrc}; }
  std::span<const Span> dst(const Step& s) const { return {spans_.data() + s.dstBegin, s.ndst}; }
  std::span<Span> mutableSrc(const Step& s) { return {spans_.data() + s.srcBegin, s.nsrc}; }
  std::span<Span> mutableDst(const Step& s) { return {spans_.data() + s.dstBegin, s.ndst}; }

  std::size_t peerPoolSize() const { return peers_.size(); }
  // The pools steps index into (what a device copy of the program carries).
  std::span<const int> peerPool() const { return peers_; }
  std::span<const Span> spanPool() const { return spans_; }

  // Number of blocks a step moves (its source's, or its destination's when it has no source).
  std::uint32_t blocks(const Step& s) const;

  void add(StepKind kind, const Peers& recvFrom, const Peers& sendTo, const BlockList& src,
           const BlockList& dst);

  void send(const BlockList& src, const Peers& to) { add(StepKind::send, {}, to, src, {}); }
  void recv(int from, const BlockList& dst) { add(StepKind::recv, {from}, {}, {}, dst); }
  void recvReduceSend(const Peers& from, const BlockList& src, const Peers& to) {
    add(StepKind::recvReduceSend, from, to, src, {});
  }
  void recvCopySend(int from, const BlockList& dst, const Peers& to) {
    add(StepKind::recvCopySend, {from}, to, {}, dst);
  }
  void recvReduceCopy(const Peers& from, const BlockList& src, const BlockList& dst) {
    add(StepKind::recvReduceCopy, from, {}, src, dst);
  }
  void recvReduceCopySend(const Peers& from, const BlockList& src, const BlockList& dst,
                          const Peers& to) {
    add(StepKind::recvReduceCopySend, from, to, src, dst);
  }
  void copy(const BlockList& src, const BlockList& dst) { add(StepKind::copy, {}, {}, src, dst); }
  void reduceLocal(const BlockList& src, const BlockList& dst) {
    add(StepKind::reduceLocal, {}, {}, src, dst);
  }

  // Inserts a copy of step i right after it (mutation tests).
  void duplicateStep(std::size_t i);

 private:
  std::uint32_t pushSpans(const BlockList& list);

  std::vector<Step> steps_;
  std::vector<int> peers_;
  std::vector<Span> spans_;
};

struct ChannelSchedule {
  std::uint32_t part = 0;      // which part of every block this channel moves
  std::vector<Program> ranks;  // indexed by rank
};

// How many segments each buffer has: one per rank on the gathered/scattered side.
struct Segments {
  std::uint32_t input = 1;
  std::uint32_t output = 1;
  // The side nccl-tests reports as the message size (the larger buffer).
  std::uint32_t message() const { return input > output ? input : output; }
};
Segments segments(Collective coll, int nranks);

struct Schedule {
  Collective coll = Collective::allReduce;
  int nranks = 1;
  int root = 0;
  std::string algorithm;
  std::uint32_t blocksPerSegment = 1;
  std::uint32_t scratchBlocks = 0;  // per rank, each the size of one block
  std::uint32_t partsPerBlock = 1;
  std::vector<ChannelSchedule> channels;

  std::uint32_t inputBlocks() const { return segments(coll, nranks).input * blocksPerSegment; }
  std::uint32_t outputBlocks() const { return segments(coll, nranks).output * blocksPerSegment; }
  // Blocks in one message-size worth of data (the unit of "bytes per rank").
  std::uint32_t messageBlocks() const {
    return segments(coll, nranks).message() * blocksPerSegment;
  }
  const Program& program(std::size_t channel, int rank) const {
    return channels[channel].ranks[static_cast<std::size_t>(rank)];
  }
  Program& program(std::size_t channel, int rank) {
    return channels[channel].ranks[static_cast<std::size_t>(rank)];
  }

  // A schedule with one channel per rank-program set, allocated and ready to fill.
  static Schedule make(Collective coll, int nranks, std::string algorithm,
                       std::uint32_t blocksPerSegment, std::uint32_t channels = 1);
};

// Splits every channel into `factor` channels, each moving one of `factor` parts of every block.
// Channels run in parallel; parts never interact, so correctness carries over unchanged.
Schedule splitChannels(const Schedule& s, std::uint32_t factor);

// A readable listing of one rank's steps ("  3 recvReduceSend from 2 src in[1] to 0").
std::string describe(const Schedule& s, int rank);

}  // namespace weft::algo
