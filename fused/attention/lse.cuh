// The log-sum-exp merge's weights (merge.hpp's rule), shared by the merge kernel and the
// attention kernel's fused merge.
#pragma once

#include <cmath>

namespace weft::fused::attention {

// Partials so far of log-sum-exp `old` (−inf: none) taking in a block's `block` (finite): the
// merged log-sum-exp and the weights of the old and the new output.
struct LseMerge {
  float merged, keep, take;
};
__device__ inline LseMerge mergeLse(float old, float block) {
  if (old == -INFINITY) return {block, 0.0f, 1.0f};
  const float hi = fmaxf(old, block);
  const float merged = hi + log1pf(expf(fminf(old, block) - hi));
  return {merged, expf(old - merged), expf(block - merged)};
}

}  // namespace weft::fused::attention
