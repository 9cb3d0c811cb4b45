// Small calls on host memory through the slots: every rank copies its whole input into one of
// the two slots after its inbox's control page and publishes the call's number there; every rank
// then computes its own output from all ranks' slots (every slot summed in rank order for the
// reductions, so every rank's all-reduce has the same bits). A rank writes a slot again two
// calls later: by then every peer has published the call in between, which it does only after
// reading everything of the call before. One write and n - 1 reads of at most
// kShmSmallSlotBytes a rank, no messages, no schedule: the latency of one exchange.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "src/exec/host_direct.hpp"
#include "src/transport/connection.hpp"
#include "src/transport/shm.hpp"
#include "weft/types.hpp"

namespace weft::exec {

struct SlotsGroup {
  int rank = 0, nranks = 1;
  std::vector<transport::ShmSmallSlot*> slots;  // by rank: its two slots
  const transport::Waiter* waiter = nullptr;
};

// Whether the slots serve this collective at all (every one but all-to-all-v and send/recv).
bool slotsServe(Collective coll);

// Runs one call; every rank of the group calls it for the same call, whose input fits a slot.
// `calls` counts this rank's slot calls so far (the same on every rank between calls).
Status runSlots(const DirectCall& call, const SlotsGroup& group, std::uint64_t& calls);

}  // namespace weft::exec
