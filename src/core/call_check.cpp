// Call signatures (WEFT_CHECK_CALLS): every host collective posts what it is (collective, dtype,
// count, op, root) in the caller's inbox before it touches a peer; a rank compares its call with
// each peer's on this host while it waits for them and once more before it returns (before it
// starts, on paths that read peers' buffers in place), so a call the ranks made differently
// fails on every rank with both calls named, instead of returning wrong data, reading past a
// buffer or hanging. Sends and receives (and all-to-all-v's) post their sizes too: a receive
// compares with its send before anything moves, a send with its receive if that was posted by
// the time it finishes (a send never waits for its receiver). Calls on GPU memory post theirs
// before their launch and compare with the peers that posted already (the later of two ranks
// sees the earlier's). Ranks reached through UCX compare a 32-bit signature of the call in
// every message's tag (UcxTransport::sign), failing on the receiver.
#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "src/core/communicator.hpp"
#include "src/device/schedule_kernel.hpp"
#include "src/transport/shm.hpp"

namespace weft {
namespace {

bool reduces(Collective c) {
  return c == Collective::allReduce || c == Collective::reduceScatter || c == Collective::reduce;
}
bool rooted(Collective c) {
  return c == Collective::broadcast || c == Collective::reduce;
}

}  // namespace

std::string Communicator::CallSignature::toString() const {
  std::string out =
      std::string(name(coll)) + "(" + std::string(name(type)) + ", " + std::to_string(count);
  if (reduces(coll)) out += ", " + std::string(name(op));
  if (rooted(coll)) out += ", root " + std::to_string(root);
  return out + ")";
}

bool Communicator::CallSignature::operator==(const CallSignature& o) const {
  return coll == o.coll && type == o.type && count == o.count && gpu == o.gpu &&
         (!reduces(coll) || op == o.op) && (!rooted(coll) || root == o.root);
}

std::uint32_t Communicator::CallSignature::signature() const {
  const std::uint64_t what = static_cast<std::uint64_t>(coll) |
                             static_cast<std::uint64_t>(type) << 8 |
                             static_cast<std::uint64_t>(reduces(coll) ? op : RedOp::sum) << 16 |
                             static_cast<std::uint64_t>(rooted(coll) ? root : 0) << 24;
  return device::signatureOf(device::signatureOf(what) ^ count * 0x9e3779b97f4a7c15ULL);
}

void Communicator::publishCall(const CallSignature& call) {
  current_ = call;
  const std::uint64_t seq = ++postedCalls_;
  transport::PostedCall& p =
      transport::controlOf(inbox_.data())->calls[seq % transport::kPostedCalls];
  // A seqlock: readers that see the same number before and after their reads read one call.
  // (The exchange's acquire keeps the field stores after it; no fences: TSan cannot see them.)
  (void)p.seq.exchange(0, std::memory_order_acq_rel);
  // Release: a reader that loads a new field then sees the 0 above in its second look at seq.
  p.coll.store(static_cast<std::uint32_t>(call.coll), std::memory_order_release);
  p.type.store(static_cast<std::uint32_t>(call.type), std::memory_order_release);
  p.op.store(static_cast<std::uint32_t>(call.op), std::memory_order_release);
  p.root.store(call.root, std::memory_order_release);
  p.gpu.store(call.gpu ? 1 : 0, std::memory_order_release);
  p.count.store(call.count, std::memory_order_release);
  // Sequentially consistent, as postedBy's first load: of two ranks that each publish, then
  // look at the other's entry, at least one sees the other's call (checkGpuCall relies on it).
  p.seq.store(seq, std::memory_order_seq_cst);
}

void Communicator::postCall(Collective coll, std::size_t count, DataType type, RedOp op, int root) {
  publishCall({coll, type, op, root, count, false});
  // Ranks through UCX compare it in every message's tag (UcxTransport::sign).
  if (ucx_) ucx_->sign(current_.signature());
  inCall_.store(true, std::memory_order_release);
}

Status Communicator::checkGpuCall(Collective coll, std::size_t count, DataType type, RedOp op,
                                  int root) {
  publishCall({coll, type, op, root, count, true});
  for (int q = 0; q < size_; ++q) {
    if (!comparesWith(q)) continue;
    const Posted p = postedBy(q);
    if (p.state == Posted::here && !(p.call == current_)) return mismatch(q, p.call);
  }
  return {};
}

std::uint64_t Communicator::readPosted(const transport::PostedCall& p, CallSignature& call) {
  const std::uint64_t before = p.seq.load(std::memory_order_seq_cst);
  // Acquire loads: the second look at seq below cannot move above them.
  call.coll = static_cast<Collective>(p.coll.load(std::memory_order_acquire));
  call.type = static_cast<DataType>(p.type.load(std::memory_order_acquire));
  call.op = static_cast<RedOp>(p.op.load(std::memory_order_acquire));
  call.root = p.root.load(std::memory_order_acquire);
  call.gpu = p.gpu.load(std::memory_order_acquire) != 0;
  call.count = static_cast<std::size_t>(p.count.load(std::memory_order_acquire));
  return p.seq.load(std::memory_order_relaxed) == before ? before : 0;
}

Communicator::Posted Communicator::postedBy(int q) const {
  const auto Q = static_cast<std::size_t>(q);
  const std::uint64_t seq = postedCalls_;
  const transport::PostedCall& p =
      transport::controlOf(peerInboxes_[Q].data())->calls[seq % transport::kPostedCalls];
  Posted out;
  const std::uint64_t before = p.seq.load(std::memory_order_seq_cst);
  if (before < seq) return out;  // not yet (or its entry is being rewritten)
  if (before > seq) {
    out.state = Posted::ahead;  // it made this call and many more: nothing left to compare
    return out;
  }
  out.state = readPosted(p, out.call) == seq ? Posted::here : Posted::ahead;
  return out;
}

std::string Communicator::callSigned(int q, std::uint64_t signature, bool ll) const {
  std::byte* inbox = q == rank_ ? inbox_.data() : peerInboxes_[static_cast<std::size_t>(q)].data();
  if (inbox == nullptr) return "";
  std::optional<CallSignature> found;
  for (const transport::PostedCall& p : transport::controlOf(inbox)->calls) {
    CallSignature c;
    if (readPosted(p, c) == 0 || !c.gpu) continue;
    const std::uint32_t s = c.signature();
    if (ll ? (device::llFlag(0, s) & 0xffu) != signature : s != signature) continue;
    if (found && !(*found == c)) return "";  // two calls: cannot tell which
    found = c;
  }
  return found ? found->toString() : "";
}

Status Communicator::mismatch(int q, const CallSignature& theirs) {
  auto memory = [&](const CallSignature& c) -> std::string {
    if (c.gpu == current_.gpu && c.gpu == theirs.gpu) return "";
    return c.gpu ? " on GPU memory" : " on host memory";
  };
  const std::string why = "rank " + std::to_string(rank_) + " called " + current_.toString() +
                          memory(current_) + " but rank " + std::to_string(q) + " called " +
                          theirs.toString() + memory(theirs) + " as call " +
                          std::to_string(postedCalls_) +
                          " (every rank must make the same collective calls in the same order; "
                          "WEFT_CHECK_CALLS)";
  // Every rank's waits end with it: the first to see a mismatch tells them all.
  if (!mismatchRaised_.exchange(true)) abort(why);
  return {Code::invalidUsage, why};
}

void Communicator::watchCall() {
  if (!inCall_.load(std::memory_order_acquire)) return;
  for (int q = 0; q < size_; ++q) {
    if (!comparesWith(q)) continue;
    const Posted p = postedBy(q);
    if (p.state == Posted::here && !(p.call == current_)) {
      (void)mismatch(q, p.call);
      return;
    }
  }
}

Status Communicator::verifyCall() {
  inCall_.store(false, std::memory_order_release);
  for (int q = 0; q < size_; ++q) {
    if (!comparesWith(q)) continue;
    Posted p = postedBy(q);
    if (p.state == Posted::notYet) {
      // A peer this call did not wait for (a broadcast's root, say): until it makes its call.
      Status s = waiter_->wait(
          [&] {
            p = postedBy(q);
            return p.state != Posted::notYet;
          },
          "waiting for the rank to make its call (WEFT_CHECK_CALLS)", q);
      if (!s) return fail(s);
    }
    if (p.state == Posted::here && !(p.call == current_)) return mismatch(q, p.call);
  }
  return {};
}

bool Communicator::comparesWith(int q) const {
  const auto Q = static_cast<std::size_t>(q);
  return config_.checkCalls && q != rank_ && sameHost_[Q] && !viaUcx_[Q] &&
         peerInboxes_[Q].data() != nullptr;
}

namespace {

// A seqlock entry: `bytes` under number `seq` (see publishCall; sequentially consistent too).
void post(transport::PostedOp& p, std::uint64_t seq, std::uint64_t bytes) {
  (void)p.seq.exchange(0, std::memory_order_acq_rel);
  p.bytes.store(bytes, std::memory_order_release);
  p.seq.store(seq, std::memory_order_seq_cst);
}

// The bytes of entry `seq`: nullopt while not posted; UINT64_MAX when it has moved on.
std::optional<std::uint64_t> posted(const transport::PostedOp& p, std::uint64_t seq) {
  const std::uint64_t before = p.seq.load(std::memory_order_seq_cst);
  if (before < seq) return std::nullopt;
  if (before > seq) return UINT64_MAX;
  const std::uint64_t bytes = p.bytes.load(std::memory_order_acquire);
  return p.seq.load(std::memory_order_relaxed) == before ? bytes : UINT64_MAX;
}

}  // namespace

Status Communicator::checkOps(const std::vector<P2pOp>& ops, OpsCheck when) {
  const bool before = when == OpsCheck::before;
  struct Numbered {
    const P2pOp* op;
    std::uint64_t seq;
  };
  // The numbers were given when posting (before); the end looks at the same operations again.
  thread_local std::vector<Numbered> numbered;
  if (when != OpsCheck::after) {
    numbered.clear();
    for (const P2pOp& op : ops) {
      if (op.bytes == 0 || !comparesWith(op.peer)) continue;
      const auto Q = static_cast<std::size_t>(op.peer);
      const std::uint64_t seq = op.isSend ? ++sendsTo_[Q] : ++recvsFrom_[Q];
      transport::PostedOps* mine = transport::postedOpsOf(peerInboxes_[Q].data(), geometry_, rank_);
      post((op.isSend ? mine->sends : mine->recvs)[seq % transport::kPostedOps], seq, op.bytes);
      numbered.push_back({&op, seq});
    }
  }
  for (const Numbered& n : numbered) {
    // Receives before a host batch, sends at its end; every operation of a GPU batch.
    if (when != OpsCheck::gpu && n.op->isSend == before) continue;
    const int q = n.op->peer;
    transport::PostedOps* theirs = transport::postedOpsOf(inbox_.data(), geometry_, q);
    const transport::PostedOp& p =
        (n.op->isSend ? theirs->recvs : theirs->sends)[n.seq % transport::kPostedOps];
    std::optional<std::uint64_t> bytes = posted(p, n.seq);
    if (!bytes && before) {
      Status s = waiter_->wait([&] { return (bytes = posted(p, n.seq)).has_value(); },
                               "waiting for the rank to post its send (WEFT_CHECK_CALLS)", q);
      if (!s) return fail(s);
    }
    if (!bytes || *bytes == UINT64_MAX || *bytes == n.op->bytes) continue;
    const std::string sender = std::to_string(n.op->isSend ? rank_ : q);
    const std::string receiver = std::to_string(n.op->isSend ? q : rank_);
    const std::uint64_t sent = n.op->isSend ? n.op->bytes : *bytes;
    const std::uint64_t received = n.op->isSend ? *bytes : n.op->bytes;
    const std::string why = "rank " + sender + "'s send #" + std::to_string(n.seq) + " to rank " +
                            receiver + " is " + std::to_string(sent) + " bytes but rank " +
                            receiver + " receives " + std::to_string(received) +
                            " bytes (each send needs a receive of its size, in the same order; "
                            "WEFT_CHECK_CALLS)";
    if (!mismatchRaised_.exchange(true)) abort(why);
    return {Code::invalidUsage, why};
  }
  return {};
}

}  // namespace weft
