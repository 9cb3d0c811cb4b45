// What fused/ builds on: the communicator's compression default, the plans of compressed calls,
// workspaces, and its operations' order on the GPU.
#include <algorithm>

#include "src/core/communicator.hpp"
#include "src/core/log.hpp"
#include "src/transport/host_alloc.hpp"

namespace weft {

Result<algo::Plan> Communicator::compressedPlanFor(Collective coll, std::size_t bytes,
                                                   const algo::CodecShape& codec, bool always,
                                                   bool gpu) {
  if (Status s = checkUsable("plan"); !s) return s;
  const auto key =
      std::make_tuple(static_cast<int>(coll), bytes,
                      codec.name + ":" + std::to_string(codec.valueBytes), always, gpu);
  if (auto it = compressedPlans_.find(key); it != compressedPlans_.end()) return it->second;
  // The GPU selector is made (or made again on the device's channels) by a plain plan.
  if (gpu) {
    if (auto p = gpuPlanFor(coll, bytes); !p) return p;
  }
  const algo::Selector& selector = gpu ? *gpuSelector_ : *selector_;
  auto plan = selector.planCompressed(coll, bytes, codec, always);
  if (!plan) return plan;
  if (!gpu || gpu_) compressedPlans_.emplace(key, *plan);
  if (rank_ == 0)
    WEFT_INFO(log::kTuning, "%s %zu bytes on %s memory, compression %s allowed: %s",
              std::string(name(coll)).c_str(), bytes, gpu ? "GPU" : "host", codec.name.c_str(),
              plan->reason.c_str());
  return plan;
}

Result<std::byte*> Communicator::workspace(std::size_t bytes, bool gpu) {
  if (gpu) {
    if (Status s = ensureGpu(); !s) return s;
    return gpu_->workspace(bytes);
  }
  if (hostWorkspaceBytes_ < bytes || !hostWorkspace_) {
    const std::size_t size = std::max({bytes, 2 * hostWorkspaceBytes_, std::size_t{4096}});
    hostWorkspace_.reset();  // its memory goes before the larger one is made
    hostWorkspaceBytes_ = 0;
    auto p = transport::hostAlloc(size);
    if (!p) return p.status();
    hostWorkspace_.reset(static_cast<std::byte*>(*p),
                         [](std::byte* q) { (void)transport::hostFree(q); });
    hostWorkspaceBytes_ = size;
  }
  return hostWorkspace_.get();
}

void Communicator::parallel(std::size_t k, const std::function<void(std::size_t)>& fn) {
  const std::size_t m = std::min(k, hostThreads_);  // threads; each runs every m-th share
  if (m <= 1) {
    for (std::size_t i = 0; i < k; ++i) fn(i);
    return;
  }
  workers_->run(m, [&](std::size_t t) {
    for (std::size_t i = t; i < k; i += m) fn(i);
  });
}

Result<std::vector<const std::byte*>> Communicator::peerWorkspaces(std::size_t bytes) {
  if (Status s = checkUsable("peerWorkspaces"); !s) return s;
  auto ws = workspace(bytes, false);
  if (!ws) return ws.status();
  // Each rank's workspace as its peers name it: its address (threads of one process), its
  // allocation (other processes) and its size.
  struct Named {
    std::uint64_t address, id, offset, allocBytes, fd, bytes;
  };
  const auto n = static_cast<std::size_t>(size_), me = static_cast<std::size_t>(rank_);
  const transport::HostRef ref = transport::hostRefOf(*ws, hostWorkspaceBytes_);
  std::vector<Named> all(n);
  all[me] = {reinterpret_cast<std::uintptr_t>(*ws),
             ref.id,
             ref.offset,
             ref.allocBytes,
             static_cast<std::uint64_t>(static_cast<std::int64_t>(ref.fd)),
             hostWorkspaceBytes_};
  static_assert(sizeof(Named) == 6 * sizeof(std::uint64_t));
  transport::handOff(*ws);  // what this rank wrote there, to the peers that read it
  if (Status s = allGather(&all[me], all.data(), 6, DataType::u64); !s) return s;
  const auto* names = reinterpret_cast<const std::uint64_t*>(all.data());
  if (std::equal(peerNames_.begin(), peerNames_.end(), names, names + 6 * n)) {
    for (const std::byte* p : peerViews_) transport::takeOver(p);
    return peerViews_;
  }
  std::vector<const std::byte*> at(n, nullptr);
  bool mapped = workspacesShared_;
  if (!peerWorkspaces_) peerWorkspaces_ = std::make_unique<transport::PeerAllocations>();
  for (std::size_t q = 0; q < n && mapped; ++q) {
    if (q == me || directThreads_) {
      at[q] = reinterpret_cast<const std::byte*>(static_cast<std::uintptr_t>(all[q].address));
    } else {
      transport::HostRef r;
      r.id = all[q].id, r.offset = all[q].offset, r.allocBytes = all[q].allocBytes;
      r.fd = static_cast<std::int32_t>(static_cast<std::int64_t>(all[q].fd));
      at[q] = r.id == 0 ? nullptr : peerWorkspaces_->view(pids_[q], r, all[q].bytes);
    }
    mapped = at[q] != nullptr;
  }
  // Every rank takes the same way: through the mappings only where every rank could map.
  std::uint8_t mine = mapped ? 1 : 0, every = 0;
  if (Status s = allReduce(&mine, &every, 1, DataType::u8, RedOp::min); !s) return s;
  if (every == 0) at.clear();
  peerNames_.assign(names, names + 6 * n);
  peerViews_ = at;
  for (const std::byte* p : at) transport::takeOver(p);
  return at;
}

Status Communicator::doneWithPeerWorkspaces(const std::vector<const std::byte*>& peers) {
  for (const std::byte* p : peers) transport::handOff(p);  // this rank's reads, to their owners
  if (Status s = barrier(); !s) return s;
  if (!peers.empty()) transport::takeOver(peers[static_cast<std::size_t>(rank_)]);
  return {};
}

std::shared_ptr<void>& Communicator::fusedState(std::string_view name) {
  auto it = fusedStates_.find(name);
  if (it == fusedStates_.end()) it = fusedStates_.emplace(std::string(name), nullptr).first;
  return it->second;
}

Result<Communicator::PeerMemory> Communicator::mapPeerMemory(void* base) {
  if (Status s = ensureGpu(); !s) return s;
  if (machine_.placement.hosts() > 1) return PeerMemory{};
  auto peers = gpu_->mapRegistered(base, *bootstrap_);
  if (!peers) return fail(peers.status());
  PeerMemory m;
  m.at = gpu_->peerPointers(**peers);
  m.keep = *peers;
  m.deviceShared = gpu_->someDeviceShared();
  return m;
}

Result<algo::TpPlan> Communicator::tpPlanFor(const algo::TpShape& shape) {
  if (Status s = checkUsable("plan"); !s) return s;
  const auto key =
      std::make_tuple(static_cast<int>(shape.op), shape.m, shape.cols, shape.k, shape.valueBytes,
                      shape.cBytes(), shape.rowGrain, config_.tpChunks);
  if (auto it = tpPlans_.find(key); it != tpPlans_.end()) return it->second;
  // The collective of the whole block, to make the GPU selector on the device's channels.
  const std::size_t rows = shape.m / static_cast<std::size_t>(size());
  const bool ag = shape.op == algo::TpOp::allGatherGemm;
  const Collective coll = ag ? Collective::allGather : Collective::reduceScatter;
  if (auto p = gpuPlanFor(coll, rows * static_cast<std::size_t>(size()) *
                                    (ag ? shape.k : shape.cols) * shape.commBytes());
      !p)
    return p.status();
  auto plan = gpuSelector_->planTp(shape, config_.tpChunks);
  if (!plan) return plan;
  if (config_.tpChunks != 0) plan->reason += " by WEFT_TP_OVERLAP";
  if (gpu_) tpPlans_.emplace(key, *plan);  // as gpuPlanFor: kept once made on the device
  if (rank_ == 0)
    WEFT_INFO(log::kTuning, "%s %zux%zux%zu: %s", std::string(algo::name(shape.op)).c_str(),
              shape.m, shape.cols, shape.k, plan->reason.c_str());
  return plan;
}

Result<algo::MoePlan> Communicator::moePlanFor(const algo::MoeShape& shape,
                                               const algo::MoeTraffic& traffic) {
  if (Status s = checkUsable("plan"); !s) return s;
  auto plan = selector_->planMoe(shape, traffic, config_.moeHierarchical);
  if (plan && rank_ == 0 && traffic.rails &&
      moeLogged_.emplace(shape.tokens, shape.hidden, shape.topk, plan->hierarchical).second)
    WEFT_INFO(log::kTuning, "moe %zu tokens a rank, hidden %zu, top-%d: %s", shape.tokens,
              shape.hidden, shape.topk, plan->reason.c_str());
  return plan;
}

Result<algo::MoeGpuPlan> Communicator::moeGpuPlanFor(const algo::MoeShape& shape) {
  if (Status s = checkUsable("plan"); !s) return s;
  // An all-to-all of the rows, to make the GPU selector on the device's channels.
  if (auto p = gpuPlanFor(Collective::allToAll,
                          std::max<std::size_t>(shape.tokens * shape.dispatchBytes, 1));
      !p)
    return p.status();
  const algo::MoeTraffic traffic = algo::simulateRouting(shape, algo::Routing{});
  auto plan = gpuSelector_->planMoeGpu(shape, traffic, config_.moeLowLatency, config_.moeChannels,
                                       config_.moeTable);
  if (plan && rank_ == 0)
    WEFT_INFO(log::kTuning, "moe on GPU memory, %zu tokens a rank, hidden %zu, top-%d: %s",
              shape.tokens, shape.hidden, shape.topk, plan->reason.c_str());
  return plan;
}

Result<algo::AttentionPlan> Communicator::attentionPlanFor(const algo::AttentionShape& shape) {
  if (Status s = checkUsable("plan"); !s) return s;
  const auto key = std::make_tuple(shape.tokens, shape.heads, shape.kvHeads, shape.dim,
                                   shape.valueBytes, shape.causal, shape.backward, shape.cudnn);
  if (auto it = attentionPlans_.find(key); it != attentionPlans_.end()) return it->second;
  // A K/V block's hop, to make the GPU selector on the device's channels.
  if (auto p = gpuPlanFor(Collective::allGather,
                          std::max<std::size_t>(shape.tokens, 1) * 2 *
                              static_cast<std::size_t>(shape.kvHeads * shape.dim) *
                              shape.valueBytes * static_cast<std::size_t>(size()));
      !p)
    return p.status();
  auto plan = gpuSelector_->planAttention(shape, config_.cpAttention, config_.attentionKernel);
  if (!plan) return plan;
  if (config_.cpAttention) plan->reason += ", the way by WEFT_CP_ATTENTION";
  if (config_.attentionKernel) plan->reason += ", the kernel by WEFT_ATTENTION_KERNEL";
  if (gpu_) attentionPlans_.emplace(key, *plan);
  if (rank_ == 0)
    WEFT_INFO(log::kTuning, "context-parallel attention%s, %zu tokens a rank, %d heads: %s",
              shape.backward ? " backward" : "", shape.tokens, shape.heads, plan->reason.c_str());
  return plan;
}

Status Communicator::gpuOperation(void* stream, const std::function<Status()>& launches) {
  if (Status s = ensureGpu(); !s) return s;
  if (Status s = gpu_->begin(stream); !s) return fail(s);
  if (Status s = launches(); !s) return s;
  if (Status s = gpu_->end(stream); !s) return fail(s);
  return {};
}

}  // namespace weft
