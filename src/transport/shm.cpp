#include "src/transport/shm.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>

#include "src/core/sizes.hpp"

namespace weft::transport {
namespace {

constexpr std::size_t kCacheLine = 64;
constexpr std::size_t kControlBytes = 4096;
// The control page and the small slots, before the FIFOs.
constexpr std::size_t kHeadBytes = kControlBytes + roundUp(2 * sizeof(ShmSmallSlot), 4096);
constexpr std::uint64_t kReferenceBit = std::uint64_t{1} << 63;  // in a slot's size

Status sysError(const std::string& what) {
  return {Code::systemError, what + ": " + std::strerror(errno)};
}

}  // namespace

struct ShmConnection::Header {
  alignas(kCacheLine) std::atomic<std::uint64_t> head;  // sender's; release on post
  alignas(kCacheLine) std::atomic<std::uint64_t> tail;  // receiver's; release on release()
  alignas(kCacheLine) std::uint64_t sizes[64];          // bytes of the message in each slot
  alignas(kCacheLine) PostedOps posted;                 // channel 0's: WEFT_CHECK_CALLS
};

static_assert(sizeof(ShmControl) <= kControlBytes);

std::size_t ShmGeometry::connectionBytes() const {
  return roundUp(sizeof(ShmConnection::Header) + static_cast<std::size_t>(slots) * slotBytes,
                 kCacheLine);
}

std::size_t ShmGeometry::inboxBytes() const {
  if (!fifos) return kHeadBytes;
  return kHeadBytes +
         static_cast<std::size_t>(channels) * static_cast<std::size_t>(nranks) * connectionBytes() +
         roundUp(stageBytes, 4096);
}

std::size_t ShmGeometry::offset(int channel, int from) const {
  return kHeadBytes + (static_cast<std::size_t>(channel) * static_cast<std::size_t>(nranks) +
                       static_cast<std::size_t>(from)) *
                          connectionBytes();
}

Result<ShmSegment> ShmSegment::create(std::size_t bytes) {
  // Anonymous memory that peers open through /proc/<pid>/fd/<fd> while this process holds the
  // descriptor: no name in /dev/shm, so a SIGKILL at any moment leaves nothing behind. Where
  // memfd_create is missing, a randomly named segment, unlinked once every peer mapped it.
  {
    ShmSegment s;
    s.name_.reserve(64);  // allocates: before anything is created
    const int fd = memfd_create("weft-inbox", MFD_CLOEXEC);
    if (fd >= 0) {
      s.fd_ = fd;
      s.linked_ = true;
      char path[64];
      std::snprintf(path, sizeof path, "/proc/%d/fd/%d", getpid(), fd);
      s.name_ = path;  // fits the reserved capacity: no allocation
      if (fchmod(fd, S_IRUSR | S_IWUSR) != 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0)
        return sysError("shm: sizing an inbox of " + std::to_string(bytes) + " bytes");
      void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (p == MAP_FAILED) return sysError("shm: mmap of an inbox");
      s.data_ = static_cast<std::byte*>(p);
      s.size_ = bytes;
      return s;
    }
    if (errno != ENOSYS && errno != EINVAL) return sysError("shm: memfd_create");
  }
  unsigned char random[8];
  if (getrandom(random, sizeof random, 0) != static_cast<ssize_t>(sizeof random))
    return sysError("shm: getrandom");
  char name[64];
  std::snprintf(name, sizeof name, "/weft-%d-%02x%02x%02x%02x%02x%02x%02x%02x", getpid(), random[0],
                random[1], random[2], random[3], random[4], random[5], random[6], random[7]);
  ShmSegment s;
  s.name_ = name;  // allocates: before the segment exists, so a throw leaves none behind
  const int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, S_IRUSR | S_IWUSR);
  if (fd < 0) return sysError(std::string("shm: shm_open(") + name + ")");
  s.linked_ = true;
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const Status err = sysError("shm: ftruncate " + s.name_ + " to " + std::to_string(bytes) +
                                " bytes (is /dev/shm large enough?)");
    close(fd);
    return err;  // s unlinks the name
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return sysError("shm: mmap " + s.name_);
  s.data_ = static_cast<std::byte*>(p);
  s.size_ = bytes;
  return s;
}

Result<ShmSegment> ShmSegment::open(const std::string& name, std::size_t bytes) {
  ShmSegment s;
  s.name_ = name;  // allocates: before anything is opened or mapped
  // A peer's descriptor through /proc (its memfd), or a name in /dev/shm.
  const bool viaProc = name.rfind("/proc/", 0) == 0;
  const int fd = viaProc ? ::open(name.c_str(), O_RDWR | O_CLOEXEC)
                         : shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0)
    return sysError("shm: opening " + name + ", a peer's inbox" +
                    (viaProc ? " (its process must be alive, of this user, and readable through "
                               "/proc)"
                             : ""));
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<std::size_t>(st.st_size) != bytes) {
    close(fd);
    return Status(Code::internalError, "shm: " + name + " is not the size this rank expects (" +
                                           std::to_string(bytes) +
                                           " bytes): ranks disagree on the geometry");
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return sysError("shm: mmap " + name);
  s.data_ = static_cast<std::byte*>(p);
  s.size_ = bytes;
  return s;
}

ShmSegment::ShmSegment(ShmSegment&& o) noexcept {
  *this = std::move(o);
}

ShmSegment& ShmSegment::operator=(ShmSegment&& o) noexcept {
  if (this != &o) {
    this->~ShmSegment();
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    name_ = std::move(o.name_);
    linked_ = std::exchange(o.linked_, false);
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}

ShmSegment::~ShmSegment() {
  unlink();
  if (data_ != nullptr) munmap(data_, size_);
  data_ = nullptr;
}

void ShmSegment::unlink() {
  if (linked_ && fd_ < 0) shm_unlink(name_.c_str());
  if (fd_ >= 0) close(fd_);  // a memfd: peers can no longer open it
  fd_ = -1;
  linked_ = false;
}

void initInbox(std::byte* inbox, const ShmGeometry& g) {
  ShmControl* c = new (inbox) ShmControl{};
  c->aborted.store(0, std::memory_order_relaxed);
  c->claimed.store(0, std::memory_order_relaxed);
  c->directArrived.store(0, std::memory_order_relaxed);
  c->refusesReferences.store(0, std::memory_order_relaxed);
  for (int i = 0; i < 2; ++i) new (inbox + kControlBytes + i * sizeof(ShmSmallSlot)) ShmSmallSlot{};
  c->pid = getpid();
  for (int ch = 0; g.fifos && ch < g.channels; ++ch) {
    for (int q = 0; q < g.nranks; ++q) new (inbox + g.offset(ch, q)) ShmConnection::Header{};
  }
  // No fence needed: peers learn the segment's name only through the bootstrap, whose exchange
  // (a socket or a mutex) orders these writes before their first access.
}

ShmControl* controlOf(std::byte* inbox) {
  return std::launder(reinterpret_cast<ShmControl*>(inbox));
}

ShmSmallSlot* smallSlotsOf(std::byte* inbox) {
  return std::launder(reinterpret_cast<ShmSmallSlot*>(inbox + kControlBytes));
}

PostedOps* postedOpsOf(std::byte* inbox, const ShmGeometry& g, int from) {
  auto* h = std::launder(reinterpret_cast<ShmConnection::Header*>(inbox + g.offset(0, from)));
  return &h->posted;
}

ShmConnection::ShmConnection(std::byte* base, const ShmGeometry& g, int peer)
    : header_(std::launder(reinterpret_cast<Header*>(base))),
      slots_(base + sizeof(Header)),
      nslots_(g.slots),
      slotBytes_(g.slotBytes),
      peer_(peer) {}

std::byte* ShmConnection::tryAcquire() {
  // acquire: the receiver's reads of the slot happen before this rank overwrites it.
  if (next_ - header_->tail.load(std::memory_order_acquire) >= static_cast<std::uint64_t>(nslots_))
    return nullptr;
  return slots_ + (next_ % static_cast<std::uint64_t>(nslots_)) * slotBytes_;
}

Result<std::byte*> ShmConnection::acquire(const Waiter& w) {
  return waitToAcquire(w, peer_);
}

void ShmConnection::postReference(std::size_t bytes) {
  post(bytes | kReferenceBit);
}

void ShmConnection::post(std::size_t bytes) {
  header_->sizes[next_ % static_cast<std::uint64_t>(nslots_)] = bytes;
  ++next_;
  // release: the slot's bytes and size are visible to the receiver's acquire of head.
  header_->head.store(next_, std::memory_order_release);
}

std::optional<std::span<const std::byte>> ShmConnection::tryReceive() {
  // acquire: pairs with post()'s release, so the slot's bytes are complete.
  if (header_->head.load(std::memory_order_acquire) <= next_) return std::nullopt;
  const std::uint64_t slot = next_ % static_cast<std::uint64_t>(nslots_);
  const std::uint64_t size = header_->sizes[slot];
  reference_ = (size & kReferenceBit) != 0;
  return std::span<const std::byte>(slots_ + slot * slotBytes_, size & ~kReferenceBit);
}

Result<std::span<const std::byte>> ShmConnection::receive(const Waiter& w) {
  return waitToReceive(w, peer_);
}

void ShmConnection::release() {
  ++next_;
  // release: this rank's reads of the slot complete before the sender may reuse it.
  header_->tail.store(next_, std::memory_order_release);
}

bool ShmConnection::drained() {
  return header_->tail.load(std::memory_order_acquire) == next_;
}

void raiseAbort(std::byte* inbox, const std::string& why) {
  ShmControl* c = controlOf(inbox);
  int expected = 0;
  if (c->claimed.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
    std::snprintf(c->reason, sizeof c->reason, "%s", why.c_str());
    c->aborted.store(1, std::memory_order_release);
  }
}

}  // namespace weft::transport
