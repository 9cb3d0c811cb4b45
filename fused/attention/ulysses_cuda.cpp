// runUlysses and runUlyssesBackward: this rank's rows to the head shards of its group's share
// (heads.hpp's exchange), the ring across the groups on the share (this rank alone where the
// group is every rank), and the results back; and the groups' communicators.
#include <string>

#include "fused/attention/backward.hpp"
#include "fused/attention/heads.hpp"
#include "fused/attention/ulysses.hpp"

namespace weft::fused::attention {
namespace {

// The communicators of groups of u, split from the call's: u consecutive ranks, and the ranks
// of one place in every group.
struct GroupComms {
  std::unique_ptr<Communicator> group, ring;
};

HeadExchange exchangeOf(const LocalAttention& a, const GroupShare& s) {
  HeadExchange e;
  e.rowBytes = static_cast<std::size_t>(a.dim) * sizeOf(a.type);
  e.sequences = a.sequences, e.cu = a.cuSeqlensQ, e.tokens = a.tokensQ;
  e.valueHeads = s.call.local.heads;
  return e;
}

}  // namespace

Result<Groups> groupsOf(Communicator& comm, int u) {
  const int n = comm.size(), me = comm.rank();
  if (u == n) return Groups{&comm, {}};
  if (u < 1 || n % u != 0)
    return invalidArgument("context-parallel attention: groups of " + std::to_string(u) +
                           " do not divide " + std::to_string(n) + " ranks");
  std::shared_ptr<void>& slot = comm.fusedState("attention-groups-" + std::to_string(u));
  if (!slot) {
    // On the call's channels: ranks sharing a GPU each run one of the three's kernels at a
    // time, which then all fit on the device together as the call's own do (a group of fewer
    // ranks would otherwise take more channels a rank, and its spinning kernels the SMs a
    // peer's need).
    Config config = comm.config();
    if (config.gpuChannels == 0) config.gpuChannels = comm.gpuChannels();
    auto made = std::make_shared<GroupComms>();
    auto group = comm.split(me / u, me % u, &config);
    if (!group) return group.status();
    auto ring = comm.split(me % u, me / u, &config);
    if (!ring) return ring.status();
    made->group = std::move(*group), made->ring = std::move(*ring);
    // Their GPU transports now (collective in each, groups first on every rank), before any
    // call enqueues a transfer that waits for a peer.
    for (Communicator* c : {made->group.get(), made->ring.get()}) {
      if (auto w = c->workspace(256, true); !w) return w.status();
    }
    comm.adopt(made->group.get());  // their errors the call's communicator's
    comm.adopt(made->ring.get());
    slot = made;
    // Every rank's set up before any enqueues a transfer that waits for a peer.
    if (Status s = comm.barrier(); !s) return s;
  }
  auto* made = static_cast<GroupComms*>(slot.get());
  return Groups{made->group.get(), {made->ring.get(), n / u, me / u}};
}

Status runUlysses(const Groups& g, const RingCall& x, algo::AttentionKernel kernel, std::byte* ws) {
  const LocalAttention& a = x.local;
  const int u = g.group->size();
  const UlyssesWorkspace w = *ulyssesWorkspace(a, false);  // checked by the call
  const GroupShare s = groupShare(x, u, ws, false);
  const LocalAttention& share = s.call.local;
  HeadExchange in = exchangeOf(a, s);
  in.rowTensors = 3;
  in.rows[0] = {const_cast<void*>(a.q), const_cast<void*>(share.q), share.heads};
  in.rows[1] = {const_cast<void*>(a.k), const_cast<void*>(share.k), share.kvHeads};
  in.rows[2] = {const_cast<void*>(a.v), const_cast<void*>(share.v), share.kvHeads};
  in.shareCu = const_cast<std::int32_t*>(share.cuSeqlensQ);
  if (Status st = toHeads(*g.group, in, ws + w.sendIn, ws + w.recvIn, x.stream); !st) return st;
  if (Status st = ringForward(g.ring, s.call, kernel, static_cast<std::byte*>(s.call.workspace));
      !st)
    return st;
  HeadExchange out = exchangeOf(a, s);
  out.rowTensors = 1, out.valueTensors = 1;
  out.rows[0] = {a.out, share.out, share.heads};
  out.values[0] = {a.lse, share.lse};
  return fromHeads(*g.group, out, ws + w.sendOut, ws + w.recvOut, x.stream);
}

// Delta (rowsum(dOut ∘ out)) of this rank's rows first, so that it travels with the
// log-sum-exp instead of out.
Status runUlyssesBackward(const Groups& g, const RingCall& x, const RingGrads& grads,
                          std::byte* ws) {
  const LocalAttention& a = x.local;
  const int u = g.group->size();
  const UlyssesWorkspace w = *ulyssesWorkspace(a, true);  // checked by the call
  const GroupShare s = groupShare(x, u, ws, true);
  const LocalAttention& share = s.call.local;
  auto* delta = reinterpret_cast<float*>(ws + w.delta);
  if (Status st =
          computeDelta(a.out, grads.dOut, a.type, a.tokensQ, a.heads, a.dim, delta, x.stream);
      !st)
    return st;
  HeadExchange in = exchangeOf(a, s);
  in.rowTensors = 4, in.valueTensors = 2;
  in.rows[0] = {const_cast<void*>(a.q), const_cast<void*>(share.q), share.heads};
  in.rows[1] = {const_cast<void*>(a.k), const_cast<void*>(share.k), share.kvHeads};
  in.rows[2] = {const_cast<void*>(a.v), const_cast<void*>(share.v), share.kvHeads};
  in.rows[3] = {const_cast<void*>(grads.dOut), const_cast<void*>(s.grads.dOut), share.heads};
  in.values[0] = {a.lse, share.lse};
  in.values[1] = {delta, s.delta};
  in.shareCu = const_cast<std::int32_t*>(share.cuSeqlensQ);
  if (Status st = toHeads(*g.group, in, ws + w.sendIn, ws + w.recvIn, x.stream); !st) return st;
  if (Status st =
          ringBackward(g.ring, s.call, s.grads, static_cast<std::byte*>(s.call.workspace), true);
      !st)
    return st;
  HeadExchange out = exchangeOf(a, s);
  out.rowTensors = 3;
  out.rows[0] = {grads.dq, s.grads.dq, share.heads};
  out.rows[1] = {grads.dk, s.grads.dk, share.kvHeads};
  out.rows[2] = {grads.dv, s.grads.dv, share.kvHeads};
  return fromHeads(*g.group, out, ws + w.sendOut, ws + w.recvOut, x.stream);
}

}  // namespace weft::fused::attention
