// The direct kernels: every rank reads every rank's input from its slab (or its registered
// buffer) in rounds, one-shot and two-shot all-reduce and the one-shot block collectives.
#include <algorithm>
#include <string>

#include "src/device/elementwise.cuh"
#include "src/device/launch.cuh"
#include "src/device/ordering.cuh"
#include "src/device/schedule_kernel.hpp"

namespace weft::device {
namespace {

// outs = rank 0's (op) rank 1's (op) ... (op) rank n-1's elements [at, at + n) of the buffers
// bases[q] + offset (bytes), in rank order: ranks 0..63, then the running sum (outs[0]) and up to
// 63 more at a time; outs past the first get only the final sum (one may be a slab a later group
// still reads). `ins` is shared memory that thread 0 fills.
template <typename T, typename Op>
__device__ void sumInRankOrder(const LaunchArgs& a, std::byte* const* bases, std::size_t offset,
                               std::size_t at, std::size_t n, T* const* outs, int nouts,
                               const T** ins) {
  for (int first = 0; first < a.nranks;) {
    const int take = first == 0 ? (a.nranks < 64 ? a.nranks : 64)
                                : (a.nranks - first < 63 ? a.nranks - first : 63);
    const int nins = first > 0 ? take + 1 : take;
    if (threadIdx.x == 0) {
      int k = 0;
      if (first > 0) ins[k++] = outs[0];
      for (int q = first; q < first + take; ++q)
        ins[k++] = reinterpret_cast<const T*>(bases[q] + offset) + at;
    }
    __syncthreads();
    const bool last = first + take >= a.nranks;
    elementwise<T, Op>(outs, last ? nouts : 1, ins, nins, first > 0 ? 1 : 0, n);
    __syncthreads();
    first += take;
  }
}

// The direct all-reduce kernels: block b takes the b-th slab's worth of the input and copies it
// into its slab of this rank's inbox (two per block, alternating by the block's call count),
// then raises word 0 of its flag to the call count.
//   One-shot: it sums slab b of every rank, in rank order, into its output.
//   Two-shot: the slab is cut into one piece per rank; it sums piece `rank` of every rank's
//   slab, in rank order, into its output and back into its own slab, raises word 1, and copies
//   every other rank's summed piece into its output.
// Each element is summed in rank order on one rank only, so every rank gets the same bits.
// A slab is rewritten two calls of that block later; in the call between, every rank waited for
// every peer's word 0 of that call, which a peer raises only after finishing the call before.
// On registered inputs (a.registered) nothing is copied: word 0 says "my input is there" (it is,
// the kernel being ordered after whatever wrote it), and the sums read every rank's input in
// place. No rank's stream may go on to change an input a peer still reads: one-shot raises
// word 2 after summing and waits for every rank's; two-shot's wait for word 1 already is that
// (a rank raises it after its last read of the inputs). Two-shot may also run in place on them:
// piece q of every input is read by rank q alone, which writes its sum there only after reading
// it, and copies the other pieces in only after word 1, when every rank is done reading.
template <typename T, typename Op, bool TwoShot>
__global__ void __launch_bounds__(kThreads) directKernel(const LaunchArgs a) {
  __shared__ int failed;
  __shared__ std::uint64_t first;
  __shared__ const T* ins[64];
  __shared__ T* pushes[64];  // two-shot on registered outputs: every rank's output piece
  const int b = static_cast<int>(blockIdx.x);
  if (!directStart(a, b, a.directCounts, &failed, &first)) return;
  const std::size_t per = a.directShareElems;
  // A call larger than the blocks' slabs hold runs in rounds: round k takes the k-th grid's
  // worth of the input, and counts as a call of its own (its parity picks the slab, its flags
  // are raised to its count), so the slabs alternate from round to round as from call to call.
  const std::size_t stride = per * gridDim.x;
  const std::size_t rounds = a.count == 0 ? 1 : (a.count + stride - 1) / stride;
  std::uint64_t call = first;
  for (std::size_t round = 0; round < rounds && failed == 0; ++round, ++call) {
    const std::size_t begin = round * stride + static_cast<std::size_t>(b) * per;
    const std::size_t n = begin < a.count ? lesser(per, a.count - begin) : 0;
    const std::size_t slab = (2 * static_cast<std::size_t>(b) + (call & 1)) * a.directSlabBytes;
    T* const out = static_cast<T*>(a.output) + begin;
    // 1. This rank's share into its slab (unless peers read its registered input), then word
    // 0 of its flag; every rank's share.
    const bool inPlace = a.registered != nullptr;
    std::byte* const* const sources = inPlace ? a.registered : a.directSlabs;
    const std::size_t sourceAt = inPlace ? a.registeredOffset + begin * sizeof(T) : slab;
    T* mine = reinterpret_cast<T*>(a.directSlabs[a.rank] + slab);
    if (!inPlace) {
      T* const outs[1] = {mine};
      const T* const from[1] = {static_cast<const T*>(a.input) + begin};
      elementwise<T, Op>(outs, 1, from, 1, 1 << 30, n);
    }
    barrierEveryRank(a, b, 0, call, &failed);
    if (failed != 0) break;
    if constexpr (!TwoShot) {
      T* const outs[1] = {out};
      sumInRankOrder<T, Op>(a, sources, sourceAt, 0, n, outs, 1, ins);
      if (inPlace) {
        // 2. Done reading every rank's input: word 2; then wait until every rank is.
        barrierEveryRank(a, b, 2, call, &failed);
      }
    } else {
      // Pieces start 16 bytes apart, so vectors serve them.
      constexpr std::size_t kAlign = sizeof(T) >= 16 ? 1 : 16 / sizeof(T);
      const auto R = static_cast<std::size_t>(a.nranks);
      const std::size_t piece = ((n + R - 1) / R + kAlign - 1) / kAlign * kAlign;
      auto pieceAt = [&](std::size_t q) { return q * piece < n ? q * piece : n; };
      auto pieceLen = [&](std::size_t q) { return lesser(piece, n - pieceAt(q)); };
      const auto me = static_cast<std::size_t>(a.rank);
      if (a.registeredOut != nullptr) {
        // 2'. Registered outputs (64 ranks at most): piece `rank` summed straight into every
        // rank's output, then word 1; once every rank's word 1 is up, this rank's output is
        // whole. In place, a peer's output piece is that peer's input piece, which this rank
        // alone reads, element by element before writing it.
        if (threadIdx.x == 0) {
          for (int q = 0; q < a.nranks; ++q) {
            pushes[q] = reinterpret_cast<T*>(a.registeredOut[q] + a.registeredOutOffset) + begin +
                        pieceAt(me);
          }
        }
        __syncthreads();
        sumInRankOrder<T, Op>(a, sources, sourceAt, pieceAt(me), pieceLen(me), pushes, a.nranks,
                              ins);
        barrierEveryRank(a, b, 1, call, &failed);
        __syncthreads();
        continue;
      }
      // 2. Piece `rank` summed into this rank's slab and its output; word 1. The slab comes
      // first: past 64 ranks the running sum lives in outs[0], and the output may be this
      // rank's registered input (an in-place call), whose piece a later group still reads.
      {
        T* const outs[2] = {mine + pieceAt(me), out + pieceAt(me)};
        sumInRankOrder<T, Op>(a, sources, sourceAt, pieceAt(me), pieceLen(me), outs, 2, ins);
      }
      barrierEveryRank(a, b, 1, call, &failed);
      // 3. Every other rank's summed piece, read from its slab.
      if (failed == 0) {
        for (std::size_t q = 0; q < R; ++q) {
          if (q == me) continue;
          T* const outs[1] = {out + pieceAt(q)};
          const T* const from[1] = {reinterpret_cast<const T*>(a.directSlabs[q] + slab) +
                                    pieceAt(q)};
          elementwise<T, Op>(outs, 1, from, 1, 0, pieceLen(q));
        }
      }
    }
    // The next round rewrites shared lists and slabs: every thread done with this one.
    __syncthreads();
  }
  if (threadIdx.x == 0) a.directCounts[b] = call - 1;
}

// The direct kernels of the block collectives (launchDirectBlocks): block b takes the b-th
// share of each of the input's pieces (one for all-gather, one per rank for reduce-scatter and
// all-to-all), copies them into its slab of this rank's inbox, piece p at p * share, raises
// word 0 of its flag and waits for every rank's; then
//   all-gather: rank q's piece goes to block q of the output, for every q;
//   reduce-scatter: piece `rank` of every rank's slab, summed in rank order, is the output;
//   all-to-all: piece `rank` of rank q's slab goes to block q of the output, for every q.
// A peer's slab is read only by the same block, so the slabs alternate as the all-reduce's do
// (directKernel above), and the two kernels share the flags and call counts. In place is safe:
// a round copies its share of every piece before it writes any of the output's.
template <typename T, typename Op, DirectKind Kind>
__global__ void __launch_bounds__(kThreads) directBlocksKernel(const LaunchArgs a) {
  __shared__ int failed;
  __shared__ std::uint64_t first;
  __shared__ const T* ins[64];
  const int b = static_cast<int>(blockIdx.x);
  if (!directStart(a, b, a.directCounts, &failed, &first)) return;
  const auto R = static_cast<std::size_t>(a.nranks);
  const std::size_t pieces = Kind == DirectKind::gather ? 1 : R;
  const std::size_t share = a.directShareElems;
  const std::size_t stride = share * gridDim.x;
  const std::size_t rounds = a.count == 0 ? 1 : (a.count + stride - 1) / stride;
  const auto me = static_cast<std::size_t>(a.rank);
  std::uint64_t call = first;
  for (std::size_t round = 0; round < rounds && failed == 0; ++round, ++call) {
    const std::size_t begin = round * stride + static_cast<std::size_t>(b) * share;
    const std::size_t n = begin < a.count ? lesser(share, a.count - begin) : 0;
    const std::size_t slab = (2 * static_cast<std::size_t>(b) + (call & 1)) * a.directSlabBytes;
    T* const mine = reinterpret_cast<T*>(a.directSlabs[a.rank] + slab);
    for (std::size_t p = 0; p < pieces; ++p) {
      T* const outs[1] = {mine + p * share};
      const T* const from[1] = {static_cast<const T*>(a.input) + p * a.count + begin};
      elementwise<T, Op>(outs, 1, from, 1, 1 << 30, n);
    }
    barrierEveryRank(a, b, 0, call, &failed);
    if (failed != 0) break;
    if constexpr (Kind == DirectKind::reduceScatter) {
      T* const outs[1] = {static_cast<T*>(a.output) + begin};
      sumInRankOrder<T, Op>(a, a.directSlabs, slab + me * share * sizeof(T), 0, n, outs, 1, ins);
    } else {
      const std::size_t at = Kind == DirectKind::gather ? 0 : me * share;
      for (std::size_t q = 0; q < R; ++q) {
        T* const outs[1] = {static_cast<T*>(a.output) + q * a.count + begin};
        const T* const from[1] = {reinterpret_cast<const T*>(a.directSlabs[q] + slab) + at};
        elementwise<T, Op>(outs, 1, from, 1, q == me ? 1 << 30 : 0, n);
      }
    }
    // The next round rewrites this block's slab (the other parity) and shared lists.
    __syncthreads();
  }
  if (threadIdx.x == 0) a.directCounts[b] = call - 1;
}

}  // namespace

Status launchDirect(const LaunchArgs& args, int blocks, bool twoShot, DataType type, RedOp op,
                    void* stream) {
  return withType(type, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    return withOp(op, [&](auto reduction) {
      using Op = decltype(reduction);
      auto kernel = twoShot ? directKernel<T, Op, true> : directKernel<T, Op, false>;
      kernel<<<static_cast<unsigned>(blocks), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
          args);
      return launchError(twoShot ? "two-shot kernel" : "one-shot kernel");
    });
  });
}

Status launchDirectBlocks(const LaunchArgs& args, int blocks, DirectKind kind, DataType type,
                          RedOp op, void* stream) {
  if (kind == DirectKind::allReduce)
    return internalError("launchDirectBlocks: all-reduce runs launchDirect");
  const auto grid = static_cast<unsigned>(blocks);
  auto* const st = static_cast<cudaStream_t>(stream);
  return withType(type, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    withKind(kind, op, [&](auto reduction, auto k) {
      if constexpr (decltype(k)::value != DirectKind::allReduce)
        directBlocksKernel<T, decltype(reduction), decltype(k)::value>
            <<<grid, kThreads, 0, st>>>(args);
    });
    return launchError("direct block-collective kernel");
  });
}

cudaError_t preloadDirect() {
  cudaFuncAttributes attr;
  return forEachInstance([&](auto* tag, auto reduction, auto) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using Op = decltype(reduction);
    cudaError_t e = cudaFuncGetAttributes(&attr, directKernel<T, Op, false>);
    if (e == cudaSuccess) e = cudaFuncGetAttributes(&attr, directKernel<T, Op, true>);
    if (e == cudaSuccess)
      e = cudaFuncGetAttributes(&attr, directBlocksKernel<T, Op, DirectKind::reduceScatter>);
    if (e == cudaSuccess)
      e = cudaFuncGetAttributes(&attr, directBlocksKernel<T, Sum, DirectKind::gather>);
    if (e == cudaSuccess)
      e = cudaFuncGetAttributes(&attr, directBlocksKernel<T, Sum, DirectKind::exchange>);
    return e;
  });
}

}  // namespace weft::device
