#include "src/transport/cuda_ipc.hpp"

#include <cuda.h>
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>

#include "src/core/sizes.hpp"

namespace weft::transport {
namespace {

constexpr std::size_t kAbortBytes = 256;
constexpr std::size_t kControlBytes = 256;  // head, tail and counts, each on its own 64 bytes

// Where the words of one (channel, peer) control block sit: the simple slots' signatures
// (Endpoint::sigs) in the words after head, on its 64 bytes.
constexpr std::size_t kHead = 0, kSigs = 8, kTail = 64, kSent = 128, kReceived = 192;
constexpr int kMostSlots = static_cast<int>((kTail - kSigs) / 8);

Status cudaFailed(const std::string& what, cudaError_t err) {
  return {Code::systemError, what + ": " + cudaGetErrorString(err)};
}

// What each rank shares: where its inbox is, and how to map it.
struct InboxRecord {
  cudaIpcMemHandle_t handle;
  std::uint64_t address;
  std::int32_t pid;
  std::int32_t device;
  std::int32_t ipcOk;
  std::int32_t residentBlocks;
  char bus[20];  // PCI bus id, for the summary and to tell devices apart across processes
};

// What each rank shares of a buffer it registered: the allocation holding it, where the buffer
// sits in that allocation, and its address for ranks of the same process.
struct BufferRecord {
  cudaIpcMemHandle_t handle;
  std::uint64_t address;
  std::uint64_t offset;  // from the allocation's start
  std::int32_t pid;
  std::int32_t ipcOk;   // 1: handle valid; 0: not exportable (peers in its process need none)
  std::int32_t device;  // 1: device (or managed) memory
};

// The start of the device allocation holding p, through the driver's cuMemGetAddressRange
// (found at run time: nothing links against libcuda).
Result<std::uintptr_t> allocationStart(const void* p) {
  using GetRange = CUresult (*)(CUdeviceptr*, std::size_t*, CUdeviceptr);
  static GetRange getRange = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      fn = nullptr;
    }
    return reinterpret_cast<GetRange>(fn);
  }();
  if (getRange == nullptr)
    return Status(Code::systemError, "cuda_ipc: the driver offers no cuMemGetAddressRange");
  CUdeviceptr start = 0;
  std::size_t size = 0;
  if (getRange(&start, &size, reinterpret_cast<CUdeviceptr>(p)) != CUDA_SUCCESS)
    return Status(Code::invalidArgument, "cuda_ipc: the buffer is not device memory CUDA knows");
  return static_cast<std::uintptr_t>(start);
}

// A process may map one allocation of another process once (CUDA IPC refuses a second open of
// a handle): the mappings are shared, process-wide, counted.
struct OpenedAllocation {
  void* at = nullptr;
  int users = 0;
};
std::mutex openedMutex;
std::map<std::string, OpenedAllocation> opened;  // by handle bytes

std::string keyOf(const cudaIpcMemHandle_t& h) {
  return std::string(reinterpret_cast<const char*>(&h), sizeof h);
}

Result<void*> openShared(const cudaIpcMemHandle_t& h) {
  std::lock_guard lock(openedMutex);
  OpenedAllocation& o = opened[keyOf(h)];
  if (o.users == 0) {
    void* mapped = nullptr;
    if (cudaError_t e = cudaIpcOpenMemHandle(&mapped, h, cudaIpcMemLazyEnablePeerAccess);
        e != cudaSuccess) {
      opened.erase(keyOf(h));
      return cudaFailed("cuda_ipc: opening a peer's allocation", e);
    }
    o.at = mapped;
  }
  ++o.users;
  return o.at;
}

void closeShared(void* at) {
  std::lock_guard lock(openedMutex);
  for (auto it = opened.begin(); it != opened.end(); ++it) {
    if (it->second.at != at) continue;
    if (--it->second.users == 0) {
      (void)cudaIpcCloseMemHandle(at);
      opened.erase(it);
    }
    return;
  }
}

}  // namespace

Result<CudaIpcTransport::PeerBuffers> CudaIpcTransport::mapPeerBuffers(
    const void* base, boot::Bootstrap& bootstrap) const {
  const auto N = static_cast<std::size_t>(g_.nranks), ME = static_cast<std::size_t>(g_.rank);
  std::vector<BufferRecord> all(N);
  BufferRecord& self = all[ME];
  std::memset(&self, 0, sizeof self);
  self.address = reinterpret_cast<std::uintptr_t>(base);
  self.pid = static_cast<std::int32_t>(getpid());
  cudaPointerAttributes attr{};
  self.device = cudaPointerGetAttributes(&attr, base) == cudaSuccess &&
                        (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged)
                    ? 1
                    : 0;
  (void)cudaGetLastError();
  if (auto start = allocationStart(base)) {
    self.offset = self.address - *start;
    self.ipcOk =
        cudaIpcGetMemHandle(&self.handle, reinterpret_cast<void*>(*start)) == cudaSuccess ? 1 : 0;
    (void)cudaGetLastError();
  }
  if (Status s = bootstrap.allGather(all.data(), sizeof(BufferRecord)); !s) return s;
  // Every rank decides from the same table, so all read in place or none does (a rank that
  // reads a peer's input in place skips copying its own into the slabs): a buffer that is not
  // GPU memory, or one a peer in another process cannot map, leaves the slabs to serve.
  PeerBuffers p;
  for (std::size_t q = 0; q < N; ++q) {
    if (all[q].device == 0) return p;
    for (std::size_t k = 0; k < N; ++k) {
      if (all[k].pid != all[q].pid && all[q].ipcOk == 0) return p;
    }
  }
  p.at.assign(N, nullptr);
  p.allocation.assign(N, nullptr);
  for (std::size_t q = 0; q < N; ++q) {
    const BufferRecord& r = all[q];
    if (q == ME || r.pid == self.pid) {
      p.at[q] = reinterpret_cast<std::byte*>(static_cast<std::uintptr_t>(r.address));
      continue;
    }
    auto mapped = openShared(r.handle);
    if (!mapped) {
      close(p);
      return Status(mapped.status().code(), "registered buffer of rank " + std::to_string(q) +
                                                ": " + mapped.status().message());
    }
    p.allocation[q] = static_cast<std::byte*>(*mapped);
    p.at[q] = static_cast<std::byte*>(*mapped) + r.offset;
  }
  return p;
}

void CudaIpcTransport::close(PeerBuffers& p) {
  for (std::byte*& a : p.allocation) {
    if (a != nullptr) closeShared(a);
    a = nullptr;
  }
  p.at.clear();
}

std::size_t CudaIpcGeometry::controlOffset(int channel, int peer) const {
  return kAbortBytes +
         (static_cast<std::size_t>(channel) * nranks + static_cast<std::size_t>(peer)) *
             kControlBytes;
}

std::size_t CudaIpcGeometry::dataOffset(int channel, int sender) const {
  const std::size_t controls =
      roundUp(kAbortBytes + static_cast<std::size_t>(channels) * nranks * kControlBytes, 4096);
  const std::size_t pair = static_cast<std::size_t>(slots) * (slotBytes + 2 * llPayload);
  return controls +
         (static_cast<std::size_t>(channel) * nranks + static_cast<std::size_t>(sender)) * pair;
}

std::size_t CudaIpcGeometry::stagingOffset() const {
  return dataOffset(channels, 0);
}

std::size_t CudaIpcGeometry::directOffset() const {
  return roundUp(stagingOffset() + static_cast<std::size_t>(channels) * (nranks + 1) * llPayload,
                 4096);
}

// Direct region: flags (64 bytes each), counts (8 bytes each), the ll kernels' counts, then the
// slabs.
constexpr std::size_t kDirectFlags = 0, kDirectCounts = 64 * CudaIpcGeometry::kDirectBlocks,
                      kLlCounts = kDirectCounts + 8 * CudaIpcGeometry::kDirectBlocks,
                      kDirectSlabs = 4096;
static_assert(kLlCounts + 8 * CudaIpcGeometry::kDirectLlBlocks <= kDirectSlabs);

std::size_t CudaIpcGeometry::directLlOffset() const {
  return directOffset() + kDirectSlabs + 2 * std::size_t{kDirectBlocks} * directSlabBytes;
}

std::size_t CudaIpcGeometry::directLlInboxBytes() const {
  // Two parities of every sender's lines (an 8-byte line carries 4 bytes of data).
  return nranks <= kDirectLlRanks ? 2 * static_cast<std::size_t>(nranks) * 2 * kDirectLlBytes : 0;
}

std::size_t CudaIpcGeometry::inboxBytes() const {
  return directLlOffset() + directLlInboxBytes();
}

Result<std::unique_ptr<CudaIpcTransport>> CudaIpcTransport::create(const CudaIpcGeometry& g,
                                                                   boot::Bootstrap& bootstrap) {
  std::unique_ptr<CudaIpcTransport> t(new CudaIpcTransport());
  t->g_ = g;
  const auto N = static_cast<std::size_t>(g.nranks), ME = static_cast<std::size_t>(g.rank);
  std::vector<InboxRecord> all(N);
  InboxRecord& self = all[ME];
  std::memset(&self, 0, sizeof self);
  Status local = [&]() -> Status {
    if (g.slots < 1 || g.slots > kMostSlots) {
      return {Code::invalidArgument, "cuda_ipc: " + std::to_string(g.slots) +
                                         " slots per connection; 1 to " +
                                         std::to_string(kMostSlots) + " fit its control block"};
    }
    if (cudaError_t e = cudaGetDevice(&t->device_); e != cudaSuccess)
      return cudaFailed("cuda_ipc: no current CUDA device", e);
    void* p = nullptr;
    if (cudaError_t e = cudaMalloc(&p, g.inboxBytes()); e != cudaSuccess)
      return cudaFailed(
          "cuda_ipc: allocating the " + std::to_string(g.inboxBytes() >> 20) + " MiB device inbox",
          e);
    t->own_ = static_cast<std::byte*>(p);
    const auto e = static_cast<cudaError_t>(runWaited([&](void* s) {
      return static_cast<int>(cudaMemsetAsync(p, 0, g.inboxBytes(), static_cast<cudaStream_t>(s)));
    }));
    if (e != cudaSuccess) return cudaFailed("cuda_ipc: clearing the device inbox", e);
    self.ipcOk = cudaIpcGetMemHandle(&self.handle, p) == cudaSuccess ? 1 : 0;
    (void)cudaGetLastError();
    (void)cudaDeviceGetPCIBusId(self.bus, sizeof self.bus, t->device_);
    return {};
  }();
  self.address = reinterpret_cast<std::uintptr_t>(t->own_);
  self.pid = static_cast<std::int32_t>(getpid());
  self.device = local ? t->device_ : -1;
  self.residentBlocks = g.residentBlocks;
  // Every rank learns of every failure here, so none waits for a peer that gave up.
  if (Status s = bootstrap.allGather(all.data(), sizeof(InboxRecord)); !s) return s;
  if (!local) return local;
  for (std::size_t q = 0; q < N; ++q) {
    if (all[q].device < 0) {
      return Status(Code::systemError,
                    "cuda_ipc: rank " + std::to_string(q) + " could not set up its device inbox");
    }
  }

  t->inboxes_.assign(N, nullptr);
  t->opened_.assign(N, 0);
  int processes = 0, sameDevice = 0, p2pPeers = 0, threads = 0;
  for (std::size_t q = 0; q < N; ++q) {
    const InboxRecord& r = all[q];
    const bool sameProcess = r.pid == self.pid;
    const bool onMyDevice = std::strncmp(r.bus, self.bus, sizeof self.bus) == 0;
    sameDevice += onMyDevice ? 1 : 0;
    threads += onMyDevice && sameProcess ? 1 : 0;
    if (q == ME) {
      t->inboxes_[q] = t->own_;
      continue;
    }
    if (!onMyDevice) {
      // Another GPU: this process must see it, and reach its memory over P2P (NVLink or PCIe).
      int ordinal = -1, can = 0;
      if (cudaDeviceGetByPCIBusId(&ordinal, r.bus) != cudaSuccess) {
        (void)cudaGetLastError();
        return Status(Code::unsupported,
                      "cuda_ipc: rank " + std::to_string(q) + "'s GPU (" + r.bus +
                          ") is not visible to rank " + std::to_string(ME) +
                          "'s process (CUDA_VISIBLE_DEVICES?); GPU buffers need every rank's GPU "
                          "visible to every rank of the host");
      }
      (void)cudaDeviceCanAccessPeer(&can, t->device_, ordinal);
      if (can == 0) {
        return Status(Code::unsupported, "cuda_ipc: no peer access from GPU " +
                                             std::string(self.bus) + " to rank " +
                                             std::to_string(q) + "'s GPU " + r.bus +
                                             "; GPU buffers between them are not supported yet");
      }
      ++p2pPeers;
      if (sameProcess) {
        const cudaError_t e = cudaDeviceEnablePeerAccess(ordinal, 0);
        if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled)
          return cudaFailed("cuda_ipc: enabling peer access to GPU " + std::string(r.bus), e);
        (void)cudaGetLastError();
      }
    }
    if (sameProcess) {
      t->inboxes_[q] = reinterpret_cast<std::byte*>(static_cast<std::uintptr_t>(r.address));
      continue;
    }
    ++processes;
    if (r.ipcOk == 0) {
      return Status(Code::unsupported,
                    "cuda_ipc: rank " + std::to_string(q) + " could not export its inbox");
    }
    void* mapped = nullptr;
    if (cudaError_t e = cudaIpcOpenMemHandle(&mapped, r.handle, cudaIpcMemLazyEnablePeerAccess);
        e != cudaSuccess) {
      return cudaFailed("cuda_ipc: mapping rank " + std::to_string(q) + "'s device inbox (GPU " +
                            std::string(r.bus) + ")",
                        e);
    }
    t->inboxes_[q] = static_cast<std::byte*>(mapped);
    t->opened_[q] = 1;
  }
  // Nobody writes a peer's inbox before every rank has cleared its own and mapped the others.
  if (Status s = bootstrap.barrier(); !s) return s;
  t->allOnThisDevice_ = sameDevice == static_cast<int>(N);
  t->threadsOnThisDevice_ = threads;
  // Blocks per rank that keep every rank of the busiest device resident at once.
  t->residentChannels_ = 1 << 30;
  for (std::size_t q = 0; q < N; ++q) {
    int sharing = 0;
    for (std::size_t p = 0; p < N; ++p)
      sharing += std::strncmp(all[p].bus, all[q].bus, sizeof all[q].bus) == 0 ? 1 : 0;
    t->residentChannels_ = std::min(t->residentChannels_, all[q].residentBlocks / sharing);
    t->someDeviceShared_ = t->someDeviceShared_ || sharing > 1;
  }
  if (t->residentChannels_ < 1) {
    return Status(Code::unsupported,
                  "cuda_ipc: too many ranks share one GPU for their kernels to be resident "
                  "together (fewer ranks per GPU, or a GPU with more SMs)");
  }
  t->description_ = "cuda_ipc on GPU " + std::to_string(t->device_) + " (" + self.bus + "), " +
                    std::to_string(sameDevice) + " of " + std::to_string(N) +
                    " rank(s) on this device, " + std::to_string(p2pPeers) +
                    " peer(s) on other GPUs through P2P, " + std::to_string(processes) +
                    " peer(s) in other processes";
  return t;
}

CudaIpcTransport::~CudaIpcTransport() {
  for (std::size_t q = 0; q < inboxes_.size(); ++q) {
    if (opened_[q] != 0) (void)cudaIpcCloseMemHandle(inboxes_[q]);
  }
  if (own_ != nullptr) (void)cudaFree(own_);
}

device::Endpoint CudaIpcTransport::to(int channel, int peer) const {
  device::Endpoint e;
  if (peer == g_.rank) return e;
  std::byte* theirs = inboxes_[static_cast<std::size_t>(peer)];
  std::byte* mine = inboxes_[static_cast<std::size_t>(g_.rank)];
  std::byte* data = theirs + g_.dataOffset(channel, g_.rank);
  e.slots = data;
  e.lines = reinterpret_cast<std::uint64_t*>(data + g_.slots * g_.slotBytes);
  e.head = reinterpret_cast<std::uint64_t*>(theirs + g_.controlOffset(channel, g_.rank) + kHead);
  e.sigs = reinterpret_cast<std::uint64_t*>(theirs + g_.controlOffset(channel, g_.rank) + kSigs);
  e.tail = reinterpret_cast<std::uint64_t*>(mine + g_.controlOffset(channel, peer) + kTail);
  e.counter = reinterpret_cast<std::uint64_t*>(mine + g_.controlOffset(channel, peer) + kSent);
  return e;
}

device::Endpoint CudaIpcTransport::from(int channel, int peer) const {
  device::Endpoint e;
  if (peer == g_.rank) return e;
  std::byte* theirs = inboxes_[static_cast<std::size_t>(peer)];
  std::byte* mine = inboxes_[static_cast<std::size_t>(g_.rank)];
  std::byte* data = mine + g_.dataOffset(channel, peer);
  e.slots = data;
  e.lines = reinterpret_cast<std::uint64_t*>(data + g_.slots * g_.slotBytes);
  e.head = reinterpret_cast<std::uint64_t*>(mine + g_.controlOffset(channel, peer) + kHead);
  e.sigs = reinterpret_cast<std::uint64_t*>(mine + g_.controlOffset(channel, peer) + kSigs);
  e.tail = reinterpret_cast<std::uint64_t*>(theirs + g_.controlOffset(channel, g_.rank) + kTail);
  e.counter = reinterpret_cast<std::uint64_t*>(mine + g_.controlOffset(channel, peer) + kReceived);
  return e;
}

Result<CudaIpcTransport::Counts> CudaIpcTransport::peerCounts(int channel, int peer) const {
  if (channel < 0 || channel >= g_.channels || peer < 0 || peer >= g_.nranks || peer == g_.rank)
    return Status(Code::invalidArgument, "cuda_ipc: no connection to count");
  const std::byte* control =
      inboxes_[static_cast<std::size_t>(peer)] + g_.controlOffset(channel, g_.rank);
  Counts c;
  if (cudaError_t e = cudaMemcpy(&c.sent, control + kSent, sizeof c.sent, cudaMemcpyDeviceToHost);
      e != cudaSuccess)
    return cudaFailed("cuda_ipc: reading rank " + std::to_string(peer) + "'s counts", e);
  if (cudaError_t e =
          cudaMemcpy(&c.received, control + kReceived, sizeof c.received, cudaMemcpyDeviceToHost);
      e != cudaSuccess)
    return cudaFailed("cuda_ipc: reading rank " + std::to_string(peer) + "'s counts", e);
  return c;
}

std::uint64_t* CudaIpcTransport::directFlags(int rank) const {
  return reinterpret_cast<std::uint64_t*>(inboxes_[static_cast<std::size_t>(rank)] +
                                          g_.directOffset() + kDirectFlags);
}

std::uint64_t* CudaIpcTransport::directCounts() const {
  return reinterpret_cast<std::uint64_t*>(inboxes_[static_cast<std::size_t>(g_.rank)] +
                                          g_.directOffset() + kDirectCounts);
}

std::uint64_t* CudaIpcTransport::llCounts() const {
  return reinterpret_cast<std::uint64_t*>(inboxes_[static_cast<std::size_t>(g_.rank)] +
                                          g_.directOffset() + kLlCounts);
}

std::byte* CudaIpcTransport::directSlabs(int rank) const {
  return inboxes_[static_cast<std::size_t>(rank)] + g_.directOffset() + kDirectSlabs;
}

std::byte* CudaIpcTransport::directLl(int rank) const {
  if (g_.directLlInboxBytes() == 0) return nullptr;
  return inboxes_[static_cast<std::size_t>(rank)] + g_.directLlOffset();
}

std::uint32_t* CudaIpcTransport::abortWord(int rank) const {
  return reinterpret_cast<std::uint32_t*>(inboxes_[static_cast<std::size_t>(rank)]);
}

int runWaited(const std::function<int(void*)>& work) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  cudaStream_t s = cudaStreamLegacy;
  if (cudaStreamIsCapturing(cudaStreamLegacy, &capture) != cudaSuccess ||
      capture != cudaStreamCaptureStatusNone) {
    (void)cudaGetLastError();
    if (cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking); e != cudaSuccess)
      return static_cast<int>(e);
  }
  auto e = static_cast<cudaError_t>(work(s));
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  if (s != cudaStreamLegacy) (void)cudaStreamDestroy(s);
  return static_cast<int>(e);
}

}  // namespace weft::transport
