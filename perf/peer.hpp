// A peer library that --compare times next to weft, on the same buffers, in the same process.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "perf/collective.hpp"
#include "weft/types.hpp"

namespace weft::perf {

class Peer {
 public:
  virtual ~Peer() = default;
  virtual std::string name() const = 0;
  // Seconds per call of the collective through the peer after `warmup` untimed calls, or nothing
  // when the peer has no such call (MPI has no half-precision reductions, for one). Every rank
  // calls it with the same arguments.
  virtual std::optional<double> secondsPerCall(Collective c, const Layout& l, DataType type,
                                               RedOp op, int root, const void* send, void* recv,
                                               int warmup, int iters) = 0;
};

// MPI's own collectives over MPI_COMM_WORLD (one rank per process); nullptr in a build without
// MPI.
std::unique_ptr<Peer> makeMpiPeer();

}  // namespace weft::perf
