// The TCP bootstrap: ids, the rank's side of the rendezvous, and a ring of TCP connections.
// allGather is a ring all-gather: a 16-byte call header, then n-1 steps, each rank passing on the
// record it received last with the HMAC its origin put on it (the id's secret over the call
// number, the origin's rank and the record: a forwarder can neither alter a record nor pass one
// off as another rank's or another call's); bytes on the wire per rank: 16 + (n-1) * (record +
// 32). barrier is a 1-byte allGather.
#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <vector>

#include "src/bootstrap/bootstrap.hpp"
#include "src/bootstrap/hmac.hpp"
#include "src/bootstrap/rendezvous.hpp"
#include "src/bootstrap/socket.hpp"
#include "src/bootstrap/wire.hpp"
#include "src/core/log.hpp"

namespace weft::boot {
namespace {

using detail::Hello;
using detail::HelloKind;
using detail::IdContents;
using detail::RootMode;
using detail::Secret;

// Each allGather starts with this header to the ring successor: call number and record size, so
// that ranks making different calls are caught instead of silently exchanging the wrong bytes.
constexpr std::size_t kCallHeaderBytes = 16;

Status withPrefix(const Status& s, const std::string& prefix, const std::string& suffix = "") {
  return {s.code(), prefix + s.message() + suffix};
}

Status checkTimeout(double seconds) {
  if (std::isnan(seconds) || seconds <= 0) {
    return invalidArgument("bootstrap: timeoutSeconds is " + std::to_string(seconds) +
                           "; it must be > 0 (WEFT_TIMEOUT_S)");
  }
  return Status::ok();
}

Result<Secret> randomSecret() {
  Secret secret{};
  if (Status st = detail::randomBytes(secret.data(), secret.size()); !st)
    return withPrefix(st, "", " (for the id's secret)");
  return secret;
}

// Without WEFT_COMM_SECRET every process given the same WEFT_COMM_ID must compute the same
// secret, so it can only be a function of the address: it keeps out strays and stale jobs on a
// reused port, not attackers who know the address (the rendezvous is unauthenticated, and says
// so). The resolved address (not the text) is hashed, so "localhost:29500" and "127.0.0.1:29500"
// agree.
Secret secretFromAddress(const SocketAddress& address) {
  unsigned char bytes[SocketAddress::kWireBytes];
  address.encode(bytes);
  std::uint64_t lanes[2] = {0xcbf29ce484222325ULL, 0x84222325cbf29ce4ULL};  // FNV-1a, two seeds
  for (std::uint64_t& h : lanes) {
    for (const unsigned char b : bytes) h = (h ^ b) * 0x100000001b3ULL;
    // splitmix64 finalizer: spread every input bit over the output
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ULL;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebULL;
    h ^= h >> 31;
  }
  Secret secret{};
  wire::put64(secret.data(), lanes[0]);
  wire::put64(secret.data() + 8, lanes[1]);
  return secret;
}

// With WEFT_COMM_SECRET: the text shared out of band and the address, hashed (SHA-256).
Secret secretFromText(const std::string& text, const SocketAddress& address) {
  unsigned char bytes[SocketAddress::kWireBytes];
  address.encode(bytes);
  const char* label = "weft-comm-secret";
  detail::Sha256 h;
  h.update(label, std::strlen(label));
  h.update(text.data(), text.size());
  h.update(bytes, sizeof bytes);
  const detail::Digest d = h.finish();
  Secret secret{};
  std::memcpy(secret.data(), d.data(), secret.size());
  return secret;
}

class TcpBootstrap final : public Bootstrap {
 public:
  TcpBootstrap(int rank, int nranks, double timeoutSeconds, Socket next, std::string nextName,
               Socket prev, std::string prevName, std::unique_ptr<AbortSignal> abort,
               const Secret& secret, bool tamper)
      : rank_(rank),
        nranks_(nranks),
        timeoutSeconds_(timeoutSeconds),
        prefix_("bootstrap: rank " + std::to_string(rank) + " of " + std::to_string(nranks) + ": "),
        next_(std::move(next)),
        nextName_(std::move(nextName)),
        prev_(std::move(prev)),
        prevName_(std::move(prevName)),
        abort_(std::move(abort)),
        secret_(secret),
        tamper_(tamper) {}

  int rank() const override { return rank_; }
  int size() const override { return nranks_; }

  Status allGather(void* buf, std::size_t bytes) override;

  Status barrier() override {
    std::vector<unsigned char> bytes(static_cast<std::size_t>(nranks_), 0);
    return allGather(bytes.data(), 1);
  }

  void abort() override {
    abort_->trigger();
    // Wakes this rank's waits and shows the neighbours the connection end, so they fail with
    // remoteError at once instead of at their timeout.
    next_.shutdown();
    prev_.shutdown();
  }

 private:
  // Breaks the bootstrap for good and closes the ring, so the neighbours fail at once
  // (remoteError naming this rank) instead of waiting out their timeout.
  Status fail(Status s) {
    broken_ = s;
    next_.shutdown();
    prev_.shutdown();
    return s;
  }

  const int rank_;
  const int nranks_;
  const double timeoutSeconds_;
  const std::string prefix_;
  Socket next_;  // to rank+1: this rank only sends on it
  std::string nextName_;
  Socket prev_;  // from rank-1: this rank only receives on it
  std::string prevName_;
  std::unique_ptr<AbortSignal> abort_;
  Secret secret_;
  bool tamper_ = false;  // BootstrapOptions::testTamperForwarded
  std::uint64_t calls_ = 0;
  std::optional<Status> broken_;
};

Status TcpBootstrap::allGather(void* buf, std::size_t bytes) {
  if (broken_) return *broken_;
  if (abort_->triggered()) return {Code::remoteError, prefix_ + "the bootstrap was aborted"};
  if (buf == nullptr && bytes > 0) {
    return invalidArgument(prefix_ + "allGather: buf is null with bytes=" + std::to_string(bytes));
  }
  const std::uint64_t call = calls_++;
  if (nranks_ == 1) return Status::ok();
  const std::string what = prefix_ + "allGather #" + std::to_string(call) + ": ";
  const Deadline deadline = Deadline::after(timeoutSeconds_);

  // Neighbours first agree on the call: if every pair agrees, the whole ring does.
  unsigned char mine[kCallHeaderBytes];
  unsigned char theirs[kCallHeaderBytes];
  wire::put64(mine, call);
  wire::put64(mine + 8, bytes);
  if (Status st = sendRecvAll(next_, mine, nextName_, prev_, theirs, prevName_, sizeof mine,
                              deadline, abort_.get());
      !st.isOk()) {
    return fail(withPrefix(st, what));
  }
  const std::uint64_t theirCall = wire::get64(theirs);
  const std::uint64_t theirBytes = wire::get64(theirs + 8);
  if (theirCall != call || theirBytes != bytes) {
    return fail({Code::invalidUsage,
                 what + prevName_ + " is in bootstrap call #" + std::to_string(theirCall) +
                     " with " + std::to_string(theirBytes) + " bytes per rank, but this rank " +
                     "passed " + std::to_string(bytes) +
                     "; every rank must make the same bootstrap calls in the same order"});
  }

  auto* base = static_cast<unsigned char*>(buf);
  const auto n = static_cast<std::size_t>(nranks_);
  const auto me = static_cast<std::size_t>(rank_);
  // A record travels with its origin's HMAC; each rank checks every one it receives.
  auto tag = [&](std::size_t origin, const unsigned char* record) {
    unsigned char who[16];
    wire::put64(who, call);
    wire::put32(who + 8, static_cast<std::uint32_t>(origin));
    wire::put32(who + 12, static_cast<std::uint32_t>(nranks_));
    const char* label = "weft-record";
    return detail::hmacSha256(secret_.data(), secret_.size(),
                              {{label, std::strlen(label)}, {who, sizeof who}, {record, bytes}});
  };
  constexpr std::size_t kTag = sizeof(detail::Digest);
  std::vector<unsigned char> out(bytes + kTag), in(bytes + kTag);
  detail::Digest held = bytes > 0 ? tag(me, base + me * bytes) : detail::Digest{};
  for (std::size_t step = 0; step + 1 < n && bytes > 0; ++step) {
    // Step s: pass on the record of rank (me - s), receive the one of rank (me - s - 1).
    const std::size_t sendSlot = (me + n - step) % n;
    const std::size_t recvSlot = (me + n - step - 1) % n;
    std::memcpy(out.data(), base + sendSlot * bytes, bytes);
    std::memcpy(out.data() + bytes, held.data(), kTag);
    if (tamper_ && step > 0) out[0] ^= 0x01;
    Status st = sendRecvAll(next_, out.data(), nextName_, prev_, in.data(), prevName_, bytes + kTag,
                            deadline, abort_.get());
    if (!st.isOk()) {
      return fail(withPrefix(
          st, what + "step " + std::to_string(step + 1) + " of " + std::to_string(n - 1) + ": "));
    }
    const detail::Digest want = tag(recvSlot, in.data());
    if (!detail::sameDigest(in.data() + bytes, want.data(), kTag)) {
      return fail(
          {Code::remoteError, what + "rank " + std::to_string(recvSlot) +
                                  "'s record, forwarded by " + prevName_ +
                                  ", fails its HMAC: it was altered, or is another rank's or "
                                  "another call's"});
    }
    std::memcpy(base + recvSlot * bytes, in.data(), bytes);
    std::memcpy(held.data(), in.data() + bytes, kTag);
  }
  return Status::ok();
}

std::string rankName(int rank, const SocketAddress& address) {
  return "rank " + std::to_string(rank) + " (" + address.toString() + ")";
}

}  // namespace

Result<UniqueId> createUniqueId(const BootstrapOptions& options) {
  if (Status st = checkTimeout(options.timeoutSeconds); !st.isOk()) return st;
  auto address = interfaceAddress(options.ifname);
  if (!address) return withPrefix(address.status(), "bootstrap: ");
  auto listener = Socket::listen(*address, false);
  if (!listener) return withPrefix(listener.status(), "bootstrap: could not start the root: ");
  auto bound = listener->localAddress();
  if (!bound) return withPrefix(bound.status(), "bootstrap: ");
  auto secret = randomSecret();
  if (!secret) return secret.status();

  IdContents id;
  id.mode = RootMode::ownThread;
  id.secret = *secret;
  id.root = *bound;
  if (Status st = detail::startRootThread(std::move(*listener), *secret, options.timeoutSeconds);
      !st.isOk()) {
    return withPrefix(st, "bootstrap: ");
  }
  return detail::encodeId(id);
}

Result<UniqueId> uniqueIdFromAddress(const std::string& hostPort, const std::string& secret) {
  auto address = SocketAddress::parse(hostPort);
  if (!address) return withPrefix(address.status(), "bootstrap: WEFT_COMM_ID: ");
  IdContents id;
  id.mode = RootMode::fixedAddress;
  id.secret = secret.empty() ? secretFromAddress(*address) : secretFromText(secret, *address);
  id.root = *address;
  id.rootName = hostPort;
  return detail::encodeId(id);
}

bool rankStartsRoot(const UniqueId& id, int rank) {
  auto contents = detail::decodeId(id);
  return contents && contents->mode == RootMode::fixedAddress && rank == 0;
}

Result<std::string> rootAddress(const UniqueId& id) {
  auto contents = detail::decodeId(id);
  if (!contents) return withPrefix(contents.status(), "bootstrap: ");
  return contents->root.toString();
}

Result<std::unique_ptr<Bootstrap>> connectTcp(const UniqueId& id, int rank, int nranks,
                                              const BootstrapOptions& options, bool startRoot) {
  if (nranks < 1) {
    return invalidArgument("bootstrap: nranks is " + std::to_string(nranks) +
                           "; it must be at least 1");
  }
  if (rank < 0 || rank >= nranks) {
    return invalidArgument("bootstrap: rank " + std::to_string(rank) + " is out of range for " +
                           "nranks=" + std::to_string(nranks) + "; ranks are 0.." +
                           std::to_string(nranks - 1));
  }
  if (Status st = checkTimeout(options.timeoutSeconds); !st.isOk()) return st;
  const std::string who =
      "bootstrap: rank " + std::to_string(rank) + " of " + std::to_string(nranks) + ": ";
  auto contents = detail::decodeId(id);
  if (!contents) return withPrefix(contents.status(), who);
  const SocketAddress& rootAddr = contents->root;
  const std::string rootText = rootAddr.toString();
  const std::string rootPeer = contents->rootName.empty() || contents->rootName == rootText
                                   ? std::string("the root")
                                   : "the root (" + contents->rootName + ")";
  const Secret& secret = contents->secret;

  if (startRoot) {
    if (contents->mode != RootMode::fixedAddress) {
      return Status(Code::invalidUsage,
                    who +
                        "startRoot is set, but this id comes from createUniqueId, whose "
                        "process already runs the root; pass rankStartsRoot(id, rank)");
    }
    auto listener = Socket::listen(rootAddr, true);
    if (!listener) {
      return withPrefix(listener.status(), who + "could not start the root: ",
                        "; WEFT_COMM_ID must name an address of rank 0's host and a free port");
    }
    if (Status st = detail::startRootThread(std::move(*listener), secret, options.timeoutSeconds);
        !st.isOk()) {
      return withPrefix(st, who);
    }
  }

  const Deadline deadline = Deadline::after(options.timeoutSeconds);
  auto ownAddress = interfaceAddress(options.ifname);
  if (!ownAddress) return withPrefix(ownAddress.status(), who);
  auto listenerSocket = Socket::listen(*ownAddress, false);
  if (!listenerSocket) return withPrefix(listenerSocket.status(), who);
  auto listenAddress = listenerSocket->localAddress();
  if (!listenAddress) return withPrefix(listenAddress.status(), who);

  // 1. Join at the root: the handshake, then this rank's address; receive the table of all
  // addresses, checked against the handshake's HMAC before anything in it is used.
  std::vector<SocketAddress> table(static_cast<std::size_t>(nranks));
  {
    const std::string hint = "; check WEFT_COMM_ID / WEFT_SOCKET_IFNAME and firewalls";
    auto root = Socket::connect(rootAddr, rootPeer, deadline, nullptr);
    if (!root) return withPrefix(root.status(), who, hint);
    const std::string rootWhere = rootPeer + " at " + rootText;
    auto handshake = detail::clientHandshake(
        *root, secret, Hello{HelloKind::toRoot, rank, nranks, *listenAddress}, rootWhere, deadline);
    if (!handshake) {
      std::string why;
      if (handshake.status().code() == Code::timeout) {
        why = " (is the root's process alive, and this id from this run?)";
      }
      return withPrefix(handshake.status(), who + "joining the rendezvous: ", why);
    }
    std::vector<unsigned char> reply(detail::kReplyHeaderBytes);
    if (Status st = root->recvAll(reply.data(), reply.size(), rootWhere, deadline, nullptr);
        !st.isOk()) {
      std::string why;
      if (st.code() == Code::timeout) {
        why =
            " (the root is still waiting for other ranks: every rank must join with the same "
            "id and nranks=" +
            std::to_string(nranks) + ")";
      }
      return withPrefix(st, who + "joining the rendezvous: ", why);
    }
    if (!detail::replyHeaderValid(reply.data())) {
      return Status(Code::remoteError, who + rootWhere +
                                           " answered with a bad reply (wrong magic); "
                                           "is another program listening on that port?");
    }
    const auto code = static_cast<Code>(wire::get32(reply.data() + 8));
    const std::uint32_t replyRanks = wire::get32(reply.data() + 12);
    const std::uint32_t messageBytes = wire::get32(reply.data() + 16);
    if (messageBytes > detail::kMaxReplyMessage ||
        (code == Code::ok && replyRanks != static_cast<std::uint32_t>(nranks)) ||
        (code != Code::ok && replyRanks != 0)) {
      return Status(Code::remoteError, who + rootWhere + " sent a malformed reply (" +
                                           std::to_string(replyRanks) + " ranks, expected " +
                                           std::to_string(nranks) + ")");
    }
    const std::size_t rest =
        messageBytes + replyRanks * SocketAddress::kWireBytes + detail::kMacBytes;
    reply.resize(detail::kReplyHeaderBytes + rest);
    if (Status st = root->recvAll(reply.data() + detail::kReplyHeaderBytes, rest, rootWhere,
                                  deadline, nullptr);
        !st.isOk()) {
      return withPrefix(st, who);
    }
    if (!detail::replyValid(*handshake, reply)) {
      return Status(Code::remoteError,
                    who + rootWhere + " sent a reply that fails its HMAC: not this rendezvous");
    }
    const std::string message(
        reinterpret_cast<const char*>(reply.data()) + detail::kReplyHeaderBytes, messageBytes);
    if (code != Code::ok) {
      // The ranks still to come hear the reason from the root, if it outlives this call.
      (void)detail::waitForRoots(std::min(options.timeoutSeconds, 5.0));
      return Status(code, who + "the root refused the rendezvous: " + message);
    }
    const unsigned char* wireTable = reply.data() + detail::kReplyHeaderBytes + messageBytes;
    for (std::size_t r = 0; r < table.size(); ++r) {
      table[r] = SocketAddress::decode(wireTable + r * SocketAddress::kWireBytes);
      if (!table[r].valid()) {
        return Status(Code::remoteError,
                      who + "the root sent no address for rank " + std::to_string(r));
      }
    }
  }

  auto abort = AbortSignal::create();
  if (!abort) return withPrefix(abort.status(), who);
  if (nranks == 1) {
    return std::unique_ptr<Bootstrap>(new TcpBootstrap(rank, nranks, options.timeoutSeconds,
                                                       Socket(), "", Socket(), "",
                                                       std::move(*abort), secret, false));
  }

  // 2. Form the ring: connect to rank+1's listener; accept rank-1 on ours. Each connection's
  // handshake needs its server to answer, so even ranks connect first and odd ones accept
  // first: nobody waits on a successor that is itself waiting on its own.
  const int next = (rank + 1) % nranks;
  const int prev = (rank + nranks - 1) % nranks;
  std::string nextName = rankName(next, table[static_cast<std::size_t>(next)]);
  std::string prevName = rankName(prev, table[static_cast<std::size_t>(prev)]);
  detail::HelloListener listener(std::move(*listenerSocket), secret);
  auto connectNext = [&]() -> Result<Socket> {
    auto socket = Socket::connect(table[static_cast<std::size_t>(next)],
                                  "rank " + std::to_string(next), deadline, nullptr);
    if (!socket) return withPrefix(socket.status(), who + "forming the ring: ");
    auto handshake = detail::clientHandshake(
        *socket, secret, Hello{HelloKind::ring, rank, nranks, *listenAddress}, nextName, deadline);
    if (!handshake) return withPrefix(handshake.status(), who + "forming the ring: ");
    return std::move(*socket);
  };
  auto acceptPrev = [&]() -> Result<Socket> {
    for (;;) {
      auto arrival = listener.next(deadline, nullptr);
      if (!arrival) {
        if (arrival.status().code() == Code::timeout) {
          return Status(Code::timeout, who + "timed out after " + deadline.describe() +
                                           " waiting for " + prevName + " to connect to the ring");
        }
        return withPrefix(arrival.status(), who + "forming the ring: ");
      }
      if (arrival->hello.kind != HelloKind::ring) continue;
      if (arrival->hello.rank != prev || arrival->hello.nranks != nranks) {
        return Status(Code::invalidUsage, who + "rank " + std::to_string(arrival->hello.rank) +
                                              " of " + std::to_string(arrival->hello.nranks) +
                                              " connected as ring predecessor, expected rank " +
                                              std::to_string(prev) + " of " +
                                              std::to_string(nranks) +
                                              "; is one id used by two communicators?");
      }
      return std::move(arrival->socket);
    }
  };
  Result<Socket> nextSocket = Socket();
  Result<Socket> prevSocket = Socket();
  if (rank % 2 == 0) {
    nextSocket = connectNext();
    if (!nextSocket) return nextSocket.status();
    prevSocket = acceptPrev();
  } else {
    prevSocket = acceptPrev();
    if (!prevSocket) return prevSocket.status();
    nextSocket = connectNext();
  }
  if (!prevSocket) return prevSocket.status();
  if (!nextSocket) return nextSocket.status();
  listener.close();  // nobody else may join

  WEFT_INFO(log::kBootstrap, "bootstrap: rank %d of %d joined at %s; ring: %s -> this -> %s", rank,
            nranks, rootText.c_str(), prevName.c_str(), nextName.c_str());
  return std::unique_ptr<Bootstrap>(
      new TcpBootstrap(rank, nranks, options.timeoutSeconds, std::move(*nextSocket),
                       std::move(nextName), std::move(*prevSocket), std::move(prevName),
                       std::move(*abort), secret, options.testTamperForwarded));
}

}  // namespace weft::boot
