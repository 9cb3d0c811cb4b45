// The one selector: every way a communicator can run a call is a candidate. Schedules (ring, PAT,
// one-shot, ...) are priced by the cost model on the rank graph (the Tuner); the runtime's kernels
// that run without a schedule (the host slots, the host direct path, the GPU direct kernels)
// declare what they serve (KernelSet) and are offered in the ranges where they were measured to
// beat every schedule (KernelConstants, a tuning file's "kernels"). The runtime runs what the
// plan names; weft-plan makes the same pick from the same graph and constants.
#pragma once

#include <bitset>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "algorithms/attention_plan.hpp"
#include "algorithms/moe_plan.hpp"
#include "algorithms/overlap.hpp"
#include "algorithms/rank_graph.hpp"
#include "algorithms/tuner.hpp"
#include "topology/system.hpp"

namespace weft::algo {

// What a communicator can run besides schedules through its FIFOs, for calls on one kind of
// memory.
struct KernelSet {
  bool gpu = false;  // calls on GPU memory (else host memory)
  // GPU: one round of the direct kernels' slabs (0: no direct kernels), and the rounds a call
  // may take (negative: the constants' for the rank count; 0: none).
  std::size_t directRoundBytes = 0;
  int directRounds = -1;
  // Host: the collectives the slots and the direct path serve (by Collective), none where the
  // ranks cannot (not all on one host, ...), and their sizes (none: the constants').
  std::bitset<8> slots, direct;
  std::optional<std::size_t> slotsMaxBytes, directMinBytes;
  bool sameDevice = false;  // GPU: the ranks share one device (and its codec bandwidth)
  bool peerMemory = false;  // GPU: the ranks map each other's buffers (CUDA IPC, one host)
};

// A block-scaled codec a call may cross the wire through (fused/fp8): one byte a value plus
// `scaleBytes` a block of `block` values, each rank's share padded to whole blocks.
struct CodecShape {
  std::string name;  // "e4m3:32"
  std::size_t block = 32;
  std::size_t scaleBytes = 1;
  std::size_t valueBytes = 2;  // of the call's type
  std::size_t paddedValues(std::size_t values) const {
    return (values + block - 1) / block * block;
  }
  // One rank's share of `values` values, encoded: its elements, then its scales, in whole
  // 16 bytes (fused/fp8/codec.hpp's Segments).
  std::size_t segmentBytes(std::size_t values) const {
    const std::size_t p = paddedValues(values);
    return (p + p / block * scaleBytes + 15) / 16 * 16;
  }
  // All-reduce's share a rank reduces of `count` values: whole blocks, so that every block of
  // values starts at a multiple of `block`.
  std::size_t share(std::size_t count, int nranks) const {
    const auto n = static_cast<std::size_t>(nranks < 1 ? 1 : nranks);
    return paddedValues((count + n - 1) / n);
  }
};

class Selector {
 public:
  Selector(RankGraph graph, TunerOptions options, KernelSet kernels);

  // The plan for a call of `bytes` (the whole message: an all-gather's holds every rank's input).
  Result<Plan> plan(Collective coll, std::size_t bytes) const;
  // A call the caller allowed to compress (all-reduce, reduce-scatter, all-gather of `bytes`,
  // counted as plan() counts them): the compressed variant (encode, the exchange of the encoded
  // bytes, decode and sum; Plan::codec set) priced with the codec's speed against the call as it
  // is, the cheaper returned; `always`: the compressed one.
  Result<Plan> planCompressed(Collective coll, std::size_t bytes, const CodecShape& codec,
                              bool always = false) const;
  // A tensor-parallel operation (algorithms/overlap.hpp): unfused or in chunks, priced with
  // the constants' GEMM rate and this selector's plans of the collective; `forcedChunks` > 0
  // (1: unfused) or kTpFused prices just that variant.
  Result<TpPlan> planTp(const TpShape& shape, int forcedChunks = 0) const;
  // Context-parallel attention (attention_plan.hpp): ring or Ulysses, the cheaper unless forced,
  // on the faster local kernel of those that cover the shape unless `kernel` is forced.
  Result<AttentionPlan> planAttention(const AttentionShape& shape,
                                      std::optional<CpAlgo> forced = std::nullopt,
                                      std::optional<AttentionKernel> kernel = std::nullopt) const;
  // MoE dispatch and combine (moe_plan.hpp) of a routing's traffic: each way priced as an
  // all-to-all of the busiest rank's bytes; across hosts (traffic.rails) the flat and the
  // hierarchical path priced by their busiest host's network bytes, the cheaper picked unless
  // `hierarchical` forces one.
  Result<MoePlan> planMoe(const MoeShape& shape, const MoeTraffic& traffic,
                          std::optional<bool> hierarchical = std::nullopt) const;
  // MoE on GPU memory (every rank `shape.tokens`; the ranks of one host): the mode and channels
  // priced from the traffic's busiest rank through the device's memory (ranks sharing one) or
  // its links, with each mode's kernels and scans (the tuning file's "moe"); `lowLatency`,
  // `channels` (> 0) and normal mode's `placeFromTable` force them.
  Result<MoeGpuPlan> planMoeGpu(const MoeShape& shape, const MoeTraffic& traffic,
                                std::optional<bool> lowLatency = std::nullopt, int channels = 0,
                                std::optional<bool> placeFromTable = std::nullopt) const;
  // Whether the GPU direct kernel runs `algorithm` for a call of `bytes` (one-shot or two-shot
  // all-reduce; one-shot all-gather, reduce-scatter, all-to-all).
  bool directServes(Collective coll, std::string_view algorithm, std::size_t bytes) const;
  // The rounds a direct call may take.
  int directRounds() const;

  const Tuner& tuner() const { return tuner_; }
  const KernelSet& kernels() const { return kernels_; }
  const KernelConstants& constants() const { return options_.constants.kernels; }
  const TunerOptions& options() const { return options_; }

 private:
  Result<Plan> planGpu(Collective coll, std::size_t bytes) const;
  Result<Plan> planHost(Collective coll, std::size_t bytes) const;
  bool forced() const { return !options_.algorithms.empty(); }

  TunerOptions options_;
  Tuner tuner_;
  KernelSet kernels_;
};

// The constants GPU calls are priced with: where the ranks share a device and the constants are
// not a tuning file's (fitted on such ranks), a dependent step of the bulk protocol (a flag
// store, a poll through L2, the block's barriers, the upstream's lag) costs the graphs'
// device_hop_latency_us; and where the device's peak memory rate is known (memoryPeakGBs > 0),
// the GEMMs' memory rate is the H200's default scaled to it.
CostConstants gpuConstants(CostConstants c, bool sameDevice, bool fromTuningFile,
                           double memoryPeakGBs = 0);
// The GPU selector on `graph` (gpuRankGraph's) as the runtime makes it: the direct kernels'
// round (0: none; ranks of one host only) and rounds (KernelSet::directRounds).
Selector gpuSelectorOn(RankGraph graph, bool sameDevice, TunerOptions options, bool oneHost,
                       std::size_t directRoundBytes, int directRounds = -1);
// The GPU selector for `ranks` ranks sharing one device of `sms` SMs (processes under MPS), as
// the runtime makes it for them before their device is set up: what weft-plan tp --share picks
// with, and the runtime once the device is set up where it has that peak memory rate.
// `fromTuningFile`: the options' constants are a tuning file's.
Selector sharedGpuSelectorFor(int ranks, int sms, TunerOptions options, bool fromTuningFile,
                              double memoryPeakGBs = 0);
// The GPU selector for ranks one per GPU of `system`, as the runtime makes it for them before
// their devices are set up (the direct kernels' largest round): what weft-plan tune picks with.
// `fromTuningFile` and `memoryPeakGBs` as for sharedGpuSelectorFor.
Selector gpuSelectorFor(const topo::System& system, TunerOptions options,
                        bool fromTuningFile = false, double memoryPeakGBs = 0);

// The selector of calls on host memory, as the runtime makes it (weft-plan tune --host-ranks
// prices with it too): ranks with `share` of a core at the fewest, their default copy and fold
// rates scaled to it and, below 1, their phases taking turns on the CPUs; each host's network at
// the options' net_gbs (weft-perf --calibrate), else `nicGBs` (its fastest NIC), else 10 GbE.
Selector hostSelectorFor(const Placement& placement, double nicGBs, TunerOptions options,
                         double share, KernelSet kernels = {});
// The network rate a host's ranks are priced at there (GB/s a host).
double hostNetworkGBs(const GraphConstants& c, double nicGBs);

}  // namespace weft::algo
