#include "src/bootstrap/socket.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "src/bootstrap/wire.hpp"
#include "src/core/log.hpp"

namespace weft::boot {
namespace {

using Clock = std::chrono::steady_clock;
using wire::get16;
using wire::get32;
using wire::put16;
using wire::put32;

[[maybe_unused]] const char* pickStrerror(int rc, const char* buf) {
  return rc == 0 ? buf : "unknown error";
}
[[maybe_unused]] const char* pickStrerror(const char* s, const char*) {
  return s;
}

bool wouldBlock(int err) {
  return err == EAGAIN || err == EWOULDBLOCK || err == EINTR;
}

bool peerGone(int err) {
  return err == ECONNRESET || err == EPIPE || err == ENOTCONN || err == ETIMEDOUT ||
         err == EHOSTUNREACH || err == ENETUNREACH;
}

std::string str(std::string_view s) {
  return std::string(s);
}

Status abortedWhile(std::string_view what) {
  return {Code::remoteError, "aborted while " + str(what)};
}

Status timedOut(const Deadline& deadline, std::string_view what) {
  return {Code::timeout, "timed out after " + deadline.describe() + " " + str(what)};
}

Status closedBy(std::string_view peer) {
  return {Code::remoteError, str(peer) + " closed the connection (it exited, crashed or aborted)"};
}

Status ioError(int err, std::string_view what, std::string_view peer) {
  if (peerGone(err)) {
    return {Code::remoteError, "lost the connection to " + str(peer) + " (" + errnoText(err) + ")"};
  }
  return {Code::systemError, str(what) + " " + str(peer) + " failed: " + errnoText(err)};
}

enum class Wait { ready, timedOut, aborted };

// Waits until `fd` has `events` (or an error), the deadline passes, or `abort` is triggered; a
// wait that goes on says so at WARN (log::ProgressClock), naming `what` it waits for ("the root
// at 10.0.0.1:5000").
Wait waitFor(int fd, short events, const Deadline& deadline, const AbortSignal* abort,
             std::string_view what) {
  log::ProgressClock progress(deadline.seconds());
  for (;;) {
    if (abort != nullptr && abort->triggered()) return Wait::aborted;
    pollfd fds[2] = {{fd, events, 0}, {abort != nullptr ? abort->fd() : -1, POLLIN, 0}};
    const int slice = std::max(1, static_cast<int>(std::ceil(progress.secondsUntilDue() * 1000)));
    const int left = deadline.pollMillis();
    const int rc = ::poll(fds, 2, left < 0 ? slice : std::min(left, slice));
    if (rc == 0 && !deadline.expired()) {
      if (progress.due())
        WEFT_WARN(log::kBootstrap, "bootstrap: still waiting for %.*s: %.0f s so far, %.0f s left",
                  static_cast<int>(what.size()), what.data(), progress.waited(),
                  deadline.secondsLeft());
      continue;
    }
    if (rc < 0 && errno != EINTR) return Wait::ready;  // the caller's syscall reports the error
    if (abort != nullptr && (fds[1].revents != 0 || abort->triggered())) return Wait::aborted;
    if (rc > 0 && fds[0].revents != 0) return Wait::ready;
    if (deadline.expired()) return Wait::timedOut;
  }
}

// Sleeps up to `millis` (bounded by the deadline), waking early on abort.
void pause(int millis, const Deadline& deadline, const AbortSignal* abort) {
  const int left = deadline.pollMillis();
  const int ms = left < 0 ? millis : std::min(millis, left);
  pollfd fd = {abort != nullptr ? abort->fd() : -1, POLLIN, 0};
  ::poll(&fd, 1, ms);
}

void setNoDelay(int fd) {
  // Bootstrap messages are small request/response exchanges: Nagle would only add latency.
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

bool isLinkLocal(const SocketAddress& a) {
  if (a.family() != AF_INET6) return false;
  const auto* in6 = reinterpret_cast<const sockaddr_in6*>(a.get());
  return IN6_IS_ADDR_LINKLOCAL(&in6->sin6_addr);
}

}  // namespace

std::string errnoText(int err) {
  char buf[128] = {};
  std::string text = pickStrerror(strerror_r(err, buf, sizeof buf), buf);
  if (!text.empty() && text[0] >= 'A' && text[0] <= 'Z' && (text.size() < 2 || text[1] > 'Z')) {
    text[0] = static_cast<char>(text[0] - 'A' + 'a');
  }
  return text;
}

// ---- Deadline ----

Deadline Deadline::after(double seconds) {
  Deadline d;
  d.seconds_ = seconds;
  constexpr double kForever = 1e8;  // ~3 years: treated as no deadline, avoids clock overflow
  if (std::isfinite(seconds) && seconds < kForever) {
    const auto span = std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(std::max(seconds, 0.0)));
    d.at_ = Clock::now() + span;
  }
  return d;
}

bool Deadline::expired() const {
  return at_.has_value() && Clock::now() >= *at_;
}

int Deadline::pollMillis() const {
  if (!at_) return -1;
  const auto left = *at_ - Clock::now();
  if (left <= Clock::duration::zero()) return 0;
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return static_cast<int>(std::min<long long>(ms, std::numeric_limits<int>::max()));
}

double Deadline::secondsLeft() const {
  if (!at_) return std::numeric_limits<double>::infinity();
  return std::max(0.0, std::chrono::duration<double>(*at_ - Clock::now()).count());
}

std::string Deadline::describe() const {
  char buf[32];
  if (seconds_ == std::floor(seconds_)) {
    std::snprintf(buf, sizeof buf, "%.0f s", seconds_);
  } else {
    std::snprintf(buf, sizeof buf, "%.3g s", seconds_);
  }
  return buf;
}

// ---- AbortSignal ----

Result<std::unique_ptr<AbortSignal>> AbortSignal::create() {
  const int fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (fd < 0) {
    return Status(Code::systemError, "could not create an eventfd: " + errnoText(errno));
  }
  return std::unique_ptr<AbortSignal>(new AbortSignal(fd));
}

AbortSignal::~AbortSignal() {
  ::close(fd_);
}

void AbortSignal::trigger() {
  triggered_.store(true, std::memory_order_release);  // acquired by triggered()
  const std::uint64_t one = 1;
  if (::write(fd_, &one, sizeof one) < 0) {
    // Only EAGAIN (counter saturated) is possible, and then the fd is readable already.
  }
}

// ---- SocketAddress ----

Result<SocketAddress> SocketAddress::fromSockaddr(const sockaddr* sa, socklen_t len) {
  SocketAddress a;
  if (sa == nullptr) return invalidArgument("no socket address");
  if (sa->sa_family == AF_INET && len >= static_cast<socklen_t>(sizeof(sockaddr_in))) {
    std::memcpy(&a.storage_, sa, sizeof(sockaddr_in));
  } else if (sa->sa_family == AF_INET6 && len >= static_cast<socklen_t>(sizeof(sockaddr_in6))) {
    std::memcpy(&a.storage_, sa, sizeof(sockaddr_in6));
  } else {
    return unsupported("address family " + std::to_string(sa->sa_family) +
                       " is neither IPv4 nor IPv6");
  }
  return a;
}

Result<SocketAddress> SocketAddress::parse(std::string_view hostPort) {
  const std::string whole(hostPort);
  std::string host;
  std::string_view portText;
  if (!hostPort.empty() && hostPort.front() == '[') {
    const auto close = hostPort.find(']');
    if (close == std::string_view::npos || close + 1 >= hostPort.size() ||
        hostPort[close + 1] != ':') {
      return invalidArgument("\"" + whole + "\" is not host:port; write IPv6 as [::1]:29500");
    }
    host = std::string(hostPort.substr(1, close - 1));
    portText = hostPort.substr(close + 2);
  } else {
    const auto colon = hostPort.rfind(':');
    if (colon == std::string_view::npos) {
      return invalidArgument("\"" + whole +
                             "\" has no port; expected host:port, e.g. 10.0.0.1:29500");
    }
    if (hostPort.find(':') != colon) {
      return invalidArgument(
          "\"" + whole + "\" is ambiguous; write an IPv6 address in brackets, e.g. [::1]:29500");
    }
    host = std::string(hostPort.substr(0, colon));
    portText = hostPort.substr(colon + 1);
  }
  if (host.empty()) return invalidArgument("\"" + whole + "\" has no host; expected host:port");
  unsigned long port = 0;
  bool digits = !portText.empty() && portText.size() <= 5;
  for (const char c : portText) {
    if (c < '0' || c > '9') digits = false;
    if (digits) port = port * 10 + static_cast<unsigned long>(c - '0');
  }
  if (!digits || port == 0 || port > 65535) {
    return invalidArgument("\"" + whole + "\" has an invalid port; expected 1-65535");
  }

  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (rc != 0) {
    return invalidArgument("cannot resolve host \"" + host + "\" of \"" + whole +
                           "\": " + (rc == EAI_SYSTEM ? errnoText(errno) : gai_strerror(rc)));
  }
  const addrinfo* pick = nullptr;
  for (const addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    if (ai->ai_family == AF_INET) {
      pick = ai;
      break;
    }
    if (ai->ai_family == AF_INET6 && pick == nullptr) pick = ai;
  }
  Result<SocketAddress> out =
      pick != nullptr ? fromSockaddr(pick->ai_addr, pick->ai_addrlen)
                      : Result<SocketAddress>(
                            invalidArgument("host \"" + host + "\" has no IPv4 or IPv6 address"));
  ::freeaddrinfo(found);
  if (out) out->setPort(static_cast<std::uint16_t>(port));
  return out;
}

SocketAddress SocketAddress::decode(const unsigned char* in) {
  SocketAddress a;
  const std::uint16_t family = get16(in);
  const std::uint16_t port = get16(in + 2);
  if (family == 4) {
    auto* v4 = reinterpret_cast<sockaddr_in*>(&a.storage_);
    v4->sin_family = AF_INET;
    v4->sin_port = htons(port);
    std::memcpy(&v4->sin_addr, in + 8, 4);
  } else if (family == 6) {
    auto* v6 = reinterpret_cast<sockaddr_in6*>(&a.storage_);
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(port);
    v6->sin6_scope_id = get32(in + 4);
    std::memcpy(&v6->sin6_addr, in + 8, 16);
  }
  return a;
}

void SocketAddress::encode(unsigned char* out) const {
  std::memset(out, 0, kWireBytes);
  if (family() == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&storage_);
    put16(out, 4);
    put16(out + 2, port());
    std::memcpy(out + 8, &v4->sin_addr, 4);
  } else if (family() == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&storage_);
    put16(out, 6);
    put16(out + 2, port());
    put32(out + 4, v6->sin6_scope_id);
    std::memcpy(out + 8, &v6->sin6_addr, 16);
  }
}

std::uint16_t SocketAddress::port() const {
  if (family() == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&storage_)->sin_port);
  if (family() == AF_INET6) {
    return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage_)->sin6_port);
  }
  return 0;
}

void SocketAddress::setPort(std::uint16_t port) {
  if (family() == AF_INET) reinterpret_cast<sockaddr_in*>(&storage_)->sin_port = htons(port);
  if (family() == AF_INET6) reinterpret_cast<sockaddr_in6*>(&storage_)->sin6_port = htons(port);
}

socklen_t SocketAddress::length() const {
  if (family() == AF_INET) return sizeof(sockaddr_in);
  if (family() == AF_INET6) return sizeof(sockaddr_in6);
  return 0;
}

std::string SocketAddress::toString() const {
  char text[INET6_ADDRSTRLEN] = {};
  if (family() == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&storage_);
    ::inet_ntop(AF_INET, &v4->sin_addr, text, sizeof text);
    return std::string(text) + ":" + std::to_string(port());
  }
  if (family() == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&storage_);
    ::inet_ntop(AF_INET6, &v6->sin6_addr, text, sizeof text);
    std::string host = text;
    if (v6->sin6_scope_id != 0) {
      char name[IF_NAMESIZE] = {};
      host += "%";
      host += ::if_indextoname(v6->sin6_scope_id, name) != nullptr
                  ? std::string(name)
                  : std::to_string(v6->sin6_scope_id);
    }
    return "[" + host + "]:" + std::to_string(port());
  }
  return "(no address)";
}

// ---- interface lookup ----

Result<SocketAddress> interfaceAddress(std::string_view ifname) {
  auto choice = chooseInterface(ifname);
  if (!choice) return choice.status();
  return choice->address;
}

Result<InterfaceChoice> chooseInterface(std::string_view ifname) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) {
    return Status(Code::systemError, "could not list network interfaces: " + errnoText(errno));
  }
  // Freed on every way out, an exception (an allocation below) included.
  const std::unique_ptr<ifaddrs, void (*)(ifaddrs*)> owned(list, ::freeifaddrs);

  // NCCL_SOCKET_IFNAME syntax: optional '^' (exclude), optional '=' (exact), comma list.
  std::string_view spec = ifname;
  const bool exclude = !spec.empty() && spec.front() == '^';
  if (exclude) spec.remove_prefix(1);
  const bool exact = !spec.empty() && spec.front() == '=';
  if (exact) spec.remove_prefix(1);
  std::vector<std::string> patterns;
  for (std::size_t start = 0; start <= spec.size();) {
    const std::size_t comma = std::min(spec.find(',', start), spec.size());
    if (comma > start) patterns.emplace_back(spec.substr(start, comma - start));
    start = comma + 1;
  }
  const auto listed = [&](const std::string& name) {
    return std::any_of(patterns.begin(), patterns.end(), [&](const std::string& p) {
      return exact ? name == p : name.rfind(p, 0) == 0;
    });
  };

  struct Candidate {
    std::string name;
    SocketAddress address;
    int rank;  // lower is better: non-loopback before loopback, IPv4, IPv6, IPv6 link-local
  };
  std::vector<Candidate> candidates;
  std::vector<std::string> seen;
  for (const ifaddrs* ifa = list; ifa != nullptr; ifa = ifa->ifa_next) {
    if (ifa->ifa_addr == nullptr || (ifa->ifa_flags & IFF_UP) == 0) continue;
    const int family = ifa->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    const std::string name = ifa->ifa_name;
    if (std::find(seen.begin(), seen.end(), name) == seen.end()) seen.push_back(name);
    const bool loopback = (ifa->ifa_flags & IFF_LOOPBACK) != 0;
    if (patterns.empty() && !exclude && !exact) {
      if (name.rfind("docker", 0) == 0) continue;  // like NCCL: never pick a docker bridge
    } else if (listed(name) == exclude) {
      continue;
    }
    auto address = SocketAddress::fromSockaddr(
        ifa->ifa_addr, family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6));
    if (!address) continue;
    const int kind = family == AF_INET ? 0 : isLinkLocal(*address) ? 2 : 1;
    candidates.push_back({name, *address, (loopback ? 10 : 0) + kind});
  }

  // stable: among equals, the first interface listed wins
  const auto best =
      std::min_element(candidates.begin(), candidates.end(),
                       [](const Candidate& a, const Candidate& b) { return a.rank < b.rank; });
  if (best == candidates.end()) {
    std::string names;
    for (const auto& n : seen) names += (names.empty() ? "" : ", ") + n;
    return invalidArgument("WEFT_SOCKET_IFNAME=\"" + std::string(ifname) +
                           "\" matches no interface that is up and has an IP address "
                           "(interfaces with addresses: " +
                           (names.empty() ? std::string("none") : names) + ")");
  }
  InterfaceChoice out{best->name, best->address};
  out.address.setPort(0);
  return out;
}

// ---- Socket ----

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    close();
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

void Socket::close() {
  if (fd_ >= 0) ::close(fd_);  // never retried: on Linux the fd is released even on EINTR
  fd_ = -1;
}

void Socket::shutdown() const {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

Result<Socket> Socket::listen(const SocketAddress& address, bool reuseAddress) {
  const int fd = ::socket(address.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status(Code::systemError, "could not create a socket: " + errnoText(errno));
  Socket s(fd);
  if (reuseAddress) {
    // A fixed port (WEFT_COMM_ID) must be reusable while the last run's connections linger.
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  }
  if (::bind(fd, address.get(), address.length()) != 0) {
    return Status(Code::systemError,
                  "could not bind to " + address.toString() + " (" + errnoText(errno) + ")");
  }
  if (::listen(fd, SOMAXCONN) != 0) {
    return Status(Code::systemError,
                  "could not listen on " + address.toString() + " (" + errnoText(errno) + ")");
  }
  return s;
}

Result<SocketAddress> Socket::localAddress() const {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getsockname(fd_, reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
    return Status(Code::systemError, "getsockname failed: " + errnoText(errno));
  }
  return SocketAddress::fromSockaddr(reinterpret_cast<const sockaddr*>(&ss), len);
}

Result<Socket> Socket::connect(const SocketAddress& address, std::string_view peer,
                               const Deadline& deadline, const AbortSignal* abort) {
  const std::string where = str(peer) + " at " + address.toString();
  std::string lastError = "no answer";
  int backoffMs = 5;
  log::ProgressClock progress(deadline.seconds());
  for (;;) {
    if (abort != nullptr && abort->triggered()) return abortedWhile("connecting to " + where);
    if (progress.due())
      WEFT_WARN(log::kBootstrap,
                "bootstrap: still trying to reach %s (%s): %.0f s so far, %.0f s left",
                where.c_str(), lastError.c_str(), progress.waited(), deadline.secondsLeft());
    const int fd = ::socket(address.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return Status(Code::systemError, "could not create a socket: " + errnoText(errno));
    Socket s(fd);
    int err = ::connect(fd, address.get(), address.length()) == 0 ? 0 : errno;
    if (err == EINPROGRESS || err == EINTR) {
      const Wait w = waitFor(fd, POLLOUT, deadline, abort, peer);
      if (w == Wait::aborted) return abortedWhile("connecting to " + where);
      if (w == Wait::timedOut) break;
      socklen_t len = sizeof err;
      if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    }
    if (err == 0) {
      setNoDelay(fd);
      return s;
    }
    lastError = errnoText(err);
    const bool retry = err == ECONNREFUSED || err == ECONNRESET || err == ECONNABORTED ||
                       err == ETIMEDOUT || err == EHOSTUNREACH || err == ENETUNREACH ||
                       err == EAGAIN || err == EADDRNOTAVAIL;
    if (!retry) {
      return Status(Code::systemError, "could not connect to " + where + " (" + lastError + ")");
    }
    if (deadline.expired()) break;
    pause(backoffMs, deadline, abort);  // the listener may not be up yet
    backoffMs = std::min(backoffMs * 2, 100);
  }
  return Status(Code::timeout, "could not reach " + where + " within " + deadline.describe() +
                                   " (" + lastError + ")");
}

Result<Socket> Socket::tryAccept() const {
  const int fd = ::accept4(fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd >= 0) {
    setNoDelay(fd);
    return Socket(fd);
  }
  const int err = errno;
  // A connection reset before it was accepted is the client's problem, not the listener's.
  if (wouldBlock(err) || err == ECONNABORTED || err == EPROTO) return Socket();
  return Status(Code::systemError, "could not accept a connection: " + errnoText(err));
}

Result<std::size_t> Socket::tryRecv(void* data, std::size_t bytes, std::string_view peer) const {
  if (bytes == 0) return std::size_t{0};
  const ssize_t n = ::recv(fd_, data, bytes, 0);
  if (n > 0) return static_cast<std::size_t>(n);
  if (n == 0) return closedBy(peer);
  if (wouldBlock(errno)) return std::size_t{0};
  return ioError(errno, "receiving from", peer);
}

Status Socket::sendAll(const void* data, std::size_t bytes, std::string_view peer,
                       const Deadline& deadline, const AbortSignal* abort) const {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t done = 0; done < bytes;) {
    if (abort != nullptr && abort->triggered()) return abortedWhile("sending to " + str(peer));
    const ssize_t n = ::send(fd_, p + done, bytes - done, MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && !wouldBlock(errno)) return ioError(errno, "sending to", peer);
    const Wait w = waitFor(fd_, POLLOUT, deadline, abort, peer);
    if (w == Wait::aborted) return abortedWhile("sending to " + str(peer));
    if (w == Wait::timedOut) return timedOut(deadline, "sending to " + str(peer));
  }
  return Status::ok();
}

Status Socket::recvAll(void* data, std::size_t bytes, std::string_view peer,
                       const Deadline& deadline, const AbortSignal* abort) const {
  auto* p = static_cast<unsigned char*>(data);
  for (std::size_t done = 0; done < bytes;) {
    if (abort != nullptr && abort->triggered()) {
      return abortedWhile("receiving from " + str(peer));
    }
    auto n = tryRecv(p + done, bytes - done, peer);
    if (!n) return n.status();
    if (*n > 0) {
      done += *n;
      continue;
    }
    const Wait w = waitFor(fd_, POLLIN, deadline, abort, peer);
    if (w == Wait::aborted) return abortedWhile("receiving from " + str(peer));
    if (w == Wait::timedOut) return timedOut(deadline, "waiting for " + str(peer));
  }
  return Status::ok();
}

Status sendRecvAll(const Socket& to, const void* out, std::string_view toPeer, const Socket& from,
                   void* in, std::string_view fromPeer, std::size_t bytes, const Deadline& deadline,
                   const AbortSignal* abort) {
  const auto* src = static_cast<const unsigned char*>(out);
  auto* dst = static_cast<unsigned char*>(in);
  std::size_t sent = 0;
  std::size_t got = 0;
  while (sent < bytes || got < bytes) {
    if (abort != nullptr && abort->triggered()) {
      return abortedWhile(got < bytes ? "waiting for " + str(fromPeer)
                                      : "sending to " + str(toPeer));
    }
    bool progress = false;
    if (sent < bytes) {
      const ssize_t n = ::send(to.fd(), src + sent, bytes - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        sent += static_cast<std::size_t>(n);
        progress = true;
      } else if (n < 0 && !wouldBlock(errno)) {
        return ioError(errno, "sending to", toPeer);
      }
    }
    if (got < bytes) {
      auto n = from.tryRecv(dst + got, bytes - got, fromPeer);
      if (!n) return n.status();
      got += *n;
      progress = progress || *n > 0;
    }
    if (progress) continue;

    pollfd fds[3] = {{sent < bytes ? to.fd() : -1, POLLOUT, 0},
                     {got < bytes ? from.fd() : -1, POLLIN, 0},
                     {abort != nullptr ? abort->fd() : -1, POLLIN, 0}};
    const int rc = ::poll(fds, 3, deadline.pollMillis());
    if (rc < 0 && errno != EINTR) return ioError(errno, "waiting for", fromPeer);
    if (rc == 0 && deadline.expired()) {
      return timedOut(deadline,
                      got < bytes ? "waiting for " + str(fromPeer) : "sending to " + str(toPeer));
    }
  }
  return Status::ok();
}

}  // namespace weft::boot
