// The CpuExecutor runs a schedule on host memory: each channel walks its rank's step list once
// per slice, moving every step's blocks through the connections, so data pipelines around rings
// and down trees; channels run in parallel on their own threads.
//
// Geometry. A buffer is segments of `count` elements (docs/algorithms.md: one per rank on the
// gathered or scattered side). A segment is blocksPerSegment blocks of L = ceil(count / B)
// elements (the last ones shorter or empty), a block is partsPerBlock parts of ceil(L / P)
// elements (one per channel copy), and a part is cut into slices of S elements. A message
// carries each of its blocks' slice at a fixed stride of S elements, so sender and receiver agree
// on where every block sits whatever their blocks' true lengths; each side reads or writes only
// the elements its own block has. Scratch blocks are L elements long.
#pragma once

#include <atomic>
#include <cstddef>
#include <vector>

#include "algorithms/schedule.hpp"
#include "src/transport/connection.hpp"
#include "weft/types.hpp"

namespace weft::exec {

// Which steps may send references instead of bytes (single copy), by channel, rank and step:
// those whose every receiver only copies the message out, and whose named pieces the sender does
// not write again in the pass. See referenceSteps().
using ReferenceSteps = std::vector<std::vector<std::vector<std::uint8_t>>>;

// Which steps move their pieces as direct messages (Connection::direct) to and from the peers
// whose connections carry them, by channel, rank and step: kSendsDirect, kReceivesDirect, or
// both. See directSteps().
using DirectSteps = std::vector<std::vector<std::vector<std::uint8_t>>>;
inline constexpr std::uint8_t kSendsDirect = 1, kReceivesDirect = 2;

struct Buffers {
  const void* input = nullptr;
  void* output = nullptr;
  std::byte* scratch = nullptr;  // scratchBlocks * L elements
  std::size_t count = 0;         // elements per segment
  DataType type = DataType::f32;
  RedOp op = RedOp::sum;                        // avg reduces as sum; the caller divides
  std::size_t inputBytes = 0, outputBytes = 0;  // extents, to tell whether they overlap
  // Single copy for this call (large enough): steps marked in byReference name their pieces to
  // peers that can read this rank's memory.
  bool singleCopy = false;
  const ReferenceSteps* byReference = nullptr;
  // Direct messages where the connections carry them (null: none).
  const DirectSteps* direct = nullptr;
};

// Private copies of the pieces direct sends read where the input is also the output: chunks
// kept from call to call (reset() at each), so their pages stay mapped.
class StagingArena {
 public:
  void reset() { chunk_ = used_ = 0; }
  std::byte* take(std::size_t bytes);

 private:
  static constexpr std::size_t kChunkBytes = std::size_t{4} << 20;
  std::vector<std::vector<std::byte>> chunks_;
  std::size_t chunk_ = 0, used_ = 0;
};

// Where one channel's messages go: to(peer) for this rank's sends, from(peer) for its receives.
struct ChannelLinks {
  std::vector<transport::Connection*> to;    // by peer
  std::vector<transport::Connection*> from;  // by peer
  // Single copy: how to read each peer's memory, and whether each peer can read this rank's.
  const std::vector<transport::PeerMemory>* memory = nullptr;
  const std::vector<std::uint8_t>* readsMe = nullptr;
  // What reads the peers' pieces, counting and timing them (null: plain reads); and each peer's
  // refusal of references (null: none).
  transport::ReadRate* reads = nullptr;
  const std::vector<const std::atomic<std::uint32_t>*>* refuses = nullptr;
  // The channel's staging for direct sends (null: the call allocates its own).
  StagingArena* staging = nullptr;
};

struct Geometry {
  std::size_t blockElems = 0;  // L
  std::size_t partElems = 0;   // ceil(L / P)
  std::size_t sliceElems = 0;  // S
  std::size_t passes = 0;      // slices per part
  std::size_t scratchElems = 0;

  // `maxBlocks` is the most blocks any step of the schedule moves; a message of that many
  // slices must fit `messageBytes` (a FIFO slot, or the plan's chunk if smaller).
  static Geometry of(const algo::Schedule& s, std::size_t count, DataType type,
                     std::uint32_t maxBlocks, std::size_t messageBytes);
};

// The most blocks one step of the schedule moves (over every channel and rank).
std::uint32_t maxStepBlocks(const algo::Schedule& s);

// The steps of the schedule that may send references (see ReferenceSteps).
ReferenceSteps referenceSteps(const algo::Schedule& s);

// The messages that may go direct: those that move one block of the sender's buffers (not
// scratch) into one block of the receiver's at the same place in their segments (so both pieces
// have the same length, which both sides know), that the receiver only copies out, and whose
// piece the sender does not write again in the pass (it is read until the call's end). A step
// sends direct when all its messages may; one that receives direct and sends on does so only
// when its sends are direct too, since it then holds its own block's elements and no more.
DirectSteps directSteps(const algo::Schedule& s);

// Runs channel `channel` of `rank`'s program to completion.
Status runChannel(const algo::Schedule& s, std::size_t channel, int rank, const Geometry& g,
                  const Buffers& b, const ChannelLinks& links, const transport::Waiter& w);

}  // namespace weft::exec
