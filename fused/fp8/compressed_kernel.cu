// The compressed all-reduce as one kernel on the direct kernels' slabs (compressed_kernel.hpp):
// the two-shot of src/device/direct_kernel.cu with fp8 pieces in the slabs. Block b takes the
// b-th share of the input a round, cut into one piece per rank (whole blocks of values):
//   1. encodes every piece into its slab of this rank's inbox; word 0 of its flag;
//   2. decodes piece `rank` of every rank's slab, sums it in f32 in rank order, encodes the sum
//      into that piece of its own slab (no rank else reads it); word 1;
//   3. decodes piece q of rank q's slab into the output, for every q (its own included), so
//      every rank gets the same bits.
// The slabs alternate by the block's call count as the direct kernels' do, and share their
// flags and counts.
#include "fused/fp8/codec_device.cuh"
#include "fused/fp8/compressed_kernel.hpp"
#include "src/device/ordering.cuh"

namespace weft::fused::fp8 {
namespace {

using namespace dev;  // NOLINT: the device pieces

__device__ inline std::size_t roundUp(std::size_t x, std::size_t to) {
  return (x + to - 1) / to * to;
}

template <typename T, bool E4m3, int Block, bool E8m0>
__global__ void __launch_bounds__(kThreads)
    compressedTwoShotKernel(const device::LaunchArgs a, float divisor, bool aligned) {
  __shared__ int failed;
  __shared__ std::uint64_t first;
  const int b = static_cast<int>(blockIdx.x);
  if (!device::directStart(a, b, a.directCounts, &failed, &first)) return;
  constexpr std::size_t kScaleBytes = E8m0 ? 1 : 4;
  const std::size_t per = a.directShareElems;
  const std::size_t stride = per * gridDim.x;
  const std::size_t rounds = a.count == 0 ? 1 : (a.count + stride - 1) / stride;
  const auto R = static_cast<std::size_t>(a.nranks);
  const auto me = static_cast<std::size_t>(a.rank);
  std::uint64_t call = first;
  for (std::size_t round = 0; round < rounds && failed == 0; ++round, ++call) {
    const std::size_t begin = round * stride + static_cast<std::size_t>(b) * per;
    const std::size_t n = begin < a.count ? (a.count - begin < per ? a.count - begin : per) : 0;
    const std::size_t slab = (2 * static_cast<std::size_t>(b) + (call & 1)) * a.directSlabBytes;
    // Pieces of whole blocks; each encoded piece 16-byte aligned in the slab.
    const std::size_t piece = roundUp((n + R - 1) / R, Block);
    const std::size_t encoded = roundUp(piece + piece / Block * kScaleBytes, 16);
    const std::size_t lanes = piece / kVec;  // threads' worth of one piece
    auto valid = [&](std::size_t q) {
      return q * piece < n ? (n - q * piece < piece ? n - q * piece : piece) : 0;
    };
    const T* in = static_cast<const T*>(a.input) + begin;
    T* out = static_cast<T*>(a.output) + begin;
    auto* mine = reinterpret_cast<std::uint8_t*>(a.directSlabs[a.rank] + slab);
    // 1. Every piece of this rank's share, encoded into its slab. Every thread runs every
    // iteration (the block's lanes find each block's largest magnitude together).
    for (std::size_t j0 = 0; j0 < R * lanes; j0 += blockDim.x) {
      const std::size_t j = j0 + threadIdx.x;
      const bool active = j < R * lanes;
      const std::size_t q = active ? j / lanes : 0, i = active ? (j % lanes) * kVec : 0;
      float v[kVec];
      load8(in + q * piece, i, active ? valid(q) : 0, aligned, v);
      std::uint8_t* to = mine + q * encoded;
      encode8<E4m3, Block, E8m0>(v, i, active, piece, to, to + piece, true);
    }
    device::barrierEveryRank(a, b, 0, call, &failed);
    if (failed != 0) break;
    // 2. Piece `rank` of every rank's slab, summed; its encoding replaces this rank's own.
    for (std::size_t j0 = 0; j0 < lanes; j0 += blockDim.x) {
      const std::size_t j = j0 + threadIdx.x;
      const bool active = j < lanes;
      const std::size_t i = active ? j * kVec : 0;
      float sum[kVec] = {0, 0, 0, 0, 0, 0, 0, 0};
      if (active) {
        for (std::size_t r = 0; r < R; ++r) {
          const auto* from =
              reinterpret_cast<const std::uint8_t*>(a.directSlabs[r] + slab) + me * encoded;
          float v[kVec];
          decode8<E4m3, Block, E8m0>(from, from + piece, i, piece, true, v);
          for (int k = 0; k < kVec; ++k) sum[k] = __fadd_rn(sum[k], v[k]);
        }
        if (divisor != 1.0f) {
          for (int k = 0; k < kVec; ++k) sum[k] = __fdiv_rn(sum[k], divisor);
        }
      }
      std::uint8_t* to = mine + me * encoded;
      encode8<E4m3, Block, E8m0>(sum, i, active, piece, to, to + piece, true);
    }
    device::barrierEveryRank(a, b, 1, call, &failed);
    if (failed != 0) break;
    // 3. Every rank's summed piece, decoded into the output.
    for (std::size_t j = threadIdx.x; j < R * lanes; j += blockDim.x) {
      const std::size_t q = j / lanes, i = (j % lanes) * kVec;
      if (i >= valid(q)) continue;
      const auto* from =
          reinterpret_cast<const std::uint8_t*>(a.directSlabs[q] + slab) + q * encoded;
      float v[kVec];
      decode8<E4m3, Block, E8m0>(from, from + piece, i, piece, true, v);
      store8(out + q * piece, i, valid(q), aligned, v);
    }
    // The next round rewrites the slabs' other half: every thread done with this one.
    __syncthreads();
  }
  if (threadIdx.x == 0) a.directCounts[b] = call - 1;
}

}  // namespace

std::size_t compressedTwoShotMostElems(const Codec& codec, std::size_t slabBytes, int nranks) {
  const auto block = static_cast<std::size_t>(codec.block);
  const auto r = static_cast<std::size_t>(nranks < 1 ? 1 : nranks);
  // A piece of p values takes at most p (1 + scale bytes / block) + 15 bytes; R of them a slab.
  if (slabBytes / r <= 16) return 0;
  const double most = static_cast<double>(slabBytes / r - 16) /
                      (1.0 + static_cast<double>(codec.scaleBytes()) / static_cast<double>(block));
  const std::size_t piece = static_cast<std::size_t>(most) / block * block;
  return piece * r;
}

Status launchCompressedTwoShot(const device::LaunchArgs& a, int blocks, const Codec& codec,
                               DataType type, float divisor, void* stream) {
  return dispatch(codec, type, [&](auto t, auto e4m3, auto block, auto e8m0) -> Status {
    using T = decltype(t);
    const bool aligned = alignedTo(a.input, 16) && alignedTo(a.output, 16);
    compressedTwoShotKernel<T, decltype(e4m3)::value, decltype(block)::value, decltype(e8m0)::value>
        <<<static_cast<unsigned>(blocks), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
            a, divisor, aligned);
    return launched("fp8 compressed two-shot");
  });
}

}  // namespace weft::fused::fp8
