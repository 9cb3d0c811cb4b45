// dispatchGpu and combineGpu (gpu.hpp): the communicator's MoE state, set up for a shape at its
// first call outside a capture (every rank's buffer mapped by every other), and the calls'
// checks around the kernels of device.cu.
#include <cuda_runtime.h>

#include <array>
#include <string>
#include <vector>

#include "fused/cuda_steps.hpp"
#include "fused/moe/device.hpp"
#include "fused/moe/gpu.hpp"
#include "fused/tp/flags.hpp"
#include "src/exec/cuda_executor.hpp"

namespace weft::fused::moe {

// A communicator's buffers for one shape; older ones stay until the communicator goes
// (cudaFree waits for the whole device, where another rank's kernel may wait for this rank).
struct GpuState {
  MoeDevice dev;
  std::uint64_t generation = 0;
  bool pending = false;  // a dispatch sent and not combined yet
  DispatchCall call;     // the dispatch's buffers, for its receive
  std::array<std::size_t, 5> key{};
  std::vector<void*> memory;
  std::vector<std::shared_ptr<void>> mappings;
  ~GpuState() {
    mappings.clear();
    for (void* p : memory) (void)cudaFree(p);
  }
};

namespace {

Status refuse(const std::string& why) {
  return invalidArgument("moe dispatch: " + why);
}

Status onDevice(const void* p, const char* role, bool optional = false) {
  if (p == nullptr && optional) return {};
  if (p == nullptr || !exec::isDevicePointer(p))
    return refuse(std::string(role) + " must be GPU memory, as x is");
  return {};
}

bool aligned16(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
}

// The state for `shape`: made (collectively, outside a capture) where the communicator has none
// of this shape.
Result<GpuState*> stateFor(Communicator& comm, const algo::MoeShape& shape, DataType type, bool fp8,
                           std::size_t capacity, cudaStream_t stream) {
  std::shared_ptr<void>& slot = comm.fusedState("moe");
  if (!slot) slot = std::make_shared<GpuState>();
  auto* st = static_cast<GpuState*>(slot.get());
  const std::array<std::size_t, 5> key{shape.tokens, shape.hidden * sizeOf(type),
                                       static_cast<std::size_t>(shape.topk),
                                       static_cast<std::size_t>(shape.experts), fp8 ? 1u : 0u};
  if (st->generation > 0 && st->key == key) {
    st->dev.capacity = capacity, st->dev.type = type, st->dev.hidden = shape.hidden;
    return st;
  }
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaError_t e = cudaStreamIsCapturing(stream, &capture); e != cudaSuccess)
    return cudaStatus("moe: capture status", e);
  if (capture != cudaStreamCaptureStatusNone)
    return Status(Code::invalidUsage,
                  "moe dispatch: a shape's first call sets up buffers the ranks share: make one "
                  "call of the shape before capturing it");
  // Every rank the same tokens: each source's rows at a rank are held for that many.
  const auto n = static_cast<std::size_t>(comm.size());
  std::vector<std::uint64_t> tokens(n);
  const std::uint64_t mine = shape.tokens;
  if (Status s = comm.allGather(&mine, tokens.data(), 1, DataType::u64); !s) return s;
  for (std::size_t r = 0; r < n; ++r)
    if (tokens[r] != mine)
      return refuse("on GPU memory every rank dispatches the same number of tokens (rank " +
                    std::to_string(r) + " has " + std::to_string(tokens[r]) + ", rank " +
                    std::to_string(comm.rank()) + " " + std::to_string(mine) + ")");
  if (cudaError_t e = cudaStreamSynchronize(stream); e != cudaSuccess)
    return cudaStatus("moe: sync", e);
  MoeDevice d;
  d.n = comm.size(), d.me = comm.rank(), d.k = shape.topk, d.L = shape.localExperts();
  d.experts = shape.experts, d.tokens = static_cast<int>(shape.tokens);
  d.hidden = shape.hidden, d.rowBytes = shape.hidden * sizeOf(type), d.capacity = capacity;
  d.type = type;
  d.fp8 = fp8, d.codec = dispatchCodec();
  d.sentBytes =
      fp8 ? fp8::Segments::of(d.codec, 1, shape.hidden, shape.hidden).segmentBytes : d.rowBytes;
  algo::MoeShape priced = shape;
  priced.dispatchBytes = d.sentBytes, priced.combineBytes = d.rowBytes;
  auto plan = comm.moeGpuPlanFor(priced);
  if (!plan) return plan.status();
  d.lowLatency = plan->lowLatency, d.table = plan->table, d.channels = plan->channels;
  d.timeoutNs = static_cast<std::uint64_t>(comm.config().timeout.count()) * 1000000ULL;
  const std::size_t bytes = layoutShared(d);
  void* shared = nullptr;
  if (cudaError_t e = cudaMalloc(&shared, bytes); e != cudaSuccess)
    return cudaStatus("moe: allocating the " + std::to_string(bytes >> 20) + " MiB shared buffer",
                      e);
  st->memory.push_back(shared);
  const std::size_t T = shape.tokens, k = static_cast<std::size_t>(shape.topk);
  const auto L = static_cast<std::size_t>(shape.localExperts());
  const std::size_t chunks = std::max<std::size_t>(1, (T + 255) / 256);
  const std::size_t layoutBytes =
      (4 * (T * n + n + n * T * k + n + 1 + n * L + n * chunks * (1 + L)) + 64 + 255) / 256 * 256;
  const std::size_t localBytes = layoutBytes + (fp8 ? T * d.sentBytes : 0);
  void* local = nullptr;
  if (cudaError_t e = cudaMalloc(&local, localBytes); e != cudaSuccess)
    return cudaStatus("moe: allocating the layout", e);
  st->memory.push_back(local);
  cudaError_t e = cudaMemset(shared, 0, kFlagsBytes);
  if (e == cudaSuccess) e = cudaMemset(local, 0, localBytes);
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (e != cudaSuccess) return cudaStatus("moe: clearing the buffers", e);
  auto* words = static_cast<std::byte*>(local);
  d.epoch = reinterpret_cast<std::uint64_t*>(words);
  d.status = reinterpret_cast<unsigned long long*>(words + 8);
  d.slotOf = reinterpret_cast<std::int32_t*>(words + 64);
  d.sendCount = d.slotOf + T * n;
  d.rowPos = d.sendCount + n;
  d.arrived = reinterpret_cast<unsigned*>(d.rowPos + n * T * k);
  d.sentRows = reinterpret_cast<std::int32_t*>(d.arrived + n + 1);
  d.chunkRows = d.sentRows + n * L;
  if (fp8) d.encoded = words + layoutBytes;
  auto peers = comm.mapPeerMemory(shared);
  if (!peers) return peers.status();
  if (peers->at.empty() || n > static_cast<std::size_t>(kGpuMaxRanks))
    return Status(Code::unsupported,
                  "moe dispatch on GPU memory: the ranks must map each other's memory (one host, "
                  "at most " +
                      std::to_string(kGpuMaxRanks) + " ranks)");
  for (std::size_t r = 0; r < n; ++r) d.peers[r] = peers->at[r];
  st->mappings.push_back(std::move(peers->keep));
  if (Status s = loadMoeKernels(); !s) return s;
  if (Status s = comm.barrier(); !s) return s;
  st->dev = d;
  st->key = key;
  ++st->generation;
  st->pending = false;
  return st;
}

// The ranks' status words summed: every rank's error alike.
Status reportStatus(Communicator& comm, GpuState& st, cudaStream_t stream, const DispatchCall& call,
                    std::size_t& rows) {
  if (cudaError_t e = cudaStreamSynchronize(stream); e != cudaSuccess)
    return cudaStatus("moe dispatch", e);
  std::uint64_t status[3] = {};
  std::vector<std::int32_t> counts(static_cast<std::size_t>(st.dev.L));
  cudaError_t e = cudaMemcpy(status, st.dev.status, sizeof status, cudaMemcpyDeviceToHost);
  if (e == cudaSuccess)
    e = cudaMemcpy(counts.data(), call.expertCounts, counts.size() * 4, cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) return cudaStatus("moe dispatch: reading its status", e);
  std::uint64_t all[3] = {};
  if (Status s = comm.allReduce(status, all, 3, DataType::u64, RedOp::sum); !s) return s;
  rows = 0;
  for (std::int32_t c : counts) rows += static_cast<std::size_t>(c);
  if (all[0] > 0)
    return refuse(std::to_string(all[0]) + " expert index(es) out of range (-1 or 0 … " +
                  std::to_string(st.dev.experts - 1) + "); their slots were dropped");
  if (all[1] > 0) return refuse(std::to_string(all[1]) + " token(s) list an expert twice");
  if (all[2] > 0)
    return refuse(std::to_string(all[2]) + " row(s) over the ranks' capacity were dropped");
  return {};
}

}  // namespace

Result<GpuLayout> dispatchGpuSend(Communicator& comm, const algo::MoeShape& shape,
                                  const DispatchCall& call, void* stream) {
  if (Status s = algo::checkMoeShape(shape); !s) return s;
  for (auto [p, role] : {std::pair<const void*, const char*>{call.x, "x"},
                         {call.topkIdx, "topk_idx"},
                         {call.topkWeights, "topk_weights"},
                         {call.recvX, "recv_x"},
                         {call.expertCounts, "expert_counts"}}) {
    if (shape.tokens == 0 && (p == call.x || p == call.topkIdx || p == call.topkWeights)) continue;
    if (Status s = onDevice(p, role); !s) return s;
  }
  if (Status s = onDevice(call.recvSource, "recv_source", true); !s) return s;
  if (call.fp8) {
    if (Status s = onDevice(call.recvScales, "recv_scales", call.capacity == 0); !s) return s;
    if (shape.hidden % 128 != 0)
      return refuse("fp8 dispatch on GPU memory takes whole blocks of 128 values (hidden " +
                    std::to_string(shape.hidden) + ")");
  }
  const std::size_t rowBytes = shape.hidden * sizeOf(call.type);
  if (rowBytes % 16 != 0 || !aligned16(call.x) || !aligned16(call.recvX))
    return refuse(
        "on GPU memory a row's bytes (hidden × the value's size) and x and recv_x "
        "must be multiples of 16 bytes");
  if (call.type != DataType::bf16 && call.type != DataType::f16 && call.type != DataType::f32)
    return refuse("bf16, f16 or f32 values");
  const auto s = static_cast<cudaStream_t>(stream);
  auto st = stateFor(comm, shape, call.type, call.fp8, call.capacity, s);
  if (!st) return st.status();
  GpuState& state = **st;
  if (state.pending)
    return Status(Code::invalidUsage,
                  "moe dispatch: the previous dispatch on this communicator was not combined "
                  "(combine it, or destroy its handle, first)");
  Status run = comm.gpuOperation(stream, [&]() -> Status {
    if (Status c = tp::countCall(state.dev.epoch, stream); !c) return c;
    return launchDispatchSend(state.dev, call.x, call.topkIdx, call.topkWeights, stream);
  });
  if (!run) return run;
  state.pending = true;
  state.call = call;
  return GpuLayout{std::static_pointer_cast<GpuState>(comm.fusedState("moe")), state.generation, 0};
}

namespace {

// The layout's state while its dispatch is the communicator's pending one; else why not. The
// halves' order within a call is the caller's (the C API's handle keeps it).
Result<GpuState*> expect(const GpuLayout& layout, const char* what) {
  GpuState* st = layout.state.lock().get();  // the handle's communicator holds it
  if (st == nullptr || st->generation != layout.generation || !st->pending)
    return invalidArgument(std::string(what) +
                           ": the handle's dispatch is not the communicator's last (each "
                           "dispatch is combined before the next)");
  return st;
}

Status deviceBuffer(const void* p, const char* what, const char* role) {
  if (p == nullptr || !exec::isDevicePointer(p) || !aligned16(p))
    return invalidArgument(std::string(what) + ": " + role +
                           " must be GPU memory, 16-byte aligned");
  return {};
}

}  // namespace

Status dispatchGpuRecv(Communicator& comm, GpuLayout& layout, void* stream) {
  auto st = expect(layout, "moe dispatch (receive)");
  if (!st) return st.status();
  GpuState& state = **st;
  const DispatchCall& call = state.call;
  const auto s = static_cast<cudaStream_t>(stream);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaError_t e = cudaStreamIsCapturing(s, &capture); e != cudaSuccess)
    return cudaStatus("moe: capture status", e);
  Status run = comm.gpuOperation(stream, [&] {
    return launchDispatchRecv(state.dev, call.recvX, call.expertCounts, call.recvSource,
                              call.recvScales, stream);
  });
  if (!run) return run;
  if (capture == cudaStreamCaptureStatusNone) {
    if (Status r = reportStatus(comm, state, s, call, layout.rows); !r) {
      // Every rank stops here alike: the dispatch's peers may already hold its rows, so its
      // combine would still be owed; it is forgotten instead.
      state.pending = false;
      return r;
    }
  }
  return {};
}

Status combineGpuSend(Communicator& comm, const GpuLayout& layout, const void* expertOut,
                      void* stream) {
  auto st = expect(layout, "moe combine");
  if (!st) return st.status();
  if (Status b = deviceBuffer(expertOut, "moe combine", "expert_out"); !b) return b;
  GpuState& state = **st;
  return comm.gpuOperation(stream, [&] { return launchCombineSend(state.dev, expertOut, stream); });
}

Status combineGpuRecv(Communicator& comm, const GpuLayout& layout, void* out, void* stream) {
  auto st = expect(layout, "moe combine (receive)");
  if (!st) return st.status();
  if (Status b = deviceBuffer(out, "moe combine", "out"); !b) return b;
  GpuState& state = **st;
  Status run = comm.gpuOperation(stream, [&] { return launchCombineRecv(state.dev, out, stream); });
  if (run) state.pending = false;
  return run;
}

void forgetGpu(const GpuLayout& layout) {
  if (const auto st = layout.state.lock(); st && st->generation == layout.generation)
    st->pending = false;
}

}  // namespace weft::fused::moe
