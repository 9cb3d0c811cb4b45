#include "fused/attention/ring.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>

#include "fused/attention/cudnn.hpp"
#include "fused/attention/ulysses.hpp"

namespace weft::fused::attention {
namespace {

constexpr std::size_t kAlign = 256;

std::size_t aligned(std::size_t bytes) {
  return (bytes + kAlign - 1) / kAlign * kAlign;
}

}  // namespace

// local.hpp's, here because local.cu builds only with CUDA and CI checks calls without it.
Status checkLocal(const LocalAttention& a) {
  if (a.type != DataType::bf16 && a.type != DataType::f16)
    return invalidArgument("attention: " + std::string(name(a.type)) +
                           " is not attended (bf16 and f16 are)");
  if (a.dim != 64 && a.dim != 128)
    return invalidArgument("attention: head dim " + std::to_string(a.dim) +
                           " has no kernel (64 and 128 do)");
  if (a.heads < 1 || a.kvHeads < 1 || a.heads % a.kvHeads != 0 || a.heads > 65535)
    return invalidArgument("attention: " + std::to_string(a.heads) +
                           " query heads do not group over " + std::to_string(a.kvHeads) +
                           " K/V heads");
  if (a.sequences < 0 || a.sequences > 65535)
    return invalidArgument("attention: " + std::to_string(a.sequences) + " sequences");
  if (a.sequences > 0 && (a.q == nullptr || a.k == nullptr || a.v == nullptr || a.out == nullptr ||
                          a.lse == nullptr || a.cuSeqlensQ == nullptr || a.cuSeqlensK == nullptr))
    return invalidArgument(
        "attention: q, k, v, out, lse and the sequence offsets must not be NULL");
  // The kernel moves 16-byte pieces of q, k and v, and writes out in pairs.
  for (const void* p : {a.q, a.k, a.v, static_cast<const void*>(a.out)}) {
    if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0)
      return invalidArgument("attention: q, k, v and out must be 16-byte aligned");
  }
  return {};
}

namespace {

// The ring's bytes alone (the same for a group's share: u times the tokens, 1 / u the heads).
Result<RingWorkspace> ringBytes(const LocalAttention& a) {
  const auto dim = static_cast<std::size_t>(a.dim);
  constexpr std::size_t most = std::numeric_limits<std::size_t>::max() / 16;
  if (a.tokensQ > most / (dim * 256))
    return invalidArgument("ring attention: " + std::to_string(a.tokensQ) + " tokens are too many");
  const std::size_t kv = 2 * a.tokensQ * static_cast<std::size_t>(a.kvHeads) * dim * sizeOf(a.type);
  const std::size_t out = a.tokensQ * static_cast<std::size_t>(a.heads) * dim * sizeof(float);
  RingWorkspace w;
  w.block = aligned(kv);
  w.partials = 2 * w.block;
  // cuDNN's kernel (one sequence) writes a step's part, its log-sum-exp, and takes a workspace.
  w.scratch = w.partials + aligned(out);
  if (a.sequences == 1) {
    LocalAttention merging = a;
    merging.merge = true;
    w.scratchBytes = cudnnScratchBytes(merging);
  }
  w.ring = w.total = w.scratch + w.scratchBytes;
  return w;
}

Result<RingBackwardWorkspace> ringBackwardBytes(const LocalAttention& a) {
  auto forward = ringBytes(a);  // checks the token count
  if (!forward) return forward.status();
  const auto dim = static_cast<std::size_t>(a.dim);
  const std::size_t kv = a.tokensQ * static_cast<std::size_t>(a.kvHeads) * dim;
  RingBackwardWorkspace w;
  w.dq = aligned(a.tokensQ * static_cast<std::size_t>(a.heads) * sizeof(float));
  w.blocks = w.dq + aligned(a.tokensQ * static_cast<std::size_t>(a.heads) * dim * sizeof(float));
  w.grads = aligned(2 * kv * sizeOf(a.type));
  w.block = w.grads + aligned(2 * kv * sizeof(float));
  w.ring = w.total = w.blocks + 2 * w.block;
  return w;
}

}  // namespace

Result<UlyssesWorkspace> ulyssesWorkspace(const LocalAttention& a, bool backward) {
  const auto dim = static_cast<std::size_t>(a.dim), es = sizeOf(a.type), T = a.tokensQ;
  const auto h = static_cast<std::size_t>(a.heads), g = static_cast<std::size_t>(a.kvHeads);
  // Rows of a token (q, k, v; backward also dO), and f32 values of each head (backward: lse
  // and delta); each destination's share padded to 16 bytes (u at most the heads).
  const std::size_t rowsIn = backward ? 2 * h + 2 * g : h + 2 * g;
  const std::size_t rowsOut = backward ? h + 2 * g : h;
  const std::size_t in = aligned(T * (rowsIn * dim * es + (backward ? 8 * h : 0)) + 16 * h);
  const std::size_t out = aligned(T * (rowsOut * dim * es + (backward ? 0 : 4 * h)) + 16 * h);
  UlyssesWorkspace w;
  w.recvIn = w.sendIn + in;
  w.sendOut = w.recvIn + in;
  w.recvOut = w.sendOut + out;
  w.share = w.recvOut + out;
  w.out = w.share + aligned(T * rowsIn * dim * es);
  w.lse = w.out + aligned(T * rowsOut * dim * es);
  w.delta = w.lse + aligned(T * h * 4);
  w.cu = w.delta + (backward ? aligned(T * h * 4) : 0);
  w.ring = w.cu + aligned((static_cast<std::size_t>(std::max(a.sequences, 0)) + 1) * 4);
  if (backward) {
    auto r = ringBackwardBytes(a);
    if (!r) return r.status();
    w.total = w.ring + r->ring;
  } else {
    auto r = ringBytes(a);
    if (!r) return r.status();
    w.total = w.ring + r->ring;
  }
  return w;
}

GroupShare groupShare(const RingCall& x, int u, std::byte* ws, bool backward) {
  const LocalAttention& a = x.local;
  const auto U = static_cast<std::size_t>(u), T = a.tokensQ;
  const std::size_t row = static_cast<std::size_t>(a.dim) * sizeOf(a.type);
  const std::size_t q = T * static_cast<std::size_t>(a.heads) * row;
  const std::size_t kv = T * static_cast<std::size_t>(a.kvHeads) * row;
  const UlyssesWorkspace w = *ulyssesWorkspace(a, backward);  // checked by the call
  GroupShare s;
  s.call = x;
  LocalAttention& all = s.call.local;
  all.q = ws + w.share, all.k = ws + w.share + q, all.v = ws + w.share + q + kv;
  all.cuSeqlensQ = all.cuSeqlensK = reinterpret_cast<const std::int32_t*>(ws + w.cu);
  all.tokensQ = U * T, all.maxSeqlenQ = U * a.maxSeqlenQ;
  all.heads = a.heads / u, all.kvHeads = a.kvHeads / u;
  all.out = ws + w.out, all.lse = reinterpret_cast<float*>(ws + w.lse);
  all.merge = false;
  s.call.workspace = ws + w.ring, s.call.workspaceBytes = w.total - w.ring;
  if (backward) {
    all.out = nullptr;  // delta comes with the log-sum-exp
    s.grads.dOut = ws + w.share + q + 2 * kv;
    s.grads.dq = ws + w.out, s.grads.dk = ws + w.out + q, s.grads.dv = ws + w.out + q + kv;
    s.delta = reinterpret_cast<float*>(ws + w.ring);  // the ring's workspace starts with it
  }
  return s;
}

Result<RingWorkspace> ringWorkspace(const LocalAttention& a) {
  auto w = ringBytes(a);
  if (!w) return w;
  // Either way the selector may pick: room for Ulysses's buffers too.
  auto u = ulyssesWorkspace(a, false);
  if (!u) return u.status();
  w->total = std::max(w->ring, u->total);
  return w;
}

namespace {

// A caller's workspace: none (and 0 bytes), or at least `needs` bytes, as `sizeCall` says.
Status checkWorkspace(const RingCall& x, std::size_t needs, const std::string& who,
                      const char* sizeCall) {
  if (x.workspace == nullptr && x.workspaceBytes != 0)
    return invalidArgument(who + ": workspace is NULL but workspaceBytes is " +
                           std::to_string(x.workspaceBytes));
  if (x.workspace != nullptr && x.workspaceBytes < needs)
    return invalidArgument(who + ": a workspace of " + std::to_string(x.workspaceBytes) +
                           " bytes is too small: this call needs " + std::to_string(needs) + " (" +
                           sizeCall + ")");
  return {};
}

}  // namespace

Status checkRing(const RingCall& x) {
  if (Status s = checkLocal(x.local); !s) return s;
  if (x.local.cuSeqlensK != x.local.cuSeqlensQ)
    return invalidArgument("ring attention: queries and keys share the sequences' offsets");
  auto w = ringWorkspace(x.local);
  if (!w) return w.status();
  return checkWorkspace(x, w->total, "ring attention", "weftRingAttentionWorkspaceSize");
}

Result<RingBackwardWorkspace> ringBackwardWorkspace(const LocalAttention& a) {
  auto w = ringBackwardBytes(a);
  if (!w) return w;
  auto u = ulyssesWorkspace(a, true);
  if (!u) return u.status();
  w->total = std::max(w->ring, u->total);
  return w;
}

Status checkRingBackward(const RingCall& x, const RingGrads& g) {
  RingCall forward = x;
  forward.workspace = nullptr, forward.workspaceBytes = 0;  // checked below, for this pass
  if (Status s = checkRing(forward); !s) return s;
  if (x.local.sequences > 0 &&
      (g.dOut == nullptr || g.dq == nullptr || g.dk == nullptr || g.dv == nullptr))
    return invalidArgument("ring attention backward: dOut, dq, dk and dv must not be NULL");
  for (const void* p : {g.dOut, static_cast<const void*>(g.dq), static_cast<const void*>(g.dk),
                        static_cast<const void*>(g.dv)}) {
    if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0)
      return invalidArgument(
          "ring attention backward: dOut, dq, dk and dv must be 16-byte aligned");
  }
  auto w = ringBackwardWorkspace(x.local);
  if (!w) return w.status();
  return checkWorkspace(x, w->total, "ring attention backward",
                        "weftRingAttentionBackwardWorkspaceSize");
}

}  // namespace weft::fused::attention
