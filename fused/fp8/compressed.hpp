// Compressed collectives (weft.h's weftAllReduceEx, weftReduceScatterEx, weftAllGatherEx): what
// crosses between ranks is the fp8 codec's bytes (codec.hpp), every reduction adds decoded values
// in f32 in rank order, and each value is quantized at most once per stage: reduce-scatter
// quantizes the inputs, all-gather the values it gathers, all-reduce both (its inputs, then each
// rank's reduced share, encoded from the f32 sums). The same steps on host and GPU memory:
//   encode every rank's share -> all-to-all of the encoded shares -> decode and sum
//   [all-reduce: encode the sums -> all-gather -> decode]
// with the communicator's own all-to-all and all-gather on the encoded bytes, so whatever
// transport and algorithm those pick carries them. docs/algorithms-fused.md, "Compressed
// collectives".
#pragma once

#include <cstddef>

#include "src/core/communicator.hpp"
#include "weft/weft.h"

namespace weft::fused::fp8 {

struct CompressedCall {
  Collective coll = Collective::allReduce;
  const void* send = nullptr;
  void* recv = nullptr;
  std::size_t count = 0;  // as the call takes it
  DataType type = DataType::f32;
  RedOp op = RedOp::sum;
  void* stream = nullptr;
};

// Runs `call` through `compression` where the communicator's selector picks that (or where
// compression.always), otherwise as it is. `asked`: the caller passed the compression (one that
// cannot serve the call is then an error); else it is the communicator's default, which serves
// the calls it can.
Status runCompressible(Communicator& comm, const CompressedCall& call,
                       const weftCompression& compression, bool asked);
// The plan such a call gets ("compressed" with Plan::codec set, or the call's own plan).
Result<algo::Plan> planCompressible(Communicator& comm, Collective coll, std::size_t count,
                                    DataType type, bool gpu, const weftCompression& compression);

}  // namespace weft::fused::fp8
