// What the MoE kernels of device.cu (dispatch) and device_combine.cu (combine) share: the block
// size, the flags, the records, the row copies, the waits, the values' conversions and the
// grids. docs/algorithms-fused.md, "MoE dispatch and combine".
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "fused/moe/device.hpp"

namespace weft::fused::moe {

inline constexpr int kThreads = 256;
inline constexpr int kInFlight = 4;  // 16-byte loads a thread keeps in flight in the copy loops
__device__ inline std::uint64_t now() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ inline std::uint64_t* flagAt(const MoeDevice& d, int rank, int index) {
  return reinterpret_cast<std::uint64_t*>(d.peers[rank] +
                                          static_cast<std::size_t>(index) * kFlagStride);
}

// A record's fields: its token at 0, then per slot its local expert, weight and index.
__device__ constexpr int localAt(int slot) {
  return 1 + 3 * slot;
}

// A row's 16-byte vectors by the threads first, first + step, ... (a block, or a warp's lanes),
// kInFlight loads a thread in flight before their stores (one at a time, the copies would wait
// out a load's latency per vector).
__device__ inline void copyVectors(std::byte* to, const std::byte* from, std::size_t bytes,
                                   std::size_t first, std::size_t step, bool peerWritten) {
  auto* t = reinterpret_cast<uint4*>(to);
  const auto* f = reinterpret_cast<const uint4*>(from);
  const std::size_t vectors = bytes / 16;
  for (std::size_t base = first; base < vectors; base += step * kInFlight) {
    uint4 v[kInFlight];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u)
      if (const std::size_t i = base + u * step; i < vectors)
        v[u] = peerWritten ? __ldcg(f + i) : f[i];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u)
      if (const std::size_t i = base + u * step; i < vectors) t[i] = v[u];
  }
}

// A row by the block.
__device__ inline void copyRow(std::byte* to, const std::byte* from, std::size_t bytes,
                               bool peerWritten) {
  copyVectors(to, from, bytes, threadIdx.x, blockDim.x, peerWritten);
}

// Until every rank's flag of this call is up in this rank's buffer (the block's threads wait on
// a rank each); past the timeout the kernel traps (the stream fails rather than hang on a dead
// peer).
__device__ inline void awaitFlags(const MoeDevice& d, int flagBase) {
  const std::uint64_t want = *d.epoch, start = now();
  for (int s = static_cast<int>(threadIdx.x); s < d.n; s += static_cast<int>(blockDim.x)) {
    const auto* flag =
        reinterpret_cast<const volatile std::uint64_t*>(flagAt(d, d.me, flagBase + s));
    while (*flag < want) {
      if (now() - start > d.timeoutNs) __trap();
      __nanosleep(200);
    }
  }
  __syncthreads();
  __threadfence_system();
}

__device__ inline int receivedFrom(const MoeDevice& d, int s) {
  return __ldcg(reinterpret_cast<const std::int32_t*>(d.peers[d.me] + d.countsAt) + s);
}
__device__ inline const std::int32_t* recordOf(const MoeDevice& d, int s, int j) {
  return reinterpret_cast<const std::int32_t*>(d.peers[d.me] + d.metaAt) +
         (static_cast<std::size_t>(s) * d.tokens + j) * d.metaInts;
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

// A thread's kInFlight sums (vectors c0, c0 + step, ...) rounded to T into `to`.
template <typename T>
__device__ void storeSums(uint4* to, const float (&sums)[kInFlight][Vec<T>::V], std::size_t c0,
                          std::size_t step, std::size_t chunks) {
#pragma unroll
  for (int u = 0; u < kInFlight; ++u) {
    if (c0 + u * step >= chunks) continue;
    Vec<T> out;
#pragma unroll
    for (int i = 0; i < Vec<T>::V; ++i) out.v[i] = narrow<T>(sums[u][i]);
    to[c0 + u * step] = out.raw;
  }
}

// Whether this block is the last of `blocks` to be done with counter `c` (which it resets for the
// next call). The barrier orders the block's writes before its thread 0's system fence, and the
// last block fences again after the count, so the flags it raises next follow every block's
// writes.
__device__ inline bool lastDone(unsigned* c, unsigned blocks) {
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();
    last = atomicAdd(c, 1u) == blocks - 1;
    if (last) {
      *c = 0;
      __threadfence_system();
    }
  }
  __syncthreads();
  return last;
}

// A copy kernel's blocks: one per item of work, at most the plan's channels.
inline unsigned gridOf(const MoeDevice& d, std::size_t work) {
  return static_cast<unsigned>(
      std::clamp<std::size_t>(work, 1, static_cast<std::size_t>(std::max(1, d.channels))));
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

// The flags of a call (dispatch's at 0 with its row counts, combine's at kGpuMaxRanks) raised in
// every rank's buffer after the stream's kernels so far; a wait until every rank's are up here.
Status launchSignal(const MoeDevice& d, int flagBase, bool withCounts, cudaStream_t s);
Status launchAwait(const MoeDevice& d, int flagBase, cudaStream_t s);

}  // namespace weft::fused::moe
