// One connection through UCX (src/transport/ucx.hpp) or, where its peer has one, through its TCP
// lane: UcxTransport::Link, and the helpers it shares with the transport. Internal to ucx.cpp.
#pragma once

#include <ucp/api/ucp.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "src/transport/tcp_lanes.hpp"
#include "src/transport/ucx.hpp"

namespace weft::transport {
namespace ucx_detail {

inline Status ucxError(const std::string& what, ucs_status_t s) {
  return {Code::systemError, "ucx: " + what + ": " + ucs_status_string(s)};
}

// Hands a request back to UCX. A receive still posted is cancelled first (UCX cancels tag
// receives only); anything else still in flight finishes or fails inside UCX on its own, since
// ucp_request_free releases a request in any state.
inline void drop(ucp_worker_h worker, void* request, bool isReceive) {
  if (isReceive && ucp_request_check_status(request) == UCS_INPROGRESS) {
    ucp_request_cancel(worker, request);
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
    while (ucp_request_check_status(request) == UCS_INPROGRESS &&
           std::chrono::steady_clock::now() < end)
      ucp_worker_progress(worker);
  }
  ucp_request_free(request);
}

// The tag bits a link's receives match: the sender's rank (the call's signature sits above),
// and above it the bit that marks a direct message.
constexpr ucp_tag_t kRankBits = 0xffff'ffffull;
constexpr ucp_tag_t kDirectBit = 0x8000'0000ull;

}  // namespace ucx_detail

// Progresses a channel's worker while it has work, and writes what its TCP lanes have queued.
void progressChannel(UcxTransport::Channel* ch);

using ucx_detail::drop;
using ucx_detail::kDirectBit;
using ucx_detail::kRankBits;
using ucx_detail::ucxError;

// One direction to or from one peer on one channel.
class UcxTransport::Link final : public Connection {
 public:
  Link(UcxTransport* owner, Channel* channel, ucp_worker_h worker, ucp_ep_h ep, bool sender,
       int self, int peer, const UcxGeometry& g, std::atomic<int>* failed)
      : owner_(owner),
        channel_(channel),
        worker_(worker),
        ep_(ep),
        sender_(sender),
        tag_(static_cast<ucp_tag_t>(sender ? self : peer)),
        self_(self),
        peer_(peer),
        slotBytes_(g.slotBytes),
        buffers_(static_cast<std::size_t>(g.slots) * g.slotBytes),
        requests_(static_cast<std::size_t>(g.slots), nullptr),
        failed_(failed) {}

  ~Link() override {
    for (void*& r : requests_) {
      if (r == nullptr) continue;
      // Sends still in flight are left only after an abort: they end with the endpoint.
      drop(worker_, r, !sender_);
      r = nullptr;
    }
    for (void* r : directs_) drop(worker_, r, false);
  }

  // Receivers post every slot's receive before any peer may send.
  Status start() {
    if (sender_) return {};
    for (std::size_t k = 0; k < requests_.size(); ++k) {
      if (Status s = postReceive(k); !s) return s;
    }
    return {};
  }

  std::size_t slotBytes() const override { return slotBytes_; }

  std::byte* tryAcquire() override {
    const std::size_t k = next_ % requests_.size();
    if (lane_ != nullptr) {
      // Free once the lane has written the message the slot held.
      if (laneSeq_[k] != 0 && lane_->written() < laneSeq_[k]) {
        progressChannel(channel_);
        if (!lane_->error().empty()) laneFailed();
        if (lane_->written() < laneSeq_[k]) return nullptr;
      }
      return buffers_.data() + k * slotBytes_;
    }
    void*& r = requests_[k];
    if (r != nullptr) {
      progressChannel(channel_);
      const ucs_status_t s = ucp_request_check_status(r);
      if (s == UCS_INPROGRESS) return nullptr;
      ucp_request_free(r);
      r = nullptr;
      if (s != UCS_OK) {
        broken_ = s;
        return nullptr;
      }
    }
    return buffers_.data() + k * slotBytes_;
  }

  Result<std::byte*> acquire(const Waiter& w) override {
    std::byte* slot = nullptr;
    if (Status s = w.wait([&] { return (slot = tryAcquire()) != nullptr || broken_ != UCS_OK; },
                          "sending to", peer_);
        !s)
      return s;
    if (broken_ != UCS_OK) return failure("sending to");
    return slot;
  }

  void post(std::size_t bytes) override {
    const std::size_t k = next_ % requests_.size();
    if (lane_ != nullptr) {
      laneSeq_[k] = lane_->post(buffers_.data() + k * slotBytes_, bytes, owner_->signature(),
                                TcpLane::Kind::slot) +
                    1;
      ++next_;
      return;
    }
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_MEMORY_TYPE;
    p.memory_type = UCS_MEMORY_TYPE_HOST;
    const ucp_tag_t tag = tag_ | static_cast<ucp_tag_t>(owner_->signature()) << 32;
    ucs_status_ptr_t r = ucp_tag_send_nbx(ep_, buffers_.data() + k * slotBytes_, bytes, tag, &p);
    if (UCS_PTR_IS_ERR(r)) {
      broken_ = UCS_PTR_STATUS(r);
      r = nullptr;
    }
    requests_[k] = r;  // nullptr: sent (copied out) already
    ++next_;
    seenCall_ = owner_->calls();
  }

  std::optional<std::span<const std::byte>> tryReceive() override {
    const std::size_t k = next_ % requests_.size();
    if (lane_ != nullptr) return tryReceiveFromLane(k);
    void* r = requests_[k];
    if (r == nullptr) return std::nullopt;  // its re-post failed: broken_ says why
    progressChannel(channel_);
    ucp_tag_recv_info_t info{};
    const ucs_status_t s = ucp_tag_recv_request_test(r, &info);
    if (s == UCS_INPROGRESS) return std::nullopt;
    if (s != UCS_OK) {
      broken_ = s;
      return std::nullopt;
    }
    // Another call's message (both checked): kept unreleased, so it is seen again.
    if (const std::uint32_t other = otherCallOf(info); other != 0) {
      otherCall_ = other;
      return std::nullopt;
    }
    seenCall_ = owner_->calls();
    return std::span<const std::byte>(buffers_.data() + k * slotBytes_, info.length);
  }

  Result<std::span<const std::byte>> receive(const Waiter& w) override {
    std::optional<std::span<const std::byte>> m;
    if (Status s = w.wait(
            [&] { return (m = tryReceive()).has_value() || broken_ != UCS_OK || otherCall_ != 0; },
            "receiving from", peer_);
        !s)
      return s;
    if (otherCall_ != 0) return otherCall();
    if (broken_ != UCS_OK) return failure("receiving from");
    return *m;
  }

  bool direct() const override { return true; }

  Status sendDirect(const std::byte* at, std::size_t bytes, const Waiter& w) override {
    if (markerDue()) {
      // Where calls are checked, a call's first message on the link goes through the slots, a
      // marker (the message's length) where it is direct: a peer in another call meets it there,
      // as it would without direct messages. After it both sides are in one call, whose
      // schedule orders the rest alike.
      auto slot = acquire(w);
      if (!slot) return slot.status();
      const std::uint64_t length = bytes;
      std::memcpy(*slot, &length, sizeof length);
      post(sizeof length);
    }
    if (broken_ != UCS_OK) return failure("sending to");
    if (lane_ != nullptr) {
      lane_->post(at, bytes, owner_->signature());
      if (!lane_->error().empty()) return laneFailure("sending to");
      return {};
    }
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_MEMORY_TYPE;
    p.memory_type = UCS_MEMORY_TYPE_HOST;
    const ucp_tag_t tag = tag_ | kDirectBit | static_cast<ucp_tag_t>(owner_->signature()) << 32;
    ucs_status_ptr_t r = ucp_tag_send_nbx(ep_, at, bytes, tag, &p);
    if (UCS_PTR_IS_ERR(r)) {
      broken_ = UCS_PTR_STATUS(r);
      return failure("sending to");
    }
    if (r != nullptr) directs_.push_back(r);
    return {};
  }

  Status receiveDirect(std::byte* at, std::size_t bytes, const Waiter& w) override {
    if (markerDue()) {
      auto marker = receive(w);
      if (!marker) return marker.status();
      std::uint64_t length = 0;
      if (marker->size() == sizeof length) std::memcpy(&length, marker->data(), sizeof length);
      release();
      if (length != bytes) return lengthMismatch(bytes, std::to_string(length));
    }
    if (broken_ != UCS_OK) return failure("receiving from");
    if (lane_ != nullptr) return receiveFromLane(at, bytes, w);
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_MEMORY_TYPE | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    p.memory_type = UCS_MEMORY_TYPE_HOST;
    ucs_status_ptr_t r =
        ucp_tag_recv_nbx(worker_, at, bytes, tag_ | kDirectBit, kRankBits | kDirectBit, &p);
    if (UCS_PTR_IS_ERR(r)) {
      broken_ = UCS_PTR_STATUS(r);
      return failure("receiving from");
    }
    ucp_tag_recv_info_t info{};
    ucs_status_t s = UCS_INPROGRESS;
    Status waited = w.wait(
        [&] {
          progressChannel(channel_);
          return (s = ucp_tag_recv_request_test(r, &info)) != UCS_INPROGRESS;
        },
        "receiving from", peer_);
    // Not left posted on an error: it would land in the caller's buffer after the call.
    drop(worker_, r, true);
    if (!waited) return waited;
    if (const std::uint32_t other = s == UCS_OK ? otherCallOf(info) : 0; other != 0) {
      otherCall_ = other;
      return otherCall();
    }
    if (s == UCS_ERR_MESSAGE_TRUNCATED || (s == UCS_OK && info.length != bytes))
      return lengthMismatch(bytes, s == UCS_OK ? std::to_string(info.length) : "more");
    if (s != UCS_OK) {
      broken_ = s;
      return failure("receiving from");
    }
    return {};
  }

  // Sender: whether every message posted so far has left this rank (a rendezvous send
  // completes only once the receiver has the data).
  bool sent() {
    if (lane_ != nullptr && !lane_->pump()) {
      if (lane_->error().empty()) return false;
      laneFailed();
    }
    for (void*& r : requests_) {
      if (r == nullptr) continue;
      const ucs_status_t s = ucp_request_check_status(r);
      if (s == UCS_INPROGRESS) return false;
      ucp_request_free(r);
      r = nullptr;
      if (s != UCS_OK) broken_ = s;
    }
    while (!directs_.empty()) {
      void* r = directs_.front();
      const ucs_status_t s = ucp_request_check_status(r);
      if (s == UCS_INPROGRESS) return false;
      ucp_request_free(r);
      directs_.pop_front();
      if (s != UCS_OK) broken_ = s;
    }
    return true;
  }
  bool broken() const { return broken_ != UCS_OK; }
  bool drained() override {
    progressChannel(channel_);
    return sent();
  }
  Status failureOf(const char* what) const { return failure(what); }
  // Every message, the slots' and the direct ones, through `lane` (shared with the other
  // direction's link) instead of UCX.
  void setLane(TcpLane* lane) {
    lane_ = lane;
    laneSeq_.assign(requests_.size(), 0);
  }

  void release() override {
    const std::size_t k = next_ % requests_.size();
    if (lane_ != nullptr) {
      held_.reset();
      ++next_;
      return;
    }
    ucp_request_free(requests_[k]);
    requests_[k] = nullptr;
    ++next_;
    if (Status s = postReceive(k); !s) broken_ = UCS_ERR_IO_ERROR;
  }

 private:
  // The next slot message, read from the lane into slot k, where it stays until release().
  std::optional<std::span<const std::byte>> tryReceiveFromLane(std::size_t k) {
    std::byte* slot = buffers_.data() + k * slotBytes_;
    if (held_) return std::span<const std::byte>(slot, *held_);
    progressChannel(channel_);
    const std::uint32_t mine = owner_->signature();
    switch (lane_->read(slot, slotBytes_, mine, TcpLane::Kind::slot)) {
      case TcpLane::Read::more:
        return std::nullopt;
      case TcpLane::Read::done:
        held_ = lane_->lengthSeen();
        return std::span<const std::byte>(slot, *held_);
      case TcpLane::Read::mismatch:
        // Another call's message (both checked), seen again at the next read; a slot's length
        // is the same on every rank, so one longer is a lane out of step.
        if (lane_->lengthSeen() <= slotBytes_) {
          otherCall_ = lane_->signatureSeen();
          return std::nullopt;
        }
        break;
      case TcpLane::Read::failed:
        break;
    }
    laneFailed();
    return std::nullopt;
  }

  Status receiveFromLane(std::byte* at, std::size_t bytes, const Waiter& w) {
    const std::uint32_t mine = owner_->signature();
    TcpLane::Read got = TcpLane::Read::more;
    Status waited = w.wait(
        [&] {
          progressChannel(channel_);
          return (got = lane_->read(at, bytes, mine)) != TcpLane::Read::more;
        },
        "receiving from", peer_);
    if (!waited) return waited;
    if (got == TcpLane::Read::failed) return laneFailure("receiving from");
    if (got == TcpLane::Read::mismatch) {
      const std::uint32_t theirs = lane_->signatureSeen();
      if (theirs != 0 && mine != 0 && theirs != mine) {
        otherCall_ = theirs;
        return otherCall();
      }
      return lengthMismatch(bytes, std::to_string(lane_->lengthSeen()));
    }
    return {};
  }

  // The lane failed (its peer's process or host went, or the connection broke): the peer is
  // failed for every wait on it.
  void laneFailed() {
    broken_ = UCS_ERR_CONNECTION_RESET;
    int healthy = 0;
    failed_->compare_exchange_strong(healthy, static_cast<int>(UCS_ERR_CONNECTION_RESET));
  }
  Status laneFailure(const char* what) {
    laneFailed();
    return failure(what);
  }

  Status postReceive(std::size_t k) {
    ucp_request_param_t p{};
    // Always a request, never an immediate completion: tryReceive() tests it for the length.
    p.op_attr_mask = UCP_OP_ATTR_FIELD_MEMORY_TYPE | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    p.memory_type = UCS_MEMORY_TYPE_HOST;
    ucs_status_ptr_t r = ucp_tag_recv_nbx(worker_, buffers_.data() + k * slotBytes_, slotBytes_,
                                          tag_, kRankBits, &p);
    if (UCS_PTR_IS_ERR(r)) {
      broken_ = UCS_PTR_STATUS(r);
      return ucxError("posting a receive from rank " + std::to_string(peer_), broken_);
    }
    requests_[k] = r;
    return {};
  }

  // Whether a direct message needs a marker: calls are checked and it is the call's first
  // message on this link.
  // (Not on a lane: it carries every message of the link in one stream, each header naming its
  // call.)
  bool markerDue() const {
    return lane_ == nullptr && owner_->signature() != 0 && seenCall_ != owner_->calls();
  }

  // The signature of a received message's call where it differs from this rank's current call's
  // (both checked), else 0.
  std::uint32_t otherCallOf(const ucp_tag_recv_info_t& info) const {
    const auto theirs = static_cast<std::uint32_t>(info.sender_tag >> 32);
    const std::uint32_t mine = owner_->signature();
    return theirs != 0 && mine != 0 && theirs != mine ? theirs : 0;
  }

  Status lengthMismatch(std::size_t expected, const std::string& got) const {
    return {Code::invalidUsage,
            "rank " + std::to_string(self_) + " expected " + std::to_string(expected) +
                " bytes from rank " + std::to_string(peer_) + " but got " + got +
                " (every rank must make the same collective calls, with the same counts)"};
  }

  Status otherCall() const {
    const std::string mine = owner_->callNamer ? owner_->callNamer() : "";
    char seen[80];
    std::snprintf(seen, sizeof seen, "signature %08x against %08x", owner_->signature(),
                  otherCall_);
    return {Code::invalidUsage,
            "rank " + std::to_string(self_) + " called " + (mine.empty() ? "a call" : mine) +
                " but rank " + std::to_string(peer_) + "'s message is of another call (" + seen +
                "; every rank must make the same collective calls in the same order; "
                "WEFT_CHECK_CALLS)"};
  }

  Status failure(const char* what) const {
    // A peer that aborted (over a mismatched call, say) may be gone before this rank reads its
    // notice, and its link break first: the notice, where one comes within a moment, says why.
    if (std::string why = owner_->awaitAbort(std::chrono::milliseconds(200)); !why.empty())
      return {Code::remoteError, "the communicator was aborted (" + why + ")"};
    if (lane_ != nullptr && !lane_->error().empty())
      return {Code::remoteError, std::string("TCP lane: ") + what + " rank " +
                                     std::to_string(peer_) + " failed: " + lane_->error()};
    const int f = failed_->load(std::memory_order_acquire);
    const ucs_status_t s = f != 0 ? static_cast<ucs_status_t>(f) : broken_;
    return {Code::remoteError, std::string("ucx: ") + what + " rank " + std::to_string(peer_) +
                                   " failed: " + ucs_status_string(s)};
  }

  UcxTransport* owner_;
  Channel* channel_;
  ucp_worker_h worker_;
  ucp_ep_h ep_;
  bool sender_;
  ucp_tag_t tag_;
  int self_;
  int peer_;
  std::size_t slotBytes_;
  std::vector<std::byte> buffers_;
  std::vector<void*> requests_;         // by slot: the send in flight, or the posted receive
  std::deque<void*> directs_;           // direct sends in flight, oldest first
  TcpLane* lane_ = nullptr;             // where every message goes instead, if anywhere
  std::vector<std::uint64_t> laneSeq_;  // sender, by slot: its message's number + 1 on the lane
  std::optional<std::size_t> held_;     // receiver: the length of the slot message not released
  std::atomic<int>* failed_;
  std::uint64_t next_ = 0;
  ucs_status_t broken_ = UCS_OK;
  std::uint32_t otherCall_ = 0;  // the signature of another call's message, once one came
  std::uint64_t seenCall_ = ~std::uint64_t{0};  // the last call (calls()) a slot message crossed in
};

}  // namespace weft::transport
