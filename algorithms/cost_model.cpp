#include "algorithms/cost_model.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <tuple>

#include "algorithms/algorithm.hpp"
#include "algorithms/patterns.hpp"
#include "algorithms/verifier.hpp"

namespace weft::algo {

std::string_view name(Protocol p) {
  return p == Protocol::ll ? "ll" : "simple";
}

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
    case topo::PathClass::c2c:
      return LinkClass::nvlink;
    case topo::PathClass::net:
      return LinkClass::network;
    default:
      return LinkClass::pcie;
  }
}

double busBandwidthFactor(Collective coll, int n) {
  switch (coll) {
    case Collective::allReduce:
      return 2.0 * (n - 1) / n;
    case Collective::allGather:
    case Collective::reduceScatter:
    case Collective::allToAll:
    case Collective::allToAllv:
      return double(n - 1) / n;
    default:
      return 1.0;
  }
}

// ---- tuning files ----------------------------------------------------------------------------

namespace {

using nlohmann::json;

const char* kProtoKeys[] = {"ll", "simple"};
const char* kClassKeys[] = {"nvlink", "pcie", "network"};

Status readPositive(const json& j, const std::string& where, double& out) {
  if (!j.is_number() || j.get<double>() <= 0)
    return invalidArgument(where + " must be a positive number");
  out = j.get<double>();
  return {};
}

template <std::size_t N>
Status readTable(const json& j, const std::string& where, const char* const (&keys)[N],
                 std::array<double, N>& out) {
  if (!j.is_object()) return invalidArgument(where + " must be an object");
  for (auto it = j.begin(); it != j.end(); ++it) {
    const auto k = std::find_if(std::begin(keys), std::end(keys),
                                [&](const char* x) { return it.key() == x; });
    if (k == std::end(keys))
      return invalidArgument(where + " has an unknown key '" + it.key() + "'");
    if (Status s = readPositive(*it, where + "." + it.key(),
                                out[static_cast<std::size_t>(k - std::begin(keys))]);
        !s) {
      return s;
    }
  }
  return {};
}

Result<std::size_t> readBytes(const json& j, const std::string& where) {
  if (!j.is_number_unsigned()) return invalidArgument(where + " must be a byte count (>= 0)");
  return static_cast<std::size_t>(j.get<std::uint64_t>());
}

Status readKernels(const json& j, const std::string& where, KernelConstants& k) {
  if (!j.is_object()) return invalidArgument(where + " must be an object");
  const std::pair<const char*, std::size_t*> bytes[] = {
      {"gpu_direct_round_bytes", &k.gpuDirectRoundBytes},
      {"gpu_oneshot_max_bytes", &k.gpuOneShotMaxBytes},
      {"gpu_direct_exchange_max_bytes", &k.gpuDirectExchangeMaxBytes},
      {"gpu_direct_pair_max_bytes", &k.gpuDirectPairMaxBytes},
      {"gpu_ll_max_bytes", &k.gpuLlMaxBytes},
      {"gpu_registered_oneshot_min_bytes", &k.gpuRegisteredOneShotMinBytes},
      {"host_slots_max_bytes", &k.hostSlotsMaxBytes},
      {"host_direct_min_bytes", &k.hostDirectMinBytes}};
  const std::pair<const char*, int*> ranks[] = {
      {"gpu_twoshot_min_ranks", &k.gpuTwoShotMinRanks},
      {"gpu_registered_oneshot_max_ranks", &k.gpuRegisteredOneShotMaxRanks}};
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string w = where + "." + it.key();
    if (it.key() == "gpu_direct_rounds") {
      // {"2": 4, "4": 16, "64": 64}: up to that many ranks, that many rounds.
      if (!it->is_object() || it->empty())
        return invalidArgument(w + " must be an object of rank counts to rounds");
      k.gpuDirectRounds.clear();
      for (auto r = it->begin(); r != it->end(); ++r) {
        const int n = std::atoi(r.key().c_str());
        if (n < 1 || !r->is_number_unsigned())
          return invalidArgument(w + ": '" + r.key() + "' must be a rank count to a round count");
        k.gpuDirectRounds.emplace_back(n, r->get<int>());
      }
      std::sort(k.gpuDirectRounds.begin(), k.gpuDirectRounds.end());
      continue;
    }
    bool known = false;
    for (const auto& [key, field] : bytes) {
      if (it.key() != key) continue;
      auto v = readBytes(*it, w);
      if (!v) return v.status();
      *field = *v;
      known = true;
    }
    for (const auto& [key, field] : ranks) {
      if (it.key() != key) continue;
      if (!it->is_number_unsigned()) return invalidArgument(w + " must be a rank count");
      *field = it->get<int>();
      known = true;
    }
    if (!known) return invalidArgument(w + ": unknown key");
  }
  return {};
}

json kernelsJson(const KernelConstants& k) {
  json j;
  for (const auto& [n, rounds] : k.gpuDirectRounds)
    j["gpu_direct_rounds"][std::to_string(n)] = rounds;
  j["gpu_direct_round_bytes"] = k.gpuDirectRoundBytes;
  j["gpu_oneshot_max_bytes"] = k.gpuOneShotMaxBytes;
  j["gpu_twoshot_min_ranks"] = k.gpuTwoShotMinRanks;
  j["gpu_direct_exchange_max_bytes"] = k.gpuDirectExchangeMaxBytes;
  j["gpu_direct_pair_max_bytes"] = k.gpuDirectPairMaxBytes;
  j["gpu_ll_max_bytes"] = k.gpuLlMaxBytes;
  j["gpu_registered_oneshot_max_ranks"] = k.gpuRegisteredOneShotMaxRanks;
  j["gpu_registered_oneshot_min_bytes"] = k.gpuRegisteredOneShotMinBytes;
  j["host_slots_max_bytes"] = k.hostSlotsMaxBytes;
  j["host_direct_min_bytes"] = k.hostDirectMinBytes;
  return j;
}

}  // namespace

int KernelConstants::gpuDirectRoundsFor(int nranks) const {
  for (const auto& [most, rounds] : gpuDirectRounds) {
    if (nranks <= most) return rounds;
  }
  return gpuDirectRounds.empty() ? 0 : gpuDirectRounds.back().second;
}

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
    } else if (key == "message_overhead_us") {
      if (!it->is_object()) return invalidArgument(where + " must be an object");
      for (auto p = it->begin(); p != it->end(); ++p) {
        const auto proto = parseProtocol(p.key());
        if (!proto) return invalidArgument(where + " has an unknown protocol '" + p.key() + "'");
        s = readTable(*p, where + "." + p.key(), kClassKeys,
                      c.messageOverhead[static_cast<std::size_t>(*proto)]);
        if (!s) return s;
      }
    } else if (key == "hop_latency_us") {
      if (!it->is_object()) return invalidArgument(where + " must be an object");
      for (auto p = it->begin(); p != it->end(); ++p) {
        const auto proto = parseProtocol(p.key());
        if (!proto) return invalidArgument(where + " has an unknown protocol '" + p.key() + "'");
        s = readTable(*p, where + "." + p.key(), kClassKeys,
                      c.hopLatency[static_cast<std::size_t>(*proto)]);
        if (!s) return s;
      }
    } else if (key == "kernels") {
      s = readKernels(*it, where, c.kernels);
    } else if (key == "comment" || key == "measured_on") {
      continue;  // free text for people
    } else {
      return invalidArgument(where +
                             ": unknown key (expected base_latency_us, hop_latency_us, "
                             "message_overhead_us, bandwidth_efficiency, bandwidth_scale, "
                             "pat_staging_bytes, kernels)");
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
    for (std::size_t c = 0; c < kNumLinkClasses; ++c) {
      j["hop_latency_us"][kProtoKeys[p]][kClassKeys[c]] = hopLatency[p][c];
      j["message_overhead_us"][kProtoKeys[p]][kClassKeys[c]] = messageOverhead[p][c];
    }
  }
  for (std::size_t c = 0; c < kNumLinkClasses; ++c)
    j["bandwidth_scale"][kClassKeys[c]] = bandwidthScale[c];
  j["pat_staging_bytes"] = patStagingBytes;
  j["kernels"] = kernelsJson(kernels);
  return j.dump(2);
}

// ---- estimates -------------------------------------------------------------------------------

int CostModel::patAggregationFor(std::size_t bytes, int nranks) const {
  const double block = std::max(1.0, double(bytes) / nranks);
  const double fit = std::floor(c_.patStagingBytes / block);
  const int most = std::max(1, nranks / 2);
  const int a = static_cast<int>(std::clamp(fit, 1.0, double(most)));
  return static_cast<int>(pow2Floor(static_cast<std::uint32_t>(a)));
}

void CostModel::shape(Protocol proto, std::size_t bytes, int ranksPerHost, int& channels,
                      std::size_t& chunkBytes) {
  // Enough channels to keep every link busy, not so many that each moves a sliver.
  const std::size_t perChannel = proto == Protocol::ll ? 64 * 1024 : 1024 * 1024;
  const int most = std::clamp(ranksPerHost, 2, 16);
  channels = static_cast<int>(std::clamp<std::size_t>((bytes + perChannel - 1) / perChannel, 1,
                                                      static_cast<std::size_t>(most)));
  // Slices small enough that a channel's share is cut into at least eight, so trees and chains
  // pipeline; no larger than a FIFO slot, and no smaller than where each slice's per-message
  // cost starts to show. LL moves fixed 16 KiB steps.
  const std::size_t largest = proto == Protocol::ll ? 16 * 1024 : 512 * 1024;
  const std::size_t smallest = proto == Protocol::ll ? 16 * 1024 : 64 * 1024;
  const auto ch = static_cast<std::size_t>(channels);
  chunkBytes = std::clamp<std::size_t>(bytes / ch / 8, smallest, largest);
}

namespace {

// The numbers one estimate works with, for one protocol.
struct Terms {
  double base, aIntra, aNet;  // us
  double oIntra, oNet;        // us per message
  double bwIntra, bwNet;      // bytes per us
  int n, G, N;
};

constexpr double kBytesPerUsPerGBs = 1e3;
// The part of an exchange round across hosts (the smaller of its latency and its bytes on the
// NIC) that ranks sharing a NIC hide behind each other's transfers (pairwise, hierarchical).
// The replays bracket it: 1/2 fluid, 1/8 three passes; 1/4 picks what both rank first at the
// PCIe servers' crossovers (docs/perf.md, 2026-11-30, eleventh session).
constexpr double kDriftHidden = 0.25;

}  // namespace

CostModel::ScheduleShape CostModel::scheduleShape(std::string_view algorithm, Collective coll,
                                                  int nranks) {
  static std::mutex mutex;
  static std::map<std::tuple<std::string, int, int>, ScheduleShape> known;
  const auto key = std::make_tuple(std::string(algorithm), static_cast<int>(coll), nranks);
  {
    std::lock_guard lock(mutex);
    if (auto it = known.find(key); it != known.end()) return it->second;
  }
  ScheduleShape shape;
  if (const Algorithm* a = findAlgorithm(algorithm); a != nullptr && a->supports(coll)) {
    if (auto s = a->build(coll, nranks)) {
      VerifyOptions o;
      o.slices = 1;
      const VerifyReport r = verify(*s, o);
      if (r.ok()) {
        shape.traffic = r.totalMemory;
        shape.reduced = r.maxReduced;
        shape.blocksPerSegment = std::max<double>(1, s->blocksPerSegment);
        shape.maxMessageBlocks = std::max<double>(1, r.maxMessageBlocks);
      }
    }
  }
  std::lock_guard lock(mutex);
  known.emplace(key, shape);
  return shape;
}

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
  t.oIntra = c_.messageOverhead[p][nv];
  t.oNet = c_.messageOverhead[p][net];
  t.bwIntra = g.intraBandwidth * c_.bandwidthScale[nv] * eff * kBytesPerUsPerGBs;
  t.bwNet = g.netPerRank * c_.bandwidthScale[net] * eff * kBytesPerUsPerGBs;
  const double S = double(bytes);
  const int n = t.n, G = t.G, N = t.N;
  const bool multi = N > 1;
  // The slowest link a step that involves every rank must cross.
  // A pattern's per-flow bandwidth inside a host, as bytes per us at this protocol.
  auto pat = [&](double gbs) { return gbs * c_.bandwidthScale[nv] * eff * kBytesPerUsPerGBs; };
  // Ranks across hosts whose NIC other ranks of their host share, and a message's time on it.
  const bool sharedNic = multi && g.ranksPerNic > 1;
  auto onNic = [&](double message) { return message / std::min(t.bwIntra, t.bwNet); };
  // What ranks sharing a NIC hide of `rounds` exchange rounds across hosts, each moving
  // `roundBytes` a rank (pairwise, hierarchical; kDriftHidden).
  auto drift = [&](double rounds, double roundBytes) {
    return sharedNic ? rounds * std::min(t.aNet, onNic(roundBytes)) * kDriftHidden : 0.0;
  };
  auto shift = [&](int d) {
    const int local = G > 0 ? d % G : 0;
    return local == 0 || g.shiftBw.empty() ? 1e300
                                           : pat(g.shiftBw[static_cast<std::size_t>(local)]);
  };
  const double aStep = multi ? t.aNet : t.aIntra;
  int channels = 1;
  std::size_t chunk = 1;
  shape(proto, bytes, G, channels, chunk);
  // Every slice of a message is a message of its own: its posting cost repeats.
  // The most slices any message is cut into: how many passes the pipeline runs.
  double passCount = 1;
  auto slices = [&](double msgBytes) {
    const double m = std::max(1.0, std::ceil(msgBytes / channels / double(chunk)));
    passCount = std::max(passCount, m);
    return m;
  };
  const double oStep = multi ? t.oNet : t.oIntra;
  const double bwStep = multi ? std::min(t.bwIntra, t.bwNet) : t.bwIntra;

  // A pairwise exchange inside a host, `block` bytes to each of the G-1 others. One pass runs
  // the rounds one after another, each as slow as its most contended link (the matching
  // pattern); once several passes are in flight every round is busy at once, which is the
  // all-pairs pattern, bound by the busiest link alone.
  // One rank's message with the links to itself: the narrowest host path, or the network path
  // when the rank is alone on its NIC.
  const double bwAlone =
      multi ? std::min(t.bwIntra, g.netAlone * c_.bandwidthScale[net] * eff * kBytesPerUsPerGBs)
            : t.bwIntra;
  auto together = [&](double block) { return G < 2 ? 0.0 : block / pat(g.allPairsBw); };
  auto exchange = [&](double block, double passes) {
    if (G < 2) return 0.0;
    const double rounds = (G - 1) * block / pat(g.matchingBw);
    return rounds / passes + (passes - 1) / passes * std::min(rounds, together(block));
  };

  Estimate e;
  e.algorithm = std::string(algorithm);
  e.protocol = proto;
  // Hop latencies, each channel's postings of its messages, and the bytes over the links. In the
  // pipelined passes every step is busy at once on different slices, so phases that cross
  // different links overlap there: `overlapped` is then the busiest link's time alone, where an
  // algorithm knows it (negative: the phases stay in series, as in the first pass).
  // `alone` is a rank's own transfers at the rate its messages get with nobody else on the links
  // (negative: not known apart from `bw`); the pipelined passes are bound by the busiest link or
  // by one channel's postings and its share of those transfers, whichever is longer.
  double lat = t.base, post = 0, bw = 0, overlapped = -1, alone = -1;
  auto unsupportedHere = [&] {
    return unsupported(std::string(algorithm) + " has no estimate for " + std::string(name(coll)));
  };
  if (n == 1) {
    e.timeUs = e.latencyUs = t.base;
    return e;
  }

  // Rounds in which rank r sends to r + d and waits for r - d (Bruck, PAT), across hosts. Before
  // d reaches G only the last d ranks of a host cross to the next one, so a round is not a
  // network round for everyone: walk the critical path (a rank goes on once its own send is out
  // and its message from r - d has landed; only that message pays the latency). Ranks a host
  // apart live the same timeline, so local indices suffice. Sets the hop latencies, postings and
  // transfers along the path.
  auto shiftRounds = [&](const std::vector<std::pair<int, double>>& rounds, double passes) {
    const double hopNet = c_.hopLatency[p][net];
    auto sendCost = [&](int l, int d, double moved, bool withPosts, bool withBytes) {
      const bool across = d >= G || l + d >= G;
      // A graph built by hand may lack the mixed-shift figures: every flow at the step's rate.
      const bool mixedKnown = static_cast<std::size_t>(d) < g.shiftCrossBw.size() &&
                              static_cast<std::size_t>(d) < g.shiftInsideBw.size();
      const double rate =
          d >= G || !mixedKnown ? (across ? bwStep : shift(d))
          : !across             ? pat(g.shiftInsideBw[static_cast<std::size_t>(d)])
                                : std::min(t.bwIntra, g.shiftCrossBw[static_cast<std::size_t>(d)] *
                                                          c_.bandwidthScale[net] * eff * kBytesPerUsPerGBs);
      return (withPosts ? passes * (across ? t.oNet : t.oIntra) : 0) +
             (withBytes ? moved / rate : 0);
    };
    auto latency = [&](int l, int d) {
      if (d < G && l + d < G) return t.aIntra;
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
  };

  if (algorithm == "ring") {
    double steps = 0, moved = 0;
    switch (coll) {
      case Collective::allReduce:
        steps = 2.0 * (n - 1);
        moved = 2.0 * (n - 1) / n;
        break;
      case Collective::allGather:
      case Collective::reduceScatter:
        steps = n - 1;
        moved = double(n - 1) / n;
        break;
      case Collective::broadcast:
      case Collective::reduce:
        steps = n - 1;
        moved = 1;
        break;
      default:
        return unsupportedHere();
    }
    // Each host's ranks are consecutive in every ring: n - N hops inside hosts, N across. Each
    // channel's ring leaves a host through a different GPU (rotated rings), so the crossings use
    // min(channels, G) GPUs' NICs, up to all of the host's.
    const std::size_t ci = static_cast<std::size_t>(
        std::clamp(channels, 1, static_cast<int>(g.ringIntraBw.size())) - 1);
    const double intraBw = multi ? pat(g.ringIntraBw[ci]) : shift(1);
    const double netBw =
        multi ? g.ringCrossBw[ci] * c_.bandwidthScale[net] * eff * kBytesPerUsPerGBs : intraBw;
    const double crossings = multi ? N : 0, inside = n - crossings;
    if (coll == Collective::broadcast || coll == Collective::reduce) {
      // A pipelined chain: the first slice crosses every hop, the rest follow at the slowest.
      lat += inside * (t.aIntra + t.oIntra) + crossings * (t.aNet + t.oNet);
      bw = moved * S / (multi ? std::min(intraBw, netBw) : intraBw);
      post = (slices(S) - 1) * oStep;
    } else {
      // Per step every rank forwards one block. The ring runs at the slower of its busiest rank
      // (back-to-back sends over its link) and its cycle (a block's hop latency and transfer,
      // averaged over the ring): the latency of a fast hop hides behind a slow one.
      // Channels share a rank's NVSwitch port but post their messages independently: while one
      // posts, the others keep the port busy, so a step takes the longer of one channel's
      // postings and transfer alone on the port, and the whole block over it. Host crossings
      // differ: each rotated channel leaves through its own GPU's NIC (channels share one only
      // past G of them), so nothing hides a channel's postings there.
      const double block = moved * S / steps;
      const double C = channels;
      const double busyIntra =
          std::max(slices(block) * t.oIntra + block / C / intraBw, block / intraBw);
      const double nicsUsed = std::min(C, static_cast<double>(std::max(1, G)));
      const double busyNet =
          multi ? std::max(slices(block) * t.oNet + block / C / (netBw / nicsUsed), block / netBw)
                : 0;
      const double cycle = (inside * (t.aIntra + busyIntra) + crossings * (t.aNet + busyNet)) / n;
      const double period = std::max({busyIntra, busyNet, cycle});
      lat += steps * (period - std::max(busyIntra, busyNet));
      bw = steps * std::max(busyIntra, busyNet);
    }
  } else if (algorithm == "dbtree") {
    // Depth: the in-order tree climbs log2(G) levels inside a host, then log2(N) across hosts.
    // t.aNet charges two fabric switches, between a rail's one and three across rails: each hop
    // pays its own.
    const double depth = g.treeHopsInside * (t.aIntra + t.oIntra) +
                         g.treeHopsAcross * (t.aNet + t.oNet) +
                         (2 * g.treeHopsCrossRail - g.treeHopsAcross) * g.switchLatency;
    // Every edge of both trees carries half the data each way; edges share links as the tree
    // pattern says (four flows per GPU on a switch: up once, down twice, and the other tree's up).
    const double edge = G > 1 ? pat(g.treeBw) : 1e300;
    const double bwEdge = multi ? std::min(edge, t.bwNet / 4) : edge;
    const double bwTree = 4 * bwEdge;
    const double posting = (slices(S / 2) - 1) * 4 * oStep;  // four messages per slice per rank
    // The first slice fills the pipeline hop by hop, and on every hop it travels with the same
    // slice of the tree's other channels.
    const double fillHop = double(chunk) * channels;
    const double fill =
        g.treeHopsAcross * fillHop / (multi ? std::min(t.bwIntra, t.bwNet) : t.bwIntra) +
        g.treeHopsInside * fillHop / (G > 1 ? shift(1) : 1e300);
    if (coll == Collective::allReduce) {
      lat += 2 * (depth + fill);
      bw = (S / 2) / bwEdge;
      post = posting;
    } else if (coll == Collective::broadcast || coll == Collective::reduce) {
      lat += depth + fill;
      bw = S / bwTree;
      post = posting / 2;
    } else {
      return unsupportedHere();
    }
  } else if (algorithm == "pat") {
    if (coll != Collective::allGather && coll != Collective::reduceScatter)
      return unsupportedHere();
    const int A = patAggregationFor(bytes, n);
    e.aggregation = A;
    const int Q = (n + A - 1) / A;
    const double block = S / n;
    // The executor slices globally: every step runs once per pass, and the largest message (a
    // full bundle) sets how many passes there are.
    const double passes = slices(std::min(A, n) * block);
    // Bundle q moves min(A, n - qA) blocks over distance highbit(q)*A; bundle 0's log2(A)
    // rounds move d blocks over distance d. A distance that is a multiple of the host size stays
    // on the same local GPU index (one rail); any other crosses hosts for some ranks.
    auto over = [&](int dist) { return multi ? std::min(shift(dist), t.bwNet) : shift(dist); };
    if (multi) {
      std::vector<std::pair<int, double>> rounds;
      for (int q = 1; q < Q; ++q) {
        rounds.push_back({static_cast<int>(pow2Floor(static_cast<std::uint32_t>(q))) * A,
                          std::min(A, n - q * A) * block});
      }
      for (int d = 1; d < A; d *= 2) rounds.push_back({d, d * block});
      shiftRounds(rounds, passes);
    }
    for (int q = 1; q < Q && !multi; ++q) {
      const int blocks = std::min(A, n - q * A);
      lat += aStep;
      post += passes * oStep;
      bw += blocks * block / over(static_cast<int>(pow2Floor(static_cast<std::uint32_t>(q))) * A);
    }
    for (int d = 1; d < A && !multi; d *= 2) {
      lat += aStep;
      post += passes * oStep;
      bw += d * block / over(d);
    }
  } else if (algorithm == "rhd") {
    if (coll != Collective::allReduce) return unsupportedHere();
    const int p2 = static_cast<int>(pow2Floor(static_cast<std::uint32_t>(n)));
    const double passes = slices(p2 != n ? S : S / 2);  // the largest message sets the passes
    if (p2 != n && !multi) {                            // fold in and out: a whole message each way
      lat += 2 * aStep;
      post += 2 * passes * oStep;
      bw += 2 * S / bwStep;
    }
    if (!multi) {
      // One host: every exchange is inside it, at the XOR pattern's share where known.
      for (int mask = 1; mask < p2; mask *= 2) {
        const bool xorKnown = mask < G && static_cast<std::size_t>(mask) < g.xorBw.size() &&
                              g.xorBw[static_cast<std::size_t>(mask)] < 1e29;
        const double b = xorKnown ? pat(g.xorBw[static_cast<std::size_t>(mask)]) : t.bwIntra;
        lat += 2 * t.aIntra;
        post += 2 * passes * t.oIntra;
        bw += 2 * (double(mask) / p2) * S / b;
      }
    } else {
      // Across hosts, whether an exchange stays inside a host depends on the placement (hosts of
      // 72 cut the hypercube's subcubes). Nothing synchronises the exchanges, so walk the
      // hypercube's critical path: a rank finishes an exchange after itself and its partner are
      // ready, plus its own pair's latency and transfer.
      const int extra = n - p2;
      auto real = [extra](int v) { return v < extra ? 2 * v + 1 : v + extra; };
      // A pair's latency: NICs of one rail are a switch apart, other rails three.
      auto pairLatency = [&](int a, int b) {
        if (a / G == b / G) return t.aIntra;
        const bool sameRail =
            static_cast<int>(g.nicOf.size()) < G ||
            g.nicOf[static_cast<std::size_t>(a % G)] == g.nicOf[static_cast<std::size_t>(b % G)];
        return c_.hopLatency[p][net] + (sameRail ? 1 : 3) * g.switchLatency;
      };
      // What the sender spends on its side of an exchange.
      auto ownCost = [&](int a, int b, double moved, bool withPosts, bool withBytes) {
        const bool inside = a / G == b / G;
        return (withPosts ? passes * (inside ? t.oIntra : t.oNet) : 0) +
               (withBytes ? moved / (inside ? t.bwIntra : std::min(t.bwIntra, t.bwNet)) : 0);
      };
      auto pairCost = [&](int a, int b, double moved, bool withPosts, bool withBytes) {
        return pairLatency(a, b) + ownCost(a, b, moved, withPosts, withBytes);
      };
      auto criticalPath = [&](bool withPosts, bool withBytes) {
        std::vector<double> ready(static_cast<std::size_t>(p2), 0), next(ready.size());
        if (p2 != n) {
          for (int v = 0; v < extra; ++v)
            ready[static_cast<std::size_t>(v)] =
                pairCost(2 * v, 2 * v + 1, S, withPosts, withBytes);
        }
        std::vector<int> masks;
        for (int m = p2 / 2; m >= 1; m /= 2) masks.push_back(m);  // halving
        for (int m = 1; m < p2; m *= 2) masks.push_back(m);       // doubling
        for (int m : masks) {
          for (int v = 0; v < p2; ++v) {
            const int w = v ^ m;
            next[static_cast<std::size_t>(v)] =
                // A rank goes on once its own side is out and its partner's has landed: only
                // the partner's message pays the latency.
                std::max(ready[static_cast<std::size_t>(v)],
                         ready[static_cast<std::size_t>(w)] + pairLatency(real(v), real(w))) +
                ownCost(real(v), real(w), double(m) / p2 * S, withPosts, withBytes);
          }
          std::swap(ready, next);
        }
        double worst = 0;
        for (int v = 0; v < p2; ++v) {
          const double fold = v < extra ? pairCost(2 * v, 2 * v + 1, S, withPosts, withBytes) : 0;
          worst = std::max(worst, ready[static_cast<std::size_t>(v)] + fold);
        }
        return worst;
      };
      const double hops = criticalPath(false, false), posted = criticalPath(true, false);
      lat = t.base + hops;
      post = posted - hops;
      bw = criticalPath(true, true) - posted;
    }
  } else if (algorithm == "oneshot" || algorithm == "twoshot") {
    const bool one = algorithm == "oneshot";
    const bool blocks = coll == Collective::allGather || coll == Collective::reduceScatter ||
                        coll == Collective::allToAll;
    if (coll != Collective::allReduce && !(one && blocks)) return unsupportedHere();
    // The block collectives' one-shot is priced inside one host only: across hosts (n - G
    // messages a rank over the NICs at once) the simulator found it 1.1-3x slower than this
    // model said at 8 hosts (docs/perf.md, 2026-11-30f), so it is left to WEFT_ALGO there.
    if (blocks && multi) return unsupportedHere();
    // What goes to each peer: one-shot all-reduce's whole vector, a block otherwise.
    const double per = one && !blocks ? S : S / n;
    const double intra = G > 1 ? per / pat(g.allPairsBw) : 0;  // all G-1 flows at once
    const double inter = multi ? (n - G) * per / t.bwNet : 0;
    const double phase = std::max(intra, inter);
    const double passes = slices(per);
    const double posting = passes * ((G - 1) * t.oIntra + (multi ? (n - G) * t.oNet : 0));
    // One-shot's sends, and two-shot's gather, are one step that posts a message to every peer:
    // each transfer starts as soon as it is posted, so in the first pass the postings and the
    // bytes overlap: it takes the longer of all postings plus the last message alone and the
    // first posting plus all bytes. (Two-shot's scatter is a step per peer: each send occupies
    // its rank for the posting and the transfer, one after another. In the pipelined passes a
    // rank's postings stay in series with its transfers, as priced below.)
    const double postPass = posting / passes, bytesPass = phase / passes;
    const double lastAlone = per / passes / (multi ? t.bwNet : t.bwIntra);
    const double firstPost = G > 1 ? t.oIntra : t.oNet;
    // (On one device's memory, below, the bytes are memory traffic, priced as measured there.
    // Reduce-scatter's and all-to-all's one-shot post a different piece to each peer: the
    // simulator found no such overlap there: 72 ranks of GB200 NVL72, 8 MB, simple, simulated
    // 37.5 us against 26.2 estimated with it, 37.5 without.)
    const double hidden =
        g.deviceCopyGBs > 0 || (blocks && coll != Collective::allGather)
            ? 0
            : postPass - (std::max(postPass + lastAlone, firstPost + bytesPass) - bytesPass);
    lat += (one ? 1 : 2) * aStep - hidden;
    // Two-shot's scatter across hosts on NICs that several ranks share: each send is a posting and
    // then its transfer, one after the other, so where the posting outlasts the transfer at the
    // NIC's shared rate the sharers' transfers overlap only in part (the NIC idles between them)
    // and part of each hides, kDriftHidden of it as in pairwise's drift; where the transfer
    // outlasts the posting the NIC stays busy and nothing hides. (PCIe servers, 4 GPUs a NIC, 8
    // hosts: the replay's 4 KiB sends at 256 KiB took 0.27-0.81 us against 0.66 at a quarter of
    // the NIC, a posting 1 us; at 1 MiB, 2.6 us a send, none hid.)
    if (!one && sharedNic && onNic(per) < t.oNet) lat -= (n - G) * onNic(per) * kDriftHidden;
    post = (one ? 1 : 2) * posting;
    bw = (one ? 1 : 2) * phase;
  } else if (algorithm == "pairwise") {
    if (coll != Collective::allToAll && coll != Collective::allToAllv) return unsupportedHere();
    // Nothing synchronises the exchanges: a rank pays its G-1 host peers at host speed and the
    // n-G others at network speed.
    const double passes = slices(S / n);
    lat += (G - 1) * t.aIntra + (n - G) * t.aNet;
    post = passes * ((G - 1) * t.oIntra + (n - G) * t.oNet);
    const double across = multi ? (n - G) * (S / n) / std::min(t.bwIntra, t.bwNet) : 0;
    bw = exchange(S / n, passes) + across;
    overlapped = std::max(together(S / n), across);
    alone = (n - 1) * (S / n) / bwAlone;
    // Ranks that share a NIC drift apart over the rounds across hosts: while one waits out its
    // partner's latency, the others' blocks keep the NIC busy. Each round's partner differs, so
    // they never drift far. How much of a round hides depends on how the sharing is replayed:
    // of the smaller of its latency and its bytes on the NIC, about half with the links shared
    // at every instant (weft-plan tune --fluid; PCIe servers, 4 GPUs a NIC, 8 hosts: 0.47-0.57
    // from 512 KiB to 8 MiB), about an eighth in the three time-averaged passes of the grids.
    // The model takes kDriftHidden, between the two.
    lat -= drift(n - G, S / n);
  } else if (algorithm == "bruck") {
    if (coll != Collective::allToAll) return unsupportedHere();
    // The rotations into and out of scratch copy all n blocks: they set the passes.
    const double passes = slices(S);
    // Blocks whose index has bit d set.
    auto moved = [&](int d) {
      return (std::floor(double(n) / (2.0 * d)) * d + std::max(0.0, double(n % (2 * d)) - d)) *
             (S / n);
    };
    if (!multi) {
      for (int d = 1; d < n; d *= 2) {
        lat += aStep;
        post += passes * oStep;
        bw += moved(d) / shift(d);
      }
    } else {
      std::vector<std::pair<int, double>> rounds;
      for (int d = 1; d < n; d *= 2) rounds.push_back({d, moved(d)});
      shiftRounds(rounds, passes);
    }
  } else if (algorithm == "hierarchical") {
    if (coll != Collective::allToAll) return unsupportedHere();
    // The executor slices globally: every step runs once per pass, and the largest step (a
    // message or the staging copy of max(G, N) blocks) sets how many passes there are.
    const double passes = slices(std::max(G, N) * S / n);
    lat += (G - 1) * t.aIntra + (N - 1) * t.aNet;
    post = passes * ((G - 1) * t.oIntra + (N - 1) * t.oNet);
    const double across = multi ? (N - 1) * (S / N) / std::min(t.bwIntra, t.bwNet) : 0;
    bw = exchange(S / G, passes) + across;
    // Once several passes are in flight, the exchange inside hosts of one slice runs beside the
    // exchange across hosts of another: the NICs and the GPUs' host links carry them at once.
    overlapped = std::max(together(S / G), across);
    alone = ((G - 1) * (S / G) + (N - 1) * (S / N)) / bwAlone;
    // Its N-1 rounds across hosts drift apart on shared NICs as pairwise's do (above).
    lat -= drift(N - 1, S / N);
  } else if (algorithm == "p2p") {
    if (coll != Collective::sendRecv) return unsupportedHere();
    lat += aStep;
    post = slices(S) * oStep;
    bw = S / (multi ? bwStep : shift(1));
  } else {
    return unsupported("no estimate for algorithm " + std::string(algorithm));
  }
  if (g.hostReduceGBs > 0 && g.deviceCopyGBs <= 0) {
    // The busiest rank's folding, in series with its copies (the same CPU thread does both).
    const ScheduleShape d = scheduleShape(algorithm, coll, n);
    const double fold = d.reduced * S / (g.hostReduceGBs * kBytesPerUsPerGBs);
    bw += fold;
    if (overlapped >= 0) overlapped += fold;
    if (alone >= 0) alone += fold;
  }
  if (g.deviceCopyGBs > 0) {
    // One device's memory carries everything: the bytes term is the schedule's memory traffic,
    // whatever links the algorithm would cross; hop latencies and postings stay as priced. The
    // ranks' class's bandwidth scale applies to the copy rate (what weft-perf --calibrate --gpu
    // fits, where the ranks' GPUs are not one).
    const ScheduleShape d = scheduleShape(algorithm, coll, n);
    if (d.traffic < 0) return unsupportedHere();
    bw = d.traffic * S / (g.deviceCopyGBs * c_.bandwidthScale[nv] * eff * kBytesPerUsPerGBs);
    overlapped = -1;
    alone = -1;
    if (proto == Protocol::simple) {
      const double C =
          std::clamp(std::ceil(S / g.deviceBytesPerChannel), 1.0, double(g.deviceChannels));
      // A slice is its share of the slot, cut at 16 bytes (as exec::Geometry cuts it).
      const double slice =
          std::max(16.0, std::floor(g.deviceSlotBytes / d.maxMessageBlocks / 16) * 16);
      // Every pass waits out the chain of flags in full (fitted on the H200: a step's wait was
      // 5-6 us from 4 to 256 MB on 8 ranks, so a pass of a quarter slot costs a whole chain),
      // and an algorithm whose steps wait on every peer at once (two-shot's reduce and gather)
      // also waits out the slowest of them in every pass.
      const double passes = std::max(1.0, std::ceil(S / (d.blocksPerSegment * C * slice)));
      const double chain = lat - t.base;
      lat = t.base + chain * passes;
      if (algorithm == "twoshot") lat += g.deviceAllPeersUs * std::max(0, n - 2) * passes;
    }
  }
  // The first pass pays postings and bytes in full. In the pipelined passes after it, channels
  // post their messages independently: while one posts, the others keep the links busy, so the
  // postings cost only where one channel's postings and its share of the bytes outlast
  // everyone's bytes.
  const double C = channels, m = passCount;
  const double linkBound = overlapped >= 0 ? std::min(bw, overlapped) : bw;
  const double steady = alone >= 0 ? std::max(post + std::min(bw, alone) / C, linkBound)
                        : C > 1    ? std::max(post + bw / C, linkBound)
                                   : post + bw;
  const double moving = (post + bw) / m + (m - 1) / m * steady;
  e.bandwidthUs = bw;
  e.latencyUs = lat + moving - bw;
  e.timeUs = lat + moving;
  return e;
}

}  // namespace weft::algo
