// Everything the runtime reads from the environment, read once per communicator and passed
// down: no code below this reads getenv. The variables are one declarative table (config.cpp:
// name, values, default, whether every rank must agree, one line of doc) from which the parser,
// the README's and docs/configuration.md's tables and weft-config come.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "algorithms/attention_plan.hpp"
#include "algorithms/tuner.hpp"
#include "weft/status.hpp"
#include "weft/weft.h"

namespace weft {

// Who a setting is for: what a user sets (the README's table), overrides of the tuning file's
// measured choices, and diagnostics (docs/configuration.md).
enum class Audience { user, tuning, diagnostic };

struct SettingDoc {
  std::string name, alias;  // alias: NCCL's name, or the former name, read where name is unset
  std::string kind;         // "2-16", "0 or 1", "auto, 0 or 1", "text", "choice"
  std::string fallback;     // the default
  bool agreed = false;      // every rank must set it alike (compared at init)
  Audience audience = Audience::user;
  std::string doc;
  std::string tuningKey;  // its key in a tuning file's "settings" ("": none)
};
std::vector<SettingDoc> settingsTable();
// The table of one audience's settings, as Markdown (the README's is Audience::user's).
std::string settingsMarkdown(Audience audience);

struct Config {
  std::chrono::milliseconds timeout{300'000};  // WEFT_TIMEOUT_S (default 300)
  std::string socketIfname;                    // WEFT_SOCKET_IFNAME
  // WEFT_COMPRESS: what the compressed calls (weftAllReduceEx, ...; the NCCL interface's sums)
  // use when given none. Off by default: it changes results.
  weftCompression compression{weftCompressNone, weftScaleE8M0, 0, 0};
  // WEFT_TP_OVERLAP: the chunks the tensor-parallel operations run in (1: unfused;
  // algo::kTpFused: fused); 0: the selector's pick (algo::Selector::planTp).
  int tpChunks = 0;
  // WEFT_CP_ATTENTION: ring or Ulysses for context-parallel attention; none: the selector's.
  std::optional<algo::CpAlgo> cpAttention;
  // WEFT_MOE_PATH: MoE dispatch and combine across hosts, flat (false) or hierarchical (true);
  // none: the selector's.
  std::optional<bool> moeHierarchical;
  // WEFT_MOE_MODE, WEFT_MOE_CHANNELS: MoE on GPU memory, normal (false) or low latency (true),
  // and the copy kernels' blocks; none, 0: the selector's (algo::Selector::planMoeGpu).
  std::optional<bool> moeLowLatency;
  std::optional<bool> moeTable;  // normal mode placing from the table (true) or counting
  int moeChannels = 0;
  // WEFT_ATTENTION_KERNEL: weft's or cuDNN's local attention kernel; none: the selector's.
  std::optional<algo::AttentionKernel> attentionKernel;
  // WEFT_TP_GEMM_SMS: the SMs a tensor-parallel GEMM that runs beside a collective plans for
  // (cuBLASLt's SM count target), leaving the rest to the collective; 0: the device's.
  int tpGemmSms = 0;
  // WEFT_TP_GEMM_STREAMS: the streams a chunked tensor-parallel call's GEMMs take in turn (the
  // caller's first), so a chunk's last wave runs beside the next chunk's first; 1 or 2, 0 by
  // operation (fused::tp::gemmStreams; docs/perf-tp-gemms.md, "The chunks' GEMMs on two streams").
  int tpGemmStreams = 0;
  // WEFT_TP_GEMM_TUNE: a tensor-parallel call's first GEMM of a shape times cuBLASLt's
  // candidates that sum alike, the ranks together, and keeps the fastest
  // (fused::tp::Gemms::setTuning). Off: in weft's calls it was no faster
  // (docs/perf-tp-gemms.md).
  bool tpGemmTune = false;
  // WEFT_TP_GEMM_FIT: untuned, a tensor-parallel GEMM whose heuristic tile leaves the SMs idler
  // than a wave-fitted one runs that one (fused::tp::Gemms::setFitting; docs/perf-tp-gemms.md,
  // "Wave-fitted tiles, untuned").
  bool tpGemmFit = true;
  // WEFT_TP_FUSED_BLOCKS: the most blocks a fused tensor-parallel GEMM takes whatever the copies
  // cost; 0: the plan's grouping (algo::tpFusedPieces).
  int tpFusedBlocks = 0;
  std::string commId;  // WEFT_COMM_ID=host:port
  // WEFT_COMM_SECRET (or the first line of the file WEFT_COMM_SECRET_FILE names): the secret a
  // WEFT_COMM_ID rendezvous proves by challenge-response; empty: unauthenticated.
  std::string commSecret;
  // WEFT_CHECK_CALLS (0 or 1, default 1): every host collective's signature (collective, dtype,
  // count, op, root) compared with the same call of each peer on this host; a mismatch fails
  // the call on every rank, naming both calls (src/core/call_check.cpp).
  bool checkCalls = true;
  std::string transport =
      "auto";           // WEFT_TRANSPORT: auto (shm within a host, ucx between), shm, ucx
  int maxChannels = 2;  // WEFT_HOST_CHANNELS (2-16): host threads per rank
  int fifoSlots = 4;    // slots per connection
  // WEFT_GPU_DIRECT (0-64): a one-shot or two-shot all-reduce on GPU memory runs the direct
  // kernel (peers read each other's copy of the input) instead of its schedule over the FIFOs,
  // in up to this many rounds of its slabs (larger calls run the schedule); 0: never. -1 (the
  // default): the tuning constants' gpu_direct_rounds for the rank count.
  int gpuDirect = -1;
  // WEFT_GPU_REGISTERED: whether the direct kernels read registered inputs in place. -1 (auto,
  // the default): where it measured faster (Communicator::readsRegisteredInPlace); 0: never (the
  // slabs); 1: wherever every rank's buffer is registered. Unless 0, two-shot writes its sums
  // into every rank's registered output (Communicator::writesRegisteredOutputs).
  int gpuRegistered = -1;
  // WEFT_GPU_CHANNELS (1-64): thread blocks of a GPU call at most; 0 (the default): the largest
  // power of two at most 64 that leaves each rank sharing a GPU its own SMs
  // (algo::DeviceShape::autoChannels).
  int gpuChannels = 0;
  std::size_t gpuSlotBytes = 256 * 1024;  // WEFT_GPU_SLOT_BYTES: one bulk FIFO slot on GPU
  // WEFT_GPU_LL_DIRECT_BYTES (0-262144): a one-shot collective on GPU memory whose pieces (a rank's
  // input; its share for each peer, for reduce-scatter and all-to-all) hold at most this many
  // bytes pushes them to the peers as ll lines (data and flag in one 8-byte word: no fence, no
  // flag round trip) instead of copying them into its slab (exec::GpuOptions::llDirectBytes):
  // about twice as fast to 256 KiB (docs/perf-gpu.md, "ll on many blocks and for every one-shot").
  std::size_t gpuLlDirectBytes = 256 * 1024;
  // WEFT_GPU_LL_BLOCK_BYTES (512-262144): the least an ll one-shot block takes of a piece
  // (exec::GpuOptions::llBlockBytes).
  std::size_t gpuLlBlockBytes = 1024;
  // WEFT_GPU_LL_BLOCKS (1-128): the most blocks an ll one-shot call spreads over
  // (exec::GpuOptions::llBlocks).
  int gpuLlBlocks = 128;
  // WEFT_GPU_PDL (0 or 1): the ll one-shot kernels launch as programmatic dependents
  // (exec::GpuOptions::dependentLaunch).
  bool gpuDependentLaunch = true;
  // WEFT_GPU_DIRECT_BLOCK_BYTES (512-131072): the least a block of the direct kernels takes of a
  // call that one round of the slabs holds (exec::GpuOptions::directBlockBytes).
  std::size_t gpuDirectBlockBytes = 16 * 1024;
  std::size_t fifoSlotBytes = 128 * 1024;  // WEFT_HOST_SLOT_BYTES
  // WEFT_HOST_SINGLE_COPY_BYTES: point-to-point messages this large (between processes of one host)
  // are read straight from the sender's buffer; 0 turns it off.
  std::size_t singleCopyBytes = 256 * 1024;
  // WEFT_HOST_SINGLE_COPY_MIN_GBPS (0-1000; 0: never): a rank whose reads of its peers' buffers run
  // slower than this (two windows of 4 MiB in a row) asks its peers for bytes through the FIFO
  // instead, for the rest of the communicator's life (transport::ReadRate).
  double singleCopyMinGBps = 2.0;
  // WEFT_HOST_DIRECT (auto, 1, 0 as -1, 1, 0) and WEFT_HOST_DIRECT_BYTES: all-reduce,
  // reduce-scatter, all-gather and all-to-all calls at least this large on host memory (unset:
  // the tuning constants' host_direct_min_bytes), with every rank on this host, run the direct
  // path (src/exec/host_direct.hpp) instead of a schedule. auto: among threads of one process
  // always; between processes (through the stages) where every rank has at least two cores
  // (Communicator::create says why). 1: at any size, whatever the cores. 0, or 0 bytes: never.
  int hostDirect = -1;
  std::optional<std::size_t> hostDirectBytes;
  // WEFT_HOST_DIRECT_THREADS (1-16; 0: automatic): the threads of every direct call of a rank,
  // at most its channels. Automatic: up to the rank's cores, one a 256 KiB of the call.
  int hostDirectThreads = 0;
  // WEFT_HOST_CHANNEL_THREADS (auto, 1, 0 as -1, 1, 0): whether a schedule's channels run on
  // threads of their own (1) or one after another on the calling thread (0). auto: on threads
  // where the rank has two or more cores, on the caller otherwise (Communicator::create says
  // why).
  int hostChannelThreads = -1;
  // WEFT_TCP_LANES (0-2): where UCX runs over TCP, the messages through weft's own sockets
  // (src/transport/tcp_lanes.hpp) to ranks on other hosts (1), to every rank UCX reaches (2), or
  // through UCX (0).
  int tcpLanes = 1;
  // WEFT_HOST_STAGE_BYTES (8 KiB-1 GiB, in 8 KiB): each rank's stage, through which the direct
  // path between processes runs in rounds of half of it (src/exec/host_direct.hpp). The default
  // two halves of 1 MiB stay in a core's L2 between a round's copy in and its peers' reads.
  std::size_t hostStageBytes = 2 * 1024 * 1024;
  // WEFT_HOST_SMALL_BYTES (0-8192): calls on host memory whose rank's input is at most this
  // large (unset: the tuning constants' host_slots_max_bytes), among ranks of one host, go
  // through the slots (src/exec/host_slots.hpp) instead of a schedule; 0 turns them off.
  std::optional<std::size_t> hostSmallBytes;
  // WEFT_CHECK_PLANS (0 or 1; a diagnostic): before each call on GPU memory the ranks compare,
  // through the bootstrap (a host round trip a call), the call and how each runs it (algorithm,
  // protocol, channels, slices, kernel, registered buffers); any difference fails the call on
  // every rank with both ranks' accounts.
  bool checkPlans = false;
  // WEFT_GRAPH_MIXING (NCCL_GRAPH_MIXING_SUPPORT; 0 or 1, default 1): whether a CUDA graph's
  // operations are also ordered against the communicator's eager calls and other graphs (an
  // external wait and record node per graph: src/exec/launch_order.hpp). 0 orders a graph's
  // operations among themselves only; the caller's streams must then order graphs and eager
  // calls, as with NCCL_GRAPH_MIXING_SUPPORT=0.
  bool graphMixing = true;
  // WEFT_GPU_TRACE=PREFIX (a diagnostic): each rank's GPU executor keeps when each block of its
  // last schedule kernels started, waited and moved each step, and writes it to PREFIX.RANK when
  // the communicator is destroyed (scripts/gpu-trace.py reads the files).
  std::string gpuTrace;
  // CUDA_DEVICE_MAX_CONNECTIONS, CUDA's own (8 when unset): read only to warn where ranks that
  // are threads of one process share a GPU (Communicator::ensureGpu).
  int cudaMaxConnections = 8;
  // WEFT_TEST_HOST_ID: for tests, this process claims to run on a host of that name, so ranks of
  // one machine can play several hosts (UCX between them, shm within each).
  std::string testHostId;
  // WEFT_TOPO_FILE (NCCL_TOPO_FILE): the host's topology from this file instead of discovery.
  std::string topoFile;
  algo::TunerOptions tuner;  // WEFT_ALGO, WEFT_PROTO, WEFT_TUNING_FILE
  // "NAME=value" lines of the settings every rank must agree on, as set (init compares them).
  std::string agreed;

  // Unknown values are errors naming the variable and what it accepts.
  static Result<Config> fromEnvironment();
};

}  // namespace weft
