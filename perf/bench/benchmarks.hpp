// weft-bench's families of micro-benchmarks. Each registers its benchmarks with Google Benchmark;
// main.cpp calls them before running whatever --benchmark_filter selects.
#pragma once

namespace weft::bench {

// weft::exec::reduce per dtype and op, at output sizes that sit in L1, in L2 and in memory.
void registerReduceBenchmarks();
// The narrow-float conversions of src/exec/numeric.hpp, both ways, over arrays.
void registerConvertBenchmarks();
// The shared-memory FIFO between two threads: ping-pong round trips and one-way streaming.
void registerShmFifoBenchmarks();
// Whether a GPU is there (the GPU families skip each benchmark with an error where not).
bool haveGpu();
// The GPU's copy ceiling and the kernels' element-wise primitive (builds with CUDA only).
void registerGpuBenchmarks();
// The tensor-parallel calls' cuBLASLt GEMMs, whole and in chunks, per candidate (CUDA only).
void registerTpGemmBenchmarks();

}  // namespace weft::bench
