// The shared-memory FIFO (src/transport/shm.hpp) between two threads, as two ranks of one
// process use it: each rank owns an inbox holding the FIFO from the other, with the runtime's
// default geometry (Config: 4 slots of 128 KiB). Every message is copied into its slot by the
// sender and out of it by the receiver, as a send and a receive of the collectives do. Times are
// wall-clock: the CPU time of one side says nothing about a round trip.
//   shm/pingpong: one round trip per iteration (rank 0 sends, rank 1 copies it back).
//   shm/stream:   one message per iteration from rank 0 to a consuming rank 1; the last
//                 iteration waits until rank 1 has released everything.
#include <benchmark/benchmark.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "perf/bench/benchmarks.hpp"
#include "src/core/config.hpp"
#include "src/transport/shm.hpp"

namespace weft::bench {
namespace {

using transport::Connection;
using transport::ShmConnection;
using transport::ShmGeometry;
using transport::ShmSegment;
using transport::Waiter;

// Ranks 0 and 1 of one host, each with its inbox.
class TwoRanks {
 public:
  static Result<std::unique_ptr<TwoRanks>> create() {
    const Config defaults;
    ShmGeometry g;
    g.nranks = 2;
    g.channels = 1;
    g.slots = defaults.fifoSlots;
    g.slotBytes = defaults.fifoSlotBytes;
    auto inbox0 = ShmSegment::create(g.inboxBytes());
    if (!inbox0) return inbox0.status();
    auto inbox1 = ShmSegment::create(g.inboxBytes());
    if (!inbox1) return inbox1.status();
    transport::initInbox(inbox0->data(), g);
    transport::initInbox(inbox1->data(), g);
    return std::unique_ptr<TwoRanks>(new TwoRanks(g, std::move(*inbox0), std::move(*inbox1)));
  }

  std::size_t slotBytes() const { return geometry_.slotBytes; }
  // The FIFO from rank `from` to the other rank, as the sender and as the receiver use it.
  ShmConnection sender(int from) { return ShmConnection(fifo(from), geometry_, 1 - from); }
  ShmConnection receiver(int from) { return ShmConnection(fifo(from), geometry_, from); }
  // A wait fails after 60 s without progress, or at once after abort() (by either thread).
  Waiter waiter(int rank) const {
    return Waiter(&aborted_, "", nullptr, std::chrono::seconds(60), rank);
  }
  // release: the other thread's waiter sees it on its next check and returns an error.
  void abort() { aborted_.store(1, std::memory_order_release); }

 private:
  TwoRanks(const ShmGeometry& g, ShmSegment inbox0, ShmSegment inbox1)
      : geometry_(g), inboxes_{std::move(inbox0), std::move(inbox1)} {}
  // Rank `from`'s messages arrive in the other rank's inbox, at `from`'s offset.
  std::byte* fifo(int from) { return inboxes_[1 - from].data() + geometry_.offset(0, from); }

  ShmGeometry geometry_;
  std::array<ShmSegment, 2> inboxes_;
  std::atomic<int> aborted_{0};
};

// Waits for a free slot, copies `message` into it and posts it.
Status send(Connection& c, const Waiter& w, std::span<const std::byte> message) {
  Result<std::byte*> slot = c.acquire(w);
  if (!slot) return slot.status();
  std::memcpy(*slot, message.data(), message.size());
  c.post(message.size());
  return {};
}

// Waits for the next message, copies it to the front of `into` and releases its slot.
Status receive(Connection& c, const Waiter& w, std::span<std::byte> into) {
  Result<std::span<const std::byte>> message = c.receive(w);
  if (!message) return message.status();
  if (message->size() > into.size())
    return internalError("shm bench: a message larger than the receiver's buffer");
  std::memcpy(into.data(), message->data(), message->size());
  c.release();
  return {};
}

// Runs `rank1` on a thread while `rank0` runs the timed loop, and reports the first
// error of either. A failing side aborts, which ends the other's waits.
template <typename Rank0, typename Rank1>
void runTwoRanks(benchmark::State& state, Rank0 rank0, Rank1 rank1) {
  auto ranks = TwoRanks::create();
  if (!ranks) {
    state.SkipWithError(ranks.status().toString().c_str());
    return;
  }
  TwoRanks& r = **ranks;
  if (static_cast<std::size_t>(state.range(0)) > r.slotBytes()) {
    state.SkipWithError("message larger than a FIFO slot");
    return;
  }
  Status peerStatus;
  std::thread peer([&] {
    peerStatus = rank1(r);
    if (!peerStatus) r.abort();
  });
  Status status = rank0(r);
  if (!status) r.abort();
  peer.join();
  if (!status || !peerStatus)
    state.SkipWithError((!status ? status : peerStatus).toString().c_str());
}

void pingPongBenchmark(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const std::int64_t rounds = state.max_iterations;
  auto rank0 = [&](TwoRanks& r) -> Status {
    ShmConnection out = r.sender(0), in = r.receiver(1);
    const Waiter w = r.waiter(0);
    std::vector<std::byte> message(bytes, std::byte{1}), reply(bytes);
    for (auto _ : state) {
      if (Status s = send(out, w, message); !s) return s;
      if (Status s = receive(in, w, reply); !s) return s;
    }
    return {};
  };
  auto rank1 = [&](TwoRanks& r) -> Status {
    ShmConnection in = r.receiver(0), out = r.sender(1);
    const Waiter w = r.waiter(1);
    std::vector<std::byte> buffer(bytes);
    for (std::int64_t i = 0; i < rounds; ++i) {
      if (Status s = receive(in, w, buffer); !s) return s;
      if (Status s = send(out, w, buffer); !s) return s;
    }
    return {};
  };
  runTwoRanks(state, rank0, rank1);
}

void streamBenchmark(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const std::int64_t messages = state.max_iterations;
  auto rank0 = [&](TwoRanks& r) -> Status {
    ShmConnection out = r.sender(0);
    const Waiter w = r.waiter(0);
    const std::vector<std::byte> message(bytes, std::byte{1});
    std::int64_t left = messages;
    for (auto _ : state) {
      if (Status s = send(out, w, message); !s) return s;
      if (--left == 0) {
        // Inside the timed loop: the run ends when rank 1 has consumed the last message.
        if (Status s = w.wait([&] { return out.drained(); }, "draining to", 1); !s) return s;
      }
    }
    return {};
  };
  auto rank1 = [&](TwoRanks& r) -> Status {
    ShmConnection in = r.receiver(0);
    const Waiter w = r.waiter(1);
    std::vector<std::byte> buffer(bytes);
    for (std::int64_t i = 0; i < messages; ++i) {
      if (Status s = receive(in, w, buffer); !s) return s;
    }
    return {};
  };
  runTwoRanks(state, rank0, rank1);
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(bytes));
  state.SetItemsProcessed(state.iterations());
}

void registerShmFifo(const char* label, void (*run)(benchmark::State&)) {
  benchmark::RegisterBenchmark(label, run)
      ->ArgName("bytes")
      ->Arg(8)
      ->Arg(4 << 10)
      ->Arg(128 << 10)
      ->UseRealTime();
}

}  // namespace

void registerShmFifoBenchmarks() {
  registerShmFifo("shm/pingpong", pingPongBenchmark);
  registerShmFifo("shm/stream", streamBenchmark);
}

}  // namespace weft::bench
