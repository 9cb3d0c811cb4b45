#include "src/transport/connection.hpp"

#include <sched.h>

#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace weft::transport {

void Waiter::relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

void Waiter::yield() {
  sched_yield();
}

void Waiter::nap(int microseconds) {
  std::this_thread::sleep_for(std::chrono::microseconds(microseconds));
}

Status Waiter::check(const char* what, int peer, Clock::time_point start, int round,
                     log::ProgressClock& progress) const {
  if (watch_) watch_();  // may abort (a mismatched call): the check below then ends the wait
  if (aborted_ != nullptr && aborted_->load(std::memory_order_acquire) != 0) {
    // The setter wrote the reason before its release of the flag; this acquire sees it.
    const std::string why = reason_ != nullptr && reason_[0] != '\0' ? reason_ : "abort was called";
    return {Code::remoteError, "rank " + std::to_string(rank_) + ": " + what + " rank " +
                                   std::to_string(peer) +
                                   " stopped: the communicator was aborted (" + why + ")"};
  }
  // Asking the kernel about the peer costs a system call: every 64th nap (~10 ms) is enough.
  if (peerFailure_ && round % 64 == 63) {
    if (std::string failure = peerFailure_(peer); !failure.empty()) {
      return {Code::remoteError, "rank " + std::to_string(rank_) + ": " + what + " rank " +
                                     std::to_string(peer) + ": " + failure};
    }
  }
  const double limit = static_cast<double>(timeout_.count()) / 1000.0;
  if (round % 64 == 63 && progress.waited() <= limit && progress.due())
    WEFT_WARN(log::kColl,
              "rank %d: still %s rank %d: no progress for %.0f s, %.0f s left (WEFT_TIMEOUT_S)",
              rank_, what, peer, progress.waited(), limit - progress.waited());
  if (Clock::now() - start > timeout_) {
    return {Code::timeout,
            "rank " + std::to_string(rank_) + ": " + what + " rank " + std::to_string(peer) +
                ": no progress for " +
                std::to_string(static_cast<double>(timeout_.count()) / 1000.0).substr(0, 5) +
                " s (WEFT_TIMEOUT_S); the peer is stuck or far behind"};
  }
  return {};
}

Result<std::byte*> Connection::waitToAcquire(const Waiter& w, int peer) {
  std::byte* slot = nullptr;
  if (Status s = w.wait([&] { return (slot = tryAcquire()) != nullptr; }, "sending to", peer); !s)
    return s;
  return slot;
}

Result<std::span<const std::byte>> Connection::waitToReceive(const Waiter& w, int peer) {
  std::optional<std::span<const std::byte>> m;
  if (Status s = w.wait([&] { return (m = tryReceive()).has_value(); }, "receiving from", peer); !s)
    return s;
  return *m;
}

Status Connection::sendDirect(const std::byte*, std::size_t, const Waiter&) {
  return internalError("a direct message on a connection that does not carry them");
}

Status Connection::receiveDirect(std::byte*, std::size_t, const Waiter&) {
  return internalError("a direct message on a connection that does not carry them");
}

Status ReadRate::read(const PeerMemory& peer, void* to, std::uintptr_t from, std::size_t bytes) {
  bytesRead_.fetch_add(bytes, std::memory_order_relaxed);
  if (peer.local() || floorBytesPerUs_ <= 0) return peer.read(to, from, bytes);
  const auto start = std::chrono::steady_clock::now();
  Status s = peer.read(to, from, bytes);
  record(
      bytes,
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
  return s;
}

bool ReadRate::record(std::uint64_t bytes, double us) {
  if (floorBytesPerUs_ <= 0 || refuse_ == nullptr) return false;
  double rate = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    bytes_ += bytes;
    us_ += us;
    if (bytes_ < kWindowBytes) return false;
    rate = us_ > 0 ? static_cast<double>(bytes_) / us_ : floorBytesPerUs_;
    bytes_ = 0;
    us_ = 0;
    if (rate >= floorBytesPerUs_) {
      slowWindows_ = 0;
      return false;
    }
    if (++slowWindows_ < 2 || refuse_->load(std::memory_order_relaxed) != 0) return false;
    refuse_->store(1, std::memory_order_relaxed);
  }
  if (onRefuse_) onRefuse_(rate / 1e3);
  return true;
}

PeerMemory::PeerMemory(int pid) : pid_(pid), self_(pid == getpid()) {}

Status PeerMemory::read(void* to, std::uintptr_t from, std::size_t bytes) const {
  if (self_) {
    const void* src = reinterpret_cast<const void*>(from);
    takeOver(src);  // the sender's writes came before its reference
    std::memcpy(to, src, bytes);
    handOff(src);  // this read comes before the sender's next write, after its drain
    return {};
  }
  auto* out = static_cast<std::byte*>(to);
  while (bytes > 0) {
    // One call moves at most about 2 GiB (and may move less): loop until done.
    iovec local{out, bytes}, remote{reinterpret_cast<void*>(from), bytes};
    const ssize_t n = process_vm_readv(pid_, &local, 1, &remote, 1, 0);
    if (n <= 0) {
      return {Code::remoteError,
              "reading " + std::to_string(bytes) + " bytes of process " + std::to_string(pid_) +
                  " (process_vm_readv): " + (n == 0 ? "nothing read" : std::strerror(errno))};
    }
    out += n;
    from += static_cast<std::uintptr_t>(n);
    bytes -= static_cast<std::size_t>(n);
  }
  return {};
}

}  // namespace weft::transport
