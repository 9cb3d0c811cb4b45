// Ring attention on a communicator (weft.h's weftRingAttention and weftRingAttentionBackward):
// each rank's zigzag shard of packed sequences attends the K/V block it holds while the next
// block moves around the ring (the communicator's send/recv, on a side stream), merging by
// log-sum-exp in f32; backward, the blocks go around again with their gradients.
#pragma once

#include <cstddef>
#include <vector>

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
  std::size_t block = 0, partials = 0;        // byte offsets of the second block, the partials
  std::size_t scratch = 0, scratchBytes = 0;  // cuDNN's (one sequence): a part and its workspace
  std::size_t ring = 0, total = 0;            // the ring's bytes; either way's (Ulysses's too)
};
Result<RingWorkspace> ringWorkspace(const LocalAttention& a);
// What a call checks before it changes anything.
Status checkRing(const RingCall& x);
// The selector's pick (ring, Ulysses or the hybrid) on the call.
Status runRing(Communicator& comm, const RingCall& x);

// The ring's ranks: n of `comm` (none needed where n is 1: this rank alone, Ulysses's).
struct RingPeers {
  Communicator* comm = nullptr;
  int n = 1, me = 0;
};
// Step s's attention of the ring (its k and v those of the block then held).
LocalAttention ringPart(const RingPeers& p, const RingCall& x, algo::AttentionKernel kernel,
                        const RingWorkspace& layout, std::byte* workspace, int step);
// The ring's steps, enqueued on x.stream (the call checked, the peers met over the workspace).
Status ringForward(const RingPeers& p, const RingCall& x, algo::AttentionKernel kernel,
                   std::byte* workspace);

// The backward pass: from the forward's call (its out and lse now inputs) and the loss's
// gradient by out, the gradients of q, k and v (of the call's type, q's and k's shapes). Each
// rank keeps its queries' dq; a K/V block travels around the ring again with its dk and dv in
// f32, each rank adding its queries' share, and comes home after n steps.
struct RingGrads {
  const void* dOut = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
};
// Byte offsets: delta (rowsum(dOut ∘ out)), dq in f32, then two travelling blocks, each k, v
// (of type) and dk, dv (f32; `grads` bytes into the block).
// `ring` the ring's bytes, `total` either way's (Ulysses's too).
struct RingBackwardWorkspace {
  std::size_t dq = 0, blocks = 0, block = 0, grads = 0, ring = 0, total = 0;
};
Result<RingBackwardWorkspace> ringBackwardWorkspace(const LocalAttention& a);
Status checkRingBackward(const RingCall& x, const RingGrads& g);
Status runRingBackward(Communicator& comm, const RingCall& x, const RingGrads& g);
// `deltaReady`: delta (rowsum(dOut ∘ out), the workspace's first bytes) is there already.
Status ringBackward(const RingPeers& p, const RingCall& x, const RingGrads& g, std::byte* workspace,
                    bool deltaReady = false);

}  // namespace weft::fused::attention
