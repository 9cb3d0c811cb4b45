// Throughput of weft::exec::reduce, the element-wise arithmetic inside every recvReduce step.
// Out of place (dst, a and b distinct), as a receiver combines its own buffer with a slot. Bytes
// count both inputs read and the output written: 3 x the output per call.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "perf/bench/benchmarks.hpp"
#include "src/exec/host_reduce.hpp"
#include "src/exec/numeric.hpp"
#include "weft/types.hpp"

namespace weft::bench {
namespace {

template <typename T>
void put(std::byte* p, T v) {
  std::memcpy(p, &v, sizeof v);
}

// The element k/4 (floating types) or k (integers) of `type` at p; k is small, so every format
// holds it exactly (fp8 rounds a few).
void storeElement(std::byte* p, DataType type, int k) {
  const float v = static_cast<float>(k) * 0.25f;
  switch (type) {
    case DataType::f64:
      return put(p, static_cast<double>(v));
    case DataType::f32:
      return put(p, v);
    case DataType::f16:
      return put(p, exec::floatToHalf(v));
    case DataType::bf16:
      return put(p, exec::floatToBf16(v));
    case DataType::f8e4m3:
      return put(p, exec::floatToE4m3(v));
    case DataType::f8e5m2:
      return put(p, exec::floatToE5m2(v));
    case DataType::i8:
      return put(p, static_cast<std::int8_t>(k));
    case DataType::u8:
      return put(p, static_cast<std::uint8_t>(k));
    case DataType::i32:
      return put(p, static_cast<std::int32_t>(k));
    case DataType::u32:
      return put(p, static_cast<std::uint32_t>(k));
    case DataType::i64:
      return put(p, static_cast<std::int64_t>(k));
    case DataType::u64:
      return put(p, static_cast<std::uint64_t>(k));
  }
}

// `bytes` of `type` holding values of both signs in [-15/4, 15/4] (never NaN, inf or subnormal,
// whose slow paths collectives rarely meet); `phase` shifts the sequence so two inputs differ.
// The first 4 KiB are computed element by element and then repeated, which keeps set-up cheap
// for the 16 MiB runs that Google Benchmark repeats while it sizes the iteration count.
std::vector<std::byte> inputOf(DataType type, std::size_t bytes, int phase) {
  const std::size_t element = sizeOf(type);
  const std::size_t period = std::min<std::size_t>(bytes, 4096);
  std::vector<std::byte> out(bytes);
  for (std::size_t i = 0; i < period / element; ++i) {
    storeElement(out.data() + i * element, type, static_cast<int>((i * 7 + phase) % 31) - 15);
  }
  for (std::size_t at = period; at < bytes; at += period) {
    std::memcpy(out.data() + at, out.data(), std::min(period, bytes - at));
  }
  return out;
}

void reduceBenchmark(benchmark::State& state, DataType type, RedOp op) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const std::size_t count = bytes / sizeOf(type);
  const std::vector<std::byte> a = inputOf(type, bytes, 0);
  const std::vector<std::byte> b = inputOf(type, bytes, 11);
  std::vector<std::byte> dst(bytes);
  for (auto _ : state) {
    exec::reduce(dst.data(), a.data(), b.data(), count, type, op);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * 3 * static_cast<std::int64_t>(bytes));
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(count));
}

void registerReduce(DataType type, RedOp op) {
  const std::string label = "reduce/" + std::string(name(op)) + "/" + std::string(name(type));
  benchmark::RegisterBenchmark(label.c_str(), reduceBenchmark, type, op)
      ->ArgName("bytes")
      ->Arg(4 << 10)    // 12 KiB in all: L1
      ->Arg(256 << 10)  // 768 KiB: L2 of current server cores
      ->Arg(16 << 20);  // 48 MiB: past most L3s, so memory
}

}  // namespace

void registerReduceBenchmarks() {
  for (DataType type : kAllDataTypes) registerReduce(type, RedOp::sum);
  // avg reduces as sum; the other ops on the two types training reduces most.
  for (RedOp op : {RedOp::min, RedOp::max, RedOp::prod}) {
    for (DataType type : {DataType::f32, DataType::bf16}) registerReduce(type, op);
  }
}

}  // namespace weft::bench
