// Context-parallel attention's layout and ring schedule, without a GPU: zigzag (load-balanced)
// sharding of each sequence among the ranks, and which part of its queries each rank attends to
// which part of the K/V block it holds at each ring step (docs/algorithms-fused.md, "Ring
// attention").
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "weft/status.hpp"

namespace weft::fused::attention {

// Zigzag sharding of a sequence of `length` tokens among n ranks: 2n chunks of length / 2n;
// rank r holds chunk r, then chunk 2n − 1 − r (its local tokens: the two chunks in that order),
// so that under a causal mask every rank's share of the work is the same.
struct Zigzag {
  std::size_t length = 0, chunk = 0;
  int nranks = 1;
  // A length that 2n divides (any for one rank, whose local order is the sequence's).
  static Result<Zigzag> of(std::size_t length, int nranks);
  // The global indices of rank r's first and second chunk's first token.
  std::array<std::size_t, 2> starts(int rank) const;
  // The global position of rank r's local token i (what RoPE needs).
  std::size_t position(int rank, std::size_t local) const;
};

// Packed sequences (flash-attention's varlen layout): `cuSeqlens` holds sequences + 1 offsets
// into the packed tokens, each sequence zigzagged on its own. Writes rank r's offsets into its
// packed local tokens (sequences + 1 values) and the global position of each local token.
Status zigzagLocal(const std::int32_t* cuSeqlens, int sequences, int nranks, int rank,
                   std::int32_t* localCuSeqlens, std::int32_t* positions);

// Which local tokens of a rank's share take part in one attention: all of them, or the first
// or second chunk of each sequence.
enum class Part : std::uint8_t { all, first, second };

// One attention of a ring step: the rank's queries of `q` against the held block's keys of
// `kv`, with the causal mask in local token order or none.
struct Piece {
  Part q = Part::all, kv = Part::all;
  bool causal = false;
};

// Step s < n of the ring on `rank`: it holds the K/V block of rank (rank − s) mod n. Without a
// mask every step attends everything. Causal with zigzag: step 0 is the local block under the
// causal mask (local order is global order there); a block from a lower rank is attended by every
// query through its first chunk only; one from a higher rank by the second chunk's queries only,
// through both chunks; each the same number of query-key pairs.
Piece ringStep(int rank, int step, int nranks, bool causal);

// The query-key pairs a piece computes for one sequence whose local share is 2 · chunk tokens
// (a causal square counts its diagonal).
std::size_t pairs(const Piece& p, std::size_t chunk);

}  // namespace weft::fused::attention
