// The rendezvous protocol shared by the root (root.cpp) and the ranks (tcp_bootstrap.cpp):
// what a unique id holds, the hello that opens every connection, the root's reply, and the
// listener that drops connections without the id's secret. Internal to src/bootstrap.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "src/bootstrap/bootstrap.hpp"
#include "src/bootstrap/socket.hpp"

namespace weft::boot::detail {

inline constexpr std::size_t kSecretBytes = 16;
using Secret = std::array<unsigned char, kSecretBytes>;

// ---- the unique id ----

enum class RootMode : std::uint16_t {
  ownThread = 1,     // createUniqueId: a thread of the creating process runs the root
  fixedAddress = 2,  // WEFT_COMM_ID: rank 0 runs the root on the given address
};

struct IdContents {
  RootMode mode = RootMode::ownThread;
  Secret secret{};
  SocketAddress root;
  std::string rootName;  // what the user wrote (WEFT_COMM_ID), for messages; may be cut short
};

// Layout: magic "WFID"(4) version(2) mode(2) secret(16) root address(24) name (NUL-terminated).
UniqueId encodeId(const IdContents& id);
Result<IdContents> decodeId(const UniqueId& id);

// ---- the handshake that opens every connection ----
//
// Challenge-response, so the id's secret never crosses the wire and nothing about a rank is
// sent before its peer proved it knows the secret:
//   server -> client  challenge: magic, version, a fresh nonce Ns
//   client -> server  proof: magic, version, kind, a fresh nonce Nc, HMAC(secret, "client",
//                     kind, Ns, Nc); a wrong one is closed without a word
//   server -> client  proof: magic, HMAC(secret, "server", kind, Nc, Ns); a wrong one ends the
//                     client's attempt
//   client -> server  hello: rank, nranks, the client's listening address, HMAC over them and
//                     both nonces
// Whatever follows on the connection (the root's reply) carries an HMAC under the same nonces.

enum class HelloKind : std::uint32_t {
  toRoot = 1,  // a rank joining; carries the rank's own listening address
  ring = 2,    // a rank connecting to its ring successor
  lane = 3,    // a rank opening a TCP lane (src/transport/tcp_lanes.hpp); the secret is the
               // listener's token
};

inline constexpr std::size_t kNonceBytes = 16;
using Nonce = std::array<unsigned char, kNonceBytes>;
inline constexpr std::size_t kMacBytes = 32;
inline constexpr std::size_t kChallengeBytes = 32;    // magic(8) version(4) pad(4) Ns(16)
inline constexpr std::size_t kProofBytes = 64;        // magic(8) version(4) kind(4) Nc(16) mac(32)
inline constexpr std::size_t kServerProofBytes = 40;  // magic(8) mac(32)
inline constexpr std::size_t kHelloBytes = 64;        // rank(4) nranks(4) address(24) mac(32)

// One authenticated connection: the secret both ends proved and the nonces that bind what
// follows to it.
struct Handshake {
  Secret secret{};
  HelloKind kind = HelloKind::toRoot;
  Nonce server{}, client{};
  // HMAC(secret, label, Ns, Nc, data).
  std::array<unsigned char, kMacBytes> mac(const char* label, const void* data,
                                           std::size_t bytes) const;
};

struct Hello {
  HelloKind kind = HelloKind::toRoot;
  std::int32_t rank = 0;
  std::int32_t nranks = 0;
  SocketAddress address;  // toRoot: the sender's listening address; ring: unused
};

// Fresh random bytes (getrandom, else /dev/urandom).
Status randomBytes(void* out, std::size_t bytes);

// The client's side, on a connected socket: proves the secret, checks the server's proof, then
// sends the hello. `peer` names the server in messages.
Result<Handshake> clientHandshake(const Socket& socket, const Secret& secret, const Hello& hello,
                                  const std::string& peer, const Deadline& deadline);

// Compares in time independent of where the first difference is.
bool sameSecret(const Secret& a, const Secret& b);

// ---- the root's reply ----

// magic(8) code(4) nranks(4) message length(4); then the message, then (on success) nranks
// addresses of SocketAddress::kWireBytes each; then the handshake's HMAC over all of it.
inline constexpr std::size_t kReplyHeaderBytes = 20;
inline constexpr std::size_t kMaxReplyMessage = 4096;

std::vector<unsigned char> encodeReply(const Handshake& handshake, const Status& status,
                                       const std::vector<SocketAddress>& table);
// Whether a reply header (kReplyHeaderBytes) has the right magic; the HMAC at its end is
// checked once the whole reply is in (replyValid).
bool replyHeaderValid(const unsigned char* header);
bool replyValid(const Handshake& handshake, const std::vector<unsigned char>& reply);

// ---- the listener ----

// Accepts connections and runs each one's handshake without blocking on any single client, so
// a client that connects and stays silent delays nobody. Connections that fail the handshake or
// do not finish it within a few seconds are closed and forgotten.
class HelloListener {
 public:
  HelloListener(Socket listener, const Secret& secret)
      : listener_(std::move(listener)), secret_(secret) {}

  struct Arrival {
    Socket socket;
    Hello hello;
    Handshake handshake;
  };
  // The next connection that completed the handshake.
  Result<Arrival> next(const Deadline& deadline, const AbortSignal* abort);
  // Closes the listener and every pending connection.
  void close();

 private:
  struct Pending {
    Socket socket;
    Handshake handshake;
    bool proved = false;  // the client's proof checked, the server's sent; the hello is next
    std::array<unsigned char, kProofBytes> bytes{};
    std::size_t got = 0;
    std::chrono::steady_clock::time_point since;
  };
  // Reads what the client sent; false when the connection is to be dropped. Sets `done` when
  // the hello is in.
  bool progress(Pending& p, bool& done, Hello& hello);
  Socket listener_;
  Secret secret_;
  std::vector<Pending> pending_;
};

// Starts a detached thread that serves one rendezvous on `listener` and exits.
Status startRootThread(Socket listener, const Secret& secret, double timeoutSeconds);

// Waits up to `seconds` for the roots this process runs to end (a failed one keeps telling the
// ranks still to come why, which they would not hear were this process to exit first); true
// when none is left.
bool waitForRoots(double seconds);

}  // namespace weft::boot::detail
