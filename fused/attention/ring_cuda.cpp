// runRing on the GPU: step s attends the block held (the own K/V at step 0) on the caller's
// stream, merging into f32 partials, while a side stream sends that block to the next rank and
// receives the following one from the previous into the other buffer; the side stream forks
// from the caller's and joins it again (capturable).
#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "fused/attention/backward.hpp"
#include "fused/attention/cudnn.hpp"
#include "fused/attention/merge.hpp"
#include "fused/attention/ring.hpp"
#include "fused/attention/ulysses.hpp"
#include "fused/cuda_steps.hpp"

namespace weft::fused::attention {
namespace {

Status cudaFailed(const char* what, cudaError_t e) {
  return cudaStatus(std::string("ring attention: ") + what, e);
}

Status copyOnDevice(void* to, const void* from, std::size_t bytes, cudaStream_t stream,
                    const char* what) {
  if (cudaError_t e = cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, stream);
      e != cudaSuccess)
    return cudaFailed(what, e);
  return {};
}

// Every buffer of a call (and its gradients') is GPU memory.
Status buffersOnDevice(const RingCall& x, const RingGrads* g) {
  const LocalAttention& a = x.local;
  const RingGrads none;
  const RingGrads& d = g != nullptr ? *g : none;
  const char* who = g != nullptr ? "ring attention backward" : "ring attention";
  for (auto [p, role] : {std::pair<const void*, const char*>{a.q, "q"},
                         {a.k, "k"},
                         {a.v, "v"},
                         {a.out, "out"},
                         {a.lse, "lse"},
                         {a.cuSeqlensQ, "cuSeqlens"},
                         {d.dOut, "dOut"},
                         {d.dq, "dq"},
                         {d.dk, "dk"},
                         {d.dv, "dv"},
                         {x.workspace, "the workspace"}}) {
    if (Status s = onDevice(p, who, role); !s) return s;
  }
  return {};
}

// What the selector prices.
algo::AttentionShape shapeOf(const Communicator& comm, const RingCall& x, bool backward) {
  const LocalAttention& a = x.local;
  algo::AttentionShape s;
  s.tokens = a.tokensQ, s.heads = a.heads, s.kvHeads = a.kvHeads, s.dim = a.dim;
  s.valueBytes = sizeOf(a.type), s.causal = x.causal, s.backward = backward;
  s.nranks = comm.size();
  LocalAttention merging = a;
  merging.merge = true;
  s.cudnn = !backward && cudnnCovers(merging) && cudnnAvailable();
  return s;
}

// cuDNN loads a kernel at its first launch, and loading waits for the kernels running on the
// device, among them a peer's transfer waiting for this rank: at a call's first shape each of
// its attentions runs once alone (its partials untouched), then the ranks meet. Not while a
// graph is captured (its kernels load when it is instantiated).
Status primeCudnn(Communicator& comm, const RingCall& x, int group,
                  const std::function<std::vector<LocalAttention>()>& parts) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  const auto stream = static_cast<cudaStream_t>(x.stream);
  if (cudaError_t e = cudaStreamIsCapturing(stream, &capture); e != cudaSuccess)
    return cudaFailed("capture status", e);
  if (capture != cudaStreamCaptureStatusNone) return {};
  using Key = std::tuple<std::size_t, int, int, int, int, bool, int>;
  std::shared_ptr<void>& slot = comm.fusedState("ring-attention-cudnn");
  if (!slot) slot = std::make_shared<std::set<Key>>();
  auto& primed = *static_cast<std::set<Key>*>(slot.get());
  const LocalAttention& a = x.local;
  const Key key{a.tokensQ, a.heads, a.kvHeads, a.dim, static_cast<int>(a.type), x.causal, group};
  if (primed.contains(key)) return {};
  for (const LocalAttention& p : parts()) {
    if (Status s = attendWithCudnn(p, stream, false); !s) return s;
  }
  if (cudaError_t e = cudaStreamSynchronize(stream); e != cudaSuccess) return cudaFailed("sync", e);
  if (comm.size() > 1) {
    if (Status s = comm.barrier(); !s) return s;
  }
  primed.insert(key);
  return {};
}

// The call's workspace. The communicator's grows at a call larger than any before: then the
// ranks meet (a host barrier) once each has its own, before any enqueues a transfer that waits
// for a peer, since an allocation may wait for the kernels running on the device.
Result<std::byte*> workspaceMet(Communicator& comm, const RingCall& x, std::size_t bytes) {
  if (x.workspace != nullptr) return static_cast<std::byte*>(x.workspace);
  std::shared_ptr<void>& slot = comm.fusedState("ring-attention-bytes");
  if (!slot) slot = std::make_shared<std::size_t>(0);
  std::size_t& most = *static_cast<std::size_t*>(slot.get());
  auto ws = comm.workspace(bytes, true);
  if (!ws) return ws;
  if (bytes > most && comm.size() > 1) {
    if (Status s = comm.barrier(); !s) return s;
  }
  most = std::max(most, bytes);
  return ws;
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

// The ring's side stream made before anything is enqueued: where this call made it, the ranks
// then meet (as at a workspace's growth), since making a stream may wait for the kernels running
// on the device, a peer's transfer waiting for this rank among them.
Status sideMet(Communicator& comm, const RingPeers& p) {
  if (p.n == 1) return {};
  const bool made = static_cast<bool>(p.comm->fusedState("ring-attention"));
  if (auto side = sideOf(*p.comm); !side) return side.status();
  if (!made && comm.size() > 1) return comm.barrier();
  return {};
}

// What a call runs with: the ring, Ulysses or the hybrid (Ulysses in groups of u, the ring
// across them) as the selector picks, in a workspace of what that needs (a caller's holds any),
// the ranks met over it; the groups' communicators and the ring's side stream made.
struct Prepared {
  algo::AttentionPlan plan;
  std::byte* ws = nullptr;
  Groups groups;
};
Result<Prepared> prepare(Communicator& comm, const RingCall& x, bool backward,
                         std::size_t ringBytes, std::size_t groupBytes) {
  Prepared p;
  // Every kernel loaded on every rank before any rank's first call waits on a peer.
  if (std::shared_ptr<void>& loaded = comm.fusedState("attention-kernels"); !loaded) {
    if (Status s = loadAttentionKernels(); !s) return s;
    loaded = std::make_shared<bool>(true);
    if (comm.size() > 1) {
      if (Status s = comm.barrier(); !s) return s;
    }
  }
  auto plan = comm.attentionPlanFor(shapeOf(comm, x, backward));
  if (!plan) return plan.status();
  p.plan = *plan;
  const int u = plan->group;
  auto workspace = workspaceMet(comm, x, u > 1 ? groupBytes : ringBytes);
  if (!workspace) return workspace.status();
  p.ws = *workspace;
  p.groups = Groups{nullptr, {&comm, comm.size(), comm.rank()}};
  if (u > 1) {
    auto g = groupsOf(comm, u);
    if (!g) return g.status();
    p.groups = *g;
  }
  if (Status s = sideMet(comm, p.groups.ring); !s) return s;
  return p;
}

}  // namespace

LocalAttention ringPart(const RingPeers& p, const RingCall& x, algo::AttentionKernel kernel,
                        const RingWorkspace& layout, std::byte* ws, int step) {
  const LocalAttention& a = x.local;
  LocalAttention part = a;
  part.cuSeqlensK = a.cuSeqlensQ;
  part.piece = ringStep(p.me, step, p.n, x.causal);
  // Merged into the f32 partials; cuDNN's first (every query: ringStep's step 0) writes them
  // fresh. One rank's writes the result.
  if (p.n > 1) {
    part.out = ws + layout.partials;
    part.merge = true;
    part.fresh = kernel == algo::AttentionKernel::cudnn && step == 0;
  }
  part.kernel = kernel;
  part.scratch = ws + layout.scratch, part.scratchBytes = layout.scratchBytes;
  return part;
}

Status ringForward(const RingPeers& p, const RingCall& x, algo::AttentionKernel kernel,
                   std::byte* ws) {
  const LocalAttention& a = x.local;
  auto layout = ringWorkspace(a);
  if (!layout) return layout.status();
  const auto stream = static_cast<cudaStream_t>(x.stream);
  const int n = p.n, me = p.me;
  const std::size_t half = a.tokensQ * static_cast<std::size_t>(a.kvHeads * a.dim) * sizeOf(a.type);
  std::byte* blocks[2] = {ws, ws + layout->block};
  auto* partials = reinterpret_cast<float*>(ws + layout->partials);
  const MergeShape shape{a.tokensQ, static_cast<std::size_t>(a.heads),
                         static_cast<std::size_t>(a.dim)};
  if (n == 1) return attendOnDevice(ringPart(p, x, kernel, *layout, ws, 0), stream);
  auto side = sideOf(*p.comm);
  if (!side) return side.status();
  SideStream& state = **side;
  if (kernel != algo::AttentionKernel::cudnn) {
    if (Status s = resetPartials(partials, a.lse, shape, stream); !s) return s;
  }
  for (auto [to, from] : {std::pair{blocks[0], a.k}, std::pair{blocks[0] + half, a.v}}) {
    if (Status s = copyOnDevice(to, from, half, stream, "the own block"); !s) return s;
  }
  for (int step = 0; step < n; ++step) {
    std::byte* held = blocks[step % 2];
    std::byte* next = blocks[(step + 1) % 2];
    if (step + 1 < n) {
      // The next block's buffer was last read by the previous step's attention.
      if (Status s = follow(state.stream, stream, state.fork); !s) return s;
      std::vector<Communicator::P2pOp> ops{{true, (me + 1) % n, held, 2 * half, state.stream},
                                           {false, (me + n - 1) % n, next, 2 * half, state.stream}};
      if (Status s = p.comm->exchange(std::move(ops)); !s) return s;
    }
    LocalAttention part = ringPart(p, x, kernel, *layout, ws, step);
    part.k = held, part.v = held + half;
    if (Status s = attendOnDevice(part, stream); !s) return s;
    if (step + 1 < n) {
      if (Status s = follow(stream, state.stream, state.join); !s) return s;
    }
  }
  return finishPartials(a.out, partials, a.type, shape, stream);
}

Status runRing(Communicator& comm, const RingCall& x) {
  if (Status s = checkRing(x); !s) return s;
  const LocalAttention& a = x.local;
  if (Status s = buffersOnDevice(x, nullptr); !s) return s;
  auto layout = ringWorkspace(a);
  if (!layout) return layout.status();
  auto groupLayout = ulyssesWorkspace(a, false);
  if (!groupLayout) return groupLayout.status();
  auto prep = prepare(comm, x, false, layout->ring, groupLayout->total);
  if (!prep) return prep.status();
  const algo::AttentionPlan* plan = &prep->plan;
  const int u = plan->group;
  std::byte* ws = prep->ws;
  const Groups& groups = prep->groups;
  // The ring's call: this one, or the group's share.
  RingCall ring = x;
  std::byte* ringWs = ws;
  if (u > 1) {
    ring = groupShare(x, u, ws, false).call;
    ringWs = static_cast<std::byte*>(ring.workspace);
  }
  if (plan->kernel == algo::AttentionKernel::cudnn && a.tokensQ > 0) {
    auto ringLayout = ringWorkspace(ring.local);
    if (!ringLayout) return ringLayout.status();
    auto parts = [&] {
      std::vector<LocalAttention> all;
      for (int step = 0; step < groups.ring.n; ++step) {
        all.push_back(ringPart(groups.ring, ring, plan->kernel, *ringLayout, ringWs, step));
        all.back().k = ring.local.k, all.back().v = ring.local.v;
      }
      return all;
    };
    if (Status s = primeCudnn(comm, x, u, parts); !s) return s;
  }
  return comm.gpuOperation(x.stream, [&]() -> Status {
    if (a.tokensQ == 0) return {};
    return u > 1 ? runUlysses(groups, x, plan->kernel, ws)
                 : ringForward(groups.ring, x, plan->kernel, ws);
  });
}

// Backward, step s: rank me holds block me − s with its dk, dv so far. Its k, v go on to the
// next rank (on the side stream) while this rank adds its queries' share of the gradients; then
// the gradients go on too, and the next step waits for both. After n steps every block's
// gradients are home.
Status ringBackward(const RingPeers& p, const RingCall& x, const RingGrads& g, std::byte* ws,
                    bool deltaReady) {
  const LocalAttention& a = x.local;
  auto layout = ringBackwardWorkspace(a);
  if (!layout) return layout.status();
  const auto stream = static_cast<cudaStream_t>(x.stream);
  const int n = p.n, me = p.me;
  SideStream* state = nullptr;
  if (n > 1) {
    auto side = sideOf(*p.comm);
    if (!side) return side.status();
    state = *side;
  }
  const std::size_t kv = a.tokensQ * static_cast<std::size_t>(a.kvHeads * a.dim);
  const std::size_t half = kv * sizeOf(a.type), gradHalf = kv * sizeof(float);
  auto* delta = reinterpret_cast<float*>(ws);
  auto* dq = reinterpret_cast<float*>(ws + layout->dq);
  std::byte* blocks[2] = {ws + layout->blocks, ws + layout->blocks + layout->block};
  const MergeShape qShape{a.tokensQ, static_cast<std::size_t>(a.heads),
                          static_cast<std::size_t>(a.dim)};
  const MergeShape kvShape{a.tokensQ, static_cast<std::size_t>(a.kvHeads),
                           static_cast<std::size_t>(a.dim)};
  if (!deltaReady) {
    if (Status s = computeDelta(a.out, g.dOut, a.type, a.tokensQ, a.heads, a.dim, delta, stream);
        !s)
      return s;
  }
  for (auto [ptr, bytes] :
       {std::pair{static_cast<void*>(dq), a.tokensQ * qShape.heads * qShape.dim * sizeof(float)},
        std::pair{static_cast<void*>(blocks[0] + layout->grads), 2 * gradHalf}}) {
    if (cudaError_t e = cudaMemsetAsync(ptr, 0, bytes, stream); e != cudaSuccess)
      return cudaFailed("zeroing the gradients", e);
  }
  for (auto [to, from] : {std::pair{blocks[0], a.k}, std::pair{blocks[0] + half, a.v}}) {
    if (n == 1) break;  // attended where they are
    if (Status s = copyOnDevice(to, from, half, stream, "the own block"); !s) return s;
  }
  auto pass = [&](std::byte* from, std::byte* to, std::size_t bytes) -> Status {
    if (Status s = follow(state->stream, stream, state->fork); !s) return s;
    std::vector<Communicator::P2pOp> ops{{true, (me + 1) % n, from, bytes, state->stream},
                                         {false, (me + n - 1) % n, to, bytes, state->stream}};
    return p.comm->exchange(std::move(ops));
  };
  for (int step = 0; step < n; ++step) {
    std::byte* held = blocks[step % 2];
    std::byte* next = blocks[(step + 1) % 2];
    if (step + 1 < n) {  // k and v on while this step runs
      if (Status s = pass(held, next, 2 * half); !s) return s;
    }
    LocalBackward b;
    b.q = a.q, b.k = n == 1 ? a.k : held, b.v = n == 1 ? a.v : held + half;
    b.cuSeqlensQ = b.cuSeqlensK = a.cuSeqlensQ;
    b.sequences = a.sequences;
    b.tokensQ = b.tokensK = a.tokensQ;
    b.maxSeqlenQ = b.maxSeqlenK = a.maxSeqlenQ;
    b.heads = a.heads, b.kvHeads = a.kvHeads, b.dim = a.dim;
    b.type = a.type, b.scale = a.scale;
    b.piece = ringStep(me, step, n, x.causal);
    b.dOut = g.dOut, b.lse = a.lse, b.delta = delta;
    b.dq = dq;
    b.dk = reinterpret_cast<float*>(held + layout->grads);
    b.dv = b.dk + kv;
    if (Status s = attendBackwardOnDevice(b, stream); !s) return s;
    if (n > 1) {  // the gradients on, once this step has added to them
      if (Status s = pass(held + layout->grads, next + layout->grads, 2 * gradHalf); !s) return s;
      if (Status s = follow(stream, state->stream, state->join); !s) return s;
    }
  }
  const auto* grads = reinterpret_cast<const float*>(blocks[n == 1 ? 0 : n % 2] + layout->grads);
  if (Status s = finishPartials(g.dq, dq, a.type, qShape, stream); !s) return s;
  if (Status s = finishPartials(g.dk, grads, a.type, kvShape, stream); !s) return s;
  return finishPartials(g.dv, grads + kv, a.type, kvShape, stream);
}

Status runRingBackward(Communicator& comm, const RingCall& x, const RingGrads& g) {
  if (Status s = checkRingBackward(x, g); !s) return s;
  const LocalAttention& a = x.local;
  if (Status s = buffersOnDevice(x, &g); !s) return s;
  auto layout = ringBackwardWorkspace(a);
  if (!layout) return layout.status();
  auto groupLayout = ulyssesWorkspace(a, true);
  if (!groupLayout) return groupLayout.status();
  auto prep = prepare(comm, x, true, layout->ring, groupLayout->total);
  if (!prep) return prep.status();
  const int u = prep->plan.group;
  std::byte* ws = prep->ws;
  const Groups& groups = prep->groups;
  return comm.gpuOperation(x.stream, [&]() -> Status {
    if (a.tokensQ == 0) return {};
    return u > 1 ? runUlyssesBackward(groups, x, g, ws) : ringBackward(groups.ring, x, g, ws);
  });
}

}  // namespace weft::fused::attention
