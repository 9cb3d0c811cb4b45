// Partial attention results merged by their log-sum-exp (the ring's step results, or any split
// of the keys): with o, l the output and log-sum-exp so far and o_b, l_b a block's,
//   l' = log(e^l + e^l_b),   o' = e^(l − l') · o + e^(l_b − l') · o_b,
// in f32; a row whose l_b is −inf (no key attended) keeps its o and l.
#pragma once

#include <cstddef>

#include "weft/status.hpp"
#include "weft/types.hpp"

namespace weft::fused::attention {

// Rows are (token, head) pairs: out and blockOut [tokens, heads, dim], lse and blockLse
// [heads, tokens] (flash-attention's varlen layouts).
struct MergeShape {
  std::size_t tokens = 0, heads = 0, dim = 0;
  std::size_t lseStride = 0;  // of mergeOnDevice's lse rows (a head's), if not `tokens`
  bool fresh = false;         // mergeOnDevice: out and lse hold nothing yet (written, not read)
};

// Partial results of no key yet: out 0, lse −inf (rows: tokens · heads).
Status resetPartials(float* out, float* lse, const MergeShape& shape, void* stream);
// out of `type` (bf16 or f16) from the f32 partials.
Status finishPartials(void* out, const float* partials, DataType type, const MergeShape& shape,
                      void* stream);

// out (f32) and lse take in blockOut (bf16, f16 or f32) and blockLse, on `stream`.
Status mergeOnDevice(float* out, float* lse, const void* blockOut, const float* blockLse,
                     DataType type, const MergeShape& shape, void* stream);

Status loadMergeKernels();  // by loadAttentionKernels

}  // namespace weft::fused::attention
