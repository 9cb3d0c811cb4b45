// What fused/ builds on: the communicator's compression default, the plans of compressed calls,
// workspaces, and its operations' order on the GPU.
#include <algorithm>

#include "src/core/communicator.hpp"
#include "src/core/log.hpp"

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
  if (hostWorkspace_.size() < bytes)
    hostWorkspace_.resize(std::max(bytes, 2 * hostWorkspace_.size()));
  return hostWorkspace_.data();
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
