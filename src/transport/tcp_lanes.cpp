#include "src/transport/tcp_lanes.hpp"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "src/bootstrap/hmac.hpp"
#include "src/bootstrap/rendezvous.hpp"
#include "src/bootstrap/wire.hpp"

namespace weft::transport {
namespace {

constexpr std::size_t kMostIovecs = 16;
// Each lane socket's send and receive buffers (the kernel doubles them). 1 and 4 MiB ran alike.
constexpr int kSocketBufferBytes = 1 << 20;

namespace wire = boot::wire;
using boot::detail::Secret;

// The record: address(24) token(16) mode(4).
struct LaneRecord {
  boot::SocketAddress address;
  Secret token{};
  int mode = 0;
};

LaneRecord decode(const std::vector<std::byte>& r) {
  LaneRecord out;
  if (r.size() != TcpLanes::kRecordBytes) return out;
  const auto* p = reinterpret_cast<const unsigned char*>(r.data());
  out.address = boot::SocketAddress::decode(p);
  std::memcpy(out.token.data(), p + boot::SocketAddress::kWireBytes, out.token.size());
  out.mode = static_cast<int>(wire::get32(p + boot::SocketAddress::kWireBytes + out.token.size()));
  return out;
}

// The channel a connecting rank names, under its handshake's MAC.
constexpr std::size_t kChannelBytes = 4 + boot::detail::kMacBytes;

}  // namespace

void TcpLane::fail(const std::string& why) {
  if (error_.empty()) error_ = why;
}

std::uint64_t TcpLane::post(const std::byte* at, std::size_t bytes, std::uint32_t signature,
                            Kind kind) {
  Out o{at, bytes, 0, {}};
  wire::put32(o.header, static_cast<std::uint32_t>(kind));
  wire::put32(o.header + 4, signature);
  wire::put64(o.header + 8, bytes);
  out_.push_back(o);
  pump();
  return posted_++;
}

bool TcpLane::pump() {
  while (!out_.empty() && error_.empty()) {
    iovec iov[kMostIovecs];
    std::size_t k = 0;
    for (auto it = out_.begin(); it != out_.end() && k + 2 <= kMostIovecs; ++it) {
      if (it->done < kHeaderBytes) iov[k++] = {it->header + it->done, kHeaderBytes - it->done};
      const std::size_t sentBytes = it->done > kHeaderBytes ? it->done - kHeaderBytes : 0;
      if (sentBytes < it->bytes)
        iov[k++] = {const_cast<std::byte*>(it->at) + sentBytes, it->bytes - sentBytes};
    }
    msghdr m{};
    m.msg_iov = iov;
    m.msg_iovlen = k;
    const ssize_t w = ::sendmsg(socket_.fd(), &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
      const int e = errno;
      if (e == EINTR) continue;
      if (e != EAGAIN && e != EWOULDBLOCK) fail(boot::errnoText(e));
      return false;
    }
    auto left = static_cast<std::size_t>(w);
    while (left > 0) {
      Out& f = out_.front();
      const std::size_t take = std::min(left, kHeaderBytes + f.bytes - f.done);
      f.done += take;
      left -= take;
      if (f.done == kHeaderBytes + f.bytes) {
        out_.pop_front();
        ++written_;
      }
    }
  }
  return out_.empty();
}

TcpLane::Read TcpLane::read(std::byte* at, std::size_t bytes, std::uint32_t signature, Kind kind) {
  if (!error_.empty()) return Read::failed;
  // Reads into `to` what the socket has, up to `want`; false once the lane failed.
  auto take = [&](void* to, std::size_t want, std::size_t& got) {
    while (got < want) {
      const ssize_t r =
          ::recv(socket_.fd(), static_cast<char*>(to) + got, want - got, MSG_DONTWAIT);
      if (r > 0) {
        got += static_cast<std::size_t>(r);
        continue;
      }
      if (r == 0) {
        fail("the connection was closed");
        return false;
      }
      const int e = errno;
      if (e == EINTR) continue;
      if (e == EAGAIN || e == EWOULDBLOCK) return true;
      fail(boot::errnoText(e));
      return false;
    }
    return true;
  };
  if (!checked_) {
    if (!take(header_, kHeaderBytes, headerGot_)) return Read::failed;
    if (headerGot_ < kHeaderBytes) return Read::more;
    if (wire::get32(header_) != static_cast<std::uint32_t>(kind)) {
      fail(wire::get32(header_) == static_cast<std::uint32_t>(Kind::slot) ||
                   wire::get32(header_) == static_cast<std::uint32_t>(Kind::direct)
               ? "a message of the other kind (slot or direct) than the schedule's step expects"
               : "a message out of step (no lane header where one was due)");
      return Read::failed;
    }
    signature_ = wire::get32(header_ + 4);
    length_ = wire::get64(header_ + 8);
    const bool fits = kind == Kind::direct ? length_ == bytes : length_ <= bytes;
    if (!fits || (signature != 0 && signature_ != 0 && signature_ != signature))
      return Read::mismatch;
    checked_ = true;
  }
  if (!take(at, length_, bytesGot_)) return Read::failed;
  if (bytesGot_ < length_) return Read::more;
  headerGot_ = bytesGot_ = 0;
  checked_ = false;
  return Read::done;
}

Result<std::unique_ptr<TcpLanes>> TcpLanes::create(const TcpLaneGeometry& g) {
  std::unique_ptr<TcpLanes> t(new TcpLanes());
  t->g_ = g;
  boot::SocketAddress at = g.bindTo;
  at.setPort(0);
  auto listener = boot::Socket::listen(at, false);
  if (!listener) return listener.status();
  auto bound = listener->localAddress();
  if (!bound) return bound.status();
  t->listener_ = std::move(*listener);
  Secret token{};
  if (Status s = boot::detail::randomBytes(token.data(), token.size()); !s) return s;
  t->record_.resize(kRecordBytes);
  auto* p = reinterpret_cast<unsigned char*>(t->record_.data());
  bound->encode(p);
  std::memcpy(p + boot::SocketAddress::kWireBytes, token.data(), token.size());
  wire::put32(p + boot::SocketAddress::kWireBytes + token.size(),
              static_cast<std::uint32_t>(g.mode));
  t->lanes_.resize(static_cast<std::size_t>(g.channels));
  for (auto& byPeer : t->lanes_) byPeer.resize(static_cast<std::size_t>(g.nranks));
  return t;
}

TcpLanes::~TcpLanes() = default;

bool TcpLanes::between(const std::vector<std::byte>& a, const std::vector<std::byte>& b,
                       bool sameHost) {
  const LaneRecord x = decode(a), y = decode(b);
  if (!x.address.valid() || !y.address.valid()) return false;
  return std::min(x.mode, y.mode) >= (sameHost ? 2 : 1);
}

Status TcpLanes::connect(const std::vector<std::vector<std::byte>>& records,
                         const std::vector<bool>& use) {
  const auto deadline = boot::Deadline::after(g_.timeoutSeconds);
  const std::string who = "rank " + std::to_string(g_.rank) + ": TCP lanes: ";
  const LaneRecord mine = decode(record_);
  auto install = [&](int c, int q, boot::Socket s) {
    const int one = 1;
    (void)::setsockopt(s.fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    // Fixed buffers, not the kernel's autotuning, which starved some lanes on the namespace hosts
    // (docs/perf-hosts.md, "TCP lanes").
    const int buffer = kSocketBufferBytes;
    (void)::setsockopt(s.fd(), SOL_SOCKET, SO_SNDBUF, &buffer, sizeof buffer);
    (void)::setsockopt(s.fd(), SOL_SOCKET, SO_RCVBUF, &buffer, sizeof buffer);
    lanes_[static_cast<std::size_t>(c)][static_cast<std::size_t>(q)] =
        std::make_unique<TcpLane>(std::move(s));
  };

  // Lower ranks connect; this thread accepts theirs while the caller opens its own.
  int expected = 0;
  for (int q = 0; q < g_.rank; ++q) expected += use[static_cast<std::size_t>(q)] ? g_.channels : 0;
  Status accepted;
  // Ends the acceptor's wait where this rank's own connections failed.
  auto stop = boot::AbortSignal::create();
  if (!stop) return stop.status();
  std::thread acceptor([&] {
    boot::detail::HelloListener listener(std::move(listener_), mine.token);
    for (int in = 0; in < expected;) {
      auto arrival = listener.next(deadline, stop->get());
      if (!arrival) {
        accepted =
            Status(arrival.status().code(),
                   who + "waiting for lower ranks to connect: " + arrival.status().message());
        return;
      }
      const int q = arrival->hello.rank;
      if (arrival->hello.kind != boot::detail::HelloKind::lane || q < 0 || q >= g_.rank ||
          !use[static_cast<std::size_t>(q)] || arrival->hello.nranks != g_.nranks)
        continue;  // not a lane of this communicator: the socket closes
      unsigned char named[kChannelBytes];
      if (!arrival->socket.recvAll(named, sizeof named, "rank " + std::to_string(q), deadline,
                                   stop->get()))
        continue;
      const auto mac = arrival->handshake.mac("weft-lane", named, 4);
      const auto c = static_cast<int>(wire::get32(named));
      if (!boot::detail::sameDigest(named + 4, mac.data(), mac.size()) || c < 0 ||
          c >= g_.channels || lane(c, q) != nullptr)
        continue;
      install(c, q, std::move(arrival->socket));
      ++in;
    }
  });
  Status opened;
  for (int q = g_.rank + 1; q < g_.nranks && opened.isOk(); ++q) {
    if (!use[static_cast<std::size_t>(q)]) continue;
    const LaneRecord theirs = decode(records[static_cast<std::size_t>(q)]);
    const std::string name = "rank " + std::to_string(q);
    for (int c = 0; c < g_.channels; ++c) {
      auto s = boot::Socket::connect(theirs.address, name, deadline, nullptr);
      if (!s) {
        opened = Status(s.status().code(), who + s.status().message());
        break;
      }
      const boot::detail::Hello hello{boot::detail::HelloKind::lane, g_.rank, g_.nranks, {}};
      auto handshake = boot::detail::clientHandshake(*s, theirs.token, hello, name, deadline);
      if (!handshake) {
        opened = Status(handshake.status().code(), who + handshake.status().message());
        break;
      }
      unsigned char named[kChannelBytes];
      wire::put32(named, static_cast<std::uint32_t>(c));
      const auto mac = handshake->mac("weft-lane", named, 4);
      std::memcpy(named + 4, mac.data(), mac.size());
      if (Status st = s->sendAll(named, sizeof named, name, deadline, nullptr); !st) {
        opened = Status(st.code(), who + st.message());
        break;
      }
      install(c, q, std::move(*s));
    }
  }
  if (!opened) (*stop)->trigger();
  acceptor.join();
  if (!opened) return opened;
  return accepted;
}

TcpLane* TcpLanes::lane(int channel, int peer) const {
  return lanes_[static_cast<std::size_t>(channel)][static_cast<std::size_t>(peer)].get();
}

}  // namespace weft::transport
