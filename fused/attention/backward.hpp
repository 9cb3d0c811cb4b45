// The backward pass of weft's attention kernel (local.hpp) on one rank's tokens: one piece's
// (ring step's) gradients of q, k and v, added into f32 sums, from the FINAL log-sum-exp and
// delta of each row, so that the ring's steps sum to the whole attention's gradients. On the
// tensor cores (backward_mma.cu; delta in merge.cu), no atomics: the sums' order is fixed.
#pragma once

#include <cstddef>
#include <cstdint>

#include "fused/attention/ring_plan.hpp"
#include "weft/status.hpp"
#include "weft/types.hpp"

namespace weft::fused::attention {

struct LocalBackward {
  // The forward's inputs (LocalAttention's meaning): q [tokensQ, heads, dim]; k and v
  // [tokensK, kvHeads, dim], of `type` (bf16 or f16); cuSeqlensQ/K: sequences + 1 offsets each,
  // in device memory; maxSeqlenQ/K the longest; the piece's parts and mask.
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const std::int32_t* cuSeqlensQ = nullptr;
  const std::int32_t* cuSeqlensK = nullptr;
  int sequences = 0;
  std::size_t tokensQ = 0, tokensK = 0, maxSeqlenQ = 0, maxSeqlenK = 0;
  int heads = 0, kvHeads = 0, dim = 0;  // heads a multiple of kvHeads; dim 64 or 128
  DataType type = DataType::bf16;
  float scale = 1;  // of q · k
  Piece piece;
  const void* dOut = nullptr;    // [tokensQ, heads, dim] of type: the loss's gradient by out
  const float* lse = nullptr;    // [heads, tokensQ]: the final log-sum-exp (over every piece)
  const float* delta = nullptr;  // [heads, tokensQ]: rowsum(dOut ∘ out) of the final out
  // Added into (+=), f32: dq [tokensQ, heads, dim]; dk and dv [tokensK, kvHeads, dim] (a K/V
  // head's sum over its group's query heads). Rows and keys the piece does not cover: untouched.
  float* dq = nullptr;
  float* dk = nullptr;
  float* dv = nullptr;
  bool portable = false;  // mma.sync's kernels where Hopper's would run (tests)
};

// What a call checks before it runs: pointers, a dim it has a kernel for, heads that group.
Status checkBackward(const LocalBackward& b);

// delta[h, t] = Σ_c dOut[t, h, c] · out[t, h, c] in f32; out and dOut [tokens, heads, dim] of
// `type` (bf16 or f16).
Status computeDelta(const void* out, const void* dOut, DataType type, std::size_t tokens, int heads,
                    int dim, float* delta, void* stream);

// Adds one piece's gradients: with P = exp(scale · q·k − lse) over the piece's (query, key)
// pairs (masked pairs 0; rows of lse −inf 0), dv += Pᵀ dOut; dP = dOut vᵀ;
// dS = P ∘ (dP − delta); dq += scale · dS k; dk += scale · dSᵀ q.
Status attendBackwardOnDevice(const LocalBackward& b, void* stream);
Status loadBackwardKernels();  // by loadAttentionKernels

}  // namespace weft::fused::attention
