// Context-parallel attention (fused/attention) as the selector prices it: ring attention (K/V
// blocks around the ring, each step's transfer under the step's attention), Ulysses (all-to-all
// from sequence to head sharding, attention of the whole sequences on a rank's heads, and back),
// or the hybrid of the two (Ulysses within groups of consecutive ranks, the ring across them).
// docs/algorithms-fused.md, "Ring attention", "Ulysses" and "Hybrid".
#pragma once

#include <cstddef>
#include <string>

#include "algorithms/tuner.hpp"

namespace weft::algo {

// One rank's share: `tokens` of every sequence (zigzag, the same on every rank), heads and K/V
// heads of `dim` values of `valueBytes`.
struct AttentionShape {
  std::size_t tokens = 0;
  int heads = 1, kvHeads = 1, dim = 128;
  std::size_t valueBytes = 2;
  bool causal = false;
  bool backward = false;
  int nranks = 1;
  bool cudnn = false;  // cuDNN's kernel loads here and covers the shape (forward, one sequence)
  // The attention's multiply-adds of one rank, as FLOPs (4 per query-key pair and dim; the
  // causal mask's half; backward 2.5 times).
  double rankFlops() const;
  // Ulysses over groups of u ranks gives each rank heads / u of both kinds.
  bool headsSplit(int u) const { return u >= 1 && heads % u == 0 && kvHeads % u == 0; }
};

enum class CpAlgo : std::uint8_t { ring, ulysses, hybrid };
std::string_view name(CpAlgo a);
// "ring", "ulysses", "hybrid"; an error names them.
Result<CpAlgo> parseCpAlgo(std::string_view text);

// The local attention kernel: weft's own, or cuDNN's fused flash attention.
enum class AttentionKernel : std::uint8_t { weft, cudnn };
std::string_view name(AttentionKernel k);
// "weft", "cudnn"; an error names them.
Result<AttentionKernel> parseAttentionKernel(std::string_view text);

struct AttentionPlan {
  CpAlgo algo = CpAlgo::ring;
  AttentionKernel kernel = AttentionKernel::weft;
  // Ulysses's group: u consecutive ranks exchange heads (1: the ring alone; nranks: Ulysses
  // alone), and the n / u groups run the ring.
  int group = 1;
  double estimateUs = 0;
  double ringUs = 0, ulyssesUs = 0, hybridUs = 0;  // 0: not a candidate
  double attentionUs = 0;                          // the kernels alone
  std::string reason;
};

}  // namespace weft::algo
