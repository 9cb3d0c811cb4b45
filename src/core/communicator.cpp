#include "src/core/communicator.hpp"
#include "src/core/log.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "algorithms/algorithm.hpp"
#include "src/core/arguments.hpp"
#include "src/core/sizes.hpp"
#include "src/exec/host_reduce.hpp"

namespace weft {

Communicator::~Communicator() {
  // A rank whose set-up failed (an error or an exception out of create) tells its peers through
  // the bootstrap, so they fail now rather than at their timeout.
  if (!created_ && bootstrap_) bootstrap_->abort();
  // Registered buffers are unmapped before the executor goes: no kernel may still read them.
  if (gpu_ && !registrations_.empty()) (void)gpu_->synchronize();
  children_.clear();  // fusedStates_ destroys them
}

Result<std::unique_ptr<Communicator>> Communicator::split(int color, int key,
                                                          const Config* config) {
  if (Status s = checkUsable("split"); !s) return s;
  struct Entry {
    std::int32_t color, key, rank;
    boot::UniqueId id;  // filled by each color's leader: the rendezvous of the new communicator
  };
  std::vector<Entry> all(static_cast<std::size_t>(size_));
  all[static_cast<std::size_t>(rank_)] = {color, key, rank_, {}};
  if (Status s = bootstrap_->allGather(all.data(), sizeof(Entry)); !s) return fail(s);
  std::vector<Entry> members;
  for (const Entry& e : all) {
    if (color >= 0 && e.color == color) members.push_back(e);
  }
  std::sort(members.begin(), members.end(), [](const Entry& a, const Entry& b) {
    return a.key != b.key ? a.key < b.key : a.rank < b.rank;
  });
  const bool leader = !members.empty() && members.front().rank == rank_;
  // The leaders open their rendezvous; a second exchange hands every member its leader's id.
  boot::BootstrapOptions options;
  options.timeoutSeconds = static_cast<double>(config_.timeout.count()) / 1000.0;
  options.ifname = config_.socketIfname;
  if (leader) {
    auto id = boot::createUniqueId(options);
    if (!id) return id.status();
    all[static_cast<std::size_t>(rank_)].id = *id;
  }
  if (Status s = bootstrap_->allGather(all.data(), sizeof(Entry)); !s) return fail(s);
  if (color < 0) return std::unique_ptr<Communicator>();
  int newRank = 0;
  while (members[static_cast<std::size_t>(newRank)].rank != rank_) ++newRank;
  const boot::UniqueId id = all[static_cast<std::size_t>(members.front().rank)].id;
  auto boot = boot::connectTcp(id, newRank, static_cast<int>(members.size()), options, false);
  if (!boot) return boot.status();
  return create(std::move(*boot), config != nullptr ? *config : config_);
}

std::string Communicator::summary() const {
  const bool ucx = ucx_ != nullptr;
  const bool shm = !connections_.empty();
  const std::string transports = ucx && shm ? "shm within a host, ucx between hosts"
                                 : ucx      ? "ucx transport"
                                            : "shm transport";
  std::string line = "rank " + std::to_string(rank_) + " of " + std::to_string(size_) +
                     ", host memory, " + transports + ", " + std::to_string(geometry_.channels) +
                     " channel(s), " + std::to_string(geometry_.slots) + " x " +
                     std::to_string(geometry_.slotBytes / 1024) + " KiB FIFO slots";
  const bool reads = std::find(iRead_.begin(), iRead_.end(), 1) != iRead_.end();
  if (reads && config_.singleCopyBytes > 0) {
    line += ", single copy from " + std::to_string(config_.singleCopyBytes / 1024) + " KiB";
  }
  const std::size_t directFrom =
      config_.hostDirectBytes.value_or(selector_->constants().hostDirectMinBytes);
  if (directPossible_ && directFrom > 0) {
    line += ", direct path from " + std::to_string(directFrom / 1024) + " KiB";
    if (!directThreads_)
      line += " through " + std::to_string(geometry_.stageBytes / 1024) + " KiB stages";
  } else if (directFewestCores_ > 0) {
    line += ", no direct path (a rank has " + std::to_string(directFewestCores_) +
            " core; WEFT_HOST_DIRECT=1 forces it)";
  }
  if (gpu_) line += "; GPU memory: " + gpu_->describe();
  return line;
}

void Communicator::abort(const std::string& why) {
  // Tell every rank: their waits watch their own inbox's flag, which ranks of this host set
  // directly; ranks on other hosts hear it through UCX's control worker.
  for (int q = 0; q < size_; ++q) {
    std::byte* inbox =
        q == rank_ ? inbox_.data() : peerInboxes_[static_cast<std::size_t>(q)].data();
    if (inbox != nullptr) transport::raiseAbort(inbox, why);
  }
  if (ucx_) ucx_->notifyAbort(why);
  if (bootstrap_) bootstrap_->abort();
  for (Communicator* c : children_) c->abort(why);
}

bool Communicator::aborted() const {
  return abortFlag_ != nullptr && abortFlag_->load(std::memory_order_acquire) != 0;
}

Status Communicator::checkUsable(const char* what) const {
  if (aborted()) {
    return {Code::invalidUsage, std::string(what) + ": the communicator was aborted (" +
                                    transport::controlOf(inbox_.data())->reason +
                                    "); destroy it and create a new one"};
  }
  return {};
}

Status Communicator::fail(Status s) {
  // A rank that saw a peer fail or time out stops the others instead of leaving them to time out.
  // Where this rank was itself stopped by an abort, the others hear that abort's reason, not
  // this wait's account of it (which nests it, and a reason holds 256 bytes).
  if (!s.isOk() && s.code() != Code::invalidArgument)
    abort(aborted() ? std::string(transport::controlOf(inbox_.data())->reason) : s.message());
  return s;
}

Result<algo::Plan> Communicator::planFor(Collective coll, std::size_t bytes) {
  const auto key = std::make_pair(static_cast<int>(coll), bytes);
  if (auto it = plans_.find(key); it != plans_.end()) return it->second;
  auto plan = selector_->plan(coll, bytes);
  if (plan && plan->kernel == algo::Kernel::hostDirect) plan->channels = geometry_.channels;
  if (plan) plans_.emplace(key, *plan);
  if (plan && rank_ == 0)
    WEFT_INFO(log::kTuning, "%s %zu bytes on host memory: %s", std::string(name(coll)).c_str(),
              bytes, plan->reason.c_str());
  return plan;
}

Result<const Communicator::Cached*> Communicator::scheduleFor(Collective coll,
                                                              const algo::Plan& plan, int root,
                                                              int maxChannels) {
  const auto key = std::make_tuple(static_cast<int>(coll), plan.algorithm, plan.channels,
                                   plan.aggregation, root, maxChannels);
  auto it = schedules_.find(key);
  if (it != schedules_.end()) return it->second.get();
  const algo::Algorithm* a = algo::findAlgorithm(plan.algorithm);
  if (a == nullptr) return internalError("the tuner picked an unknown algorithm " + plan.algorithm);
  algo::Params params;
  params.root = root;
  params.aggregation = plan.aggregation;
  params.groupSize = size_;
  params.channels = 1;
  auto built = a->build(coll, size_, params);
  if (!built) return built.status();
  // Every schedule channel needs its own connections. Some generators already make several (the
  // double binary tree: one per tree), so the plan's count is cut to what the FIFOs provide.
  const int base = static_cast<int>(built->channels.size());
  if (base > maxChannels) {
    return Status(Code::invalidUsage, plan.algorithm + " needs " + std::to_string(base) +
                                          " channels; WEFT_HOST_CHANNELS (WEFT_GPU_CHANNELS on "
                                          "GPU buffers) allows " +
                                          std::to_string(maxChannels));
  }
  const int channels = std::clamp(plan.channels, 1, maxChannels / base);
  if (channels > 1) {
    params.channels = channels;
    built = a->build(coll, size_, params);
    if (!built) return built.status();
  }
  auto cached = std::make_unique<Cached>();
  cached->maxBlocks = exec::maxStepBlocks(*built);
  cached->byReference = exec::referenceSteps(*built);
  if (ucx_) cached->direct = exec::directSteps(*built);
  cached->schedule = std::move(*built);
  const Cached* out = cached.get();
  schedules_.emplace(key, std::move(cached));
  return out;
}

Status Communicator::run(Collective coll, const void* input, void* output, std::size_t count,
                         DataType type, RedOp op, int root, void* stream) {
  if (Status s = checkUsable(std::string(name(coll)).c_str()); !s) return s;
  if (count == 0) return {};
  if (exec::isDevicePointer(input) || exec::isDevicePointer(output))
    return runGpu(coll, input, output, count, type, op, root, stream);
  if (stream != nullptr) {
    return Status(Code::invalidUsage, std::string(name(coll)) +
                                          ": a stream was given with host buffers (streams "
                                          "order calls on GPU buffers; pass NULL)");
  }
  const algo::Segments seg = algo::segments(coll, size_);
  const std::size_t bytes = std::size_t{seg.message()} * count * sizeOf(type);
  auto plan = planFor(coll, bytes);
  if (!plan) return plan.status();
  // What this call is, for the peers to compare before anything moves (WEFT_CHECK_CALLS); the
  // waits below compare it with theirs, and verifyCall once more at the end.
  if (config_.checkCalls) postCall(coll, count, type, op, root);
  struct EndCall {
    std::atomic<bool>& inCall;
    ~EndCall() { inCall.store(false, std::memory_order_release); }
  } endCall{inCall_};
  // Paths that read peers' buffers in place (the direct path, single copy) would read past a
  // peer's smaller buffer on a mismatched count: there every peer's call is compared first.
  const bool byReference = config_.singleCopyBytes > 0 && bytes >= config_.singleCopyBytes;
  const bool readsPeers = plan->kernel == algo::Kernel::hostDirect ||
                          (plan->kernel != algo::Kernel::slots && byReference);
  if (config_.checkCalls && readsPeers) {
    if (Status s = verifyCall(); !s) return s;
  }
  if (plan->kernel == algo::Kernel::slots || plan->kernel == algo::Kernel::hostDirect) {
    const bool slots = plan->kernel == algo::Kernel::slots;
    if (!slots && rank_ == 0) {
      WEFT_INFO(log::kColl, "%s %zu bytes: direct, up to %zu thread(s) (%s)",
                std::string(name(coll)).c_str(), bytes, directGroup_.threads, plan->reason.c_str());
    }
    const exec::DirectCall call{coll, input, output, count, type, op, root};
    Status s = slots ? exec::runSlots(call, slotsGroup_, slotsCalls_)
                     : exec::runDirect(call, directGroup_, directState_);
    if (!s) return fail(s);
  } else if (Status s = runSchedule(coll, *plan, input, output, count, type, op, root); !s) {
    return s;
  }
  if (config_.checkCalls && !readsPeers) {
    if (Status s = verifyCall(); !s) return s;
  }
  if (op == RedOp::avg && output != nullptr && (coll != Collective::reduce || rank_ == root)) {
    exec::divide(output, output, count, type, static_cast<std::uint64_t>(size_));
  }
  return {};
}

Status Communicator::runSchedule(Collective coll, const algo::Plan& plan, const void* input,
                                 void* output, std::size_t count, DataType type, RedOp op,
                                 int root) {
  const algo::Segments seg = algo::segments(coll, size_);
  const std::size_t bytes = std::size_t{seg.message()} * count * sizeOf(type);
  auto cached = scheduleFor(coll, plan, root, geometry_.channels);
  if (!cached) return cached.status();
  const algo::Schedule& s = (*cached)->schedule;
  const std::size_t message =
      std::min(geometry_.slotBytes, std::max<std::size_t>(plan.chunkBytes, 4096));
  const exec::Geometry g = exec::Geometry::of(s, count, type, (*cached)->maxBlocks, message);
  if (log::on(log::Level::info, log::kColl)) {
    if (rank_ == 0) {
      // What runs: the plan's channels as the FIFOs allow, slices as the slots allow.
      std::size_t named = 0, sending = 0;
      const algo::Program& p0 = s.program(0, 0);
      for (std::size_t i = 0; i < p0.steps().size(); ++i) {
        if (p0.sendPeers(p0.steps()[i]).empty()) continue;
        ++sending;
        named += (*cached)->byReference[0][0][i];
      }
      const bool single = config_.singleCopyBytes > 0 && bytes >= config_.singleCopyBytes;
      log::write(log::Level::info, log::kColl,
                 "%s %zu bytes: %s/%s, %zu channel(s), %zu-element slices, single copy %s (%s)",
                 std::string(name(coll)).c_str(), bytes, plan.algorithm.c_str(),
                 std::string(algo::name(plan.protocol)).c_str(), s.channels.size(), g.sliceElems,
                 single ? (std::to_string(named) + " of " + std::to_string(sending) +
                           " sending steps on rank 0")
                              .c_str()
                        : "off",
                 plan.reason.c_str());
    }
  }

  if (scratch_.size() < g.scratchElems * sizeOf(type))
    scratch_.resize(g.scratchElems * sizeOf(type));
  exec::Buffers b{input, output, scratch_.data(), count, type, op};
  b.inputBytes = std::size_t{seg.input} * count * sizeOf(type);
  b.outputBytes = std::size_t{seg.output} * count * sizeOf(type);
  b.singleCopy = config_.singleCopyBytes > 0 && bytes >= config_.singleCopyBytes;
  b.byReference = &(*cached)->byReference;
  if (ucx_) b.direct = &(*cached)->direct;
  std::vector<Status> results(s.channels.size());
  auto channel = [&](std::size_t ch) {
    results[ch] = exec::runChannel(s, ch, rank_, g, b, links_[ch], *waiter_);
    if (results[ch].isOk() && ucx_) results[ch] = ucx_->flush(static_cast<int>(ch), *waiter_);
    if (!results[ch].isOk()) (void)fail(results[ch]);
  };
  if (channelsInline_) {
    for (std::size_t ch = 0; ch < results.size() && (ch == 0 || results[ch - 1].isOk()); ++ch)
      channel(ch);
  } else {
    workers_->run(results.size(), channel);
  }
  for (const Status& r : results) {
    if (!r.isOk()) return r;
  }
  return {};
}

Result<algo::Plan> Communicator::planFor(Collective coll, std::size_t count, DataType type,
                                         bool gpu) {
  if (Status s = checkUsable("plan"); !s) return s;
  const std::size_t es = sizeOf(type);
  if (coll == Collective::allToAllv || coll == Collective::sendRecv) {
    if (gpu) {
      return Status(Code::unsupported,
                    std::string(name(coll)) + " on GPU buffers is not supported yet: no GPU plan");
    }
    return planFor(coll, count * es);
  }
  if (Status s = checkCount("plan", count, static_cast<std::size_t>(size_), type); !s) return s;
  const std::size_t message = algo::segments(coll, size_).message();
  return gpu ? gpuPlanFor(coll, message * count * es) : planFor(coll, message * count * es);
}

Communicator::HostCounters Communicator::hostCounters() const {
  HostCounters h;
  h.singleCopyBytes = readRate_ ? readRate_->bytesRead() : 0;
  h.readablePeers = static_cast<int>(std::count(iRead_.begin(), iRead_.end(), 1));
  h.directInPlaceCalls = directState_.inPlaceCalls;
  h.peerAllocationsMapped = directState_.peerAllocations->mappings();
  return h;
}

Status Communicator::allReduce(const void* send, void* recv, std::size_t count, DataType type,
                               RedOp op, void* stream) {
  if (Status s = check(Collective::allReduce, send, recv, count, type, 0); !s) return s;
  return run(Collective::allReduce, send, recv, count, type, op, 0, stream);
}

Status Communicator::allGather(const void* send, void* recv, std::size_t count, DataType type,
                               void* stream) {
  if (Status s = check(Collective::allGather, send, recv, count, type, 0); !s) return s;
  return run(Collective::allGather, send, recv, count, type, RedOp::sum, 0, stream);
}

Status Communicator::reduceScatter(const void* send, void* recv, std::size_t count, DataType type,
                                   RedOp op, void* stream) {
  if (Status s = check(Collective::reduceScatter, send, recv, count, type, 0); !s) return s;
  return run(Collective::reduceScatter, send, recv, count, type, op, 0, stream);
}

Status Communicator::broadcast(const void* send, void* recv, std::size_t count, DataType type,
                               int root, void* stream) {
  if (Status s = check(Collective::broadcast, send, recv, count, type, root); !s) return s;
  return run(Collective::broadcast, send, recv, count, type, RedOp::sum, root, stream);
}

Status Communicator::reduce(const void* send, void* recv, std::size_t count, DataType type,
                            RedOp op, int root, void* stream) {
  if (Status s = check(Collective::reduce, send, recv, count, type, root); !s) return s;
  return run(Collective::reduce, send, recv, count, type, op, root, stream);
}

Status Communicator::allToAll(const void* send, void* recv, std::size_t count, DataType type,
                              void* stream) {
  if (Status s = check(Collective::allToAll, send, recv, count, type, 0); !s) return s;
  return run(Collective::allToAll, send, recv, count, type, RedOp::sum, 0, stream);
}

Status Communicator::barrier() {
  // One byte all-reduced: every rank has entered before any leaves.
  std::uint8_t in = 0, out = 0;
  return run(Collective::allReduce, &in, &out, 1, DataType::u8, RedOp::max, 0, nullptr);
}

}  // namespace weft
