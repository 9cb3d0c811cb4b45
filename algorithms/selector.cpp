#include "algorithms/selector.hpp"

#include <algorithm>

namespace weft::algo {

std::string_view name(Kernel k) {
  switch (k) {
    case Kernel::schedule:
      return "schedule";
    case Kernel::slots:
      return "slots";
    case Kernel::hostDirect:
      return "host direct path";
    case Kernel::gpuDirect:
      return "direct kernel";
  }
  return "?";
}

namespace {

// GPU ranks of one host: the double binary tree, halving-doubling and the hierarchical
// all-to-all ran slower than ring and pairwise wherever measured there (one H200: up to 2.1x;
// two H200s: ring and pairwise the fastest of every forced algorithm; docs/perf-gpu.md, "where 8
// ranks' time went" and "the GPU tuner calibrated"), so only WEFT_ALGO picks them. Across
// hosts, the model's (and the simulator's) choice stands. Host ranks short of a core each: the
// hierarchical all-to-all, whose blocks stage through scratch and cross hosts through the slots
// (pairwise's go direct), ran 1.4-3x slower than the fastest forced algorithm at every size from
// 64 KB to 64 MB across four namespace hosts, and from 256 KB to 4 MB on one host
// (docs/perf-hosts.md, "the regret"), so only WEFT_ALGO picks it there. The linear all-to-all
// is unmeasured on GPUs, and its estimate there (its sends priced one after another, as the
// kernels copy them) does not track the simulator (0.4-12x its time across PCIe servers and
// HGX H200s): WEFT_ALGO's on GPUs.
TunerOptions withMeasured(TunerOptions o, const RankGraph& g, const KernelSet& k) {
  auto leave = [&](const char* a) {
    if (std::find(o.unpriced.begin(), o.unpriced.end(), a) == o.unpriced.end())
      o.unpriced.emplace_back(a);
  };
  if (k.gpu && g.hosts == 1) {
    for (const char* a : {"dbtree", "rhd", "hierarchical"}) leave(a);
  }
  if (k.gpu) leave("linear");
  if (!k.gpu && g.coresPerRank < 1) leave("hierarchical");
  return o;
}

}  // namespace

Selector::Selector(RankGraph graph, TunerOptions options, KernelSet kernels)
    : options_(withMeasured(std::move(options), graph, kernels)),
      tuner_(std::move(graph), options_),
      kernels_(kernels) {}

Result<Plan> Selector::plan(Collective coll, std::size_t bytes) const {
  return kernels_.gpu ? planGpu(coll, bytes) : planHost(coll, bytes);
}

int Selector::directRounds() const {
  return kernels_.directRounds >= 0 ? kernels_.directRounds
                                    : constants().gpuDirectRoundsFor(tuner_.graph().nranks);
}

bool Selector::directServes(Collective coll, std::string_view algorithm, std::size_t bytes) const {
  if (!kernels_.gpu || kernels_.directRoundBytes == 0) return false;
  const KernelConstants& k = constants();
  const int n = tuner_.graph().nranks;
  const std::size_t most = kernels_.directRoundBytes * static_cast<std::size_t>(directRounds());
  if (coll == Collective::allReduce)
    return bytes <= most && (algorithm == "oneshot" || algorithm == "twoshot");
  // The block collectives' one-shot, by the bytes of each rank's input (an all-gather's is one
  // block of the call's), at most 64 ranks (a slab holds a share of every rank's piece).
  const bool blocks = coll == Collective::allGather || coll == Collective::reduceScatter ||
                      coll == Collective::allToAll;
  const std::size_t input = coll == Collective::allGather ? bytes / std::size_t(n) : bytes;
  const std::size_t limit = n <= 2 ? std::min(most, k.gpuDirectPairMaxBytes)
                            : coll != Collective::allGather
                                ? std::min(most, k.gpuDirectExchangeMaxBytes)
                                : most;
  return blocks && algorithm == "oneshot" && n <= 64 && input <= limit;
}

Result<Plan> Selector::planGpu(Collective coll, std::size_t bytes) const {
  const KernelConstants& k = constants();
  const int n = tuner_.graph().nranks;
  auto plan = tuner_.plan(coll, bytes);
  if (!plan) return plan;
  const bool protocolForced = options_.protocol.has_value();
  // The direct kernels, where they serve: one-shot at every size up to gpuTwoShotMinRanks
  // ranks and to gpuOneShotMaxBytes beyond, two-shot past it.
  const char* direct =
      coll == Collective::allReduce && n >= k.gpuTwoShotMinRanks && bytes > k.gpuOneShotMaxBytes
          ? "twoshot"
          : "oneshot";
  if (directServes(coll, direct, bytes) && !forced() && !protocolForced &&
      plan->algorithm != direct) {
    for (const Estimate& e : tuner_.explain(coll, bytes)) {
      if (e.algorithm != direct) continue;
      plan->algorithm = e.algorithm;
      plan->protocol = e.protocol;
      plan->estimateUs = e.timeUs;
      plan->reason =
          "the direct " + std::string(direct) + " kernel up to " +
          std::to_string((kernels_.directRoundBytes * static_cast<std::size_t>(directRounds())) >>
                         10) +
          " KiB on GPU; " + plan->reason;
      break;
    }
  }
  // The ll protocol moves one 16 KiB message at a time per channel on GPU, so past small sizes
  // it is far slower than the model says: there the bulk protocol runs.
  if (plan->protocol == Protocol::ll && bytes > k.gpuLlMaxBytes && !protocolForced &&
      !directServes(coll, plan->algorithm, bytes)) {
    auto simple = tuner_.plan(coll, bytes, Protocol::simple);
    if (!simple) return simple;
    simple->reason = "the bulk protocol past " + std::to_string(k.gpuLlMaxBytes / 1024) +
                     " KiB on GPU; " + simple->reason;
    plan = std::move(simple);
  }
  // Past the direct kernels, one-shot and two-shot would run as schedules through the FIFOs,
  // every peer's message at once: the block collectives' one-shot was never measured there, and
  // the all-reduces lost to ring wherever they were (one H200, two H200s; docs/perf-gpu.md, "the
  // GPU tuner calibrated"). The next cheapest runs instead unless WEFT_ALGO asks for them.
  const bool allPairs = plan->algorithm == "oneshot" || plan->algorithm == "twoshot";
  const bool pastDirect = coll != Collective::allReduce
                              ? plan->algorithm == "oneshot"
                              : kernels_.directRoundBytes > 0 && directRounds() > 0 && allPairs;
  if (pastDirect && !forced() && !directServes(coll, plan->algorithm, bytes)) {
    for (const Estimate& e : tuner_.explain(coll, bytes)) {
      if (e.algorithm == "oneshot" || e.algorithm == "twoshot") continue;
      if (protocolForced ? e.protocol != *options_.protocol
                         : e.protocol == Protocol::ll && bytes > k.gpuLlMaxBytes)
        continue;
      plan->algorithm = e.algorithm;
      plan->protocol = e.protocol;
      plan->aggregation = e.aggregation;
      plan->estimateUs = e.timeUs;
      tuner_.shape(e, bytes, plan->channels, plan->chunkBytes);
      plan->reason =
          "one-shot and two-shot through the FIFOs on GPU only when asked; " + plan->reason;
      break;
    }
  }
  if (directServes(coll, plan->algorithm, bytes)) {
    plan->kernel = Kernel::gpuDirect;
    // Where the ranks share a device, the kernel's own memory traffic prices it (its slabs, not
    // the schedule's FIFO slots).
    const RankGraph& g = tuner_.graph();
    if (g.deviceCopyGBs > 0) {
      auto e = tuner_.model().directEstimate(coll, bytes, plan->protocol, g,
                                             plan->algorithm == "twoshot");
      if (e) {
        plan->estimateUs = e->timeUs;
        plan->reason += "; the direct kernel at its own memory traffic: " +
                        std::to_string(static_cast<int>(e->timeUs)) + " us";
      }
    }
  }
  return plan;
}

Result<Plan> Selector::planHost(Collective coll, std::size_t bytes) const {
  const KernelConstants& k = constants();
  const auto c = static_cast<std::size_t>(coll);
  auto plan = tuner_.plan(coll, bytes);
  if (!plan || forced()) return plan;  // a WEFT_ALGO list asks for schedules by name
  // `bytes` is the call's message: an all-gather's holds every rank's input.
  const std::size_t n = static_cast<std::size_t>(std::max(1, tuner_.graph().nranks));
  const std::size_t input = coll == Collective::allGather ? bytes / n : bytes;
  const std::size_t slotsMost = kernels_.slotsMaxBytes.value_or(k.hostSlotsMaxBytes);
  const std::size_t directLeast = kernels_.directMinBytes.value_or(k.hostDirectMinBytes);
  if (c < kernels_.slots.size() && kernels_.slots.test(c) && slotsMost > 0 && input <= slotsMost) {
    plan->algorithm = "slots";
    plan->kernel = Kernel::slots;
    plan->protocol = Protocol::simple;
    plan->channels = 1;
    plan->aggregation = 0;
    plan->reason = "every rank's input in its slot, up to " + std::to_string(slotsMost) + " B";
  } else if (c < kernels_.direct.size() && kernels_.direct.test(c) && directLeast > 0 &&
             bytes >= directLeast) {
    plan->algorithm = "direct";
    plan->kernel = Kernel::hostDirect;
    plan->protocol = Protocol::simple;
    plan->aggregation = 0;
    plan->reason =
        "every rank reads its peers' buffers, from " + std::to_string(directLeast >> 10) + " KiB";
  }
  return plan;
}

Result<Plan> Selector::planCompressed(Collective coll, std::size_t bytes, const CodecShape& codec,
                                      bool always) const {
  if (coll != Collective::allReduce && coll != Collective::reduceScatter &&
      coll != Collective::allGather)
    return invalidArgument(std::string(name(coll)) + " cannot be compressed");
  auto plain = plan(coll, bytes);
  if (!plain) return plain;
  const int n = std::max(1, tuner_.graph().nranks);
  const auto ranks = static_cast<std::size_t>(n);
  const std::size_t values = bytes / std::max<std::size_t>(1, codec.valueBytes);
  // Each rank's share of the values and its encoding; all-reduce exchanges shares twice.
  const std::size_t share = coll == Collective::allReduce ? codec.share(values, n) : values / ranks;
  const std::size_t e = codec.segmentBytes(share);
  const double valueBytes = static_cast<double>(values * codec.valueBytes);
  const double encoded = static_cast<double>(e * ranks);
  // The codec's passes over memory (bytes read plus written) and the inner collectives.
  double passes = 0, inner = 0;
  int kernels = 0;
  std::string how;
  auto exchange = [&](Collective c) -> Status {
    auto p = plan(c, e * ranks);
    if (!p) return p.status();
    inner += p->estimateUs;
    how += (how.empty() ? "" : " + ") + std::string(name(c)) + " " + p->algorithm;
    return {};
  };
  if (coll == Collective::allGather) {
    passes = static_cast<double>(share * codec.valueBytes + e) + encoded + valueBytes;
    kernels = 2;
    if (Status s = exchange(Collective::allGather); !s) return s;
  } else {
    passes = valueBytes + encoded;  // encode every share
    if (Status s = exchange(Collective::allToAll); !s) return s;
    if (coll == Collective::reduceScatter) {
      passes += encoded + static_cast<double>(share * codec.valueBytes);  // decode and sum
      kernels = 2;
    } else {
      passes += encoded + static_cast<double>(e);  // decode, sum, encode the sums
      passes += encoded + valueBytes;              // decode every rank's sums
      kernels = 3;
      if (Status s = exchange(Collective::allGather); !s) return s;
    }
  }
  const CodecConstants& cc = options_.constants.codecs;
  const double rate = kernels_.gpu ? cc.deviceGBs / (kernels_.sameDevice ? n : 1) : cc.hostGBs;
  const double codecUs = passes / (rate * 1e3) + (kernels_.gpu ? kernels * cc.deviceLaunchUs : 0.0);
  const double us = codecUs + inner;
  if (!always && us >= plain->estimateUs) {
    plain->reason = "uncompressed (" + codec.name + " would take " +
                    std::to_string(static_cast<int>(us)) + " us); " + plain->reason;
    return plain;
  }
  Plan p;
  p.algorithm = "compressed";
  p.codec = codec.name;
  p.estimateUs = us;
  p.reason = codec.name + " over " + how + ", " + std::to_string(static_cast<int>(us)) +
             " us against " + std::to_string(static_cast<int>(plain->estimateUs)) +
             " us uncompressed" + (always ? " (compression asked for always)" : "");
  return p;
}

CostConstants gpuConstants(CostConstants c, bool sameDevice, bool fromTuningFile,
                           double memoryPeakGBs) {
  if (fromTuningFile) return c;
  if (sameDevice)
    c.hopLatency[static_cast<std::size_t>(Protocol::simple)]
                [static_cast<std::size_t>(LinkClass::nvlink)] = c.graphs.deviceHopLatencyUs;
  // A GEMM streams, and the kernels sharing a device copy, at the same fraction of any HBM
  // device's peak (docs/perf-tp.md, "Small GEMMs: the memory's price"; docs/perf-gpu.md, "The
  // shared device's model refitted").
  if (memoryPeakGBs > 0) {
    const double scale = memoryPeakGBs / GemmConstants::kH200PeakMemoryGBs;
    c.gemm.memoryGBs *= scale;
    c.graphs.deviceCopyGBs *= scale;
  }
  return c;
}

Selector gpuSelectorOn(RankGraph graph, bool sameDevice, TunerOptions options, bool oneHost,
                       std::size_t directRoundBytes, int directRounds) {
  KernelSet k;
  k.gpu = true;
  // The direct kernels map every rank's buffers (CUDA IPC): ranks of one host only.
  k.directRoundBytes = oneHost ? directRoundBytes : 0;
  k.directRounds = directRounds;
  k.sameDevice = sameDevice;
  k.peerMemory = oneHost;
  return Selector(std::move(graph), std::move(options), k);
}

Selector sharedGpuSelectorFor(int ranks, int sms, TunerOptions options, bool fromTuningFile,
                              double memoryPeakGBs) {
  DeviceShape shape;
  shape.channels = DeviceShape::autoChannels(sms, ranks);
  options.constants = gpuConstants(options.constants, true, fromTuningFile, memoryPeakGBs);
  RankGraph graph = sameDeviceRankGraph(ranks, shape, options.constants.graphs);
  const std::size_t round = options.constants.kernels.gpuDirectRoundBytes;
  return gpuSelectorOn(std::move(graph), true, std::move(options), true, round);
}

Selector gpuSelectorFor(const topo::System& system, TunerOptions options, bool fromTuningFile,
                        double memoryPeakGBs) {
  options.constants = gpuConstants(options.constants, false, fromTuningFile, memoryPeakGBs);
  const std::size_t round = options.constants.kernels.gpuDirectRoundBytes;
  return gpuSelectorOn(RankGraph::fromSystem(system), false, std::move(options),
                       system.hosts() == 1, round);
}

Selector hostSelectorFor(const Placement& placement, double nicGBs, TunerOptions options,
                         double share, KernelSet kernels) {
  GraphConstants& graphs = options.constants.graphs;
  graphs = atCoreShare(graphs, share);
  RankGraph graph = hostRankGraph(placement, hostNetworkGBs(graphs, nicGBs), graphs);
  graph.coresPerRank = std::min(1.0, share);
  return Selector(std::move(graph), std::move(options), kernels);
}

double hostNetworkGBs(const GraphConstants& c, double nicGBs) {
  // A host that lists no NIC still reaches the others (UCX over TCP): priced as 10 GbE.
  constexpr double kUnlistedNetGBs = 1.25;
  return c.netGBs > 0 ? c.netGBs : nicGBs > 0 ? nicGBs : kUnlistedNetGBs;
}

}  // namespace weft::algo
