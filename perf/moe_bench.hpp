// weft-perf moe: MoE dispatch and combine (weftMoeDispatch, weftMoeCombine) per --tokens count,
// bf16 values, uniform top-k routing. On host memory beside a plain all-to-all-v implementation
// in the same run (every slot's row sent to its expert's rank after a counts exchange, permuted
// by expert there; combine's rows back the same way and summed at the owner); on GPU memory
// called eagerly (normal mode) and replayed from CUDA graphs (low-latency mode). GB/s as DeepEP
// counts them: the bf16 bytes of the token rows a rank receives (once per token and rank). Every
// rank's combined output (identity experts) is checked against Σ weight · x in double.
#pragma once

#include "perf/bench.hpp"
#include "perf/control.hpp"
#include "perf/gpu.hpp"

namespace weft::perf {

// Every rank runs it after joining; rank 0 prints the table. Sets `exitCode` to kExitFailed
// where an output differed.
Status runMoeBench(ProcessContext& context, int thread, Comm& comm, Control& control, GpuRank* gpu,
                   int& exitCode);

}  // namespace weft::perf
