// The CudaExecutor runs a schedule on GPU memory: one kernel launch per call on the caller's
// stream, one thread block per channel, each walking this rank's steps exactly as the
// CpuExecutor does (same Geometry, same messages), through the cuda_ipc transport's FIFOs.
// A call returns once its kernel is enqueued: it is ordered on the stream and can be captured
// into a CUDA graph. A kernel that times out or sees an abort stops, aborts every rank's kernels,
// and leaves its reason for asyncError(); the communicator's later calls then fail with it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "algorithms/cost_model.hpp"
#include "algorithms/schedule.hpp"
#include "src/bootstrap/bootstrap.hpp"
#include "src/device/schedule_kernel.hpp"
#include "src/exec/cpu_executor.hpp"
#include "src/exec/launch_order.hpp"
#include "weft/status.hpp"

namespace weft::transport {
class CudaIpcTransport;
}

namespace weft::exec {

// Whether this build has the CUDA executor.
bool cudaBuilt();

// Whether p is memory of a CUDA device (device or managed). Never initializes CUDA in a process
// that has not loaded the driver (so host-only programs, and their forks, stay CUDA-free).
bool isDevicePointer(const void* p);

// The calling thread's current CUDA device, or -1 where the driver is not loaded (never
// initializes CUDA, as above); and making a device current (nothing for -1).
int currentDevice();
void useDevice(int device);
// A device's PCI bus id ("0000:19:00.0", lowercase); "" where it cannot be had.
std::string busIdOf(int device);

struct GpuOptions {
  // Thread blocks per call at most; 0: algo::DeviceShape::autoChannels for the ranks sharing
  // each device.
  int channels = 0;
  int slots = 4;                       // per connection and protocol
  std::size_t slotBytes = 256 * 1024;  // simple
  std::size_t llPayload = 16 * 1024;   // ll (its lines take twice this)
  // One-shot collectives whose pieces (a rank's input; a rank's share of it for reduce-scatter
  // and all-to-all) hold at most this many bytes (up to CudaIpcGeometry::kDirectLlBytes, and up
  // to kDirectLlRanks ranks) push ll lines into the peers' ll inboxes (device::launchDirectLl).
  std::size_t llDirectBytes = 256 * 1024;
  // An ll call gives each block at least this many bytes of a piece: smaller shares spread small
  // calls over more blocks, which measured faster down to 1 KiB (docs/perf-gpu.md, "ll on many
  // blocks").
  std::size_t llBlockBytes = 1024;
  // ... and spreads over at most this many blocks (up to CudaIpcGeometry::kDirectLlBlocks, and
  // those all ranks' kernels on a device can keep resident): 128 beat 32 from 64 KB on two H200s
  // (docs/perf-gpu.md, "The ll one-shot on up to 128 blocks").
  int llBlocks = 128;
  // Programmatic dependent launch of the ll one-shot kernels (sm_90): each launches as a
  // programmatic dependent of the stream's previous kernel, waits for that kernel's completion
  // (griddepcontrol.wait) before it touches memory, and lets the stream's next kernel be
  // scheduled once its peers' lines have all arrived; so only the next call's launch overlaps
  // this one's tail (0.2-0.4 us a call; docs/perf-gpu.md, "the ll kernels as programmatic
  // dependents"). Not earlier: a waiting kernel could hold SMs a peer sharing the GPU needs.
  bool dependentLaunch = true;
  // Graphs ordered against eager calls too (WEFT_GRAPH_MIXING; src/exec/launch_order.hpp).
  bool graphMixing = true;
  // The direct kernels (one-shot and two-shot through the slabs) give each block at least this
  // many bytes of a call that one round holds, so a small call spreads over many blocks (one
  // block reading a peer's 128 KiB slab over NVLink is slow) instead of one per slab.
  std::size_t directBlockBytes = 16 * 1024;
  std::chrono::milliseconds timeout{300'000};
  // WEFT_GPU_TRACE: where the schedule kernels' timeline goes (empty: none kept).
  std::string tracePath;
  // This rank's host abort word (in its shared-memory inbox) and the page holding it: kernels
  // watch it through a mapping, so abort() from any rank of the host stops them.
  void* controlPage = nullptr;
  std::size_t controlBytes = 0;
  const std::int32_t* hostAbort = nullptr;
};

class CudaExecutor {
 public:
  // Collective over the bootstrap (every rank, on this host): maps every rank's device inbox.
  static Result<std::unique_ptr<CudaExecutor>> create(const GpuOptions& o,
                                                      boot::Bootstrap& bootstrap);
  ~CudaExecutor();
  CudaExecutor(const CudaExecutor&) = delete;
  CudaExecutor& operator=(const CudaExecutor&) = delete;

  // Channels a call may use: the options' at most, fewer where the ranks sharing a device could
  // not all be resident at once.
  int channels() const { return channels_; }
  // The slowest of the ranks' devices' peak memory rate, GB/s (clock and bus width; 0: unknown).
  double memoryPeakGBs() const { return memoryPeakGBs_; }
  int device() const;
  // Ranks of this process (threads) on this executor's GPU, this one included.
  int threadsOnDevice() const;
  // Some GPU runs more than one of the communicator's ranks (the same on every rank).
  bool someDeviceShared() const;
  // The most bytes one message of the protocol carries.
  std::size_t messageBytes(algo::Protocol p) const {
    return p == algo::Protocol::ll ? options_.llPayload : options_.slotBytes;
  }
  std::string describe() const;

  // Every operation (a collective or a batch of sends and receives, with whatever it launches)
  // between begin() and end() on its stream: it then runs after the operation issued before it,
  // whatever the streams (src/exec/launch_order.hpp).
  Status begin(void* stream);
  Status end(void* stream);

  // Device memory of at least `bytes` for what an operation keeps between its launches (the
  // compressed collectives' encoded shares): the executor's, freed with it. A larger request
  // replaces it; the one replaced is kept until then, as captured graphs may still use it.
  Result<std::byte*> workspace(std::size_t bytes);

  // Enqueues the schedule on `stream` (a cudaStream_t). b.scratch is ignored: the executor
  // keeps its own device scratch. avg is left as a sum (see divide()).
  Status run(const algo::Schedule& s, const Geometry& g, const Buffers& b, algo::Protocol p,
             void* stream);
  Status divide(void* data, std::size_t count, DataType type, std::uint64_t n, void* stream);
  // The bytes one round of the direct kernels holds (every block's slab); a larger call runs in
  // rounds of that many. Every rank copies its input where peers read it, and every rank sums
  // all of them in rank order (one-shot) or its piece of them (two-shot).
  std::size_t oneShotLimit() const;
  // Every rank's registered buffer (weftCommRegister), as this rank's kernels reach it: collective
  // over the bootstrap, each rank passing its own. Dropping the last reference unmaps them; the
  // caller first makes sure no kernel still reads them. Where some rank's buffer cannot be read
  // in place (every rank learns it alike), direct() ignores them and the slabs serve.
  struct PeerInputs;
  Result<std::shared_ptr<PeerInputs>> mapRegistered(const void* base, boot::Bootstrap& bootstrap);
  // Each rank's mapping of them (empty where they could not be mapped).
  static std::vector<std::byte*> peerPointers(const PeerInputs& p);
  // A one-shot or two-shot all-reduce by the direct kernel, in rounds of oneShotLimit() bytes. With
  // `peers` (out of place): every rank reads every rank's input in place, `offset` bytes into
  // its registered buffer, instead of copying its own into the slabs. With `outPeers` (two-shot,
  // at most 64 ranks): every rank writes its summed piece into every rank's output, `outOffset`
  // bytes into its registered buffer, instead of each gathering the others' pieces.
  Status direct(const Buffers& b, bool twoShot, void* stream, const PeerInputs* peers = nullptr,
                std::size_t offset = 0, const PeerInputs* outPeers = nullptr,
                std::size_t outOffset = 0);
  // All-gather, reduce-scatter or all-to-all by the direct kernel (device::launchDirectBlocks),
  // b.count elements a block, in rounds of about oneShotLimit() bytes of each rank's input.
  Status directBlocks(const Buffers& b, device::DirectKind kind, void* stream);
  // One batch of sends and receives on GPU memory (peer == this rank: the k-th send meets the
  // k-th receive, checked by the caller), all progressing together, enqueued on `stream`.
  struct P2p {
    bool isSend = true;
    int peer = 0;
    std::byte* buf = nullptr;
    std::size_t bytes = 0;
  };
  Status exchange(const std::vector<P2p>& ops, void* stream);
  // The signature of the operations launched next (device::signatureOf of the call; 0: unchecked;
  // point-to-point: non-zero signs each message with its operation's size's), and what names
  // the call a signature stands for in a mismatch's message: namer(rank, signature, ll) with
  // `ll` where only an ll line's 8 bits of it are known ("" where it cannot tell).
  void sign(std::uint32_t signature) { signature_ = signature; }
  std::function<std::string(int, std::uint64_t, bool)> namer;
  // The failure a kernel recorded, if any.
  Status asyncError() const;
  // Whether `stream` (a cudaStream_t) is being captured into a graph.
  static bool capturing(void* stream);
  // Waits for every kernel enqueued outside graph capture.
  Status synchronize();

 private:
  CudaExecutor() = default;
  // A schedule's device copy, made at its first call. Outside capture the copy is enqueued on
  // the call's stream from pinned memory kept here, so the host never waits between a call's
  // launches, where a wait could sit behind a peer's kernel that waits for this rank's (ranks
  // that are threads sharing a GPU; docs/perf-gpu.md, "MPS and hardware queues").
  Result<const void*> upload(const algo::Schedule& s, void* stream);
  // Copies host memory to the device and returns once it is there (cudaMemcpy from pageable
  // memory may return before its DMA lands, unordered with the non-blocking streams collectives
  // run on). On the legacy stream: an executor makes no stream of its own, since every stream a
  // process makes takes the next of CUDA's hardware queues in turn, and ranks that are threads
  // need their streams' queues apart.
  Status toDevice(void* dev, const void* host, std::size_t bytes, const std::string& what);
  // The launch arguments every kernel shares: endpoints, failure words, slots, timeout.
  ::weft::device::LaunchArgs baseArgs() const;
  // The direct kernels' grid for `count` elements (of the call, or of each piece) with at most
  // `most` a block in a round: blocks, and the elements each takes (LaunchArgs::directShareElems).
  struct Spread {
    int blocks = 1;
    std::size_t share = 0;
  };
  Spread spread(std::size_t count, std::size_t most, std::size_t align, std::size_t least) const;
  // Whether a one-shot whose pieces hold pieceBytes each takes the ll kernel (launchLl): up to
  // options_.llDirectBytes and kDirectLlBytes, kDirectLlRanks ranks.
  bool llServes(const ::weft::device::LaunchArgs& a, std::size_t pieceBytes) const;
  Status launchLl(const ::weft::device::LaunchArgs& a, ::weft::device::DirectKind kind,
                  const Buffers& b, void* stream);
  // The records of the next schedule kernel (null when not tracing), and the trace file.
  std::uint64_t* nextTrace();
  Status writeTrace() const;

  GpuOptions options_;
  int nranks_ = 1, rank_ = 0;
  int channels_ = 1;
  double memoryPeakGBs_ = 0;
  std::unique_ptr<transport::CudaIpcTransport> ipc_;
  void* endpoints_ = nullptr;  // device: to[C * n], from[C * n], aborts[n]
  void* error_ = nullptr;      // host-mapped KernelError
  void* errorDevice_ = nullptr;
  const std::int32_t* hostAbortDevice_ = nullptr;
  bool registered_ = false;
  std::map<const algo::Schedule*, void*> uploads_;  // device: ChannelCode[], steps, peers, spans
  std::vector<void*> staged_;  // pinned host copies of uploads, read by their stream's copies
  std::byte* scratch_ = nullptr;
  std::size_t scratchBytes_ = 0;
  std::byte* workspace_ = nullptr;
  std::size_t workspaceBytes_ = 0;
  std::vector<void*>
      retired_;  // earlier scratch and workspaces, kept: captured graphs may still use it
  std::unique_ptr<LaunchOrder> order_;
  std::uint64_t* trace_ = nullptr;  // device: kTraceCalls x channels x kTraceWords
  std::uint64_t traceCalls_ = 0;    // schedule kernels launched while tracing
  std::uint32_t signature_ = 0;
};

}  // namespace weft::exec
