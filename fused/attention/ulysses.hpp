// Ulysses (DeepSpeed-Ulysses's scheme) for context-parallel attention's forward pass, the
// selector's other candidate beside the ring: each rank's zigzag share of the sequences, all
// heads, goes by all-to-all to head shards of the whole sequences (heads / n and K/V heads / n a
// rank), the whole sequences are attended in global order, and out and the log-sum-exp go back
// the same way. docs/algorithms-fused.md, "Ulysses".
#pragma once

#include <cstddef>

#include "fused/attention/ring.hpp"

namespace weft::fused::attention {

// Byte offsets in the workspace: the q, k, v rows out and in, the head shards of the whole
// sequences (q, k, v), their out and log-sum-exp, the out and log-sum-exp rows out and in, and
// the whole sequences' offsets, cuDNN's workspace (one sequence). The same for every rank count.
struct UlyssesWorkspace {
  std::size_t sendIn = 0, recvIn = 0, whole = 0, wholeOut = 0, wholeLse = 0, sendOut = 0,
              recvOut = 0, sendLse = 0, recvLse = 0, cu = 0, cudnn = 0, total = 0;
};
UlyssesWorkspace ulyssesWorkspace(const LocalAttention& a);

// The attention of the whole sequences on this rank's heads, in the workspace.
LocalAttention ulyssesAttention(const Communicator& comm, const RingCall& x, std::byte* workspace);

// The forward pass by Ulysses (CUDA builds; the caller checked the call and that the ranks
// divide both head counts).
Status runUlysses(Communicator& comm, const RingCall& x, std::byte* workspace);

}  // namespace weft::fused::attention
