// TCP lanes: weft's own sockets for the messages between hosts where UCX runs over TCP. UCX's
// TCP transport lands every eager message in a buffer of its own and copies it out (and its
// rendezvous costs a round trip per message); a lane writes a message from the sender's buffer
// (one sendmsg of a header and the bytes) and reads it straight into the receiver's (a direct
// message into the collective's buffer, a slot's into the slot), one copy each way in the kernel,
// as Open MPI's TCP transport does (docs/perf-hosts.md, "TCP lanes").
//
// One lane per channel and pair of ranks, both directions, used by that channel's thread only.
// Lanes connect at init: the lower rank connects to the higher one's listener and proves it knows
// the listener's token (16 random bytes each rank publishes in its record, which the bootstrap's
// authenticated all-gather carries) with the rendezvous's challenge-response, then names its
// channel under the handshake's MAC; the listener closes once every lane is in.
//
// A message is a header (its kind, the call's signature, the length) and the bytes. The receiver
// reads the header before the bytes: a length or a call other than its own is an error it
// reports, never bytes landing where they do not belong.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "src/bootstrap/socket.hpp"
#include "weft/status.hpp"

namespace weft::transport {

class TcpLane {
 public:
  explicit TcpLane(boot::Socket socket) : socket_(std::move(socket)) {}

  // A lane carries both kinds of a link's messages, in the one order both ends' schedules give
  // them: those the slots would carry (any length up to a slot) and direct ones (of the length
  // the receiver expects). The header says which, so ends out of step fail, never mix them up.
  enum class Kind : std::uint32_t { slot = 0x5746'5453, direct = 0x5746'544c };  // WFTS, WFTL

  // Sender: queues a message of `bytes` at `at`, which must stay as it is until written() has
  // passed the number this returns, and writes what the socket takes.
  std::uint64_t post(const std::byte* at, std::size_t bytes, std::uint32_t signature,
                     Kind kind = Kind::direct);
  // Writes what the socket takes of the queued messages; true once none is left.
  bool pump();
  // Messages written whole so far (post() numbers them from 0).
  std::uint64_t written() const { return written_; }

  // Receiver: reads the next message into `at`, which holds `bytes`: a direct message must be
  // exactly that long, a slot's at most. `mismatch`: its header names another length, or (both
  // checked) another call's signature; nothing of it was read, and the next read sees it again.
  enum class Read { more, done, mismatch, failed };
  Read read(std::byte* at, std::size_t bytes, std::uint32_t signature, Kind kind = Kind::direct);
  std::uint64_t lengthSeen() const { return length_; }
  std::uint32_t signatureSeen() const { return signature_; }

  // What went wrong (the connection closed or failed), or empty.
  const std::string& error() const { return error_; }

  static constexpr std::size_t kHeaderBytes = 16;  // kind(4) signature(4) length(8)

 private:
  struct Out {
    const std::byte* at;
    std::size_t bytes;
    std::size_t done;  // of the header and the bytes
    unsigned char header[kHeaderBytes];
  };
  void fail(const std::string& why);

  boot::Socket socket_;
  std::deque<Out> out_;
  std::uint64_t posted_ = 0, written_ = 0;
  unsigned char header_[kHeaderBytes] = {};
  std::size_t headerGot_ = 0, bytesGot_ = 0;
  bool checked_ = false;  // the header read and matched
  std::uint64_t length_ = 0;
  std::uint32_t signature_ = 0;
  std::string error_;
};

struct TcpLaneGeometry {
  int nranks = 1;
  int rank = 0;
  int channels = 1;
  boot::SocketAddress bindTo;  // this host's address; the port is chosen
  // WEFT_TCP_LANES: 0 none, 1 to ranks on other hosts, 2 to every rank reached through UCX.
  int mode = 1;
  double timeoutSeconds = 300;
};

class TcpLanes {
 public:
  // Listens on the geometry's address.
  static Result<std::unique_ptr<TcpLanes>> create(const TcpLaneGeometry& g);
  ~TcpLanes();

  // This rank's record: its listener's address, its token and its mode.
  static constexpr std::size_t kRecordBytes = 44;
  const std::vector<std::byte>& record() const { return record_; }
  // Whether two ranks with these records (either may be empty: no lanes) use a lane between
  // them. Both ends compute the same answer.
  static bool between(const std::vector<std::byte>& a, const std::vector<std::byte>& b,
                      bool sameHost);

  // Connects a lane per channel to every rank q with use[q], from its record; then closes the
  // listener. Every rank calls it at once (it waits for the lanes its peers open to it).
  Status connect(const std::vector<std::vector<std::byte>>& records, const std::vector<bool>& use);

  // The lane to `peer` on `channel`, or null.
  TcpLane* lane(int channel, int peer) const;

 private:
  TcpLanes() = default;
  TcpLaneGeometry g_;
  boot::Socket listener_;
  std::vector<std::byte> record_;
  std::vector<std::vector<std::unique_ptr<TcpLane>>> lanes_;  // by channel, by peer
};

}  // namespace weft::transport
