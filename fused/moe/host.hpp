// MoE dispatch and combine on host memory through the communicator's collectives: the counts
// every rank routes to every rank's experts gathered once, each token's values sent once per
// destination rank (with its slots' local experts and weights) — read by the destination
// straight from the sender's workspace where the ranks share a host, else by one all-to-all-v
// — and laid out grouped by local expert on arrival; combine sends each received token's weighted
// sum over its local experts back, summed at its owner in rank order (f32), so the result is the
// same bits whatever the arrival order. Across hosts the selector may pick the hierarchical path:
// a token once per host over the network, forwarded there, its parts summed there first. The
// reference the device kernels are checked against, and the host path. docs/algorithms-fused.md,
// "MoE dispatch and combine".
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "algorithms/moe_plan.hpp"
#include "fused/fp8/codec.hpp"
#include "src/core/communicator.hpp"

namespace weft::fused::moe {

struct DispatchCall {
  const void* x = nullptr;                // [tokens, hidden] of `type`
  const std::int64_t* topkIdx = nullptr;  // [tokens, topk]: an expert, or −1 (dropped)
  const float* topkWeights = nullptr;     // [tokens, topk]: combine's weights
  DataType type = DataType::bf16;         // bf16, f16 or f32
  // [capacity, hidden] of `type`: the rows received, grouped by local expert (expert 0's rows,
  // then expert 1's, …), each expert's by source rank, then the source's token order.
  void* recvX = nullptr;
  std::size_t capacity = 0;
  std::int32_t* expertCounts = nullptr;  // [local experts]: each one's rows
  std::int32_t* recvSource = nullptr;    // optional, [capacity, 2]: each row's rank and token
  // fp8 dispatch: each row sent as e4m3 with one f32 scale per 128 values (DeepSeek-V3's
  // blocks, fp8::Codec e4m3:128); recvX then [capacity, hidden] bytes of e4m3 and recvScales
  // [capacity, ⌈hidden / 128⌉] (a value ≈ element · its block's scale). Combine stays in `type`.
  bool fp8 = false;
  float* recvScales = nullptr;
};

// The codec of fp8 dispatch.
fp8::Codec dispatchCodec();

// One dispatch's layout, which its combine takes back.
struct MoeLayout {
  algo::MoeShape shape;
  DataType type = DataType::bf16;
  algo::RankRoute route;              // this rank's tokens to each rank
  std::vector<std::size_t> fromRank;  // tokens received from each rank
  // Flat, through the peers' workspaces (Communicator::peerWorkspaces): where this rank's
  // tokens stand among each rank's received ones (the tokens of the ranks before it there).
  std::vector<std::size_t> atPeer;
  std::vector<std::size_t> slotOffsets;  // received tokens + 1: token j's slots are
  std::vector<std::size_t> slotRows;     // slotRows[slotOffsets[j] …] (rows of recvX),
  std::vector<float> slotWeights;        // with their weights
  std::size_t rows = 0;                  // recvX's rows written
  // The hierarchical path (algo::MoePlan::hierarchical; ranks on several hosts): this rank's
  // tokens to each host, sent to the rank of its rail there, which forwards them to the host's
  // ranks; each received token's record among the forwarders' (atForwarded), and as a forwarder,
  // the records it got from its rail (fromRail, by rank), those it sent each rank of its host
  // (toLocal) and where each got record's parts come back in combine (partAt).
  bool hierarchical = false;
  algo::HostRoute hostRoute;                                  // this rank's tokens, by host
  std::vector<std::size_t> fromRail, toLocal, fromForwarder;  // records, by rank
  std::vector<std::size_t> atForwarded;  // received tokens: index among the forwarded records
  std::vector<std::size_t> partOffsets;  // records from the rail + 1: record i's parts are at
  std::vector<std::size_t> partAt;       // partAt[partOffsets[i] …) of the forwarded records
};

// Collective: every rank calls it with the same shape (`tokens` its own). A routing error on any
// rank, or more rows for a rank than its capacity, is every rank's error (naming the rank and,
// over capacity, by how many), and nothing is written.
Result<MoeLayout> dispatchHost(Communicator& comm, const algo::MoeShape& shape,
                               const DispatchCall& call);
// out [tokens, hidden] of the layout's type: each token's Σ weight · expert output over its
// slots (0 where every slot was dropped); expertOut [rows, hidden] as recvX was laid out.
Status combineHost(Communicator& comm, const MoeLayout& layout, const void* expertOut, void* out);

}  // namespace weft::fused::moe
