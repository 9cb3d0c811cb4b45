#include "src/exec/launch_order.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <string>

namespace weft::exec {
namespace {

Status cudaFailed(const std::string& what, cudaError_t err) {
  (void)cudaGetLastError();
  return {Code::systemError,
          "ordering the communicator's operations: " + what + ": " + cudaGetErrorString(err)};
}

// A capture sequence's state as the stream sees it: its status, id, graph and the nodes the next
// captured node will depend on (edge data asked for too, or a programmatic edge makes the query
// fail as lossy).
struct CaptureInfo {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  cudaGraph_t graph = nullptr;
  const cudaGraphNode_t* deps = nullptr;
  std::size_t ndeps = 0;
};

cudaError_t captureInfo(cudaStream_t s, CaptureInfo& c) {
  const cudaGraphEdgeData* edges = nullptr;
#if CUDART_VERSION >= 13000
  return cudaStreamGetCaptureInfo(s, &c.status, &c.id, &c.graph, &c.deps, &edges, &c.ndeps);
#else
  return cudaStreamGetCaptureInfo_v3(s, &c.status, &c.id, &c.graph, &c.deps, &edges, &c.ndeps);
#endif
}

cudaError_t addDependencies(cudaStream_t s, std::vector<void*>& nodes) {
  auto* n = reinterpret_cast<cudaGraphNode_t*>(nodes.data());
#if CUDART_VERSION >= 13000
  return cudaStreamUpdateCaptureDependencies(s, n, nullptr, nodes.size(),
                                             cudaStreamAddCaptureDependencies);
#else
  return cudaStreamUpdateCaptureDependencies_v2(s, n, nullptr, nodes.size(),
                                                cudaStreamAddCaptureDependencies);
#endif
}

// Edges from each of `from` to `to` (the same node each time), added or removed.
cudaError_t edges(cudaGraph_t g, const std::vector<void*>& from, void* to, bool add) {
  const std::vector<cudaGraphNode_t> tos(from.size(), static_cast<cudaGraphNode_t>(to));
  const auto* f = reinterpret_cast<const cudaGraphNode_t*>(from.data());
#if CUDART_VERSION >= 13000
  return add ? cudaGraphAddDependencies(g, f, tos.data(), nullptr, from.size())
             : cudaGraphRemoveDependencies(g, f, tos.data(), nullptr, from.size());
#else
  return add ? cudaGraphAddDependencies_v2(g, f, tos.data(), nullptr, from.size())
             : cudaGraphRemoveDependencies_v2(g, f, tos.data(), nullptr, from.size());
#endif
}

// Captures kept at most: one per graph being captured with this communicator at once; older
// ones have ended (their ids never come back).
constexpr std::size_t kCaptures = 8;

}  // namespace

Result<std::unique_ptr<LaunchOrder>> LaunchOrder::create(bool mixing) {
  std::unique_ptr<LaunchOrder> o(new LaunchOrder());
  o->mixing_ = mixing;
  cudaEvent_t ev = nullptr;
  if (cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming); e != cudaSuccess)
    return cudaFailed("creating the completion event", e);
  o->done_ = ev;
  return o;
}

LaunchOrder::~LaunchOrder() {
  (void)synchronize();
  if (done_ != nullptr) (void)cudaEventDestroy(static_cast<cudaEvent_t>(done_));
  (void)cudaGetLastError();
}

Status LaunchOrder::begin(void* stream) {
  auto* s = static_cast<cudaStream_t>(stream);
  auto* done = static_cast<cudaEvent_t>(done_);
  CaptureInfo c;
  waited_ = false;
  if (cudaError_t e = captureInfo(s, c); e != cudaSuccess)
    return cudaFailed("asking whether the stream is being captured", e);
  if (c.status == cudaStreamCaptureStatusNone) {
    // By id, not handle: a destroyed stream's handle may come back as another stream's.
    unsigned long long id = 0;
    if (cudaError_t e = cudaStreamGetId(s, &id); e != cudaSuccess)
      return cudaFailed("reading the stream's id", e);
    // Same stream: its order suffices, unless a replayed graph recorded done_ since.
    if (everCaptured_ || (issued_ && id != stream_)) {
      if (cudaError_t e = cudaStreamWaitEvent(s, done, 0); e != cudaSuccess)
        return cudaFailed("waiting for the previous operation", e);
      waited_ = true;
    }
    stream_ = id;
    return {};
  }
  if (c.status != cudaStreamCaptureStatusActive)
    return {Code::invalidUsage, "the stream's graph capture was invalidated (an earlier error)"};
  everCaptured_ = mixing_;
  auto [at, fresh] = captures_.try_emplace(c.id);
  Capture& cap = at->second;
  cap.used = ++operations_;
  if (fresh && mixing_) {
    // At every replay, after whatever operation was issued before the graph's launch.
    if (cudaError_t e = cudaStreamWaitEvent(s, done, cudaEventWaitExternal); e != cudaSuccess)
      return cudaFailed("making the capture wait for the previous operation", e);
    waited_ = true;
  } else if (cap.stream != stream && !cap.tail.empty()) {
    // After the capture's previous operation, captured on another stream.
    if (cudaError_t e = addDependencies(s, cap.tail); e != cudaSuccess)
      return cudaFailed("making this stream's capture follow the previous operation", e);
    waited_ = true;
  }
  cap.stream = stream;  // streams live while they are captured: their handles identify them
  if (captures_.size() > kCaptures) {
    auto oldest = std::min_element(captures_.begin(), captures_.end(),
                                   [](auto& a, auto& b) { return a.second.used < b.second.used; });
    captures_.erase(oldest);
  }
  return {};
}

Status LaunchOrder::end(void* stream) {
  auto* s = static_cast<cudaStream_t>(stream);
  auto* done = static_cast<cudaEvent_t>(done_);
  CaptureInfo c;
  if (cudaError_t e = captureInfo(s, c); e != cudaSuccess)
    return cudaFailed("asking whether the stream is being captured", e);
  if (c.status == cudaStreamCaptureStatusNone) {
    if (cudaError_t e = cudaEventRecord(done, s); e != cudaSuccess)
      return cudaFailed("recording the operation's completion", e);
    issued_ = pending_ = true;
    return {};
  }
  auto it = captures_.find(c.id);
  if (c.status != cudaStreamCaptureStatusActive || it == captures_.end())
    return {Code::invalidUsage, "the stream's graph capture ended inside a weft call"};
  Capture& cap = it->second;
  std::vector<void*> tail(c.deps, c.deps + c.ndeps);
  // One record node per capture, moved after the newest operation: the event a later
  // operation waits on then covers every operation of the graph.
  if (!mixing_) {
    // No record node: nothing outside the graph waits for it.
  } else if (cap.record == nullptr) {
    cudaGraphNode_t node = nullptr;
    if (cudaError_t e = cudaGraphAddEventRecordNode(&node, c.graph, c.deps, c.ndeps, done);
        e != cudaSuccess)
      return cudaFailed("adding the capture's completion record", e);
    cap.record = node;
  } else if (tail != cap.tail) {
    if (cudaError_t e = edges(c.graph, cap.tail, cap.record, false); e != cudaSuccess)
      return cudaFailed("moving the capture's completion record", e);
    if (cudaError_t e = edges(c.graph, tail, cap.record, true); e != cudaSuccess)
      return cudaFailed("moving the capture's completion record", e);
  }
  cap.tail = std::move(tail);
  return {};
}

Status LaunchOrder::synchronize() {
  if (!pending_) return {};
  pending_ = false;
  if (cudaError_t e = cudaEventSynchronize(static_cast<cudaEvent_t>(done_)); e != cudaSuccess)
    return cudaFailed("waiting for the communicator's kernels", e);
  return {};
}

}  // namespace weft::exec
