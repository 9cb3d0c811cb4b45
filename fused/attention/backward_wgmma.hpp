// The backward pass on Hopper's warpgroup products (backward_wgmma.cu), which backward_mma.cu's
// attendBackwardOnDevice runs where local_wgmma.hpp's forward runs.
#pragma once

#include "fused/attention/backward.hpp"
#include "weft/status.hpp"

namespace weft::fused::attention {

Status loadWgmmaBackwardKernels();
Status attendBackwardWgmma(const LocalBackward& b, void* stream);  // checked by the caller

}  // namespace weft::fused::attention
