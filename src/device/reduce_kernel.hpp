// Element-wise reduction of two device buffers: the arithmetic inside every recvReduce* step of
// the CUDA executor. Host-callable; no CUDA headers needed to include it.
#pragma once

#include <cstddef>

#include "weft/status.hpp"
#include "weft/types.hpp"

namespace weft::device {

// dst[i] = a[i] (op) b[i] for i < count, enqueued on `stream` (a cudaStream_t; nullptr is the
// default stream). Half and fp8 types compute in fp32 and round to nearest even on store
// (fp8 saturates to the largest finite value). dst may alias a or b. Ops: sum, prod, min, max;
// avg is a sum followed by a scale, which the executor applies once at the end.
Status reduce(void* dst, const void* a, const void* b, std::size_t count, DataType type, RedOp op,
              void* stream = nullptr);

}  // namespace weft::device
