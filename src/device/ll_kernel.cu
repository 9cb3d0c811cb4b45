// The ll one-shot kernels: each rank pushes its pieces to its peers as ll lines (data and flag in
// one 8-byte word), for calls whose pieces fit the ll inboxes.
#include <algorithm>
#include <string>

#include "src/device/elementwise.cuh"
#include "src/device/launch.cuh"
#include "src/device/ordering.cuh"
#include "src/device/schedule_kernel.hpp"

namespace weft::device {
namespace {

// ---- the ll direct all-reduce ------------------------------------------------------------

// Bytes [at, at + 16) of p (zeros past `bytes`), with one vector load where it can.
__device__ __forceinline__ uint4 loadChunk(const std::byte* p, std::size_t at, std::size_t bytes) {
  if (at + 16 <= bytes && aligned16(p + at)) return *reinterpret_cast<const uint4*>(p + at);
  uint4 v = make_uint4(0, 0, 0, 0);
  auto* d = reinterpret_cast<unsigned char*>(&v);
  for (std::size_t k = 0; k < 16 && at + k < bytes; ++k)
    d[k] = static_cast<unsigned char>(p[at + k]);
  return v;
}

// Bytes [at, at + 16) of p, no further than `bytes`.
__device__ __forceinline__ void storeChunk(std::byte* p, std::size_t at, std::size_t bytes,
                                           uint4 v) {
  if (at + 16 <= bytes && aligned16(p + at)) {
    *reinterpret_cast<uint4*>(p + at) = v;
    return;
  }
  const auto* s = reinterpret_cast<const unsigned char*>(&v);
  for (std::size_t k = 0; k < 16 && at + k < bytes; ++k) p[at + k] = std::byte{s[k]};
}

// Two ll lines (4 bytes of data and the flag each), each 8-byte half stored whole.
__device__ __forceinline__ void storeLines(std::uint64_t* p, std::uint32_t x, std::uint32_t y,
                                           std::uint32_t flag) {
  const std::uint64_t f = std::uint64_t{flag} << 32;
  asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(f | x), "l"(f | y)
               : "memory");
}
__device__ __forceinline__ void loadLines(const std::uint64_t* p, std::uint64_t& x,
                                          std::uint64_t& y) {
  asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(x), "=l"(y) : "l"(p) : "memory");
}

// Programmatic dependent launch (sm_90): in a kernel launched with
// cudaLaunchAttributeProgrammaticStreamSerialization, waits until the stream's previous kernel
// has completed and its memory is visible (at once where there is none, or without the
// attribute); and lets the stream's next such kernel be scheduled once every block of this one
// has called it or exited.
__device__ __forceinline__ void waitForPreviousKernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void releaseNextKernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// launchDirectLl (schedule_kernel.hpp). `cap`: the data bytes a sender's place in an ll inbox
// holds (its lines take twice as many); `perBlock`: the 16-byte chunks of a piece each block
// takes. Each thread owns chunks of the pieces (the same in both loops, so in place is safe: a
// thread reads every piece's chunk before it writes the output's), a chunk being four lines.
// Every block counts the call in its own ll count, the grid being the same at every call, so
// every block's count (the lines' flag, and the parity) is the same, and the same on every rank.
template <typename T, typename Op, DirectKind Kind>
__global__ void __launch_bounds__(kThreads)
    directLlKernel(const LaunchArgs a, std::size_t cap, std::size_t perBlock) {
  __shared__ int failed;
  __shared__ std::uint64_t call;
  const int b = static_cast<int>(blockIdx.x);
  // The counts, the input and the inboxes are the previous call's until it has completed.
  waitForPreviousKernel();
  if (!directStart(a, b, a.llCounts, &failed, &call)) return;
  const std::size_t bytes = a.count * sizeof(T);  // of one piece
  const std::size_t chunks = (bytes + 15) / 16;
  const std::uint32_t flag = llFlag(call, a.signature);
  const auto N = static_cast<std::size_t>(a.nranks);
  const std::size_t parity = call & 1;
  // Where sender `from`'s lines go in rank `owner`'s inbox this call.
  auto place = [&](int owner, int from) {
    return reinterpret_cast<std::uint64_t*>(
        a.directLl[owner] + (parity * N + static_cast<std::size_t>(from)) * 2 * cap);
  };
  // Piece p of the input, of the output.
  constexpr bool kPieces = Kind == DirectKind::reduceScatter || Kind == DirectKind::exchange;
  const auto* in = static_cast<const std::byte*>(a.input);
  auto* out = static_cast<std::byte*>(a.output);
  auto input = [&](int p) { return kPieces ? in + static_cast<std::size_t>(p) * bytes : in; };
  constexpr bool kBlocksOut = Kind == DirectKind::gather || Kind == DirectKind::exchange;
  auto output = [&](int q) { return kBlocksOut ? out + static_cast<std::size_t>(q) * bytes : out; };
  const std::size_t first = static_cast<std::size_t>(b) * perBlock;
  const std::size_t last = first + perBlock < chunks ? first + perBlock : chunks;
  // Chunk c of a piece, as four lines, to rank q.
  auto push = [&](int q, std::size_t c, uint4 v) {
    std::uint64_t* l = place(q, a.rank) + 4 * c;
    storeLines(l, v.x, v.y, flag);
    storeLines(l + 2, v.z, v.w, flag);
  };
  for (std::size_t c = first + threadIdx.x; c < last; c += blockDim.x) {
    // Piece q to rank q, or the one input (loaded once) to every peer.
    const uint4 all = kPieces ? uint4{} : loadChunk(in, 16 * c, bytes);
    for (int q = 0; q < a.nranks; ++q) {
      if (q != a.rank) push(q, c, kPieces ? loadChunk(input(q), 16 * c, bytes) : all);
    }
  }
  auto high = [](std::uint64_t x) { return static_cast<std::uint32_t>(x >> 32); };
  bool gaveUp = false;
  for (std::size_t c = first + threadIdx.x; c < last && !gaveUp; c += blockDim.x) {
    uint4 sum = make_uint4(0, 0, 0, 0);
    for (int q = 0; q < a.nranks && !gaveUp; ++q) {
      uint4 v;
      if (q == a.rank) {
        v = loadChunk(input(a.rank), 16 * c, bytes);
      } else {
        const std::uint64_t* l = place(a.rank, q) + 4 * c;
        std::uint64_t x0, x1, x2, x3;
        Watch w(a);
        for (;;) {
          loadLines(l, x0, x1);
          loadLines(l + 2, x2, x3);
          if (high(x0) == flag && high(x1) == flag && high(x2) == flag && high(x3) == flag) break;
          if (kSigned && llOtherCall(high(x0), flag)) {
            fail(a, 3, b, q, -1, Seen{-1, static_cast<int>(c), high(x0) & 0xffu, a.signature});
            gaveUp = true;
            break;
          }
          if (int why = w.check(); why != 0) {
            fail(a, why, b, q, -1, Seen{-1, static_cast<int>(c), high(x0), flag});
            gaveUp = true;
            break;
          }
        }
        v = make_uint4(static_cast<std::uint32_t>(x0), static_cast<std::uint32_t>(x1),
                       static_cast<std::uint32_t>(x2), static_cast<std::uint32_t>(x3));
      }
      if constexpr (kBlocksOut) {
        if (!gaveUp) storeChunk(output(q), 16 * c, bytes, v);
      } else {
        sum = q == 0 ? v : combineVec<T, Op>(sum, v);
      }
    }
    if constexpr (!kBlocksOut) {
      if (!gaveUp) storeChunk(out, 16 * c, bytes, sum);
    }
  }
  __syncthreads();
  // Every rank's lines for this block have arrived: this block of every rank has started, so a
  // next kernel now waiting on the GPU cannot keep any of them from being resident.
  if (a.dependentLaunch) releaseNextKernel();
  if (threadIdx.x == 0) a.llCounts[b] = call;
}

}  // namespace

Status launchDirectLl(const LaunchArgs& args, DirectKind kind, std::size_t cap, int blocks,
                      std::size_t leastBytes, DataType type, RedOp op, void* stream) {
  const std::size_t chunks = (args.count * sizeOf(type) + 15) / 16;
  // At least leastBytes a block, spread over as many blocks as that takes.
  const std::size_t least = std::max<std::size_t>(1, leastBytes / 16);
  const auto used = static_cast<std::size_t>(
      std::clamp<std::size_t>((chunks + least - 1) / least, 1, static_cast<std::size_t>(blocks)));
  const std::size_t perBlock = (chunks + used - 1) / used;
  const auto grid = static_cast<unsigned>(blocks);
  auto* const st = static_cast<cudaStream_t>(stream);
  return withType(type, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    cudaError_t e = cudaSuccess;
    withKind(kind, op, [&](auto reduction, auto k) {
      auto* kernel = directLlKernel<T, decltype(reduction), decltype(k)::value>;
      if (!args.dependentLaunch) {
        kernel<<<grid, kThreads, 0, st>>>(args, cap, perBlock);
        return;
      }
      cudaLaunchAttribute attr[1];
      attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attr[0].val.programmaticStreamSerializationAllowed = 1;
      cudaLaunchConfig_t config = {};
      config.gridDim = dim3(grid);
      config.blockDim = dim3(kThreads);
      config.stream = st;
      config.attrs = attr;
      config.numAttrs = 1;
      e = cudaLaunchKernelEx(&config, kernel, args, cap, perBlock);
    });
    if (e != cudaSuccess)
      return Status(Code::systemError,
                    std::string("ll one-shot kernel launch failed: ") + cudaGetErrorString(e));
    return launchError("ll one-shot kernel");
  });
}

cudaError_t preloadLl() {
  cudaFuncAttributes attr;
  return forEachInstance([&](auto* tag, auto reduction, auto) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using Op = decltype(reduction);
    cudaError_t e = cudaFuncGetAttributes(&attr, directLlKernel<T, Op, DirectKind::allReduce>);
    if (e == cudaSuccess)
      e = cudaFuncGetAttributes(&attr, directLlKernel<T, Op, DirectKind::reduceScatter>);
    if (e == cudaSuccess)
      e = cudaFuncGetAttributes(&attr, directLlKernel<T, Sum, DirectKind::gather>);
    if (e == cudaSuccess)
      e = cudaFuncGetAttributes(&attr, directLlKernel<T, Sum, DirectKind::exchange>);
    return e;
  });
}

}  // namespace weft::device
