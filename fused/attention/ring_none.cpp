// runRing and runRingBackward in builds without CUDA: ring attention needs a GPU.
#include "fused/attention/ring.hpp"

namespace weft::fused::attention {

Status runRing(Communicator&, const RingCall& x) {
  if (Status s = checkRing(x); !s) return s;
  return Status(Code::unsupported, "ring attention needs a build with CUDA");
}

Status runRingBackward(Communicator&, const RingCall& x, const RingGrads& g) {
  if (Status s = checkRingBackward(x, g); !s) return s;
  return Status(Code::unsupported, "ring attention needs a build with CUDA");
}

}  // namespace weft::fused::attention
