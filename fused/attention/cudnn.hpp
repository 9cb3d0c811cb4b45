// cuDNN's fused flash attention as the local kernel (forward): cuDNN's graph of Q·Kᵀ, scale,
// causal mask, softmax with its natural-log log-sum-exp, and P·V, built through its backend API,
// planned once a shape a thread. libcudnn is loaded with dlopen at the first call, so libweft
// needs no cuDNN to load and builds without its headers still run weft's own kernel.
#pragma once

#include <cstddef>

#include "fused/attention/local.hpp"
#include "weft/status.hpp"

namespace weft::fused::attention {

// What cuDNN's attention takes of a call's scratch for its own workspace at most (plans that
// need more are passed over).
constexpr std::size_t kCudnnWorkspaceBytes = std::size_t{1} << 20;

// Whether cuDNN loads here (tried once a process); the reason when not.
Status cudnnAvailable();

// Whether cuDNN's graph covers `a`: one sequence (not packed), dim 64 or 128, bf16 or f16, and
// a causal piece of equal query and key parts (the square's top-left mask).
bool cudnnCovers(const LocalAttention& a);

// The scratch a call needs: a merging call's part's output (2-byte values) and log-sum-exp,
// 256-byte aligned each, then kCudnnWorkspaceBytes. Inline: the ring's workspace (built without
// CUDA too) reserves it.
inline std::size_t cudnnAligned(std::size_t bytes) {
  return (bytes + 255) / 256 * 256;
}
inline std::size_t cudnnScratchBytes(const LocalAttention& a) {
  const std::size_t rows = a.tokensQ * static_cast<std::size_t>(a.heads);
  const std::size_t part =
      a.merge ? cudnnAligned(rows * static_cast<std::size_t>(a.dim) * 2) + cudnnAligned(rows * 4)
              : 0;
  return part + kCudnnWorkspaceBytes;
}

// a on `stream` through cuDNN: written, or (a.merge) into a.scratch and merged into the f32
// partials (merge.hpp); `mergeToo` false leaves the partials alone (a first run that loads
// cuDNN's kernels before any peer waits on the GPU).
Status attendWithCudnn(const LocalAttention& a, void* stream, bool mergeToo = true);

}  // namespace weft::fused::attention
