#include "src/core/config.hpp"

#include "src/core/log.hpp"

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "algorithms/compression.hpp"
#include "algorithms/overlap.hpp"
#include "src/transport/cuda_ipc.hpp"
#include "src/transport/ucx.hpp"

namespace weft {
namespace {

// How a setting's text is read.
enum class Kind { number, flag, tri, text, choice };

// One environment variable: the declarative table every reader, the README's table and
// weft-config come from. `apply` gets the text (and, for numbers, flags and three-way settings,
// its value; tri: -1 for auto) and may refuse it with the variable's name in the message.
struct Setting {
  const char* name;
  const char* alias;  // NCCL's name, or the variable's former name; nullptr: none
  Kind kind;
  double lo, hi;         // number: the accepted range
  const char* fallback;  // the default, as the table prints it
  bool agreed;           // every rank must set it alike (compared at init)
  Audience audience;
  const char* doc;
  Status (*apply)(Config& c, const std::string& name, const std::string& text, double value);
};

Status ok() {
  return {};
}

std::string shown(double b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.15g", b);
  return buf;
}

// Keep the entries of one audience together: the tables print in this order.
const Setting kSettings[] = {
    {"WEFT_DEBUG", "NCCL_DEBUG", Kind::text, 0, 0, "unset", false, Audience::user,
     "`VERSION`, `WARN` (every failure where it happens), `INFO` (init: transports, graphs), "
     "`TRACE`; any case. Lines read `host:pid:tid [rank] weft LEVEL ...`",
     [](Config&, const std::string& n, const std::string& v, double) {
       if (auto l = log::parseLevel(v); !l) return invalidArgument(n + "=" + l.status().message());
       return ok();
     }},
    {"WEFT_DEBUG_SUBSYS", "NCCL_DEBUG_SUBSYS", Kind::text, 0, 0, "INIT,BOOTSTRAP,ENV", false,
     Audience::user,
     "what `INFO` prints: `INIT`, `BOOTSTRAP`, `GRAPH`, `TUNING` (each pick and its runner-up), "
     "`COLL` (every call), `NET`, `SHM`, `ALL`; `^` before the list excludes",
     [](Config&, const std::string& n, const std::string& v, double) {
       if (auto s = log::parseSubsys(v); !s)
         return invalidArgument(n + ": " + s.status().message());
       return ok();
     }},

    {"WEFT_COMPRESS", nullptr, Kind::text, 0, 0, "none", true, Audience::user,
     "`fp8e4m3:32`, `fp8e5m2:128`, ...: the NCCL interface's bf16/f16/f32 all-reduces and "
     "reduce-scatters (sum, avg), and the C API's `Ex` calls given no compression, cross as fp8 "
     "where the selector prices that cheaper (`:always`: every one); it changes results "
     "(docs/api.md, \"Compressed collectives\")",
     [](Config& c, const std::string& n, const std::string& v, double) {
       auto parsed = parseCompression(v);
       if (!parsed) return invalidArgument(n + "=" + parsed.status().message());
       c.compression = *parsed;
       return ok();
     }},
    {"WEFT_DEBUG_FILE", "NCCL_DEBUG_FILE", Kind::text, 0, 0, "stderr", false, Audience::user,
     "the log's file instead of stderr; `%h` is the host's name, `%p` the process id", nullptr},
    {"WEFT_TIMEOUT_S", nullptr, Kind::number, 0.001, 1e6, "300", false, Audience::user,
     "seconds a rank waits without progress before a call (or init) fails",
     [](Config& c, const std::string&, const std::string&, double x) {
       c.timeout = std::chrono::milliseconds(static_cast<long long>(x * 1000));
       return ok();
     }},
    {"WEFT_TRANSPORT", nullptr, Kind::choice, 0, 0, "auto", true, Audience::user,
     "`auto`: shared memory within a host, UCX between hosts; `shm`: one host only; `ucx`: every "
     "pair through UCX (`UCX_TLS` picks UCX's own transports)",
     [](Config& c, const std::string& n, const std::string& v, double) {
       if (v != "auto" && v != "shm" && v != "ucx")
         return invalidArgument(
             n + "=" + v + ": expected auto (shm within a host, ucx between hosts), shm or ucx");
       if (v == "ucx" && !transport::ucxAvailable())
         return invalidArgument(n +
                                "=ucx: this build has no UCX transport (build with libucx-dev "
                                "installed)");
       c.transport = v;
       return ok();
     }},
    {"WEFT_TOPO_FILE", "NCCL_TOPO_FILE", Kind::text, 0, 0, "discovery", false, Audience::user,
     "the host's topology from this NCCL-format XML instead of discovering it; every call is "
     "priced on it (docs/algorithms.md, \"The graph at run time\")",
     [](Config& c, const std::string&, const std::string& v, double) {
       c.topoFile = v;
       return ok();
     }},
    {"WEFT_TUNING_FILE", nullptr, Kind::text, 0, 0, "built in", true, Audience::user,
     "JSON constants of the cost model and the ranges of the runtime's kernels (`weft-perf "
     "--calibrate` writes them; docs/algorithms.md, \"The selector\")",
     nullptr},
    {"WEFT_ALGO", "NCCL_ALGO", Kind::text, 0, 0, "all", true, Audience::user,
     "allowed algorithms (`ring`, `ring,pat`); NCCL's names as NCCL reads them (`Ring`, `Tree`, "
     "`PAT`, `^` excludes, per-collective lists)",
     nullptr},
    {"WEFT_PROTO", "NCCL_PROTO", Kind::text, 0, 0, "both", true, Audience::user,
     "`ll` or `simple` (NCCL's `LL`, `Simple`, `LL128` as Simple)", nullptr},
    {"WEFT_COMM_ID", "NCCL_COMM_ID", Kind::text, 0, 0, "unset", false, Audience::user,
     "`host:port` of the rendezvous; rank 0 listens there",
     [](Config& c, const std::string&, const std::string& v, double) {
       c.commId = v;
       return ok();
     }},
    {"WEFT_COMM_SECRET", nullptr, Kind::text, 0, 0, "unset", false, Audience::user,
     "the secret every rank of a `WEFT_COMM_ID` rendezvous proves (challenge-response, never "
     "sent); docs/security.md",
     [](Config& c, const std::string&, const std::string& v, double) {
       c.commSecret = v;
       return ok();
     }},
    {"WEFT_COMM_SECRET_FILE", nullptr, Kind::text, 0, 0, "unset", false, Audience::user,
     "a file whose first line is that secret",
     [](Config& c, const std::string& n, const std::string& v, double) {
       if (!c.commSecret.empty()) return ok();
       std::ifstream in(v);
       if (!in || !std::getline(in, c.commSecret) || c.commSecret.empty())
         return invalidArgument(n + "=" + v +
                                ": cannot read a secret from it (its first line, not empty)");
       return ok();
     }},
    {"WEFT_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", Kind::text, 0, 0, "first up, not lo or docker",
     false, Audience::user,
     "interface of this host's address: `eth0`, `eth,ib` (prefixes), `=eth0` (exact), "
     "`^lo,docker` (excluded); UCX's traffic between hosts goes through the same interface (its "
     "`NET_DEVICES`) unless `UCX_NET_DEVICES` is set",
     [](Config& c, const std::string&, const std::string& v, double) {
       c.socketIfname = v;
       return ok();
     }},
    {"WEFT_CHECK_CALLS", nullptr, Kind::flag, 0, 1, "1", true, Audience::user,
     "every call's signature (collective, type, count, op, root) compared with its peers'; a "
     "mismatch fails the call on every rank, naming both (docs/security.md)",
     [](Config& c, const std::string&, const std::string&, double x) {
       c.checkCalls = x != 0;
       return ok();
     }},
    {"WEFT_GRAPH_MIXING", "NCCL_GRAPH_MIXING_SUPPORT", Kind::flag, 0, 1, "1", false, Audience::user,
     "a CUDA graph's operations are ordered against the communicator's eager calls and other "
     "graphs too; 0: among themselves only (the streams must order the rest)",
     [](Config& c, const std::string&, const std::string&, double x) {
       c.graphMixing = x != 0;
       return ok();
     }},
    {"WEFT_HOST_CHANNELS", "WEFT_MAX_CHANNELS", Kind::number, 2, 16, "2", true, Audience::user,
     "channels (threads) of a call on host memory at most",
     [](Config& c, const std::string&, const std::string&, double x) {
       c.maxChannels = static_cast<int>(x);
       return ok();
     }},
    {"WEFT_GPU_CHANNELS", nullptr, Kind::number, 1, 64, "auto", true, Audience::user,
     "thread blocks (channels) of a call on GPU memory at most; auto: the largest power of two "
     "at most 64 leaving each rank sharing a GPU its own SMs",
     [](Config& c, const std::string&, const std::string&, double x) {
       c.gpuChannels = static_cast<int>(x);
       return ok();
     }},

    // Measured choices: the tuning file's, or these overrides of them.
    {"WEFT_HOST_SMALL_BYTES", nullptr, Kind::number, 0, 8192, "kernels.host_slots_max_bytes: 4096",
     true, Audience::tuning,
     "calls on host memory whose rank's input is at most this large go through the slots "
     "(ranks of one host); 0: never",
     [](Config& c, const std::string&, const std::string&, double x) {
       c.hostSmallBytes = static_cast<std::size_t>(x);
       return ok();
     }},
    {"WEFT_HOST_DIRECT", nullptr, Kind::tri, 0, 0, "auto", true, Audience::tuning,
     "the direct path on host memory (ranks of one host read each other's buffers): auto, among "
     "threads always and between processes where every rank has two cores; 1 always; 0 never, "
     "and MoE on host memory then goes through all-to-all-v instead of the peers' workspaces",
     [](Config& c, const std::string&, const std::string&, double x) {
       c.hostDirect = static_cast<int>(x);
       return ok();
     }},
    {"WEFT_HOST_DIRECT_BYTES", nullptr, Kind::number, 0, 1e18,
     "kernels.host_direct_min_bytes: 262144", true, Audience::tuning,
     "the smallest call (its message) the direct path takes; 0: never",
     [](Config& c, const std::string&, const std::string&, double x) {
       c.hostDirectBytes = static_cast<std::size_t>(x);
       return ok();
     }},
    {"WEFT_HOST_DIRECT_THREADS", nullptr, Kind::number, 1, 16, "auto", false, Audience::tuning,
     "threads of a direct call (at most its channels); auto: up to the rank's cores, one a 256 "
     "KiB",
     [](Config& c, const std::string&, const std::string&, double x) {
       c.hostDirectThreads = static_cast<int>(x);
       return ok();
     }},
    {"WEFT_TCP_LANES", nullptr, Kind::number, 0, 2, "1", true, Audience::tuning,
     "where UCX runs over TCP (no RDMA device), messages go through weft's own sockets, read "
     "straight into place: 1 to ranks on other hosts, 2 to every rank UCX reaches, 0 never "
     "(UCX's tag messages); docs/algorithms.md, \"TCP lanes\"",
     [](Config& c, const std::string&, const std::string&, double x) {
       c.tcpLanes = static_cast<int>(x);
       return ok();
     }},
    {"WEFT_HOST_CHANNEL_THREADS", nullptr, Kind::tri, 0, 0, "auto", false, Audience::tuning,
     "a schedule's channels on threads of their own (1) or one after another on the caller (0); "
     "auto: threads where the rank has two cores or more",
     [](Config& c, const std::string&, const std::string&, double x) {
       c.hostChannelThreads = static_cast<int>(x);
       return ok();
     }},
    {"WEFT_HOST_STAGE_BYTES", nullptr, Kind::number, 8192, 1 << 30, "2097152", true,
     Audience::tuning,
     "each rank's stage for the direct path between processes (rounds of half of it; in 8 KiB)",
     [](Config& c, const std::string&, const std::string&, double x) {
       c.hostStageBytes = static_cast<std::size_t>(x) / 8192 * 8192;
       return ok();
     }},
    {"WEFT_HOST_SLOT_BYTES", "WEFT_SLOT_BYTES", Kind::number, 4096, 64.0 * 1024 * 1024, "131072",
     true, Audience::tuning, "one FIFO slot on host memory (in 64 B)",
     [](Config& c, const std::string&, const std::string&, double x) {
       c.fifoSlotBytes = static_cast<std::size_t>(x) / 64 * 64;
       return ok();
     }},
    {"WEFT_HOST_SINGLE_COPY_BYTES", "WEFT_SINGLE_COPY_BYTES", Kind::number, 0, 1e18, "262144", true,
     Audience::tuning,
     "messages this large between processes of a host are read from the sender's buffer "
     "(`process_vm_readv`); 0: never",
     [](Config& c, const std::string&, const std::string&, double x) {
       c.singleCopyBytes = static_cast<std::size_t>(x);
       return ok();
     }},
    {"WEFT_HOST_SINGLE_COPY_MIN_GBPS", "WEFT_SINGLE_COPY_MIN_GBPS", Kind::number, 0, 1000, "2",
     false, Audience::tuning,
     "a rank whose reads of its peers run slower (two 4 MiB windows) gets bytes through the FIFO "
     "instead; 0: never",
     [](Config& c, const std::string&, const std::string&, double x) {
       c.singleCopyMinGBps = x;
       return ok();
     }},
    {"WEFT_GPU_DIRECT", nullptr, Kind::number, 0, 64, "kernels.gpu_direct_rounds", true,
     Audience::tuning,
     "rounds of their slabs the direct GPU kernels may take (the tuning file's "
     "`gpu_direct_rounds`); 0: never the direct kernels",
     [](Config& c, const std::string&, const std::string&, double x) {
       c.gpuDirect = static_cast<int>(x);
       return ok();
     }},
    {"WEFT_GPU_REGISTERED", nullptr, Kind::tri, 0, 0, "auto", true, Audience::tuning,
     "the direct kernels read registered inputs (and two-shot writes registered outputs) in "
     "place: auto, where measured faster; 1 always; 0 never",
     [](Config& c, const std::string&, const std::string&, double x) {
       c.gpuRegistered = static_cast<int>(x);
       return ok();
     }},
    {"WEFT_GPU_SLOT_BYTES", nullptr, Kind::number, 16 * 1024, 4.0 * 1024 * 1024, "262144", true,
     Audience::tuning, "one bulk FIFO slot on GPU memory (in 4 KiB)",
     [](Config& c, const std::string&, const std::string&, double x) {
       c.gpuSlotBytes = static_cast<std::size_t>(x) / 4096 * 4096;
       return ok();
     }},
    {"WEFT_GPU_LL_DIRECT_BYTES", nullptr, Kind::number, 0, 256 * 1024, "262144", true,
     Audience::tuning,
     "a one-shot call whose pieces hold at most this many bytes pushes them as ll lines",
     [](Config& c, const std::string&, const std::string&, double x) {
       c.gpuLlDirectBytes = static_cast<std::size_t>(x);
       return ok();
     }},
    {"WEFT_GPU_LL_BLOCK_BYTES", nullptr, Kind::number, 512, 256 * 1024, "1024", true,
     Audience::tuning, "the least an ll one-shot block takes of a piece",
     [](Config& c, const std::string&, const std::string&, double x) {
       c.gpuLlBlockBytes = static_cast<std::size_t>(x);
       return ok();
     }},
    {"WEFT_GPU_LL_BLOCKS", nullptr, Kind::number, 1, transport::CudaIpcGeometry::kDirectLlBlocks,
     "128", true, Audience::tuning, "the most blocks an ll one-shot call spreads over",
     [](Config& c, const std::string&, const std::string&, double x) {
       c.gpuLlBlocks = static_cast<int>(x);
       return ok();
     }},
    {"WEFT_GPU_DIRECT_BLOCK_BYTES", nullptr, Kind::number, 512, 128 * 1024, "16384", true,
     Audience::tuning, "the least a block of the slab kernels takes of a one-round call",
     [](Config& c, const std::string&, const std::string&, double x) {
       c.gpuDirectBlockBytes = static_cast<std::size_t>(x);
       return ok();
     }},
    {"WEFT_GPU_PDL", nullptr, Kind::flag, 0, 1, "1", false, Audience::tuning,
     "the ll one-shot kernels launch as programmatic dependents of the stream's previous kernel",
     [](Config& c, const std::string&, const std::string&, double x) {
       c.gpuDependentLaunch = x != 0;
       return ok();
     }},

    {"WEFT_TP_OVERLAP", nullptr, Kind::text, 0, 0, "auto", true, Audience::tuning,
     "`unfused`, `chunked:K` (K 1-64), `fused` or `fused:inplace`: how all-gather + GEMM and GEMM "
     "+ "
     "reduce-scatter run "
     "(`weftAllGatherGemm`, `weftGemmReduceScatter`) instead of the selector's pick",
     [](Config& c, const std::string& n, const std::string& v, double) {
       if (v == "auto") {
         c.tpChunks = 0;
         return ok();
       }
       auto k = algo::parseTpChunks(v);
       if (!k) return invalidArgument(n + ": " + k.status().message());
       c.tpChunks = *k;
       return ok();
     }},

    {"WEFT_CP_ATTENTION", nullptr, Kind::text, 0, 0, "auto", true, Audience::tuning,
     "`ring`, `ulysses` or `hybrid`: how context-parallel attention runs (`weftRingAttention` "
     "and its backward) instead of the selector's pick; ulysses where the ranks divide both head "
     "counts, hybrid (Ulysses in groups, the ring across them) where a group of 2 to n / 2 "
     "ranks does",
     [](Config& c, const std::string& n, const std::string& v, double) {
       if (v == "auto") {
         c.cpAttention.reset();
         return ok();
       }
       auto a = algo::parseCpAlgo(v);
       if (!a) return invalidArgument(n + ": " + a.status().message());
       c.cpAttention = *a;
       return ok();
     }},

    {"WEFT_MOE_PATH", nullptr, Kind::text, 0, 0, "auto", true, Audience::tuning,
     "`flat` or `hierarchical`: how MoE dispatch and combine on host memory cross hosts "
     "instead of the selector's pick; hierarchical (each token once per host, to the rank of "
     "its rail there, which forwards it) where every host has as many ranks",
     [](Config& c, const std::string& n, const std::string& v, double) {
       if (v == "auto") {
         c.moeHierarchical.reset();
       } else if (v == "flat" || v == "hierarchical") {
         c.moeHierarchical = v == "hierarchical";
       } else {
         return invalidArgument(n + ": " + v + " (flat, hierarchical or auto)");
       }
       return ok();
     }},

    {"WEFT_MOE_MODE", nullptr, Kind::text, 0, 0, "auto", true, Audience::tuning,
     "`normal`, `normal-table`, `normal-counted` or `low-latency`: how MoE dispatch and combine "
     "run on GPU memory instead of the selector's pick; normal places the rows from a table of "
     "the senders' counts (`normal-table`) or counts and places each expert's rows "
     "(`normal-counted`), the selector's way unless named; the table and low-latency (one "
     "kernel each way and half) where a rank holds at most 64 experts",
     [](Config& c, const std::string& n, const std::string& v, double) {
       c.moeLowLatency.reset(), c.moeTable.reset();
       if (v == "auto") return ok();
       if (v == "low-latency") {
         c.moeLowLatency = true;
       } else if (v == "normal" || v == "normal-table" || v == "normal-counted") {
         c.moeLowLatency = false;
         if (v != "normal") c.moeTable = v == "normal-table";
       } else {
         return invalidArgument(n + ": " + v +
                                " (normal, normal-table, normal-counted, low-latency or auto)");
       }
       return ok();
     }},

    {"WEFT_MOE_CHANNELS", nullptr, Kind::number, 0, 4096, "0", true, Audience::tuning,
     "the thread blocks of each MoE copy kernel on GPU memory instead of the selector's pick "
     "(in low-latency mode at most the blocks that may wait on peers at once); 0: the pick",
     [](Config& c, const std::string&, const std::string&, double x) {
       c.moeChannels = static_cast<int>(x);
       return ok();
     }},

    {"WEFT_ATTENTION_KERNEL", nullptr, Kind::text, 0, 0, "auto", true, Audience::tuning,
     "`weft` or `cudnn`: the local attention kernel of context-parallel attention instead of "
     "the selector's pick; cudnn where libcudnn.so.9 loads, in the forward pass of one sequence",
     [](Config& c, const std::string& n, const std::string& v, double) {
       if (v == "auto") {
         c.attentionKernel.reset();
         return ok();
       }
       auto k = algo::parseAttentionKernel(v);
       if (!k) return invalidArgument(n + ": " + k.status().message());
       c.attentionKernel = *k;
       return ok();
     }},

    {"WEFT_TP_FUSED_BLOCKS", nullptr, Kind::number, 0, 128, "0", false, Audience::tuning,
     "the most ranks' blocks one GEMM of a fused tensor-parallel call takes, whatever the copies "
     "cost; 0: as many as the GEMMs before it hide the copies of (algo::tpFusedPieces)",
     [](Config& c, const std::string&, const std::string&, double x) {
       c.tpFusedBlocks = static_cast<int>(x);
       return ok();
     }},

    {"WEFT_TP_GEMM_SMS", nullptr, Kind::number, 0, 1024, "0", true, Audience::tuning,
     "the SMs a chunked tensor-parallel GEMM plans for while a collective runs beside it "
     "(cuBLASLt's SM count target), leaving the others to the collective; 0: all",
     [](Config& c, const std::string&, const std::string&, double x) {
       c.tpGemmSms = static_cast<int>(x);
       return ok();
     }},

    {"WEFT_TP_GEMM_STREAMS", nullptr, Kind::number, 0, 2, "0", true, Audience::tuning,
     "the streams a chunked tensor-parallel call's GEMMs take in turn (the caller's, then a "
     "side stream of the communicator's), so one chunk's last wave of tiles runs beside the "
     "next chunk's first; 1: the caller's alone; 0: two for GEMM + reduce-scatter, one for "
     "all-gather + GEMM",
     [](Config& c, const std::string&, const std::string&, double x) {
       c.tpGemmStreams = static_cast<int>(x);
       return ok();
     }},

    {"WEFT_TP_GEMM_TUNE", nullptr, Kind::flag, 0, 1, "0", false, Audience::tuning,
     "1: a tensor-parallel call's first GEMM of each shape times cuBLASLt's candidates without "
     "split-K and its wave-fitted tiles (the same bits of C) briefly, then the fastest four and "
     "the heuristic's first sustained, the ranks at once, and keeps the fastest on the slowest "
     "rank; 0: untuned (WEFT_TP_GEMM_FIT)",
     [](Config& c, const std::string&, const std::string&, double x) {
       c.tpGemmTune = x != 0;
       return ok();
     }},
    {"WEFT_TP_GEMM_FIT", nullptr, Kind::flag, 0, 1, "1", false, Audience::tuning,
     "1: untuned, a tensor-parallel GEMM whose cuBLASLt heuristic tile takes 1.05 x the SMs' "
     "tile slots a wave-fitted tile of the same algorithm takes runs that tile with the "
     "heuristic's cluster and kernel option where the cluster pairs it along its shorter side, "
     "else (the heuristic's tiles clustered) the largest such tile paired so with the lowest "
     "kernel option it accepts (the same bits of C); 0: the heuristic's first",
     [](Config& c, const std::string&, const std::string&, double x) {
       c.tpGemmFit = x != 0;
       return ok();
     }},

    // Diagnostics and tests.
    {"WEFT_NCCL_HOST_MEMORY", nullptr, Kind::flag, 0, 1, "0", false, Audience::diagnostic,
     "1: the NCCL interface runs without a CUDA device and on host buffers, where NCCL (and it, "
     "by default) fails with `ncclUnhandledCudaError` / `ncclInvalidArgument`",
     nullptr},
    {"WEFT_CHECK_PLANS", nullptr, Kind::flag, 0, 1, "0", true, Audience::diagnostic,
     "before every call on GPU memory the ranks compare the call and how each runs it (a host "
     "round trip a call)",
     [](Config& c, const std::string&, const std::string&, double x) {
       c.checkPlans = x != 0;
       return ok();
     }},
    {"WEFT_GPU_TRACE", nullptr, Kind::text, 0, 0, "unset", false, Audience::diagnostic,
     "a file prefix: each rank writes when its last schedule kernels' blocks started, waited and "
     "moved each step (scripts/gpu-trace.py)",
     [](Config& c, const std::string&, const std::string& v, double) {
       c.gpuTrace = v;
       return ok();
     }},
    {"CUDA_DEVICE_MAX_CONNECTIONS", nullptr, Kind::text, 0, 0, "8 (CUDA's)", false,
     Audience::diagnostic,
     "CUDA's own; read to warn where thread ranks sharing a GPU have fewer than 32 queues",
     [](Config& c, const std::string&, const std::string& v, double) {
       c.cudaMaxConnections = std::atoi(v.c_str());
       return ok();
     }},
    {"WEFT_TEST_HOST_ID", nullptr, Kind::text, 0, 0, "unset", false, Audience::diagnostic,
     "tests only: this process claims a host of that name, so one machine plays several",
     [](Config& c, const std::string&, const std::string& v, double) {
       c.testHostId = v;
       return ok();
     }},
};

const char* env(const char* name) {
  const char* v = name != nullptr ? std::getenv(name) : nullptr;
  return v != nullptr && *v != '\0' ? v : nullptr;
}

// The values a setting takes, as its table prints them.
std::string valuesOf(const Setting& s) {
  switch (s.kind) {
    case Kind::number:
      return shown(s.lo) + "-" + shown(s.hi);
    case Kind::flag:
      return "0 or 1";
    case Kind::tri:
      return "auto, 0 or 1";
    case Kind::choice:
      return "auto, shm, ucx";  // WEFT_TRANSPORT, the one choice (its apply checks them)
    case Kind::text:
      return "text";
  }
  return "";
}

// The value of a setting's text: numbers and flags in their range, three-way settings as -1, 0, 1.
Result<double> valueOf(const Setting& s, const std::string& name, const std::string& v) {
  if (s.kind == Kind::tri) {
    if (v == "auto") return -1.0;
    if (v == "0" || v == "1") return v == "1" ? 1.0 : 0.0;
    return invalidArgument(name + "=" + v + ": expected auto, 0 or 1");
  }
  if (s.kind != Kind::number && s.kind != Kind::flag) return 0.0;
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (end == v.c_str() || *end != '\0' || !(x >= s.lo && x <= s.hi)) {
    return invalidArgument(name + "=" + v + ": expected a number from " + shown(s.lo) + " to " +
                           shown(s.hi));
  }
  return x;
}

// A tuning setting's key in a tuning file's "settings": its name in lower case without WEFT_;
// "" for those the file's "kernels" section holds (host_slots_max_bytes, host_direct_min_bytes,
// gpu_direct_rounds).
std::string tuningKey(const Setting& s) {
  const std::string name = s.name;
  if (name == "WEFT_HOST_SMALL_BYTES" || name == "WEFT_HOST_DIRECT_BYTES" ||
      name == "WEFT_GPU_DIRECT" || name.rfind("WEFT_", 0) != 0)
    return {};
  std::string key = name.substr(5);
  for (char& ch : key) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return key;
}

}  // namespace

std::vector<SettingDoc> settingsTable() {
  std::vector<SettingDoc> out;
  for (const Setting& s : kSettings) {
    SettingDoc d;
    d.name = s.name;
    d.alias = s.alias != nullptr ? s.alias : "";
    d.kind = valuesOf(s);
    d.fallback = s.fallback;
    d.agreed = s.agreed;
    d.audience = s.audience;
    d.doc = s.doc;
    d.tuningKey = s.audience == Audience::tuning ? tuningKey(s) : "";
    out.push_back(d);
  }
  return out;
}

std::string settingsMarkdown(Audience audience) {
  std::string out =
      "| variable | values | default | every rank alike | meaning |\n| --- | --- | --- | --- | "
      "--- |\n";
  for (const SettingDoc& d : settingsTable()) {
    if (d.audience != audience) continue;
    out += "| `" + d.name + "`" + (d.alias.empty() ? "" : " (`" + d.alias + "`)") +
           (d.tuningKey.empty() ? "" : "; file: `" + d.tuningKey + "`") + " | " + d.kind + " | " +
           d.fallback + " | " + (d.agreed ? "yes" : "") + " | " + d.doc + " |\n";
  }
  return out;
}

Result<Config> Config::fromEnvironment() {
  Config c;
  for (const Setting& s : kSettings) {
    // weft's name, else its alias (NCCL's name for the same setting, or its former name).
    const char* name = env(s.name) != nullptr ? s.name : s.alias;
    const char* v = env(name);
    if (v == nullptr) continue;
    auto x = valueOf(s, name, v);
    if (!x) return x.status();
    if (s.agreed) c.agreed += std::string(s.name) + "=" + v + "\n";
    if (s.apply == nullptr) continue;  // read by its own reader (TunerOptions)
    if (Status st = s.apply(c, name, v, *x); !st) return st;
  }
  auto tuner = algo::TunerOptions::fromEnvironment();
  if (!tuner) return tuner.status();
  c.tuner = std::move(*tuner);
  // The tuning file's settings, for the tuning settings the environment leaves unset.
  for (const auto& [key, text] : c.tuner.constants.settings) {
    const Setting* s = nullptr;
    for (const Setting& row : kSettings) {
      if (row.audience == Audience::tuning && tuningKey(row) == key) s = &row;
    }
    const std::string where = c.tuner.tuningFile + ": settings." + key;
    if (s == nullptr) {
      return invalidArgument(where +
                             ": not a tuning setting (docs/configuration.md lists them, as "
                             "host_slot_bytes for WEFT_HOST_SLOT_BYTES)");
    }
    if (env(s->name) != nullptr || env(s->alias) != nullptr) continue;  // the environment wins
    auto x = valueOf(*s, where, text);
    if (!x) return x.status();
    if (Status st = s->apply(c, where, text, *x); !st) return st;
  }
  return c;
}

}  // namespace weft
