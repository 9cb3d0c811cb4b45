// weft-perf attention: ring attention's forward pass (weftRingAttention) per sequence length,
// beside its parts in the same run: one process attending the whole sequence alone (rank 0,
// the others idle), the local kernel on one rank's share of the work without the ring, the
// ring; TFLOP/s (a causal mask's half counted as half); and each rank's output against the
// whole sequence's attention.
#pragma once

#include "perf/bench.hpp"
#include "perf/control.hpp"
#include "perf/gpu.hpp"

namespace weft::perf {

// Every rank runs it after joining; rank 0 prints the table. Sets `exitCode` to kExitFailed
// where an output differed.
Status runAttentionBench(ProcessContext& context, int thread, Comm& comm, Control& control,
                         GpuRank* gpu, int& exitCode);

}  // namespace weft::perf
