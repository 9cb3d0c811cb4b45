// The cuda_ipc transport: every rank's FIFOs live in one allocation of its GPU's memory (its
// device inbox); every peer maps it, with CUDA IPC between processes, or directly between threads
// of one process (with peer access enabled when their devices differ). Ranks sharing one device
// are allowed: that is how a one-GPU machine runs several ranks.
//
// Layout of one rank's inbox, for n ranks, C channels and K slots per connection:
//   [abort word]                         set by any rank's kernel when it fails
//   [control of (channel, peer)] x C*n   head (peer's messages posted here), tail (this rank's
//                                        messages the peer consumed), this rank's own counts
//   [data of (channel, sender)] x C*n    K simple slots, then K ll slots (twice their payload)
//   [staging of channel] x C             ll: (n + 1) payloads the kernel packs and unpacks in
//   [direct: flags, counts, slabs]       one-shot all-reduce: per block a flag (peers read it),
//                                        a call count (its own), and two slabs (by call parity)
//                                        that the rank copies its input into for peers to read;
//                                        the ll kernels' per-block call counts
//   [ll inbox]                           two parities of every sender's ll lines (<= 16 ranks)
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "src/bootstrap/bootstrap.hpp"
#include "src/device/schedule_kernel.hpp"
#include "weft/status.hpp"

namespace weft::transport {

struct CudaIpcGeometry {
  int nranks = 1;
  int rank = 0;
  int channels = 1;
  int slots = 4;
  std::size_t slotBytes = 256 * 1024;
  std::size_t llPayload = 16 * 1024;
  int residentBlocks = 1 << 20;  // blocks of the kernel this rank's device holds at once
  static constexpr int kDirectBlocks = 32;
  static constexpr std::size_t kDirectSlabBytes = 128 * 1024;
  // The most a direct all-reduce can carry (fewer blocks where residency caps them).
  static constexpr std::size_t kDirectMaxBytes = kDirectBlocks * kDirectSlabBytes;
  std::size_t directSlabBytes = kDirectSlabBytes;  // one block's share of a direct call at most
  // The ll one-shot kernels (device::launchDirectLl): pieces of at most this many bytes, this
  // many ranks, this many blocks; each rank's ll inbox holds two parities of a call's lines from
  // every rank.
  static constexpr std::size_t kDirectLlBytes = 256 * 1024;
  static constexpr int kDirectLlRanks = 16;
  static constexpr int kDirectLlBlocks = 128;
  std::size_t directLlOffset() const;
  std::size_t directLlInboxBytes() const;

  std::size_t controlOffset(int channel, int peer) const;
  std::size_t dataOffset(int channel, int sender) const;
  std::size_t stagingOffset() const;
  std::size_t directOffset() const;
  std::size_t inboxBytes() const;
};

class CudaIpcTransport {
 public:
  // Collective over the bootstrap: allocates this rank's inbox on the current device, shares
  // it, and maps every peer's (ranks with this process's pid directly, others with CUDA IPC).
  // Every rank must run on this host.
  static Result<std::unique_ptr<CudaIpcTransport>> create(const CudaIpcGeometry& g,
                                                          boot::Bootstrap& bootstrap);
  ~CudaIpcTransport();
  CudaIpcTransport(const CudaIpcTransport&) = delete;
  CudaIpcTransport& operator=(const CudaIpcTransport&) = delete;

  const CudaIpcGeometry& geometry() const { return g_; }
  int device() const { return device_; }

  // Every rank's buffer `base` (device memory it allocated), as this rank reaches it: its own
  // directly, a peer in this process at its address, a peer in another process through CUDA
  // IPC (the allocation holding it, opened here, at the same offset). Collective over the
  // bootstrap; every rank passes its own buffer. Empty (on every rank alike) when some rank's
  // buffer is not GPU memory or cannot be mapped where it must be (a stream-ordered pool's,
  // a VMM allocation's): then nobody reads in place. close() undoes the IPC mappings.
  struct PeerBuffers {
    std::vector<std::byte*> at;          // by rank
    std::vector<std::byte*> allocation;  // by rank: what cudaIpcOpenMemHandle returned, or null
  };
  Result<PeerBuffers> mapPeerBuffers(const void* base, boot::Bootstrap& bootstrap) const;
  static void close(PeerBuffers& p);
  device::Endpoint to(int channel, int peer) const;
  device::Endpoint from(int channel, int peer) const;
  std::uint32_t* abortWord(int rank) const;
  // What `peer` has counted on its connection with this rank on `channel`: messages sent here
  // and received from here, as its kernels left them at their end (read from its inbox; for a
  // timeout's message, to tell a peer that never sent from one whose messages went astray).
  struct Counts {
    std::uint64_t sent = 0, received = 0;
  };
  Result<Counts> peerCounts(int channel, int peer) const;
  // One-shot: rank's per-block flags (64 bytes apart), this rank's per-block call counts, and
  // rank's slabs (block b, parity p at (2 b + p) * directSlabBytes).
  std::uint64_t* directFlags(int rank) const;
  std::uint64_t* directCounts() const;
  std::byte* directSlabs(int rank) const;
  // This rank's per-block call counts of the ll one-shot kernels (kDirectLlBlocks of them).
  std::uint64_t* llCounts() const;
  // rank's ll inbox (parity p, sender s at (p * nranks + s) * 2 * kDirectLlBytes); null past
  // kDirectLlRanks ranks.
  std::byte* directLl(int rank) const;
  // The most blocks each rank's kernel may have so that all the blocks of all the ranks sharing
  // each device are resident together (their kernels wait on each other).
  int residentChannels() const { return residentChannels_; }
  // Every rank of the communicator runs on this GPU (threads or processes sharing it).
  bool allOnThisDevice() const { return allOnThisDevice_; }
  // Ranks of this process (threads) on this GPU, this one included.
  int threadsOnThisDevice() const { return threadsOnThisDevice_; }
  // Some GPU runs more than one of the communicator's ranks (the same on every rank).
  bool someDeviceShared() const { return someDeviceShared_; }
  std::byte* staging() const {
    return inboxes_[static_cast<std::size_t>(g_.rank)] + g_.stagingOffset();
  }
  // "3 processes on GPU 0, 1 thread(s) ..." for the communicator's summary.
  std::string describe() const { return description_; }

 private:
  CudaIpcTransport() = default;
  CudaIpcGeometry g_;
  int device_ = -1;
  std::byte* own_ = nullptr;          // cudaMalloc'd
  std::vector<std::byte*> inboxes_;   // by rank, as mapped here
  std::vector<std::uint8_t> opened_;  // by rank: mapped with cudaIpcOpenMemHandle
  std::string description_;
  int residentChannels_ = 1;
  bool allOnThisDevice_ = false;
  int threadsOnThisDevice_ = 1;
  bool someDeviceShared_ = false;
};

// Runs `work` (which enqueues on the cudaStream_t it is given and returns a cudaError_t) and
// waits for it: on the legacy stream, which is no device-wide wait (ranks that are threads of
// this process may have kernels running on non-blocking streams) and takes no hardware queue of
// its own (every stream made takes the next, and thread ranks need their streams' queues
// apart); while a blocking stream is captured, which forbids the legacy stream, on a stream made
// for it. Returns the first error (a cudaError_t; 0: none).
int runWaited(const std::function<int(void*)>& work);

}  // namespace weft::transport
