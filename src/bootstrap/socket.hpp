// TCP sockets for the bootstrap. Every socket is non-blocking and close-on-exec; every wait is a
// poll() with a deadline that also watches an AbortSignal, so no call can hang past its deadline
// or survive an abort. Sends use MSG_NOSIGNAL: a dead peer is an error value, never SIGPIPE.
#pragma once

#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "weft/status.hpp"

namespace weft::boot {

// A point in time after which waits give up.
class Deadline {
 public:
  // Non-finite or absurdly long durations never expire.
  static Deadline after(double seconds);
  static Deadline never() { return Deadline(); }

  bool expired() const;
  // Milliseconds for poll(): -1 when it never expires, else what is left rounded up (0 if none).
  int pollMillis() const;
  std::optional<std::chrono::steady_clock::time_point> at() const { return at_; }
  // "5 s", "0.5 s": the duration it was made with, for messages.
  std::string describe() const;
  // The duration it was made with, and what is left of it (infinite when it never expires).
  double seconds() const { return seconds_; }
  double secondsLeft() const;

 private:
  Deadline() = default;
  std::optional<std::chrono::steady_clock::time_point> at_;
  double seconds_ = 0;
};

// An eventfd that, once triggered, stays readable: every poll that includes it wakes at once.
// trigger() may be called from any thread.
class AbortSignal {
 public:
  static Result<std::unique_ptr<AbortSignal>> create();
  ~AbortSignal();
  AbortSignal(const AbortSignal&) = delete;
  AbortSignal& operator=(const AbortSignal&) = delete;

  void trigger();
  bool triggered() const { return triggered_.load(std::memory_order_acquire); }
  int fd() const { return fd_; }

 private:
  explicit AbortSignal(int fd) : fd_(fd) {}
  const int fd_;
  std::atomic<bool> triggered_{false};
};

// An IPv4 or IPv6 address and port.
class SocketAddress {
 public:
  // family(2) port(2) IPv6 scope id(4) address(16), big-endian: the form used in ids and tables.
  static constexpr std::size_t kWireBytes = 24;

  SocketAddress() = default;
  static Result<SocketAddress> fromSockaddr(const sockaddr* sa, socklen_t len);
  // "10.0.0.1:41234", "[fd00::1]:41234", "[fe80::1%eth0]:41234" or "node7:41234" (resolved
  // with getaddrinfo, IPv4 preferred).
  static Result<SocketAddress> parse(std::string_view hostPort);
  // Returns an invalid address (valid() == false) when the bytes do not hold one.
  static SocketAddress decode(const unsigned char* in);
  void encode(unsigned char* out) const;

  bool valid() const { return family() == AF_INET || family() == AF_INET6; }
  int family() const { return storage_.ss_family; }
  std::uint16_t port() const;
  void setPort(std::uint16_t port);
  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&storage_); }
  socklen_t length() const;
  // "10.0.0.1:41234" or "[fe80::1%eth0]:41234".
  std::string toString() const;

 private:
  sockaddr_storage storage_{};
};

// This host's address per WEFT_SOCKET_IFNAME rules (see BootstrapOptions::ifname), port 0.
Result<SocketAddress> interfaceAddress(std::string_view ifname);

// The same choice with the interface's name ("eth0"): UCX is told to use that device too.
struct InterfaceChoice {
  std::string name;
  SocketAddress address;
};
Result<InterfaceChoice> chooseInterface(std::string_view ifname);

// An owned socket file descriptor: closed by the destructor, move-only.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) noexcept : fd_(fd) {}
  ~Socket() { close(); }
  Socket(Socket&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void close();
  // Shuts both directions without closing the fd, so it is safe while another thread polls it;
  // that thread wakes, and the peer sees the connection end.
  void shutdown() const;

  // A listening socket bound to `address` (port 0: an ephemeral port).
  static Result<Socket> listen(const SocketAddress& address, bool reuseAddress);
  Result<SocketAddress> localAddress() const;

  // Connects to `address`, retrying refused or unreachable attempts (the listener may not be up
  // yet) until the deadline. `peer` names the other side in messages ("the root", "rank 3").
  static Result<Socket> connect(const SocketAddress& address, std::string_view peer,
                                const Deadline& deadline, const AbortSignal* abort);
  // Accepts one pending connection; an invalid Socket when none is pending.
  Result<Socket> tryAccept() const;
  // Reads what is available, up to `bytes`: 0 when nothing is (never blocks); an error when the
  // peer has closed the connection.
  Result<std::size_t> tryRecv(void* data, std::size_t bytes, std::string_view peer) const;

  Status sendAll(const void* data, std::size_t bytes, std::string_view peer,
                 const Deadline& deadline, const AbortSignal* abort) const;
  Status recvAll(void* data, std::size_t bytes, std::string_view peer, const Deadline& deadline,
                 const AbortSignal* abort) const;

 private:
  int fd_ = -1;
};

// Sends `bytes` on `to` while receiving `bytes` on `from`, progressing both so that two peers
// exchanging large records cannot block each other on full socket buffers.
Status sendRecvAll(const Socket& to, const void* out, std::string_view toPeer, const Socket& from,
                   void* in, std::string_view fromPeer, std::size_t bytes, const Deadline& deadline,
                   const AbortSignal* abort);

// "connection refused": strerror, thread-safe, first letter lowercase.
std::string errnoText(int err);

}  // namespace weft::boot
