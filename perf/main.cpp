// weft-perf: nccl-tests' benchmark for weft. `weft-perf allreduce -b 8 -e 128M -f 2 -np 8`
// prints nccl-tests' table (its parsers keep working) with the algorithm weft picked for each
// size, and optionally MPI's time for the same call (--compare mpi), a JSON dump and an SVG plot.
#include <cstdio>
#include <cstdlib>

#include "perf/launch.hpp"
#include "perf/options.hpp"

int main(int argc, char** argv) {
  // Every row appears as soon as it is measured, as nccl-tests' do.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  int exitCode = 0;
  const auto options = weft::perf::parseOptions(argc, argv, exitCode);
  if (!options) return exitCode;
  // Ranks as threads (-t) share one CUDA context; beyond CUDA's 8 default hardware queues their
  // streams would share queues, where a rank's kernel can wait behind a peer's that waits for
  // it. Before CUDA starts; a value the user set stays. Not for one rank per process: under
  // MPS every client's queues come from one pool, and at 32 each only 3 processes got a GPU
  // on the H200 (cudaSetDevice: out of memory in the 4th).
  if (options->threads > 1) setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
  return weft::perf::launchAndRun(*options);
}
