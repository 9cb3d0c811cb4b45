// Ring attention's forward pass on a communicator (weft.h's weftRingAttention): each rank's
// zigzag shard of packed sequences attends the K/V block it holds while the next block moves
// around the ring (the communicator's send/recv, on a side stream), merging by log-sum-exp in f32.
#pragma once

#include <cstddef>

#include "fused/attention/local.hpp"
#include "src/core/communicator.hpp"

namespace weft::fused::attention {

struct RingCall {
  LocalAttention local;  // this rank's q, k, v (cuSeqlensQ: its offsets), out (of type) and lse
  bool causal = false;
  void* workspace = nullptr;  // null: the communicator's
  std::size_t workspaceBytes = 0;
  void* stream = nullptr;
};

// Two K/V blocks (k, then v) and the f32 output the steps merge into.
struct RingWorkspace {
  std::size_t block = 0, partials = 0, total = 0;  // byte offsets of the second block, partials
};
Result<RingWorkspace> ringWorkspace(const LocalAttention& a);
// What a call checks before it changes anything.
Status checkRing(const RingCall& x);
Status runRing(Communicator& comm, const RingCall& x);

}  // namespace weft::fused::attention
