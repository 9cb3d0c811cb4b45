// UCX transport: UCP tag messages between ranks on different hosts (or on one host, with
// WEFT_TRANSPORT=ucx, so CI runs it over shared memory and TCP loopback).
//
// Each rank has one UCP worker per channel; channel c of rank p talks to channel c of rank q
// through one endpoint, so a channel's thread is the only one that touches its worker. A
// connection keeps the shared-memory FIFO's contract with local slots:
//  - sender: slot k's buffer is free once its tag send has completed; post() sends it with the
//    sender's rank as the tag's low 32 bits (the call's signature above them, see sign());
//  - receiver: `slots` receives stay posted for those bits; UCP matches a sender's messages to
//    the receives in posting order, so slot k holds message k, and release() re-posts its
//    receive.
// Direct messages (Connection::sendDirect/receiveDirect) go from the sender's buffer into the
// receiver's through no slot, tagged apart from the slots' (a bit above the rank); where calls are
// checked, one that opens a call on its link follows a marker in the slots. Every wait progresses
// the worker. An endpoint's error (the peer died, its host went away) marks the peer failed, which
// the Waiter reports as a remote error.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "src/bootstrap/socket.hpp"
#include "src/transport/connection.hpp"

namespace weft::transport {

struct UcxGeometry {
  int nranks = 1;
  int rank = 0;
  int channels = 1;
  int slots = 4;
  std::size_t slotBytes = 128 * 1024;
  // The interface WEFT_SOCKET_IFNAME chose ("eth1"): UCX's network transports use it alone,
  // unless UCX_NET_DEVICES says otherwise. Empty: UCX picks.
  std::string netDevice;
  // WEFT_TCP_LANES (src/transport/tcp_lanes.hpp): where UCX runs over TCP, the messages go
  // through weft's own sockets, listening on `laneAddress`, to ranks on other hosts (1) or to
  // every rank (2), and UCX carries only the aborts and watches the peers; 0 or no address:
  // every message through UCX.
  int tcpLanes = 0;
  boot::SocketAddress laneAddress;
  double connectSeconds = 300;  // the lanes' connections at init
};

class TcpLanes;

class UcxTransport {
 public:
  // Reads UCX's configuration (UCX_TLS, UCX_NET_DEVICES, ...) and opens a worker per channel.
  static Result<std::unique_ptr<UcxTransport>> create(const UcxGeometry& g);
  ~UcxTransport();
  UcxTransport(const UcxTransport&) = delete;
  UcxTransport& operator=(const UcxTransport&) = delete;

  // Whether messages go eagerly, whatever their size (UCX_RNDV_THRESH=inf): where the user
  // did not set UCX_RNDV_THRESH and the host has no RDMA device, so UCX runs over TCP.
  bool eager() const { return eager_; }
  // The peers whose messages go through TCP lanes (after connect()).
  int lanePeers() const { return lanePeers_; }

  // This rank's record for the bootstrap: every channel's worker address.
  const std::vector<std::byte>& address() const { return address_; }
  // Connects to every rank q with use[q] set, from its record (as address() made it). Peers on
  // other hosts get UCX's peer-failure handling; on this host the caller watches the process.
  Status connect(const std::vector<std::vector<std::byte>>& records, const std::vector<bool>& use,
                 const std::vector<bool>& sameHost);

  // One pass of the channel's worker (from the channel's thread).
  void progress(int channel);

  Connection* to(int channel, int peer) const;
  Connection* from(int channel, int peer) const;

  // Waits until every message this rank sent on `channel` has reached its peer. A channel's
  // thread calls it at the end of each call: the peers' waits need nothing more from this
  // rank's worker, which is not progressed between calls.
  Status flush(int channel, const Waiter& w);

  // Aborts between hosts: every rank keeps one more worker (any thread may use it) whose only
  // message is "this communicator was aborted". notifyAbort sends it to every UCX peer once,
  // waiting at most a second for it to leave; pollAbort (from any waiter) progresses that
  // worker and returns the first such message received ("rank 3: <why>"), else "". It also
  // notices, for peerFailure, a peer whose process or host has gone.
  void notifyAbort(const std::string& why);
  std::string pollAbort();
  // pollAbort until it returns a message or `limit` has passed.
  std::string awaitAbort(std::chrono::milliseconds limit);

  // Empty while the endpoints to `peer` are healthy; else what UCX said went wrong.
  std::string peerFailure(int peer) const;

  // Call signatures (WEFT_CHECK_CALLS): every message carries the signature of the call that
  // sends it in its tag's high 32 bits (0: unchecked), and receive() of a message whose
  // signature differs from this rank's current call's fails, naming that call (callNamer). Set
  // by the caller before it starts a call's channels.
  void sign(std::uint32_t signature) {
    signature_.store(signature, std::memory_order_relaxed);
    calls_.fetch_add(1, std::memory_order_relaxed);
  }
  std::uint32_t signature() const { return signature_.load(std::memory_order_relaxed); }
  // How many calls have been signed: a link tells a call's first message by it.
  std::uint64_t calls() const { return calls_.load(std::memory_order_relaxed); }
  std::function<std::string()> callNamer;

  struct Channel;  // a worker and its endpoints (ucx.cpp)
  class Link;      // one connection (ucx.cpp)

 private:
  UcxTransport() = default;
  UcxGeometry g_;
  void* context_ = nullptr;  // ucp_context_h
  bool eager_ = false;
  std::vector<std::unique_ptr<Channel>> channels_;
  std::vector<std::byte> address_;
  std::unique_ptr<std::atomic<int>[]> failed_;  // by peer: a ucs_status_t, 0 while healthy
  // The control worker is channels_.back(). Its one receive, and what it brought:
  void* abortReceive_ = nullptr;
  char abortBuffer_[256] = {};
  std::string abortMessage_;
  std::mutex controlMutex_;  // one poller at a time
  std::atomic<bool> notified_{false};
  std::unique_ptr<TcpLanes> lanes_;  // null: direct messages go through UCX
  int lanePeers_ = 0;
  std::atomic<std::uint32_t> signature_{0};
  std::atomic<std::uint64_t> calls_{0};
};

// Whether this build has the UCX transport.
bool ucxAvailable();

}  // namespace weft::transport
