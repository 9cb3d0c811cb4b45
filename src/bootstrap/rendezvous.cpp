#include "src/bootstrap/rendezvous.hpp"

#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "src/bootstrap/wire.hpp"

namespace weft::boot::detail {
namespace {

using Clock = std::chrono::steady_clock;

constexpr unsigned char kIdMagic[4] = {'W', 'F', 'I', 'D'};
constexpr unsigned char kHelloMagic[8] = {'W', 'E', 'F', 'T', 'B', 'O', 'O', 'T'};
constexpr unsigned char kReplyMagic[8] = {'W', 'E', 'F', 'T', 'R', 'O', 'O', 'T'};
constexpr std::uint16_t kIdVersion = 1;
constexpr std::uint32_t kHelloVersion = 1;

// Id layout offsets.
constexpr std::size_t kIdMode = 6;
constexpr std::size_t kIdSecret = 8;
constexpr std::size_t kIdRoot = kIdSecret + kSecretBytes;
constexpr std::size_t kIdName = kIdRoot + SocketAddress::kWireBytes;
static_assert(kIdName < kUniqueIdBytes);

// A client must send its whole hello this soon after connecting, or it is dropped; bounds the
// descriptors a silent or slow stray client can hold.
constexpr auto kHelloGrace = std::chrono::seconds(10);
// At most this many connections wait for their hello; beyond it the oldest is dropped.
constexpr std::size_t kMaxPending = 256;

}  // namespace

bool sameSecret(const Secret& a, const Secret& b) {
  unsigned char diff = 0;
  for (std::size_t i = 0; i < kSecretBytes; ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

UniqueId encodeId(const IdContents& id) {
  UniqueId out{};
  auto* p = reinterpret_cast<unsigned char*>(out.bytes);
  std::memcpy(p, kIdMagic, sizeof kIdMagic);
  wire::put16(p + 4, kIdVersion);
  wire::put16(p + kIdMode, static_cast<std::uint16_t>(id.mode));
  std::memcpy(p + kIdSecret, id.secret.data(), kSecretBytes);
  id.root.encode(p + kIdRoot);
  const std::size_t nameBytes = std::min(id.rootName.size(), kUniqueIdBytes - kIdName - 1);
  std::memcpy(p + kIdName, id.rootName.data(), nameBytes);  // the rest stays NUL
  return out;
}

Result<IdContents> decodeId(const UniqueId& id) {
  const auto* p = reinterpret_cast<const unsigned char*>(id.bytes);
  if (std::memcmp(p, kIdMagic, sizeof kIdMagic) != 0) {
    return invalidArgument(
        "not a weft unique id (bad magic); pass the bytes from weftGetUniqueId unchanged");
  }
  if (wire::get16(p + 4) != kIdVersion) {
    return invalidArgument("unique id version " + std::to_string(wire::get16(p + 4)) +
                           " is not supported by this weft (expects " + std::to_string(kIdVersion) +
                           "); use one weft build on all ranks");
  }
  IdContents out;
  const std::uint16_t mode = wire::get16(p + kIdMode);
  if (mode != static_cast<std::uint16_t>(RootMode::ownThread) &&
      mode != static_cast<std::uint16_t>(RootMode::fixedAddress)) {
    return invalidArgument("unique id has an unknown root mode " + std::to_string(mode));
  }
  out.mode = static_cast<RootMode>(mode);
  std::memcpy(out.secret.data(), p + kIdSecret, kSecretBytes);
  out.root = SocketAddress::decode(p + kIdRoot);
  if (!out.root.valid() || out.root.port() == 0) {
    return invalidArgument("unique id holds no valid root address");
  }
  const char* name = id.bytes + kIdName;
  out.rootName.assign(name, strnlen(name, kUniqueIdBytes - kIdName));
  return out;
}

void encodeHello(const Hello& hello, unsigned char* out) {
  std::memset(out, 0, kHelloBytes);
  std::memcpy(out, kHelloMagic, sizeof kHelloMagic);
  wire::put32(out + 8, kHelloVersion);
  wire::put32(out + 12, static_cast<std::uint32_t>(hello.kind));
  std::memcpy(out + 16, hello.secret.data(), kSecretBytes);
  wire::put32(out + 32, static_cast<std::uint32_t>(hello.rank));
  wire::put32(out + 36, static_cast<std::uint32_t>(hello.nranks));
  hello.address.encode(out + 40);
}

std::optional<Hello> decodeHello(const unsigned char* in, const Secret& secret) {
  if (std::memcmp(in, kHelloMagic, sizeof kHelloMagic) != 0) return std::nullopt;
  if (wire::get32(in + 8) != kHelloVersion) return std::nullopt;
  Hello h;
  std::memcpy(h.secret.data(), in + 16, kSecretBytes);
  if (!sameSecret(h.secret, secret)) return std::nullopt;
  const std::uint32_t kind = wire::get32(in + 12);
  if (kind != static_cast<std::uint32_t>(HelloKind::toRoot) &&
      kind != static_cast<std::uint32_t>(HelloKind::ring)) {
    return std::nullopt;
  }
  h.kind = static_cast<HelloKind>(kind);
  h.rank = static_cast<std::int32_t>(wire::get32(in + 32));
  h.nranks = static_cast<std::int32_t>(wire::get32(in + 36));
  h.address = SocketAddress::decode(in + 40);
  return h;
}

std::vector<unsigned char> encodeReply(const Secret& secret, const Status& status,
                                       const std::vector<SocketAddress>& table) {
  const std::string message = status.message().substr(0, kMaxReplyMessage);
  const std::size_t tableBytes = status.isOk() ? table.size() * SocketAddress::kWireBytes : 0;
  std::vector<unsigned char> out(kReplyHeaderBytes + message.size() + tableBytes);
  unsigned char* p = out.data();
  std::memcpy(p, kReplyMagic, sizeof kReplyMagic);
  std::memcpy(p + 8, secret.data(), kSecretBytes);
  wire::put32(p + 24, static_cast<std::uint32_t>(status.code()));
  wire::put32(p + 28, static_cast<std::uint32_t>(status.isOk() ? table.size() : 0));
  wire::put32(p + 32, static_cast<std::uint32_t>(message.size()));
  std::memcpy(p + kReplyHeaderBytes, message.data(), message.size());
  if (status.isOk()) {
    unsigned char* t = p + kReplyHeaderBytes + message.size();
    for (const SocketAddress& a : table) {
      a.encode(t);
      t += SocketAddress::kWireBytes;
    }
  }
  return out;
}

bool replyHeaderValid(const unsigned char* header, const Secret& secret) {
  Secret echoed;
  std::memcpy(echoed.data(), header + 8, kSecretBytes);
  return std::memcmp(header, kReplyMagic, sizeof kReplyMagic) == 0 && sameSecret(echoed, secret);
}

void HelloListener::close() {
  pending_.clear();
  listener_.close();
}

Result<HelloListener::Arrival> HelloListener::next(const Deadline& deadline,
                                                   const AbortSignal* abort) {
  std::vector<pollfd> fds;
  for (;;) {
    if (abort != nullptr && abort->triggered()) {
      return Status(Code::remoteError, "aborted while waiting for connections");
    }
    for (;;) {
      auto accepted = listener_.tryAccept();
      if (!accepted) return accepted.status();
      if (!accepted->valid()) break;
      if (pending_.size() >= kMaxPending) pending_.erase(pending_.begin());
      pending_.push_back(Pending{std::move(*accepted), {}, 0, Clock::now()});
    }

    const auto now = Clock::now();
    for (std::size_t i = 0; i < pending_.size();) {
      Pending& p = pending_[i];
      auto n = p.socket.tryRecv(p.bytes.data() + p.got, kHelloBytes - p.got, "a client");
      bool drop = !n || now - p.since > kHelloGrace;
      if (n) p.got += *n;
      if (!drop && p.got == kHelloBytes) {
        // A wrong secret or magic closes the connection at once; no answer tells the client why.
        if (auto hello = decodeHello(p.bytes.data(), secret_)) {
          Arrival arrival{std::move(p.socket), *hello};
          pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
          return arrival;
        }
        drop = true;
      }
      if (drop) {
        pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }

    fds.clear();
    fds.push_back({listener_.fd(), POLLIN, 0});
    fds.push_back({abort != nullptr ? abort->fd() : -1, POLLIN, 0});
    for (const Pending& p : pending_) fds.push_back({p.socket.fd(), POLLIN, 0});
    int millis = deadline.pollMillis();
    if (!pending_.empty() && (millis < 0 || millis > 1000)) millis = 1000;  // to expire the grace
    const int rc = ::poll(fds.data(), fds.size(), millis);
    if (rc < 0 && errno != EINTR) {
      return Status(Code::systemError,
                    "poll failed while waiting for connections: " + errnoText(errno));
    }
    if (deadline.expired()) {
      return Status(Code::timeout, "timed out after " + deadline.describe());
    }
  }
}

}  // namespace weft::boot::detail
