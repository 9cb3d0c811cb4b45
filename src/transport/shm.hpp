// Shared-memory transport between the ranks of one host, processes or threads alike.
//
// Every rank owns an inbox: one shared-memory segment holding a control page and the FIFOs of
// every connection into it (one per channel and sender). The segment is a memfd of mode 0600;
// its /proc/<pid>/fd path goes to the peers through the bootstrap, every peer maps it, and after
// a barrier its owner closes the descriptor. It never has a name in /dev/shm, so a process
// killed at any moment leaves nothing there. (Without memfd_create: a POSIX segment under an
// unguessable name, unlinked after that barrier.)
//
// A FIFO is a head counter (messages posted, written by the sender), a tail counter (messages
// consumed, written by the receiver), each on its own cache line, and kSlots slots. The sender
// writes a slot, then publishes it with a release store of head; the receiver's acquire load of
// head makes the slot's bytes visible. The receiver hands the slot back with a release store of
// tail; the sender's acquire load of tail orders its next write after the receiver's reads.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "src/transport/connection.hpp"
#include "src/transport/host_alloc.hpp"

namespace weft::transport {

// The first page of every inbox.
// One collective a rank made, as it posts it for its peers to compare (WEFT_CHECK_CALLS,
// src/core/call_check.cpp): a seqlock, `seq` the call's number (0 while being rewritten).
struct PostedCall {
  std::atomic<std::uint64_t> seq;
  std::atomic<std::uint32_t> coll, type, op;
  std::atomic<std::int32_t> root;
  std::atomic<std::uint32_t> gpu;  // 1: on GPU memory
  std::atomic<std::uint64_t> count;
};
// Calls kept: a peer more calls ahead than this is past comparing.
constexpr std::size_t kPostedCalls = 64;

// One send or receive a rank made with the inbox's owner (WEFT_CHECK_CALLS): its number among
// that rank's operations of that direction with the owner, and its bytes. A seqlock, in the
// header of channel 0's FIFO from that rank (postedOpsOf).
struct PostedOp {
  std::atomic<std::uint64_t> seq;
  std::atomic<std::uint64_t> bytes;
};
constexpr std::size_t kPostedOps = 16;
struct PostedOps {
  PostedOp sends[kPostedOps];  // the sender's sends to the owner
  PostedOp recvs[kPostedOps];  // the sender's receives from the owner
};

struct ShmControl {
  std::atomic<int> aborted;  // any rank may set it in any inbox: the owner stops waiting
  std::atomic<int> claimed;  // the first aborter takes it, writes `reason`, then sets `aborted`
  std::int32_t pid;
  char reason[256];  // why, for the message of the owner's error
  // The direct path (src/exec/host_direct.hpp): the barriers this rank has reached, and the
  // buffers of its current call, written before the first of the call's barriers.
  alignas(64) std::atomic<std::uint64_t> directArrived;
  std::uint64_t directInput, directOutput;
  // Between processes: where the call's input and output lie in weftHostAlloc memory (id 0:
  // elsewhere), by the parity of the call (a peer may still read the last call's while this
  // rank writes the next's), and whether this rank mapped every peer's
  // (src/transport/host_alloc.hpp). Lines of their own: peers poll directArrived meanwhile.
  alignas(64) HostRef directRefs[2][2];
  std::uint32_t directViews;
  // Nonzero once this rank's reads of its peers' buffers ran too slow (transport::ReadRate):
  // its peers send it bytes through the FIFO instead of naming their pieces.
  alignas(64) std::atomic<std::uint32_t> refusesReferences;
  // This rank's last collectives (host and GPU), by number modulo kPostedCalls.
  alignas(64) PostedCall calls[kPostedCalls];
};

// After the control page, two of these: a small call's input, published whole (the slots path).
constexpr std::size_t kShmSmallSlotBytes = 8192;
struct ShmSmallSlot {
  alignas(64) std::atomic<std::uint64_t> call;     // the call whose input `data` holds
  alignas(64) std::atomic<std::uint64_t> reduced;  // two-shot: the call whose piece is summed
  alignas(64) std::byte data[kShmSmallSlotBytes];
};

struct ShmGeometry {
  int nranks = 1;
  int channels = 1;
  int slots = 4;
  std::size_t slotBytes = 64 * 1024;
  // False for an inbox of a rank whose peers all use another transport: the control page and
  // the small slots only.
  bool fifos = true;
  // The direct path's stage at the inbox's end (src/exec/host_direct.hpp); 0: none.
  std::size_t stageBytes = 0;

  std::size_t connectionBytes() const;
  std::size_t inboxBytes() const;
  std::size_t stageOffset() const { return inboxBytes() - stageBytes; }
  // Offset of the FIFO from `from` on `channel` inside the receiver's inbox.
  std::size_t offset(int channel, int from) const;
};

// One mapping of a segment; unmaps (and, for the owner until released, unlinks) on destruction.
class ShmSegment {
 public:
  // Creates a fresh segment of `bytes` (zero-filled), mode 0600: a memfd whose name is its
  // /proc/<pid>/fd path (nothing in /dev/shm), or where there is no memfd a random name.
  static Result<ShmSegment> create(std::size_t bytes);
  // Maps a peer's segment by name (a /proc path or a /dev/shm name).
  static Result<ShmSegment> open(const std::string& name, std::size_t bytes);

  ShmSegment() = default;
  ShmSegment(ShmSegment&& o) noexcept;
  ShmSegment& operator=(ShmSegment&& o) noexcept;
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;
  ~ShmSegment();

  // Removes the name, or closes the memfd peers open (the mapping stays). Idempotent.
  void unlink();
  std::byte* data() const { return data_; }
  std::size_t size() const { return size_; }
  const std::string& name() const { return name_; }

 private:
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  std::string name_;
  bool linked_ = false;
  int fd_ = -1;  // a memfd's descriptor, held while peers may open it
};

// The FIFO at `base` (inside some rank's inbox), used from one side.
class ShmConnection final : public Connection {
 public:
  ShmConnection(std::byte* base, const ShmGeometry& g, int peer);
  std::size_t slotBytes() const override { return slotBytes_; }
  Result<std::byte*> acquire(const Waiter& w) override;
  void post(std::size_t bytes) override;
  Result<std::span<const std::byte>> receive(const Waiter& w) override;
  void release() override;
  std::byte* tryAcquire() override;
  std::optional<std::span<const std::byte>> tryReceive() override;
  bool drained() override;
  void postReference(std::size_t bytes) override;
  bool isReference() const override { return reference_; }

  struct Header;  // in shared memory; laid out in shm.cpp

 private:
  Header* header_;
  std::byte* slots_;
  int nslots_;
  std::size_t slotBytes_;
  int peer_;
  std::uint64_t next_ = 0;  // sender: messages posted so far; receiver: consumed so far
  bool reference_ = false;  // receiver: the current message is a reference
};

// Zeroes a fresh inbox's FIFOs and writes its control page.
void initInbox(std::byte* inbox, const ShmGeometry& g);
ShmControl* controlOf(std::byte* inbox);
// Aborts the rank whose inbox this is: the first to claim its flag writes the reason, then
// publishes it with a release store (a waiter's acquire load of the flag sees the text).
void raiseAbort(std::byte* inbox, const std::string& why);
// The inbox's two small slots.
ShmSmallSlot* smallSlotsOf(std::byte* inbox);
// What rank `from` posted of its sends and receives with the inbox's owner (an inbox with
// FIFOs only).
PostedOps* postedOpsOf(std::byte* inbox, const ShmGeometry& g, int from);

}  // namespace weft::transport
