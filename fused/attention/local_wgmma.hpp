// weft's attention kernel on Hopper's warpgroup products (local_wgmma.cu), which local.cu's
// attendOnDevice runs where the device is sm_90 and the build has sm_90a code
// (WEFT_WGMMA_ATTENTION); mma.sync's kernel everywhere else.
#pragma once

#include "fused/attention/local.hpp"
#include "weft/status.hpp"

namespace weft::fused::attention {

bool wgmmaAttention();  // the current device runs it
Status loadWgmmaAttentionKernels();
Status attendWgmma(const LocalAttention& a, void* stream);  // checked by attendOnDevice

}  // namespace weft::fused::attention
