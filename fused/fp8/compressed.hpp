// Compressed collectives on host memory (issue 34's first step; the GPU path and the selector's
// candidates come next): what crosses between ranks is the fp8 codec's bytes (codec.hpp), every
// reduction adds decoded values in f32 in rank order, and each value is quantized at most once
// per stage: reduce-scatter quantizes the inputs, all-gather the values it gathers, all-reduce
// both (its reduce-scatter's inputs, then each reduced shard, encoded from the f32 sums).
// Sum and average only: scaled blocks cannot be multiplied or compared exactly. docs/algorithms.md,
// "FP8 codecs", gives the error bound.
#pragma once

#include <cstddef>

#include "fused/fp8/codec.hpp"
#include "weft/weft.h"

namespace weft::fused::fp8 {

// recv gets every rank's `sendcount` values, rank r's at r * sendcount.
Status compressedAllGather(weftComm_t comm, const Codec& codec, DataType type, const void* send,
                           void* recv, std::size_t sendcount);
// send holds size * recvcount values; recv gets this rank's share of their sum (or average).
Status compressedReduceScatter(weftComm_t comm, const Codec& codec, DataType type, RedOp op,
                               const void* send, void* recv, std::size_t recvcount);
// recv gets the sum (or average) of every rank's `count` values, the same bits on every rank.
Status compressedAllReduce(weftComm_t comm, const Codec& codec, DataType type, RedOp op,
                           const void* send, void* recv, std::size_t count);

}  // namespace weft::fused::fp8
