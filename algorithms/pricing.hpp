// What an algorithm's estimate is made of (CostModel::estimate, docs/algorithms.md "Costs"): the
// call's terms on a rank graph for one protocol, the helpers every estimate shares, and the parts
// an algorithm's Algorithm::price fills in. The model adds what every algorithm pays alike: host
// folding, a shared device's memory traffic, and the pipelined passes.
#pragma once

#include <string_view>
#include <utility>
#include <vector>

#include "algorithms/cost_model.hpp"

namespace weft::algo {

// GB/s in bytes per us.
inline constexpr double kBytesPerUsPerGBs = 1e3;
// The part of an exchange round across hosts (the smaller of its latency and its bytes on the
// NIC) that ranks sharing a NIC hide behind each other's transfers (pairwise, hierarchical).
// The replays bracket it: 1/2 fluid, 1/8 three passes; 1/4 picks what both rank first at the
// PCIe servers' crossovers (docs/perf.md, "The fluid replay, and drift on shared NICs").
inline constexpr double kDriftHidden = 0.25;
// Both ends' CPU work for a message, in calibrated overheads (the larger end's): 2 put ring's 256
// KB all-reduce 45 % above its time over the TCP lanes of the namespace hosts; 1.5 kept every
// pick of those hosts' forced sweeps, over UCX and over the lanes, the fastest forced but where
// rounds disagreed (docs/perf-hosts.md, "the regret").
inline constexpr double kBothEnds = 1.5;

class Pricing {
 public:
  Pricing(const CostModel& model, std::string_view algorithm, Collective coll, std::size_t bytes,
          Protocol proto, const RankGraph& g);

  // The call.
  const CostModel& model;
  const CostConstants& c;
  const RankGraph& g;
  const std::string_view algorithm;
  const Collective coll;
  const std::size_t bytes;
  const Protocol proto;
  const std::size_t p;        // proto as an index
  const double eff;           // the protocol's bandwidth efficiency
  const std::size_t nv, net;  // the link classes inside a host and between hosts
  // The terms: base, per-hop latencies (us), per-message overheads (us), bandwidths (bytes/us).
  double base, aIntra, aNet, oIntra, oNet, bwIntra, bwNet;
  const double S;
  const int n, G, N;
  const bool multi;             // several hosts
  const bool sharedNic;         // across hosts, ranks of a host share a NIC
  double aStep, oStep, bwStep;  // a step that involves every rank: its latency, posting, rate
  double bwAlone;               // one rank's message with the links to itself
  int channels = 1;
  std::size_t chunk = 1;

  // What the algorithm fills in: hop latencies, postings, bytes over the links; in the pipelined
  // passes the busiest link's time alone where the phases overlap (`overlapped`, negative: they
  // stay in series) and a rank's own transfers with nobody else on the links (`alone`, negative:
  // not known apart from `bw`); PAT's aggregation.
  double lat = 0, post = 0, bw = 0, overlapped = -1, alone = -1;
  int aggregation = 0;
  double passCount = 1;  // the most slices any message is cut into: the pipeline's passes

  // A pattern's per-flow bandwidth inside a host (GB/s) as bytes per us at this protocol.
  double pat(double gbs) const { return gbs * c.bandwidthScale[nv] * eff * kBytesPerUsPerGBs; }
  // A message's time on its rank's NIC.
  double onNic(double message) const { return message / std::min(bwIntra, bwNet); }
  // What ranks sharing a NIC hide of `rounds` exchange rounds across hosts, each moving
  // `roundBytes` a rank (pairwise, hierarchical; kDriftHidden).
  double drift(double rounds, double roundBytes) const {
    return sharedNic ? rounds * std::min(aNet, onNic(roundBytes)) * kDriftHidden : 0.0;
  }
  // The per-flow rate of a shift by d inside a host (1e300: no flow stays inside).
  double shift(int d) const;
  // The slices a message of msgBytes is cut into (each a message of its own, its posting
  // repeated); raises passCount.
  double slices(double msgBytes);
  // A pairwise exchange inside a host, `block` bytes to each of the G-1 others: one pass runs the
  // rounds one after another, each as slow as its most contended link (the matching pattern);
  // once several passes are in flight every round is busy at once (the all-pairs pattern).
  double together(double block) const { return G < 2 ? 0.0 : block / pat(g.allPairsBw); }
  double exchange(double block, double passes) const;
  // Rounds in which rank r sends to r + d and waits for r - d (Bruck, PAT) across hosts: the
  // critical path over local indices; adds its hop latencies, postings and transfers.
  void shiftRounds(const std::vector<std::pair<int, double>>& rounds, double passes);
  // The same rounds on one host or across hosts: inside one host each is a step at the shift's
  // per-flow rate (Bruck, linear on GPUs).
  void shifts(const std::vector<std::pair<int, double>>& rounds, double passes);
  // The error of an algorithm with no estimate for this collective.
  Status unsupportedHere() const;
};

// One-shot's and two-shot's estimate (oneshot.cpp and twoshot.cpp).
Status priceAllPairs(Pricing& P, bool one);

}  // namespace weft::algo
