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
constexpr int kInFlight = 4;  // 16-byte loads a thread keeps in flight in the copy loops
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

// A record's fields: its token at 0, then per slot its local expert, weight and index.
__device__ constexpr int localAt(int slot) {
  return 1 + 3 * slot;
}

// A row by the block, four 16-byte loads a thread in flight before their stores (one at a time,
// a block's copies wait out a load's latency per vector).
__device__ void copyRow(std::byte* to, const std::byte* from, std::size_t bytes, bool peerWritten) {
  auto* t = reinterpret_cast<uint4*>(to);
  const auto* f = reinterpret_cast<const uint4*>(from);
  const std::size_t vectors = bytes / 16, step = blockDim.x;
  for (std::size_t base = threadIdx.x; base < vectors; base += step * kInFlight) {
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
        meta[localAt(j)] = there ? static_cast<std::int32_t>(e % d.L) : -1;
        meta[localAt(j) + 1] = __float_as_int(w[static_cast<std::size_t>(t) * d.k + j]);
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

// Until every rank's flag of this call is up in this rank's buffer (the block's threads wait on
// a rank each); past the timeout the kernel traps (the stream fails rather than hang on a dead
// peer).
__device__ void awaitFlags(const MoeDevice& d, int flagBase) {
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

__global__ void awaitKernel(MoeDevice d, int flagBase) {
  awaitFlags(d, flagBase);
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
        const int local = __ldcg(m + localAt(slot));
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
      for (int slot = 0; m != nullptr && slot < d.k; ++slot) hits += __ldcg(m + localAt(slot)) == e;
      int prefix = 0, total = 0;
      Scan(tmp).ExclusiveSum(hits, prefix, total);
      std::size_t pos = base + static_cast<std::size_t>(running + prefix);
      for (int slot = 0; hits > 0 && slot < d.k; ++slot) {
        if (__ldcg(m + localAt(slot)) != e) continue;
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

// Received row p (at `from`) into its slots' rows of recvX (fp8: the elements there, the scales
// to recvScales), `rows[slot]` (shared; −1: none): each vector loaded once, stored to every slot.
__device__ void fanOut(const MoeDevice& d, std::byte* recvX, float* recvScales,
                       const std::byte* from, const int* rows, int slots) {
  const std::size_t recvBytes = d.fp8 ? d.hidden : d.rowBytes, vectors = recvBytes / 16;
  const auto* f = reinterpret_cast<const uint4*>(from);
  const std::size_t step = blockDim.x;
  for (std::size_t base = threadIdx.x; base < vectors; base += step * kInFlight) {
    uint4 v[kInFlight];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u)
      if (base + u * step < vectors) v[u] = __ldcg(f + base + u * step);
    for (int slot = 0; slot < slots; ++slot) {
      if (rows[slot] < 0) continue;
      auto* t = reinterpret_cast<uint4*>(recvX + static_cast<std::size_t>(rows[slot]) * recvBytes);
#pragma unroll
      for (int u = 0; u < kInFlight; ++u)
        if (base + u * step < vectors) t[base + u * step] = v[u];
    }
  }
  if (!d.fp8) return;
  const std::size_t blocks = d.hidden / 128;
  const auto* scales = reinterpret_cast<const float*>(from + d.hidden);
  for (std::size_t b = threadIdx.x; b < blocks; b += blockDim.x) {
    const float x = __ldcg(scales + b);
    for (int slot = 0; slot < slots; ++slot)
      if (rows[slot] >= 0) recvScales[static_cast<std::size_t>(rows[slot]) * blocks + b] = x;
  }
}

// Each received row copied to its slots' rows of recvX, kThreads slots at a time.
__global__ void __launch_bounds__(kThreads)
    gatherKernel(MoeDevice d, std::byte* recvX, float* recvScales) {
  __shared__ int rows[kThreads];
  const std::size_t pairs = static_cast<std::size_t>(d.n) * d.tokens;
  for (std::size_t p = blockIdx.x; p < pairs; p += gridDim.x) {
    const int s = static_cast<int>(p / d.tokens), j = static_cast<int>(p % d.tokens);
    if (j >= receivedFrom(d, s)) continue;
    for (int first = 0; first < d.k; first += kThreads) {
      const int slots = min(kThreads, d.k - first);
      __syncthreads();
      if (const int slot = static_cast<int>(threadIdx.x); slot < slots)
        rows[slot] = d.rowPos[p * d.k + first + slot];
      __syncthreads();
      fanOut(d, recvX, recvScales, d.peers[d.me] + d.rowsAt + p * d.sentBytes, rows, slots);
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
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        if (c0 + u * step >= chunks) continue;
        Vec<T> out;
#pragma unroll
        for (int i = 0; i < V; ++i) out.v[i] = narrow<T>(acc[u][i]);
        to[c0 + u * step] = out.raw;
      }
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
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        if (c0 + u * step >= chunks) continue;
        Vec<T> o;
#pragma unroll
        for (int i = 0; i < V; ++i) o.v[i] = narrow<T>(sum[u][i]);
        reinterpret_cast<uint4*>(out + static_cast<std::size_t>(t) * d.rowBytes)[c0 + u * step] =
            o.raw;
      }
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

// Whether this block is the last of `blocks` to be done with counter `c` (which it resets for the
// next call). The barrier orders the block's writes before its thread 0's system fence, and the
// last block fences again after the count, so the flags it raises next follow every block's
// writes.
__device__ bool lastDone(unsigned* c, unsigned blocks) {
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

// The low-latency dispatch's send, a grid of n × cs blocks. Block (q, ch) finds every token's slot
// at rank q and its index among the rows each of q's experts takes from this rank (block scans,
// the experts' counts 7 to a 64-bit word), writes the records and rows of every cs-th slot from
// ch, and the last of q's blocks writes q the rows and raises its flag.
constexpr int kPacked = 7, kFieldBits = 9;  // a field holds up to 256 tokens' hits, and more

__global__ void __launch_bounds__(kThreads)
    lowLatencySendKernel(MoeDevice d, const std::byte* x, const std::int64_t* idx, const float* w) {
  using Scan = cub::BlockScan<int, kThreads>;
  using WideScan = cub::BlockScan<unsigned long long, kThreads>;
  __shared__ union {
    typename Scan::TempStorage narrow;
    typename WideScan::TempStorage wide;
  } tmp;
  __shared__ int sent, perExpert[kLowLatencyMaxLocal];
  const int cs = static_cast<int>(gridDim.x) / d.n;
  const int q = static_cast<int>(blockIdx.x) / cs, ch = static_cast<int>(blockIdx.x) % cs;
  for (int e = static_cast<int>(threadIdx.x); e < d.L; e += kThreads) perExpert[e] = 0;
  if (threadIdx.x == 0) sent = 0;
  __syncthreads();
  const auto field = [](unsigned long long word, int i) {
    return static_cast<int>((word >> (kFieldBits * i)) & ((1u << kFieldBits) - 1));
  };
  for (int base = 0; base < d.tokens; base += kThreads) {
    const int t = base + static_cast<int>(threadIdx.x);
    const std::int64_t* row = idx + static_cast<std::size_t>(t) * d.k;
    // The expert's local index where it lives at q, else -1.
    const auto localAtQ = [&](int j) {
      const std::int64_t e = row[j];
      return e >= 0 && e < d.experts && e / d.L == q ? static_cast<int>(e % d.L) : -1;
    };
    int going = 0;
    for (int j = 0; t < d.tokens && j < d.k; ++j) {
      going |= localAtQ(j) >= 0 ? 1 : 0;
      if (q != 0 || ch != 0) continue;
      const std::int64_t e = row[j];
      if (e < -1 || e >= d.experts) atomicAdd(&d.status[0], 1ULL);
      for (int i = 0; e >= 0 && e < d.experts && i < j; ++i)
        if (row[i] == e) atomicAdd(&d.status[1], 1ULL);
    }
    int prefix = 0, total = 0;
    Scan(tmp.narrow).ExclusiveSum(going, prefix, total);
    const int slot = sent + prefix;
    // Every block of q writes the same slots; each reads its own back to copy its rows.
    if (t < d.tokens) d.slotOf[static_cast<std::size_t>(t) * d.n + q] = going != 0 ? slot : -1;
    std::int32_t* meta = nullptr;
    if (going != 0 && slot % cs == ch) {
      meta = reinterpret_cast<std::int32_t*>(d.peers[q] + d.metaAt) +
             (static_cast<std::size_t>(d.me) * d.tokens + slot) * d.metaInts;
      meta[0] = t;
      for (int j = 0; j < d.k; ++j) {
        meta[localAt(j)] = localAtQ(j);
        meta[localAt(j) + 1] = __float_as_int(w[static_cast<std::size_t>(t) * d.k + j]);
      }
    }
    for (int g = 0; g * kPacked < d.L; ++g) {
      unsigned long long mine = 0, before = 0, all = 0;
      for (int j = 0; going != 0 && j < d.k; ++j)
        if (const int l = localAtQ(j); l >= 0 && l / kPacked == g)
          mine += 1ULL << (kFieldBits * (l % kPacked));
      __syncthreads();
      WideScan(tmp.wide).ExclusiveSum(mine, before, all);
      for (int j = 0; meta != nullptr && j < d.k; ++j)
        if (const int l = localAtQ(j); l >= 0 && l / kPacked == g)
          meta[localAt(j) + 2] = perExpert[l] + field(before, l % kPacked);
      __syncthreads();
      if (const int l = g * kPacked + static_cast<int>(threadIdx.x);
          threadIdx.x < kPacked && l < d.L)
        perExpert[l] += field(all, static_cast<int>(threadIdx.x));
    }
    __syncthreads();
    if (threadIdx.x == 0) sent += total;
    __syncthreads();
  }
  // This block's rows (every cs-th slot from ch), a warp a row: each warp looks at 32 tokens at a
  // time and copies those of them that are this block's.
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const std::size_t vectors = d.sentBytes / 16;
  for (int t0 = 32 * warp; t0 < d.tokens; t0 += kThreads) {
    const int t = t0 + lane;
    const int slot = t < d.tokens ? d.slotOf[static_cast<std::size_t>(t) * d.n + q] : -1;
    unsigned rows = __ballot_sync(0xffffffffu, slot >= 0 && slot % cs == ch);
    while (rows != 0) {
      const int i0 = __ffs(rows) - 1;
      rows &= rows - 1;
      const int token = t0 + i0, at = __shfl_sync(0xffffffffu, slot, i0);
      const auto* from =
          reinterpret_cast<const uint4*>(x + static_cast<std::size_t>(token) * d.sentBytes);
      auto* to = reinterpret_cast<uint4*>(
          d.peers[q] + d.rowsAt + (static_cast<std::size_t>(d.me) * d.tokens + at) * d.sentBytes);
      for (std::size_t i = static_cast<std::size_t>(lane); i < vectors; i += 32 * kInFlight) {
        uint4 v[kInFlight];
#pragma unroll
        for (int u = 0; u < kInFlight; ++u)
          if (i + 32 * u < vectors) v[u] = from[i + 32 * u];
#pragma unroll
        for (int u = 0; u < kInFlight; ++u)
          if (i + 32 * u < vectors) to[i + 32 * u] = v[u];
      }
    }
  }
  if (!lastDone(d.arrived + q, static_cast<unsigned>(cs))) return;
  if (threadIdx.x == 0) {
    auto* rows = reinterpret_cast<volatile std::int32_t*>(d.peers[q] + d.expertRowsAt) + d.me * d.L;
    for (int e = 0; e < d.L; ++e) rows[e] = perExpert[e];
    reinterpret_cast<volatile std::int32_t*>(d.peers[q] + d.countsAt)[d.me] = sent;
    __threadfence_system();
    *reinterpret_cast<volatile std::uint64_t*>(flagAt(d, q, d.me)) = *d.epoch;
  }
}

// The low-latency dispatch's receive: once every source's flag is up, each block makes the
// table of where each source's rows of each local expert start (the lower experts' rows first,
// then the lower sources'), and copies its share of the received rows to their slots' rows of
// recvX, where the sender's index puts them: the rows, counts and sources of the normal mode.
__global__ void __launch_bounds__(kThreads)
    lowLatencyRecvKernel(MoeDevice d, std::byte* recvX, std::int32_t* expertCounts,
                         std::int32_t* recvSource, float* recvScales) {
  __shared__ int first[kLowLatencyMaxTable], before[kLowLatencyMaxLocal];
  awaitFlags(d, 0);
  const int cells = d.n * d.L;
  const auto* sent = reinterpret_cast<const std::int32_t*>(d.peers[d.me] + d.expertRowsAt);
  for (int i = static_cast<int>(threadIdx.x); i < cells; i += kThreads) first[i] = __ldcg(sent + i);
  __syncthreads();
  for (int e = static_cast<int>(threadIdx.x); e < d.L; e += kThreads) {
    int run = 0;
    for (int s = 0; s < d.n; ++s) {
      const int c = first[s * d.L + e];
      first[s * d.L + e] = run;
      run += c;
    }
    before[e] = run;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int base = 0;
    for (int e = 0; e < d.L; ++e) {
      const int c = before[e];
      before[e] = base;
      base += c;
      if (blockIdx.x == 0) expertCounts[e] = c;
    }
  }
  __syncthreads();
  for (int i = static_cast<int>(threadIdx.x); i < cells; i += kThreads) first[i] += before[i % d.L];
  __syncthreads();
  __shared__ int rows[kThreads];
  const std::size_t pairs = static_cast<std::size_t>(d.n) * d.tokens;
  for (std::size_t p = blockIdx.x; p < pairs; p += gridDim.x) {
    const int s = static_cast<int>(p / d.tokens), j = static_cast<int>(p % d.tokens);
    if (j >= receivedFrom(d, s)) continue;
    const std::int32_t* m = recordOf(d, s, j);
    for (int head = 0; head < d.k; head += kThreads) {
      const int slots = min(kThreads, d.k - head);
      __syncthreads();
      if (const int slot = head + static_cast<int>(threadIdx.x); slot < d.k) {
        const int local = __ldcg(m + localAt(slot));
        int row = -1;
        if (local >= 0 && local < d.L) {
          const auto at =
              static_cast<std::size_t>(first[s * d.L + local] + __ldcg(m + localAt(slot) + 2));
          if (at < d.capacity) {
            row = static_cast<int>(at);
            if (recvSource != nullptr) {
              recvSource[2 * at] = s;
              recvSource[2 * at + 1] = __ldcg(m);
            }
          } else {
            atomicAdd(&d.status[2], 1ULL);
          }
        }
        d.rowPos[p * d.k + slot] = row;
        rows[slot - head] = row;
      }
      __syncthreads();
      fanOut(d, recvX, recvScales, d.peers[d.me] + d.rowsAt + p * d.sentBytes, rows, slots);
    }
  }
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

// A copy kernel's blocks: one per item of work, at most the plan's channels.
unsigned gridOf(const MoeDevice& d, std::size_t work) {
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

}  // namespace

std::size_t layoutShared(MoeDevice& d) {
  const auto rows = static_cast<std::size_t>(d.n) * static_cast<std::size_t>(d.tokens);
  d.metaInts = 1 + 3 * d.k;
  d.countsAt = kFlagsBytes;
  d.expertRowsAt = aligned(d.countsAt + sizeof(std::int32_t) * kGpuMaxRanks);
  d.metaAt = aligned(d.expertRowsAt + sizeof(std::int32_t) * static_cast<std::size_t>(d.n * d.L));
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
  if (d.lowLatency) {
    const auto perRank = static_cast<unsigned>(std::max(1, d.channels / d.n));
    lowLatencySendKernel<<<perRank* static_cast<unsigned>(d.n), kThreads, 0, s>>>(d, rows, topkIdx,
                                                                                  topkWeights);
    return launched("moe dispatch (send)");
  }
  layoutKernel<<<static_cast<unsigned>(d.n), kThreads, 0, s>>>(d, topkIdx);
  sendKernel<<<gridOf(d, static_cast<std::size_t>(d.tokens)), kThreads, 0, s>>>(d, rows, topkIdx,
                                                                                topkWeights);
  signalKernel<<<1, 64, 0, s>>>(d, 0, 1);
  return launched("moe dispatch (send)");
}

Status launchDispatchRecv(const MoeDevice& d, void* recvX, std::int32_t* expertCounts,
                          std::int32_t* recvSource, float* recvScales, void* stream) {
  auto* s = static_cast<cudaStream_t>(stream);
  if (d.lowLatency) {
    lowLatencyRecvKernel<<<gridOf(d, static_cast<std::size_t>(d.n) * d.tokens), kThreads, 0, s>>>(
        d, static_cast<std::byte*>(recvX), expertCounts, recvSource, recvScales);
    return launched("moe dispatch (receive)");
  }
  awaitKernel<<<1, 64, 0, s>>>(d, 0);
  countKernel<<<static_cast<unsigned>(d.L), kThreads, 0, s>>>(d, expertCounts);
  placeKernel<<<static_cast<unsigned>(d.L), kThreads, 0, s>>>(d, expertCounts, recvSource);
  gatherKernel<<<gridOf(d, static_cast<std::size_t>(d.n) * d.tokens), kThreads, 0, s>>>(
      d, static_cast<std::byte*>(recvX), recvScales);
  return launched("moe dispatch (receive)");
}

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
    signalKernel<<<1, 64, 0, s>>>(d, kGpuMaxRanks, 0);
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
      awaitKernel<<<1, 64, 0, s>>>(d, kGpuMaxRanks);
      combineKernel<T><<<grid, kThreads, 0, s>>>(d, static_cast<std::byte*>(out));
    }
    return launched("moe combine (receive)");
  });
}

Status loadMoeKernels() {
  cudaFuncAttributes a{};
  cudaError_t e = cudaSuccess;
  for (const void* f : {reinterpret_cast<const void*>(layoutKernel),
                        reinterpret_cast<const void*>(sendKernel),
                        reinterpret_cast<const void*>(signalKernel),
                        reinterpret_cast<const void*>(awaitKernel),
                        reinterpret_cast<const void*>(countKernel),
                        reinterpret_cast<const void*>(placeKernel),
                        reinterpret_cast<const void*>(gatherKernel),
                        reinterpret_cast<const void*>(combineSendKernel<__nv_bfloat16>),
                        reinterpret_cast<const void*>(combineSendKernel<__half>),
                        reinterpret_cast<const void*>(combineSendKernel<float>),
                        reinterpret_cast<const void*>(combineKernel<__nv_bfloat16>),
                        reinterpret_cast<const void*>(combineKernel<__half>),
                        reinterpret_cast<const void*>(combineKernel<float>),
                        reinterpret_cast<const void*>(lowLatencySendKernel),
                        reinterpret_cast<const void*>(lowLatencyRecvKernel),
                        reinterpret_cast<const void*>(lowLatencyCombineSendKernel<__nv_bfloat16>),
                        reinterpret_cast<const void*>(lowLatencyCombineSendKernel<__half>),
                        reinterpret_cast<const void*>(lowLatencyCombineSendKernel<float>),
                        reinterpret_cast<const void*>(lowLatencyCombineKernel<__nv_bfloat16>),
                        reinterpret_cast<const void*>(lowLatencyCombineKernel<__half>),
                        reinterpret_cast<const void*>(lowLatencyCombineKernel<float>)}) {
    if (e == cudaSuccess) e = cudaFuncGetAttributes(&a, f);
  }
  return cudaStatus("moe: loading the kernels", e);
}

}  // namespace weft::fused::moe
