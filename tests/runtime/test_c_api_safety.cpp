// The C ABI never crashes its caller: a destroy racing calls on other threads waits for them,
// a thread or an allocation that cannot be had at any point of init or of a group becomes
// weftSystemError, with nothing left behind, and arguments out of range (all-to-all-v's counts
// and displacements, a group's queued calls, sizes) are refused before anything moves. Failures
// are injected by this binary's own pthread_create and operator new, which stand in for the C
// library's and libstdc++'s in the whole process (libweft.so included) and fail on demand.
#include <dirent.h>
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <new>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/runtime/fork.hpp"
#include "weft/weft.h"

// ---- failure injection ---------------------------------------------------------------------

namespace {
// The number of thread starts (allocations) from now on that succeed before one fails; negative:
// none fails. Each counts down once per start (allocation) and fails exactly one.
std::atomic<long> gThreadsLeft{-1};
std::atomic<long> gAllocsLeft{-1};
std::atomic<long> gThreadsMade{0};
std::atomic<long> gAllocsMade{0};

bool failNow(std::atomic<long>& left) {
  long v = left.load(std::memory_order_relaxed);
  while (v >= 0) {
    if (left.compare_exchange_weak(v, v - 1, std::memory_order_relaxed)) return v == 0;
  }
  return false;
}
}  // namespace

extern "C" int pthread_create(pthread_t* t, const pthread_attr_t* attr, void* (*fn)(void*),
                              void* arg) {
  using Real = int (*)(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*);
  static Real real = reinterpret_cast<Real>(dlsym(RTLD_NEXT, "pthread_create"));
  gThreadsMade.fetch_add(1, std::memory_order_relaxed);
  if (failNow(gThreadsLeft)) return EAGAIN;
  return real(t, attr, fn, arg);
}

// Every form of new and delete but the aligned ones, on malloc and free (so none of them pairs
// with the C++ runtime's, or a sanitizer's, own).
namespace {
void* allocate(std::size_t n, bool throws) {
  gAllocsMade.fetch_add(1, std::memory_order_relaxed);
  void* p = failNow(gAllocsLeft) ? nullptr : std::malloc(n == 0 ? 1 : n);
  if (p == nullptr && throws) throw std::bad_alloc();
  return p;
}
}  // namespace
void* operator new(std::size_t n) {
  return allocate(n, true);
}
void* operator new[](std::size_t n) {
  return allocate(n, true);
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  return allocate(n, false);
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  return allocate(n, false);
}
// GCC cannot see that these pair with the operator new above (malloc), not the default one.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete[](void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete(void* p, const std::nothrow_t&) noexcept {
  std::free(p);
}
void operator delete[](void* p, const std::nothrow_t&) noexcept {
  std::free(p);
}
#pragma GCC diagnostic pop

namespace {

// ---- helpers -------------------------------------------------------------------------------

// What this process's descriptors point at (the directory read's own included), sorted.
std::multiset<std::string> openFds() {
  std::multiset<std::string> out;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (dirent* e = readdir(d)) {
      char target[512] = {};
      const std::string path = std::string("/proc/self/fd/") + e->d_name;
      const ssize_t n = readlink(path.c_str(), target, sizeof target - 1);
      out.insert(n > 0 ? std::string(target, static_cast<std::size_t>(n)) : e->d_name);
    }
    closedir(d);
  }
  return out;
}

// This process's segments in /dev/shm (weft names them weft-<pid>-<random>).
std::set<std::string> shmOf(pid_t pid) {
  std::set<std::string> out;
  const std::string prefix = "weft-" + std::to_string(pid) + "-";
  for (const std::string& name : weft::test::shmNames()) {
    if (name.rfind(prefix, 0) == 0) out.insert(name);
  }
  return out;
}

// A short timeout: a rank whose init failed leaves its peers waiting for it that long.
struct ShortTimeout {
  ShortTimeout() { setenv("WEFT_TIMEOUT_S", "1", 1); }
  ~ShortTimeout() { unsetenv("WEFT_TIMEOUT_S"); }
};

// One all-reduce of n floats on every rank of comms, each rank on a thread of its own; true when
// every rank succeeded with the right sums.
bool allReduceWorks(const std::vector<weftComm_t>& comms) {
  const int n = static_cast<int>(comms.size());
  std::vector<int> ok(comms.size(), 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      std::vector<float> buf(1000, static_cast<float>(r + 1));
      const auto R = static_cast<std::size_t>(r);
      if (weftAllReduce(buf.data(), buf.data(), buf.size(), weftFloat32, weftSum, comms[R],
                        nullptr) != weftSuccess)
        return;
      bool right = true;
      for (float v : buf) right = right && v == static_cast<float>(n * (n + 1) / 2);
      ok[R] = right ? 1 : 0;
    });
  }
  for (std::thread& t : threads) t.join();
  return std::all_of(ok.begin(), ok.end(), [](int v) { return v == 1; });
}

void destroyAll(const std::vector<weftComm_t>& comms) {
  for (weftComm_t c : comms) EXPECT_EQ(weftCommDestroy(c), weftSuccess) << weftGetLastError();
}

// ---- destroy racing calls ------------------------------------------------------------------

// Two ranks all-reduce in a loop on threads of their own while the main thread destroys rank
// 0's communicator at a random moment, then aborts and destroys rank 1's: every call returns
// success with the right sums or an error (never a crash, never a wrong sum), and each destroy
// returns success.
TEST(CApiSafety, DestroyRacingCallsOnOtherThreads) {
  const char* env = std::getenv("WEFT_TEST_DESTROY_ROUNDS");
  const int rounds = env != nullptr ? std::atoi(env) : 1000;
  std::mt19937 rng(20261202);
  int raced = 0;
  for (int round = 0; round < rounds; ++round) {
    std::vector<weftComm_t> comms(2);
    ASSERT_EQ(weftCommInitAll(comms.data(), 2), weftSuccess) << weftGetLastError();
    std::atomic<int> wrong{0}, calls{0};
    std::atomic<bool> stop{false};
    auto loop = [&](int r) {
      std::vector<float> buf(64);
      while (!stop.load()) {
        std::fill(buf.begin(), buf.end(), static_cast<float>(r + 1));
        const weftResult_t res =
            weftAllReduce(buf.data(), buf.data(), buf.size(), weftFloat32, weftSum,
                          comms[static_cast<std::size_t>(r)], nullptr);
        if (res != weftSuccess) break;  // destroyed, aborted or timed out: the loop ends
        calls.fetch_add(1);
        for (float v : buf) wrong.fetch_add(v == 3.0f ? 0 : 1);
      }
    };
    std::thread t0(loop, 0), t1(loop, 1);
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 400));
    raced += calls.load() > 0 ? 1 : 0;
    EXPECT_EQ(weftCommDestroy(comms[0]), weftSuccess) << weftGetLastError();
    stop.store(true);
    EXPECT_EQ(weftCommAbort(comms[1]), weftSuccess) << weftGetLastError();
    t0.join();
    t1.join();
    EXPECT_EQ(weftCommDestroy(comms[1]), weftSuccess) << weftGetLastError();
    ASSERT_EQ(wrong.load(), 0) << "round " << round;
  }
  EXPECT_GT(raced, 0) << "no destroy came while calls were running";
  EXPECT_EQ(weftCommDestroy(nullptr), weftInvalidArgument);
}

// ---- thread starts that fail ---------------------------------------------------------------

// weftCommInitAll(4) with its k-th thread start failing, for every k until one makes none
// fail: each an error (systemError where the failing thread was its own, or a peer's timeout),
// never a crash; then it works, and no descriptor or segment is left.
TEST(CApiSafety, InitAllWithAThreadThatCannotStart) {
  ShortTimeout timeout;
  const auto fds = openFds();
  const auto segments = shmOf(getpid());
  int failed = 0;
  for (long k = 0;; ++k) {
    std::vector<weftComm_t> comms(4, nullptr);
    gThreadsLeft.store(k);
    const weftResult_t r = weftCommInitAll(comms.data(), 4);
    const bool injected = gThreadsLeft.exchange(-1) < 0;
    if (!injected) {
      ASSERT_EQ(r, weftSuccess) << weftGetLastError();
      EXPECT_TRUE(allReduceWorks(comms));
      destroyAll(comms);
      break;
    }
    ++failed;
    ASSERT_NE(r, weftSuccess) << "thread start " << k << " failed, yet init succeeded";
    EXPECT_TRUE(r == weftSystemError || r == weftTimeout || r == weftRemoteError)
        << "start " << k << ": " << weftGetErrorString(r) << ": " << weftGetLastError();
    if (k == 0) {  // the first of the rank threads: nothing ran
      EXPECT_EQ(r, weftSystemError);
      EXPECT_NE(std::string(weftGetLastError()).find("none ran"), std::string::npos)
          << weftGetLastError();
    }
    ASSERT_LT(k, 200) << "more thread starts than expected";
  }
  EXPECT_GE(failed, 4);
  EXPECT_EQ(openFds(), fds);
  EXPECT_EQ(shmOf(getpid()), segments);
}

// weftGroupEnd over four communicators, driven by one thread, with each of its threads failing
// to start in turn: weftSystemError, nothing run (the next group works and sums right).
TEST(CApiSafety, GroupEndWithAThreadThatCannotStart) {
  std::vector<weftComm_t> comms(4, nullptr);
  ASSERT_EQ(weftCommInitAll(comms.data(), 4), weftSuccess) << weftGetLastError();
  auto group = [&](long failAt, std::vector<std::vector<float>>& bufs) {
    bufs.assign(4, std::vector<float>(256));
    for (int r = 0; r < 4; ++r) {
      auto& b = bufs[static_cast<std::size_t>(r)];
      std::fill(b.begin(), b.end(), static_cast<float>(r + 1));
    }
    EXPECT_EQ(weftGroupStart(), weftSuccess);
    for (int r = 0; r < 4; ++r) {
      auto& b = bufs[static_cast<std::size_t>(r)];
      EXPECT_EQ(weftAllReduce(b.data(), b.data(), b.size(), weftFloat32, weftSum,
                              comms[static_cast<std::size_t>(r)], nullptr),
                weftSuccess);
    }
    gThreadsLeft.store(failAt);
    const weftResult_t res = weftGroupEnd();
    gThreadsLeft.store(-1);
    return res;
  };
  std::vector<std::vector<float>> bufs;
  for (long k = 0; k < 4; ++k) {
    EXPECT_EQ(group(k, bufs), weftSystemError) << "start " << k << ": " << weftGetLastError();
    EXPECT_NE(std::string(weftGetLastError()).find("none ran"), std::string::npos)
        << weftGetLastError();
    for (auto& b : bufs) {
      for (float v : b) ASSERT_NE(v, 10.0f) << "a call ran although the group failed";
    }
  }
  ASSERT_EQ(group(-1, bufs), weftSuccess) << weftGetLastError();
  for (auto& b : bufs) {
    for (float v : b) ASSERT_EQ(v, 10.0f);
  }
  destroyAll(comms);
}

// ---- allocations that fail -----------------------------------------------------------------

// weftCommInitAll(2) with its k-th allocation failing, for every one of init's allocations: each
// an error (the failing rank aborts its peers' bootstrap, so it comes at once), never a crash,
// nothing left behind; then it works.
TEST(CApiSafety, InitAllWithAnAllocationThatFails) {
  ShortTimeout timeout;
  const auto fds = openFds();
  const auto segments = shmOf(getpid());
  long total = 0;
  {
    std::vector<weftComm_t> comms(2, nullptr);
    const long before = gAllocsMade.load();
    ASSERT_EQ(weftCommInitAll(comms.data(), 2), weftSuccess) << weftGetLastError();
    total = gAllocsMade.load() - before;
    destroyAll(comms);
  }
  ASSERT_GT(total, 0);
  for (long k = 0; k < total; ++k) {
    std::vector<weftComm_t> comms(2, nullptr);
    gAllocsLeft.store(k);
    const weftResult_t r = weftCommInitAll(comms.data(), 2);
    const bool injected = gAllocsLeft.exchange(-1) < 0;
    if (!injected) {  // fewer allocations this time: it must have worked
      ASSERT_EQ(r, weftSuccess) << weftGetLastError();
      destroyAll(comms);
      continue;
    }
    ASSERT_NE(r, weftSuccess) << "allocation " << k << " of " << total << " failed, yet init "
                              << "succeeded";
    EXPECT_TRUE(r == weftSystemError || r == weftTimeout || r == weftRemoteError)
        << "allocation " << k << ": " << weftGetErrorString(r) << ": " << weftGetLastError();
    EXPECT_EQ(openFds(), fds) << "allocation " << k << " of " << total << ": "
                              << weftGetLastError();
    EXPECT_EQ(shmOf(getpid()), segments) << "allocation " << k << " of " << total;
  }
  std::vector<weftComm_t> comms(2, nullptr);
  ASSERT_EQ(weftCommInitAll(comms.data(), 2), weftSuccess) << weftGetLastError();
  EXPECT_TRUE(allReduceWorks(comms));
  destroyAll(comms);
  EXPECT_EQ(openFds(), fds);
  EXPECT_EQ(shmOf(getpid()), segments);
}

// weftHostAlloc and weftGetUniqueId with their first allocation failing: systemError.
TEST(CApiSafety, EntryPointsWithAnAllocationThatFails) {
  weftUniqueId id;
  gAllocsLeft.store(0);
  const weftResult_t r = weftGetUniqueId(&id);
  gAllocsLeft.store(-1);
  EXPECT_EQ(r, weftSystemError) << weftGetLastError();
  void* p = nullptr;
  gAllocsLeft.store(0);
  const weftResult_t a = weftHostAlloc(&p, 4096);
  gAllocsLeft.store(-1);
  EXPECT_TRUE(a == weftSystemError || a == weftSuccess) << weftGetLastError();
  if (a == weftSuccess) {
    EXPECT_EQ(weftHostFree(p), weftSuccess);
  }
}

// weftGetUniqueId's listeners are not a forked child's: with 64 ids made, a child forked after
// holds none of their sockets (the port closes when the root ends), and the ids still work in
// the parent.
TEST(CApiSafety, AForkedChildHoldsNoRendezvousListener) {
  auto sockets = [] {
    int n = 0;
    for (const std::string& target : openFds()) n += target.rfind("socket:", 0) == 0 ? 1 : 0;
    return n;
  };
  const int before = sockets();
  std::vector<weftUniqueId> ids(64);
  for (weftUniqueId& id : ids) ASSERT_EQ(weftGetUniqueId(&id), weftSuccess) << weftGetLastError();
  ASSERT_GE(sockets(), before + 64);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) _exit(sockets() == before ? 0 : 1);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child holds the parent's rendezvous listeners";
  // The last id still makes a communicator here: two ranks on threads.
  std::vector<weftComm_t> comms(2, nullptr);
  std::thread other([&] { (void)weftCommInitRank(&comms[1], 2, ids.back(), 1); });
  EXPECT_EQ(weftCommInitRank(&comms[0], 2, ids.back(), 0), weftSuccess) << weftGetLastError();
  other.join();
  ASSERT_NE(comms[1], nullptr);
  EXPECT_TRUE(allReduceWorks(comms));
  destroyAll(comms);
}

// ---- SIGKILL during init ---------------------------------------------------------------------

// A process making 4-rank communicators over and over, SIGKILLed at a random moment, 200 times:
// nothing of it stays in /dev/shm.
TEST(CApiSafety, ASigkillAtAnyMomentOfInitLeavesNothing) {
  WEFT_SKIP_UNDER_TSAN();
  std::mt19937 rng(20261202);
  int left = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      for (;;) {
        std::vector<weftComm_t> comms(4, nullptr);
        if (weftCommInitAll(comms.data(), 4) != weftSuccess) _exit(2);
        for (weftComm_t c : comms) (void)weftCommDestroy(c);
      }
    }
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 20000));
    kill(pid, SIGKILL);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFSIGNALED(status)) << "trial " << trial << ": the child exited by itself";
    left += static_cast<int>(shmOf(pid).size());
  }
  EXPECT_EQ(left, 0) << "segments left in /dev/shm by killed processes";
}

// Two processes joining one communicator over TCP, one SIGKILLed at a random moment of its init,
// 40 times: the survivor's init fails (or had finished) within its timeout and leaves it no more
// descriptors than it had and nothing in /dev/shm.
TEST(CApiSafety, ASigkilledPeerDuringInitLeavesTheSurvivorClean) {
  WEFT_SKIP_UNDER_TSAN();
  std::mt19937 rng(20261203);
  for (int trial = 0; trial < 40; ++trial) {
    int idPipe[2], readyPipe[2];
    ASSERT_EQ(pipe(idPipe), 0);
    ASSERT_EQ(pipe(readyPipe), 0);
    const pid_t survivor = fork();
    ASSERT_GE(survivor, 0);
    if (survivor == 0) {  // rank 0: makes the id, hands it over, joins, checks itself
      setenv("WEFT_TIMEOUT_S", "1", 1);
      close(idPipe[0]);
      close(readyPipe[0]);
      close(readyPipe[1]);
      const auto fds = openFds();
      weftUniqueId id;
      if (weftGetUniqueId(&id) != weftSuccess) _exit(3);
      if (write(idPipe[1], &id, sizeof id) != static_cast<ssize_t>(sizeof id)) _exit(3);
      close(idPipe[1]);
      weftComm_t comm = nullptr;
      const auto start = std::chrono::steady_clock::now();
      if (weftCommInitRank(&comm, 2, id, 0) == weftSuccess) (void)weftCommDestroy(comm);
      if (std::chrono::steady_clock::now() - start > std::chrono::seconds(3)) _exit(4);
      // The root thread ends once the rendezvous is over (or after its timeout), and its
      // descriptors with it: none may stay that was not there before (the id's pipe went).
      auto noneNew = [&] {
        const auto now = openFds();
        return std::includes(fds.begin(), fds.end(), now.begin(), now.end());
      };
      for (int i = 0; i < 100 && !noneNew(); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      if (!noneNew()) _exit(5);
      if (!shmOf(getpid()).empty()) _exit(6);
      _exit(0);
    }
    close(idPipe[1]);
    const pid_t victim = fork();
    ASSERT_GE(victim, 0);
    if (victim == 0) {  // rank 1: says when it has the id, then joins
      close(readyPipe[0]);
      weftUniqueId id;
      if (read(idPipe[0], &id, sizeof id) != static_cast<ssize_t>(sizeof id)) _exit(3);
      const char go = 1;
      if (write(readyPipe[1], &go, 1) != 1) _exit(3);
      weftComm_t comm = nullptr;
      if (weftCommInitRank(&comm, 2, id, 1) == weftSuccess) pause();
      _exit(1);
    }
    close(idPipe[0]);
    close(readyPipe[1]);
    char go = 0;
    EXPECT_EQ(read(readyPipe[0], &go, 1), 1);
    close(readyPipe[0]);
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 15000));
    kill(victim, SIGKILL);
    int status = 0;
    ASSERT_EQ(waitpid(victim, &status, 0), victim);
    ASSERT_EQ(waitpid(survivor, &status, 0), survivor);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0)
        << "trial " << trial << ": 4 too slow, 5 descriptors left, 6 segments left";
    EXPECT_TRUE(shmOf(victim).empty()) << "trial " << trial;
  }
}

// ---- a library in someone else's process ------------------------------------------------------

// No handler of libucs (UCX's) for the crash signals once weft is loaded and a communicator made,
// unless UCX_ERROR_SIGNALS asks for them: a caller's crash is the caller's to report.
TEST(CApiSafety, UcxInstallsNoSignalHandlersUnlessAskedTo) {
  if (std::getenv("UCX_ERROR_SIGNALS") != nullptr) GTEST_SKIP() << "UCX_ERROR_SIGNALS is set";
  std::vector<weftComm_t> comms(2, nullptr);
  ASSERT_EQ(weftCommInitAll(comms.data(), 2), weftSuccess) << weftGetLastError();
  for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE}) {
    struct sigaction sa {};
    ASSERT_EQ(sigaction(sig, nullptr, &sa), 0);
    void* handler = (sa.sa_flags & SA_SIGINFO) != 0 ? reinterpret_cast<void*>(sa.sa_sigaction)
                                                    : reinterpret_cast<void*>(sa.sa_handler);
    Dl_info info{};
    const std::string owner =
        handler != nullptr && dladdr(handler, &info) != 0 && info.dli_fname != nullptr
            ? info.dli_fname
            : "";
    EXPECT_EQ(owner.find("libucs"), std::string::npos) << "signal " << sig << ": " << owner;
  }
  destroyAll(comms);
}

// ---- arguments out of range ----------------------------------------------------------------

// Runs call(0) and call(1), the two ranks of a communicator, at once; their results.
std::vector<weftResult_t> onBoth(const std::function<weftResult_t(int)>& call) {
  std::vector<weftResult_t> out(2, weftSuccess);
  std::thread other([&] { out[1] = call(1); });
  out[0] = call(0);
  other.join();
  return out;
}

// All-to-all-v whose counts or displacements overflow, or whose buffer would run past the end of
// the address space: weftInvalidArgument on every rank, naming the argument, nothing written.
TEST(CApiArguments, AllToAllvCountsAndDisplacementsThatOverflow) {
  ShortTimeout timeout;
  std::vector<weftComm_t> comms(2, nullptr);
  ASSERT_EQ(weftCommInitAll(comms.data(), 2), weftSuccess) << weftGetLastError();
  struct Case {
    const char* what;
    std::size_t sendCount, sendDispl;  // rank 0's to rank 1 (and rank 1's to rank 0)
    std::size_t recvCount, recvDispl;
    bool wildSend;  // the send buffer at the top of the address space
    const char* names;
  };
  const std::size_t half = SIZE_MAX / 2;
  const Case cases[] = {
      {"a displacement of SIZE_MAX/2", 1, half, 1, 1, false, "senddispls[1]"},
      {"a receive displacement of SIZE_MAX/2", 1, 1, 1, half, false, "recvdispls[1]"},
      {"a displacement whose sum with its count wraps", 4, SIZE_MAX - 1, 4, 0, false,
       "senddispls[1]"},
      {"counts whose sum wraps", half + 1, 0, 1, 1, false, "sendcounts[1]"},
      {"a buffer past the end of the address space", 64, 0, 64, 0, true, "sendbuff"},
  };
  for (const Case& c : cases) {
    std::vector<std::vector<float>> recv(2, std::vector<float>(256, -7.0f));
    std::vector<std::vector<float>> send(2, std::vector<float>(256, 1.0f));
    std::vector<std::string> messages(2);
    const auto results = onBoth([&](int r) {
      const auto R = static_cast<std::size_t>(r);
      const std::size_t other = R ^ 1;
      std::size_t sc[2] = {0, 0}, sd[2] = {0, 0}, rc[2] = {0, 0}, rd[2] = {0, 0};
      sc[other] = c.sendCount;
      sd[other] = c.sendDispl;
      rc[other] = c.recvCount;
      rd[other] = c.recvDispl;
      const void* sb = c.wildSend ? reinterpret_cast<const void*>(UINTPTR_MAX - 15)
                                  : static_cast<const void*>(send[R].data());
      const weftResult_t res =
          weftAllToAllv(sb, sc, sd, recv[R].data(), rc, rd, weftFloat32, comms[R], nullptr);
      messages[R] = weftGetLastError();
      return res;
    });
    for (std::size_t r = 0; r < 2; ++r) {
      EXPECT_EQ(results[r], weftInvalidArgument) << c.what << ", rank " << r;
      const std::string want = c.names;
      // sendcounts[1] on rank 0 is sendcounts[0] on rank 1.
      std::string alt = want;
      if (auto at = alt.find("[1]"); at != std::string::npos) alt.replace(at, 3, "[0]");
      EXPECT_TRUE(messages[r].find(want) != std::string::npos ||
                  messages[r].find(alt) != std::string::npos)
          << c.what << ": " << messages[r];
      for (float v : recv[r]) ASSERT_EQ(v, -7.0f) << c.what << ": the call wrote";
    }
  }
  EXPECT_TRUE(allReduceWorks(comms));
  destroyAll(comms);
}

// In a group, a call's arguments are checked when it is queued: a bad root, an overflowing
// count and a NULL buffer are refused there, and weftGroupEnd runs what was queued.
TEST(CApiArguments, AGroupChecksEachCallWhenItIsQueued) {
  std::vector<weftComm_t> comms(2, nullptr);
  ASSERT_EQ(weftCommInitAll(comms.data(), 2), weftSuccess) << weftGetLastError();
  std::vector<std::vector<float>> bufs(2, std::vector<float>(100));
  std::vector<std::string> refused(2);
  const auto results = onBoth([&](int r) -> weftResult_t {
    const auto R = static_cast<std::size_t>(r);
    std::fill(bufs[R].begin(), bufs[R].end(), static_cast<float>(r + 1));
    float* b = bufs[R].data();
    if (weftGroupStart() != weftSuccess) return weftInternalError;
    if (weftBroadcast(b, b, 100, weftFloat32, 5, comms[R], nullptr) != weftInvalidArgument)
      refused[R] += "broadcast with root 5 was queued; ";
    else if (std::string(weftGetLastError()).find("root 5") == std::string::npos)
      refused[R] += std::string("broadcast: ") + weftGetLastError() + "; ";
    if (weftAllGather(b, b, SIZE_MAX / 2, weftFloat32, comms[R], nullptr) != weftInvalidArgument)
      refused[R] += "an all-gather of SIZE_MAX/2 was queued; ";
    if (weftAllReduce(b, nullptr, 100, weftFloat32, weftSum, comms[R], nullptr) !=
        weftInvalidArgument)
      refused[R] += "an all-reduce into NULL was queued; ";
    if (weftAllReduce(b, b, 100, weftFloat32, weftSum, comms[R], nullptr) != weftSuccess)
      refused[R] += "a good all-reduce was refused; ";
    return weftGroupEnd();
  });
  for (std::size_t r = 0; r < 2; ++r) {
    EXPECT_EQ(refused[r], "") << "rank " << r;
    EXPECT_EQ(results[r], weftSuccess) << "rank " << r;
    for (float v : bufs[r]) ASSERT_EQ(v, 3.0f) << "rank " << r;
  }
  destroyAll(comms);
}

// Sizes beyond what weft can hold: named, with the limit.
TEST(CApiArguments, RankCountsAndHostAllocationsBeyondTheLimits) {
  std::vector<weftComm_t> one(1, nullptr);
  EXPECT_EQ(weftCommInitAll(one.data(), INT_MAX), weftInvalidArgument);
  EXPECT_NE(std::string(weftGetLastError()).find("WEFT_MAX_RANKS"), std::string::npos)
      << weftGetLastError();
  EXPECT_EQ(one[0], nullptr);
  weftUniqueId id{};
  weftComm_t comm = nullptr;
  EXPECT_EQ(weftCommInitRank(&comm, INT_MAX, id, 0), weftInvalidArgument);
  EXPECT_NE(std::string(weftGetLastError()).find("WEFT_MAX_RANKS"), std::string::npos)
      << weftGetLastError();
  void* p = reinterpret_cast<void*>(0x1);
  EXPECT_EQ(weftHostAlloc(&p, SIZE_MAX), weftInvalidArgument);
  EXPECT_NE(std::string(weftGetLastError()).find("exceeds the largest allocation"),
            std::string::npos)
      << weftGetLastError();
  EXPECT_EQ(p, reinterpret_cast<void*>(0x1));
}

}  // namespace
