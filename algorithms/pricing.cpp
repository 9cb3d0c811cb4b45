#include "algorithms/pricing.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "algorithms/patterns.hpp"

namespace weft::algo {

Pricing::Pricing(const CostModel& m, std::string_view a, Collective cl, std::size_t b, Protocol pr,
                 const RankGraph& graph)
    : model(m),
      c(m.constants()),
      g(graph),
      algorithm(a),
      coll(cl),
      bytes(b),
      proto(pr),
      p(static_cast<std::size_t>(pr)),
      eff(c.bandwidthEfficiency[p]),
      nv(static_cast<std::size_t>(linkClassOf(graph.intraClass))),
      net(static_cast<std::size_t>(LinkClass::network)),
      S(double(b)),
      n(graph.nranks),
      G(graph.ranksPerHost),
      N(graph.hosts),
      multi(graph.hosts > 1),
      sharedNic(graph.hosts > 1 && graph.ranksPerNic > 1) {
  base = c.baseLatency[p];
  aIntra = c.hopLatency[p][nv];
  aNet = c.hopLatency[p][net] + g.fabricLatency;
  // A message's overhead is CPU work of its sender and its receiver, which overlap where each has
  // a core (the calibration's stream measures the larger). Where ranks outnumber the cores they
  // share, every rank posts at once and both ends take turns on the CPUs: kBothEnds o at the
  // share.
  const double perCore = graph.coresPerRank < 1 ? kBothEnds / graph.coresPerRank : 1;
  oIntra = c.messageOverhead[p][nv] * perCore;
  oNet = c.messageOverhead[p][net] * perCore;
  bwIntra = g.intraBandwidth * c.bandwidthScale[nv] * eff * kBytesPerUsPerGBs;
  bwNet = g.netPerRank * c.bandwidthScale[net] * eff * kBytesPerUsPerGBs;
  aStep = multi ? aNet : aIntra;
  CostModel::shape(proto, bytes, G, channels, chunk);
  oStep = multi ? oNet : oIntra;
  bwStep = multi ? std::min(bwIntra, bwNet) : bwIntra;
  bwAlone = multi ? std::min(bwIntra, g.netAlone * c.bandwidthScale[net] * eff * kBytesPerUsPerGBs)
                  : bwIntra;
  lat = base;
}

double Pricing::shift(int d) const {
  const int local = G > 0 ? d % G : 0;
  return local == 0 || g.shiftBw.empty() ? 1e300 : pat(g.shiftBw[static_cast<std::size_t>(local)]);
}

double Pricing::slices(double msgBytes) {
  const double m = std::max(1.0, std::ceil(msgBytes / channels / double(chunk)));
  passCount = std::max(passCount, m);
  return m;
}

double Pricing::exchange(double block, double passes) const {
  if (G < 2) return 0.0;
  const double rounds = (G - 1) * block / pat(g.matchingBw);
  return rounds / passes + (passes - 1) / passes * std::min(rounds, together(block));
}

void Pricing::shifts(const std::vector<std::pair<int, double>>& rounds, double passes) {
  if (multi) {
    shiftRounds(rounds, passes);
    return;
  }
  for (const auto& [d, moved] : rounds) {
    lat += aStep;
    post += passes * oStep;
    bw += moved / shift(d);
  }
}

void Pricing::shiftRounds(const std::vector<std::pair<int, double>>& rounds, double passes) {
  const double hopNet = c.hopLatency[p][net];
  // Before d reaches G only the last d ranks of a host cross to the next one, so a round is not
  // a network round for everyone: a rank goes on once its own send is out and its message from
  // r - d has landed; only that message pays the latency. Ranks a host apart live the same
  // timeline, so local indices suffice.
  auto sendCost = [&](int l, int d, double moved, bool withPosts, bool withBytes) {
    const bool across = d >= G || l + d >= G;
    // A graph built by hand may lack the mixed-shift figures: every flow at the step's rate.
    const bool mixedKnown = static_cast<std::size_t>(d) < g.shiftCrossBw.size() &&
                            static_cast<std::size_t>(d) < g.shiftInsideBw.size();
    const double rate =
        d >= G || !mixedKnown ? (across ? bwStep : shift(d))
        : !across             ? pat(g.shiftInsideBw[static_cast<std::size_t>(d)])
                              : std::min(bwIntra, g.shiftCrossBw[static_cast<std::size_t>(d)] *
                                                      c.bandwidthScale[net] * eff * kBytesPerUsPerGBs);
    return (withPosts ? passes * (across ? oNet : oIntra) : 0) + (withBytes ? moved / rate : 0);
  };
  auto latency = [&](int l, int d) {
    if (d < G && l + d < G) return aIntra;
    const int m = mod(l + d, G);
    const bool sameRail =
        static_cast<int>(g.nicOf.size()) < G ||
        g.nicOf[static_cast<std::size_t>(l)] == g.nicOf[static_cast<std::size_t>(m)];
    return hopNet + (sameRail ? 1 : 3) * g.switchLatency;
  };
  auto criticalPath = [&](bool withPosts, bool withBytes) {
    std::vector<double> ready(static_cast<std::size_t>(G), 0), next(ready.size());
    for (const auto& [d, moved] : rounds) {
      for (int l = 0; l < G; ++l) {
        const int src = mod(l - d, G);
        next[static_cast<std::size_t>(l)] = std::max(
            ready[static_cast<std::size_t>(l)] + sendCost(l, d, moved, withPosts, withBytes),
            ready[static_cast<std::size_t>(src)] + sendCost(src, d, moved, withPosts, withBytes) +
                latency(src, d));
      }
      std::swap(ready, next);
    }
    return *std::max_element(ready.begin(), ready.end());
  };
  const double hops = criticalPath(false, false), posted = criticalPath(true, false);
  lat += hops;
  post += posted - hops;
  bw += criticalPath(true, true) - posted;
}

Status Pricing::unsupportedHere() const {
  return unsupported(std::string(algorithm) + " has no estimate for " + std::string(name(coll)));
}

Status priceAllPairs(Pricing& P, bool one) {
  const Collective coll = P.coll;
  const bool blocks = coll == Collective::allGather || coll == Collective::reduceScatter ||
                      coll == Collective::allToAll;
  if (coll != Collective::allReduce && !(one && blocks)) return P.unsupportedHere();
  // The block collectives' one-shot is priced inside one host only: across hosts (n - G
  // messages a rank over the NICs at once) the simulator found it 1.1-3x slower than this model
  // said at 8 hosts (docs/perf.md, "One-shot for all-gather, reduce-scatter and all-to-all"), so
  // it is left to WEFT_ALGO there.
  if (blocks && P.multi) return P.unsupportedHere();
  const int n = P.n, G = P.G;
  // What goes to each peer: one-shot all-reduce's whole vector, a block otherwise.
  const double per = one && !blocks ? P.S : P.S / n;
  const double intra = G > 1 ? per / P.pat(P.g.allPairsBw) : 0;  // all G-1 flows at once
  const double inter = P.multi ? (n - G) * per / P.bwNet : 0;
  // Ranks short of a core each take turns on the CPUs between the copies inside the host and the
  // network's (docs/algorithms.md, "Costs").
  const double phase = P.g.coresPerRank < 1 ? intra + inter : std::max(intra, inter);
  const double passes = P.slices(per);
  const double posting = passes * ((G - 1) * P.oIntra + (P.multi ? (n - G) * P.oNet : 0));
  // One-shot's sends, and two-shot's gather, are one step that posts a message to every peer:
  // each transfer starts as soon as it is posted, so in the first pass the postings and the
  // bytes overlap: it takes the longer of all postings plus the last message alone and the
  // first posting plus all bytes. (Two-shot's scatter is a step per peer: each send occupies
  // its rank for the posting and the transfer, one after another.) On one device's memory the
  // bytes are memory traffic, priced as measured there; reduce-scatter's and all-to-all's
  // one-shot post a different piece to each peer, where the simulator found no such overlap.
  const double postPass = posting / passes, bytesPass = phase / passes;
  const double lastAlone = per / passes / (P.multi ? P.bwNet : P.bwIntra);
  const double firstPost = G > 1 ? P.oIntra : P.oNet;
  const double hidden =
      P.g.deviceCopyGBs > 0 || (blocks && coll != Collective::allGather)
          ? 0
          : postPass - (std::max(postPass + lastAlone, firstPost + bytesPass) - bytesPass);
  P.lat += (one ? 1 : 2) * P.aStep - hidden;
  // Two-shot's scatter across hosts on NICs that several ranks share: each send is a posting
  // and then its transfer, so where the posting outlasts the transfer at the NIC's shared rate
  // the sharers' transfers overlap only in part and kDriftHidden of each hides; where the
  // transfer is the longer the NIC stays busy and nothing hides.
  if (!one && P.sharedNic && P.onNic(per) < P.oNet) {
    P.lat -= (n - G) * P.onNic(per) * kDriftHidden;
  }
  P.post = (one ? 1 : 2) * posting;
  P.bw = (one ? 1 : 2) * phase;
  return {};
}

}  // namespace weft::algo
