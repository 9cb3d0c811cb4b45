// Ulysses (DeepSpeed-Ulysses's scheme) for context-parallel attention, forward and backward, and
// the hybrid: within a group of u consecutive ranks, each rank's zigzag share of the sequences,
// all heads, goes by all-to-all to head shards (heads / u and K/V heads / u a rank) of the
// group's share, which is the n / u groups' zigzag share of the sequences; the ring runs across
// the groups on it (one group: the whole sequences, no ring), and the results come back the same
// way. docs/algorithms-fused.md, "Ulysses" and "Hybrid".
#pragma once

#include <cstddef>
#include <cstdint>

#include "fused/attention/ring.hpp"

namespace weft::fused::attention {

// The communicators a call over groups of u runs on: its group (the call's own where u is all
// of it), and the ring across the groups (this rank alone where there is one group).
struct Groups {
  Communicator* group = nullptr;
  RingPeers ring;
};
// Made once per u a communicator (collective: every rank asks for the same u).
Result<Groups> groupsOf(Communicator& comm, int u);

// Byte offsets in the workspace: what goes to the head shards and back (sent and received each
// way), the group's share (the forward's q, k, v; backward also dO), the forward's out and
// log-sum-exp (backward: the log-sum-exp, delta and the gradients of q, k and v, of the call's
// type), its offsets, then the ring's workspace on it. The same bytes whatever u.
struct UlyssesWorkspace {
  std::size_t sendIn = 0, recvIn = 0, sendOut = 0, recvOut = 0, share = 0, out = 0, lse = 0,
              delta = 0, cu = 0, ring = 0, total = 0;
};
Result<UlyssesWorkspace> ulyssesWorkspace(const LocalAttention& a, bool backward);

// The group's share of the call on this rank's heads, in the workspace: the ring's call on it
// (out and lse the workspace's; backward, the forward's lse, and out unread), its workspace
// after the buffers; backward, dOut's share and the gradients' (of the call's type), and where
// the ring's backward takes delta, which comes with the log-sum-exp.
struct GroupShare {
  RingCall call;
  RingGrads grads;
  float* delta = nullptr;
};
GroupShare groupShare(const RingCall& x, int u, std::byte* workspace, bool backward);

// Forward and backward over groups of u (CUDA builds; the caller checked the call, met the
// peers over the workspace and that u divides the ranks and both head counts).
Status runUlysses(const Groups& g, const RingCall& x, algo::AttentionKernel kernel,
                  std::byte* workspace);
Status runUlyssesBackward(const Groups& g, const RingCall& x, const RingGrads& grads,
                          std::byte* workspace);

}  // namespace weft::fused::attention
