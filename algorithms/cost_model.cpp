#include "algorithms/cost_model.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <initializer_list>
#include <map>
#include <mutex>
#include <sstream>
#include <tuple>

#include "algorithms/algorithm.hpp"
#include "algorithms/patterns.hpp"
#include "algorithms/pricing.hpp"
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

// An object of positive numbers, each key one of `keys`.
Status readPositives(const json& j, const std::string& where,
                     std::initializer_list<std::pair<const char*, double*>> keys) {
  if (!j.is_object()) return invalidArgument(where + " must be an object");
  for (auto it = j.begin(); it != j.end(); ++it) {
    bool known = false;
    for (const auto& [key, field] : keys) {
      if (it.key() != key) continue;
      if (Status s = readPositive(*it, where + "." + it.key(), *field); !s) return s;
      known = true;
    }
    if (!known) return invalidArgument(where + "." + it.key() + ": unknown key");
  }
  return {};
}

Status readGraphs(const json& j, const std::string& where, GraphConstants& g) {
  return readPositives(j, where,
                       {{"host_copy_gbs", &g.hostCopyGBs},
                        {"host_fold_gbs", &g.hostFoldGBs},
                        {"device_copy_gbs", &g.deviceCopyGBs},
                        {"device_p2p_gbs", &g.deviceP2pGBs},
                        {"device_all_peers_us", &g.deviceAllPeersUs},
                        {"device_hop_latency_us", &g.deviceHopLatencyUs},
                        {"net_gbs", &g.netGBs}});
}

Status readCodecs(const json& j, const std::string& where, CodecConstants& c) {
  return readPositives(j, where,
                       {{"host_gbs", &c.hostGBs},
                        {"device_gbs", &c.deviceGBs},
                        {"device_launch_us", &c.deviceLaunchUs}});
}

Status readGemm(const json& j, const std::string& where, GemmConstants& g) {
  return readPositives(j, where,
                       {{"tflops", &g.tflops},
                        {"fp8_tflops", &g.fp8Tflops},
                        {"half_gflop", &g.halfGflop},
                        {"launch_us", &g.launchUs},
                        {"memory_gbs", &g.memoryGBs},
                        {"overlap_slowdown", &g.overlapSlowdown},
                        {"copy_slowdown", &g.copySlowdown},
                        {"attention_tflops", &g.attentionTflops},
                        {"attention_backward_tflops", &g.attentionBackwardTflops},
                        {"attention_cudnn_tflops", &g.attentionCudnnTflops}});
}

Status readMoe(const json& j, const std::string& where, MoeConstants& m) {
  return readPositives(j, where,
                       {{"kernel_us", &m.kernelUs},
                        {"low_latency_kernel_us", &m.lowLatencyKernelUs},
                        {"peer_us", &m.peerUs},
                        {"scan_us", &m.scanUs},
                        {"number_us", &m.numberUs},
                        {"chunk_us", &m.chunkUs},
                        {"half_rate_blocks", &m.halfRateBlocks},
                        {"spin_blocks", &m.spinBlocks}});
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
    } else if (key == "graphs") {
      s = readGraphs(*it, where, c.graphs);
    } else if (key == "codecs") {
      s = readCodecs(*it, where, c.codecs);
    } else if (key == "gemm") {
      s = readGemm(*it, where, c.gemm);
    } else if (key == "moe") {
      s = readMoe(*it, where, c.moe);
    } else if (key == "settings") {
      if (!it->is_object()) return invalidArgument(where + " must be an object");
      for (auto v = it->begin(); v != it->end(); ++v) {
        if (v->is_string()) {
          c.settings.emplace_back(v.key(), v->get<std::string>());
        } else if (v->is_number()) {
          c.settings.emplace_back(v.key(), v->dump());
        } else {
          return invalidArgument(where + "." + v.key() + " must be a number or a string");
        }
      }
    } else if (key == "comment" || key == "measured_on") {
      continue;  // free text for people
    } else {
      return invalidArgument(where +
                             ": unknown key (expected base_latency_us, hop_latency_us, "
                             "message_overhead_us, bandwidth_efficiency, bandwidth_scale, "
                             "pat_staging_bytes, kernels, graphs, codecs, gemm, settings)");
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
  for (const auto& [key, value] : settings) j["settings"][key] = value;
  j["graphs"] = {{"host_copy_gbs", graphs.hostCopyGBs},
                 {"host_fold_gbs", graphs.hostFoldGBs},
                 {"device_copy_gbs", graphs.deviceCopyGBs},
                 {"device_p2p_gbs", graphs.deviceP2pGBs},
                 {"device_all_peers_us", graphs.deviceAllPeersUs},
                 {"device_hop_latency_us", graphs.deviceHopLatencyUs}};
  if (graphs.netGBs > 0) j["graphs"]["net_gbs"] = graphs.netGBs;
  j["codecs"] = {{"host_gbs", codecs.hostGBs},
                 {"device_gbs", codecs.deviceGBs},
                 {"device_launch_us", codecs.deviceLaunchUs}};
  j["moe"] = {{"kernel_us", moe.kernelUs},
              {"low_latency_kernel_us", moe.lowLatencyKernelUs},
              {"peer_us", moe.peerUs},
              {"scan_us", moe.scanUs},
              {"number_us", moe.numberUs},
              {"chunk_us", moe.chunkUs},
              {"half_rate_blocks", moe.halfRateBlocks},
              {"spin_blocks", moe.spinBlocks}};
  j["gemm"] = {{"tflops", gemm.tflops},
               {"fp8_tflops", gemm.fp8Tflops},
               {"half_gflop", gemm.halfGflop},
               {"launch_us", gemm.launchUs},
               {"memory_gbs", gemm.memoryGBs},
               {"overlap_slowdown", gemm.overlapSlowdown},
               {"copy_slowdown", gemm.copySlowdown},
               {"attention_tflops", gemm.attentionTflops},
               {"attention_backward_tflops", gemm.attentionBackwardTflops},
               {"attention_cudnn_tflops", gemm.attentionCudnnTflops}};
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
  const Algorithm* a = findAlgorithm(algorithm);
  if (a == nullptr) return unsupported("no estimate for algorithm " + std::string(algorithm));
  return estimate(*a, coll, bytes, proto, g);
}

Result<Estimate> CostModel::estimate(const Algorithm& a, Collective coll, std::size_t bytes,
                                     Protocol proto, const RankGraph& g) const {
  return estimateWith(a, coll, bytes, proto, g, -1);
}

double CostModel::directTraffic(Collective coll, bool twoShot, int n) {
  // Every rank copies its input into its slab (read and written), every slab is read from
  // memory once (the ranks' blocks that read it run together; the others' reads hit L2), and
  // every rank writes its output; two-shot also writes its summed piece into its slab.
  const double N = n;
  switch (coll) {
    case Collective::allGather:
      return N + 3;  // an input is 1/n of the message: 3/n a rank, and a whole output
    case Collective::reduceScatter:
      return 3 * N + 1;  // the input 3 times, an output of 1/n
    case Collective::allToAll:
      return 4 * N;
    case Collective::allReduce:
      return twoShot ? 4 * N + 2 : 4 * N;
    default:
      return -1;
  }
}

Result<Estimate> CostModel::directEstimate(Collective coll, std::size_t bytes, Protocol proto,
                                           const RankGraph& g, bool twoShot) const {
  const Algorithm* a = findAlgorithm(twoShot ? "twoshot" : "oneshot");
  if (a == nullptr) return unsupported("no direct kernel priced");
  const double traffic = g.deviceCopyGBs > 0 ? directTraffic(coll, twoShot, g.nranks) : -1;
  return estimateWith(*a, coll, bytes, proto, g, traffic);
}

Result<Estimate> CostModel::estimateWith(const Algorithm& a, Collective coll, std::size_t bytes,
                                         Protocol proto, const RankGraph& g,
                                         double trafficOverride) const {
  Pricing P(*this, a.name(), coll, bytes, proto, g);
  Estimate e;
  e.algorithm = std::string(a.name());
  e.protocol = proto;
  if (P.n == 1) {
    e.timeUs = e.latencyUs = P.base;
    return e;
  }
  if (Status s = a.price(P); !s) return s;
  e.aggregation = P.aggregation;
  double& lat = P.lat;
  double& bw = P.bw;
  const double S = P.S;
  if (g.hostReduceGBs > 0 && g.deviceCopyGBs <= 0) {
    // The busiest rank's folding, in series with its copies (the same CPU thread does both).
    const ScheduleShape d = scheduleShape(a.name(), coll, P.n);
    const double fold = d.reduced * S / (g.hostReduceGBs * kBytesPerUsPerGBs);
    bw += fold;
    if (P.overlapped >= 0) P.overlapped += fold;
    if (P.alone >= 0) P.alone += fold;
  }
  // Ranks short of a core each: the phases that would overlap take turns on the CPUs.
  if (g.coresPerRank < 1) P.overlapped = -1;
  if (g.deviceCopyGBs > 0) {
    // One device's memory carries everything: the bytes term is the schedule's memory traffic,
    // whatever links the algorithm would cross; hop latencies and postings stay as priced. The
    // ranks' class's bandwidth scale applies to the copy rate (what weft-perf --calibrate --gpu
    // fits, where the ranks' GPUs are not one).
    const ScheduleShape d = scheduleShape(a.name(), coll, P.n);
    if (d.traffic < 0) return P.unsupportedHere();
    const double traffic = trafficOverride >= 0 ? trafficOverride : d.traffic;
    bw = traffic * S / (g.deviceCopyGBs * c_.bandwidthScale[P.nv] * P.eff * kBytesPerUsPerGBs);
    P.overlapped = -1;
    P.alone = -1;
    if (proto == Protocol::simple) {
      const double C =
          std::clamp(std::ceil(S / g.deviceBytesPerChannel), 1.0, double(g.deviceChannels));
      // A slice is its share of the slot, cut at 16 bytes (as exec::Geometry cuts it).
      const double slice =
          std::max(16.0, std::floor(g.deviceSlotBytes / d.maxMessageBlocks / 16) * 16);
      // Every pass waits out the chain of flags in full (a pass of a quarter slot costs a whole
      // chain), and an algorithm whose steps wait on every peer at once also waits out the
      // slowest of them in every pass. Past the first pass those waits overlap the bytes: a
      // bulk call is the longer of the two (one H100, 2 to 8 ranks; docs/perf-gpu.md, "The
      // shared device's model refitted").
      const double passes = std::max(1.0, std::ceil(S / (d.blocksPerSegment * C * slice)));
      const double chain = lat - P.base;
      double waits = chain * (passes - 1);
      if (a.waitsOnEveryPeer()) waits += g.deviceAllPeersUs * std::max(0, P.n - 2) * passes;
      lat = P.base + chain + std::max(0.0, waits - bw);
    }
  }
  // The first pass pays postings and bytes in full. In the pipelined passes after it, channels
  // post their messages independently: while one posts, the others keep the links busy, so the
  // postings cost only where one channel's postings and its share of the bytes outlast
  // everyone's bytes.
  const double C = P.channels, m = P.passCount, post = P.post;
  const double linkBound = P.overlapped >= 0 ? std::min(bw, P.overlapped) : bw;
  const double steady = P.alone >= 0 ? std::max(post + std::min(bw, P.alone) / C, linkBound)
                        : C > 1      ? std::max(post + bw / C, linkBound)
                                     : post + bw;
  const double moving = (post + bw) / m + (m - 1) / m * steady;
  e.bandwidthUs = bw;
  e.latencyUs = lat + moving - bw;
  e.timeUs = lat + moving;
  return e;
}

GraphConstants atCoreShare(GraphConstants g, double share) {
  const GraphConstants defaults;
  if (share < 1 && g.hostCopyGBs == defaults.hostCopyGBs && g.hostFoldGBs == defaults.hostFoldGBs) {
    g.hostCopyGBs *= share;
    g.hostFoldGBs *= share;
  }
  return g;
}

}  // namespace weft::algo
