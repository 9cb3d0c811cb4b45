// A peer library that --compare times next to weft, on the same buffers, in the same process.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "perf/collective.hpp"
#include "weft/types.hpp"

namespace weft::perf {

class Control;

class Peer {
 public:
  virtual ~Peer() = default;
  virtual std::string name() const = 0;
  // Seconds per call of the collective through the peer after `warmup` untimed calls, or nothing
  // when the peer has no such call (MPI has no half-precision reductions, for one). Timed call i
  // runs at send + rotation.at(i) and recv + rotation.at(i), as weft's do; the warm-up calls at
  // the buffers' start. Every rank calls it with the same arguments. graphLaunches > 0 (weft-perf
  // -G): the `iters` calls are captured into a CUDA graph and that many launches of it are timed,
  // as weft's are; a peer without streams (MPI) runs its calls as ever.
  virtual std::optional<double> secondsPerCall(Collective c, const Layout& l, DataType type,
                                               RedOp op, int root, const void* send, void* recv,
                                               const Rotation& rotation, int warmup, int iters,
                                               int graphLaunches) = 0;
};

// MPI's own collectives over MPI_COMM_WORLD (one rank per process); nullptr in a build without
// MPI.
std::unique_ptr<Peer> makeMpiPeer();

// --compare nccl: this rank's NCCL peer, on its device buffers and stream, or (peer null) why
// there is none where that is a fact of the run rather than an error (ranks sharing a GPU, which
// NCCL refuses). Every rank calls it; `control` carries rank 0's NCCL id.
struct NcclJoin {
  std::unique_ptr<Peer> peer;
  std::string why;          // when peer is null
  std::string description;  // "NCCL 2.28.3 (/path/libnccl.so.2)"
};
Result<NcclJoin> joinNccl(Control& control, void* stream, int rank, int nranks,
                          const std::string& host, const std::string& busId);
// Whether this weft-perf was built with NCCL (CMake found nccl.h and libnccl).
bool ncclBuilt();

}  // namespace weft::perf
