// How weft-perf's ranks come to be, and how they find each other:
//   mpirun -np N weft-perf ...        one process per MPI rank; rank 0 makes the unique id and
//                                     MPI_Bcast hands it out (builds with MPI only)
//   weft-perf ... -np N               this process forks N processes, then makes the id (its
//                                     listener lives here) and pipes it to them, and waits; only
//                                     rank 0 prints; any failure fails the command
//   WEFT_COMM_ID=host:port WEFT_RANK=i WEFT_NRANKS=n weft-perf ...
//                                     any launcher: every process derives the id from the address
//   weft-perf ...                     one process
// and -t T makes each process T ranks (threads): ranks = processes x T, all on one id.
#pragma once

#include "perf/options.hpp"

namespace weft::perf {

// Runs the benchmark as the launch mode of this invocation asks; returns the exit code.
int launchAndRun(const Options& options);

}  // namespace weft::perf
