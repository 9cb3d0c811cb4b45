// weft-bench: Google Benchmark micro-benchmarks of the pieces under the collectives. Registration
// is explicit, so the families and their order are read here rather than from static initialisers.
#include <benchmark/benchmark.h>

#include "perf/bench/benchmarks.hpp"

int main(int argc, char** argv) {
  weft::bench::registerReduceBenchmarks();
  weft::bench::registerConvertBenchmarks();
  weft::bench::registerShmFifoBenchmarks();
#if WEFT_BENCH_GPU
  weft::bench::registerGpuBenchmarks();
  weft::bench::registerTpGemmBenchmarks();
#endif
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
