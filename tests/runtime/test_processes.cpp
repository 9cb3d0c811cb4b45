// The same collectives with every rank its own process: the parent makes the unique id (its root
// listener lives here), forks the ranks, and each child joins with weftCommInitRank. Children
// report through their exit status; the parent never waits forever. Also: a rank killed with
// SIGKILL mid-job turns into an error on every survivor, and nothing is left in /dev/shm.
#include <arpa/inet.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>

#include "src/core/communicator.hpp"
#include "tests/runtime/fork.hpp"
#include "tests/runtime/harness.hpp"

namespace weft::test {
namespace {

// All-reduce, all-gather, reduce-scatter, broadcast, reduce and all-to-all with checked results
// for a few types and sizes; 0 when every check passed.
int everyCollective(int r, Comm& comm) {
  const int n = comm.size();
  int bad = 0;
  for (std::size_t count : {0ul, 7ul, 65537ul}) {
    for (DataType type : {DataType::f32, DataType::bf16, DataType::i32}) {
      // Inputs are a function of (rank, index), so each rank knows everyone's.
      auto value = [&](int q, std::size_t i) {
        return static_cast<double>((static_cast<int>(i % 13) + q * 3) % 11 - 5);
      };
      std::vector<std::byte> in(count * static_cast<std::size_t>(n) * sizeOf(type));
      for (std::size_t i = 0; i < count * static_cast<std::size_t>(n); ++i)
        store(in, i, type, value(r, i));
      auto out = poisoned(count * static_cast<std::size_t>(n) * sizeOf(type));
      auto check = [&](const char* what, std::size_t elems, auto expected) {
        for (std::size_t i = 0; i < elems; ++i) {
          if (load(out, i, type) != expected(i)) {
            std::fprintf(stderr, "rank %d %s %s count %zu element %zu: %g != %g\n", r, what,
                         std::string(name(type)).c_str(), count, i, load(out, i, type),
                         expected(i));
            ++bad;
            return;
          }
        }
      };
      auto sumOf = [&](std::size_t i) {
        double s = 0;
        for (int q = 0; q < n; ++q) s += value(q, i);
        return s;
      };
      if (!comm.allReduce(in.data(), out.data(), count, type, RedOp::sum)) ++bad;
      check("allreduce", count, sumOf);
      if (!comm.allGather(in.data(), out.data(), count, type)) ++bad;
      check("allgather", count * static_cast<std::size_t>(n),
            [&](std::size_t i) { return value(static_cast<int>(i / count), i % count); });
      if (!comm.reduceScatter(in.data(), out.data(), count, type, RedOp::sum)) ++bad;
      check("reducescatter", count,
            [&](std::size_t i) { return sumOf(static_cast<std::size_t>(r) * count + i); });
      if (!comm.broadcast(in.data(), out.data(), count, type, n - 1)) ++bad;
      check("broadcast", count, [&](std::size_t i) { return value(n - 1, i); });
      out = poisoned(out.size());
      if (!comm.reduce(in.data(), out.data(), count, type, RedOp::max, 0)) ++bad;
      if (r == 0) {
        check("reduce", count, [&](std::size_t i) {
          double m = value(0, i);
          for (int q = 1; q < n; ++q) m = std::max(m, value(q, i));
          return m;
        });
      }
      if (!comm.allToAll(in.data(), out.data(), count, type)) ++bad;
      check("alltoall", count * static_cast<std::size_t>(n), [&](std::size_t i) {
        return value(static_cast<int>(i / count), static_cast<std::size_t>(r) * count + i % count);
      });
    }
  }
  return bad == 0 ? 0 : 1;
}

// The threads' matrix run by rank r of n, this process, checking its own outputs; 0 when all
// passed.
int matrixAsRank(int n, int r, Comm& comm) {
  std::vector<Comm> mine;
  mine.push_back(std::move(comm));
  const std::vector<std::string> failures = runMatrix(mine, n, r);
  for (const std::string& f : failures) std::fprintf(stderr, "rank %d: %s\n", r, f.c_str());
  comm = std::move(mine.front());
  return failures.empty() ? 0 : 1;
}

class Processes : public ::testing::TestWithParam<int> {};

TEST_P(Processes, EveryCollectiveAndNoSegmentLeft) {
  WEFT_SKIP_UNDER_TSAN();
  std::vector<pid_t> pids;
  const std::vector<int> codes = forkRanks(GetParam(), everyCollective, &pids);
  for (std::size_t r = 0; r < codes.size(); ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
  EXPECT_EQ(segmentsOf(pids), 0);
}

// The same matrix as the threads' (every collective x dtype x op x size x placement), each rank
// its own process checking its own output against the double-precision reference.
TEST_P(Processes, EveryCollectiveTypeOpAndSize) {
  WEFT_SKIP_UNDER_TSAN();
  const int n = GetParam();
  std::vector<pid_t> pids;
  const std::vector<int> codes = forkRanks(
      n, [n](int r, Comm& comm) { return matrixAsRank(n, r, comm); }, &pids,
      std::chrono::seconds(300));
  for (std::size_t r = 0; r < codes.size(); ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
  EXPECT_EQ(segmentsOf(pids), 0);
}

// Forks n ranks whose every call the direct path serves takes it (WEFT_HOST_DIRECT=1,
// WEFT_HOST_DIRECT_BYTES=1; not the slots either).
std::vector<int> forkOnTheDirectPath(int n, const std::function<int(int, Comm&)>& body,
                                     std::vector<pid_t>* pids,
                                     std::chrono::seconds limit = std::chrono::seconds(60)) {
  setenv("WEFT_HOST_DIRECT", "1", 1);
  setenv("WEFT_HOST_DIRECT_BYTES", "1", 1);
  setenv("WEFT_HOST_SMALL_BYTES", "0", 1);
  std::vector<int> codes = forkRanks(n, body, pids, limit);
  unsetenv("WEFT_HOST_SMALL_BYTES");
  unsetenv("WEFT_HOST_DIRECT_BYTES");
  unsetenv("WEFT_HOST_DIRECT");
  return codes;
}

// The direct path between processes (through the stages), the path of every call it serves; and
// a rank killed while its peers wait in its barriers (below).
TEST(ProcessDirect, EveryCollectiveThroughPeersMemory) {
  WEFT_SKIP_UNDER_TSAN();
  std::vector<pid_t> pids;
  const std::vector<int> codes = forkOnTheDirectPath(
      3,
      [](int r, Comm& comm) {
        if (comm.summary().find("direct path from 0 KiB") == std::string::npos) {
          std::fprintf(stderr, "summary: %s\n", comm.summary().c_str());
          return 5;
        }
        return everyCollective(r, comm);
      },
      &pids);
  for (std::size_t r = 0; r < codes.size(); ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
  EXPECT_EQ(segmentsOf(pids), 0);
}

// The stage in many rounds: an 8 KiB stage (rounds of 4 KiB, some cut short, some empty for the
// last ranks) under the whole matrix, in place and out of place, two threads a rank.
TEST(ProcessDirect, EveryCollectiveTypeOpAndSizeInRoundsThroughTheStage) {
  WEFT_SKIP_UNDER_TSAN();
  setenv("WEFT_HOST_STAGE_BYTES", "8192", 1);
  setenv("WEFT_HOST_DIRECT_THREADS", "2", 1);
  std::vector<pid_t> pids;
  const std::vector<int> codes = forkOnTheDirectPath(
      3, [](int r, Comm& comm) { return matrixAsRank(3, r, comm); }, &pids,
      std::chrono::seconds(300));
  unsetenv("WEFT_HOST_DIRECT_THREADS");
  unsetenv("WEFT_HOST_STAGE_BYTES");
  for (std::size_t r = 0; r < codes.size(); ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
  EXPECT_EQ(segmentsOf(pids), 0);
}

// Rank r of n runs the matrix with every buffer (poison included) in weftHostAlloc memory: each
// direct call must load from the peers' buffers in place, which the rank counts, and every
// output must be right. A call on plain memory after them goes through the stages (the count
// stays). Once the communicator is gone, no allocation, descriptor or mapping is left. 2: this
// kernel does not let the ranks reach each other.
int hostAllocMatrix(int n, int r, Comm& comm) {
  DeviceMemory shared;
  shared.alloc = [](int, std::size_t bytes) {
    auto p = hostAlloc(bytes);
    return p ? static_cast<std::byte*>(*p) : nullptr;
  };
  shared.release = [](int, std::byte* p) { (void)hostFree(p); };
  shared.copy = [](int, void* to, const void* from, std::size_t bytes) {
    if (bytes > 0) std::memcpy(to, from, bytes);  // empty vectors hand over null
  };
  shared.stream = [](int) -> void* { return nullptr; };
  shared.finish = [](Comm&, int) { return std::string(); };
  auto before = hostCountersOf(comm.handle());
  if (!before) return 20;
  if (before->readablePeers < n - 1) return 2;
  std::vector<Comm> mine;
  mine.push_back(std::move(comm));
  std::vector<std::string> failures = runMatrix(mine, n, r, &shared);
  // The same two allocations for several calls, each at another offset in them (as weft-perf
  // moves through its buffers): the peers' mappings are reused, at every offset.
  {
    const std::size_t count = 40000, slices = 4;
    auto in = hostAlloc(count * slices * sizeof(float));
    auto out = hostAlloc(count * slices * sizeof(float));
    if (!in || !out) return 23;
    auto* x = static_cast<float*>(*in);
    auto* y = static_cast<float*>(*out);
    for (std::size_t i = 0; i < count * slices; ++i) x[i] = static_cast<float>((i * 7 + r) % 29);
    for (int call = 0; call < 6; ++call) {
      const std::size_t at = count * static_cast<std::size_t>(call % slices);
      std::fill(y + at, y + at + count, -1.f);
      if (!mine.front().allReduce(x + at, y + at, count, DataType::f32, RedOp::sum)) {
        failures.push_back("all-reduce at an offset failed");
        break;
      }
      for (std::size_t i = 0; i < count; ++i) {
        float want = 0;
        for (int q = 0; q < n; ++q)
          want += static_cast<float>(((at + i) * 7 + static_cast<std::size_t>(q)) % 29);
        if (y[at + i] != want) {
          failures.push_back("all-reduce at offset " + std::to_string(at) + ": element " +
                             std::to_string(i) + " wrong");
          break;
        }
      }
    }
    if (!mine.front().barrier()) return 24;  // nobody still reads them
    (void)hostFree(*in);
    (void)hostFree(*out);
  }
  auto onShared = hostCountersOf(mine.front().handle());
  // Plain memory on every rank, then on all but rank 0 (which waits at the first barrier to
  // copy in late): through the stages, right, and not counted.
  const Case plain{Collective::allReduce, DataType::f32, RedOp::sum, 65537, false, 0};
  if (std::string e = runCase(mine, plain, 99, n, r); !e.empty()) failures.push_back(e);
  DeviceMemory mixed = shared;
  mixed.alloc = [&](int q, std::size_t bytes) {
    return q == 0 ? shared.alloc(q, bytes) : new std::byte[bytes];
  };
  mixed.release = [&](int q, std::byte* p) {
    if (q == 0) {
      shared.release(q, p);
    } else {
      delete[] p;
    }
  };
  std::uint64_t seed = 100;
  for (Collective coll : {Collective::allReduce, Collective::allGather, Collective::reduceScatter,
                          Collective::allToAll}) {
    for (bool inPlace : {false, true}) {
      const Case c{coll, DataType::f32, RedOp::sum, 50000, inPlace, 0};
      if (std::string e = runCase(mine, c, seed++, n, r, &mixed); !e.empty())
        failures.push_back("mixed memory: " + describe(c, n) + ": " + e);
    }
  }
  auto after = hostCountersOf(mine.front().handle());
  if (!onShared || !after) return 21;
  for (const std::string& f : failures) std::fprintf(stderr, "rank %d: %s\n", r, f.c_str());
  const std::uint64_t inPlace = onShared->directInPlaceCalls - before->directInPlaceCalls;
  std::fprintf(stderr, "rank %d: %llu calls in place, %zu peer allocations mapped\n", r,
               static_cast<unsigned long long>(inPlace), onShared->peerAllocationsMapped);
  int code = failures.empty() ? 0 : 1;
  if (inPlace == 0 || onShared->peerAllocationsMapped == 0) code = 3;
  if (after->directInPlaceCalls != onShared->directInPlaceCalls) code = 4;
  // Every rank is done with the others' buffers before any communicator goes.
  if (!mine.front().barrier()) code = 22;
  mine.clear();
  if (const int left = hostAllocMaps() + hostAllocDescriptors(); left != 0) {
    std::fprintf(stderr, "rank %d: %d weftHostAlloc maps or descriptors left\n", r, left);
    code = 6;
  }
  return code;
}

TEST(ProcessDirect, BuffersInWeftHostAllocMemoryAreReadInPlace) {
  WEFT_SKIP_UNDER_TSAN();
  std::vector<pid_t> pids;
  const std::vector<int> codes = forkOnTheDirectPath(
      3, [](int r, Comm& comm) { return hostAllocMatrix(3, r, comm); }, &pids,
      std::chrono::seconds(300));
  if (std::count(codes.begin(), codes.end(), 2) == 3)
    GTEST_SKIP() << "this kernel does not let the ranks read each other";
  for (std::size_t r = 0; r < codes.size(); ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
  EXPECT_EQ(segmentsOf(pids), 0);
}

// Automatic: the ranks agree on whether the path pays here (every rank has two cores); the
// summary says which.
TEST(ProcessDirect, AutomaticChoiceIsAgreedAndReported) {
  WEFT_SKIP_UNDER_TSAN();
  const std::vector<int> codes = forkRanks(2, [](int, Comm& comm) {
    // (Where the kernel forbids reading a peer, there is nothing to time.)
    const std::string s = comm.summary();
    if (s.find("single copy") != std::string::npos && s.find("direct path") == std::string::npos) {
      std::fprintf(stderr, "summary: %s\n", s.c_str());
      return 5;
    }
    return 0;
  });
  for (std::size_t r = 0; r < codes.size(); ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Ranks, Processes, ::testing::Values(1, 2, 3, 4, 8),
                         [](const auto& p) { return std::to_string(p.param) + "ranks"; });

// Rank 2 dies (SIGKILL) between two all-reduces; every survivor's second all-reduce must fail
// with a remote error well within WEFT_TIMEOUT_S: the death is detected, not waited out.
int killRank2ThenAllReduce(int r, Comm& comm) {
  std::vector<float> in(1 << 16, 1.f), out(in.size());
  if (!comm.allReduce(in.data(), out.data(), in.size(), DataType::f32, RedOp::sum)) return 2;
  if (r == 2) raise(SIGKILL);
  const auto start = std::chrono::steady_clock::now();
  const Status s = comm.allReduce(in.data(), out.data(), in.size(), DataType::f32, RedOp::sum);
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fprintf(stderr, "rank %d after the kill: %s in %.2f s\n", r, s.toString().c_str(), secs);
  if (s.code() != Code::remoteError) return 3;
  return secs < 10 ? 0 : 4;
}

TEST(ProcessFaults, AKilledRankIsAnErrorOnEverySurvivor) {
  WEFT_SKIP_UNDER_TSAN();
  setenv("WEFT_TIMEOUT_S", "20", 1);
  setenv("WEFT_HOST_DIRECT_BYTES", "0", 1);  // the FIFOs (the next test: the direct path)
  std::vector<pid_t> pids;
  const std::vector<int> codes = forkRanks(4, killRank2ThenAllReduce, &pids);
  unsetenv("WEFT_HOST_DIRECT_BYTES");
  unsetenv("WEFT_TIMEOUT_S");
  EXPECT_EQ(codes[2], -SIGKILL);
  for (int r : {0, 1, 3}) EXPECT_EQ(codes[static_cast<std::size_t>(r)], 0) << "rank " << r;
  EXPECT_EQ(segmentsOf(pids), 0);  // the killed rank's inbox included
}

TEST(ProcessFaults, AKilledRankIsAnErrorOnEverySurvivorOfADirectCall) {
  WEFT_SKIP_UNDER_TSAN();
  setenv("WEFT_TIMEOUT_S", "20", 1);
  setenv("WEFT_HOST_DIRECT", "1", 1);
  setenv("WEFT_HOST_DIRECT_BYTES", "1", 1);
  std::vector<pid_t> pids;
  const std::vector<int> codes = forkRanks(4, killRank2ThenAllReduce, &pids);
  unsetenv("WEFT_HOST_DIRECT_BYTES");
  unsetenv("WEFT_HOST_DIRECT");
  unsetenv("WEFT_TIMEOUT_S");
  EXPECT_EQ(codes[2], -SIGKILL);
  for (int r : {0, 1, 3}) EXPECT_EQ(codes[static_cast<std::size_t>(r)], 0) << "rank " << r;
  EXPECT_EQ(segmentsOf(pids), 0);
}

// The same for a small all-reduce, through the slots: the survivors wait for the dead rank's
// slot.
int killRank2ThenSmallAllReduce(int r, Comm& comm) {
  std::vector<float> in(16, 1.f), out(in.size());
  if (!comm.allReduce(in.data(), out.data(), in.size(), DataType::f32, RedOp::sum)) return 2;
  if (r == 2) raise(SIGKILL);
  const Status s = comm.allReduce(in.data(), out.data(), in.size(), DataType::f32, RedOp::sum);
  std::fprintf(stderr, "rank %d after the kill: %s\n", r, s.toString().c_str());
  return s.code() == Code::remoteError ? 0 : 3;
}

TEST(ProcessFaults, AKilledRankIsAnErrorOnEverySurvivorOfASmallCall) {
  WEFT_SKIP_UNDER_TSAN();
  setenv("WEFT_TIMEOUT_S", "20", 1);
  std::vector<pid_t> pids;
  const auto start = std::chrono::steady_clock::now();
  const std::vector<int> codes = forkRanks(4, killRank2ThenSmallAllReduce, &pids);
  unsetenv("WEFT_TIMEOUT_S");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_EQ(codes[2], -SIGKILL);
  for (int r : {0, 1, 3}) EXPECT_EQ(codes[static_cast<std::size_t>(r)], 0) << "rank " << r;
  EXPECT_EQ(segmentsOf(pids), 0);
}

TEST(ProcessFaults, BootstrapToADeadAddressTimesOut) {
  setenv("WEFT_COMM_ID", "127.0.0.1:1", 1);  // nothing listens on port 1
  setenv("WEFT_TIMEOUT_S", "1", 1);
  weftUniqueId id{};
  ASSERT_EQ(weftGetUniqueId(&id), weftSuccess);
  weftComm_t comm = nullptr;
  const auto start = std::chrono::steady_clock::now();
  const weftResult_t r = weftCommInitRank(&comm, 2, id, 1);
  unsetenv("WEFT_COMM_ID");
  unsetenv("WEFT_TIMEOUT_S");
  EXPECT_EQ(r, weftTimeout) << weftGetLastError();
  EXPECT_NE(std::string(weftGetLastError()).find("127.0.0.1:1"), std::string::npos)
      << weftGetLastError();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(4));
}

// A rank whose peers never come says so at WARN while it waits (every quarter of a short
// timeout), and the root names the ranks it waits for.
TEST(ProcessFaults, ARankWaitingAtTheRendezvousSaysForWhom) {
  const std::string log = ::testing::TempDir() + "weft-wait-" + std::to_string(getpid()) + ".log";
  setenv("WEFT_TIMEOUT_S", "1.2", 1);
  setenv("NCCL_DEBUG", "WARN", 1);
  setenv("WEFT_DEBUG_FILE", log.c_str(), 1);
  weftUniqueId id{};
  ASSERT_EQ(weftGetUniqueId(&id), weftSuccess);
  weftComm_t comm = nullptr;
  const weftResult_t r = weftCommInitRank(&comm, 2, id, 0);
  unsetenv("WEFT_TIMEOUT_S");
  unsetenv("NCCL_DEBUG");
  unsetenv("WEFT_DEBUG_FILE");
  EXPECT_EQ(r, weftTimeout) << weftGetLastError();
  std::ifstream in(log);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::remove(log.c_str());
  EXPECT_NE(text.find("[0] weft WARN bootstrap: still waiting for the root at "), std::string::npos)
      << text;
  EXPECT_NE(text.find("bootstrap root: 1 of 2 ranks have joined; waiting for rank 1"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("weft WARN bootstrap: rank 0 of 2: "), std::string::npos)
      << "the failure itself, where it happens:\n"
      << text;
}

// Ranks passing different nranks each hear so, even where the rank whose process runs the
// rendezvous' root (WEFT_COMM_ID's rank 0) fails first and exits at once.
TEST(ProcessFaults, MismatchedNranksIsNamedOnEveryRank) {
  WEFT_SKIP_UNDER_TSAN();
  const int port = [] {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    close(fd);
    return ntohs(a.sin_port);
  }();
  const std::string address = "127.0.0.1:" + std::to_string(port);
  std::vector<pid_t> pids;
  for (int rank = 0; rank < 2; ++rank) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      setenv("WEFT_COMM_ID", address.c_str(), 1);
      setenv("WEFT_TIMEOUT_S", "20", 1);
      if (rank == 1) usleep(300 * 1000);  // after rank 0's init has failed
      weftUniqueId id{};
      weftComm_t comm = nullptr;
      if (weftGetUniqueId(&id) != weftSuccess) _exit(2);
      const weftResult_t r = weftCommInitRank(&comm, rank == 0 ? 3 : 2, id, rank);
      const bool named = r == weftInvalidUsage &&
                         std::strstr(weftGetLastError(),
                                     "rank 1 joined with nranks=2, but rank 0 joined with "
                                     "nranks=3") != nullptr;
      if (!named) std::fprintf(stderr, "rank %d: %s\n", rank, weftGetLastError());
      _exit(named ? 0 : 1);  // at once: no destructor keeps the root alive
    }
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  }
}

// Point-to-point between processes: small messages through the FIFO, large ones read straight
// from the sender's buffer (process_vm_readv) where the kernel allows it, else the FIFO; every
// byte checked, with single copy on and off.
int ringExchange(int r, Comm& comm) {
  const int n = comm.size(), next = (r + 1) % n, prev = (r + n - 1) % n;
  int bad = 0;
  for (std::size_t bytes : {1000ul, 300ul * 1024, 5ul * 1024 * 1024 + 3}) {
    auto fill = [&](int q, std::size_t i) {
      return static_cast<std::uint8_t>((i * 7 + q * 31) % 253);
    };
    std::vector<std::uint8_t> out(bytes), in(bytes, 0xCD);
    for (std::size_t i = 0; i < bytes; ++i) out[i] = fill(r, i);
    // A group: every rank sends before it receives, which only works because they progress
    // together; then a plain send/recv pair ordered to avoid the cycle.
    if (weftGroupStart() != weftSuccess) return 10;
    if (!comm.send(out.data(), bytes, DataType::u8, next)) ++bad;
    if (!comm.recv(in.data(), bytes, DataType::u8, prev)) ++bad;
    if (weftGroupEnd() != weftSuccess) return 11;
    for (std::size_t i = 0; i < bytes; ++i) {
      if (in[i] != fill(prev, i)) {
        std::fprintf(stderr, "rank %d: %zu bytes from rank %d: byte %zu wrong\n", r, bytes, prev,
                     i);
        ++bad;
        break;
      }
    }
    std::fill(in.begin(), in.end(), 0xCD);
    if (r % 2 == 0) {
      if (!comm.send(out.data(), bytes, DataType::u8, next)) ++bad;
      if (!comm.recv(in.data(), bytes, DataType::u8, prev)) ++bad;
    } else {
      if (!comm.recv(in.data(), bytes, DataType::u8, prev)) ++bad;
      if (!comm.send(out.data(), bytes, DataType::u8, next)) ++bad;
    }
    if (in != [&] {
          std::vector<std::uint8_t> want(bytes);
          for (std::size_t i = 0; i < bytes; ++i) want[i] = fill(prev, i);
          return want;
        }())
      ++bad;
  }
  if (r == 0) std::fprintf(stderr, "%s\n", comm.summary().c_str());
  return bad == 0 ? 0 : 1;
}

TEST(ProcessP2p, LargeMessagesTakeTheSingleCopyPathAndSmallOnesTheFifo) {
  WEFT_SKIP_UNDER_TSAN();
  for (const char* threshold : {"262144", "0"}) {
    setenv("WEFT_SINGLE_COPY_BYTES", threshold, 1);
    std::vector<pid_t> pids;
    const std::vector<int> codes = forkRanks(4, ringExchange, &pids);  // 4: even, for the pairs
    for (std::size_t r = 0; r < codes.size(); ++r)
      EXPECT_EQ(codes[r], 0) << "rank " << r << " with WEFT_SINGLE_COPY_BYTES=" << threshold;
    EXPECT_EQ(segmentsOf(pids), 0);
  }
  unsetenv("WEFT_SINGLE_COPY_BYTES");
}

// Collectives through the schedules (no direct path) between processes: from 256 KiB the steps
// marked for single copy send references, and their receivers read the named pieces straight
// from the senders' buffers. Every output is checked, and this rank's count of bytes read that
// way must have grown by what its receives needed, where the kernel lets it read its peers
// (exit 2 otherwise); with single copy off it must not grow at all.
int singleCopyCollectives(int r, Comm& comm, bool on) {
  const int n = comm.size();
  auto counters = [&] { return hostCountersOf(comm.handle()); };
  auto before = counters();
  if (!before) return 20;
  if (on && before->readablePeers == 0) return 2;
  std::vector<Comm> mine;
  mine.push_back(std::move(comm));
  int bad = 0;
  std::uint64_t seed = 11, least = 0;
  const std::size_t count = (1u << 18) + 5;  // a rank's block: 1 MiB of floats and a bit
  for (Collective coll : {Collective::allGather, Collective::broadcast, Collective::allToAll,
                          Collective::allReduce}) {
    for (bool inPlace : {false, true}) {
      const Case c{coll, DataType::f32, RedOp::sum, count, inPlace, n - 1};
      if (const std::string err = runCase(mine, c, seed++, n, r); !err.empty()) {
        std::fprintf(stderr, "rank %d: %s: %s\n", r, describe(c, n).c_str(), err.c_str());
        ++bad;
      }
    }
  }
  // Out of place, an all-gather's receives alone read every peer's block.
  least = std::uint64_t{count} * sizeof(float) * static_cast<std::uint64_t>(n - 1);
  auto after = hostCountersOf(mine.front().handle());
  comm = std::move(mine.front());
  if (!after) return 21;
  const std::uint64_t read = after->singleCopyBytes - before->singleCopyBytes;
  std::fprintf(stderr, "rank %d: single copy %s: %llu bytes read from peers\n", r,
               on ? "on" : "off", static_cast<unsigned long long>(read));
  if (on ? read < least : read != 0) ++bad;
  return bad == 0 ? 0 : 1;
}

// With a read-rate floor no host meets (WEFT_SINGLE_COPY_MIN_GBPS=1000), each rank refuses
// references after two windows of reads: from then on its peers send it bytes, the count of bytes
// it read stops, and every result (collective and send/recv) stays right.
int refusesAfterSlowReads(int r, Comm& comm) {
  const int n = comm.size();
  auto read = [&](Comm& c) -> std::uint64_t {
    auto h = hostCountersOf(c.handle());
    return h ? h->singleCopyBytes : ~std::uint64_t{0};
  };
  if (auto h = hostCountersOf(comm.handle()); !h || h->readablePeers == 0) return 2;
  std::vector<Comm> mine;
  mine.push_back(std::move(comm));
  int bad = 0;
  std::uint64_t seed = 21;
  const std::size_t count = 1u << 18;  // 1 MiB a block: 2 MiB read a call per rank at 3 ranks
  auto allGather = [&] {
    const Case c{Collective::allGather, DataType::f32, RedOp::sum, count, false, 0};
    if (const std::string err = runCase(mine, c, seed++, n, r); !err.empty()) {
      std::fprintf(stderr, "rank %d: %s\n", r, err.c_str());
      ++bad;
    }
  };
  for (int i = 0; i < 8; ++i) allGather();  // 16 MiB read: four windows
  const std::uint64_t after = read(mine.front());
  for (int i = 0; i < 4; ++i) allGather();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  std::vector<std::uint8_t> out(3u << 20), in(out.size());
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<std::uint8_t>(i * 13 + r);
  if (weftGroupStart() != weftSuccess) return 10;
  if (!mine.front().send(out.data(), out.size(), DataType::u8, next)) ++bad;
  if (!mine.front().recv(in.data(), in.size(), DataType::u8, prev)) ++bad;
  if (weftGroupEnd() != weftSuccess) return 11;
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (in[i] != static_cast<std::uint8_t>(i * 13 + prev)) {
      ++bad;
      break;
    }
  }
  const std::uint64_t end = read(mine.front());
  comm = std::move(mine.front());
  std::fprintf(stderr, "rank %d: %llu bytes read before refusing, %llu after\n", r,
               static_cast<unsigned long long>(after),
               static_cast<unsigned long long>(end - after));
  if (after == 0 || end != after) ++bad;
  return bad == 0 ? 0 : 1;
}

TEST(ProcessSingleCopy, SlowReadsTurnARanksReferencesIntoBytes) {
  WEFT_SKIP_UNDER_TSAN();
  setenv("WEFT_HOST_DIRECT", "0", 1);
  setenv("WEFT_SINGLE_COPY_MIN_GBPS", "1000", 1);
  std::vector<pid_t> pids;
  const std::vector<int> codes =
      forkRanks(3, refusesAfterSlowReads, &pids, std::chrono::seconds(120));
  unsetenv("WEFT_SINGLE_COPY_MIN_GBPS");
  unsetenv("WEFT_HOST_DIRECT");
  if (std::count(codes.begin(), codes.end(), 2) == 3)
    GTEST_SKIP() << "this kernel does not let the ranks read each other (process_vm_readv)";
  for (std::size_t r = 0; r < codes.size(); ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
  EXPECT_EQ(segmentsOf(pids), 0);
}

TEST(ProcessSingleCopy, CollectivesReadPeersBuffersAndCountWhatTheyRead) {
  WEFT_SKIP_UNDER_TSAN();
  setenv("WEFT_HOST_DIRECT", "0", 1);
  setenv("WEFT_SINGLE_COPY_MIN_GBPS", "0", 1);  // however slow this host reads
  for (bool on : {true, false}) {
    setenv("WEFT_SINGLE_COPY_BYTES", on ? "262144" : "0", 1);
    std::vector<pid_t> pids;
    const std::vector<int> codes = forkRanks(
        3, [on](int r, Comm& comm) { return singleCopyCollectives(r, comm, on); }, &pids,
        std::chrono::seconds(120));
    if (on && std::count(codes.begin(), codes.end(), 2) == 3) {
      unsetenv("WEFT_SINGLE_COPY_BYTES");
      unsetenv("WEFT_SINGLE_COPY_MIN_GBPS");
      unsetenv("WEFT_HOST_DIRECT");
      GTEST_SKIP() << "this kernel does not let the ranks read each other (process_vm_readv)";
    }
    for (std::size_t r = 0; r < codes.size(); ++r)
      EXPECT_EQ(codes[r], 0) << "rank " << r << (on ? " with" : " without") << " single copy";
    EXPECT_EQ(segmentsOf(pids), 0);
  }
  unsetenv("WEFT_SINGLE_COPY_BYTES");
  unsetenv("WEFT_SINGLE_COPY_MIN_GBPS");
  unsetenv("WEFT_HOST_DIRECT");
}

// Ranks that claim different hosts (WEFT_TEST_HOST_ID): shared memory within each, UCX between.
// `hosts[r]` is rank r's host.
std::function<void(int)> onHosts(std::vector<int> hosts) {
  return [hosts](int r) {
    setenv("WEFT_TEST_HOST_ID", std::to_string(hosts[static_cast<std::size_t>(r)]).c_str(), 1);
  };
}

#if defined(WEFT_HAVE_UCX)
TEST(Hosts, RanksOnTwoHostsUseShmWithinAndUcxBetween) {
  WEFT_SKIP_UNDER_TSAN();
  std::vector<pid_t> pids;
  const std::vector<int> codes = forkRanks(
      5,
      [](int, Comm& comm) {
        if (comm.summary().find("shm within a host, ucx between hosts") == std::string::npos) {
          std::fprintf(stderr, "summary: %s\n", comm.summary().c_str());
          return 5;
        }
        return everyCollective(comm.rank(), comm);
      },
      &pids, std::chrono::seconds(60), onHosts({0, 1, 0, 1, 1}));
  for (std::size_t r = 0; r < codes.size(); ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
  EXPECT_EQ(segmentsOf(pids), 0);
}

TEST(Hosts, AKilledRankOnAnotherHostIsAnErrorOnEverySurvivor) {
  WEFT_SKIP_UNDER_TSAN();
  setenv("WEFT_TIMEOUT_S", "30", 1);
  std::vector<pid_t> pids;
  const std::vector<int> codes =
      forkRanks(4, killRank2ThenAllReduce, &pids, std::chrono::seconds(60), onHosts({0, 0, 1, 1}));
  unsetenv("WEFT_TIMEOUT_S");
  EXPECT_EQ(codes[2], -SIGKILL);
  for (int r : {0, 1, 3}) EXPECT_EQ(codes[static_cast<std::size_t>(r)], 0) << "rank " << r;
  EXPECT_EQ(segmentsOf(pids), 0);
}

TEST(Hosts, AnAbortReachesRanksOnOtherHosts) {
  WEFT_SKIP_UNDER_TSAN();
  setenv("WEFT_TIMEOUT_S", "30", 1);
  const std::vector<int> codes = forkRanks(
      3,
      [](int r, Comm& comm) {
        if (r == 2) {
          usleep(300'000);  // the others are waiting in the all-reduce
          return comm.abort() ? 0 : 6;
        }
        std::vector<float> in(1024, 1.f), out(in.size());
        const auto start = std::chrono::steady_clock::now();
        const Status s =
            comm.allReduce(in.data(), out.data(), in.size(), DataType::f32, RedOp::sum);
        const double secs =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        std::fprintf(stderr, "rank %d: %s in %.2f s\n", r, s.toString().c_str(), secs);
        if (s.code() != Code::remoteError || s.message().find("abort") == std::string::npos)
          return 3;
        return secs < 10 ? 0 : 4;
      },
      nullptr, std::chrono::seconds(60), onHosts({0, 1, 2}));
  unsetenv("WEFT_TIMEOUT_S");
  for (std::size_t r = 0; r < codes.size(); ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}
#else
TEST(Hosts, WithoutUcxRanksOnTwoHostsAreAClearError) {
  WEFT_SKIP_UNDER_TSAN();
  const std::vector<int> codes = forkRanks(
      2, [](int, Comm&) { return 0; }, nullptr, std::chrono::seconds(60), onHosts({0, 1}));
  for (int c : codes) EXPECT_EQ(c, 90);  // init failed (the message names libucx-dev)
}
#endif

// The transport WEFT_TRANSPORT names is the one in use (so a run "over UCX" cannot quietly run
// over shared memory).
TEST(Transport, TheSummaryNamesTheTransportInUse) {
  const char* t = std::getenv("WEFT_TRANSPORT");
  const std::string want =
      t != nullptr && std::string(t) == "ucx" ? "ucx transport" : "shm transport";
  const std::vector<int> codes = forkRanks(2, [&](int, Comm& comm) {
    if (comm.summary().find(want) != std::string::npos) return 0;
    std::fprintf(stderr, "summary: %s (wanted %s)\n", comm.summary().c_str(), want.c_str());
    return 7;
  });
  for (int c : codes) EXPECT_EQ(c, 0);
}

}  // namespace
}  // namespace weft::test
