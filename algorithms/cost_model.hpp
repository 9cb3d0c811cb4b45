// The cost model: an alpha-beta estimate of every algorithm on a system, per protocol, in the
// shape of NCCL's tuning model (time = base latency + hops x per-hop latency + bytes / bandwidth),
// with NCCL's published constants as defaults (docs/algorithms.md cites them). A JSON tuning file
// (written by weft-perf --calibrate) replaces any of them.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "topology/system.hpp"
#include "weft/status.hpp"
#include "weft/types.hpp"

namespace weft::algo {

class Algorithm;

enum class Protocol : std::uint8_t { ll, simple };
inline constexpr std::array<Protocol, 2> kAllProtocols = {Protocol::ll, Protocol::simple};
std::string_view name(Protocol p);
std::optional<Protocol> parseProtocol(std::string_view s);

// The path classes the model prices separately.
enum class LinkClass : std::uint8_t { nvlink, pcie, network };
inline constexpr int kNumLinkClasses = 3;
LinkClass linkClassOf(topo::PathClass c);

// Where the runtime's kernels beat every schedule on the machine class they were measured on:
// the ranges in which the selector (algorithms/selector.hpp) offers each, a tuning file's
// "kernels" section. The defaults are the H200 machine's (docs/perf-gpu.md, "The direct kernels in
// rounds" and "The direct path through the stages"); the names are the JSON keys.
struct KernelConstants {
  // gpu_direct_rounds: the direct GPU kernels take calls of up to this many rounds of their
  // slabs, by rank count ({ranks at most, rounds}, ascending; the last entry covers the rest).
  std::vector<std::pair<int, int>> gpuDirectRounds{{2, 4}, {4, 16}, {64, 64}};
  // gpu_direct_round_bytes: one round of the slabs (the runtime uses its device's; tools this).
  std::size_t gpuDirectRoundBytes = 4u << 20;
  // gpu_oneshot_max_bytes, gpu_twoshot_min_ranks: the direct all-reduce runs two-shot from this
  // many ranks past this many bytes, one-shot otherwise.
  std::size_t gpuOneShotMaxBytes = 128u << 10;
  int gpuTwoShotMinRanks = 5;
  // gpu_direct_exchange_max_bytes, gpu_direct_pair_max_bytes: the direct reduce-scatter and
  // all-to-all take inputs up to this many bytes a rank (all three block collectives on 2 ranks
  // up to the pair's).
  std::size_t gpuDirectExchangeMaxBytes = 4u << 20;
  std::size_t gpuDirectPairMaxBytes = 8u << 20;
  // gpu_ll_max_bytes: schedules on GPU memory use the ll protocol up to this many bytes.
  std::size_t gpuLlMaxBytes = 64u << 10;
  // gpu_registered_oneshot_max_ranks, gpu_registered_oneshot_min_bytes: one-shot reads
  // registered inputs in place up to this many ranks at any size, and beyond from this size.
  int gpuRegisteredOneShotMaxRanks = 2;
  std::size_t gpuRegisteredOneShotMinBytes = 4u << 20;
  // host_slots_max_bytes, host_direct_min_bytes: calls on host memory go through the slots up
  // to this many bytes of a rank's input, the direct path from this many bytes of the message.
  std::size_t hostSlotsMaxBytes = 4096;
  std::size_t hostDirectMinBytes = 256u << 10;

  int gpuDirectRoundsFor(int nranks) const;
};

// The figures the runtime's own graphs are made of where no topology gives them: ranks on host
// memory (shared memory within a host) and ranks whose kernels share one GPU. A tuning file's
// "graphs" section; the defaults are the machines' of docs/perf.md ("Host all-reduce on 2 ranks,
// the 2-core CI-class machine"; "where 8 ranks' time went"). The names are the JSON keys.
struct GraphConstants {
  double hostCopyGBs = 8.0;         // host_copy_gbs: a rank's copies through shared memory
  double hostFoldGBs = 48.0;        // host_fold_gbs: a rank's reductions, in series with them
  double deviceCopyGBs = 4100;      // device_copy_gbs: one GPU's memory, read + written
  double deviceAllPeersUs = 12.0;   // device_all_peers_us: an all-peers wait, per peer past one
  double deviceHopLatencyUs = 5.0;  // device_hop_latency_us: a bulk step's wait on one GPU
  double deviceP2pGBs = 60;         // device_p2p_gbs: a large GPU send/recv, ranks sharing a GPU
  // net_gbs: one host's rate to the others on host memory (weft-perf --calibrate measures it
  // where ranks span hosts); 0: its fastest discovered NIC's, or 10 GbE where it lists none.
  double netGBs = 0;
};

// The constants of ranks with `share` of a core each (below 1: more ranks than CPUs, as network
// namespaces of one machine): the default copy and fold rates scaled by it, since a rank copies
// at its share; rates a tuning file set stand as measured.
GraphConstants atCoreShare(GraphConstants g, double share);

// How fast the fp8 codecs run (fused/fp8), for pricing compressed calls: bytes read plus written
// per second. A tuning file's "codecs"; the defaults are the H200 machine's (docs/perf-fused.md,
// "FP8 codecs against the device's copy" and "Compressed collectives").
struct CodecConstants {
  double hostGBs = 1.0;         // host_gbs: one rank's codec on host memory (its encode)
  double deviceGBs = 3500;      // device_gbs: one GPU's, shared by the ranks on it
  double deviceLaunchUs = 4.0;  // device_launch_us: one codec kernel's launch and tail
};

// How fast a GPU multiplies matrices (fused/tp's cuBLASLt GEMMs), for pricing the tensor-parallel
// operations: a GEMM of F flops takes launch + (F + half) / rate, so it runs at half its large
// rate at F = half. A tuning file's "gemm"; the defaults are the H200 machine's bf16 figures
// (docs/perf-tp.md).
struct GemmConstants {
  double tflops = 700;      // tflops: one GPU's rate, shared by the ranks on it
  double fp8Tflops = 1400;  // fp8_tflops: the same for fp8 (e4m3) inputs
  double halfGflop = 8;     // half_gflop: the flops (in 1e9) at which it runs at half that
  double launchUs = 4;      // launch_us: one GEMM's launch and tail
  // memory_gbs: the rate one GPU's GEMMs read A and B and write C, shared by the ranks on it; a
  // GEMM takes at least its bytes over it (small M: B's read). The H200's (0.9 of its peak, as
  // an H100's GEMMs ran; its own read 0.84-0.89); a device whose peak differs gets this times its
  // peak over kH200PeakMemoryGBs (gpuConstants). docs/perf-tp.md, "Small GEMMs: the memory's
  // price".
  double memoryGBs = 4300;
  // The H200's peak memory rate as the runtime reads it (CUDA's memory clock and bus width, on an
  // H200 on 2026-12-07), so that an H200 runs the defaults unscaled.
  static constexpr double kH200PeakMemoryGBs = 4814;
  // overlap_slowdown: a chunk's GEMM and the next chunk's collective (its kernel on SMs beside
  // the GEMM) each take this much longer than alone; gated chunks on one H100, 2026-12-07.
  double overlapSlowdown = 1.1;
  // copy_slowdown: a fused call's copy-engine copy slows the GEMM beside it by its time times
  // this - 1. docs/perf-tp.md, "The fused copies at their own traffic".
  double copySlowdown = 1.5;
  // attention_tflops, attention_backward_tflops: weft's attention kernels' rates on one GPU
  // (backward counting 2.5 times the forward's FLOPs); H200 figures, docs/perf-fused.md.
  double attentionTflops = 340;
  double attentionBackwardTflops = 285;
  double attentionCudnnTflops = 600;  // attention_cudnn_tflops: cuDNN's forward kernel's
};

// How the MoE kernels on GPU memory run (fused/moe/device.cu), for pricing their two modes and
// their channels (algorithms/moe_gpu_plan.cpp). A tuning file's "moe"; the defaults are fitted
// to the H200 machine's sweeps (docs/perf-fused.md, "Modes and channels").
struct MoeConstants {
  double kernelUs = 1.53;           // kernel_us: one kernel of a call's chain (normal mode's)
  double lowLatencyKernelUs = 4.0;  // low_latency_kernel_us: each of low latency's dispatch two
  double peerUs = 4.45;             // peer_us: an all-peers wait, per peer past the rank itself
  double scanUs = 2.6;     // scan_us: a layout, count or place step over 256 tokens or records
  double numberUs = 13.5;  // number_us: a numbering step over 256 tokens (low latency's)
  double chunkUs = 8.5;    // chunk_us: each of normal mode's two kernels numbering 256-token chunks
  // half_rate_blocks: a device's copies run at rate · blocks / (blocks + this), the blocks of
  // every rank on it counted.
  double halfRateBlocks = 132;
  double spinBlocks = 256;  // spin_blocks: blocks that may wait on peers at once on one GPU
};

struct CostConstants {
  // Per protocol: fixed cost of a collective (launch, setup), us.
  std::array<double, 2> baseLatency{6.6, 8.4};
  // Per protocol and link class: cost of one hop (one dependent step), us.
  std::array<std::array<double, kNumLinkClasses>, 2> hopLatency{
      {{0.6, 1.0, 2.7}, {3.4, 5.7, 14.0}}};
  // Per protocol and link class: what the sender spends on each message beyond its bytes (LogGP's
  // o: posting, flags, the NIC's doorbell), us. It is why thousands of tiny messages are not free.
  std::array<std::array<double, kNumLinkClasses>, 2> messageOverhead{
      {{0.05, 0.1, 0.5}, {0.2, 0.3, 1.0}}};
  // Per protocol: the fraction of link bandwidth the protocol delivers.
  std::array<double, 2> bandwidthEfficiency{0.5, 1.0};
  // Multiplies every bandwidth of a class (1 = the topology's figures).
  std::array<double, kNumLinkClasses> bandwidthScale{1.0, 1.0, 1.0};
  // PAT keeps at most this many bytes of one message in flight per connection.
  double patStagingBytes = 8.0 * 1024 * 1024;
  KernelConstants kernels;  // "kernels"
  GraphConstants graphs;    // "graphs"
  CodecConstants codecs;    // "codecs"
  GemmConstants gemm;       // "gemm"
  MoeConstants moe;         // "moe"
  // "settings": the runtime's tuning settings by key (gpu_ll_blocks, host_slot_bytes, ...: the
  // environment variable's name in lower case without WEFT_), as text; the runtime checks them
  // (src/core/config.cpp) and its environment overrides them.
  std::vector<std::pair<std::string, std::string>> settings;

  // Reads a tuning file; keys it lacks keep these defaults. Errors name the file and key.
  static Result<CostConstants> fromJsonFile(const std::string& path);
  static Result<CostConstants> fromJson(const std::string& text, const std::string& source);
  std::string toJson() const;
};

// What the model needs to know of where the ranks sit.
struct RankGraph {
  int nranks = 1;
  int ranksPerHost = 1;
  int hosts = 1;
  topo::PathClass intraClass = topo::PathClass::loc;  // the worst GPU-GPU class inside a host
  double intraBandwidth = 0;  // GB/s, the narrowest GPU-GPU path inside a host
  double netPerRank = 0;      // GB/s, one GPU to the network when every GPU sends (NICs shared)
  double netAlone = 0;        // GB/s, one GPU to the network while the others are quiet
  double fabricLatency = 0;   // us, added to each network hop beyond the NIC software

  // Per-flow bandwidth (GB/s) of traffic patterns inside a host, every GPU sending at once, with
  // the flows that share a link sharing it: what contention-aware estimates are made of.
  std::vector<double> shiftBw;  // [d]: local GPU l sends to (l + d) mod G; [0] unused
  std::vector<double> xorBw;    // [m]: l sends to l ^ m (G a power of two; m < G)
  double allPairsBw = 0;        // every GPU to every other
  double matchingBw = 0;        // l <-> (k - l) mod G, the pairwise exchange, averaged over k
  double treeBw = 0;            // every edge of both double-binary trees, both directions
  // Rings through a host with C channels (index C-1), each channel's ring rotated to enter at
  // local C and leave at local C-1 through those GPUs' NICs, every channel carrying 1/C of the
  // data: the bandwidth at which a whole block passes the GPU-to-GPU hops, and the host crossing.
  // The worst root-to-leaf path of the double binary tree's two trees on this placement: hops
  // that cross hosts, then hops that stay inside one (hosts cut subtrees unless G is a power of 2).
  int treeHopsAcross = 0;
  int treeHopsCrossRail = 0;  // of those across hosts, the hops between rails
  int treeHopsInside = 0;
  std::vector<double> ringIntraBw;
  std::vector<double> ringCrossBw;
  // A shift by d < G across a row of hosts (Bruck's early rounds): local GPU l sends to l + d,
  // inside its host for l < G - d and to the next host's l + d - G otherwise, everyone at once.
  // [d]: the per-flow bandwidth of the flows that stay inside and of those that cross (their
  // GPU-NIC routes and NICs shared among them); [0] unused.
  std::vector<double> shiftInsideBw;
  std::vector<double> shiftCrossBw;
  std::vector<int> nicOf;    // local GPU -> its NIC (node index; -1: none)
  int ranksPerNic = 1;       // the most local GPUs whose nearest NIC is one NIC
  double switchLatency = 0;  // us per fabric switch: 1 between NICs of one rail, 3 across rails
  // Ranks sharing one device (GPU): every byte a schedule reads or writes, its messages through
  // the FIFO slots included, goes through that device's memory, which moves this many GB/s
  // counted as read + written. Then an algorithm's bandwidth term is its memory traffic (the
  // verifier's totalMemory) over this, in place of its transfers over links. 0: not shared.
  double deviceCopyGBs = 0;
  // How a bulk call is cut there: a channel (thread block) for every deviceBytesPerChannel, at
  // most deviceChannels, each moving its share in slices of one FIFO slot, pass after pass. A
  // block waits out the algorithm's chain of flags again in every pass, a partial pass as a
  // whole one (each step's wait is a flag's round trip and the upstream's lag, whatever the
  // step moves); an all-peers wait (two-shot's reduce and gather) adds deviceAllPeersUs per
  // peer past one in every pass.
  int deviceChannels = 16;
  double deviceBytesPerChannel = 512 * 1024;
  double deviceSlotBytes = 256 * 1024;
  double deviceAllPeersUs = 0;
  // Ranks on host memory (the shared-memory transport): a rank's CPU folds the bytes its
  // reductions combine at this many GB/s, in series with its copies, so schedules that move the
  // same bytes but fold different amounts differ (one-shot all-reduce folds every peer's whole
  // vector, two-shot and ring a 1/n share of each). 0: folding is free (GPU kernels fold while
  // they copy).
  double hostReduceGBs = 0;
  // Ranks on host memory (the CPU executor): a send to another host is handed to UCX, which moves
  // it while the rank goes on to its next step; GPU kernels copy their sends one after another.
  bool hostMemory = false;
  // The CPU share of the rank that has the least (1: a core each, 0.25: four ranks to a CPU).
  // Below 1 a rank's copies, its folding and its network transfers take turns on the CPUs it
  // shares, so an algorithm's phases never run beside each other (their times add).
  double coresPerRank = 1;

  // The ranks of `system`, one per GPU; localGpus: the GPUs (indices into the host's) a host's
  // ranks use, in local-rank order (empty: every GPU). rank_graph.cpp.
  static RankGraph fromSystem(const topo::System& system, const std::vector<int>& localGpus = {});
};

struct Estimate {
  std::string algorithm;
  Protocol protocol = Protocol::simple;
  int aggregation = 0;  // PAT's A
  double timeUs = 0;
  double latencyUs = 0;    // the part that does not scale with bytes
  double bandwidthUs = 0;  // the part that does
};

class CostModel {
 public:
  explicit CostModel(CostConstants c = {}) : c_(c) {}
  const CostConstants& constants() const { return c_; }

  // The estimate of one algorithm; unsupported pairs return an error.
  Result<Estimate> estimate(std::string_view algorithm, Collective coll, std::size_t bytes,
                            Protocol proto, const RankGraph& g) const;
  // The same for an algorithm object: its own part (Algorithm::price, beside its generator) and
  // what every algorithm pays alike (host folding, a shared device's memory traffic, the
  // pipelined passes).
  Result<Estimate> estimate(const Algorithm& algorithm, Collective coll, std::size_t bytes,
                            Protocol proto, const RankGraph& g) const;
  // The direct kernels (one-shot's; two-shot's for an all-reduce): as the schedule of that name,
  // but where ranks share a device their memory traffic is directTraffic's.
  Result<Estimate> directEstimate(Collective coll, std::size_t bytes, Protocol proto,
                                  const RankGraph& g, bool twoShot) const;
  // The direct kernels' memory traffic on n ranks per byte of the message (the slabs read from
  // memory once, docs/algorithms-gpu.md); negative: no direct kernel.
  static double directTraffic(Collective coll, bool twoShot, int n);
  // PAT's aggregation for a message: the most blocks whose bytes fit the staging budget.
  int patAggregationFor(std::size_t bytes, int nranks) const;

  // How a protocol cuts a message: channels and the bytes of one slice on one channel. The
  // executor and the simulator use the same numbers; every slice is a message.
  static void shape(Protocol proto, std::size_t bytes, int ranksPerHost, int& channels,
                    std::size_t& chunkBytes);
  // What pricing ranks that share a device or a host's memory needs of an algorithm's schedule,
  // computed once per algorithm, collective and rank count: bytes it reads and writes over all
  // ranks per byte of the message (the verifier's totalMemory; negative when there is no such
  // schedule), the bytes the busiest rank folds in reductions (maxReduced), blocks per segment,
  // and its largest message in blocks.
  struct ScheduleShape {
    double traffic = -1;
    double reduced = 0;
    double blocksPerSegment = 1;
    double maxMessageBlocks = 1;
  };
  static ScheduleShape scheduleShape(std::string_view algorithm, Collective coll, int nranks);
  static double memoryTraffic(std::string_view algorithm, Collective coll, int nranks) {
    return scheduleShape(algorithm, coll, nranks).traffic;
  }

 private:
  // estimate(), with the memory traffic on a shared device given (negative: the schedule's).
  Result<Estimate> estimateWith(const Algorithm& algorithm, Collective coll, std::size_t bytes,
                                Protocol proto, const RankGraph& g, double trafficOverride) const;
  CostConstants c_;
};

// nccl-tests' bus bandwidth factor: what a bandwidth-optimal algorithm must move per rank.
double busBandwidthFactor(Collective coll, int nranks);

}  // namespace weft::algo
