// MoE combine on GPU memory (device.hpp): each received token's weighted sum over its slots sent
// back to its source, and each own token's partial sums added in rank order. f32 with explicit
// roundings, as the host path computes them, so that both give the same bits.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "fused/cuda_steps.hpp"
#include "fused/moe/device_kernels.cuh"

namespace weft::fused::moe {
namespace {

// Each received token's Σ weight · expert output over its local slots, into its source's buffer.
template <typename T>
__device__ void combineSendRows(const MoeDevice& d, const std::byte* expertOut) {
  constexpr int V = Vec<T>::V;
  const std::size_t pairs = static_cast<std::size_t>(d.n) * d.tokens, chunks = d.hidden / V;
  for (std::size_t p = blockIdx.x; p < pairs; p += gridDim.x) {
    const int s = static_cast<int>(p / d.tokens), j = static_cast<int>(p % d.tokens);
    if (j >= receivedFrom(d, s)) continue;
    const std::int32_t* m = recordOf(d, s, j);
    auto* to = reinterpret_cast<uint4*>(
        d.peers[s] + d.backAt + (static_cast<std::size_t>(d.me) * d.tokens + j) * d.rowBytes);
    // kInFlight vectors a thread, so that a slot's loads are in flight together.
    const std::size_t step = blockDim.x;
    for (std::size_t c0 = threadIdx.x; c0 < chunks; c0 += step * kInFlight) {
      float acc[kInFlight][V] = {};
      for (int slot = 0; slot < d.k; ++slot) {
        const std::int32_t row = d.rowPos[p * d.k + slot];
        if (row < 0) continue;
        const float w = __int_as_float(__ldcg(m + localAt(slot) + 1));
        const auto* from =
            reinterpret_cast<const uint4*>(expertOut + static_cast<std::size_t>(row) * d.rowBytes);
        Vec<T> y[kInFlight];
#pragma unroll
        for (int u = 0; u < kInFlight; ++u)
          if (c0 + u * step < chunks) y[u].raw = from[c0 + u * step];
#pragma unroll
        for (int u = 0; u < kInFlight; ++u)
#pragma unroll
          for (int i = 0; i < V; ++i)
            acc[u][i] = __fadd_rn(acc[u][i], __fmul_rn(w, widen(y[u].v[i])));
      }
      storeSums<T>(to, acc, c0, step, chunks);
    }
  }
}

// Each own token's partial sums from every rank, in rank order, into out.
template <typename T>
__device__ void combineRows(const MoeDevice& d, std::byte* out) {
  constexpr int V = Vec<T>::V;
  const std::size_t chunks = d.hidden / V;
  for (int t = static_cast<int>(blockIdx.x); t < d.tokens; t += static_cast<int>(gridDim.x)) {
    const std::size_t step = blockDim.x;
    for (std::size_t c0 = threadIdx.x; c0 < chunks; c0 += step * kInFlight) {
      float sum[kInFlight][V] = {};
      for (int q = 0; q < d.n; ++q) {
        const int slot = d.slotOf[static_cast<std::size_t>(t) * d.n + q];
        if (slot < 0) continue;
        const auto* from = reinterpret_cast<const uint4*>(
            d.peers[d.me] + d.backAt +
            (static_cast<std::size_t>(q) * d.tokens + slot) * d.rowBytes);
        Vec<T> y[kInFlight];
#pragma unroll
        for (int u = 0; u < kInFlight; ++u)
          if (c0 + u * step < chunks) y[u].raw = __ldcg(from + c0 + u * step);
#pragma unroll
        for (int u = 0; u < kInFlight; ++u)
#pragma unroll
          for (int i = 0; i < V; ++i) sum[u][i] = __fadd_rn(sum[u][i], widen(y[u].v[i]));
      }
      storeSums<T>(reinterpret_cast<uint4*>(out + static_cast<std::size_t>(t) * d.rowBytes), sum,
                   c0, step, chunks);
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    combineSendKernel(MoeDevice d, const std::byte* expertOut) {
  combineSendRows<T>(d, expertOut);
}

template <typename T>
__global__ void __launch_bounds__(kThreads) combineKernel(MoeDevice d, std::byte* out) {
  combineRows<T>(d, out);
}

// The low-latency combine's halves: the sums sent back and, by the last block done, every rank's
// flag raised; every block waits for the flags, then sums its tokens.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    lowLatencyCombineSendKernel(MoeDevice d, const std::byte* expertOut) {
  combineSendRows<T>(d, expertOut);
  if (!lastDone(d.arrived + d.n, gridDim.x)) return;
  const std::uint64_t epoch = *d.epoch;
  for (int q = static_cast<int>(threadIdx.x); q < d.n; q += kThreads)
    *reinterpret_cast<volatile std::uint64_t*>(flagAt(d, q, kGpuMaxRanks + d.me)) = epoch;
}

template <typename T>
__global__ void __launch_bounds__(kThreads) lowLatencyCombineKernel(MoeDevice d, std::byte* out) {
  awaitFlags(d, kGpuMaxRanks);
  combineRows<T>(d, out);
}

}  // namespace

Status launchCombineSend(const MoeDevice& d, const void* expertOut, void* stream) {
  auto* s = static_cast<cudaStream_t>(stream);
  return withType(d.type, [&](auto* tag) -> Status {
    using T = std::remove_pointer_t<decltype(tag)>;
    const unsigned grid = gridOf(d, static_cast<std::size_t>(d.n) * d.tokens);
    const auto* rows = static_cast<const std::byte*>(expertOut);
    if (d.lowLatency) {
      lowLatencyCombineSendKernel<T><<<grid, kThreads, 0, s>>>(d, rows);
      return launched("moe combine (send)");
    }
    combineSendKernel<T><<<grid, kThreads, 0, s>>>(d, rows);
    if (Status e = launchSignal(d, kGpuMaxRanks, false, s); !e) return e;
    return launched("moe combine (send)");
  });
}

Status launchCombineRecv(const MoeDevice& d, void* out, void* stream) {
  auto* s = static_cast<cudaStream_t>(stream);
  return withType(d.type, [&](auto* tag) -> Status {
    using T = std::remove_pointer_t<decltype(tag)>;
    const unsigned grid = gridOf(d, static_cast<std::size_t>(d.tokens));
    if (d.lowLatency) {
      lowLatencyCombineKernel<T><<<grid, kThreads, 0, s>>>(d, static_cast<std::byte*>(out));
    } else {
      if (Status e = launchAwait(d, kGpuMaxRanks, s); !e) return e;
      combineKernel<T><<<grid, kThreads, 0, s>>>(d, static_cast<std::byte*>(out));
    }
    return launched("moe combine (receive)");
  });
}

Status loadCombineKernels() {
  return loadKernels("moe: loading the combine kernels", combineSendKernel<__nv_bfloat16>,
                     combineSendKernel<__half>, combineSendKernel<float>,
                     combineKernel<__nv_bfloat16>, combineKernel<__half>, combineKernel<float>,
                     lowLatencyCombineSendKernel<__nv_bfloat16>,
                     lowLatencyCombineSendKernel<__half>, lowLatencyCombineSendKernel<float>,
                     lowLatencyCombineKernel<__nv_bfloat16>, lowLatencyCombineKernel<__half>,
                     lowLatencyCombineKernel<float>);
}

}  // namespace weft::fused::moe
