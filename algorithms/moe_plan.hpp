// Mixture-of-experts dispatch and combine as the selector prices them: each rank's tokens go to
// the ranks holding their top-k experts (a token once per rank, whatever its experts there),
// and the experts' outputs come back the same way. The routing decides the bytes: which rank
// sends how many tokens to which, and the busiest rank sets the pace. From a routing table
// (routeTokens) or a simulated distribution (simulateRouting: uniform or Zipf-skewed experts).
// docs/algorithms-fused.md, "MoE dispatch and combine".
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "weft/status.hpp"

namespace weft::algo {

// An expert-parallel layer: `experts` spread evenly over the ranks (rank r holds experts
// r·L … r·L + L − 1, L = experts / nranks), every token routed to `topk` of them; `tokens` a
// rank. A token's bytes: `dispatchBytes` on the way out (hidden · 2 in bf16; hidden + hidden /
// 128 · 4 in fp8 with its scales), `combineBytes` back.
struct MoeShape {
  std::size_t tokens = 0, hidden = 0;
  int topk = 1, experts = 1, nranks = 1;
  std::size_t dispatchBytes = 0, combineBytes = 0;
  int localExperts() const { return experts / nranks; }
  int rankOf(int expert) const { return expert / localExperts(); }
  // The shape's token bytes for hidden values of bf16, or fp8 with one f32 scale per 128.
  static MoeShape of(std::size_t tokens, std::size_t hidden, int topk, int experts, int nranks,
                     bool fp8Dispatch);
};
// Experts the ranks divide, top-k within 1 … experts, a hidden size.
Status checkMoeShape(const MoeShape& s);

// One rank's routing: for each destination rank, its tokens in order (each once); the slots
// routed to each expert (every rank's experts); the slots dropped (index −1).
struct RankRoute {
  std::vector<std::size_t> offsets;  // nranks + 1: destination q's tokens are
  std::vector<std::int32_t> tokens;  // tokens[offsets[q] … offsets[q + 1])
  std::vector<std::size_t> perExpert;
  std::size_t dropped = 0;
  std::size_t toRank(int q) const { return offsets[q + 1] - offsets[q]; }
};
// From topkIdx [tokens, topk] (−1: dropped); an index outside [−1, experts), or a token's
// expert twice, is an error naming the token.
Result<RankRoute> routeTokens(const MoeShape& s, const std::int64_t* topkIdx);

// Where ranks span hosts: the rails (a rank's index among its host's ranks) that the
// hierarchical path sends along. Only where every host has the same number of ranks.
struct Rails {
  int hosts = 1, perHost = 1;
  std::vector<int> hostOf, localOf;  // by rank
  std::vector<int> rankAt;           // [h · perHost + l]: host h's rank of rail l
  // The rank of `rank`'s rail on `host`.
  int peer(int rank, int host) const {
    return rankAt[static_cast<std::size_t>(host * perHost +
                                           localOf[static_cast<std::size_t>(rank)])];
  }
  // From each rank's host (numbered from 0); none (nullopt) unless every host has as many ranks
  // and there are two hosts or more.
  static std::optional<Rails> of(const std::vector<int>& hostOf);
};
// Every rank's traffic: tokens[s · n + q] the tokens rank s sends rank q (s = q: stays), and
// the slots each expert takes.
struct MoeTraffic {
  int nranks = 1;
  std::vector<std::size_t> tokens;
  std::vector<std::size_t> perExpert;
  // Across hosts (Rails): toHost[s · hosts + h] the tokens rank s sends host h, each once.
  std::optional<Rails> rails;
  std::vector<std::size_t> toHost;
  std::size_t sentBy(int s) const;      // to other ranks
  std::size_t receivedBy(int q) const;  // from other ranks
  // The busiest rank's tokens crossing it one way (sent or received), and that over the mean.
  std::size_t busiest() const;
  double skew() const;
};
MoeTraffic trafficOf(const std::vector<RankRoute>& ranks);

// The tokens of a routing table that go to each host, in token order: a token once per host
// however many of its experts live there (the hierarchical path's network rows).
struct HostRoute {
  std::vector<std::size_t> offsets;  // hosts + 1: host h's tokens are
  std::vector<std::int32_t> tokens;  // tokens[offsets[h] … offsets[h + 1])
  std::size_t toHost(std::size_t h) const { return offsets[h + 1] - offsets[h]; }
};
HostRoute routeToHosts(const MoeShape& s, const std::int64_t* topkIdx, const Rails& rails);

// How the simulated tokens pick their experts: uniformly, or by a Zipf law of exponent `alpha`
// over the experts (expert popularity ranked in a seeded random order).
struct Routing {
  bool zipf = false;
  double alpha = 1.0;
  std::uint64_t seed = 1;
};
// "uniform" or "zipf:ALPHA"; an error names them.
Result<Routing> parseRouting(std::string_view text);
// Every rank's tokens routed to top-k distinct experts as `r` says; across `rails`' hosts,
// with the tokens each rank sends each host.
MoeTraffic simulateRouting(const MoeShape& s, const Routing& r,
                           const std::optional<Rails>& rails = std::nullopt);

struct MoePlan {
  double dispatchUs = 0, combineUs = 0;
  // Across hosts: each token once per host over the network to the rank of its rail there,
  // which forwards it to the host's ranks (DeepEP's network-then-NVLink), rather than once
  // per rank straight from its owner.
  bool hierarchical = false;
  double flatUs = 0, hierarchicalUs = 0;  // dispatch + combine each way (0: not priced)
  std::size_t busiestBytes = 0;           // dispatch: the busiest rank's bytes one way
  double skew = 1;
  std::string reason;
};

// On GPU memory (fused/moe/device.cu): the mode and the channels. Normal runs its steps each as
// a kernel: the senders lay the tokens out and the receivers count and place each expert's rows,
// or (the table) the senders number each expert's rows and the receivers place them from a table
// of the counts. Low latency runs one kernel each way and half, from the table, limited to
// kLowLatency* below and to the blocks that may wait on peers at once. Channels: the thread
// blocks of each copy kernel, the fewest within 2 % of the fastest (the rest of the GPU stays
// free for work the caller overlaps).
struct MoeGpuPlan {
  bool lowLatency = false;
  // Placed from the table of the senders' counts (low latency; normal mode where it fits and is
  // cheaper), or counted and placed by a block per local expert.
  bool table = false;
  int channels = 1;
  double dispatchUs = 0, combineUs = 0;   // the pick's
  double normalUs = 0, lowLatencyUs = 0;  // each mode's best, dispatch + combine (0: not offered)
  std::string reason;
};
// What the low-latency mode takes: local experts, and the [ranks, local experts] table.
inline constexpr int kMoeLowLatencyMaxLocal = 64;
inline constexpr int kMoeLowLatencyMaxTable = 4096;
// Whether the receivers place rows from a table of the senders' counts (low latency; normal
// mode too where it fits): n ranks of L experts each.
inline bool moeTableFits(int n, int L) {
  return L <= kMoeLowLatencyMaxLocal && n * L <= kMoeLowLatencyMaxTable;
}

}  // namespace weft::algo
