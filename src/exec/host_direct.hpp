// The direct path on host memory: a collective with no FIFO and no schedule, for the calls large
// enough that the bytes moved, not the messages, decide the time, on one host.
//
// Ranks that are threads of one process read what they need straight from each other's buffers
// behind two or three barriers over the ranks' control pages. Before the first, each rank
// publishes its buffers' addresses; after it, each rank reads its peers':
//   all-reduce      each rank sums piece r of every rank's input into piece r of its output;
//                   barrier; each copies the other pieces from their owners' outputs (two-shot's
//                   bytes: (n-1)/n of the call in, as much out)
//   reduce-scatter  each rank sums block r of every rank's input into its output
//   all-gather      each rank copies every peer's input into its block of the output
//   all-to-all      each rank copies block r of every peer's input
// and a last barrier keeps every buffer its owner's until nobody reads it.
//
// Ranks in different processes cannot load from each other's buffers (process_vm_readv, which
// can, cost a system call and a page pinning per chunk: 1 MB all-reduces of 8 ranks spent 3.8x
// a plain-load version's time summing). Instead every rank's inbox ends in a stage, two halves
// that calls alternate between round by round; each round a rank copies the part of its input
// its peers need into a half, and the peers load it from there:
//   all-reduce      copy in; barrier; sum piece r of every stage into the output, and copy the
//                   sum into the stage's reduced part; barrier; copy the others' sums
//   reduce-scatter  copy in; barrier; sum block r of every stage
//   all-gather      copy in; barrier; copy every stage
//   all-to-all      copy in; barrier; copy block r of every stage
// A half is written again two rounds later, once every peer has passed the barrier of the round
// between, which it reaches only after its reads of the half: so one barrier a round is enough
// (two for all-reduce, whose sums are read after the second), and none at the end of a call.
//
// Unless every rank's buffers are weftHostAlloc memory (src/transport/host_alloc.hpp): each rank
// publishes where its input and output lie before a first barrier; when all do, each maps its
// peers' (once per allocation) and says whether it could before a second; when all could, the
// call loads from the peers' buffers as threads of one process do, and no byte goes through a
// stage.
//
// A rank whose input overlaps its output other than in the collective's in-place layout reads
// its input from a private copy, so its own writes cannot reach what it (or a peer) still reads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include <memory>

#include "src/transport/connection.hpp"
#include "src/transport/host_alloc.hpp"
#include "src/transport/shm.hpp"
#include "weft/types.hpp"

namespace weft::exec {

struct DirectCall {
  Collective coll = Collective::allReduce;
  const void* input = nullptr;
  void* output = nullptr;
  std::size_t count = 0;  // elements per segment, as the schedules count them
  DataType type = DataType::f32;
  RedOp op = RedOp::sum;  // avg reduces as sum; the caller divides
  int root = 0;
};

struct DirectGroup {
  int rank = 0, nranks = 1;
  std::vector<transport::ShmControl*> controls;  // by rank, this rank's included
  // Every rank's stage, mapped here (by rank; empty: the ranks are threads of one process and
  // load from each other's buffers), and its bytes.
  std::vector<std::byte*> stages;
  std::size_t stageBytes = 0;
  std::vector<int> pids;  // by rank, between processes: whose weftHostAlloc memory to map
  const transport::Waiter* waiter = nullptr;
  // Runs fn(0) .. fn(k - 1) on k of this rank's threads and returns when all have.
  std::function<void(std::size_t k, const std::function<void(std::size_t)>& fn)> parallel;
  std::size_t threads = 1;    // the most `parallel` runs at once
  bool fixedThreads = false;  // every call takes them all (else one a kBytesPerThread of it)
};

// Whether the direct path serves this collective: all-reduce, reduce-scatter, all-gather and
// all-to-all.
bool directServes(Collective coll);

// What a rank's direct calls carry from one to the next (the same counts on every rank between
// calls).
struct DirectState {
  std::uint64_t barriers = 0;      // barriers passed
  std::uint64_t rounds = 0;        // rounds through the stage (its half is rounds % 2)
  std::uint64_t calls = 0;         // calls between processes (their refs' slot is calls % 2)
  std::vector<std::byte> staging;  // a private copy of the input, where one is needed
  // Between processes: the peers' weftHostAlloc memory mapped here, and the calls that loaded
  // from it instead of going through the stages.
  std::unique_ptr<transport::PeerAllocations> peerAllocations =
      std::make_unique<transport::PeerAllocations>();
  std::uint64_t inPlaceCalls = 0;
};

// Runs one call; every rank of the group calls it for the same call.
Status runDirect(const DirectCall& call, const DirectGroup& group, DirectState& state);

}  // namespace weft::exec
