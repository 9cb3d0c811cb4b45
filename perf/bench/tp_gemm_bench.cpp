// The tensor-parallel calls' GEMMs alone (fused::tp::Gemms, cuBLASLt), bf16, one process: the
// whole GEMM of a call's shape, or its K chunks' GEMMs as the chunked call cuts them
// (fused::tp::chunkGemm: a batch a block, or an all-gather's interleaved chunk as one GEMM whose
// C rows are K apart) on one stream or on two in turn as the call runs them
// (fused::tp::gemmLane, WEFT_TP_GEMM_STREAMS), each with one of cuBLASLt's heuristic candidates
// (Gemms::keepCandidate; 0 is the heuristic's first), or as weft runs them untuned (candidate
// -2: the heuristic's first or a wave-fitted tile, Gemms::setFitting), or tuned (candidate -1:
// the fastest of every candidate, wave-fitted ones too, as WEFT_TP_GEMM_TUNE=1 keeps it, timed at
// its first run). Candidates past the heuristic's are its first algorithm's wave-fitted
// configurations; WEFT_BENCH_TP_CANDIDATES (default 8) says how many indices to register, so
// every configuration can be timed sustained. Operands hold random values in [-1, 1): constant ones
// let the tensor cores run cooler and faster. Timed with CUDA events (manual time); skipped with an
// error where there is no GPU.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "fused/cuda_steps.hpp"
#include "fused/tp/overlap.hpp"
#include "perf/bench/benchmarks.hpp"
#include "src/exec/numeric.hpp"

namespace weft::bench {
namespace {

// Llama-70B's MLP as weft-perf's defaults: all-gather + GEMM n 28672, k 8192; GEMM +
// reduce-scatter n 8192, k 28672 (n and k divided among the ranks where the call divides them).
algo::TpShape tpShape(bool ag, int ranks, std::size_t m) {
  return {ag ? algo::TpOp::allGatherGemm : algo::TpOp::gemmReduceScatter,
          m,
          ag ? std::size_t{28672} : 8192,
          ag ? std::size_t{8192} : 28672,
          2,  // bf16 A and B
          ranks,
          2,  // bf16 C
          1};
}

// One set of device operands for every benchmark, sized for the largest shape registered (A
// and C 512 MiB, B 256 MiB), filled once: a 16 MiB random block, copied over the rest.
struct Operands {
  static constexpr std::size_t kA = std::size_t{512} << 20, kB = std::size_t{256} << 20,
                               kC = std::size_t{512} << 20;
  void* a = nullptr;
  void* b = nullptr;
  void* c = nullptr;
  void* workspace = nullptr;  // one cuBLASLt workspace a GEMM stream
  cudaStream_t stream = nullptr, second = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr, fork = nullptr, join = nullptr;
  bool ok = false;

  Operands() {
    ok = cudaMalloc(&a, kA) == cudaSuccess && cudaMalloc(&b, kB) == cudaSuccess &&
         cudaMalloc(&c, kC) == cudaSuccess &&
         cudaMalloc(&workspace, 2 * fused::tp::Gemms::kWorkspaceBytes) == cudaSuccess &&
         cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess &&
         cudaStreamCreateWithFlags(&second, cudaStreamNonBlocking) == cudaSuccess &&
         cudaEventCreate(&start) == cudaSuccess && cudaEventCreate(&stop) == cudaSuccess &&
         cudaEventCreateWithFlags(&fork, cudaEventDisableTiming) == cudaSuccess &&
         cudaEventCreateWithFlags(&join, cudaEventDisableTiming) == cudaSuccess;
    constexpr std::size_t kBlock = std::size_t{16} << 20;
    std::vector<std::uint16_t> host(kBlock / 2);
    std::uint64_t x = 0x9e3779b97f4a7c15ULL;
    for (std::uint16_t& v : host) {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      v = exec::floatToBf16(static_cast<float>(x >> 40) / static_cast<float>(1 << 23) - 1.0f);
    }
    for (auto [to, bytes] : {std::pair{a, kA}, std::pair{b, kB}}) {
      auto* p = static_cast<std::byte*>(to);
      for (std::size_t at = 0; ok && at < bytes; at += kBlock)
        ok = cudaMemcpy(p + at, host.data(), kBlock, cudaMemcpyHostToDevice) == cudaSuccess;
    }
  }
  // Never freed: they serve every benchmark of the process.
  static Operands& get() {
    static Operands* o = new Operands();
    return *o;
  }
};

// Args: ranks, m, chunks (1: the whole GEMM), candidate, GEMM streams, flat (1: a chunk's
// GEMMs as one GEMM of their rows, A and C contiguous: what the cut costs).
void tpGemms(benchmark::State& state, bool ag) {
  if (!haveGpu()) {
    state.SkipWithError("no GPU");
    return;
  }
  Operands& o = Operands::get();
  if (!o.ok) {
    state.SkipWithError("device allocation failed");
    return;
  }
  const algo::TpShape shape =
      tpShape(ag, static_cast<int>(state.range(0)), static_cast<std::size_t>(state.range(1)));
  const int chunks = static_cast<int>(state.range(2)), candidate = static_cast<int>(state.range(3));
  const int streams = static_cast<int>(state.range(4));
  const bool flat = state.range(5) != 0;
  const bool two = fused::tp::gemmLane(streams, chunks, 1) != 0;
  auto gemms = fused::tp::Gemms::create();
  if (!gemms) {
    state.SkipWithError(gemms.status().message().c_str());
    return;
  }
  if (candidate == -1)
    (*gemms)->setTuning(true);
  else if (candidate >= 0)
    (*gemms)->keepCandidate(candidate);
  std::vector<fused::tp::ChunkGemm> cut;
  for (int i = 0; i < chunks; ++i)
    cut.push_back(fused::tp::chunkGemm(shape, DataType::bf16, DataType::bf16, chunks, i));
  for (fused::tp::ChunkGemm& ch : cut) {
    if (!flat) continue;
    fused::tp::GemmShape& g = ch.shape;
    g.m *= static_cast<std::size_t>(g.batches);
    g.ldc = g.n;
    g.batches = 1;
    g.strideA = g.strideC = 0;
  }
  auto run = [&]() -> Status {
    if (two) {
      if (Status s = fused::follow(o.second, o.stream, o.fork); !s) return s;
    }
    for (int i = 0; i < chunks; ++i) {
      const fused::tp::ChunkGemm& ch = cut[static_cast<std::size_t>(i)];
      const auto* a = static_cast<const std::byte*>(o.a) + ch.aOffset * 2;
      auto* c = static_cast<std::byte*>(o.c) + ch.cOffset * 2;
      const int l = fused::tp::gemmLane(streams, chunks, i);
      std::byte* ws = static_cast<std::byte*>(o.workspace) +
                      static_cast<std::size_t>(l) * fused::tp::Gemms::kWorkspaceBytes;
      if (Status s = (*gemms)->run(ch.shape, a, o.b, c, nullptr, ws, l == 0 ? o.stream : o.second);
          !s)
        return s;
    }
    return two ? fused::follow(o.stream, o.second, o.join) : Status{};
  };
  // The first run loads the kernel; a shape with fewer candidates keeps its last (skipped).
  Status s = run();
  if (s && candidate >= 0 && (*gemms)->chosen(cut.front().shape) != candidate)
    s = Status(Code::invalidArgument, "the heuristic has fewer candidates");
  if (s && cudaStreamSynchronize(o.stream) != cudaSuccess)
    s = Status(Code::systemError, "the warm-up failed");
  if (!s) {
    state.SkipWithError(s.message().c_str());
    return;
  }
  constexpr int kCalls = 5;
  for (auto _ : state) {
    (void)cudaEventRecord(o.start, o.stream);
    for (int i = 0; i < kCalls && s; ++i) s = run();
    (void)cudaEventRecord(o.stop, o.stream);
    (void)cudaEventSynchronize(o.stop);
    if (!s) {
      state.SkipWithError(s.message().c_str());
      return;
    }
    float ms = 0;
    (void)cudaEventElapsedTime(&ms, o.start, o.stop);
    state.SetIterationTime(static_cast<double>(ms) / 1e3 / kCalls);
  }
  const fused::tp::GemmShape& g = cut.front().shape;
  const double flops = 2.0 * static_cast<double>(g.m * g.n * g.k) * g.batches * chunks;
  state.counters["TFLOPS"] =
      benchmark::Counter(flops / 1e12, benchmark::Counter::kIsIterationInvariantRate);
  // Which candidate ran (the first chunk's; -2 a wave-fitted tile untuned), its tile, of how many.
  state.counters["kept"] = (*gemms)->chosen(g);
  state.counters["tile"] = (*gemms)->tile(g);
  state.counters["of"] = (*gemms)->offered(g);
}

}  // namespace

void registerTpGemmBenchmarks() {
  std::int64_t candidates = 8;
  if (const char* v = std::getenv("WEFT_BENCH_TP_CANDIDATES")) candidates = std::atoll(v);
  for (bool ag : {true, false}) {
    auto* b = benchmark::RegisterBenchmark(ag ? "gpu/tp_gemm/ag-gemm" : "gpu/tp_gemm/gemm-rs",
                                           tpGemms, ag)
                  ->ArgNames({"ranks", "m", "chunks", "candidate", "streams", "flat"})
                  ->UseManualTime();
    for (std::int64_t ranks : {2, 4})
      for (std::int64_t m : {4096, 16384})
        for (std::int64_t chunks : {1, 2, 4}) {
          for (std::int64_t candidate = 0; candidate < candidates; ++candidate)
            b->Args({ranks, m, chunks, candidate, 1, 0});
          b->Args({ranks, m, chunks, -1, 1, 0});
          b->Args({ranks, m, chunks, -2, 1, 0});
          if (chunks == 1) continue;
          b->Args({ranks, m, chunks, -2, 2, 0});  // as the call runs them
          b->Args({ranks, m, chunks, 0, 1, 1});
          b->Args({ranks, m, chunks, -1, 1, 1});
        }
  }
}

}  // namespace weft::bench
