// MoE dispatch on GPU memory (device.hpp), in either mode, and the shared buffer's layout. Rows
// move in 16-byte vectors; peer-written data is read through L2 (ld.cg), where every rank's
// writes to this rank's memory land. Combine is in device_combine.cu, what both use in
// device_kernels.cuh.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <string>

#include "fused/cuda_steps.hpp"
#include "fused/fp8/codec_device.hpp"
#include "fused/moe/device_kernels.cuh"

namespace weft::fused::moe {
namespace {

constexpr std::size_t kAlign = 256;

std::size_t aligned(std::size_t b) {
  return (b + kAlign - 1) / kAlign * kAlign;
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
    sendKernel(MoeDevice d, const std::byte* x, const std::int64_t* idx, const float* w,
               bool records) {
  for (int t = static_cast<int>(blockIdx.x); t < d.tokens; t += static_cast<int>(gridDim.x)) {
    for (int q = 0; q < d.n; ++q) {
      const int slot = d.slotOf[static_cast<std::size_t>(t) * d.n + q];
      if (slot < 0) continue;
      const std::size_t at = static_cast<std::size_t>(d.me) * d.tokens + slot;
      copyRow(d.peers[q] + d.rowsAt + at * d.sentBytes,
              x + static_cast<std::size_t>(t) * d.sentBytes, d.sentBytes, false);
      if (!records) continue;  // numberChunksKernel wrote them
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
      auto* rows =
          reinterpret_cast<volatile std::int32_t*>(d.peers[q] + d.expertRowsAt) + d.me * d.L;
      for (int e = 0; withCounts == 2 && e < d.L; ++e) rows[e] = d.sentRows[q * d.L + e];
      __threadfence_system();
    }
    *reinterpret_cast<volatile std::uint64_t*>(flagAt(d, q, flagBase + d.me)) = epoch;
  }
  __threadfence_system();
}

__global__ void awaitKernel(MoeDevice d, int flagBase) {
  awaitFlags(d, flagBase);
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

// One 256-token chunk of the scan for rank q, from `base`, with *sent and perExpert (shared) the
// chunks' before: each token's slot there (slotOf, written by every block that scans q) and the
// records of the slots of channel ch of cs (each slot's local expert, weight and index among the
// rows that expert takes from this rank: the chunk's tokens of each expert as bits, the index
// the bits below); `write` false only counts. Adds the chunk's tokens and rows to both; `check`
// counts bad and repeated indices.
__device__ void numberChunk(const MoeDevice& d, int q, int base, int ch, int cs,
                            const std::int64_t* idx, const float* w, int* sent, int* perExpert,
                            bool check, bool write) {
  using Scan = cub::BlockScan<int, kThreads>;
  constexpr int kWords = kThreads / 32;
  __shared__ typename Scan::TempStorage tmp;
  // [expert][word]: the chunk's tokens (a bit each, in thread order) that go to each expert.
  __shared__ unsigned chunkOf[kLowLatencyMaxLocal * kWords];
  const int word = static_cast<int>(threadIdx.x) / 32;
  const unsigned bit = 1u << (threadIdx.x % 32);
  const int t = base + static_cast<int>(threadIdx.x);
  const std::int64_t* row = idx + static_cast<std::size_t>(t) * d.k;
  // The expert's local index where it lives at q, else -1.
  const auto localAtQ = [&](int j) {
    const std::int64_t e = row[j];
    return e >= 0 && e < d.experts && e / d.L == q ? static_cast<int>(e % d.L) : -1;
  };
  for (int i = static_cast<int>(threadIdx.x); i < d.L * kWords; i += kThreads) chunkOf[i] = 0;
  __syncthreads();
  int going = 0;
  for (int j = 0; t < d.tokens && j < d.k; ++j) {
    if (const int l = localAtQ(j); l >= 0) {
      going = 1;
      atomicOr(&chunkOf[l * kWords + word], bit);
    }
    if (!check) continue;
    const std::int64_t e = row[j];
    if (e < -1 || e >= d.experts) atomicAdd(&d.status[0], 1ULL);
    for (int i = 0; e >= 0 && e < d.experts && i < j; ++i)
      if (row[i] == e) atomicAdd(&d.status[1], 1ULL);
  }
  int prefix = 0, total = 0;
  Scan(tmp).ExclusiveSum(going, prefix, total);
  __syncthreads();  // every token's bits set
  const int slot = *sent + prefix;
  // Every block of q writes the same slots; each reads its own back to copy its rows.
  if (write && t < d.tokens) d.slotOf[static_cast<std::size_t>(t) * d.n + q] = going ? slot : -1;
  if (write && going != 0 && slot % cs == ch) {
    auto* meta = reinterpret_cast<std::int32_t*>(d.peers[q] + d.metaAt) +
                 (static_cast<std::size_t>(d.me) * d.tokens + slot) * d.metaInts;
    meta[0] = t;
    for (int j = 0; j < d.k; ++j) {
      const int l = localAtQ(j);
      meta[localAt(j)] = l;
      meta[localAt(j) + 1] = __float_as_int(w[static_cast<std::size_t>(t) * d.k + j]);
      if (l < 0) continue;
      // Its index among the rows of expert l: those of the chunks before, then the bits below.
      int below = __popc(chunkOf[l * kWords + word] & (bit - 1));
      for (int i = 0; i < word; ++i) below += __popc(chunkOf[l * kWords + i]);
      meta[localAt(j) + 2] = perExpert[l] + below;
    }
  }
  __syncthreads();
  for (int e = static_cast<int>(threadIdx.x); e < d.L; e += kThreads)
    for (int i = 0; i < kWords; ++i) perExpert[e] += __popc(chunkOf[e * kWords + i]);
  if (threadIdx.x == 0) *sent += total;
  __syncthreads();
}

// The block's scan of every token for rank q, chunk by chunk (numberChunk); leaves the tokens
// sent q in *sent and the rows each of its experts takes in perExpert; block (0, 0) counts bad
// and repeated indices.
__device__ void numberTokens(const MoeDevice& d, int q, int ch, int cs, const std::int64_t* idx,
                             const float* w, int* sent, int* perExpert) {
  for (int e = static_cast<int>(threadIdx.x); e < d.L; e += kThreads) perExpert[e] = 0;
  if (threadIdx.x == 0) *sent = 0;
  __syncthreads();
  for (int base = 0; base < d.tokens; base += kThreads)
    numberChunk(d, q, base, ch, cs, idx, w, sent, perExpert, q == 0 && ch == 0, true);
}

// Normal mode where the table fits (moeTableFits), every chunk of 256 tokens at once, in two
// kernels on a grid of (chunks, n). First each chunk's tokens and rows for rank q (chunkRows);
// blocks for rank 0 count bad and repeated indices.
__global__ void __launch_bounds__(kThreads)
    countChunksKernel(MoeDevice d, const std::int64_t* idx, const float* w) {
  __shared__ int sent, perExpert[kLowLatencyMaxLocal];
  const int c = static_cast<int>(blockIdx.x), q = static_cast<int>(blockIdx.y);
  for (int e = static_cast<int>(threadIdx.x); e < d.L; e += kThreads) perExpert[e] = 0;
  if (threadIdx.x == 0) sent = 0;
  __syncthreads();
  numberChunk(d, q, c * kThreads, 0, 1, idx, w, &sent, perExpert, q == 0, false);
  std::int32_t* mine = d.chunkRows + (static_cast<std::size_t>(q) * gridDim.x + c) * (1 + d.L);
  for (int e = static_cast<int>(threadIdx.x); e < d.L; e += kThreads) mine[1 + e] = perExpert[e];
  if (threadIdx.x == 0) mine[0] = sent;
}

// Then each chunk numbered from the chunks' before it; the last keeps the counts for
// signalKernel to send.
__global__ void __launch_bounds__(kThreads)
    numberChunksKernel(MoeDevice d, const std::int64_t* idx, const float* w) {
  __shared__ int sent, perExpert[kLowLatencyMaxLocal];
  const int c = static_cast<int>(blockIdx.x), q = static_cast<int>(blockIdx.y);
  const std::int32_t* all = d.chunkRows + static_cast<std::size_t>(q) * gridDim.x * (1 + d.L);
  for (int i = static_cast<int>(threadIdx.x); i <= d.L; i += kThreads) {
    int before = 0;
    for (int b = 0; b < c; ++b) before += all[static_cast<std::size_t>(b) * (1 + d.L) + i];
    if (i == 0) {
      sent = before;
    } else {
      perExpert[i - 1] = before;
    }
  }
  __syncthreads();
  numberChunk(d, q, c * kThreads, 0, 1, idx, w, &sent, perExpert, false, true);
  if (c + 1 != static_cast<int>(gridDim.x)) return;
  for (int e = static_cast<int>(threadIdx.x); e < d.L; e += kThreads)
    d.sentRows[q * d.L + e] = perExpert[e];
  if (threadIdx.x == 0) d.sendCount[q] = sent;
}

// The low-latency dispatch's send, a grid of n × cs blocks. Block (q, ch) finds every token's slot
// at rank q and its index among the rows each of q's experts takes from this rank (numberTokens),
// writes the records and rows of every cs-th slot from ch, and the last of q's blocks writes q
// the rows and raises its flag.
__global__ void __launch_bounds__(kThreads)
    lowLatencySendKernel(MoeDevice d, const std::byte* x, const std::int64_t* idx, const float* w) {
  __shared__ int sent, perExpert[kLowLatencyMaxLocal];
  const int cs = static_cast<int>(gridDim.x) / d.n;
  const int q = static_cast<int>(blockIdx.x) / cs, ch = static_cast<int>(blockIdx.x) % cs;
  numberTokens(d, q, ch, cs, idx, w, &sent, perExpert);
  // This block's rows (every cs-th slot from ch), a warp a row: each warp looks at 32 tokens at a
  // time and copies those of them that are this block's.
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  for (int t0 = 32 * warp; t0 < d.tokens; t0 += kThreads) {
    const int t = t0 + lane;
    const int slot = t < d.tokens ? d.slotOf[static_cast<std::size_t>(t) * d.n + q] : -1;
    unsigned rows = __ballot_sync(0xffffffffu, slot >= 0 && slot % cs == ch);
    while (rows != 0) {
      const int i0 = __ffs(rows) - 1;
      rows &= rows - 1;
      const int token = t0 + i0, at = __shfl_sync(0xffffffffu, slot, i0);
      copyVectors(
          d.peers[q] + d.rowsAt + (static_cast<std::size_t>(d.me) * d.tokens + at) * d.sentBytes,
          x + static_cast<std::size_t>(token) * d.sentBytes, d.sentBytes,
          static_cast<std::size_t>(lane), 32, false);
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
__device__ void placeFromTable(const MoeDevice& d, std::byte* recvX, std::int32_t* expertCounts,
                               std::int32_t* recvSource, float* recvScales) {
  __shared__ int first[kLowLatencyMaxTable], before[kLowLatencyMaxLocal];
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

__global__ void __launch_bounds__(kThreads)
    lowLatencyRecvKernel(MoeDevice d, std::byte* recvX, std::int32_t* expertCounts,
                         std::int32_t* recvSource, float* recvScales) {
  awaitFlags(d, 0);
  placeFromTable(d, recvX, expertCounts, recvSource, recvScales);
}

// Normal mode where the table fits: the same after awaitKernel, on as many blocks as the plan's.
__global__ void __launch_bounds__(kThreads)
    tableGatherKernel(MoeDevice d, std::byte* recvX, std::int32_t* expertCounts,
                      std::int32_t* recvSource, float* recvScales) {
  placeFromTable(d, recvX, expertCounts, recvSource, recvScales);
}

}  // namespace

Status launchSignal(const MoeDevice& d, int flagBase, bool withCounts, cudaStream_t s) {
  signalKernel<<<1, 64, 0, s>>>(d, flagBase, withCounts ? 1 : 0);
  return launched("moe: raising the flags");
}

Status launchAwait(const MoeDevice& d, int flagBase, cudaStream_t s) {
  awaitKernel<<<1, 64, 0, s>>>(d, flagBase);
  return launched("moe: awaiting the flags");
}

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
  const bool table = d.table;
  if (table) {
    const dim3 grid(static_cast<unsigned>(std::max(1, (d.tokens + kThreads - 1) / kThreads)),
                    static_cast<unsigned>(d.n));
    countChunksKernel<<<grid, kThreads, 0, s>>>(d, topkIdx, topkWeights);
    numberChunksKernel<<<grid, kThreads, 0, s>>>(d, topkIdx, topkWeights);
  } else {
    layoutKernel<<<static_cast<unsigned>(d.n), kThreads, 0, s>>>(d, topkIdx);
  }
  sendKernel<<<gridOf(d, static_cast<std::size_t>(d.tokens)), kThreads, 0, s>>>(
      d, rows, topkIdx, topkWeights, !table);
  signalKernel<<<1, 64, 0, s>>>(d, 0, table ? 2 : 1);
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
  if (d.table) {
    tableGatherKernel<<<gridOf(d, static_cast<std::size_t>(d.n) * d.tokens), kThreads, 0, s>>>(
        d, static_cast<std::byte*>(recvX), expertCounts, recvSource, recvScales);
    return launched("moe dispatch (receive)");
  }
  countKernel<<<static_cast<unsigned>(d.L), kThreads, 0, s>>>(d, expertCounts);
  placeKernel<<<static_cast<unsigned>(d.L), kThreads, 0, s>>>(d, expertCounts, recvSource);
  gatherKernel<<<gridOf(d, static_cast<std::size_t>(d.n) * d.tokens), kThreads, 0, s>>>(
      d, static_cast<std::byte*>(recvX), recvScales);
  return launched("moe dispatch (receive)");
}

Status loadMoeKernels() {
  if (Status s = loadKernels("moe: loading the kernels", layoutKernel, sendKernel, signalKernel,
                             awaitKernel, countKernel, placeKernel, gatherKernel, countChunksKernel,
                             numberChunksKernel, lowLatencySendKernel, lowLatencyRecvKernel);
      !s)
    return s;
  return loadCombineKernels();
}

}  // namespace weft::fused::moe
