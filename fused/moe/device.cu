// The MoE kernels (device.hpp). Rows move in 16-byte vectors; peer-written data is read through
// L2 (ld.cg), where every rank's writes to this rank's memory land; arithmetic is f32 with
// explicit roundings (no fused multiply-add), as the host reference computes it, so that both
// give the same bits.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <string>

#include "fused/cuda_steps.hpp"
#include "fused/fp8/codec_device.hpp"
#include "fused/moe/device.hpp"

namespace weft::fused::moe {
namespace {

constexpr int kThreads = 256;
constexpr std::size_t kAlign = 256;

std::size_t aligned(std::size_t b) {
  return (b + kAlign - 1) / kAlign * kAlign;
}

__device__ std::uint64_t now() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ std::uint64_t* flagAt(const MoeDevice& d, int rank, int index) {
  return reinterpret_cast<std::uint64_t*>(d.peers[rank] +
                                          static_cast<std::size_t>(index) * kFlagStride);
}

__device__ void copyRow(std::byte* to, const std::byte* from, std::size_t bytes, bool peerWritten) {
  auto* t = reinterpret_cast<uint4*>(to);
  const auto* f = reinterpret_cast<const uint4*>(from);
  for (std::size_t i = threadIdx.x; i < bytes / 16; i += blockDim.x)
    t[i] = peerWritten ? __ldcg(f + i) : f[i];
}

// Tokens' slots at rank blockIdx.x, in token order (a block scan); block 0 also counts bad and
// repeated expert indices (dropped).
__global__ void __launch_bounds__(kThreads) layoutKernel(MoeDevice d, const std::int64_t* idx) {
  using Scan = cub::BlockScan<int, kThreads>;
  __shared__ typename Scan::TempStorage tmp;
  __shared__ int running;
  const int q = static_cast<int>(blockIdx.x);
  if (threadIdx.x == 0) running = 0;
  __syncthreads();
  for (int base = 0; base < d.tokens; base += kThreads) {
    const int t = base + static_cast<int>(threadIdx.x);
    int going = 0;
    for (int j = 0; t < d.tokens && j < d.k; ++j) {
      const std::int64_t e = idx[static_cast<std::size_t>(t) * d.k + j];
      const bool valid = e >= 0 && e < d.experts;
      if (valid && e / d.L == q) going = 1;
      if (q != 0) continue;
      if (e < -1 || e >= d.experts) atomicAdd(&d.status[0], 1ULL);
      for (int i = 0; valid && i < j; ++i)
        if (idx[static_cast<std::size_t>(t) * d.k + i] == e) atomicAdd(&d.status[1], 1ULL);
    }
    int prefix = 0, total = 0;
    Scan(tmp).ExclusiveSum(going, prefix, total);
    if (t < d.tokens)
      d.slotOf[static_cast<std::size_t>(t) * d.n + q] = going ? running + prefix : -1;
    __syncthreads();
    if (threadIdx.x == 0) running += total;
    __syncthreads();
  }
  if (threadIdx.x == 0) d.sendCount[q] = running;
}

// Each token's row and record into each destination's buffer, at its slot there.
__global__ void __launch_bounds__(kThreads)
    sendKernel(MoeDevice d, const std::byte* x, const std::int64_t* idx, const float* w) {
  for (int t = static_cast<int>(blockIdx.x); t < d.tokens; t += static_cast<int>(gridDim.x)) {
    for (int q = 0; q < d.n; ++q) {
      const int slot = d.slotOf[static_cast<std::size_t>(t) * d.n + q];
      if (slot < 0) continue;
      const std::size_t at = static_cast<std::size_t>(d.me) * d.tokens + slot;
      copyRow(d.peers[q] + d.rowsAt + at * d.sentBytes,
              x + static_cast<std::size_t>(t) * d.sentBytes, d.sentBytes, false);
      auto* meta = reinterpret_cast<std::int32_t*>(d.peers[q] + d.metaAt) + at * d.metaInts;
      if (threadIdx.x == 0) meta[0] = t;
      const int j = static_cast<int>(threadIdx.x);
      if (j < d.k) {
        const std::int64_t e = idx[static_cast<std::size_t>(t) * d.k + j];
        const bool there = e >= 0 && e < d.experts && e / d.L == q;
        meta[1 + 2 * j] = there ? static_cast<std::int32_t>(e % d.L) : -1;
        meta[2 + 2 * j] = __float_as_int(w[static_cast<std::size_t>(t) * d.k + j]);
      }
    }
  }
}

// This call's flag (and, for dispatch, the rows sent) raised in every rank's buffer: after the
// stream's previous kernels, whose writes the fence orders before the stores.
__global__ void signalKernel(MoeDevice d, int flagBase, int withCounts) {
  __threadfence_system();
  const std::uint64_t epoch = *d.epoch;
  for (int q = static_cast<int>(threadIdx.x); q < d.n; q += static_cast<int>(blockDim.x)) {
    if (withCounts != 0) {
      reinterpret_cast<volatile std::int32_t*>(d.peers[q] + d.countsAt)[d.me] = d.sendCount[q];
      __threadfence_system();
    }
    *reinterpret_cast<volatile std::uint64_t*>(flagAt(d, q, flagBase + d.me)) = epoch;
  }
  __threadfence_system();
}

// Until every rank's flag of this call is up in this rank's buffer; past the timeout the kernel
// traps (the stream fails rather than hang on a dead peer).
__global__ void awaitKernel(MoeDevice d, int flagBase) {
  const std::uint64_t want = *d.epoch, start = now();
  for (int s = static_cast<int>(threadIdx.x); s < d.n; s += static_cast<int>(blockDim.x)) {
    const auto* flag =
        reinterpret_cast<const volatile std::uint64_t*>(flagAt(d, d.me, flagBase + s));
    while (*flag < want) {
      if (now() - start > d.timeoutNs) __trap();
      __nanosleep(200);
    }
  }
  __threadfence_system();
}

__device__ int receivedFrom(const MoeDevice& d, int s) {
  return __ldcg(reinterpret_cast<const std::int32_t*>(d.peers[d.me] + d.countsAt) + s);
}
__device__ const std::int32_t* recordOf(const MoeDevice& d, int s, int j) {
  return reinterpret_cast<const std::int32_t*>(d.peers[d.me] + d.metaAt) +
         (static_cast<std::size_t>(s) * d.tokens + j) * d.metaInts;
}

// Local expert blockIdx.x's rows; block 0 also marks every slot that is no local expert's.
__global__ void __launch_bounds__(kThreads) countKernel(MoeDevice d, std::int32_t* expertCounts) {
  using Reduce = cub::BlockReduce<int, kThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  const int e = static_cast<int>(blockIdx.x);
  int mine = 0;
  for (int s = 0; s < d.n; ++s) {
    const int count = receivedFrom(d, s);
    for (int j = static_cast<int>(threadIdx.x); j < count; j += kThreads) {
      const std::int32_t* m = recordOf(d, s, j);
      for (int slot = 0; slot < d.k; ++slot) {
        const int local = __ldcg(m + 1 + 2 * slot);
        mine += local == e ? 1 : 0;
        if (e == 0 && (local < 0 || local >= d.L))
          d.rowPos[(static_cast<std::size_t>(s) * d.tokens + j) * d.k + slot] = -1;
      }
    }
  }
  const int total = Reduce(tmp).Sum(mine);
  if (threadIdx.x == 0) expertCounts[e] = total;
}

// Local expert blockIdx.x's rows placed after the lower experts', in (source, token) order
// (a block scan); past the capacity dropped and counted.
__global__ void __launch_bounds__(kThreads)
    placeKernel(MoeDevice d, const std::int32_t* expertCounts, std::int32_t* recvSource) {
  using Scan = cub::BlockScan<int, kThreads>;
  __shared__ typename Scan::TempStorage tmp;
  __shared__ int running;
  const int e = static_cast<int>(blockIdx.x);
  std::size_t base = 0;
  for (int i = 0; i < e; ++i) base += static_cast<std::size_t>(expertCounts[i]);
  if (threadIdx.x == 0) running = 0;
  __syncthreads();
  for (int s = 0; s < d.n; ++s) {
    const int count = receivedFrom(d, s);
    for (int j0 = 0; j0 < count; j0 += kThreads) {
      const int j = j0 + static_cast<int>(threadIdx.x);
      const std::int32_t* m = j < count ? recordOf(d, s, j) : nullptr;
      int hits = 0;
      for (int slot = 0; m != nullptr && slot < d.k; ++slot) hits += __ldcg(m + 1 + 2 * slot) == e;
      int prefix = 0, total = 0;
      Scan(tmp).ExclusiveSum(hits, prefix, total);
      std::size_t pos = base + static_cast<std::size_t>(running + prefix);
      for (int slot = 0; hits > 0 && slot < d.k; ++slot) {
        if (__ldcg(m + 1 + 2 * slot) != e) continue;
        std::int32_t& row = d.rowPos[(static_cast<std::size_t>(s) * d.tokens + j) * d.k + slot];
        if (pos < d.capacity) {
          row = static_cast<std::int32_t>(pos);
          if (recvSource != nullptr) {
            recvSource[2 * pos] = s;
            recvSource[2 * pos + 1] = __ldcg(m);
          }
        } else {
          row = -1;
          atomicAdd(&d.status[2], 1ULL);
        }
        ++pos;
      }
      __syncthreads();
      if (threadIdx.x == 0) running += total;
      __syncthreads();
    }
  }
}

// Each received row copied to its slots' rows of recvX (fp8: the elements there, the scales to
// recvScales).
__global__ void __launch_bounds__(kThreads)
    gatherKernel(MoeDevice d, std::byte* recvX, float* recvScales) {
  const std::size_t pairs = static_cast<std::size_t>(d.n) * d.tokens;
  const std::size_t recvBytes = d.fp8 ? d.hidden : d.rowBytes, blocks = d.hidden / 128;
  for (std::size_t p = blockIdx.x; p < pairs; p += gridDim.x) {
    const int s = static_cast<int>(p / d.tokens), j = static_cast<int>(p % d.tokens);
    if (j >= receivedFrom(d, s)) continue;
    const std::byte* from = d.peers[d.me] + d.rowsAt + p * d.sentBytes;
    for (int slot = 0; slot < d.k; ++slot) {
      const std::int32_t row = d.rowPos[p * d.k + slot];
      if (row < 0) continue;
      copyRow(recvX + static_cast<std::size_t>(row) * recvBytes, from, recvBytes, true);
      if (!d.fp8) continue;
      const auto* scales = reinterpret_cast<const float*>(from + d.hidden);
      for (std::size_t b = threadIdx.x; b < blocks; b += blockDim.x)
        recvScales[static_cast<std::size_t>(row) * blocks + b] = __ldcg(scales + b);
    }
  }
}

template <typename T>
__device__ float widen(T v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat162float(v);
  } else {
    return __half2float(v);
  }
}
template <typename T>
__device__ T narrow(float v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(v);
  } else {
    return __float2half_rn(v);
  }
}

// 16 bytes of T: V values.
template <typename T>
struct Vec {
  static constexpr int V = 16 / sizeof(T);
  union {
    uint4 raw;
    T v[V];
  };
};

// Each received token's Σ weight · expert output over its local slots, into its source's buffer.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    combineSendKernel(MoeDevice d, const std::byte* expertOut) {
  constexpr int V = Vec<T>::V;
  const std::size_t pairs = static_cast<std::size_t>(d.n) * d.tokens, chunks = d.hidden / V;
  for (std::size_t p = blockIdx.x; p < pairs; p += gridDim.x) {
    const int s = static_cast<int>(p / d.tokens), j = static_cast<int>(p % d.tokens);
    if (j >= receivedFrom(d, s)) continue;
    const std::int32_t* m = recordOf(d, s, j);
    auto* to = reinterpret_cast<uint4*>(
        d.peers[s] + d.backAt + (static_cast<std::size_t>(d.me) * d.tokens + j) * d.rowBytes);
    for (std::size_t c = threadIdx.x; c < chunks; c += blockDim.x) {
      float acc[V] = {};
      for (int slot = 0; slot < d.k; ++slot) {
        const std::int32_t row = d.rowPos[p * d.k + slot];
        if (row < 0) continue;
        const float w = __int_as_float(__ldcg(m + 2 + 2 * slot));
        Vec<T> y;
        y.raw = reinterpret_cast<const uint4*>(expertOut +
                                               static_cast<std::size_t>(row) * d.rowBytes)[c];
#pragma unroll
        for (int i = 0; i < V; ++i) acc[i] = __fadd_rn(acc[i], __fmul_rn(w, widen(y.v[i])));
      }
      Vec<T> out;
#pragma unroll
      for (int i = 0; i < V; ++i) out.v[i] = narrow<T>(acc[i]);
      to[c] = out.raw;
    }
  }
}

// Each own token's partial sums from every rank, in rank order, into out.
template <typename T>
__global__ void __launch_bounds__(kThreads) combineKernel(MoeDevice d, std::byte* out) {
  constexpr int V = Vec<T>::V;
  const std::size_t chunks = d.hidden / V;
  for (int t = static_cast<int>(blockIdx.x); t < d.tokens; t += static_cast<int>(gridDim.x)) {
    for (std::size_t c = threadIdx.x; c < chunks; c += blockDim.x) {
      float sum[V] = {};
      for (int q = 0; q < d.n; ++q) {
        const int slot = d.slotOf[static_cast<std::size_t>(t) * d.n + q];
        if (slot < 0) continue;
        Vec<T> y;
        y.raw = __ldcg(reinterpret_cast<const uint4*>(
                           d.peers[d.me] + d.backAt +
                           (static_cast<std::size_t>(q) * d.tokens + slot) * d.rowBytes) +
                       c);
#pragma unroll
        for (int i = 0; i < V; ++i) sum[i] = __fadd_rn(sum[i], widen(y.v[i]));
      }
      Vec<T> o;
#pragma unroll
      for (int i = 0; i < V; ++i) o.v[i] = narrow<T>(sum[i]);
      reinterpret_cast<uint4*>(out + static_cast<std::size_t>(t) * d.rowBytes)[c] = o.raw;
    }
  }
}

unsigned gridOf(std::size_t work) {
  return static_cast<unsigned>(std::clamp<std::size_t>(work, 1, 4096));
}

template <typename Fn>
Status withType(DataType t, Fn&& fn) {
  switch (t) {
    case DataType::bf16:
      return fn(static_cast<__nv_bfloat16*>(nullptr));
    case DataType::f16:
      return fn(static_cast<__half*>(nullptr));
    case DataType::f32:
      return fn(static_cast<float*>(nullptr));
    default:
      return invalidArgument("moe: bf16, f16 or f32 values");
  }
}

}  // namespace

std::size_t layoutShared(MoeDevice& d) {
  const auto rows = static_cast<std::size_t>(d.n) * static_cast<std::size_t>(d.tokens);
  d.metaInts = 1 + 2 * d.k;
  d.countsAt = kFlagsBytes;
  d.metaAt = aligned(d.countsAt + sizeof(std::int32_t) * kGpuMaxRanks);
  d.rowsAt = aligned(d.metaAt + rows * static_cast<std::size_t>(d.metaInts) * sizeof(std::int32_t));
  d.backAt = aligned(d.rowsAt + rows * d.sentBytes);
  return aligned(d.backAt + rows * d.rowBytes);
}

Status launchDispatchSend(const MoeDevice& d, const void* x, const std::int64_t* topkIdx,
                          const float* topkWeights, void* stream) {
  auto* s = static_cast<cudaStream_t>(stream);
  if (cudaError_t e = cudaMemsetAsync(d.status, 0, 3 * sizeof(unsigned long long), s);
      e != cudaSuccess)
    return cudaStatus("moe dispatch: clearing its status", e);
  const auto* rows = static_cast<const std::byte*>(x);
  if (d.fp8 && d.tokens > 0) {
    const auto n = static_cast<std::size_t>(d.tokens);
    const auto seg = fp8::Segments::of(d.codec, n, d.hidden, n * d.hidden);
    if (Status e = fp8::encodeSegmentsOnDevice(d.codec, d.type, x, seg, d.encoded, s); !e) return e;
    rows = d.encoded;
  }
  layoutKernel<<<static_cast<unsigned>(d.n), kThreads, 0, s>>>(d, topkIdx);
  sendKernel<<<gridOf(static_cast<std::size_t>(d.tokens)), kThreads, 0, s>>>(d, rows, topkIdx,
                                                                             topkWeights);
  signalKernel<<<1, 64, 0, s>>>(d, 0, 1);
  return launched("moe dispatch (send)");
}

Status launchDispatchRecv(const MoeDevice& d, void* recvX, std::int32_t* expertCounts,
                          std::int32_t* recvSource, float* recvScales, void* stream) {
  auto* s = static_cast<cudaStream_t>(stream);
  awaitKernel<<<1, 64, 0, s>>>(d, 0);
  countKernel<<<static_cast<unsigned>(d.L), kThreads, 0, s>>>(d, expertCounts);
  placeKernel<<<static_cast<unsigned>(d.L), kThreads, 0, s>>>(d, expertCounts, recvSource);
  gatherKernel<<<gridOf(static_cast<std::size_t>(d.n) * d.tokens), kThreads, 0, s>>>(
      d, static_cast<std::byte*>(recvX), recvScales);
  return launched("moe dispatch (receive)");
}

Status launchCombineSend(const MoeDevice& d, const void* expertOut, void* stream) {
  auto* s = static_cast<cudaStream_t>(stream);
  return withType(d.type, [&](auto* tag) -> Status {
    using T = std::remove_pointer_t<decltype(tag)>;
    combineSendKernel<T><<<gridOf(static_cast<std::size_t>(d.n) * d.tokens), kThreads, 0, s>>>(
        d, static_cast<const std::byte*>(expertOut));
    signalKernel<<<1, 64, 0, s>>>(d, kGpuMaxRanks, 0);
    return launched("moe combine (send)");
  });
}

Status launchCombineRecv(const MoeDevice& d, void* out, void* stream) {
  auto* s = static_cast<cudaStream_t>(stream);
  return withType(d.type, [&](auto* tag) -> Status {
    using T = std::remove_pointer_t<decltype(tag)>;
    awaitKernel<<<1, 64, 0, s>>>(d, kGpuMaxRanks);
    combineKernel<T><<<gridOf(static_cast<std::size_t>(d.tokens)), kThreads, 0, s>>>(
        d, static_cast<std::byte*>(out));
    return launched("moe combine (receive)");
  });
}

Status loadMoeKernels() {
  cudaFuncAttributes a{};
  cudaError_t e = cudaSuccess;
  for (const void* f :
       {reinterpret_cast<const void*>(layoutKernel), reinterpret_cast<const void*>(sendKernel),
        reinterpret_cast<const void*>(signalKernel), reinterpret_cast<const void*>(awaitKernel),
        reinterpret_cast<const void*>(countKernel), reinterpret_cast<const void*>(placeKernel),
        reinterpret_cast<const void*>(gatherKernel),
        reinterpret_cast<const void*>(combineSendKernel<__nv_bfloat16>),
        reinterpret_cast<const void*>(combineSendKernel<__half>),
        reinterpret_cast<const void*>(combineSendKernel<float>),
        reinterpret_cast<const void*>(combineKernel<__nv_bfloat16>),
        reinterpret_cast<const void*>(combineKernel<__half>),
        reinterpret_cast<const void*>(combineKernel<float>)}) {
    if (e == cudaSuccess) e = cudaFuncGetAttributes(&a, f);
  }
  return cudaStatus("moe: loading the kernels", e);
}

}  // namespace weft::fused::moe
