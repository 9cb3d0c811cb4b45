// Ulysses's exchange (ulysses.cu): rows of up to four tensors [tokens, u · heads, dim] and f32
// values of up to two [u · heads, tokens], between this rank's tokens (every head) and the head
// shards of its group's share ([u · tokens, heads, dim] and [heads, u · tokens], the tokens of
// the group's u ranks at their places in the share, ring_plan.hpp's zigzag over u), one
// all-to-all of the group each way, packed and unpacked by a copy kernel.
#pragma once

#include <cstddef>
#include <cstdint>

#include "src/core/communicator.hpp"

namespace weft::fused::attention {

struct HeadExchange {
  static constexpr int kRows = 4, kValues = 2;
  struct Rows {
    void* local = nullptr;
    void* share = nullptr;
    int heads = 0;  // a shard's
  };
  struct Values {
    float* local = nullptr;
    float* share = nullptr;
  };
  Rows rows[kRows];
  Values values[kValues];
  int rowTensors = 0, valueTensors = 0;
  int valueHeads = 0;        // the values' heads a shard
  std::size_t rowBytes = 0;  // of a head's row: dim values, a multiple of 16
  // This rank's sequences: offsets into its tokens (device memory); toHeads writes the share's
  // (u times them) to shareCu if it is set.
  int sequences = 0;
  const std::int32_t* cu = nullptr;
  std::int32_t* shareCu = nullptr;
  std::size_t tokens = 0;
};

Status toHeads(Communicator& group, const HeadExchange& e, std::byte* send, std::byte* recv,
               void* stream);
Status fromHeads(Communicator& group, const HeadExchange& e, std::byte* send, std::byte* recv,
                 void* stream);

Status loadHeadKernels();  // by loadAttentionKernels

}  // namespace weft::fused::attention
