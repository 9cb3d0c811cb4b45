#include "algorithms/cost_model.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include "algorithms/patterns.hpp"

namespace weft::algo {

std::string_view name(Protocol p) { return p == Protocol::ll ? "ll" : "simple"; }

std::optional<Protocol> parseProtocol(std::string_view s) {
  if (s == "ll" || s == "LL") return Protocol::ll;
  if (s == "simple" || s == "Simple" || s == "SIMPLE") return Protocol::simple;
  return std::nullopt;
}

LinkClass linkClassOf(topo::PathClass c) {
  switch (c) {
    case topo::PathClass::loc:
    case topo::PathClass::nvl:
    case topo::PathClass::nvb:
    case topo::PathClass::c2c: return LinkClass::nvlink;
    case topo::PathClass::net: return LinkClass::network;
    default: return LinkClass::pcie;
  }
}

double busBandwidthFactor(Collective coll, int n) {
  switch (coll) {
    case Collective::allReduce: return 2.0 * (n - 1) / n;
    case Collective::allGather:
    case Collective::reduceScatter:
    case Collective::allToAll:
    case Collective::allToAllv: return double(n - 1) / n;
    default: return 1.0;
  }
}

// ---- tuning files ----------------------------------------------------------------------------

namespace {

using nlohmann::json;

const char* kProtoKeys[] = {"ll", "simple"};
const char* kClassKeys[] = {"nvlink", "pcie", "network"};

Status readPositive(const json& j, const std::string& where, double& out) {
  if (!j.is_number() || j.get<double>() <= 0) return invalidArgument(where + " must be a positive number");
  out = j.get<double>();
  return {};
}

template <std::size_t N>
Status readTable(const json& j, const std::string& where, const char* const (&keys)[N],
                 std::array<double, N>& out) {
  if (!j.is_object()) return invalidArgument(where + " must be an object");
  for (auto it = j.begin(); it != j.end(); ++it) {
    const auto k = std::find_if(std::begin(keys), std::end(keys), [&](const char* x) { return it.key() == x; });
    if (k == std::end(keys)) return invalidArgument(where + " has an unknown key '" + it.key() + "'");
    if (Status s = readPositive(*it, where + "." + it.key(), out[static_cast<std::size_t>(k - std::begin(keys))]); !s) {
      return s;
    }
  }
  return {};
}

}  // namespace

Result<CostConstants> CostConstants::fromJson(const std::string& text, const std::string& source) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    return invalidArgument(source + ": not JSON: " + e.what());
  }
  if (!j.is_object()) return invalidArgument(source + ": the tuning file must be a JSON object");
  CostConstants c;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string key = it.key();
    const std::string where = source + ": " + key;
    Status s;
    if (key == "base_latency_us") {
      s = readTable(*it, where, kProtoKeys, c.baseLatency);
    } else if (key == "bandwidth_efficiency") {
      s = readTable(*it, where, kProtoKeys, c.bandwidthEfficiency);
    } else if (key == "bandwidth_scale") {
      s = readTable(*it, where, kClassKeys, c.bandwidthScale);
    } else if (key == "pat_staging_bytes") {
      s = readPositive(*it, where, c.patStagingBytes);
    } else if (key == "hop_latency_us") {
      if (!it->is_object()) return invalidArgument(where + " must be an object");
      for (auto p = it->begin(); p != it->end(); ++p) {
        const auto proto = parseProtocol(p.key());
        if (!proto) return invalidArgument(where + " has an unknown protocol '" + p.key() + "'");
        s = readTable(*p, where + "." + p.key(), kClassKeys, c.hopLatency[static_cast<std::size_t>(*proto)]);
        if (!s) return s;
      }
    } else if (key == "comment" || key == "measured_on") {
      continue;  // free text for people
    } else {
      return invalidArgument(where + ": unknown key (expected base_latency_us, hop_latency_us, "
                                     "bandwidth_efficiency, bandwidth_scale, pat_staging_bytes)");
    }
    if (!s) return s;
  }
  return c;
}

Result<CostConstants> CostConstants::fromJsonFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return invalidArgument(path + ": cannot open the tuning file");
  std::stringstream ss;
  ss << in.rdbuf();
  return fromJson(ss.str(), path);
}

std::string CostConstants::toJson() const {
  json j;
  for (std::size_t p = 0; p < 2; ++p) {
    j["base_latency_us"][kProtoKeys[p]] = baseLatency[p];
    j["bandwidth_efficiency"][kProtoKeys[p]] = bandwidthEfficiency[p];
    for (std::size_t c = 0; c < kNumLinkClasses; ++c) j["hop_latency_us"][kProtoKeys[p]][kClassKeys[c]] = hopLatency[p][c];
  }
  for (std::size_t c = 0; c < kNumLinkClasses; ++c) j["bandwidth_scale"][kClassKeys[c]] = bandwidthScale[c];
  j["pat_staging_bytes"] = patStagingBytes;
  return j.dump(2);
}

// ---- the rank graph --------------------------------------------------------------------------

RankGraph RankGraph::fromSystem(const topo::System& system) {
  const topo::Topology& host = system.host();
  RankGraph g;
  g.ranksPerHost = std::max(1, system.gpusPerHost());
  g.hosts = system.hosts();
  g.nranks = g.ranksPerHost * g.hosts;
  g.intraBandwidth = g.ranksPerHost > 1 ? 1e30 : 0;
  g.injection = 1e30;
  for (int a : host.gpus()) {
    double nvlinks = 0, pcie = 0;
    for (const topo::Link& l : host.links()) {
      if (l.a != a && l.b != a) continue;
      if (l.kind == topo::LinkKind::nvlink) nvlinks += l.bandwidth;
      if (l.kind == topo::LinkKind::pcie) pcie = std::max(pcie, l.bandwidth);
    }
    g.injection = std::min(g.injection, std::max(nvlinks, pcie));
    for (int b : host.gpus()) {
      if (a == b) continue;
      const topo::Path& p = host.path(a, b);
      g.intraBandwidth = std::min(g.intraBandwidth, p.bandwidth);
      g.intraClass = std::max(g.intraClass, p.cls);
    }
  }
  if (host.gpus().empty()) g.injection = 0;
  if (g.ranksPerHost == 1) g.injection = std::min(g.injection, 1e30);
  std::set<int> nics;
  g.netPerRank = host.gpus().empty() ? 0 : 1e30;
  for (std::size_t i = 0; i < host.gpus().size(); ++i) {
    g.netPerRank = std::min(g.netPerRank, system.networkBandwidth(static_cast<int>(i)));
    const int nic = host.nearestNic(host.gpus()[i]);
    if (nic >= 0 && nics.insert(nic).second) g.netPerHost += system.networkBandwidth(static_cast<int>(i));
  }
  g.fabricLatency = 2 * system.fabric().switchLatency;  // between one (same rail) and three hops
  return g;
}

RankGraph RankGraph::flat(int nranks, topo::PathClass cls, double bandwidth) {
  RankGraph g;
  g.nranks = g.ranksPerHost = nranks;
  g.intraClass = cls;
  g.intraBandwidth = g.injection = bandwidth;
  return g;
}

// ---- estimates -------------------------------------------------------------------------------

int CostModel::patAggregationFor(std::size_t bytes, int nranks) const {
  const double block = std::max(1.0, double(bytes) / nranks);
  const double fit = std::floor(c_.patStagingBytes / block);
  const int most = std::max(1, nranks / 2);
  const int a = static_cast<int>(std::clamp(fit, 1.0, double(most)));
  return static_cast<int>(pow2Floor(static_cast<std::uint32_t>(a)));
}

namespace {

// The numbers one estimate works with, for one protocol.
struct Terms {
  double base, aIntra, aNet;      // us
  double bwIntra, inj, bwNet, bwHost;  // bytes per us
  int n, G, N;
};

constexpr double kBytesPerUsPerGBs = 1e3;

}  // namespace

Result<Estimate> CostModel::estimate(std::string_view algorithm, Collective coll, std::size_t bytes,
                                     Protocol proto, const RankGraph& g) const {
  const auto p = static_cast<std::size_t>(proto);
  const double eff = c_.bandwidthEfficiency[p];
  const auto nv = static_cast<std::size_t>(linkClassOf(g.intraClass));
  const auto net = static_cast<std::size_t>(LinkClass::network);
  Terms t{};
  t.n = g.nranks;
  t.G = g.ranksPerHost;
  t.N = g.hosts;
  t.base = c_.baseLatency[p];
  t.aIntra = c_.hopLatency[p][nv];
  t.aNet = c_.hopLatency[p][net] + g.fabricLatency;
  t.bwIntra = g.intraBandwidth * c_.bandwidthScale[nv] * eff * kBytesPerUsPerGBs;
  t.inj = g.injection * c_.bandwidthScale[nv] * eff * kBytesPerUsPerGBs;
  t.bwNet = g.netPerRank * c_.bandwidthScale[net] * eff * kBytesPerUsPerGBs;
  t.bwHost = g.netPerHost * c_.bandwidthScale[net] * eff * kBytesPerUsPerGBs;
  const double S = double(bytes);
  const int n = t.n, G = t.G, N = t.N;
  const bool multi = N > 1;
  // The slowest link a step that involves every rank must cross.
  const double aStep = multi ? t.aNet : t.aIntra;
  const double bwStep = multi ? std::min(t.bwIntra, t.bwNet) : t.bwIntra;

  Estimate e;
  e.algorithm = std::string(algorithm);
  e.protocol = proto;
  double lat = t.base, bw = 0;
  auto unsupportedHere = [&] {
    return unsupported(std::string(algorithm) + " has no estimate for " + std::string(name(coll)));
  };
  if (n == 1) {
    e.timeUs = e.latencyUs = t.base;
    return e;
  }

  if (algorithm == "ring") {
    // Every step is a hop. weft's ring keeps one rank order on every channel, so each host
    // crossing goes through one GPU's NIC (NCCL rotates its rings per channel to use them all;
    // weft's rings do not yet).
    const double bwRing = multi ? std::min(t.bwIntra, t.bwNet) : t.bwIntra;
    double steps = 0, crossings = 0, moved = 0;
    switch (coll) {
      case Collective::allReduce: steps = 2.0 * (n - 1); crossings = 2.0 * (N - 1); moved = 2.0 * (n - 1) / n; break;
      case Collective::allGather:
      case Collective::reduceScatter: steps = n - 1; crossings = N - 1; moved = double(n - 1) / n; break;
      case Collective::broadcast:
      case Collective::reduce: steps = n - 1; crossings = N - 1; moved = 1; break;
      default: return unsupportedHere();
    }
    lat += (steps - crossings) * t.aIntra + crossings * t.aNet;
    bw = moved * S / bwRing;
  } else if (algorithm == "dbtree") {
    // Depth: the in-order tree climbs log2(G) levels inside a host, then log2(N) across hosts.
    const double depth = ceilLog2(static_cast<std::uint32_t>(G)) * t.aIntra +
                         ceilLog2(static_cast<std::uint32_t>(N)) * t.aNet;
    const double bwTree = multi ? std::min(t.bwIntra, t.bwNet) : t.bwIntra;
    if (coll == Collective::allReduce) {
      lat += 2 * depth;
      bw = 2 * S / bwTree;  // a rank inner in one tree and a leaf in the other sends 2x half the data
    } else if (coll == Collective::broadcast || coll == Collective::reduce) {
      lat += depth;
      bw = S / bwTree;
    } else {
      return unsupportedHere();
    }
  } else if (algorithm == "pat") {
    if (coll != Collective::allGather && coll != Collective::reduceScatter) return unsupportedHere();
    const int A = patAggregationFor(bytes, n);
    e.aggregation = A;
    const int Q = (n + A - 1) / A;
    const double block = S / n;
    // Bundle q moves min(A, n - qA) blocks over distance highbit(q)*A; bundle 0's log2(A)
    // rounds move d blocks over distance d. A distance that is a multiple of the host size stays
    // on the same local GPU index (one rail); any other crosses hosts for some ranks.
    for (int q = 1; q < Q; ++q) {
      const int blocks = std::min(A, n - q * A);
      lat += aStep;
      bw += blocks * block / bwStep;
    }
    for (int d = 1; d < A; d *= 2) {
      lat += aStep;
      bw += d * block / bwStep;
    }
  } else if (algorithm == "rhd") {
    if (coll != Collective::allReduce) return unsupportedHere();
    const int p2 = static_cast<int>(pow2Floor(static_cast<std::uint32_t>(n)));
    if (p2 != n) {  // fold in and out: a whole message each way
      lat += 2 * aStep;
      bw += 2 * S / bwStep;
    }
    // Exchange with v ^ mask moves mask/p of the message; masks below the (power-of-two) host
    // size stay inside a host.
    const bool alignedHosts = (G & (G - 1)) == 0 && p2 == n;
    for (int mask = 1; mask < p2; mask *= 2) {
      const bool inside = !multi || (alignedHosts && mask < G);
      const double a = inside ? t.aIntra : t.aNet;
      const double b = inside ? t.bwIntra : std::min(t.bwIntra, t.bwNet);
      lat += 2 * a;
      bw += 2 * (double(mask) / p2) * S / b;
    }
  } else if (algorithm == "oneshot" || algorithm == "twoshot") {
    if (coll != Collective::allReduce) return unsupportedHere();
    const bool one = algorithm == "oneshot";
    const double per = one ? S : S / n;  // what goes to each peer
    const double intra = (G - 1) * per / t.inj;
    const double inter = multi ? (n - G) * per / t.bwNet : 0;
    const double phase = std::max(intra, inter);
    lat += (one ? 1 : 2) * aStep;
    bw = (one ? 1 : 2) * phase;
  } else if (algorithm == "pairwise") {
    if (coll != Collective::allToAll && coll != Collective::allToAllv) return unsupportedHere();
    lat += (n - 1) * aStep;
    bw = (n - 1) * (S / n) / bwStep;
  } else if (algorithm == "bruck") {
    if (coll != Collective::allToAll) return unsupportedHere();
    for (int d = 1; d < n; d *= 2) {
      // Blocks whose index has this bit set.
      const double blocks = std::floor(double(n) / (2.0 * d)) * d + std::max(0.0, double(n % (2 * d)) - d);
      lat += aStep;
      bw += blocks * (S / n) / bwStep;
    }
  } else if (algorithm == "hierarchical") {
    if (coll != Collective::allToAll) return unsupportedHere();
    lat += (G - 1) * t.aIntra + (N - 1) * t.aNet;
    bw = (G - 1) * (S / G) / t.bwIntra + (multi ? (N - 1) * (S / N) / std::min(t.bwIntra, t.bwNet) : 0);
  } else if (algorithm == "p2p") {
    if (coll != Collective::sendRecv) return unsupportedHere();
    lat += aStep;
    bw = S / bwStep;
  } else {
    return unsupported("no estimate for algorithm " + std::string(algorithm));
  }
  e.latencyUs = lat;
  e.bandwidthUs = bw;
  e.timeUs = lat + bw;
  return e;
}

}  // namespace weft::algo
