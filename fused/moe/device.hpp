// MoE dispatch and combine on GPU memory, the kernels' side: every rank's shared buffer (mapped
// by every other rank) holds the rows each source sent it, their slots, the outputs sent back,
// and the flags that say a source's (or an expert rank's) writes have landed. Each rank writes
// its rows straight into its peers' buffers, so no call waits on the host and a graph replays it.
// docs/algorithms-fused.md, "MoE dispatch and combine".
#pragma once

#include <cstddef>
#include <cstdint>

#include "algorithms/moe_plan.hpp"
#include "fused/fp8/codec.hpp"
#include "weft/status.hpp"
#include "weft/types.hpp"

namespace weft::fused::moe {

inline constexpr int kGpuMaxRanks = 64;
inline constexpr std::size_t kFlagStride = 64;
// Flags at the buffer's start: dispatch's from source s at s, combine's at kGpuMaxRanks + s.
inline constexpr std::size_t kFlagsBytes = 2 * kGpuMaxRanks * kFlagStride;
// The low-latency mode's limits: a rank's local experts, and the [sources, local experts] table
// of rows its receive keeps in shared memory.
inline constexpr int kLowLatencyMaxLocal = algo::kMoeLowLatencyMaxLocal;
inline constexpr int kLowLatencyMaxTable = algo::kMoeLowLatencyMaxTable;

// What every kernel of a call reads: the shape, where each rank's buffer is, and this rank's
// own device state.
struct MoeDevice {
  int n = 1, me = 0, k = 1, L = 1, experts = 1;
  int tokens = 0;  // each rank's (the same on every rank): a source's rows at most
  // A row's record: its token, then per slot its local expert, weight and (low-latency mode)
  // index among the rows the source sent that expert.
  int metaInts = 4;
  // The mode (algo::MoeGpuPlan): normal (the layout, counts and places each a kernel of their
  // own) or low latency (one kernel each way and half; the sender numbers each expert's rows, so
  // the receiver places them from a table); channels: thread blocks of each copy kernel.
  bool lowLatency = false;
  bool table = false;  // placed from the senders' counts (low latency; normal where planned)
  int channels = 1;
  std::size_t hidden = 0, rowBytes = 0, capacity = 0;
  // A row as it travels: rowBytes, or (fp8 dispatch) its e4m3 elements then its f32 scales, one
  // per 128 values, padded to 16 bytes (fp8::Segments' share). Combine's rows are rowBytes.
  std::size_t sentBytes = 0;
  bool fp8 = false;
  fp8::Codec codec;              // fp8: e4m3:128 (dispatchCodec)
  std::byte* encoded = nullptr;  // fp8: this rank's tokens encoded, sentBytes apart
  DataType type = DataType::bf16;
  std::byte* peers[kGpuMaxRanks] = {};  // each rank's buffer
  // countsAt: [kGpuMaxRanks] rows from each source; expertRowsAt: [n, L] rows each source sent
  // each local expert (low latency).
  std::size_t countsAt = 0, expertRowsAt = 0, metaAt = 0, rowsAt = 0, backAt = 0;
  // This rank's: [tokens, n] slot of each token at each rank (−1: not sent there), [n] rows
  // sent to each, [n, tokens, k] recvX row of each received slot (−1: none), the call count,
  // and [3] what went wrong: bad expert indices, repeated experts, rows over the capacity.
  std::int32_t* slotOf = nullptr;
  std::int32_t* sendCount = nullptr;
  std::int32_t* rowPos = nullptr;
  std::uint64_t* epoch = nullptr;
  unsigned* arrived = nullptr;       // [n + 1] blocks done sending to each rank, and combine's
  std::int32_t* sentRows = nullptr;  // [n, L] rows sent each rank's experts (normal, table)
  // [n, chunks, 1 + L] each 256-token chunk's tokens and rows for each rank (normal, table).
  std::int32_t* chunkRows = nullptr;

  unsigned long long* status = nullptr;
  std::uint64_t timeoutNs = 0;
};

// The shared buffer's bytes for `d`'s shape, with its offsets set.
std::size_t layoutShared(MoeDevice& d);

// Dispatch, in two halves on one stream (whatever the caller runs between them overlaps the
// rows' flight). Send: (fp8: x encoded first, fp8::encodeSegmentsOnDevice, the host's bytes)
// the layout, the rows and records into the peers' buffers, the counts and flags raised there.
// Receive: once every source's flag is up, each local expert's rows counted, placed and copied
// into recvX (fp8: the elements, [capacity, hidden] bytes; the scales to recvScales,
// [capacity, hidden / 128]). The call is counted (tp::countCall) before the send.
Status launchDispatchSend(const MoeDevice& d, const void* x, const std::int64_t* topkIdx,
                          const float* topkWeights, void* stream);
Status launchDispatchRecv(const MoeDevice& d, void* recvX, std::int32_t* expertCounts,
                          std::int32_t* recvSource, float* recvScales, void* stream);
// Combine's halves. Send: each received token's Σ weight · expert output over its local slots
// (f32, slot order) written back into its source's buffer, flags raised. Receive: each own
// token's partial sums added in rank order (f32) into out.
Status launchCombineSend(const MoeDevice& d, const void* expertOut, void* stream);
Status launchCombineRecv(const MoeDevice& d, void* out, void* stream);
// Each kernel loaded before any of them waits on a peer (lazy loading could otherwise wait for
// a peer's spinning kernel).
Status loadMoeKernels();
Status loadCombineKernels();  // device_combine.cu's, by loadMoeKernels

}  // namespace weft::fused::moe
