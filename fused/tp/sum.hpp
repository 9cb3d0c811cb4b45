// The fused GEMM + reduce-scatter's last step: the sum of the partial blocks every rank copied
// into this rank's shared buffer, in rank order, accumulated in f32 and rounded once.
#pragma once

#include <cstddef>

#include "weft/status.hpp"
#include "weft/types.hpp"

namespace weft::fused::tp {

// out[i] = sum over b < count of blocks[b · values + i], i < values (bf16, f16 or f32).
// Loads the kernel of every type (before any flag kernel spins: see flags.hpp).
Status loadSumKernels();
Status sumBlocks(void* out, const void* blocks, int count, std::size_t values, DataType type,
                 void* stream);

}  // namespace weft::fused::tp
