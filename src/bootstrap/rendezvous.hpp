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

// ---- the hello ----

enum class HelloKind : std::uint32_t {
  toRoot = 1,  // a rank joining; carries the rank's own listening address
  ring = 2,    // a rank connecting to its ring successor
};

// magic(8) version(4) kind(4) secret(16) rank(4) nranks(4) address(24)
inline constexpr std::size_t kHelloBytes = 64;

struct Hello {
  HelloKind kind = HelloKind::toRoot;
  Secret secret{};
  std::int32_t rank = 0;
  std::int32_t nranks = 0;
  SocketAddress address;  // toRoot: the sender's listening address; ring: unused
};

void encodeHello(const Hello& hello, unsigned char* out);
// The hello in `in` when its magic, version, kind and secret are right; nullopt otherwise.
std::optional<Hello> decodeHello(const unsigned char* in, const Secret& secret);

// Compares in time independent of where the first difference is.
bool sameSecret(const Secret& a, const Secret& b);

// ---- the root's reply ----

// magic(8) secret(16) code(4) nranks(4) message length(4); then the message, then (on success)
// nranks addresses of SocketAddress::kWireBytes each.
inline constexpr std::size_t kReplyHeaderBytes = 36;
inline constexpr std::size_t kMaxReplyMessage = 4096;

std::vector<unsigned char> encodeReply(const Secret& secret, const Status& status,
                                       const std::vector<SocketAddress>& table);
// Whether a reply header (kReplyHeaderBytes) has the right magic and echoes the id's secret.
bool replyHeaderValid(const unsigned char* header, const Secret& secret);

// ---- the listener ----

// Accepts connections and reads each one's hello without blocking on any single client, so a
// client that connects and stays silent delays nobody. Connections with a wrong secret, a bad
// magic, or no full hello within a grace period are closed and forgotten.
class HelloListener {
 public:
  HelloListener(Socket listener, const Secret& secret)
      : listener_(std::move(listener)), secret_(secret) {}

  struct Arrival {
    Socket socket;
    Hello hello;
  };
  // The next connection that presented a valid hello.
  Result<Arrival> next(const Deadline& deadline, const AbortSignal* abort);
  // Closes the listener and every pending connection.
  void close();

 private:
  struct Pending {
    Socket socket;
    std::array<unsigned char, kHelloBytes> bytes{};
    std::size_t got = 0;
    std::chrono::steady_clock::time_point since;
  };
  Socket listener_;
  Secret secret_;
  std::vector<Pending> pending_;
};

// Starts a detached thread that serves one rendezvous on `listener` and exits.
Status startRootThread(Socket listener, const Secret& secret, double timeoutSeconds);

}  // namespace weft::boot::detail
