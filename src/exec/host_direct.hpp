// The direct path on host memory: a collective in which every rank reads what it needs straight
// from its peers' buffers (process_vm_readv between processes, plain loads between threads of
// one process), with no FIFO and no schedule. It serves the calls large enough that the bytes
// moved, not the messages, decide the time, on a host where every rank can read every other.
//
// Each call is two or three barriers over the ranks' control pages. Before the first, each rank
// publishes its buffers' addresses; after it, each rank reads its peers':
//   all-reduce      each rank sums piece r of every rank's input (in chunks read into a buffer
//                   that stays in cache) into piece r of its output; barrier; each reads the
//                   other pieces from their owners' outputs (two-shot's bytes: (n-1)/n of the
//                   call in, as much out)
//   reduce-scatter  each rank sums block r of every rank's input into its output
//   all-gather      each rank reads every peer's input into its block of the output
//   all-to-all      each rank reads block r of every peer's input
// and a last barrier keeps every buffer its owner's until nobody reads it. A rank whose input
// overlaps its output other than in the collective's in-place layout reads its input from a
// private copy, so its own writes cannot reach what its peers still read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "src/transport/connection.hpp"
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
  std::vector<transport::ShmControl*> controls;                // by rank, this rank's included
  const std::vector<transport::PeerMemory>* memory = nullptr;  // by rank
  const transport::Waiter* waiter = nullptr;
  // Runs fn(0) .. fn(k - 1) on k of this rank's threads and returns when all have.
  std::function<void(std::size_t k, const std::function<void(std::size_t)>& fn)> parallel;
  std::size_t threads = 1;  // the most `parallel` runs at once
};

// Whether the direct path serves this collective: all-reduce, all-gather and all-to-all, and
// reduce-scatter where the ranks are threads of one process. Measured on the H200 machine's
// host, 8 ranks of 2 cores, against the schedules through the FIFOs (docs/perf.md): between
// processes reduce-scatter's reads (a system call per chunk and peer) ran 15-45 % slower at
// 256 KB-1 MB and no faster above, and a broadcast, whose every rank reads the root, up to 4x
// slower; as threads (plain loads) every collective ran 1.15-2.5x faster.
bool directServes(Collective coll, bool threadsOfOneProcess);

// Runs one call; every rank of the group calls it for the same call. `barriers` counts the
// barriers this rank has passed (the same on every rank between calls); `staging` holds a
// private copy of the input where one is needed.
Status runDirect(const DirectCall& call, const DirectGroup& group, std::uint64_t& barriers,
                 std::vector<std::byte>& staging);

}  // namespace weft::exec
