// weft-perf ag-gemm and gemm-rs: the tensor-parallel GEMMs with their collective
// (weftAllGatherGemm, weftGemmReduceScatter) per shape, beside their parts measured in the same
// run: the GEMM alone (cuBLASLt), the collective alone, the two in sequence (WEFT_TP_OVERLAP=
// unfused), weft's pick, each --algos variant forced and its chunks' GEMMs alone (gemms:K, on
// the streams the call runs them on: WEFT_TP_GEMM_STREAMS); the
// overlap efficiency (sequential - pick) / min(GEMM, collective); and the pick's C against the
// sequential one's.
#pragma once

#include "perf/bench.hpp"
#include "perf/control.hpp"
#include "perf/gpu.hpp"

namespace weft::perf {

// Every rank runs it after joining; rank 0 prints the table. Sets `exitCode` to kExitFailed
// where a C differed.
Status runTpBench(ProcessContext& context, int thread, Comm& comm, Control& control, GpuRank* gpu,
                  int& exitCode);

}  // namespace weft::perf
