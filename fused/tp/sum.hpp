// The fused GEMM + reduce-scatter's last step: the sum of the partial blocks every rank copied
// into this rank's shared buffer, in rank order, accumulated in f32 and rounded once.
#pragma once

#include <cstddef>

#include "fused/tp/device_list.hpp"
#include "weft/status.hpp"
#include "weft/types.hpp"

namespace weft::fused::tp {

// Blocks of `values` values anywhere: in this rank's buffer, or in peers' on its device.
using BlockList = DeviceList<const void*>;

// out[i] = sum over b < count of blocks[b · values + i], i < values (bf16, f16 or f32).
// Loads the kernel of every type (before any flag kernel spins: see flags.hpp).
Status loadSumKernels();
Status sumBlocks(void* out, const void* blocks, int count, std::size_t values, DataType type,
                 void* stream);
// out[i] = sum over the list's blocks, in its order, of block[i].
Status sumBlocks(void* out, const BlockList& blocks, std::size_t values, DataType type,
                 void* stream);

}  // namespace weft::fused::tp
