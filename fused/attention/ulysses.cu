// Ulysses's exchange (heads.hpp): a destination d's share of the buffer is this rank's tokens'
// rows of d's heads ([token][row][16-byte piece], the tensors' rows one after another), then
// the values of d's heads ([tensor][head][token]); one kernel packs (or unpacks) every item,
// rows and values alike, and one all-to-all of the group moves every share.
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "fused/attention/heads.hpp"
#include "fused/cuda_steps.hpp"

namespace weft::fused::attention {
namespace {

constexpr unsigned kThreads = 256;

struct Layout {
  int n;                   // the group's ranks
  int sequences;           // cu: sequences + 1 offsets into a rank's tokens
  const std::int32_t* cu;  // a rank's (every rank's the same lengths)
  std::size_t tokens;      // a rank's
  std::size_t pieces;      // 16-byte pieces of a head's row
  std::size_t rows;        // of a token, every tensor's shard heads together
  std::size_t chunk;       // bytes of a destination's share
  std::size_t rowItems, valueItems;
  int rowTensors, valueTensors, valueHeads;
  HeadExchange::Rows r[HeadExchange::kRows];
  HeadExchange::Values v[HeadExchange::kValues];
};

// The place in the group's share of rank r's local token i: its sequence's share is chunk r
// then chunk 2n − 1 − r of the sequence's share (ring_plan.hpp's zigzag over the group).
__device__ std::size_t shareOf(const Layout& l, std::size_t r, std::size_t i) {
  int lo = 0, hi = l.sequences;  // the sequence s with cu[s] <= i < cu[s + 1]
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (static_cast<std::size_t>(l.cu[mid]) <= i) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  const auto begin = static_cast<std::size_t>(l.cu[lo]);
  const std::size_t half = (static_cast<std::size_t>(l.cu[lo + 1]) - begin) / 2, j = i - begin;
  const auto n = static_cast<std::size_t>(l.n);
  const std::size_t pos = j < half ? r * half + j : (2 * n - 1 - r) * half + (j - half);
  return n * begin + pos;
}

// Every item once over the grid: a row's 16-byte piece or a value, between its place in the
// buffer (the share of rank d: the destination packing, the source unpacking) and its place in
// the local tensor (every head) or the group's share (a shard's heads). `pack`: the buffer is
// written; `toShare`: the exchange towards the head shards.
template <bool pack, bool toShare>
__global__ void move(std::byte* buffer, Layout l) {
  const auto n = static_cast<std::size_t>(l.n), T = l.tokens;
  for (std::size_t x = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x;
       x < l.rowItems + l.valueItems; x += std::size_t{gridDim.x} * blockDim.x) {
    if (x < l.rowItems) {
      const std::size_t piece = x % l.pieces, rest = x / l.pieces;
      std::size_t row = rest % l.rows;
      const std::size_t i = rest / l.rows % T, d = rest / l.rows / T;
      int t = 0;
      while (row >= static_cast<std::size_t>(l.r[t].heads)) row -= l.r[t++].heads;
      const auto h = static_cast<std::size_t>(l.r[t].heads);
      auto* buf = reinterpret_cast<uint4*>(buffer + d * l.chunk) + (i * l.rows) * l.pieces +
                  (rest % l.rows) * l.pieces + piece;
      const bool local = pack == toShare;  // the side it reads (packing) or writes
      const std::size_t at = local ? ((i * n + d) * h + row) * l.pieces + piece
                                   : (shareOf(l, d, i) * h + row) * l.pieces + piece;
      uint4* tensor = static_cast<uint4*>(local ? l.r[t].local : l.r[t].share);
      if (pack) {
        *buf = tensor[at];
      } else {
        tensor[at] = *buf;
      }
    } else {
      const std::size_t y = x - l.rowItems, h = static_cast<std::size_t>(l.valueHeads);
      const std::size_t i = y % T, head = y / T % h, t = y / T / h % l.valueTensors,
                        d = y / T / h / l.valueTensors;
      auto* buf = reinterpret_cast<float*>(buffer + d * l.chunk + T * l.rows * l.pieces * 16) +
                  (t * h + head) * T + i;
      const bool local = pack == toShare;
      const std::size_t at = local ? (d * h + head) * T + i : head * n * T + shareOf(l, d, i);
      float* tensor = local ? l.v[t].local : l.v[t].share;
      if (pack) {
        *buf = tensor[at];
      } else {
        tensor[at] = *buf;
      }
    }
  }
}

__global__ void scaleOffsets(std::int32_t* share, const std::int32_t* cu, int count, int n) {
  const int j = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (j < count) share[j] = cu[j] * n;
}

unsigned gridOf(std::size_t items) {
  return static_cast<unsigned>(
      std::clamp<std::size_t>((items + kThreads - 1) / kThreads, 1, std::size_t{1} << 16));
}

Layout layoutOf(const HeadExchange& e, int u) {
  Layout l{};
  l.n = u, l.sequences = e.sequences, l.cu = e.cu, l.tokens = e.tokens;
  l.pieces = e.rowBytes / 16;
  for (int t = 0; t < e.rowTensors; ++t) l.rows += static_cast<std::size_t>(e.rows[t].heads);
  l.rowTensors = e.rowTensors, l.valueTensors = e.valueTensors, l.valueHeads = e.valueHeads;
  std::copy(e.rows, e.rows + HeadExchange::kRows, l.r);
  std::copy(e.values, e.values + HeadExchange::kValues, l.v);
  const auto U = static_cast<std::size_t>(u);
  const std::size_t values = static_cast<std::size_t>(e.valueTensors * e.valueHeads) * e.tokens;
  l.chunk = (e.tokens * l.rows * e.rowBytes + values * 4 + 15) / 16 * 16;
  l.rowItems = U * e.tokens * l.rows * l.pieces;
  l.valueItems = U * values;
  return l;
}

template <bool toShare>
Status exchange(Communicator& group, const HeadExchange& e, std::byte* send, std::byte* recv,
                void* s) {
  const auto stream = static_cast<cudaStream_t>(s);
  const Layout l = layoutOf(e, group.size());
  const std::size_t items = l.rowItems + l.valueItems;
  move<true, toShare><<<gridOf(items), kThreads, 0, stream>>>(send, l);
  if (toShare && e.shareCu != nullptr)
    scaleOffsets<<<gridOf(static_cast<std::size_t>(e.sequences) + 1), kThreads, 0, stream>>>(
        e.shareCu, e.cu, e.sequences + 1, group.size());
  if (Status st = launched("ulysses packing"); !st) return st;
  if (Status st = group.allToAll(send, recv, l.chunk, DataType::u8, stream); !st) return st;
  move<false, toShare><<<gridOf(items), kThreads, 0, stream>>>(recv, l);
  return launched("ulysses unpacking");
}

}  // namespace

Status loadHeadKernels() {
  return loadKernels("ulysses: loading the kernels", move<true, true>, move<false, true>,
                     move<true, false>, move<false, false>, scaleOffsets);
}

Status toHeads(Communicator& group, const HeadExchange& e, std::byte* send, std::byte* recv,
               void* stream) {
  return exchange<true>(group, e, send, recv, stream);
}

Status fromHeads(Communicator& group, const HeadExchange& e, std::byte* send, std::byte* recv,
                 void* stream) {
  return exchange<false>(group, e, send, recv, stream);
}

}  // namespace weft::fused::attention
