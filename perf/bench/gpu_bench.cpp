// The GPU primitives against the device's own copy: cudaMemcpyAsync device to device (the
// ceiling), and the kernels' element-wise primitive copying (one input) and reducing (two inputs)
// over a whole grid. Bytes count what is read plus what is written, as the ceiling's do. Timed
// with CUDA events (manual time); skipped with an error where there is no GPU.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <vector>

#include "fused/fp8/codec_device.hpp"
#include "perf/bench/benchmarks.hpp"
#include "src/device/schedule_kernel.hpp"

namespace weft::bench {
namespace {

struct DeviceBuffers {
  explicit DeviceBuffers(std::size_t bytes) {
    ok = cudaMalloc(&a, bytes) == cudaSuccess && cudaMalloc(&b, bytes) == cudaSuccess &&
         cudaMalloc(&out, bytes) == cudaSuccess && cudaMemset(a, 0x3c, bytes) == cudaSuccess &&
         cudaMemset(b, 0x3c, bytes) == cudaSuccess && cudaEventCreate(&start) == cudaSuccess &&
         cudaEventCreate(&stop) == cudaSuccess;
  }
  ~DeviceBuffers() {
    (void)cudaFree(a);
    (void)cudaFree(b);
    (void)cudaFree(out);
    (void)cudaEventDestroy(start);
    (void)cudaEventDestroy(stop);
  }
  void* a = nullptr;
  void* b = nullptr;
  void* out = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  bool ok = false;
};

int smCount() {
  int sms = 0;
  (void)cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  return sms;
}

// Times `calls` runs of run() (each a Status) between the buffers' events, as one iteration's
// time a call; false, the state told why, when one failed.
template <typename Run>
bool timeCalls(benchmark::State& state, DeviceBuffers& d, int calls, Run run) {
  (void)cudaEventRecord(d.start);
  Status s;
  for (int i = 0; i < calls && s.isOk(); ++i) s = run();
  (void)cudaEventRecord(d.stop);
  (void)cudaEventSynchronize(d.stop);
  if (!s.isOk()) {
    state.SkipWithError(s.message().c_str());
    return false;
  }
  float ms = 0;
  (void)cudaEventElapsedTime(&ms, d.start, d.stop);
  state.SetIterationTime(static_cast<double>(ms) / 1e3 / calls);
  return true;
}

// kind: 0 cudaMemcpyAsync, 1 primitive copy, 2 primitive reduce (sum).
void gpuBenchmark(benchmark::State& state, int kind, DataType type) {
  if (!haveGpu()) {
    state.SkipWithError("no GPU");
    return;
  }
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const int blocks = static_cast<int>(state.range(1)) * smCount();
  DeviceBuffers d(bytes);
  if (!d.ok) {
    state.SkipWithError("device allocation failed");
    return;
  }
  const std::size_t count = bytes / sizeOf(type);
  for (auto _ : state) {
    const bool ran = timeCalls(state, d, 1, [&]() -> Status {
      if (kind != 0)
        return device::launchPrimitive(d.out, d.a, kind == 2 ? d.b : nullptr, count, type,
                                       RedOp::sum, blocks, nullptr);
      (void)cudaMemcpyAsync(d.out, d.a, bytes, cudaMemcpyDeviceToDevice);
      return {};
    });
    if (!ran) return;
  }
  const std::int64_t moved = static_cast<std::int64_t>(bytes) * (kind == 2 ? 3 : 2);
  state.SetBytesProcessed(state.iterations() * moved);
}

void registerGpu(const std::string& label, int kind, DataType type) {
  auto* b = benchmark::RegisterBenchmark(label.c_str(), gpuBenchmark, kind, type)
                ->ArgNames({"bytes", "blocksPerSM"})
                ->UseManualTime();
  for (std::int64_t bytes : {std::int64_t{1} << 20, std::int64_t{64} << 20, std::int64_t{256} << 20,
                             std::int64_t{1} << 30}) {
    for (std::int64_t perSm : {1, 2, 4}) {
      if (kind == 0 && perSm > 1) continue;
      b->Args({bytes, perSm});
    }
  }
}

// What the NCCL interface's pointer check costs a call per buffer (nccl/device_checks.cpp):
// cudaPointerGetAttributes on device memory (passes) and on host memory (refused).
void pointerCheck(benchmark::State& state, bool device) {
  if (!haveGpu()) {
    state.SkipWithError("no GPU");
    return;
  }
  DeviceBuffers d(4096);
  std::vector<char> host(4096);
  const void* p = device ? d.a : host.data();
  for (auto _ : state) {
    cudaPointerAttributes a{};
    benchmark::DoNotOptimize(cudaPointerGetAttributes(&a, p));
    benchmark::DoNotOptimize(a.devicePointer);
  }
  (void)cudaGetLastError();
}

// The fp8 codecs (fused/fp8/codec_device.hpp) on bf16: bytes read plus written, as the copy's.
void fp8Codec(benchmark::State& state, const char* scheme, bool decoding) {
  if (!haveGpu()) {
    state.SkipWithError("no GPU");
    return;
  }
  const fused::fp8::Codec codec = *fused::fp8::Codec::parse(scheme);
  const auto count = static_cast<std::size_t>(state.range(0)) / 2;  // bf16 values
  const std::size_t encoded = codec.encodedBytes(count);
  DeviceBuffers d(std::max(count * 2, encoded));
  if (!d.ok) {
    state.SkipWithError("device allocation failed");
    return;
  }
  auto* packed = static_cast<std::byte*>(d.b);
  auto run = [&]() {
    return decoding
               ? fused::fp8::decodeOnDevice(codec, DataType::bf16, packed, count, d.out, nullptr)
               : fused::fp8::encodeOnDevice(codec, DataType::bf16, d.a, count, packed, nullptr);
  };
  // Decoding reads what an encode wrote.
  if (Status s = fused::fp8::encodeOnDevice(codec, DataType::bf16, d.a, count, packed, nullptr);
      !s.isOk()) {
    state.SkipWithError(s.message().c_str());
    return;
  }
  for (auto _ : state) {
    if (!timeCalls(state, d, 10, run)) return;
  }
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(count * 2 + encoded));
}

}  // namespace

bool haveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

void registerGpuBenchmarks() {
  for (const char* scheme : {"e4m3:32", "e4m3:128"}) {
    for (bool decoding : {false, true}) {
      const std::string label =
          std::string("gpu/fp8/") + (decoding ? "decode/" : "encode/") + "bf16/" + scheme;
      benchmark::RegisterBenchmark(label.c_str(), fp8Codec, scheme, decoding)
          ->ArgName("bytes")
          ->Arg(std::int64_t{64} << 20)
          ->Arg(std::int64_t{256} << 20)
          ->UseManualTime();
    }
  }
  benchmark::RegisterBenchmark("gpu/pointer_check/device", pointerCheck, true);
  benchmark::RegisterBenchmark("gpu/pointer_check/host", pointerCheck, false);
  registerGpu("gpu/memcpy", 0, DataType::u8);
  for (DataType t : {DataType::f32, DataType::bf16}) {
    registerGpu("gpu/copy/" + std::string(name(t)), 1, t);
    registerGpu("gpu/reduce/" + std::string(name(t)), 2, t);
  }
}

}  // namespace weft::bench
