// One rank's benchmark: it joins the communicators, sweeps the sizes, times and checks every
// call, combines the numbers with the other ranks, and (rank 0) prints the table.
#pragma once

#include <atomic>
#include <barrier>
#include <string>

#include "perf/options.hpp"
#include "perf/peer.hpp"
#include "weft/weft.h"

namespace weft::perf {

// What the ranks (threads) of one process share.
struct ProcessContext {
  const Options& options;
  int proc = 0;    // this process's index
  int nprocs = 1;  // processes in the run; ranks = nprocs * options.threads
  weftUniqueId id{};
  std::string launch;                    // how the run was launched, for the preamble
  Peer* peer = nullptr;                  // --compare (one rank per process)
  std::barrier<>* threads = nullptr;     // this process's rank threads
  std::atomic<bool> callFailed = false;  // a rank stopped early (under mpirun: abort the job)
};

// Exit codes of a rank, and of weft-perf (the tools' convention, src/tools/cli.hpp).
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;  // a checked element was wrong, a call failed, or
                                       // NCCL_TESTS_MIN_BW was missed
inline constexpr int kExitUsage = 2;   // bad usage, found before or after the ranks started

// Runs rank options.threads * proc + thread to the end and returns its exit code. Every rank
// learns of every rank's wrong elements, so all return the same code unless a call fails.
int runRank(ProcessContext& context, int thread);

}  // namespace weft::perf
