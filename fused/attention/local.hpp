// weft's own attention kernel on one rank's tokens, packed (varlen) sequences, for the ring's
// steps: queries of one part of each sequence against keys of one part of each, under the causal
// mask or none, with the log-sum-exp, writing the result or merging it into f32 partial results
// (merge.hpp's rule). On the tensor cores (local.cu).
#pragma once

#include <cstddef>
#include <cstdint>

#include "algorithms/attention_plan.hpp"
#include "fused/attention/ring_plan.hpp"
#include "weft/status.hpp"
#include "weft/types.hpp"

namespace weft::fused::attention {

struct LocalAttention {
  // q [tokensQ, heads, dim], k and v [tokensK, kvHeads, dim], of `type` (bf16 or f16);
  // cuSeqlensQ/K: sequences + 1 offsets each, in device memory; maxSeqlenQ the longest.
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const std::int32_t* cuSeqlensQ = nullptr;
  const std::int32_t* cuSeqlensK = nullptr;
  int sequences = 0;
  std::size_t tokensQ = 0, maxSeqlenQ = 0;
  int heads = 0, kvHeads = 0, dim = 0;  // heads a multiple of kvHeads; dim 64 or 128
  DataType type = DataType::bf16;
  float scale = 1;  // of q · k
  // Which part of each sequence's queries and keys (halves: ring_plan.hpp), and the mask: key
  // j of the part attends query i of its part where j ≤ i.
  Piece piece;
  // out [tokensQ, heads, dim] and lse [heads, tokensQ]: written (out of `type`, rows of no key
  // 0 with lse −inf), or with `merge` out in f32 and the result merged in.
  void* out = nullptr;
  float* lse = nullptr;
  bool merge = false;
  bool fresh = false;  // merging, cuDNN's: the partials hold nothing yet (written, not read)
  // weft's kernel, or cuDNN's where it covers the shape (cudnn.hpp), whose part's output and
  // workspace take `scratch`.
  algo::AttentionKernel kernel = algo::AttentionKernel::weft;
  void* scratch = nullptr;
  std::size_t scratchBytes = 0;
  // weft's kernel on mma.sync, which GPUs other than Hopper run, where Hopper's would (tests).
  bool portable = false;
};

// What a call checks before it runs: pointers, a dim it has a kernel for, heads that group.
Status checkLocal(const LocalAttention& a);
Status attendOnDevice(const LocalAttention& a, void* stream);
// Loads every attention kernel (forward, backward, merges, Ulysses's exchange) before a rank's
// first call waits on a peer: lazily loaded, a kernel's first launch could wait for a peer's
// spinning transfer, which waits for this rank (../shared/DEVICE.md).
Status loadAttentionKernels();

}  // namespace weft::fused::attention
