// A communicator: the ranks that found each other through the bootstrap, the connections
// between them, the tuner that picks each call's algorithm, and the cache of schedules.
// Every collective validates its arguments, asks the tuner for a plan, and runs the plan's
// schedule on the CpuExecutor; nothing is hard-wired to one algorithm. On host memory two paths
// take the place of a schedule where they serve the call, and the plan names them: small calls
// through the slots (src/exec/host_slots.hpp) and large ones where every rank reads every other
// (the direct path, src/exec/host_direct.hpp).
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "algorithms/schedule.hpp"
#include "algorithms/selector.hpp"
#include "algorithms/tuner.hpp"
#include "src/bootstrap/bootstrap.hpp"
#include "src/core/channel_workers.hpp"
#include "src/core/config.hpp"
#include "src/core/machine.hpp"
#include "src/exec/cpu_executor.hpp"
#include "src/exec/cuda_executor.hpp"
#include "src/exec/host_direct.hpp"
#include "src/exec/host_slots.hpp"
#include "src/transport/shm.hpp"
#include "src/transport/ucx.hpp"
#include "weft/weft.h"

namespace weft {

class Communicator {
 public:
  // Collective over the bootstrap's ranks: every rank calls it. Builds the shared-memory inboxes
  // and connects every pair.
  static Result<std::unique_ptr<Communicator>> create(std::unique_ptr<boot::Bootstrap> bootstrap,
                                                      const Config& config);
  ~Communicator();

  // Collective over this communicator: ranks passing the same color form a new communicator,
  // ranked by (key, old rank). A negative color takes part but gets no communicator (nullptr).
  // `config`: the new one's (else this one's).
  Result<std::unique_ptr<Communicator>> split(int color, int key, const Config* config = nullptr);
  // A communicator a fused operation split from this one and runs on for it: its errors are
  // this one's asyncError's, and this one's abort aborts it. Until this one is destroyed.
  void adopt(Communicator* child) { children_.push_back(child); }

  int rank() const { return rank_; }
  int size() const { return size_; }
  const Config& config() const { return config_; }
  std::string summary() const;

  // Collectives. Host buffers: the call blocks until this rank's part is done, and `stream`
  // must be null. GPU buffers (every rank passing GPU buffers): the call enqueues a kernel on
  // `stream` (a cudaStream_t; null is the default stream) and returns; the first such call
  // sets up the GPU transport (collective, and not inside a CUDA graph capture).
  Status allReduce(const void* send, void* recv, std::size_t count, DataType type, RedOp op,
                   void* stream = nullptr);
  // count: elements each rank contributes.
  Status allGather(const void* send, void* recv, std::size_t count, DataType type,
                   void* stream = nullptr);
  // count: elements each rank receives.
  Status reduceScatter(const void* send, void* recv, std::size_t count, DataType type, RedOp op,
                       void* stream = nullptr);
  Status broadcast(const void* send, void* recv, std::size_t count, DataType type, int root,
                   void* stream = nullptr);
  Status reduce(const void* send, void* recv, std::size_t count, DataType type, RedOp op, int root,
                void* stream = nullptr);
  // count: elements to each peer.
  Status allToAll(const void* send, void* recv, std::size_t count, DataType type,
                  void* stream = nullptr);
  // The failure a GPU kernel of this communicator recorded (or the abort), if any.
  Status asyncError() const;
  // The CUDA device of the GPU transport; -1 before the first GPU call.
  int device() const;
  // The channels of the GPU transport; 0 before the first GPU call.
  int gpuChannels() const;
  // Counts and displacements in elements, one per rank (MPI_Alltoallv's convention).
  Status allToAllv(const void* send, const std::size_t* sendCounts, const std::size_t* sendDispls,
                   void* recv, const std::size_t* recvCounts, const std::size_t* recvDispls,
                   DataType type, void* stream = nullptr);
  // GPU buffers: enqueued on `stream`, as the collectives.
  Status send(const void* buf, std::size_t count, DataType type, int peer, void* stream = nullptr);
  Status recv(void* buf, std::size_t count, DataType type, int peer, void* stream = nullptr);
  Status barrier();
  // weftCommRegister / weftCommDeregister: a buffer (GPU memory) that collectives may read in
  // place on every rank. Local calls; the ranks' buffers are exchanged at the first collective
  // that uses them, which every rank must call with registered buffers at the same offset.
  Result<void*> registerBuffer(void* buf, std::size_t bytes);
  Status deregisterBuffer(void* handle);

  // One send or receive of a batch that progresses together (a group, all-to-all-v).
  struct P2pOp {
    bool isSend = true;
    int peer = 0;
    std::byte* buf = nullptr;
    std::size_t bytes = 0;
    void* stream = nullptr;  // GPU buffers: the cudaStream_t it is ordered on
  };
  // A collective's arguments (root: broadcast and reduce; count as the call takes it), checked
  // as the call checks them but without running it: a group queues a call once they pass.
  Status check(Collective coll, const void* send, const void* recv, std::size_t count,
               DataType type, int root) const;
  // allToAllv's: every buffer's extent (the largest displacement plus count) at most
  // PTRDIFF_MAX bytes and inside the address space, and the rank's own block sent as received.
  Status checkAllToAllv(const void* send, const std::size_t* sendCounts,
                        const std::size_t* sendDispls, const void* recv,
                        const std::size_t* recvCounts, const std::size_t* recvDispls,
                        DataType type) const;
  // Checks one point-to-point operation's arguments without running it.
  Status checkP2p(const char* what, const void* buf, std::size_t count, DataType type,
                  int peer) const;
  // Runs every operation of the batch at once: operations to the same peer in the same
  // direction go in order over their connection, everything else interleaves, so any pattern
  // of matched sends and receives completes (a ring exchange of any size included).
  Status exchange(std::vector<P2pOp> ops);

  // From any thread: every rank's current and later waits end with an error.
  void abort(const std::string& why);
  bool aborted() const;

  // The plan the tuner makes for a call (what WEFT_DEBUG=INFO prints), made once per size.
  Result<algo::Plan> planFor(Collective coll, std::size_t bytes);
  // The same for a call's count and type (what weftCommPlan reports); gpu: for a call on GPU
  // buffers (the GPU tuner's plan, what such a call runs).
  Result<algo::Plan> planFor(Collective coll, std::size_t count, DataType type, bool gpu = false);
  // The GPU tuner's plan for a call of `bytes` (made once per size).
  Result<algo::Plan> gpuPlanFor(Collective coll, std::size_t bytes);
  // The compression the Ex calls use when given none (WEFT_COMPRESS, weftCommSetCompression).
  const weftCompression& compression() const {
    return compression_ ? *compression_ : config_.compression;
  }
  void setCompression(const weftCompression& c) { compression_ = c; }
  // The plan of a call that may cross compressed (algo::Selector::planCompressed), on host or
  // GPU memory, made once per size, codec and mode; `bytes` counted as planFor counts them.
  Result<algo::Plan> compressedPlanFor(Collective coll, std::size_t bytes,
                                       const algo::CodecShape& codec, bool always, bool gpu);
  // Memory an operation of fused/ keeps between its steps, the communicator's (freed with it),
  // at least `bytes`: on the GPU (CudaExecutor::workspace; the first GPU call sets up the GPU
  // transport) or this rank's host memory, which is weftHostAlloc memory that peers in other
  // processes can map (peerWorkspaces). Valid until the next request.
  Result<std::byte*> workspace(std::size_t bytes, bool gpu);
  // Every rank's host workspace of at least `bytes` (each rank its own size) as this rank reads
  // it: its own at its rank, the peers' mapped read-only (threads of one process: their
  // addresses). Collective; empty on every rank alike unless every rank is on this host through
  // shared memory and could map every other's. Valid until the next request.
  Result<std::vector<const std::byte*>> peerWorkspaces(std::size_t bytes);
  // Collective, after reading what peerWorkspaces returned: no rank writes its workspace again
  // before every rank has stopped reading it.
  Status doneWithPeerWorkspaces(const std::vector<const std::byte*>& peers);
  // fused/'s loops on host memory: this rank's threads (its caller and channel workers, no more
  // than its cores), and fn(0) .. fn(k − 1), on up to hostThreads() of them at once.
  std::size_t hostThreads() const { return hostThreads_; }
  void parallel(std::size_t k, const std::function<void(std::size_t)>& fn);
  // What an operation of fused/ keeps from call to call (streams, library handles), by name;
  // null until it sets it. Destroyed with the communicator, before its GPU transport.
  std::shared_ptr<void>& fusedState(std::string_view name);
  // Every rank's GPU buffer `base` (this rank's own, allocated with cudaMalloc), as this rank
  // reaches it: collective, every rank passing its own, outside a graph capture. Empty on every
  // rank alike where the ranks are not on one host or some buffer cannot be mapped. The
  // mappings last as long as `keep`.
  struct PeerMemory {
    std::vector<std::byte*> at;  // by rank
    std::shared_ptr<void> keep;
    bool deviceShared = false;  // some GPU runs more than one rank (the same on every rank)
  };
  Result<PeerMemory> mapPeerMemory(void* base);
  // The plan of a tensor-parallel operation (algo::Selector::planTp on the GPU selector, or
  // WEFT_TP_OVERLAP's chunks), made once per shape; rank 0 logs it under TUNING.
  Result<algo::TpPlan> tpPlanFor(const algo::TpShape& shape);
  // MoE dispatch and combine on host memory (algo::Selector::planMoe on the host selector):
  // across hosts, flat or hierarchical (WEFT_MOE_PATH forces one). Every rank that passes the
  // same traffic gets the same plan.
  Result<algo::MoePlan> moePlanFor(const algo::MoeShape& shape, const algo::MoeTraffic& traffic);
  // On GPU memory (algo::Selector::planMoeGpu on the GPU selector, for a uniform routing of the
  // shape; WEFT_MOE_MODE and WEFT_MOE_CHANNELS force either): the mode and the channels, the
  // same on every rank; rank 0 logs it under TUNING.
  Result<algo::MoeGpuPlan> moeGpuPlanFor(const algo::MoeShape& shape);
  // Each rank's host, numbered in the order of their first rank.
  const std::vector<int>& hostOf() const { return machine_.placement.hostOf; }
  // Context-parallel attention's: ring or Ulysses (WEFT_CP_ATTENTION forces one); logged at
  // INFO on rank 0 the first time a shape is planned.
  Result<algo::AttentionPlan> attentionPlanFor(const algo::AttentionShape& shape);
  // Runs `launches` (kernels on `stream`, and this communicator's own calls) as one operation of
  // the communicator's order on the GPU (CudaExecutor::begin and end around it).
  Status gpuOperation(void* stream, const std::function<Status()>& launches);
  // What the GPU tuner prices calls with: its rank graph (from the machine: the ranks' GPUs and
  // the paths between them, or the same-device graph on the channels a bulk call gets where they
  // share one) and its constants (the tuning file's, or the defaults, with the same-device hop of
  // the bulk protocol there). weft-perf --calibrate --gpu fits the constants to it.
  struct GpuModel {
    algo::RankGraph graph;
    algo::CostConstants constants;
    std::string description;  // how the graph was made
    bool sameDevice = false;  // the ranks share a device (algo::GpuGraph::sameDevice)
  };
  GpuModel gpuTunerModel() const;
  // What this rank's calls on host memory moved how: bytes it read straight from peers' buffers
  // (single copy, since the communicator was made), and how many peers it can read that way.
  struct HostCounters {
    std::uint64_t singleCopyBytes = 0;
    int readablePeers = 0;
    // Direct calls between processes that loaded from the peers' weftHostAlloc buffers in
    // place, and how many of those buffers this rank holds mapped.
    std::uint64_t directInPlaceCalls = 0;
    std::size_t peerAllocationsMapped = 0;
  };
  HostCounters hostCounters() const;
  // Whether the direct kernel reads registered inputs in place for a call of `bytes`
  // (WEFT_GPU_REGISTERED; every rank decides alike, as the kernels' barriers require).
  bool readsRegisteredInPlace(bool twoShot, std::size_t bytes) const;
  // Whether two-shot's kernel writes each rank's summed piece into every rank's registered
  // output instead of gathering the pieces (WEFT_GPU_REGISTERED; every rank decides alike).
  bool writesRegisteredOutputs() const;

 private:
  Communicator() = default;
  Status run(Collective coll, const void* input, void* output, std::size_t count, DataType type,
             RedOp op, int root, void* stream);
  // A call on GPU memory: planned, then launched between the executor's begin() and end(), so
  // it runs after the communicator's previous operation whatever the streams.
  Status runGpu(Collective coll, const void* input, void* output, std::size_t count, DataType type,
                RedOp op, int root, void* stream);
  Status launchGpu(Collective coll, const algo::Plan& plan, const void* input, void* output,
                   std::size_t count, DataType type, RedOp op, int root, void* stream);
  // WEFT_CHECK_PLANS: every rank's account of how it runs this call (`how`), compared through
  // the bootstrap; a difference fails the call on every rank, naming both.
  Status checkSamePlan(Collective coll, std::size_t count, DataType type, RedOp op, int root,
                       const std::string& how);
  std::uint64_t gpuCalls_ = 0;  // calls on GPU memory so far (WEFT_CHECK_PLANS names them)
  // A host call's schedule on the CpuExecutor (run() divides for avg afterwards).
  Status runSchedule(Collective coll, const algo::Plan& plan, const void* input, void* output,
                     std::size_t count, DataType type, RedOp op, int root);
  // Sets up the GPU transport at the first call with GPU buffers (collective).
  Status ensureGpu();
  struct Cached {
    algo::Schedule schedule;
    std::uint32_t maxBlocks = 1;
    exec::ReferenceSteps byReference;  // single copy: which steps may send references
    exec::DirectSteps direct;          // between hosts: which steps move pieces direct
  };
  // maxChannels: what the executor's connections allow.
  Result<const Cached*> scheduleFor(Collective coll, const algo::Plan& plan, int root,
                                    int maxChannels);
  Status checkUsable(const char* what) const;
  Status fail(Status s);

  int rank_ = 0, size_ = 1;
  Config config_;
  Machine machine_;  // the host topology and where every rank runs
  std::unique_ptr<boot::Bootstrap> bootstrap_;
  transport::ShmGeometry geometry_;
  transport::ShmSegment inbox_;
  std::vector<transport::ShmSegment> peerInboxes_;  // by rank (own slot empty)
  std::vector<int> pids_;
  std::vector<bool> sameHost_;  // by rank: shares this host's memory
  std::vector<bool> viaUcx_;    // by rank: connected through UCX
  std::unique_ptr<transport::UcxTransport> ucx_;
  // Single copy between shared-memory peers: iRead_[q], this rank can read q's memory;
  // readsMe_[q], q can read this rank's. Messages of at least config_.singleCopyBytes use it.
  std::vector<transport::PeerMemory> peerMemory_;
  std::vector<std::uint8_t> iRead_, readsMe_;
  // Reads peers' buffers for every call, counting the bytes, timing other processes' reads and
  // raising this rank's refusal when they crawl; refuses_[q], rank q's refusal (null where q is
  // this rank or behind UCX).
  std::unique_ptr<transport::ReadRate> readRate_;
  std::vector<const std::atomic<std::uint32_t>*> refuses_;
  // Whether this rank may name a buffer to q for a message of `bytes` (q reads it itself).
  bool namesTo(std::size_t q, std::size_t bytes) const {
    return singleCopy(bytes, readsMe_[q]) && !transport::refusesReferences(refuses_[q]);
  }
  bool singleCopy(std::size_t bytes, std::uint8_t possible) const {
    return possible != 0 && config_.singleCopyBytes > 0 && bytes >= config_.singleCopyBytes;
  }
  std::vector<std::unique_ptr<transport::ShmConnection>> connections_;
  std::vector<std::unique_ptr<transport::ProgressingConnection>> progressing_;
  std::vector<exec::ChannelLinks> links_;     // by channel
  std::vector<exec::StagingArena> staging_;   // by channel: what direct sends of input read
  std::unique_ptr<algo::Selector> selector_;  // host memory's
  std::map<std::tuple<int, std::string, int, int, int, int>, std::unique_ptr<Cached>> schedules_;
  std::map<std::pair<int, std::size_t>, algo::Plan> plans_;
  // The GPU path, set up at the first call with GPU buffers: its executor, and a selector on
  // the GPU's graph with its own plans.
  std::unique_ptr<exec::CudaExecutor> gpu_;
  std::unique_ptr<algo::Selector> gpuSelector_;
  int gpuTunerChannels_ = 0;      // the channels gpuSelector_'s graph was made with
  double gpuTunerMemoryGBs_ = 0;  // and the device's peak memory rate (0: the H200's)
  int gpuTunerChannels() const;   // the channels a bulk call gets now
  std::map<std::pair<int, std::size_t>, algo::Plan> gpuPlans_;
  // Registered buffers, and once a collective used one, every rank's as mapped here. After
  // gpu_: destroyed first (the destructor waits for the kernels that may read them).
  struct Registration {
    std::byte* base = nullptr;
    std::size_t bytes = 0;
    std::shared_ptr<exec::CudaExecutor::PeerInputs> peers;
  };
  std::vector<std::unique_ptr<Registration>> registrations_;
  Registration* registrationHolding(const void* p, std::size_t bytes);
  std::vector<std::byte> scratch_;
  // workspace(…, false): weftHostAlloc memory; and the peers' as peerWorkspaces mapped them.
  std::shared_ptr<std::byte> hostWorkspace_;
  std::size_t hostWorkspaceBytes_ = 0;
  std::unique_ptr<transport::PeerAllocations> peerWorkspaces_;
  // The last exchange's workspaces as every rank named them, and what came of it: the same
  // names again (the same on every rank) need no new mapping and no agreement.
  std::vector<std::uint64_t> peerNames_;
  std::vector<const std::byte*> peerViews_;
  std::optional<weftCompression> compression_;  // set by weftCommSetCompression
  std::map<std::tuple<int, std::size_t, std::string, bool, bool>, algo::Plan> compressedPlans_;
  std::vector<Communicator*> children_;  // adopt()'s, which fusedStates_ own
  // fused/'s state by name, and the tensor-parallel plans; after gpu_: destroyed first.
  std::map<std::string, std::shared_ptr<void>, std::less<>> fusedStates_;
  std::map<std::tuple<int, std::size_t, std::size_t, std::size_t, std::size_t, std::size_t,
                      std::size_t, int>,
           algo::TpPlan>
      tpPlans_;
  std::map<std::tuple<std::size_t, int, int, int, std::size_t, bool, bool, bool>,
           algo::AttentionPlan>
      attentionPlans_;
  // The MoE plans rank 0 logged (shape and pick), so that each is logged once.
  std::set<std::tuple<std::size_t, std::size_t, int, bool>> moeLogged_;
  // The direct path: whether it may run (every rank on this host through shared memory; the
  // same on every rank), the ranks' control pages, stages and this rank's threads, and what its
  // calls carry from one to the next.
  bool directPossible_ = false;
  bool directThreads_ = false;  // every rank is a thread of this process
  // Every rank on this host through shared memory, WEFT_HOST_DIRECT not 0: peerWorkspaces may
  // map (the same on every rank).
  bool workspacesShared_ = false;
  int directFewestCores_ = 0;  // between processes: the fewest cores of any rank
  exec::DirectGroup directGroup_;
  exec::DirectState directState_;
  // Small calls through the slots: whether every rank shares this host's memory (the same on
  // every rank), the ranks' slots, and the slot calls made.
  bool slotsPossible_ = false;
  exec::SlotsGroup slotsGroup_;
  std::uint64_t slotsCalls_ = 0;
  std::atomic<int>* abortFlag_ = nullptr;  // in this rank's inbox
  std::unique_ptr<transport::Waiter> waiter_;
  // Call signatures (src/core/call_check.cpp).
  struct CallSignature {
    Collective coll = Collective::allReduce;
    DataType type = DataType::f32;
    RedOp op = RedOp::sum;
    int root = 0;
    std::size_t count = 0;
    bool gpu = false;  // on GPU memory
    std::string toString() const;
    bool operator==(const CallSignature& o) const;  // op and root where they matter
    std::uint32_t signature() const;                // what GPU messages carry (device::signatureOf)
  };
  struct Posted {
    enum State { notYet, here, ahead } state = notYet;
    CallSignature call;
  };
  // Writes this call's signature under the next call number into this rank's inbox.
  void publishCall(const CallSignature& call);
  // A host call: published, then compared during its waits (watchCall) and at its end.
  void postCall(Collective coll, std::size_t count, DataType type, RedOp op, int root);
  // A GPU call, before its launch: published, then compared with every peer that made this
  // call already. The host never waits for a kernel, so it waits for no peer either: of two
  // ranks the later to publish sees the other's call (sequentially consistent publication).
  Status checkGpuCall(Collective coll, std::size_t count, DataType type, RedOp op, int root);
  // Entry p read as one call (a seqlock: see publishCall): its number, or 0 where it was being
  // rewritten meanwhile.
  static std::uint64_t readPosted(const transport::PostedCall& p, CallSignature& call);
  Posted postedBy(int q) const;  // peer q's post of this rank's current call number
  // The GPU call among rank q's last posted ones (this rank's own included) whose signature is
  // `signature` (ll: whose ll flag bits are), named; "" where none or several calls match.
  std::string callSigned(int q, std::uint64_t signature, bool ll) const;
  bool comparesWith(int q) const;
  Status mismatch(int q, const CallSignature& theirs);
  void watchCall();     // during the call's waits
  Status verifyCall();  // before the call returns: every peer's post, waited for
  // Point-to-point (a batch: sends, receives, all-to-all-v). `before` a host batch moves
  // anything: posts every operation in the peer's inbox and compares each receive with its
  // sender's post (waiting for it); `after`: each send with its receiver's post where that is
  // there already (a send never waits for it); `gpu`, before a GPU batch is launched: posts
  // every operation and compares each with its peer's post where that is there already.
  enum class OpsCheck { before, after, gpu };
  Status checkOps(const std::vector<P2pOp>& ops, OpsCheck when);
  std::uint64_t postedCalls_ = 0;  // collectives made (posted) so far, host and GPU
  std::vector<std::uint64_t> sendsTo_, recvsFrom_;  // by peer: point-to-point operations posted
  CallSignature current_;
  std::atomic<bool> inCall_{false};
  std::atomic<bool> mismatchRaised_{false};
  bool created_ = false;         // create() finished: a destructor before that aborts the peers
  bool channelsInline_ = false;  // a schedule's channels one after another on the caller
  std::size_t hostThreads_ = 1;  // hostThreads()
  std::unique_ptr<ChannelWorkers> workers_;  // last: stopped before anything they use goes
};

// The GPU tuner's model of a communicator of the C API (Communicator::gpuTunerModel), for tools
// that fit constants to it (weft-perf --calibrate --gpu). Exported from libweft, which holds the
// communicators: a tool's own copy of the runtime could not reach them.
WEFT_API Result<Communicator::GpuModel> gpuTunerModelOf(weftComm_t comm);
// Communicator::hostCounters of a communicator of the C API, for tests and tools.
WEFT_API Result<Communicator::HostCounters> hostCountersOf(weftComm_t comm);

}  // namespace weft
