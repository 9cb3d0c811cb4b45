// A Connection is a one-way channel between two ranks: a bounded FIFO of message slots. The
// sender fills the slot at its head and posts it; the receiver reads the slot at its tail and
// releases it. The schedule contract (docs/algorithms.md) needs room for two messages; the
// transports give more, which never adds a deadlock.
//
// Waiting is where faults surface, so every wait goes through a Waiter: it spins, then sleeps,
// and between naps asks whether the communicator was aborted, whether the peer is still alive,
// and whether the wait has gone on past the timeout without progress.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <span>
#include <string>

#include "src/core/log.hpp"
#include "weft/status.hpp"

namespace weft::transport {

class Waiter {
 public:
  using Clock = std::chrono::steady_clock;

  // `aborted` is the communicator's flag (set by abort(), or by a rank that saw a peer fail) and
  // `reason` the text its setter left beside it; `peerFailure(q)` is empty while rank q is
  // alive and reachable, else what happened to it ("its process has exited").
  Waiter(const std::atomic<int>* aborted, const char* reason,
         std::function<std::string(int)> peerFailure, std::chrono::milliseconds timeout, int rank)
      : aborted_(aborted),
        reason_(reason),
        peerFailure_(std::move(peerFailure)),
        timeout_(timeout),
        rank_(rank) {}

  // One pause of a spinning wait.
  static void relax();

  // Spin this long before the first nap, instead of kSpins pauses (~70 us on the H200 machine's
  // Xeon): for ranks that have a core for each of their threads, where a nap's oversleep (a
  // timer slack of 50 us and more under a hypervisor) costs more than the spin.
  void spinFor(std::chrono::microseconds spin) { spin_ = spin; }
  // Give the core away while spinning (sched_yield, at most kYields times, then the naps): for
  // ranks that outnumber the host's cores, whose peer may be waiting for this rank's core.
  void yieldWhileSpinning(bool yields) { yields_ = yields; }
  // Called at each nap of a wait that spun without success, from the waiting thread (any of the
  // communicator's): it may abort the communicator (a mismatched call), which ends the wait.
  void watchWith(std::function<void()> watch) { watch_ = std::move(watch); }

  // Returns once ready() holds, or the error that ended the wait. `what` and `peer` name it.
  template <typename Ready>
  Status wait(Ready&& ready, const char* what, int peer) const {
    if (spin_.count() > 0) {
      const Clock::time_point until = Clock::now() + spin_;
      for (int spin = 0;; ++spin) {
        if (ready()) return {};
        relax();
        if (spin % 64 == 63 && Clock::now() > until) break;
      }
    }
    for (int spin = 0, spins = yields_ ? kYields : kSpins; spin < spins; ++spin) {
      if (ready()) return {};
      if (yields_) {
        yield();
      } else {
        relax();
      }
    }
    const Clock::time_point start = Clock::now();
    int napUs = 1;
    log::ProgressClock progress(static_cast<double>(timeout_.count()) / 1000.0);
    for (int round = 0;; ++round) {
      if (ready()) return {};
      if (Status s = check(what, peer, start, round, progress); !s) return s;
      nap(napUs);
      napUs = napUs < kMaxNapUs ? napUs * 2 : kMaxNapUs;
    }
  }

  int rank() const { return rank_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

 private:
  static constexpr int kSpins = 4000;
  static constexpr int kYields = 200;
  static void yield();
  static constexpr int kMaxNapUs = 200;
  static void nap(int microseconds);
  // The wait's end (abort, a dead peer, the timeout), or nothing; says at WARN when `progress`
  // has a line due that the wait goes on.
  Status check(const char* what, int peer, Clock::time_point start, int round,
               log::ProgressClock& progress) const;

  std::chrono::microseconds spin_{0};
  bool yields_ = false;
  const std::atomic<int>* aborted_;
  const char* reason_;
  std::function<std::string(int)> peerFailure_;
  std::function<void()> watch_;
  std::chrono::milliseconds timeout_;
  int rank_;
};

// One direction between two ranks. Both ends see the same object shape; a rank only ever uses
// the sender half of its outgoing connections and the receiver half of its incoming ones.
class Connection {
 public:
  virtual ~Connection() = default;
  // Largest message a slot holds.
  virtual std::size_t slotBytes() const = 0;
  // Sender: waits for a free slot and returns it; post() publishes `bytes` of it.
  virtual Result<std::byte*> acquire(const Waiter& w) = 0;
  virtual void post(std::size_t bytes) = 0;
  // Receiver: waits for the next message; release() hands its slot back.
  virtual Result<std::span<const std::byte>> receive(const Waiter& w) = 0;
  virtual void release() = 0;
  // The same without waiting, for progress engines that drive many connections at once: a free
  // slot or nullptr; the next message or nothing.
  virtual std::byte* tryAcquire() = 0;
  virtual std::optional<std::span<const std::byte>> tryReceive() = 0;
  // Sender: whether the receiver has released every message posted so far.
  virtual bool drained() = 0;
  // Single copy: a message that names memory of the sender (which the receiver reads with
  // PeerMemory) instead of carrying bytes. Only shared-memory connections carry them.
  virtual void postReference(std::size_t bytes) { post(bytes); }
  // Receiver: whether the message last returned by receive/tryReceive is such a reference.
  virtual bool isReference() const { return false; }
  // Direct messages: a piece goes from the sender's buffer straight into the receiver's, through
  // no slot on either side (UCX between hosts: its rendezvous moves the bytes, one copy each way
  // in the kernel). They keep their own order, apart from the slots' messages.
  virtual bool direct() const { return false; }
  // Sender: starts sending `bytes` at `at`, which must stay as it is until drained().
  virtual Status sendDirect(const std::byte* at, std::size_t bytes, const Waiter& w);
  // Receiver: waits for the next direct message, exactly `bytes` long, and lands it at `at`.
  virtual Status receiveDirect(std::byte* at, std::size_t bytes, const Waiter& w);

 protected:
  // acquire() and receive() for a connection whose waits need nothing but tryAcquire() and
  // tryReceive(): the Waiter polls them.
  Result<std::byte*> waitToAcquire(const Waiter& w, int peer);
  Result<std::span<const std::byte>> waitToReceive(const Waiter& w, int peer);
};

// ThreadSanitizer cannot see that a FIFO orders the accesses of two threads of one process when
// each maps the FIFO at its own address. Where a single copy hands a buffer from one thread to
// another through a FIFO, both sides say so on the buffer's own address.
#if defined(__SANITIZE_THREAD__)
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
inline void handOff(const void* addr) {
  __tsan_release(const_cast<void*>(addr));
}
inline void takeOver(const void* addr) {
  __tsan_acquire(const_cast<void*>(addr));
}
#else
inline void handOff(const void*) {}
inline void takeOver(const void*) {}
#endif

// Reads another process's memory on this host (process_vm_readv: one copy, no FIFO), or this
// process's own when the peer is a thread of it.
class PeerMemory {
 public:
  PeerMemory() = default;
  explicit PeerMemory(int pid);
  // Copies `bytes` at the peer's address `from` to `to`.
  Status read(void* to, std::uintptr_t from, std::size_t bytes) const;
  // The peer is this process (a rank that is a thread of it): its addresses are this rank's.
  bool local() const { return self_; }

 private:
  int pid_ = 0;
  bool self_ = true;
};

// How fast this rank reads its peers' buffers (single copy), and the floor below which it asks
// them for bytes through the FIFO instead. Some hosts make those reads far dearer than the
// FIFO's two copies: on the 2-core CI VM (a guest whose page tables the hypervisor keeps),
// 128 KiB pieces deep in a 16 MB buffer read at 0.65 GB/s where the first MB read at 15, and a
// 2-rank all-gather of 1 MB took 798-808 us against the FIFO's 66-71 (docs/perf.md, "Single copy
// between processes"). Reads are counted
// in windows of kWindowBytes; two windows in a row below the floor raise `refuse` (the rank's
// flag in its control page, which senders read before naming a piece) for good. Every read of a
// peer's piece goes through read(), which also counts the bytes.
class ReadRate {
 public:
  static constexpr std::uint64_t kWindowBytes = 4u << 20;

  // `floorGBps` 0 never refuses.
  ReadRate(std::atomic<std::uint32_t>* refuse, double floorGBps)
      : refuse_(refuse), floorBytesPerUs_(floorGBps * 1e3) {}
  // Called once, with the slow window's rate in GB/s, when the rank starts refusing.
  void onRefuse(std::function<void(double)> f) { onRefuse_ = std::move(f); }
  // Reads `bytes` at the peer's address `from` into `to`, counting them, and timing the read
  // where the peer is another process.
  Status read(const PeerMemory& peer, void* to, std::uintptr_t from, std::size_t bytes);
  // The bytes read so far.
  std::uint64_t bytesRead() const { return bytesRead_.load(std::memory_order_relaxed); }
  // One read of `bytes` that took `us`; true when this read made the rank refuse.
  bool record(std::uint64_t bytes, double us);

 private:
  std::atomic<std::uint32_t>* refuse_;
  double floorBytesPerUs_;
  std::function<void(double)> onRefuse_;
  std::atomic<std::uint64_t> bytesRead_{0};
  std::mutex mutex_;
  std::uint64_t bytes_ = 0;
  double us_ = 0;
  int slowWindows_ = 0;
};

// Whether the rank whose control page holds `flag` (ShmControl::refusesReferences) refuses
// references; null: a peer that never reads by reference.
inline bool refusesReferences(const std::atomic<std::uint32_t>* flag) {
  return flag != nullptr && flag->load(std::memory_order_relaxed) != 0;
}

// A connection whose waits also drive something else: a rank whose channel mixes shared memory
// and UCX keeps that channel's UCX worker progressing while it waits on a shared-memory peer
// (a remote peer's rendezvous send to this rank moves only when this rank's worker does).
class ProgressingConnection final : public Connection {
 public:
  ProgressingConnection(Connection* inner, int peer, std::function<void()> progress)
      : inner_(inner), peer_(peer), progress_(std::move(progress)) {}
  std::size_t slotBytes() const override { return inner_->slotBytes(); }
  Result<std::byte*> acquire(const Waiter& w) override { return waitToAcquire(w, peer_); }
  void post(std::size_t bytes) override { inner_->post(bytes); }
  Result<std::span<const std::byte>> receive(const Waiter& w) override {
    return waitToReceive(w, peer_);
  }
  void release() override { inner_->release(); }
  std::byte* tryAcquire() override {
    progress_();
    return inner_->tryAcquire();
  }
  std::optional<std::span<const std::byte>> tryReceive() override {
    progress_();
    return inner_->tryReceive();
  }
  bool drained() override {
    progress_();
    return inner_->drained();
  }
  void postReference(std::size_t bytes) override { inner_->postReference(bytes); }
  bool isReference() const override { return inner_->isReference(); }
  bool direct() const override { return inner_->direct(); }
  Status sendDirect(const std::byte* at, std::size_t bytes, const Waiter& w) override {
    return inner_->sendDirect(at, bytes, w);
  }
  Status receiveDirect(std::byte* at, std::size_t bytes, const Waiter& w) override {
    return inner_->receiveDirect(at, bytes, w);
  }

 private:
  Connection* inner_;
  int peer_;
  std::function<void()> progress_;
};

}  // namespace weft::transport
