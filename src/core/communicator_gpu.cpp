// The communicator's GPU path: setting up the GPU transport at the first call on GPU memory,
// the GPU tuner's plans, registered buffers, and each call's launch, ordered after the
// communicator's previous operation whatever its stream (src/exec/launch_order.hpp).
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>

#include "algorithms/algorithm.hpp"
#include "src/core/communicator.hpp"
#include "src/core/sizes.hpp"
#include "src/transport/cuda_ipc.hpp"
#include "src/transport/shm.hpp"

namespace weft {

namespace {
// A bulk GPU call takes a channel (thread block) for every this many bytes, as many as it has.
constexpr std::size_t kGpuBytesPerChannel = 512 * 1024;
constexpr std::size_t kGpuLlMaxBytes = 64 * 1024;
// The direct all-reduce kernels: one-shot up to this many bytes, and at any size below
// kGpuTwoShotDirectRanks ranks; two-shot beyond (measured on the H200, docs/perf.md: at 4 ranks
// one-shot was 7-23 % faster than two-shot from 64 KB to 64 MB, 2026-11-30e; at 8 ranks
// two-shot from 2 MB on, 8 % at 16 MB. Since one-shot runs the ll kernel to 256 KiB, at 8 ranks
// it took 128 KB in 15.3-15.5 us against two-shot's 23.6-23.9, 13.8-14.0 against 16.3 in CUDA
// graphs; at 256 KB two-shot won in graphs, 17.0-17.3 against 23.8-24.0, 2026-11-30l).
constexpr std::size_t kGpuOneShotDirectBytes = 128 * 1024;
// The direct reduce-scatter and all-to-all kernels take inputs up to this many bytes a rank (a
// slab holds a 1/n share of every piece, so larger inputs take many short rounds): on one H200
// they beat ring and pairwise 1.5-3x to 4 MB and lost from 16 MB (2 and 8 ranks, 2026-11-30f,
// docs/perf.md). All-gather's, whose slab holds its whole share, takes the rounds' limit (at 8
// ranks 821 against ring's 1956 us at 256 MB).
constexpr std::size_t kGpuDirectExchangeBytes = std::size_t{4} << 20;
// ... and all three on 2 ranks up to this many (two H200s over NVLink: all-gather 27 against
// ring's 39 us at 8 MB, but 91 against 79 at 32 MB; one H200: 31 against 38 at 16 MB; in CUDA
// graphs at 8 MB, 2026-11-30: all-to-all 32.4 against pairwise's 37.5, reduce-scatter 31.4
// against ring's 31.2).
constexpr std::size_t kGpuDirectPairBytes = std::size_t{8} << 20;
constexpr int kGpuTwoShotDirectRanks = 5;
// Past one round of the direct kernels' slabs (2 MB on 8 ranks of an H200, 4 MB on 2 and 4)
// they run in rounds, up to this many by rank count (the larger measured count's for those
// between): each round pays two flag round trips, where ring pays a pass of chained flags and
// traffic through the FIFO slots. Ranks sharing one H200 (docs/perf.md, 2026-11-30e): on 2
// ranks one-shot beat ring to 16 MB (48 against 51 us) and lost from 32 MB (90 against 83); on
// 4 one-shot beat ring by 13-22 % to 64 MB, on 8 two-shot beat ring by 7-8 % to 128 MB (64
// rounds), as far as measured. WEFT_GPU_DIRECT=N overrides it.
int directRoundsFor(int nranks) {
  if (nranks <= 2) return 4;
  if (nranks <= 4) return 16;
  return 64;
}
// By default two-shot reads registered inputs in place at any rank count, one-shot up to this
// many ranks at any size, and beyond them from this many bytes: below, its extra barrier (every
// rank waits until all are done reading) cost more than the copy it saves (8 ranks on the H200:
// 37 against 31 us at 128 KB; 4 ranks: 21.2 against 20.3 at 1 MB, but 26.7 against 29.2 at 4 MB
// and 291 against 340 at 64 MB; docs/perf.md).
constexpr int kGpuRegisteredOneShotRanks = 2;
constexpr std::size_t kGpuRegisteredOneShotBytes = std::size_t{4} << 20;
}  // namespace

algo::RankGraph sameDeviceRankGraph(int nranks, int channels, std::size_t slotBytes) {
  // Every message is a copy through the GPU's memory, which the ranks' kernels share: an
  // algorithm costs its memory traffic (reads and writes, the FIFO slots' included) over the
  // device's copy bandwidth (4.2 TB/s on the H200), plus its chains of flags (NVLink-class
  // hops, through L2). Ring moved its traffic at that rate once its forwarding steps read each
  // message once (2026-11-30d: 8 ranks, 4-256 MB, within 5 % of this model; docs/perf.md). The
  // link figures stay for the estimates that read them.
  const double perRank = 2000.0 / std::max(1, nranks);
  algo::RankGraph g = uniformRankGraph(nranks, topo::PathClass::nvl, perRank, perRank / 4);
  g.deviceCopyGBs = 4200;
  g.deviceChannels = channels;
  g.deviceBytesPerChannel = static_cast<double>(kGpuBytesPerChannel);
  g.deviceSlotBytes = static_cast<double>(slotBytes);
  // Two-shot's waits on every peer: 12 us per peer past one in every pass, what it paid over
  // the model's traffic and chains on the H200 (2026-11-30d, 8 MB to 256 MB: 21-27 us a pass at
  // 4 ranks, 67-150 at 8; docs/perf.md).
  g.deviceAllPeersUs = 12.0;
  return g;
}

Result<void*> Communicator::registerBuffer(void* buf, std::size_t bytes) {
  if (buf == nullptr || bytes == 0) {
    return Status(
        Code::invalidArgument,
        "weftCommRegister: " + std::string(buf == nullptr ? "buffer is NULL" : "0 bytes"));
  }
  auto r = std::make_unique<Registration>();
  r->base = static_cast<std::byte*>(buf);
  r->bytes = bytes;
  registrations_.push_back(std::move(r));
  return static_cast<void*>(registrations_.back().get());
}

Status Communicator::deregisterBuffer(void* handle) {
  auto it = std::find_if(registrations_.begin(), registrations_.end(),
                         [&](const auto& r) { return r.get() == handle; });
  if (it == registrations_.end()) {
    return Status(Code::invalidArgument,
                  "weftCommDeregister: not a handle weftCommRegister gave on this communicator");
  }
  // Kernels enqueued on it may still read the peers' buffers through the mappings.
  if ((*it)->peers && gpu_) {
    if (Status s = gpu_->synchronize(); !s) return s;
  }
  registrations_.erase(it);
  return {};
}

Communicator::Registration* Communicator::registrationHolding(const void* p, std::size_t bytes) {
  const auto* b = static_cast<const std::byte*>(p);
  for (const auto& r : registrations_) {
    if (b >= r->base && bytes <= r->bytes &&
        b - r->base <= static_cast<std::ptrdiff_t>(r->bytes - bytes))
      return r.get();
  }
  return nullptr;
}

Status Communicator::ensureGpu() {
  if (gpu_) return {};
  for (std::size_t q = 0; q < sameHost_.size(); ++q) {
    if (!sameHost_[q]) {
      return Status(Code::unsupported, "rank " + std::to_string(rank_) +
                                           ": GPU buffers need every rank on one host "
                                           "for now (rank " +
                                           std::to_string(q) +
                                           " runs on another); use host buffers");
    }
  }
  exec::GpuOptions o;
  o.channels = config_.gpuChannels;
  o.slotBytes = config_.gpuSlotBytes;
  o.llDirectBytes = config_.gpuLlDirectBytes;
  o.directBlockBytes = config_.gpuDirectBlockBytes;
  o.llBlockBytes = config_.gpuLlBlockBytes;
  o.llBlocks = config_.gpuLlBlocks;
  o.dependentLaunch = config_.gpuDependentLaunch;
  o.graphMixing = config_.graphMixing;
  o.tracePath = config_.gpuTrace;
  o.timeout = config_.timeout;
  // Kernels watch this rank's host abort word through a mapping of the page that holds it.
  const auto* word = reinterpret_cast<const std::byte*>(abortFlag_);
  const auto pageBytes = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  const std::size_t offset = static_cast<std::size_t>(word - inbox_.data());
  o.controlPage = inbox_.data() + offset / pageBytes * pageBytes;
  o.controlBytes = pageBytes;
  o.hostAbort = reinterpret_cast<const std::int32_t*>(abortFlag_);
  static_assert(sizeof(std::atomic<int>) == sizeof(std::int32_t));
  auto gpu = exec::CudaExecutor::create(o, *bootstrap_);
  if (!gpu) return fail(gpu.status());
  gpu_ = std::move(*gpu);
  gpu_->namer = [this](int q, std::uint64_t signature, bool ll) {
    return callSigned(q, signature, ll);
  };
  // Ranks that are threads of one process and share a GPU run kernels that wait on each other
  // from streams of one CUDA context. Beyond CUDA_DEVICE_MAX_CONNECTIONS streams (8 unless set)
  // streams share hardware queues, where a rank's kernel queued behind a peer's next call
  // (which waits for that peer's current kernel, which waits for this rank) could never start:
  // the suspected cause of a timeout seen once on 8 such ranks (docs/perf.md, 2026-11-30d). 32
  // queues, set before CUDA starts, give each of up to 32 streams its own.
  static std::atomic<bool> warned{false};
  if (gpu_->threadsOnDevice() > 1 && config_.cudaMaxConnections < 32 && !warned.exchange(true)) {
    std::fprintf(stderr,
                 "weft: %d ranks of this process share GPU %d with CUDA_DEVICE_MAX_CONNECTIONS=%d; "
                 "their streams may share hardware queues, where one rank's kernel can wait "
                 "behind a peer's that waits for it (a timeout). Set "
                 "CUDA_DEVICE_MAX_CONNECTIONS=32 before CUDA starts.\n",
                 gpu_->threadsOnDevice(), gpu_->device(), config_.cudaMaxConnections);
  }
  return {};
}

std::size_t Communicator::directRounds() const {
  return static_cast<std::size_t>(config_.gpuDirect < 0 ? directRoundsFor(size_)
                                                        : config_.gpuDirect);
}

bool Communicator::directKernelServes(Collective coll, const std::string& algorithm,
                                      std::size_t bytes, std::size_t limit) const {
  if (coll == Collective::allReduce) {
    return bytes <= limit * directRounds() && (algorithm == "oneshot" || algorithm == "twoshot");
  }
  // The block collectives' one-shot, by the bytes of each rank's input (an all-gather's is one
  // block of the call's), at most 64 ranks (a slab holds a share of every rank's piece).
  const bool blocks = coll == Collective::allGather || coll == Collective::reduceScatter ||
                      coll == Collective::allToAll;
  const std::size_t input = coll == Collective::allGather ? bytes / std::size_t(size_) : bytes;
  const std::size_t most = size_ <= 2 ? std::min(limit * directRounds(), kGpuDirectPairBytes)
                           : coll != Collective::allGather
                               ? std::min(limit * directRounds(), kGpuDirectExchangeBytes)
                               : limit * directRounds();
  return blocks && algorithm == "oneshot" && size_ <= 64 && input <= most;
}

bool Communicator::readsRegisteredInPlace(bool twoShot, std::size_t bytes) const {
  if (config_.gpuRegistered >= 0) return config_.gpuRegistered == 1;
  return twoShot || size_ <= kGpuRegisteredOneShotRanks || bytes >= kGpuRegisteredOneShotBytes;
}

bool Communicator::writesRegisteredOutputs() const {
  // Measured 2026-11-30 (docs/perf.md): 15-21 % more busbw from 16 MB on 4 and 8 ranks than
  // gathering from the slabs, the same within a microsecond below 4 MB. So unless turned off.
  return config_.gpuRegistered != 0;
}

Status Communicator::runGpu(Collective coll, const void* input, void* output, std::size_t count,
                            DataType type, RedOp op, int root, void* stream) {
  if (!exec::cudaBuilt()) {
    return Status(Code::unsupported, std::string(name(coll)) +
                                         ": GPU buffers, but this build has no CUDA (build with "
                                         "nvcc present, WEFT_CUDA=ON)");
  }
  if (Status s = ensureGpu(); !s) return s;
  if (count == 0) return gpu_->asyncError();
  if (config_.checkCalls) {
    if (Status s = checkGpuCall(coll, count, type, op, root); !s) return s;
  }
  // The kernels compare it too, where the hosts could not (graphs replayed, a rank many calls
  // ahead).
  gpu_->sign(config_.checkCalls ? current_.signature() : 0);
  const algo::Segments seg = algo::segments(coll, size_);
  const std::size_t bytes = std::size_t{seg.message()} * count * sizeOf(type);
  auto planned = gpuPlanFor(coll, bytes);
  if (!planned) return planned.status();
  algo::Plan plan = *planned;
  // One channel is one thread block, one SM: a bulk call spreads over more of them than the
  // tuner's host-shaped count, a block for every 512 KiB, as many as the FIFOs and the device's
  // residency allow.
  if (plan.protocol == algo::Protocol::simple) {
    const auto wanted = static_cast<int>(
        std::min<std::size_t>((bytes + kGpuBytesPerChannel - 1) / kGpuBytesPerChannel, 1024));
    plan.channels = std::clamp(wanted, plan.channels, std::max(plan.channels, gpu_->channels()));
  }
  ++gpuCalls_;
  if (Status s = gpu_->begin(stream); !s) return fail(s);
  if (Status s = launchGpu(coll, plan, input, output, count, type, op, root, stream); !s) return s;
  if (Status s = gpu_->end(stream); !s) return fail(s);
  return {};
}

Status Communicator::launchGpu(Collective coll, const algo::Plan& plan, const void* input,
                               void* output, std::size_t count, DataType type, RedOp op, int root,
                               void* stream) {
  const algo::Segments seg = algo::segments(coll, size_);
  const std::size_t bytes = std::size_t{seg.message()} * count * sizeOf(type);
  exec::Buffers b{input, output, nullptr, count, type, op};
  auto finish = [&]() -> Status {
    if (op == RedOp::avg && output != nullptr && (coll != Collective::reduce || rank_ == root)) {
      const std::size_t n = std::size_t{seg.output} * count;
      if (Status st = gpu_->divide(output, n, type, static_cast<std::uint64_t>(size_), stream); !st)
        return fail(st);
    }
    return {};
  };
  if (directKernelServes(coll, plan.algorithm, bytes, gpu_->oneShotLimit())) {
    if (config_.debug == "INFO" || config_.debug == "TRACE") {
      if (rank_ == 0)
        std::fprintf(stderr, "weft INFO %s %zu bytes on GPU: %s, direct kernel (%s)\n",
                     std::string(name(coll)).c_str(), bytes, plan.algorithm.c_str(),
                     plan.reason.c_str());
    }
    if (coll != Collective::allReduce) {
      const device::DirectKind kind = coll == Collective::allGather ? device::DirectKind::gather
                                      : coll == Collective::reduceScatter
                                          ? device::DirectKind::reduceScatter
                                          : device::DirectKind::exchange;
      if (Status st = checkSamePlan(coll, count, type, op, root, "the direct one-shot kernel"); !st)
        return st;
      if (Status st = gpu_->directBlocks(b, kind, stream); !st) return fail(st);
      return finish();
    }
    // On a registered input: peers read it where it is (every rank's is registered, at the
    // same offset: the NCCL rule). Out of place, or exactly in place for two-shot (each piece of
    // an input is read by one rank, which writes it only after; one-shot's sum would overwrite
    // what peers still read). The ranks' buffers are exchanged at the first such call, outside
    // graph capture (inside one, the slabs serve until then).
    const bool twoShot = plan.algorithm == "twoshot";
    const auto* in = static_cast<const std::byte*>(input);
    const auto* out = static_cast<const std::byte*>(output);
    const bool overlap = in < out + bytes && out < in + bytes;
    // Every rank's buffer holding `at` (mapped at the first such call) and `at`'s offset in it;
    // null where `at` is not registered or the peers are not mapped yet.
    struct Mapped {
      const exec::CudaExecutor::PeerInputs* peers = nullptr;
      std::size_t offset = 0;
    };
    auto mappedAt = [&](const std::byte* at) -> Result<Mapped> {
      Registration* r = registrationHolding(at, bytes);
      if (r == nullptr) return Mapped{};
      if (!r->peers && !exec::CudaExecutor::capturing(stream)) {
        auto mapped = gpu_->mapRegistered(r->base, *bootstrap_);
        if (!mapped) return mapped.status();
        r->peers = std::move(*mapped);
      }
      if (!r->peers) return Mapped{};
      return Mapped{r->peers.get(), static_cast<std::size_t>(at - r->base)};
    };
    if (config_.checkPlans) {
      // Whether this rank would read or write registered buffers in place, before mapping them
      // (collective: a rank that maps alone would wait there).
      const bool readable = (!overlap || (twoShot && in == out)) &&
                            readsRegisteredInPlace(twoShot, bytes) &&
                            registrationHolding(in, bytes) != nullptr;
      const bool writable = twoShot && (!overlap || in == out) && size_ <= 64 &&
                            writesRegisteredOutputs() && registrationHolding(out, bytes) != nullptr;
      const std::string how = "the direct " + plan.algorithm + " kernel" +
                              (readable ? ", inputs registered" : "") +
                              (writable ? ", outputs registered" : "") +
                              (exec::CudaExecutor::capturing(stream) ? ", in graph capture" : "");
      if (Status st = checkSamePlan(coll, count, type, op, root, how); !st) return st;
    }
    Mapped reads, writes;
    if ((!overlap || (twoShot && in == out)) && readsRegisteredInPlace(twoShot, bytes)) {
      auto m = mappedAt(in);
      if (!m) return fail(m.status());
      reads = *m;
    }
    // Two-shot on a registered output (out of place or exactly in place; 64 ranks at most):
    // each rank writes its summed piece into every rank's output, and none gathers.
    if (twoShot && (!overlap || in == out) && size_ <= 64 && writesRegisteredOutputs()) {
      auto m = mappedAt(out);
      if (!m) return fail(m.status());
      writes = *m;
    }
    if (Status st = gpu_->direct(b, twoShot, stream, reads.peers, reads.offset, writes.peers,
                                 writes.offset);
        !st)
      return fail(st);
    return finish();
  }
  auto cached = scheduleFor(coll, plan, root, gpu_->channels());
  if (!cached) return cached.status();
  const algo::Schedule& s = (*cached)->schedule;
  // Each block's slice sits at a 16-byte stride in a message (vector loads and stores). The
  // geometry cuts slices at 16-byte multiples, so the strides add up to no more than the message
  // (no slack: with one, a 1 MiB piece took a fifth pass of 64 bytes through 256 KiB slots).
  const std::size_t capacity = gpu_->messageBytes(plan.protocol);
  if (16 * std::size_t{(*cached)->maxBlocks} > capacity) {
    return Status(Code::unsupported, plan.algorithm + " moves " +
                                         std::to_string((*cached)->maxBlocks) +
                                         " blocks in one step, more than a GPU slot holds");
  }
  const std::size_t message = std::min(capacity, std::max<std::size_t>(plan.chunkBytes, 4096));
  const exec::Geometry g = exec::Geometry::of(s, count, type, (*cached)->maxBlocks, message);
  if (config_.debug == "INFO" || config_.debug == "TRACE") {
    if (rank_ == 0) {
      std::fprintf(stderr,
                   "weft INFO %s %zu bytes on GPU: %s/%s, %zu channel(s), %zu-element "
                   "slices (%s)\n",
                   std::string(name(coll)).c_str(), bytes, plan.algorithm.c_str(),
                   std::string(algo::name(plan.protocol)).c_str(), s.channels.size(), g.sliceElems,
                   plan.reason.c_str());
    }
  }
  if (config_.checkPlans) {
    const std::string how = plan.algorithm + "/" + std::string(algo::name(plan.protocol)) + ", " +
                            std::to_string(s.channels.size()) + " channel(s), " +
                            std::to_string(g.sliceElems) + "-element slices";
    if (Status st = checkSamePlan(coll, count, type, op, root, how); !st) return st;
  }
  if (Status st = gpu_->run(s, g, b, plan.protocol, stream); !st) return fail(st);
  return finish();
}

Status Communicator::checkSamePlan(Collective coll, std::size_t count, DataType type, RedOp op,
                                   int root, const std::string& how) {
  if (!config_.checkPlans) return {};
  // Fixed-size records, one per rank: the call (its number among this communicator's GPU
  // calls and its arguments) and how this rank runs it.
  struct Record {
    std::uint64_t call, count;
    std::int32_t coll, type, op, root;
    char how[160];
  };
  std::vector<Record> all(static_cast<std::size_t>(size_));
  Record& self = all[static_cast<std::size_t>(rank_)];
  std::memset(&self, 0, sizeof self);
  self.call = gpuCalls_;
  self.count = count;
  self.coll = static_cast<std::int32_t>(coll);
  self.type = static_cast<std::int32_t>(type);
  self.op = static_cast<std::int32_t>(op);
  self.root = root;
  std::snprintf(self.how, sizeof self.how, "%s", how.c_str());
  if (Status s = bootstrap_->allGather(all.data(), sizeof(Record)); !s) return fail(s);
  auto describe = [](const Record& r) {
    return "call " + std::to_string(r.call) + ", " +
           std::string(name(static_cast<Collective>(r.coll))) + "(" +
           std::string(name(static_cast<DataType>(r.type))) + ", " + std::to_string(r.count) +
           ", " + std::string(name(static_cast<RedOp>(r.op))) + ", root " + std::to_string(r.root) +
           ") as " + r.how;
  };
  for (std::size_t q = 0; q < all.size(); ++q) {
    const Record& r = all[q];
    if (r.call == self.call && r.count == self.count && r.coll == self.coll &&
        r.type == self.type && r.op == self.op && r.root == self.root &&
        std::strncmp(r.how, self.how, sizeof self.how) == 0)
      continue;
    return fail(Status(Code::invalidUsage, "WEFT_CHECK_PLANS: rank " + std::to_string(rank_) +
                                               " runs " + describe(self) + " but rank " +
                                               std::to_string(q) + " runs " + describe(r)));
  }
  return {};
}

Status Communicator::asyncError() const {
  if (gpu_) {
    Status s = gpu_->asyncError();
    // A kernel another rank aborted: with that rank's reason (a mismatched call's, say).
    if (s.code() == Code::remoteError && aborted()) {
      return Status(s.code(), s.message() + " (" +
                                  std::string(transport::controlOf(inbox_.data())->reason) + ")");
    }
    if (!s) return s;
  }
  return checkUsable("asyncError");
}

int Communicator::device() const {
  return gpu_ ? gpu_->device() : -1;
}

int Communicator::gpuTunerChannels() const {
  // The channels a bulk call gets: the device's, or before it is set up the default for a
  // 132-SM H100/H200 (the largest power of two giving each rank its own SMs, at most 64). A
  // tuner made on that guess is made again once the device says otherwise.
  const int channels = gpu_ ? gpu_->channels() : config_.gpuChannels;
  return channels > 0 ? channels : exec::GpuOptions::autoChannels(132, size_);
}

Communicator::GpuModel Communicator::gpuTunerModel() const {
  GpuModel m{sameDeviceRankGraph(size_, gpuTunerChannels(), config_.gpuSlotBytes),
             config_.tuner.constants};
  if (config_.tuner.tuningFile.empty()) {
    // A dependent step of the bulk protocol on one device (a flag store, a poll through L2,
    // the block's barriers, the upstream's lag): 5 us, each step's wait in every pass as
    // measured on 4 and 8 ranks of the H200 (2026-11-30d, 4.6-5.7 us; WEFT_GPU_TRACE and
    // docs/perf.md).
    m.constants.hopLatency[static_cast<std::size_t>(algo::Protocol::simple)]
                          [static_cast<std::size_t>(algo::LinkClass::nvlink)] = 5.0;
  }
  return m;
}

Result<algo::Plan> Communicator::gpuPlanFor(Collective coll, std::size_t bytes) {
  // The GPU tuner needs no device: it exists before the first GPU call, so a plan can be asked
  // for without setting up the GPU transport. A tuner made on the guessed channels is made
  // again once the device says otherwise.
  const int channels = gpuTunerChannels();
  if (gpuTuner_ && gpuTunerChannels_ != channels) {
    gpuTuner_.reset();
    gpuPlans_.clear();
  }
  if (!gpuTuner_) {
    gpuTunerChannels_ = channels;
    const GpuModel model = gpuTunerModel();
    algo::TunerOptions options = config_.tuner;
    options.constants = model.constants;
    // The double binary tree and recursive halving-doubling ran 1.1-2.1x slower than ring on
    // the H200 at 4-32 MB where the model put them ahead (4 and 8 ranks, 2026-11-30d;
    // docs/perf.md): their device costs are not modelled, so only WEFT_ALGO picks them there.
    options.unpriced.insert(options.unpriced.end(), {"dbtree", "rhd"});
    gpuTuner_ = std::make_unique<algo::Tuner>(model.graph, options);
  }
  const auto key = std::make_pair(static_cast<int>(coll), bytes);
  if (auto it = gpuPlans_.find(key); it != gpuPlans_.end()) return it->second;
  auto plan = gpuTuner_->plan(coll, bytes);
  if (!plan) return plan;
  // Up to one round of the direct kernels' slabs an all-reduce's slabs stay in L2, where the
  // model's memory traffic does not apply, and the direct kernels beat every schedule through
  // the FIFOs (4-6x at 2 MB); in rounds they stay ahead of ring to the rounds' limit
  // (directRoundsFor). Between them (H200, device-scope flags, docs/perf.md): one-shot's single
  // flag round trip wins small calls at every rank count (to 128 KB on 8), and every size to 4
  // ranks; on 8 ranks two-shot's smaller traffic wins from 2 MB (40 against 48 us, 34 against 49
  // on registered inputs).
  const std::size_t directLimit =
      gpu_ ? gpu_->oneShotLimit() : transport::CudaIpcGeometry::kDirectMaxBytes;
  const char* direct = coll == Collective::allReduce && size_ >= kGpuTwoShotDirectRanks &&
                               bytes > kGpuOneShotDirectBytes
                           ? "twoshot"
                           : "oneshot";
  if (directKernelServes(coll, direct, bytes, directLimit) && config_.tuner.algorithms.empty() &&
      !config_.tuner.protocol.has_value() && plan->algorithm != direct) {
    auto all = gpuTuner_->explain(coll, bytes);
    for (const algo::Estimate& e : all) {
      if (e.algorithm != direct) continue;
      plan->algorithm = e.algorithm;
      plan->protocol = e.protocol;
      plan->estimateUs = e.timeUs;
      plan->reason = "the direct " + std::string(direct) + " kernel up to " +
                     std::to_string((directLimit * directRounds()) >> 10) + " KiB on GPU; " +
                     plan->reason;
      break;
    }
  }
  // The ll protocol on GPU moves one 16 KiB message at a time per channel and takes no extra
  // channels, so past small sizes it is far slower than the cost model says (4 ranks on the
  // H200: 1.4-5 GB/s busbw at 128 KB - 2 MB, docs/perf.md); there the bulk protocol runs. A
  // direct all-reduce kernel uses no protocol.
  if (plan->protocol == algo::Protocol::ll && bytes > kGpuLlMaxBytes &&
      !config_.tuner.protocol.has_value() &&
      !directKernelServes(coll, plan->algorithm, bytes, directLimit)) {
    auto simple = gpuTuner_->plan(coll, bytes, algo::Protocol::simple);
    if (!simple) return simple;
    simple->reason = "the bulk protocol past " + std::to_string(kGpuLlMaxBytes / 1024) +
                     " KiB on GPU; " + simple->reason;
    plan = std::move(simple);
  }
  // Past the direct kernel, the block collectives' one-shot would run as a schedule through the
  // FIFOs, every peer's message at once, which nothing has measured on GPU: the next cheapest
  // (ring, PAT, pairwise: measured) runs instead unless WEFT_ALGO asks for one-shot.
  if (coll != Collective::allReduce && plan->algorithm == "oneshot" &&
      config_.tuner.algorithms.empty() &&
      !directKernelServes(coll, "oneshot", bytes, directLimit)) {
    for (const algo::Estimate& e : gpuTuner_->explain(coll, bytes)) {
      if (e.algorithm == "oneshot") continue;
      if (config_.tuner.protocol.has_value()
              ? e.protocol != *config_.tuner.protocol
              : e.protocol == algo::Protocol::ll && bytes > kGpuLlMaxBytes)
        continue;
      plan->algorithm = e.algorithm;
      plan->protocol = e.protocol;
      plan->aggregation = e.aggregation;
      plan->estimateUs = e.timeUs;
      gpuTuner_->shape(e, bytes, plan->channels, plan->chunkBytes);
      plan->reason = "one-shot through the FIFOs is unmeasured on GPU; " + plan->reason;
      break;
    }
  }
  // A plan asked for before the GPU is set up assumed the direct kernels' largest limit; the
  // device's own may be smaller, so only plans made with it are kept.
  if (gpu_) gpuPlans_.emplace(key, *plan);
  return plan;
}

}  // namespace weft
