// MoE dispatch and combine on GPU memory: the ranks of one host (sharing a GPU, or GPUs that map
// each other's memory) write their tokens' rows straight into each other's buffers
// (fused/moe/device.hpp). Outside a graph capture dispatch waits for its layout and reports
// bad routing and rows over the capacity as every rank's error; inside one nothing waits on the
// host (rows past the capacity are dropped and counted). docs/algorithms-fused.md, "MoE
// dispatch and combine".
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "fused/moe/host.hpp"

namespace weft::fused::moe {

struct GpuState;

// A GPU dispatch's layout: it lives in the communicator's MoE state, until the next dispatch
// (each dispatch's combine comes before the next dispatch on the communicator).
struct GpuLayout {
  std::weak_ptr<GpuState> state;  // gone with the communicator
  std::uint64_t generation = 0;   // the state's shape when dispatched
  std::size_t rows = 0;           // known outside a capture
};

// Each call in two halves on the caller's stream (device.hpp): what the caller launches between
// a send and its receive overlaps the transfer. The caller keeps the halves in order (the C
// API's handle checks it): dispatch's send, its receive, combine's send, its receive; a second
// dispatch before the first's combine is refused here. `layout.rows` is known after
// dispatch's receive, outside a capture.
Result<GpuLayout> dispatchGpuSend(Communicator& comm, const algo::MoeShape& shape,
                                  const DispatchCall& call, void* stream);
Status dispatchGpuRecv(Communicator& comm, GpuLayout& layout, void* stream);
Status combineGpuSend(Communicator& comm, const GpuLayout& layout, const void* expertOut,
                      void* stream);
Status combineGpuRecv(Communicator& comm, const GpuLayout& layout, void* out, void* stream);
// A dispatch that will not be combined (its handle destroyed): the next may come.
void forgetGpu(const GpuLayout& layout);

}  // namespace weft::fused::moe
