// The compressed all-reduce as one kernel on the direct kernels' slabs (compressed_kernel.cu):
// for ranks that share a host's GPUs (CUDA IPC), launched through CudaExecutor::directWith.
#pragma once

#include <cstddef>

#include "fused/fp8/codec.hpp"
#include "src/device/schedule_kernel.hpp"

namespace weft::fused::fp8 {

// The most elements a block may take a round so that every rank's piece, encoded, fits in a
// slab of `slabBytes` (a multiple of nranks * codec.block; 0: none fits).
std::size_t compressedTwoShotMostElems(const Codec& codec, std::size_t slabBytes, int nranks);
// Launches the kernel on `blocks` blocks (a.directShareElems elements each a round); `divisor`
// the rank count for avg, else 1.
Status launchCompressedTwoShot(const device::LaunchArgs& a, int blocks, const Codec& codec,
                               DataType type, float divisor, void* stream);

}  // namespace weft::fused::fp8
