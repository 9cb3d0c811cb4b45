// runTp in builds without CUDA: the tensor-parallel operations need a GPU.
#include "fused/tp/overlap.hpp"

namespace weft::fused::tp {

Status runTp(Communicator& comm, const TpCall& x) {
  if (Status s = checkTp(x, comm.size(), gemmStreams(comm.config(), x.op)); !s) return s;
  return Status(Code::unsupported, "the tensor-parallel operations need a build with CUDA");
}

}  // namespace weft::fused::tp
