#include "src/bootstrap/rendezvous.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "src/bootstrap/hmac.hpp"
#include "src/bootstrap/wire.hpp"

namespace weft::boot::detail {
namespace {

using Clock = std::chrono::steady_clock;

constexpr unsigned char kIdMagic[4] = {'W', 'F', 'I', 'D'};
constexpr unsigned char kChallengeMagic[8] = {'W', 'E', 'F', 'T', 'C', 'H', 'A', 'L'};
constexpr unsigned char kProofMagic[8] = {'W', 'E', 'F', 'T', 'P', 'R', 'O', 'F'};
constexpr unsigned char kServerMagic[8] = {'W', 'E', 'F', 'T', 'S', 'R', 'V', 'P'};
constexpr unsigned char kReplyMagic[8] = {'W', 'E', 'F', 'T', 'R', 'O', 'O', 'T'};
constexpr std::uint16_t kIdVersion = 1;
// 2: challenge-response (1 sent the secret in the hello).
constexpr std::uint32_t kHelloVersion = 2;

// Id layout offsets.
constexpr std::size_t kIdMode = 6;
constexpr std::size_t kIdSecret = 8;
constexpr std::size_t kIdRoot = kIdSecret + kSecretBytes;
constexpr std::size_t kIdName = kIdRoot + SocketAddress::kWireBytes;
static_assert(kIdName < kUniqueIdBytes);

// A client must finish the handshake this soon after connecting, or it is dropped: a silent or
// slow stranger holds a descriptor no longer. Ranks answer within milliseconds.
constexpr auto kHelloGrace = std::chrono::seconds(5);
// A server's small messages (challenge, proof) go to a fresh socket whose buffer is empty; a
// client that does not take them this soon is dropped.
constexpr double kSendSeconds = 1.0;

std::array<unsigned char, kMacBytes> proofMac(const Handshake& s, bool server) {
  unsigned char kind[4];
  wire::put32(kind, static_cast<std::uint32_t>(s.kind));
  const char* label = server ? "weft-server" : "weft-client";
  const Nonce& first = server ? s.client : s.server;
  const Nonce& second = server ? s.server : s.client;
  return hmacSha256(s.secret.data(), s.secret.size(),
                    {{label, std::strlen(label)},
                     {kind, sizeof kind},
                     {first.data(), first.size()},
                     {second.data(), second.size()}});
}

bool validKind(std::uint32_t kind) {
  return kind == static_cast<std::uint32_t>(HelloKind::toRoot) ||
         kind == static_cast<std::uint32_t>(HelloKind::ring) ||
         kind == static_cast<std::uint32_t>(HelloKind::lane);
}
// At most this many connections wait for their hello; beyond it the oldest is dropped.
constexpr std::size_t kMaxPending = 256;

}  // namespace

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

std::array<unsigned char, kMacBytes> Handshake::mac(const char* label, const void* data,
                                                    std::size_t bytes) const {
  return hmacSha256(secret.data(), secret.size(),
                    {{label, std::strlen(label)},
                     {server.data(), server.size()},
                     {client.data(), client.size()},
                     {data, bytes}});
}

Status randomBytes(void* out, std::size_t bytes) {
  auto* p = static_cast<unsigned char*>(out);
  std::size_t got = 0;
  while (got < bytes) {
    const ssize_t n = ::getrandom(p + got, bytes - got, 0);
    if (n > 0) {
      got += static_cast<std::size_t>(n);
    } else if (n < 0 && errno != EINTR) {
      break;  // ENOSYS on old kernels: fall back to the device
    }
  }
  if (got == bytes) return Status::ok();
  const int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status(Code::systemError, "bootstrap: no randomness: " + errnoText(errno));
  got = 0;
  while (got < bytes) {
    const ssize_t n = ::read(fd, p + got, bytes - got);
    if (n > 0) {
      got += static_cast<std::size_t>(n);
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  ::close(fd);
  if (got != bytes) return Status(Code::systemError, "bootstrap: could not read /dev/urandom");
  return Status::ok();
}

Result<Handshake> clientHandshake(const Socket& socket, const Secret& secret, const Hello& hello,
                                  const std::string& peer, const Deadline& deadline) {
  Handshake s;
  s.secret = secret;
  s.kind = hello.kind;
  const std::string notOurs =
      " does not speak weft's rendezvous (is another program listening "
      "there, or a weft of another version?)";
  unsigned char challenge[kChallengeBytes];
  if (Status st = socket.recvAll(challenge, sizeof challenge, peer, deadline, nullptr); !st)
    return st;
  if (std::memcmp(challenge, kChallengeMagic, sizeof kChallengeMagic) != 0 ||
      wire::get32(challenge + 8) != kHelloVersion)
    return Status(Code::remoteError, peer + notOurs);
  std::memcpy(s.server.data(), challenge + 16, kNonceBytes);
  if (Status st = randomBytes(s.client.data(), s.client.size()); !st) return st;
  unsigned char proof[kProofBytes];
  std::memcpy(proof, kProofMagic, sizeof kProofMagic);
  wire::put32(proof + 8, kHelloVersion);
  wire::put32(proof + 12, static_cast<std::uint32_t>(hello.kind));
  std::memcpy(proof + 16, s.client.data(), kNonceBytes);
  const auto mine = proofMac(s, false);
  std::memcpy(proof + 32, mine.data(), mine.size());
  if (Status st = socket.sendAll(proof, sizeof proof, peer, deadline, nullptr); !st) return st;
  unsigned char answer[kServerProofBytes];
  if (Status st = socket.recvAll(answer, sizeof answer, peer, deadline, nullptr); !st) {
    if (st.code() == Code::remoteError)  // closed without a word: our proof was refused
      return Status(Code::remoteError,
                    peer +
                        " refused this rank's proof of the id's secret (is this id, or "
                        "WEFT_COMM_SECRET, the one of this run?)");
    return st;
  }
  const auto theirs = proofMac(s, true);
  if (std::memcmp(answer, kServerMagic, sizeof kServerMagic) != 0 ||
      !sameDigest(answer + 8, theirs.data(), theirs.size()))
    return Status(Code::remoteError, peer +
                                         " could not prove it knows the id's secret: "
                                         "not a rank of this communicator");
  unsigned char body[kHelloBytes] = {};
  wire::put32(body, static_cast<std::uint32_t>(hello.rank));
  wire::put32(body + 4, static_cast<std::uint32_t>(hello.nranks));
  hello.address.encode(body + 8);
  const auto tag = s.mac("weft-hello", body, kHelloBytes - kMacBytes);
  std::memcpy(body + kHelloBytes - kMacBytes, tag.data(), tag.size());
  if (Status st = socket.sendAll(body, sizeof body, peer, deadline, nullptr); !st) return st;
  return s;
}

bool sameSecret(const Secret& a, const Secret& b) {
  return sameDigest(a.data(), b.data(), kSecretBytes);
}

std::vector<unsigned char> encodeReply(const Handshake& handshake, const Status& status,
                                       const std::vector<SocketAddress>& table) {
  const std::string message = status.message().substr(0, kMaxReplyMessage);
  const std::size_t tableBytes = status.isOk() ? table.size() * SocketAddress::kWireBytes : 0;
  std::vector<unsigned char> out(kReplyHeaderBytes + message.size() + tableBytes);
  unsigned char* p = out.data();
  std::memcpy(p, kReplyMagic, sizeof kReplyMagic);
  wire::put32(p + 8, static_cast<std::uint32_t>(status.code()));
  wire::put32(p + 12, static_cast<std::uint32_t>(status.isOk() ? table.size() : 0));
  wire::put32(p + 16, static_cast<std::uint32_t>(message.size()));
  std::memcpy(p + kReplyHeaderBytes, message.data(), message.size());
  if (status.isOk()) {
    unsigned char* t = p + kReplyHeaderBytes + message.size();
    for (const SocketAddress& a : table) {
      a.encode(t);
      t += SocketAddress::kWireBytes;
    }
  }
  const auto tag = handshake.mac("weft-reply", out.data(), out.size());
  out.insert(out.end(), tag.begin(), tag.end());
  return out;
}

bool replyHeaderValid(const unsigned char* header) {
  return std::memcmp(header, kReplyMagic, sizeof kReplyMagic) == 0;
}

bool replyValid(const Handshake& handshake, const std::vector<unsigned char>& reply) {
  if (reply.size() < kReplyHeaderBytes + kMacBytes) return false;
  const std::size_t body = reply.size() - kMacBytes;
  const auto tag = handshake.mac("weft-reply", reply.data(), body);
  return sameDigest(reply.data() + body, tag.data(), tag.size());
}

bool HelloListener::progress(Pending& p, bool& done, Hello& hello) {
  done = false;
  const std::size_t want = p.proved ? kHelloBytes : kProofBytes;
  auto n = p.socket.tryRecv(p.bytes.data() + p.got, want - p.got, "a client");
  if (!n) return false;
  p.got += *n;
  if (p.got < want) return true;
  const unsigned char* b = p.bytes.data();
  if (!p.proved) {
    // The client's proof: a wrong magic, version, kind or HMAC closes the connection at once,
    // with no answer telling the client why.
    if (std::memcmp(b, kProofMagic, sizeof kProofMagic) != 0 ||
        wire::get32(b + 8) != kHelloVersion || !validKind(wire::get32(b + 12)))
      return false;
    p.handshake.kind = static_cast<HelloKind>(wire::get32(b + 12));
    std::memcpy(p.handshake.client.data(), b + 16, kNonceBytes);
    const auto want_mac = proofMac(p.handshake, false);
    if (!sameDigest(b + 32, want_mac.data(), want_mac.size())) return false;
    unsigned char answer[kServerProofBytes];
    std::memcpy(answer, kServerMagic, sizeof kServerMagic);
    const auto mine = proofMac(p.handshake, true);
    std::memcpy(answer + 8, mine.data(), mine.size());
    if (!p.socket.sendAll(answer, sizeof answer, "a client", Deadline::after(kSendSeconds),
                          nullptr))
      return false;
    p.proved = true;
    p.got = 0;
    return true;
  }
  const auto tag = p.handshake.mac("weft-hello", b, kHelloBytes - kMacBytes);
  if (!sameDigest(b + kHelloBytes - kMacBytes, tag.data(), tag.size())) return false;
  hello.kind = p.handshake.kind;
  hello.rank = static_cast<std::int32_t>(wire::get32(b));
  hello.nranks = static_cast<std::int32_t>(wire::get32(b + 4));
  hello.address = SocketAddress::decode(b + 8);
  done = true;
  return true;
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
      Pending p{std::move(*accepted), {}, false, {}, 0, Clock::now()};
      p.handshake.secret = secret_;
      unsigned char challenge[kChallengeBytes] = {};
      std::memcpy(challenge, kChallengeMagic, sizeof kChallengeMagic);
      wire::put32(challenge + 8, kHelloVersion);
      if (!randomBytes(p.handshake.server.data(), kNonceBytes)) continue;
      std::memcpy(challenge + 16, p.handshake.server.data(), kNonceBytes);
      if (!p.socket.sendAll(challenge, sizeof challenge, "a client", Deadline::after(kSendSeconds),
                            nullptr))
        continue;
      pending_.push_back(std::move(p));
    }

    const auto now = Clock::now();
    for (std::size_t i = 0; i < pending_.size();) {
      Pending& p = pending_[i];
      bool done = false;
      Hello hello;
      bool keep = progress(p, done, hello) && now - p.since <= kHelloGrace;
      if (keep && done) {
        Arrival arrival{std::move(p.socket), hello, p.handshake};
        pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
        return arrival;
      }
      if (!keep) {
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
