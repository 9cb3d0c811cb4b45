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
#include "src/core/log.hpp"
#include "src/core/sizes.hpp"
#include "src/transport/cuda_ipc.hpp"
#include "src/transport/shm.hpp"

namespace weft {

namespace {
// A bulk GPU call takes a channel (thread block) for every this many bytes, as many as it has.
constexpr std::size_t kGpuBytesPerChannel = 512 * 1024;
}  // namespace

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
  // Which GPU every rank has: the GPU tuner's graph is made again on them.
  if (Status s = machine_.learnDevices(*bootstrap_, gpu_->device(), exec::busIdOf(gpu_->device()));
      !s)
    return fail(s);
  gpuSelector_.reset();
  gpuPlans_.clear();
  gpu_->namer = [this](int q, std::uint64_t signature, bool ll) {
    return callSigned(q, signature, ll);
  };
  // Ranks that are threads of one process and share a GPU run kernels that wait on each other
  // from streams of one CUDA context. Beyond CUDA_DEVICE_MAX_CONNECTIONS streams (8 unless set)
  // streams share hardware queues, where a rank's kernel queued behind a peer's next call
  // (which waits for that peer's current kernel, which waits for this rank) could never start
  // (docs/perf-gpu.md, "MPS and hardware queues"). 32 queues, set before CUDA starts, give each of
  // up to 32 streams its own.
  static std::atomic<bool> warned{false};
  if (gpu_->threadsOnDevice() > 1 && config_.cudaMaxConnections < 32 && !warned.exchange(true)) {
    WEFT_WARN(log::kInit,
              "%d ranks of this process share GPU %d with CUDA_DEVICE_MAX_CONNECTIONS=%d; their "
              "streams may share hardware queues, where one rank's kernel can wait behind a "
              "peer's that waits for it (a timeout). Set CUDA_DEVICE_MAX_CONNECTIONS=32 before "
              "CUDA starts.",
              gpu_->threadsOnDevice(), gpu_->device(), config_.cudaMaxConnections);
  }
  return {};
}

bool Communicator::readsRegisteredInPlace(bool twoShot, std::size_t bytes) const {
  if (config_.gpuRegistered >= 0) return config_.gpuRegistered == 1;
  const algo::KernelConstants& k = config_.tuner.constants.kernels;
  return twoShot || size_ <= k.gpuRegisteredOneShotMaxRanks ||
         bytes >= k.gpuRegisteredOneShotMinBytes;
}

bool Communicator::writesRegisteredOutputs() const {
  // Faster from 16 MB, level below (docs/perf-gpu.md, "registered outputs"): unless turned off.
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
  if (plan.kernel == algo::Kernel::gpuDirect) {
    if (rank_ == 0)
      WEFT_INFO(log::kColl, "%s %zu bytes on GPU: %s, direct kernel (%s)",
                std::string(name(coll)).c_str(), bytes, plan.algorithm.c_str(),
                plan.reason.c_str());
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
  if (rank_ == 0)
    WEFT_INFO(log::kColl, "%s %zu bytes on GPU: %s/%s, %zu channel(s), %zu-element slices (%s)",
              std::string(name(coll)).c_str(), bytes, plan.algorithm.c_str(),
              std::string(algo::name(plan.protocol)).c_str(), s.channels.size(), g.sliceElems,
              plan.reason.c_str());
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
  for (const Communicator* c : children_) {
    if (Status s = c->asyncError(); !s) return s;
  }
  return checkUsable("asyncError");
}

int Communicator::device() const {
  return gpu_ ? gpu_->device() : -1;
}

int Communicator::gpuChannels() const {
  return gpu_ ? gpu_->channels() : 0;
}

int Communicator::gpuTunerChannels() const {
  // The channels a bulk call gets: the device's, or before it is set up the default for a
  // 132-SM H100/H200 (the largest power of two giving each rank its own SMs, at most 64). A
  // tuner made on that guess is made again once the device says otherwise.
  const int channels = gpu_ ? gpu_->channels() : config_.gpuChannels;
  return channels > 0 ? channels : algo::DeviceShape::autoChannels(132, size_);
}

Communicator::GpuModel Communicator::gpuTunerModel() const {
  algo::DeviceShape shape;
  shape.channels = gpuTunerChannels();
  shape.slotBytes = config_.gpuSlotBytes;
  shape.bytesPerChannel = kGpuBytesPerChannel;
  // The device's memory rates scale the constants, and the graph is made of the scaled ones
  // (the graphs' rates are scaled alike whether or not the ranks share the device).
  const bool fromFile = !config_.tuner.tuningFile.empty();
  const double peak = gpu_ ? gpu_->memoryPeakGBs() : 0;
  const algo::GpuGraph g = machine_.gpuGraph(
      shape, algo::gpuConstants(config_.tuner.constants, false, fromFile, peak).graphs);
  return GpuModel{g.graph,
                  algo::gpuConstants(config_.tuner.constants, g.sameDevice, fromFile, peak),
                  g.description, g.sameDevice};
}

Result<algo::Plan> Communicator::gpuPlanFor(Collective coll, std::size_t bytes) {
  // The GPU selector needs no device: it exists before the first GPU call, so a plan can be
  // asked for without setting up the GPU transport. One made on the guessed channels (and GPUs,
  // and the H200's memory) is made again once the device says otherwise.
  const int channels = gpuTunerChannels();
  const double memory = gpu_ ? gpu_->memoryPeakGBs() : 0;
  if (gpuSelector_ && (gpuTunerChannels_ != channels || gpuTunerMemoryGBs_ != memory)) {
    gpuSelector_.reset();
    gpuPlans_.clear();
    compressedPlans_.clear();
    tpPlans_.clear();
    attentionPlans_.clear();
  }
  if (!gpuSelector_) {
    gpuTunerChannels_ = channels;
    gpuTunerMemoryGBs_ = memory;
    const GpuModel model = gpuTunerModel();
    algo::TunerOptions options = config_.tuner;
    options.constants = model.constants;
    // The direct kernels' round: the device's, or before it is set up the most a round holds.
    const std::size_t round =
        gpu_ ? gpu_->oneShotLimit() : transport::CudaIpcGeometry::kDirectMaxBytes;
    gpuSelector_ = std::make_unique<algo::Selector>(
        algo::gpuSelectorOn(model.graph, model.sameDevice, options, machine_.placement.hosts() == 1,
                            round, config_.gpuDirect));
    // The memory rates show whether the device's peak was read (0: not yet, or none).
    if (rank_ == 0)
      WEFT_INFO(log::kInit | log::kGraph | log::kTuning,
                "GPU calls priced on %s; GEMMs read at most %.0f GB/s, kernels sharing the "
                "device copy %.0f GB/s (device peak %.0f GB/s)",
                model.description.c_str(), model.constants.gemm.memoryGBs,
                model.constants.graphs.deviceCopyGBs, memory);
  }
  const auto key = std::make_pair(static_cast<int>(coll), bytes);
  if (auto it = gpuPlans_.find(key); it != gpuPlans_.end()) return it->second;
  auto plan = gpuSelector_->plan(coll, bytes);
  if (!plan) return plan;
  // A plan asked for before the GPU is set up assumed the direct kernels' largest round; the
  // device's own may be smaller, so only plans made with it are kept.
  if (gpu_) gpuPlans_.emplace(key, *plan);
  if (rank_ == 0)
    WEFT_INFO(log::kTuning, "%s %zu bytes on GPU memory: %s", std::string(name(coll)).c_str(),
              bytes, plan->reason.c_str());
  return plan;
}

}  // namespace weft
