#include "src/exec/cuda_executor.hpp"

#include <cuda_runtime.h>
#include <link.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <map>
#include <span>
#include <vector>

#include "algorithms/rank_graph.hpp"
#include "src/core/log.hpp"
#include "src/core/sizes.hpp"
#include "src/device/schedule_kernel.hpp"
#include "src/transport/cuda_ipc.hpp"

namespace weft::exec {
namespace {

Status cudaFailed(const std::string& what, cudaError_t err) {
  return {Code::systemError, what + ": " + cudaGetErrorString(err)};
}

// What the executor allocates and copies for itself (the transport at the first call, a
// schedule's first upload, more scratch) while the caller's stream may be capturing a graph:
// this thread in relaxed capture mode meanwhile, as NCCL's own allocations, since a capture
// refuses cudaMalloc and synchronous copies otherwise. None of it is part of the graph.
class RelaxedCapture {
 public:
  RelaxedCapture() { (void)cudaThreadExchangeStreamCaptureMode(&mode_); }
  ~RelaxedCapture() { (void)cudaThreadExchangeStreamCaptureMode(&mode_); }
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

}  // namespace

bool CudaExecutor::capturing(void* stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &status) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return status != cudaStreamCaptureStatusNone;
}

bool cudaBuilt() {
  return true;
}

namespace {

// Whether libcuda is in this process, asked on every call with host buffers, so it must be
// cheap: dlopen(RTLD_NOLOAD) of a library that is absent searches the disk (~17 us here).
// dl_iterate_phdr reports how many objects were ever loaded (dlpi_adds): while that count is
// the one last scanned without finding the driver, nothing has changed (~12 ns).
struct DriverScan {
  unsigned long long adds = 0;
  bool first = true, unchanged = false, found = false;
};
std::atomic<unsigned long long> scannedAdds{~0ull};

int scanObject(dl_phdr_info* info, std::size_t size, void* data) {
  auto* scan = static_cast<DriverScan*>(data);
  if (scan->first) {
    scan->first = false;
    scan->adds = size >= offsetof(dl_phdr_info, dlpi_subs) ? info->dlpi_adds : 0;
    if (scan->adds != 0 && scan->adds == scannedAdds.load(std::memory_order_relaxed)) {
      scan->unchanged = true;
      return 1;
    }
  }
  if (info->dlpi_name != nullptr && std::strstr(info->dlpi_name, "libcuda.so") != nullptr) {
    scan->found = true;
    return 1;
  }
  return 0;
}

bool driverLoaded() {
  static std::atomic<bool> loaded{false};
  if (loaded.load(std::memory_order_relaxed)) return true;
  DriverScan scan;
  dl_iterate_phdr(scanObject, &scan);
  if (scan.found) {
    loaded.store(true, std::memory_order_relaxed);
  } else if (!scan.unchanged) {
    scannedAdds.store(scan.adds, std::memory_order_relaxed);
  }
  return scan.found;
}

// The channels of a call: as configured, or (0) the largest power of two that gives every rank
// sharing a device its own SMs, at most 64. Measured on one H200 (docs/perf.md), 256 MB
// all-reduce under MPS: 2 ranks 174 -> 364 GB/s busbw (ring) from 16 to 64 channels; 4 ranks
// 134 -> 188 GB/s from 16 to 32. (4 ranks at 24 and 33 channels ran at 55-88 GB/s: their pieces
// were cut off 16-byte boundaries, which the geometry now avoids.) Collective over the
// bootstrap; every rank reaches the same count, and ranks configured differently (their FIFOs
// would not line up) are refused. Also the slowest of the ranks' devices' peak memory rates
// (GB/s; 0 where one does not say), what their GEMMs are priced on, alike on every rank.
struct DeviceCount {
  int channels = 1;
  double memoryPeakGBs = 0;
};
Result<DeviceCount> channelsFor(const GpuOptions& o, boot::Bootstrap& bootstrap) {
  struct Record {
    char bus[32];
    std::int32_t sms;
    std::int32_t channels;
    std::uint64_t slotBytes;
    double memoryPeakGBs;
  };
  std::vector<Record> all(static_cast<std::size_t>(bootstrap.size()));
  Record& self = all[static_cast<std::size_t>(bootstrap.rank())];
  std::memset(&self, 0, sizeof self);
  self.channels = o.channels;
  self.slotBytes = o.slotBytes;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetPCIBusId(self.bus, sizeof self.bus, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&self.sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    (void)cudaGetLastError();
    self.sms = 0;  // the transport's set-up then says what is wrong
  }
  int kiloHertz = 0, bits = 0;  // HBM moves data on both clock edges
  if (cudaDeviceGetAttribute(&kiloHertz, cudaDevAttrMemoryClockRate, device) == cudaSuccess &&
      cudaDeviceGetAttribute(&bits, cudaDevAttrGlobalMemoryBusWidth, device) == cudaSuccess)
    self.memoryPeakGBs = 2.0 * kiloHertz * 1e3 * bits / 8 / 1e9;
  (void)cudaGetLastError();
  if (Status s = bootstrap.allGather(all.data(), sizeof(Record)); !s) return s;
  for (std::size_t q = 0; q < all.size(); ++q) {
    if (all[q].channels != self.channels || all[q].slotBytes != self.slotBytes) {
      return Status(Code::invalidUsage,
                    "rank " + std::to_string(bootstrap.rank()) + " and rank " + std::to_string(q) +
                        " differ in WEFT_GPU_CHANNELS or WEFT_GPU_SLOT_BYTES; set them alike on "
                        "every rank");
    }
  }
  DeviceCount count;
  count.memoryPeakGBs = self.memoryPeakGBs;
  for (const Record& r : all) count.memoryPeakGBs = std::min(count.memoryPeakGBs, r.memoryPeakGBs);
  if (o.channels > 0) {
    count.channels = o.channels;
    return count;
  }
  count.channels = algo::DeviceShape::kMaxAutoChannels;
  for (const Record& r : all) {
    int sharing = 0;
    for (const Record& q : all) sharing += std::strncmp(q.bus, r.bus, sizeof r.bus) == 0 ? 1 : 0;
    count.channels = std::min(count.channels, algo::DeviceShape::autoChannels(r.sms, sharing));
  }
  return count;
}

}  // namespace

bool isDevicePointer(const void* p) {
  // Without the driver in the process there is no device memory, and asking the runtime would
  // initialize CUDA (which a later fork could not use).
  if (p == nullptr || !driverLoaded()) return false;
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
}

int currentDevice() {
  int device = -1;
  if (!driverLoaded()) return -1;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return device;
}

void useDevice(int device) {
  if (device < 0) return;
  if (cudaSetDevice(device) != cudaSuccess) (void)cudaGetLastError();
}

std::string busIdOf(int device) {
  char id[32] = {};
  if (device < 0 || cudaDeviceGetPCIBusId(id, sizeof id, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return {};
  }
  std::string s = id;
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

Result<std::unique_ptr<CudaExecutor>> CudaExecutor::create(const GpuOptions& o,
                                                           boot::Bootstrap& bootstrap) {
  const RelaxedCapture relaxed;
  std::unique_ptr<CudaExecutor> x(new CudaExecutor());
  x->options_ = o;
  x->nranks_ = bootstrap.size();
  x->rank_ = bootstrap.rank();
  const int n = x->nranks_;
  auto channels = channelsFor(o, bootstrap);
  if (!channels) return channels.status();
  const int C = channels->channels;
  x->memoryPeakGBs_ = channels->memoryPeakGBs;
  transport::CudaIpcGeometry g;
  g.nranks = n;
  g.rank = x->rank_;
  g.channels = C;
  g.slots = o.slots;
  g.slotBytes = o.slotBytes;
  g.llPayload = o.llPayload;
  // Unknown occupancy (no device) fails in the transport's set-up, which says why.
  if (auto resident = device::residentBlocks(n)) g.residentBlocks = *resident;
  auto ipc = transport::CudaIpcTransport::create(g, bootstrap);
  if (!ipc) return ipc.status();
  x->ipc_ = std::move(*ipc);
  x->channels_ = std::min(C, x->ipc_->residentChannels());
  if (Status s = device::preload(); !s) return s;

  if (cudaError_t e = cudaHostAlloc(&x->error_, sizeof(device::KernelError),
                                    cudaHostAllocMapped | cudaHostAllocPortable);
      e != cudaSuccess)
    return cudaFailed("allocating the kernels' error record", e);
  std::memset(x->error_, 0, sizeof(device::KernelError));
  if (cudaError_t e = cudaHostGetDevicePointer(&x->errorDevice_, x->error_, 0); e != cudaSuccess)
    return cudaFailed("mapping the kernels' error record", e);
  if (o.controlPage != nullptr && o.hostAbort != nullptr) {
    // Without the mapping, kernels still stop on a peer kernel's abort and on their timeout.
    if (cudaHostRegister(o.controlPage, o.controlBytes,
                         cudaHostRegisterMapped | cudaHostRegisterPortable) == cudaSuccess) {
      x->registered_ = true;
      void* d = nullptr;
      if (cudaHostGetDevicePointer(&d, const_cast<std::int32_t*>(o.hostAbort), 0) == cudaSuccess)
        x->hostAbortDevice_ = static_cast<const std::int32_t*>(d);
    }
    (void)cudaGetLastError();
  }

  std::vector<device::Endpoint> eps(2 * static_cast<std::size_t>(C) * n);
  for (int ch = 0; ch < C; ++ch) {
    for (int q = 0; q < n; ++q) {
      const std::size_t i = static_cast<std::size_t>(ch) * n + static_cast<std::size_t>(q);
      eps[i] = x->ipc_->to(ch, q);
      eps[static_cast<std::size_t>(C) * n + i] = x->ipc_->from(ch, q);
    }
  }
  std::vector<std::uint32_t*> aborts(static_cast<std::size_t>(n));
  // Its own word first in what the kernel checks most: aborts[rank].
  for (int q = 0; q < n; ++q) aborts[static_cast<std::size_t>(q)] = x->ipc_->abortWord(q);
  // Then every rank's one-shot flags, slabs and ll inboxes.
  std::vector<void*> direct(3 * static_cast<std::size_t>(n));
  for (int q = 0; q < n; ++q) {
    direct[static_cast<std::size_t>(q)] = x->ipc_->directFlags(q);
    direct[static_cast<std::size_t>(n + q)] = x->ipc_->directSlabs(q);
    direct[static_cast<std::size_t>(2 * n + q)] = x->ipc_->directLl(q);
  }
  const std::size_t epBytes = eps.size() * sizeof(device::Endpoint);
  const std::size_t abortBytes = aborts.size() * sizeof(std::uint32_t*);
  const std::size_t bytes = epBytes + abortBytes + direct.size() * sizeof(void*);
  if (cudaError_t e = cudaMalloc(&x->endpoints_, bytes); e != cudaSuccess)
    return cudaFailed("allocating the endpoint table", e);
  std::vector<std::byte> table(bytes);
  std::memcpy(table.data(), eps.data(), epBytes);
  std::memcpy(table.data() + epBytes, aborts.data(), abortBytes);
  std::memcpy(table.data() + epBytes + abortBytes, direct.data(), direct.size() * sizeof(void*));
  if (Status s = x->toDevice(x->endpoints_, table.data(), bytes, "copying the endpoint table"); !s)
    return s;
  auto order = LaunchOrder::create(o.graphMixing);
  if (!order) return order.status();
  x->order_ = std::move(*order);
  if (!o.tracePath.empty()) {
    const std::size_t traceBytes = static_cast<std::size_t>(device::kTraceCalls) * x->channels_ *
                                   device::kTraceWords * sizeof(std::uint64_t);
    if (cudaError_t e = cudaMalloc(&x->trace_, traceBytes); e != cudaSuccess)
      return cudaFailed("allocating the WEFT_GPU_TRACE records", e);
    if (cudaError_t e = cudaMemset(x->trace_, 0, traceBytes); e != cudaSuccess)
      return cudaFailed("clearing the WEFT_GPU_TRACE records", e);
  }
  return x;
}

std::uint64_t* CudaExecutor::nextTrace() {
  if (trace_ == nullptr) return nullptr;
  const std::uint64_t slot = traceCalls_++ % device::kTraceCalls;
  return trace_ + slot * static_cast<std::size_t>(channels_) * device::kTraceWords;
}

Status CudaExecutor::writeTrace() const {
  const std::size_t words =
      static_cast<std::size_t>(device::kTraceCalls) * channels_ * device::kTraceWords;
  std::vector<std::uint64_t> all(8 + words);
  // A header of eight words, then kTraceCalls x channels x kTraceWords (scripts/gpu-trace.py).
  all[0] = 0x3143525454464557ull;  // "WEFTTRC1"
  all[1] = static_cast<std::uint64_t>(rank_);
  all[2] = static_cast<std::uint64_t>(nranks_);
  all[3] = static_cast<std::uint64_t>(channels_);
  all[4] = device::kTraceWords;
  all[5] = device::kTraceCalls;
  all[6] = traceCalls_;
  all[7] = device::kTraceHeader;
  if (cudaError_t e =
          cudaMemcpy(all.data() + 8, trace_, words * sizeof(std::uint64_t), cudaMemcpyDeviceToHost);
      e != cudaSuccess)
    return cudaFailed("reading the WEFT_GPU_TRACE records", e);
  const std::string path = options_.tracePath + "." + std::to_string(rank_);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return {Code::systemError, "WEFT_GPU_TRACE: cannot write " + path};
  const std::size_t wrote = std::fwrite(all.data(), sizeof(std::uint64_t), all.size(), f);
  const bool closed = std::fclose(f) == 0;
  if (wrote != all.size() || !closed)
    return {Code::systemError, "WEFT_GPU_TRACE: writing " + path + " failed"};
  return {};
}

CudaExecutor::~CudaExecutor() {
  (void)synchronize();
  if (trace_ != nullptr) {
    if (Status s = writeTrace(); !s) WEFT_WARN(log::kAll, "%s", s.message().c_str());
    (void)cudaFree(trace_);
  }
  for (auto& [s, p] : uploads_) (void)cudaFree(p);
  for (void* p : staged_) (void)cudaFreeHost(p);
  for (void* p : retired_) (void)cudaFree(p);
  if (scratch_ != nullptr) (void)cudaFree(scratch_);
  if (workspace_ != nullptr) (void)cudaFree(workspace_);
  if (endpoints_ != nullptr) (void)cudaFree(endpoints_);
  if (error_ != nullptr) (void)cudaFreeHost(error_);
  if (registered_) (void)cudaHostUnregister(options_.controlPage);
  order_.reset();
  ipc_.reset();
  (void)cudaGetLastError();
}

int CudaExecutor::device() const {
  return ipc_->device();
}

int CudaExecutor::threadsOnDevice() const {
  return ipc_->threadsOnThisDevice();
}

bool CudaExecutor::someDeviceShared() const {
  return ipc_->someDeviceShared();
}

Status CudaExecutor::begin(void* stream) {
  return order_->begin(stream);
}

Status CudaExecutor::end(void* stream) {
  return order_->end(stream);
}

std::string CudaExecutor::describe() const {
  return ipc_->describe() + ", " + std::to_string(channels_) + " channel(s), " +
         std::to_string(options_.slots) + " x " + std::to_string(options_.slotBytes / 1024) +
         " KiB simple and " + std::to_string(options_.llPayload / 1024) + " KiB ll slots";
}

Status CudaExecutor::toDevice(void* dev, const void* host, std::size_t bytes,
                              const std::string& what) {
  const auto e = static_cast<cudaError_t>(transport::runWaited([&](void* s) {
    return static_cast<int>(
        cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, static_cast<cudaStream_t>(s)));
  }));
  return e == cudaSuccess ? Status{} : cudaFailed(what, e);
}

Result<const void*> CudaExecutor::upload(const algo::Schedule& s, void* stream) {
  if (auto it = uploads_.find(&s); it != uploads_.end()) return it->second;
  const RelaxedCapture relaxed;  // a first upload may come inside a capture
  const std::size_t C = s.channels.size();
  // ChannelCode[C], then each channel's steps, peers and spans, each 16-byte aligned.
  std::size_t at = roundUp(C * sizeof(device::ChannelCode), 16);
  struct Parts {
    std::size_t steps, peers, spans;
  };
  std::vector<Parts> parts(C);
  for (std::size_t ch = 0; ch < C; ++ch) {
    const algo::Program& p = s.program(ch, rank_);
    parts[ch].steps = at;
    at = roundUp(at + p.steps().size() * sizeof(algo::Step), 16);
    parts[ch].peers = at;
    at = roundUp(at + p.peerPool().size() * sizeof(int), 16);
    parts[ch].spans = at;
    at = roundUp(at + p.spanPool().size() * sizeof(algo::Span), 16);
  }
  void* dev = nullptr;
  if (cudaError_t e = cudaMalloc(&dev, at); e != cudaSuccess)
    return cudaFailed("allocating a schedule's device copy", e);
  auto* base = static_cast<std::byte*>(dev);
  void* pinned = nullptr;
  if (cudaError_t e = cudaMallocHost(&pinned, at); e != cudaSuccess) {
    (void)cudaFree(dev);
    return cudaFailed("allocating a schedule's pinned host copy", e);
  }
  staged_.push_back(pinned);
  const std::span<std::byte> host(static_cast<std::byte*>(pinned), at);
  for (std::size_t ch = 0; ch < C; ++ch) {
    const algo::Program& p = s.program(ch, rank_);
    device::ChannelCode code;
    code.steps = reinterpret_cast<const algo::Step*>(base + parts[ch].steps);
    code.nsteps = static_cast<std::uint32_t>(p.steps().size());
    code.peers = reinterpret_cast<const int*>(base + parts[ch].peers);
    code.spans = reinterpret_cast<const algo::Span*>(base + parts[ch].spans);
    code.part = s.channels[ch].part;
    std::memcpy(host.data() + ch * sizeof code, &code, sizeof code);
    std::memcpy(host.data() + parts[ch].steps, p.steps().data(),
                p.steps().size() * sizeof(algo::Step));
    std::memcpy(host.data() + parts[ch].peers, p.peerPool().data(),
                p.peerPool().size() * sizeof(int));
    std::memcpy(host.data() + parts[ch].spans, p.spanPool().data(),
                p.spanPool().size() * sizeof(algo::Span));
  }
  // In capture the copy is made now (and waited for), not at every replay.
  Status st;
  if (capturing(stream)) {
    st = toDevice(dev, host.data(), at,
                  "copying a schedule to the device (the first call of each size class must not "
                  "be inside a CUDA graph capture)");
  } else if (cudaError_t e = cudaMemcpyAsync(dev, host.data(), at, cudaMemcpyHostToDevice,
                                             static_cast<cudaStream_t>(stream));
             e != cudaSuccess) {
    st = cudaFailed("copying a schedule to the device", e);
  }
  if (!st) {
    (void)cudaFree(dev);
    return st;
  }
  uploads_.emplace(&s, dev);
  return static_cast<const void*>(dev);
}

Result<std::byte*> CudaExecutor::workspace(std::size_t bytes) {
  if (bytes <= workspaceBytes_) return workspace_;
  const RelaxedCapture relaxed;  // a size's first call may come inside a capture
  // Whole MiB, doubling: a sweep of growing calls allocates a few times, not at every size.
  const std::size_t need = std::max(roundUp(bytes, std::size_t{1} << 20), 2 * workspaceBytes_);
  void* fresh = nullptr;
  if (cudaError_t e = cudaMalloc(&fresh, need); e != cudaSuccess)
    return cudaFailed("allocating " + std::to_string(need) + " bytes of device workspace", e);
  if (workspace_ != nullptr) retired_.push_back(workspace_);
  workspace_ = static_cast<std::byte*>(fresh);
  workspaceBytes_ = need;
  return workspace_;
}

Status CudaExecutor::run(const algo::Schedule& s, const Geometry& g, const Buffers& b,
                         algo::Protocol p, void* stream) {
  if (Status e = asyncError(); !e) return e;
  if (s.channels.size() > static_cast<std::size_t>(channels_)) {
    return internalError("a schedule of " + std::to_string(s.channels.size()) +
                         " channels reached a GPU executor of " + std::to_string(channels_));
  }
  if (g.passes == 0) return {};
  auto code = upload(s, stream);
  if (!code) return code.status();
  const std::size_t esize = sizeOf(b.type);
  const std::size_t need = std::max<std::size_t>(g.scratchElems * esize, 16);
  if (need > scratchBytes_) {
    const RelaxedCapture relaxed;
    void* fresh = nullptr;
    if (cudaError_t e = cudaMalloc(&fresh, need); e != cudaSuccess)
      return cudaFailed("allocating " + std::to_string(need) + " bytes of device scratch", e);
    if (scratch_ != nullptr) retired_.push_back(scratch_);
    scratch_ = static_cast<std::byte*>(fresh);
    scratchBytes_ = need;
  }
  device::LaunchArgs a = baseArgs();
  a.channels = static_cast<const device::ChannelCode*>(*code);
  a.blockElems = g.blockElems;
  a.partElems = g.partElems;
  a.sliceElems = g.sliceElems;
  a.passes = g.passes;
  a.count = b.count;
  a.strideBytes = roundUp(g.sliceElems * esize, 16);
  a.blocksPerSegment = s.blocksPerSegment;
  a.input = b.input;
  a.output = b.output;
  a.scratch = scratch_;
  a.traceCall = traceCalls_;
  a.trace = nextTrace();
  return device::launchSchedule(a, static_cast<int>(s.channels.size()), b.type, b.op, p, stream);
}

device::LaunchArgs CudaExecutor::baseArgs() const {
  const std::size_t C = static_cast<std::size_t>(ipc_->geometry().channels);
  const auto N = static_cast<std::size_t>(nranks_);
  auto* eps = static_cast<const device::Endpoint*>(endpoints_);
  device::LaunchArgs a;
  a.to = eps;
  a.from = eps + C * N;
  a.aborts = reinterpret_cast<std::uint32_t* const*>(eps + 2 * C * N);
  auto* const* direct = reinterpret_cast<void* const*>(a.aborts + N);
  a.directFlags = reinterpret_cast<std::uint64_t* const*>(direct);
  a.directSlabs = reinterpret_cast<std::byte* const*>(direct + N);
  if (ipc_->geometry().directLlInboxBytes() > 0)
    a.directLl = reinterpret_cast<std::byte* const*>(direct + 2 * N);
  a.directCounts = ipc_->directCounts();
  a.llCounts = ipc_->llCounts();
  // An operation made to wait for its predecessor on another stream, or for a capture's wait
  // node, launches plainly: the stream's previous kernel is not what it follows.
  a.dependentLaunch = options_.dependentLaunch && !order_->waited();
  a.directSlabBytes = ipc_->geometry().directSlabBytes;
  a.staging = ipc_->staging();
  a.hostAbort = hostAbortDevice_;
  a.error = static_cast<device::KernelError*>(errorDevice_);
  a.timeoutNs = static_cast<std::uint64_t>(options_.timeout.count()) * 1'000'000ull;
  a.nranks = nranks_;
  a.rank = rank_;
  a.slots = options_.slots;
  a.slotBytes = options_.slotBytes;
  a.llPayload = options_.llPayload;
  a.deviceScope = ipc_->allOnThisDevice() ? 1 : 0;
  a.signature = signature_;
  return a;
}

std::size_t CudaExecutor::oneShotLimit() const {
  // A block per slab, and no more blocks than can all be resident with the other ranks'.
  const int blocks = std::min(transport::CudaIpcGeometry::kDirectBlocks, ipc_->residentChannels());
  return static_cast<std::size_t>(blocks) * ipc_->geometry().directSlabBytes;
}

struct CudaExecutor::PeerInputs {
  transport::CudaIpcTransport::PeerBuffers buffers;
  std::byte** device = nullptr;  // buffers.at, in device memory
  ~PeerInputs() {
    if (device != nullptr) (void)cudaFree(device);
    transport::CudaIpcTransport::close(buffers);
  }
};

Result<std::shared_ptr<CudaExecutor::PeerInputs>> CudaExecutor::mapRegistered(
    const void* base, boot::Bootstrap& bootstrap) {
  auto buffers = ipc_->mapPeerBuffers(base, bootstrap);
  if (!buffers) return buffers.status();
  auto p = std::make_shared<PeerInputs>();
  p->buffers = std::move(*buffers);
  if (p->buffers.at.empty()) return p;  // not readable in place: the slabs serve
  const std::size_t bytes = p->buffers.at.size() * sizeof(std::byte*);
  if (cudaError_t e = cudaMalloc(reinterpret_cast<void**>(&p->device), bytes); e != cudaSuccess)
    return cudaFailed("allocating the registered buffers' table", e);
  if (Status s =
          toDevice(p->device, p->buffers.at.data(), bytes, "copying the registered buffers' table");
      !s)
    return s;
  return p;
}

std::vector<std::byte*> CudaExecutor::peerPointers(const PeerInputs& p) {
  return p.buffers.at;
}

Status CudaExecutor::direct(const Buffers& b, bool twoShot, void* stream, const PeerInputs* peers,
                            std::size_t offset, const PeerInputs* outPeers, std::size_t outOffset) {
  if (Status e = asyncError(); !e) return e;
  const std::size_t bytes = b.count * sizeOf(b.type);
  if (bytes == 0) return {};
  device::LaunchArgs a = baseArgs();
  a.input = b.input;
  a.output = b.output;
  a.count = b.count;
  if (peers != nullptr && peers->device != nullptr) {
    a.registered = peers->device;
    a.registeredOffset = offset;
  }
  if (twoShot && a.nranks <= 64 && outPeers != nullptr && outPeers->device != nullptr) {
    a.registeredOut = outPeers->device;
    a.registeredOutOffset = outOffset;
  }
  // A small one-shot pushes ll lines instead (no copy, fence or flag round trip), registered
  // input or not.
  if (!twoShot && llServes(a, bytes)) {
    return launchLl(a, device::DirectKind::allReduce, b, stream);
  }
  const std::size_t es = sizeOf(b.type);
  const Spread grid = spread(b.count, a.directSlabBytes / es, std::max<std::size_t>(1, 512 / es),
                             std::max<std::size_t>(1, options_.directBlockBytes / es));
  a.directShareElems = grid.share;
  return device::launchDirect(a, grid.blocks, twoShot, b.type, b.op, stream);
}

CudaExecutor::Spread CudaExecutor::spread(std::size_t count, std::size_t most, std::size_t align,
                                          std::size_t least) const {
  // One round's slabs (a block each) hold the call: a block for every `least` elements, as many
  // as there are slabs, the call cut evenly among them (in multiples of `align`, which `most`
  // is). Otherwise every block a slab's worth, in rounds.
  const auto slabs = oneShotLimit() / ipc_->geometry().directSlabBytes;
  if ((count + most - 1) / most >= slabs) return {static_cast<int>(slabs), most};
  const std::size_t blocks = std::clamp<std::size_t>((count + least - 1) / least, 1, slabs);
  const std::size_t share =
      std::min(most, ((count + blocks - 1) / blocks + align - 1) / align * align);
  return {static_cast<int>((count + share - 1) / share), share};
}

bool CudaExecutor::llServes(const device::LaunchArgs& a, std::size_t pieceBytes) const {
  using Ipc = transport::CudaIpcGeometry;
  return a.directLl != nullptr &&
         pieceBytes <= std::min(options_.llDirectBytes, Ipc::kDirectLlBytes);
}

Status CudaExecutor::launchLl(const device::LaunchArgs& a, device::DirectKind kind,
                              const Buffers& b, void* stream) {
  // The same grid at every call (the blocks' counts must agree): a block for every
  // llBlockBytes of the largest piece ll takes, up to llBlocks, all resident with the peers'
  // blocks.
  using Ipc = transport::CudaIpcGeometry;
  const std::size_t most = std::min(options_.llDirectBytes, Ipc::kDirectLlBytes);
  const std::size_t least = options_.llBlockBytes;
  const int cap = std::clamp(options_.llBlocks, 1, Ipc::kDirectLlBlocks);
  const auto wanted = static_cast<int>(
      std::min<std::size_t>((most + least - 1) / least, static_cast<std::size_t>(cap)));
  const int blocks = std::clamp(wanted, 1, std::min(cap, ipc_->residentChannels()));
  return device::launchDirectLl(a, kind, Ipc::kDirectLlBytes, blocks, least, b.type, b.op, stream);
}

Status CudaExecutor::directBlocks(const Buffers& b, device::DirectKind kind, void* stream) {
  if (Status e = asyncError(); !e) return e;
  const std::size_t es = sizeOf(b.type);
  if (b.count == 0) return {};
  device::LaunchArgs a = baseArgs();
  a.input = b.input;
  a.output = b.output;
  a.count = b.count;
  if (llServes(a, b.count * es)) return launchLl(a, kind, b, stream);
  const std::size_t pieces =
      kind == device::DirectKind::gather ? 1 : static_cast<std::size_t>(a.nranks);
  const std::size_t share = device::directShare(a.directSlabBytes, es, pieces);
  if (share == 0) {
    return Status(Code::unsupported, "a direct kernel with " + std::to_string(pieces) +
                                         " pieces: a slab holds less than 16 bytes of each");
  }
  const Spread grid = spread(b.count, share, std::max<std::size_t>(1, 16 / es),
                             std::max<std::size_t>(1, options_.directBlockBytes / (es * pieces)));
  a.directShareElems = grid.share;
  return device::launchDirectBlocks(a, grid.blocks, kind, b.type, b.op, stream);
}

Status CudaExecutor::exchange(const std::vector<P2p>& ops, void* stream) {
  if (Status e = asyncError(); !e) return e;
  // To itself: device-to-device copies, in order, on the stream.
  std::vector<const P2p*> selfSends, selfRecvs;
  for (const P2p& op : ops) {
    if (op.peer == rank_ && op.bytes > 0) (op.isSend ? selfSends : selfRecvs).push_back(&op);
  }
  for (std::size_t k = 0; k < selfSends.size() && k < selfRecvs.size(); ++k) {
    if (cudaError_t e =
            cudaMemcpyAsync(selfRecvs[k]->buf, selfSends[k]->buf, selfSends[k]->bytes,
                            cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(stream));
        e != cudaSuccess)
      return cudaFailed("copying a send to itself", e);
  }
  // Lanes: per (direction, peer), the operations in call order.
  std::map<std::pair<bool, int>, std::vector<const P2p*>> lanes;
  for (const P2p& op : ops) {
    if (op.peer != rank_ && op.bytes > 0) lanes[{op.isSend, op.peer}].push_back(&op);
  }
  std::size_t total = 0;
  for (const auto& [key, list] : lanes) total += list.size();
  if (lanes.size() > static_cast<std::size_t>(ipc_->residentChannels())) {
    return Status(Code::unsupported,
                  "a group with " + std::to_string(lanes.size()) +
                      " (peer, direction) pairs on GPU memory: the ranks sharing this GPU can "
                      "keep only " +
                      std::to_string(ipc_->residentChannels()) + " blocks each resident at once");
  }
  if (lanes.size() > static_cast<std::size_t>(device::kMaxP2pLanes) ||
      total > static_cast<std::size_t>(device::kMaxP2pOps)) {
    return Status(Code::unsupported,
                  "a batch of " + std::to_string(total) + " sends and receives with " +
                      std::to_string(lanes.size()) + " (peer, direction) pairs on GPU memory: " +
                      "at most " + std::to_string(device::kMaxP2pOps) + " and " +
                      std::to_string(device::kMaxP2pLanes) + " in one group");
  }
  if (lanes.empty()) return {};
  auto p2p = std::make_unique<device::P2pArgs>();
  // Messages spread over up to kMaxP2pStripes channels (the same on every rank); each lane
  // gets as many blocks as that, while every lane's blocks stay resident together.
  p2p->stripes = std::max(1, std::min(channels_, device::kMaxP2pStripes));
  p2p->perLane =
      std::clamp(ipc_->residentChannels() / static_cast<int>(lanes.size()), 1, p2p->stripes);
  int next = 0;
  for (const auto& [key, list] : lanes) {
    device::P2pLane& lane = p2p->lanes[p2p->nlanes++];
    lane.isSend = key.first ? 1 : 0;
    lane.peer = key.second;
    lane.first = next;
    lane.count = static_cast<int>(list.size());
    for (const P2p* op : list) p2p->ops[next++] = {op->buf, op->bytes};
  }
  if (p2p->nlanes == 0) return {};
  return device::launchP2p(baseArgs(), *p2p, stream);
}

Status CudaExecutor::divide(void* data, std::size_t count, DataType type, std::uint64_t n,
                            void* stream) {
  return device::divide(data, count, type, n, stream);
}

Status CudaExecutor::asyncError() const {
  const auto* e = static_cast<const volatile device::KernelError*>(error_);
  if (e == nullptr || e->code == 0) return {};
  if (e->code == 3) {
    // A peer's message of another call: named by the calls the ranks posted where they can be.
    const bool ll = e->line >= 0;
    const std::string mine = namer ? namer(rank_, e->want, false) : "";
    const std::string theirs = namer ? namer(e->peer, e->have, ll) : "";
    char seen[128];
    std::snprintf(seen, sizeof seen, "seen on GPU channel %d: signature %08llx against %s%0*llx",
                  static_cast<int>(e->channel), static_cast<unsigned long long>(e->want),
                  ll ? "ll bits " : "", ll ? 2 : 8, static_cast<unsigned long long>(e->have));
    const std::string who = "rank " + std::to_string(rank_);
    const std::string peer = "rank " + std::to_string(e->peer);
    const std::string what =
        !mine.empty() && !theirs.empty()
            ? who + " called " + mine + " but " + peer + " called " + theirs
            : who + "'s messages from " + peer + " are of another call than its own";
    return {Code::invalidUsage, what + " (" + seen +
                                    "; every rank must make the same calls in the same order, "
                                    "each send with a receive of its size; WEFT_CHECK_CALLS)"};
  }
  std::string where = "GPU channel " + std::to_string(e->channel);
  if (e->peer < 0) {
    where += ", at its start";
  } else {
    if (e->pass >= 0) where += ", pass " + std::to_string(e->pass);
    where += ", step " + std::to_string(e->step) + ", waiting for rank " + std::to_string(e->peer);
    // What the awaited word held: a count short of the one wanted, or an ll line's flag.
    if (e->want != 0) {
      where += (e->line >= 0 ? " (ll line " + std::to_string(e->line) + " has flag " : " (has ") +
               std::to_string(e->have) + ", wants " + std::to_string(e->want) + ")";
    }
    // And the peer's own counts on this connection, as its last finished kernel left them: a
    // peer whose kernel finished having sent nothing new never sent, one that counts the
    // message wanted as sent wrote it where it is not read.
    if (e->code == 1 && e->pass >= 0) {
      if (auto c = ipc_->peerCounts(e->channel, e->peer)) {
        where += "; rank " + std::to_string(e->peer) + " counts " + std::to_string(c->sent) +
                 " sent here and " + std::to_string(c->received) + " received from here";
      }
    }
  }
  if (e->code == 1) {
    return {Code::timeout, "rank " + std::to_string(rank_) + ": " + where + ": no progress in " +
                               std::to_string(options_.timeout.count() / 1000) +
                               " s (WEFT_TIMEOUT_S)"};
  }
  return {Code::remoteError,
          "rank " + std::to_string(rank_) + ": " + where + ": the communicator was aborted"};
}

Status CudaExecutor::synchronize() {
  if (!order_) return {};
  if (Status s = order_->synchronize(); !s) return s;
  return asyncError();
}

}  // namespace weft::exec
