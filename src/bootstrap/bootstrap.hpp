// The bootstrap: how the ranks of a communicator find each other before any data transport
// exists. It carries small records (addresses, segment names, pids) with allGather, synchronises
// with barrier, and turns a missing or dead peer into an error instead of a hang during init.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "weft/status.hpp"

namespace weft::boot {

inline constexpr std::size_t kUniqueIdBytes = 128;

// Opaque to users; copied verbatim into the C ABI's weftUniqueId. It holds the root's address,
// the rendezvous secret and how the root is run (see createUniqueId / uniqueIdFromAddress).
struct UniqueId {
  char bytes[kUniqueIdBytes];
};

struct BootstrapOptions {
  // Every blocking call (connectTcp, allGather, barrier) gives up after this many seconds, counted
  // from the start of the call; the root gives up when no rank has arrived for this long.
  // Must be > 0; infinity waits forever.
  double timeoutSeconds = 60;
  // WEFT_SOCKET_IFNAME: which interface this host's address is taken from. "" picks the first up
  // interface that is neither loopback nor docker*, else loopback. Otherwise a comma-separated
  // list of name prefixes ("eth,ib"), "=eth0" for exact names, "^lo,docker" to exclude.
  std::string ifname;
  // Tests only: this rank alters every record it forwards in allGather (the HMAC must catch it).
  bool testTamperForwarded = false;
};

class Bootstrap {
 public:
  virtual ~Bootstrap() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // buf holds size()*bytes; this rank's slot (rank()*bytes) is filled; on return all are.
  // Every rank must make the same calls with the same `bytes` in the same order; a mismatch is
  // reported (Code::invalidUsage) rather than silently mixing records. One call at a time.
  // After any error the bootstrap is broken: later calls return the same error.
  virtual Status allGather(void* buf, std::size_t bytes) = 0;
  virtual Status barrier() = 0;
  // From any thread: makes every current and later call return Code::remoteError promptly, and
  // lets the peers see this rank leave (they fail with Code::remoteError instead of timing out).
  // It must not race with the destruction of this Bootstrap.
  virtual void abort() = 0;
};

// Creates an id for a fresh rendezvous: takes this host's address (per options.ifname), listens
// on an ephemeral TCP port, draws a 16-byte random secret and starts a detached root thread that
// serves exactly one rendezvous for this id, then exits (on success, on error, or when no rank
// has arrived for options.timeoutSeconds). Call it in one process; broadcast the id.
Result<UniqueId> createUniqueId(const BootstrapOptions& options);

// An id for a fixed root address "host:port" (WEFT_COMM_ID, like NCCL_COMM_ID): "10.0.0.1:29500",
// "[fd00::1]:29500" or "node7:29500". No thread is started: rank 0 runs the root when it joins
// (see rankStartsRoot). Every process derives the same id, so its secret comes from `secret`
// (WEFT_COMM_SECRET: text every rank is given out of band) and the address; without one, from
// the address alone, and the rendezvous is then only as secret as the address itself.
Result<UniqueId> uniqueIdFromAddress(const std::string& hostPort, const std::string& secret = "");

// Whether `rank` must run the root for this id: true for rank 0 of an id from
// uniqueIdFromAddress; false otherwise (createUniqueId's process already runs it).
bool rankStartsRoot(const UniqueId& id, int rank);

// "host:port" of the root named by the id, for logs and error messages.
Result<std::string> rootAddress(const UniqueId& id);

// Joins the rendezvous as `rank` of `nranks` and connects the ranks in a ring. With startRoot
// (WEFT_COMM_ID mode, rank 0) this process first starts the root listener on the id's address.
Result<std::unique_ptr<Bootstrap>> connectTcp(const UniqueId& id, int rank, int nranks,
                                              const BootstrapOptions& options, bool startRoot);

// All ranks in one process (threads): one Bootstrap per rank, sharing in-memory state. Each
// returned Bootstrap is used by its own thread; abort() on any of them fails all of them.
Result<std::vector<std::unique_ptr<Bootstrap>>> makeInProcess(int nranks,
                                                              const BootstrapOptions& options);

}  // namespace weft::boot
