#include "src/transport/ucx.hpp"

#include <dlfcn.h>
#include <ucp/api/ucp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <thread>

#include "src/transport/tcp_lanes.hpp"
#include "src/transport/ucx_link.hpp"

namespace weft::transport {
namespace {

// Progresses `worker` while it has work, up to a bound. Over TCP one call moves a bounded part
// of what the sockets hold, so a wait that progressed once per wake-up (naps of up to 200 us
// where ranks share cores) left them idle in between (docs/perf-hosts.md).
void progressAll(ucp_worker_h worker) {
  for (int i = 0; i < 256 && ucp_worker_progress(worker) != 0; ++i) {
  }
}

// Drives `request` (a status pointer from an nbx call) to completion, progressing `worker`, for
// at most `limit`; returns its status (UCS_ERR_TIMED_OUT when it did not finish) and frees it.
ucs_status_t finish(ucp_worker_h worker, ucs_status_ptr_t request,
                    std::chrono::milliseconds limit) {
  if (request == nullptr) return UCS_OK;
  if (UCS_PTR_IS_ERR(request)) return UCS_PTR_STATUS(request);
  const auto end = std::chrono::steady_clock::now() + limit;
  ucs_status_t s;
  while ((s = ucp_request_check_status(request)) == UCS_INPROGRESS &&
         std::chrono::steady_clock::now() < end)
    ucp_worker_progress(worker);
  ucp_request_free(request);
  return s == UCS_INPROGRESS ? UCS_ERR_TIMED_OUT : s;
}

// The tag of the control worker's one message.
constexpr ucp_tag_t kAbortTag = 0xab0'0000'0000'0000ull;

// How long destruction waits for UCX to release an endpoint.
constexpr std::chrono::milliseconds kCloseLimit{10'000};

}  // namespace

struct UcxTransport::Channel {
  ucp_worker_h worker = nullptr;
  std::vector<ucp_ep_h> eps;  // by peer
  std::vector<std::unique_ptr<Link>> to, from;
  struct ErrorArg {
    std::atomic<int>* failed;
  };
  std::vector<ErrorArg> errorArgs;  // by peer; stable addresses for the error callback
  std::vector<TcpLane*> lanes;      // this channel's lanes (UcxTransport::lanes_ owns them)
};

void progressChannel(UcxTransport::Channel* ch) {
  progressAll(ch->worker);
  for (TcpLane* l : ch->lanes) l->pump();
}

bool ucxAvailable() {
  return true;
}

namespace {

// libucs installs handlers for SIGSEGV, SIGBUS, SIGILL and SIGFPE as it loads (UCX_ERROR_SIGNALS),
// printing "Caught signal" backtraces for crashes of whatever process weft lives in, PyTorch's
// included. Unless the user asked for them, weft puts the previous handlers back as it loads
// (after libucs, which it depends on). Looked up, not called: not every UCX exports it.
[[maybe_unused]] const bool kQuietUcs = [] {
  if (std::getenv("UCX_ERROR_SIGNALS") != nullptr) return false;
  using Disable = void (*)();
  auto disable = reinterpret_cast<Disable>(dlsym(RTLD_DEFAULT, "ucs_debug_disable_signals"));
  if (disable != nullptr) disable();
  return disable != nullptr;
}();

// Whether this host has an RDMA device (InfiniBand or RoCE), whose zero-copy rendezvous UCX
// should keep.
bool rdmaDevicePresent() {
  std::error_code ec;
  std::filesystem::directory_iterator it("/sys/class/infiniband", ec);
  return !ec && it != std::filesystem::directory_iterator();
}

}  // namespace

Result<std::unique_ptr<UcxTransport>> UcxTransport::create(const UcxGeometry& g) {
  std::unique_ptr<UcxTransport> t(new UcxTransport());
  t->g_ = g;
  t->failed_ = std::make_unique<std::atomic<int>[]>(static_cast<std::size_t>(g.nranks));
  for (int q = 0; q < g.nranks; ++q) t->failed_[static_cast<std::size_t>(q)].store(0);

  ucp_config_t* config = nullptr;
  if (ucs_status_t s = ucp_config_read(nullptr, nullptr, &config); s != UCS_OK)
    return ucxError("reading the configuration (UCX_* variables)", s);
  // UCX's memory-type cache patches mmap and friends in the whole process (libucm's hooks) to
  // learn of GPU memory; weft hands UCX host memory only. Off unless the user set it.
  if (std::getenv("UCX_MEMTYPE_CACHE") == nullptr)
    (void)ucp_config_modify(config, "MEMTYPE_CACHE", "n");
  if (!g.netDevice.empty() && std::getenv("UCX_NET_DEVICES") == nullptr) {
    if (ucs_status_t m = ucp_config_modify(config, "NET_DEVICES", g.netDevice.c_str());
        m != UCS_OK) {
      ucp_config_release(config);
      return ucxError("setting NET_DEVICES=" + g.netDevice + " (from WEFT_SOCKET_IFNAME)", m);
    }
  }
  // Without an RDMA device UCX's network transport is TCP, where a rendezvous costs a round trip
  // before each message's data (docs/perf-hosts.md). Weft's receives are posted ahead, so its
  // messages go eagerly there. (Synchronous eager sends, which would keep the slots' bound on
  // unmatched messages, hung UCX 1.13 at times.)
  const bool tcpOnly = !rdmaDevicePresent();
  if (std::getenv("UCX_RNDV_THRESH") == nullptr && tcpOnly) {
    if (ucs_status_t m = ucp_config_modify(config, "RNDV_THRESH", "inf"); m != UCS_OK) {
      ucp_config_release(config);
      return ucxError("setting RNDV_THRESH=inf", m);
    }
    t->eager_ = true;
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_TAG;
  params.mt_workers_shared = 1;  // channels' workers run on their own threads
  ucp_context_h context = nullptr;
  const ucs_status_t s = ucp_init(&params, config, &context);
  ucp_config_release(config);
  if (s != UCS_OK) return ucxError("ucp_init", s);
  t->context_ = context;

  // Channels' workers, then the control worker.
  for (int c = 0; c <= g.channels; ++c) {
    auto ch = std::make_unique<Channel>();
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    // A channel's worker is used by one thread at a time: its channel's (the caller's for
    // channel 0). The control worker by any.
    wp.thread_mode = c < g.channels ? UCS_THREAD_MODE_SERIALIZED : UCS_THREAD_MODE_MULTI;
    if (ucs_status_t ws = ucp_worker_create(context, &wp, &ch->worker); ws != UCS_OK)
      return ucxError("ucp_worker_create", ws);
    ucp_address_t* addr = nullptr;
    std::size_t len = 0;
    if (ucs_status_t as = ucp_worker_get_address(ch->worker, &addr, &len); as != UCS_OK)
      return ucxError("ucp_worker_get_address", as);
    // Record: [u32 length][address] per channel.
    const auto n32 = static_cast<std::uint32_t>(len);
    const std::size_t at = t->address_.size();
    t->address_.resize(at + sizeof n32 + len);
    std::memcpy(t->address_.data() + at, &n32, sizeof n32);
    std::memcpy(t->address_.data() + at + sizeof n32, addr, len);
    ucp_worker_release_address(ch->worker, addr);
    t->channels_.push_back(std::move(ch));
  }
  // Then the lanes' record, empty without them.
  if (g.tcpLanes > 0 && tcpOnly && g.laneAddress.valid()) {
    auto lanes = TcpLanes::create(
        {g.nranks, g.rank, g.channels, g.laneAddress, g.tcpLanes, g.connectSeconds});
    if (!lanes) return lanes.status();
    t->lanes_ = std::move(*lanes);
  }
  const std::vector<std::byte> none;
  const std::vector<std::byte>& lane = t->lanes_ ? t->lanes_->record() : none;
  const auto n32 = static_cast<std::uint32_t>(lane.size());
  const std::size_t at = t->address_.size();
  t->address_.resize(at + sizeof n32 + lane.size());
  std::memcpy(t->address_.data() + at, &n32, sizeof n32);
  std::copy(lane.begin(), lane.end(), t->address_.begin() + static_cast<std::ptrdiff_t>(at + 4));
  return t;
}

namespace {

// Entry k of a rank's record ([u32 length][bytes] per channel's worker, the control worker's,
// then the lanes'): where its bytes start and how many; false where the record is short.
bool recordEntry(const std::vector<std::byte>& r, int k, std::size_t& at, std::uint32_t& len) {
  at = 0;
  for (int i = 0;; ++i) {
    if (at + sizeof len > r.size()) return false;
    std::memcpy(&len, r.data() + at, sizeof len);
    if (i == k) break;
    at += sizeof len + len;
  }
  at += sizeof len;
  return at + len <= r.size();
}

}  // namespace

Status UcxTransport::connect(const std::vector<std::vector<std::byte>>& records,
                             const std::vector<bool>& use, const std::vector<bool>& sameHost) {
  const auto n = static_cast<std::size_t>(g_.nranks);
  for (int c = 0; c <= g_.channels; ++c) {
    Channel& ch = *channels_[static_cast<std::size_t>(c)];
    ch.eps.assign(n, nullptr);
    ch.to.resize(n);
    ch.from.resize(n);
    ch.errorArgs.resize(n);
    for (std::size_t q = 0; q < n; ++q) {
      if (!use[q] || static_cast<int>(q) == g_.rank) continue;
      // Find channel c's address in q's record.
      const std::vector<std::byte>& r = records[q];
      std::size_t at = 0;
      std::uint32_t len = 0;
      if (!recordEntry(r, c, at, len))
        return {Code::internalError, "ucx: rank " + std::to_string(q) + "'s address is short"};
      ch.errorArgs[q].failed = &failed_[q];
      ucp_ep_params_t ep{};
      ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
      ep.address = reinterpret_cast<const ucp_address_t*>(r.data() + at);
      // Peer-failure handling for ranks on other hosts. On this host the communicator watches
      // the peer's process instead, and UCX's shared-memory transports cannot handle it.
      ep.err_mode = sameHost[q] ? UCP_ERR_HANDLING_MODE_NONE : UCP_ERR_HANDLING_MODE_PEER;
      ep.err_handler.cb = [](void* arg, ucp_ep_h, ucs_status_t status) {
        auto* e = static_cast<Channel::ErrorArg*>(arg);
        int healthy = 0;
        e->failed->compare_exchange_strong(healthy, static_cast<int>(status));
      };
      ep.err_handler.arg = &ch.errorArgs[q];
      if (ucs_status_t s = ucp_ep_create(ch.worker, &ep, &ch.eps[q]); s != UCS_OK)
        return ucxError("connecting to rank " + std::to_string(q), s);
      if (c == g_.channels) continue;  // the control worker has no links
      ch.to[q] = std::make_unique<Link>(this, &ch, ch.worker, ch.eps[q], true, g_.rank,
                                        static_cast<int>(q), g_, &failed_[q]);
      ch.from[q] = std::make_unique<Link>(this, &ch, ch.worker, ch.eps[q], false, g_.rank,
                                          static_cast<int>(q), g_, &failed_[q]);
      if (Status s = ch.from[q]->start(); !s) return s;
    }
  }
  if (lanes_) {
    // Lanes between the ranks whose records both offer them (on other hosts, or on this one too
    // with WEFT_TCP_LANES=2).
    std::vector<std::vector<std::byte>> laneRecords(n);
    std::vector<bool> laneUse(n, false);
    for (std::size_t q = 0; q < n; ++q) {
      if (!use[q] || static_cast<int>(q) == g_.rank) continue;
      std::size_t at = 0;
      std::uint32_t len = 0;
      if (!recordEntry(records[q], g_.channels + 1, at, len)) continue;
      laneRecords[q].assign(records[q].begin() + static_cast<std::ptrdiff_t>(at),
                            records[q].begin() + static_cast<std::ptrdiff_t>(at + len));
      laneUse[q] = TcpLanes::between(lanes_->record(), laneRecords[q], sameHost[q]);
    }
    if (Status s = lanes_->connect(laneRecords, laneUse); !s) return s;
    for (std::size_t q = 0; q < n; ++q) {
      if (!laneUse[q]) continue;
      ++lanePeers_;
      for (int c = 0; c < g_.channels; ++c) {
        Channel& ch = *channels_[static_cast<std::size_t>(c)];
        TcpLane* l = lanes_->lane(c, static_cast<int>(q));
        ch.to[q]->setLane(l);
        ch.from[q]->setLane(l);
        ch.lanes.push_back(l);
      }
    }
  }
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  ucs_status_ptr_t r = ucp_tag_recv_nbx(channels_.back()->worker, abortBuffer_,
                                        sizeof abortBuffer_ - 1, kAbortTag, ~ucp_tag_t{0}, &p);
  if (UCS_PTR_IS_ERR(r)) return ucxError("posting the abort receive", UCS_PTR_STATUS(r));
  abortReceive_ = r;
  return {};
}

void UcxTransport::notifyAbort(const std::string& why) {
  if (notified_.exchange(true) || channels_.empty()) return;
  Channel& ctl = *channels_.back();
  std::string message = "rank " + std::to_string(g_.rank) + ": " + why;
  message.resize(std::min(message.size(), sizeof abortBuffer_ - 1));
  std::vector<void*> sends;
  for (ucp_ep_h ep : ctl.eps) {
    if (ep == nullptr) continue;
    ucp_request_param_t p{};
    ucs_status_ptr_t r = ucp_tag_send_nbx(ep, message.data(), message.size(), kAbortTag, &p);
    if (r != nullptr && !UCS_PTR_IS_ERR(r)) sends.push_back(r);
  }
  // Bounded: a dead peer never takes its copy.
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  for (void* r : sends) {
    while (ucp_request_check_status(r) == UCS_INPROGRESS && std::chrono::steady_clock::now() < end)
      ucp_worker_progress(ctl.worker);
    drop(ctl.worker, r, false);
  }
}

std::string UcxTransport::pollAbort() {
  std::unique_lock<std::mutex> lock(controlMutex_, std::try_to_lock);
  if (!lock.owns_lock() || channels_.empty()) return {};
  if (!abortMessage_.empty() || abortReceive_ == nullptr) return abortMessage_;
  ucp_worker_progress(channels_.back()->worker);
  ucp_tag_recv_info_t info{};
  const ucs_status_t s = ucp_tag_recv_request_test(abortReceive_, &info);
  if (s == UCS_INPROGRESS) return {};
  ucp_request_free(abortReceive_);
  abortReceive_ = nullptr;
  if (s != UCS_OK) return {};
  abortMessage_.assign(abortBuffer_, std::min(info.length, sizeof abortBuffer_ - 1));
  return abortMessage_;
}

std::string UcxTransport::awaitAbort(std::chrono::milliseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  std::string why;
  while ((why = pollAbort()).empty() && std::chrono::steady_clock::now() < end)
    std::this_thread::yield();
  return why;
}

void UcxTransport::progress(int channel) {
  progressChannel(channels_[static_cast<std::size_t>(channel)].get());
}

Connection* UcxTransport::to(int channel, int peer) const {
  return channels_[static_cast<std::size_t>(channel)]->to[static_cast<std::size_t>(peer)].get();
}

Connection* UcxTransport::from(int channel, int peer) const {
  return channels_[static_cast<std::size_t>(channel)]->from[static_cast<std::size_t>(peer)].get();
}

Status UcxTransport::flush(int channel, const Waiter& w) {
  Channel& ch = *channels_[static_cast<std::size_t>(channel)];
  // A worker flush covers what the transports were handed, not a rendezvous send still waiting
  // for its receiver: those are waited for first, link by link.
  for (std::size_t q = 0; q < ch.to.size(); ++q) {
    Link* l = ch.to[q].get();
    if (l == nullptr) continue;
    Status s = w.wait(
        [&] {
          ucp_worker_progress(ch.worker);
          return l->sent();
        },
        "finishing sends to", static_cast<int>(q));
    if (!s) return s;
    if (l->broken()) return l->failureOf("sending to");
  }
  ucp_request_param_t p{};
  ucs_status_ptr_t r = ucp_worker_flush_nbx(ch.worker, &p);
  if (r == nullptr) return {};
  if (UCS_PTR_IS_ERR(r))
    return ucxError("flushing channel " + std::to_string(channel), UCS_PTR_STATUS(r));
  ucs_status_t s = UCS_INPROGRESS;
  Status waited = w.wait(
      [&] {
        ucp_worker_progress(ch.worker);
        return (s = ucp_request_check_status(r)) != UCS_INPROGRESS;
      },
      "flushing sends to", w.rank());
  drop(ch.worker, r, false);
  if (!waited) return waited;
  if (s != UCS_OK)
    return {Code::remoteError,
            "ucx: flushing channel " + std::to_string(channel) + ": " + ucs_status_string(s)};
  return {};
}

std::string UcxTransport::peerFailure(int peer) const {
  const int f = failed_[static_cast<std::size_t>(peer)].load(std::memory_order_acquire);
  if (f == 0) return {};
  return std::string("its UCX endpoint failed (") +
         ucs_status_string(static_cast<ucs_status_t>(f)) + ")";
}

UcxTransport::~UcxTransport() {
  if (abortReceive_ != nullptr) {
    drop(channels_.back()->worker, abortReceive_, true);
  }
  for (auto& ch : channels_) {
    if (ch->worker == nullptr) continue;
    // Every call ended with a flush, so nothing this rank sent is still on its way: receives
    // still posted are cancelled and the endpoints closed without asking the peers.
    ch->to.clear();
    ch->from.clear();
    for (ucp_ep_h ep : ch->eps) {
      if (ep == nullptr) continue;
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      p.flags = UCP_EP_CLOSE_FLAG_FORCE;
      (void)finish(ch->worker, ucp_ep_close_nbx(ep, &p), kCloseLimit);
    }
    ucp_worker_destroy(ch->worker);
  }
  channels_.clear();
  if (context_ != nullptr) ucp_cleanup(static_cast<ucp_context_h>(context_));
}

}  // namespace weft::transport
