// runUlysses: the rows of this rank's tokens packed by destination (rank d takes heads
// [d·h, (d + 1)·h) of q and [d·g, (d + 1)·g) of k and v, h = heads / n, g = kvHeads / n), one
// all-to-all, the received rows put at their tokens' places in the whole sequences, the
// attention of the whole sequences on this rank's heads, then out and the log-sum-exp packed by
// the tokens' owners and all-to-all'd back. Every copy moves 16-byte pieces.
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "fused/attention/ulysses.hpp"
#include "fused/cuda_steps.hpp"

namespace weft::fused::attention {
namespace {

constexpr unsigned kThreads = 256;

struct Layout {
  int n, rank;             // the ranks, this one
  int sequences;           // cu: sequences + 1 offsets into a rank's tokens
  const std::int32_t* cu;  // a rank's (every rank's the same lengths)
  std::size_t tokens;      // a rank's
  int h, g;                // heads and K/V heads of a shard
  std::size_t pieces;      // 16-byte pieces of a head's row
};

// The place in the whole sequences of rank r's local token i: its sequence's share is chunk r
// then chunk 2n − 1 − r of the sequence (ring_plan.hpp's zigzag).
__device__ std::size_t globalOf(const Layout& l, int r, std::size_t i) {
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
  const auto n = static_cast<std::size_t>(l.n), R = static_cast<std::size_t>(r);
  const std::size_t pos = j < half ? R * half + j : (2 * n - 1 - R) * half + (j - half);
  return n * begin + pos;
}

// Item x of [rank][token][row][piece] (`rows` rows a token): each once over the grid.
struct Item {
  std::size_t piece, row, token, rank;
};
template <typename F>
__device__ void forEach(std::size_t rows, const Layout& l, F f) {
  const std::size_t total = static_cast<std::size_t>(l.n) * l.tokens * rows * l.pieces;
  for (std::size_t x = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; x < total;
       x += std::size_t{gridDim.x} * blockDim.x) {
    const std::size_t r = x / l.pieces;
    f(x, Item{x % l.pieces, r % rows, r / rows % l.tokens, r / rows / l.tokens});
  }
}

// Row r of a token's rows of a shard, q's h then k's and v's g: the tensor (0, 1, 2), the row
// in it and its heads a token.
struct QkvRow {
  int tensor;
  std::size_t row, heads;
};
__device__ QkvRow qkvRow(std::size_t r, const Layout& l) {
  const auto h = static_cast<std::size_t>(l.h), g = static_cast<std::size_t>(l.g);
  if (r < h) return {0, r, h};
  return r < h + g ? QkvRow{1, r - h, g} : QkvRow{2, r - h - g, g};
}

// In: send[d][i][row] from q, k, v [i][d·heads + row] (rank d's heads).
__global__ void packIn(uint4* send, const uint4* q, const uint4* k, const uint4* v, Layout l) {
  forEach(static_cast<std::size_t>(l.h + 2 * l.g), l, [&](std::size_t x, Item it) {
    const QkvRow r = qkvRow(it.row, l);
    const uint4* from = r.tensor == 0 ? q : r.tensor == 1 ? k : v;
    send[x] = from[((it.token * l.n + it.rank) * r.heads + r.row) * l.pieces + it.piece];
  });
}

// recv[s][i][row] (rank s's token i) into the whole sequences' q [t][h], k and v [t][g].
__global__ void unpackIn(uint4* q, uint4* k, uint4* v, const uint4* recv, Layout l) {
  forEach(static_cast<std::size_t>(l.h + 2 * l.g), l, [&](std::size_t x, Item it) {
    const QkvRow r = qkvRow(it.row, l);
    uint4* to = r.tensor == 0 ? q : r.tensor == 1 ? k : v;
    const std::size_t t = globalOf(l, static_cast<int>(it.rank), it.token);
    to[(t * r.heads + r.row) * l.pieces + it.piece] = recv[x];
  });
}

// Out: sendOut[d][i][head] = whole out [globalOf(d, i)][head]; sendLse[d][head][i] likewise.
__global__ void packOut(uint4* send, float* sendLse, const uint4* out, const float* lse, Layout l) {
  const auto h = static_cast<std::size_t>(l.h), n = static_cast<std::size_t>(l.n);
  forEach(h, l, [&](std::size_t x, Item it) {
    const std::size_t t = globalOf(l, static_cast<int>(it.rank), it.token);
    send[x] = out[(t * h + it.row) * l.pieces + it.piece];
    if (it.piece == 0)
      sendLse[(it.rank * h + it.row) * l.tokens + it.token] = lse[it.row * n * l.tokens + t];
  });
}

// recvOut[s][i][head] into out [i][s·h + head]; recvLse[s][head][i] into lse [s·h + head][i].
__global__ void unpackOut(uint4* out, float* lse, const uint4* recv, const float* recvLse,
                          Layout l) {
  const auto h = static_cast<std::size_t>(l.h), n = static_cast<std::size_t>(l.n);
  forEach(h, l, [&](std::size_t x, Item it) {
    out[((it.token * n + it.rank) * h + it.row) * l.pieces + it.piece] = recv[x];
    const std::size_t at = (it.rank * h + it.row) * l.tokens + it.token;
    if (it.piece == 0) lse[at] = recvLse[at];
  });
}

__global__ void scaleOffsets(std::int32_t* whole, const std::int32_t* cu, int count, int n) {
  const int j = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (j < count) whole[j] = cu[j] * n;
}

unsigned gridOf(std::size_t items) {
  return static_cast<unsigned>(
      std::clamp<std::size_t>((items + kThreads - 1) / kThreads, 1, std::size_t{1} << 16));
}

}  // namespace

LocalAttention ulyssesAttention(const Communicator& comm, const RingCall& x, std::byte* ws) {
  const LocalAttention& a = x.local;
  const int n = comm.size();
  const auto N = static_cast<std::size_t>(n);
  const UlyssesWorkspace w = ulyssesWorkspace(a);
  const std::size_t es = sizeOf(a.type), dim = static_cast<std::size_t>(a.dim);
  const std::size_t q = N * a.tokensQ * static_cast<std::size_t>(a.heads / n) * dim * es;
  const std::size_t kv = N * a.tokensQ * static_cast<std::size_t>(a.kvHeads / n) * dim * es;
  LocalAttention all = a;
  all.q = ws + w.whole, all.k = ws + w.whole + q, all.v = ws + w.whole + q + kv;
  all.cuSeqlensQ = all.cuSeqlensK = reinterpret_cast<const std::int32_t*>(ws + w.cu);
  all.tokensQ = N * a.tokensQ, all.maxSeqlenQ = N * a.maxSeqlenQ;
  all.heads = a.heads / n, all.kvHeads = a.kvHeads / n;
  all.piece = {Part::all, Part::all, x.causal};
  all.out = ws + w.wholeOut, all.lse = reinterpret_cast<float*>(ws + w.wholeLse);
  all.merge = false;
  all.scratch = ws + w.cudnn, all.scratchBytes = w.total - w.cudnn;
  return all;
}

Status runUlysses(Communicator& comm, const RingCall& x, std::byte* ws) {
  const LocalAttention& a = x.local;
  const int n = comm.size();
  const UlyssesWorkspace w = ulyssesWorkspace(a);
  const auto stream = static_cast<cudaStream_t>(x.stream);
  const std::size_t es = sizeOf(a.type), dim = static_cast<std::size_t>(a.dim);
  const Layout l{n,         comm.rank(), a.sequences,   a.cuSeqlensQ,
                 a.tokensQ, a.heads / n, a.kvHeads / n, dim * es / 16};
  const auto N = static_cast<std::size_t>(n), T = a.tokensQ;
  const std::size_t h = static_cast<std::size_t>(l.h), g = static_cast<std::size_t>(l.g);
  // The whole sequences' q, k, v and offsets: where their attention reads them.
  const LocalAttention all = ulyssesAttention(comm, x, ws);
  auto* wq = static_cast<uint4*>(const_cast<void*>(all.q));
  auto* wk = static_cast<uint4*>(const_cast<void*>(all.k));
  auto* wv = static_cast<uint4*>(const_cast<void*>(all.v));
  auto* cu = const_cast<std::int32_t*>(all.cuSeqlensQ);
  const std::size_t in = N * T * (h + 2 * g) * l.pieces, out = N * T * h * l.pieces;
  packIn<<<gridOf(in), kThreads, 0, stream>>>(
      reinterpret_cast<uint4*>(ws + w.sendIn), static_cast<const uint4*>(a.q),
      static_cast<const uint4*>(a.k), static_cast<const uint4*>(a.v), l);
  scaleOffsets<<<gridOf(static_cast<std::size_t>(a.sequences) + 1), kThreads, 0, stream>>>(
      cu, a.cuSeqlensQ, a.sequences + 1, n);
  if (Status s = launched("ulysses packing"); !s) return s;
  // Each rank's share: its tokens' rows of the destination's heads, in 16-byte pieces.
  if (Status s = comm.allToAll(ws + w.sendIn, ws + w.recvIn, in / N * 16, DataType::u8, stream); !s)
    return s;
  unpackIn<<<gridOf(in), kThreads, 0, stream>>>(wq, wk, wv,
                                                reinterpret_cast<const uint4*>(ws + w.recvIn), l);
  if (Status s = launched("ulysses unpacking"); !s) return s;
  if (Status s = attendOnDevice(all, stream); !s) return s;
  packOut<<<gridOf(out), kThreads, 0, stream>>>(reinterpret_cast<uint4*>(ws + w.sendOut),
                                                reinterpret_cast<float*>(ws + w.sendLse),
                                                reinterpret_cast<const uint4*>(ws + w.wholeOut),
                                                reinterpret_cast<const float*>(ws + w.wholeLse), l);
  if (Status s = launched("ulysses packing out"); !s) return s;
  if (Status s = comm.allToAll(ws + w.sendOut, ws + w.recvOut, out / N * 16, DataType::u8, stream);
      !s)
    return s;
  if (Status s = comm.allToAll(ws + w.sendLse, ws + w.recvLse, T * h, DataType::f32, stream); !s)
    return s;
  unpackOut<<<gridOf(out), kThreads, 0, stream>>>(
      static_cast<uint4*>(a.out), a.lse, reinterpret_cast<const uint4*>(ws + w.recvOut),
      reinterpret_cast<const float*>(ws + w.recvLse), l);
  return launched("ulysses unpacking out");
}

}  // namespace weft::fused::attention
