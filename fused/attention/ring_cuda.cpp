// runRing on the GPU: step s attends the block held (the own K/V at step 0) on the caller's
// stream, merging into f32 partials, while a side stream sends that block to the next rank and
// receives the following one from the previous into the other buffer; the side stream forks
// from the caller's and joins it again (capturable).
#include <cuda_runtime.h>

#include <string>

#include "fused/attention/merge.hpp"
#include "fused/attention/ring.hpp"
#include "fused/cuda_steps.hpp"

namespace weft::fused::attention {
namespace {

Status cudaFailed(const char* what, cudaError_t e) {
  return Status(Code::systemError,
                std::string("ring attention: ") + what + ": " + cudaGetErrorString(e));
}

// A communicator's side stream for its ring calls.
Result<SideStream*> sideOf(Communicator& comm) {
  std::shared_ptr<void>& slot = comm.fusedState("ring-attention");
  if (slot) return static_cast<SideStream*>(slot.get());
  auto s = std::make_shared<SideStream>();
  if (Status made = s->create(); !made) return made;
  slot = s;
  return s.get();
}

}  // namespace

Status runRing(Communicator& comm, const RingCall& x) {
  if (Status s = checkRing(x); !s) return s;
  const LocalAttention& a = x.local;
  for (auto [p, role] : {std::pair<const void*, const char*>{a.q, "q"},
                         {a.k, "k"},
                         {a.v, "v"},
                         {a.out, "out"},
                         {a.lse, "lse"},
                         {a.cuSeqlensQ, "cuSeqlens"},
                         {x.workspace, "the workspace"}}) {
    if (Status s = onDevice(p, "ring attention", role); !s) return s;
  }
  auto layout = ringWorkspace(a);
  if (!layout) return layout.status();
  auto workspace = workspaceOr(comm, x.workspace, layout->total);
  if (!workspace) return workspace.status();
  std::byte* ws = *workspace;
  auto side = sideOf(comm);
  if (!side) return side.status();
  SideStream& state = **side;
  const auto stream = static_cast<cudaStream_t>(x.stream);
  const int n = comm.size(), me = comm.rank();
  const std::size_t half = a.tokensQ * static_cast<std::size_t>(a.kvHeads * a.dim) * sizeOf(a.type);
  std::byte* blocks[2] = {ws, ws + layout->block};
  auto* partials = reinterpret_cast<float*>(ws + layout->partials);
  const MergeShape shape{a.tokensQ, static_cast<std::size_t>(a.heads),
                         static_cast<std::size_t>(a.dim)};
  return comm.gpuOperation(x.stream, [&]() -> Status {
    if (a.tokensQ == 0) return {};
    if (Status s = resetPartials(partials, a.lse, shape, stream); !s) return s;
    for (auto [to, from] : {std::pair{blocks[0], a.k}, std::pair{blocks[0] + half, a.v}}) {
      if (cudaError_t e = cudaMemcpyAsync(to, from, half, cudaMemcpyDeviceToDevice, stream);
          e != cudaSuccess)
        return cudaFailed("the own block", e);
    }
    for (int step = 0; step < n; ++step) {
      std::byte* held = blocks[step % 2];
      std::byte* next = blocks[(step + 1) % 2];
      if (step + 1 < n) {
        // The next block's buffer was last read by the previous step's attention.
        if (Status s = follow(state.stream, stream, state.fork); !s) return s;
        std::vector<Communicator::P2pOp> ops{
            {true, (me + 1) % n, held, 2 * half, state.stream},
            {false, (me + n - 1) % n, next, 2 * half, state.stream}};
        if (Status s = comm.exchange(std::move(ops)); !s) return s;
      }
      LocalAttention part = a;
      part.k = held;
      part.v = held + half;
      part.cuSeqlensK = a.cuSeqlensQ;
      part.piece = ringStep(me, step, n, x.causal);
      part.out = partials;
      part.merge = true;
      if (Status s = attendOnDevice(part, stream); !s) return s;
      if (step + 1 < n) {
        if (Status s = follow(stream, state.stream, state.join); !s) return s;
      }
    }
    return finishPartials(a.out, partials, a.type, shape, stream);
  });
}

}  // namespace weft::fused::attention
