// The shared-memory transport on its own: segments (memfds of mode 0600 named by their /proc
// path, unopenable once let go) and the FIFO contract every transport keeps (order, capacity,
// blocking, timeouts).
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <thread>

#include "src/transport/shm.hpp"

namespace weft::transport {
namespace {

// An inbox is a memfd, named by its /proc path: nothing in /dev/shm at any moment, mode 0600; a
// peer maps it through that path until the owner lets go of the descriptor.
TEST(ShmSegment, AMemfdPeersOpenThroughProcAndNothingInDevShm) {
  auto devShm = [] {
    int n = 0;
    if (DIR* d = opendir("/dev/shm")) {
      const std::string mine = "weft-" + std::to_string(getpid()) + "-";
      while (dirent* e = readdir(d)) n += std::string(e->d_name).rfind(mine, 0) == 0 ? 1 : 0;
      closedir(d);
    }
    return n;
  };
  auto a = ShmSegment::create(1 << 16);
  auto b = ShmSegment::create(1 << 16);
  ASSERT_TRUE(a.isOk()) << a.status().toString();
  ASSERT_TRUE(b.isOk());
  EXPECT_NE(a->name(), b->name());
  EXPECT_EQ(a->name().rfind("/proc/" + std::to_string(getpid()) + "/fd/", 0), 0u) << a->name();
  EXPECT_EQ(devShm(), 0);
  struct stat st {};
  ASSERT_EQ(stat(a->name().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  // A peer maps it by its path; once the owner lets go, the path is gone but the mappings work.
  auto peer = ShmSegment::open(a->name(), a->size());
  ASSERT_TRUE(peer.isOk()) << peer.status().toString();
  const std::string aname = a->name();
  a->unlink();
  EXPECT_FALSE(ShmSegment::open(aname, 1 << 16).isOk());
  std::memset(a->data(), 7, 16);
  EXPECT_EQ(peer->data()[15], std::byte{7});
  // Opening with the wrong size is an error, not a short mapping.
  EXPECT_FALSE(ShmSegment::open(b->name(), 4096).isOk());
  { ShmSegment gone = std::move(*b); }
  EXPECT_EQ(devShm(), 0);
}

struct Fifo {
  ShmGeometry g{2, 1, 4, 4096};
  ShmSegment seg = ShmSegment::create(g.inboxBytes()).value();
  std::atomic<int> aborted{0};
  Fifo() { initInbox(seg.data(), g); }
  ShmConnection end(int peer) { return ShmConnection(seg.data() + g.offset(0, 0), g, peer); }
  Waiter waiter(std::chrono::milliseconds timeout) {
    return Waiter(&aborted, "", nullptr, timeout, 0);
  }
};

TEST(ShmFifo, HoldsItsSlotsThenBlocks) {
  Fifo f;
  ShmConnection tx = f.end(1), rx = f.end(0);
  EXPECT_FALSE(rx.tryReceive().has_value());
  for (int i = 0; i < f.g.slots; ++i) {
    std::byte* slot = tx.tryAcquire();
    ASSERT_NE(slot, nullptr) << i;
    slot[0] = std::byte(i);
    tx.post(1);
  }
  EXPECT_EQ(tx.tryAcquire(), nullptr);  // full until the receiver releases one
  auto m = rx.tryReceive();
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->size(), 1u);
  EXPECT_EQ((*m)[0], std::byte{0});
  rx.release();
  EXPECT_NE(tx.tryAcquire(), nullptr);
}

TEST(ShmFifo, ThousandsOfMessagesInOrderAcrossThreads) {
  Fifo f;
  ShmConnection tx = f.end(1), rx = f.end(0);
  const Waiter w = f.waiter(std::chrono::seconds(20));
  constexpr int kMessages = 20000;
  std::thread producer([&] {
    for (int i = 0; i < kMessages; ++i) {
      auto slot = tx.acquire(w);
      ASSERT_TRUE(slot.isOk());
      const std::size_t n = 1 + static_cast<std::size_t>(i) % f.g.slotBytes;
      std::memset(*slot, i & 0xff, n);
      tx.post(n);
    }
  });
  for (int i = 0; i < kMessages; ++i) {
    auto m = rx.receive(w);
    ASSERT_TRUE(m.isOk());
    ASSERT_EQ(m->size(), 1 + static_cast<std::size_t>(i) % f.g.slotBytes);
    ASSERT_EQ(m->front(), std::byte(i & 0xff));
    ASSERT_EQ(m->back(), std::byte(i & 0xff));
    rx.release();
  }
  producer.join();
}

TEST(ShmFifo, AWaitWithoutProgressTimesOutOrStopsOnAbort) {
  Fifo f;
  ShmConnection rx = f.end(1);
  const auto start = std::chrono::steady_clock::now();
  auto m = rx.receive(f.waiter(std::chrono::milliseconds(200)));
  EXPECT_EQ(m.status().code(), Code::timeout);
  EXPECT_NE(m.status().message().find("receiving from rank 1"), std::string::npos)
      << m.status().message();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  f.aborted = 1;
  EXPECT_EQ(rx.receive(f.waiter(std::chrono::seconds(60))).status().code(), Code::remoteError);
}

TEST(PeerMemory, ReadsAnotherProcessOrSaysWhyNot) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  static std::uint64_t word = 0;
  word = 0x1234'5678'9abc'def0ull;
  const pid_t child = fork();
  if (child == 0) {
    char c;
    (void)!read(fds[0], &c, 1);  // lives until the parent has read
    _exit(0);
  }
  std::uint64_t seen = 0;
  const Status s =
      PeerMemory(child).read(&seen, reinterpret_cast<std::uintptr_t>(&word), sizeof seen);
  (void)!write(fds[1], "x", 1);
  waitpid(child, nullptr, 0);
  if (s.isOk()) {
    EXPECT_EQ(seen, word);
  } else {
    // Forbidden here (Yama, seccomp): the error says so, and the communicator uses the FIFO.
    EXPECT_NE(s.message().find("process_vm_readv"), std::string::npos) << s.message();
  }
  // A process that does not exist is an error, not a crash.
  const Status gone = PeerMemory(child).read(&seen, 4096, sizeof seen);
  EXPECT_FALSE(gone.isOk());
}

}  // namespace
}  // namespace weft::transport
