// Call signatures on GPU memory (WEFT_CHECK_CALLS, on by default): ranks that make one call
// differently (count, dtype, op, collective, root, a send's size) all get an error naming both
// calls within a second, from the call or from the stream's completion (asyncError), instead of
// success with wrong data or a kernel that waits for the timeout. Ranks as threads and as
// processes sharing the GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "tests/gpu/gpu_harness.hpp"
#include "tests/runtime/fork.hpp"

namespace weft::test {
namespace {

struct Call {
  Collective coll = Collective::allReduce;
  DataType type = DataType::f32;
  std::size_t count = 100;
  RedOp op = RedOp::sum;
  int root = 0;
  bool p2p = false;  // rank 0 sends `count` floats to rank 1, which receives them
};

struct Mismatch {
  const char* what;
  Call everyone, odd;  // rank 1 makes `odd`
  const char* mine;    // how the calls are named (for p2p: the sizes in bytes)
  const char* theirs;
};

const Mismatch kCases[] = {
    {"count",
     {},
     {Collective::allReduce, DataType::f32, 200},
     "allreduce(f32, 100, sum)",
     "allreduce(f32, 200, sum)"},
    {"count, 100k",
     {Collective::allReduce, DataType::f32, 100000},
     {Collective::allReduce, DataType::f32, 200000},
     "allreduce(f32, 100000, sum)",
     "allreduce(f32, 200000, sum)"},
    {"count, 4M",
     {Collective::allReduce, DataType::f32, 4 << 20},
     {Collective::allReduce, DataType::f32, 8 << 20},
     "allreduce(f32, 4194304, sum)",
     "allreduce(f32, 8388608, sum)"},
    {"dtype",
     {},
     {Collective::allReduce, DataType::f64, 100},
     "allreduce(f32, 100, sum)",
     "allreduce(f64, 100, sum)"},
    {"op",
     {},
     {Collective::allReduce, DataType::f32, 100, RedOp::prod},
     "allreduce(f32, 100, sum)",
     "allreduce(f32, 100, prod)"},
    {"collective",
     {},
     {Collective::broadcast, DataType::f32, 100},
     "allreduce(f32, 100, sum)",
     "broadcast(f32, 100, root 0)"},
    {"root",
     {Collective::broadcast, DataType::f32, 100},
     {Collective::broadcast, DataType::f32, 100, RedOp::sum, 1},
     "broadcast(f32, 100, root 0)",
     "broadcast(f32, 100, root 1)"},
    {"reduce's root, 1M",
     {Collective::reduce, DataType::f32, 1 << 20},
     {Collective::reduce, DataType::f32, 1 << 20, RedOp::sum, 1},
     "reduce(f32, 1048576, sum, root 0)",
     "reduce(f32, 1048576, sum, root 1)"},
    {"all-gather's count",
     {Collective::allGather, DataType::f32, 1000},
     {Collective::allGather, DataType::f32, 1001},
     "allgather(f32, 1000)",
     "allgather(f32, 1001)"},
    {"send/recv",
     {Collective::allReduce, DataType::f32, 100, RedOp::sum, 0, true},
     {Collective::allReduce, DataType::f32, 200, RedOp::sum, 0, true},
     "400 bytes",
     "800 bytes"},
};

constexpr std::size_t kBufferBytes = std::size_t{80} << 20;  // the largest case's output

Status issue(Comm& comm, const Call& c, int rank, float* in, float* out, cudaStream_t s) {
  if (c.p2p) {
    if (rank == 0) return comm.send(in, c.count, c.type, 1, s);
    if (rank == 1) return comm.recv(out, c.count, c.type, 0, s);
    return {};
  }
  switch (c.coll) {
    case Collective::allReduce:
      return comm.allReduce(in, out, c.count, c.type, c.op, s);
    case Collective::broadcast:
      return comm.broadcast(in, out, c.count, c.type, c.root, s);
    case Collective::reduce:
      return comm.reduce(in, out, c.count, c.type, c.op, c.root, s);
    case Collective::allGather:
      return comm.allGather(in, out, c.count, c.type, s);
    default:
      return Status(Code::internalError, "not a case");
  }
}

struct Outcome {
  Status good, bad;
  double seconds = 0;
};

// One rank's good call, then its call of the case: the error is the call's, or else its
// stream's (asyncError after the stream completes).
Outcome runCase(Comm& comm, const Mismatch& m, int rank) {
  Outcome o;
  cudaStream_t s = nullptr;
  float *in = nullptr, *out = nullptr;
  // Stream-ordered: nothing here waits for the device, where peers' kernels wait for this rank.
  if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess ||
      cudaMallocAsync(&in, kBufferBytes, s) != cudaSuccess ||
      cudaMallocAsync(&out, kBufferBytes, s) != cudaSuccess ||
      cudaMemsetAsync(in, 0, kBufferBytes, s) != cudaSuccess ||
      cudaStreamSynchronize(s) != cudaSuccess) {
    o.good = Status(Code::systemError, "no stream or memory");
    return o;
  }
  o.good = comm.allReduce(in, out, 1000, DataType::f32, RedOp::sum, s);
  if (o.good.isOk() && cudaStreamSynchronize(s) != cudaSuccess)
    o.good = Status(Code::systemError, "stream");
  if (o.good.isOk()) o.good = comm.asyncError();
  // No rank's mismatch may abort the communicator before every rank has judged its good call.
  if (o.good.isOk()) o.good = comm.barrier();
  const auto start = std::chrono::steady_clock::now();
  o.bad = issue(comm, rank == 1 ? m.odd : m.everyone, rank, in, out, s);
  if (o.bad.isOk()) {
    (void)cudaStreamSynchronize(s);
    o.bad = comm.asyncError();
  }
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  (void)cudaFreeAsync(in, s);
  (void)cudaFreeAsync(out, s);
  (void)cudaStreamSynchronize(s);
  (void)cudaStreamDestroy(s);
  return o;
}

// "" when the outcome is as it must be, else what is wrong. A send and a receive concern ranks
// 0 and 1 only.
std::string judge(const Mismatch& m, int rank, const Outcome& o) {
  const std::string where = std::string(m.what) + ", rank " + std::to_string(rank) + ": ";
  if (!o.good.isOk()) return where + "the good call failed: " + o.good.toString();
  if (m.everyone.p2p && rank > 1) return "";
  if (o.bad.isOk()) return where + "success";
  if (o.seconds >= 1.0) return where + std::to_string(o.seconds) + " s: " + o.bad.toString();
  const std::string& text = o.bad.message();
  if (text.find(m.mine) == std::string::npos || text.find(m.theirs) == std::string::npos)
    return where + "both calls are not named: " + text;
  return "";
}

class GpuCallCheck : public ::testing::TestWithParam<int> {};

TEST_P(GpuCallCheck, AMismatchedCallIsAnErrorOnEveryRankNamingBothCalls) {
  SKIP_WITHOUT_GPU();
  const int n = GetParam();
  ScopedEnv timeoutEnv("WEFT_TIMEOUT_S", "20");  // a kernel left waiting shows as > 1 s
  for (const Mismatch& m : kCases) {
    std::vector<Comm> comms = threadRanks(n);
    ASSERT_EQ(comms.size(), static_cast<std::size_t>(n));
    std::vector<std::string> verdicts(static_cast<std::size_t>(n));
    onEveryRank(n, [&](int r) {
      const auto R = static_cast<std::size_t>(r);
      verdicts[R] = judge(m, r, runCase(comms[R], m, r));
    });
    for (const std::string& v : verdicts) EXPECT_EQ(v, "");
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, GpuCallCheck, ::testing::Values(2, 3, 4),
                         [](const auto& p) { return std::to_string(p.param) + "ranks"; });

// Matching calls never trip the check: many small calls in a row (the later rank of each call
// compares with the earlier, well within the kept calls) and a CUDA graph replayed.
TEST(GpuCallCheckMatching, ManyMatchingCallsPass) {
  SKIP_WITHOUT_GPU();
  constexpr int n = 3;
  std::vector<Comm> comms = threadRanks(n);
  ASSERT_EQ(comms.size(), static_cast<std::size_t>(n));
  std::vector<Status> results(n);
  onEveryRank(n, [&](int r) {
    const auto R = static_cast<std::size_t>(r);
    cudaStream_t s = nullptr;
    float* buf = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaMallocAsync(&buf, 1 << 22, s), cudaSuccess);
    for (int k = 0; k < 300 && results[R].isOk(); ++k) {
      const std::size_t count = 1 + static_cast<std::size_t>(k * 37 % 5000);
      results[R] = k % 3 == 0   ? comms[R].allReduce(buf, buf, count, DataType::f32, RedOp::sum, s)
                   : k % 3 == 1 ? comms[R].broadcast(buf, buf, count, DataType::f32, k % n, s)
                                : comms[R].allGather(buf, buf + 8192, count, DataType::f32, s);
    }
    (void)cudaStreamSynchronize(s);
    if (results[R].isOk()) results[R] = comms[R].asyncError();
    (void)cudaFreeAsync(buf, s);
    (void)cudaStreamSynchronize(s);
    (void)cudaStreamDestroy(s);
  });
  for (const Status& s : results) EXPECT_TRUE(s.isOk()) << s.toString();
}

// Graphs captured alike on every rank (the hosts compare them then) but replayed differently:
// rank 0 replays its first graph, rank 1 its second. The kernels compare the calls' signatures
// in the ll lines' flags (100 floats), the direct kernels' flags (1 MB) and the FIFO slots (32
// MB; and a send against a receive of another size): every rank fails within a second (a sender
// at its next operation), and a rank whose kernel saw the mismatch names both calls.
TEST(GpuCallCheckGraphs, GraphsReplayedDifferentlyAreAnError) {
  SKIP_WITHOUT_GPU();
  ScopedEnv timeoutEnv("WEFT_TIMEOUT_S", "20");
  struct Pair {
    std::size_t first, second;  // floats
    bool p2p;
    const char *mine, *theirs;  // as rank 0 names them
  };
  const Pair pairs[] = {
      {100, 200, false, "allreduce(f32, 100, sum)", "allreduce(f32, 200, sum)"},
      {1 << 18, 1 << 19, false, "allreduce(f32, 262144, sum)", "allreduce(f32, 524288, sum)"},
      {8 << 20, 16 << 20, false, "allreduce(f32, 8388608, sum)", "allreduce(f32, 16777216, sum)"},
      {100, 200, true, "", ""},
  };
  constexpr int n = 2;
  for (const Pair& pair : pairs) {
    std::vector<Comm> comms = threadRanks(n);
    ASSERT_EQ(comms.size(), static_cast<std::size_t>(n));
    std::vector<Status> captured(n), replayed(n);
    std::vector<double> seconds(n);
    std::atomic<bool> receiverDone{false};
    onEveryRank(n, [&](int r) {
      const auto R = static_cast<std::size_t>(r);
      Comm& comm = comms[R];
      cudaStream_t s = nullptr;
      float* buf = nullptr;
      ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
      ASSERT_EQ(cudaMallocAsync(&buf, pair.second * sizeof(float), s), cudaSuccess);
      ASSERT_EQ(cudaMemsetAsync(buf, 0, pair.second * sizeof(float), s), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
      // An eager call first sets the GPU transport up (nothing is allocated in a capture).
      captured[R] = comm.allReduce(buf, buf, 1, DataType::f32, RedOp::sum, s);
      ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
      cudaGraphExec_t graphs[2] = {nullptr, nullptr};
      for (int g = 0; g < 2 && captured[R].isOk(); ++g) {
        const std::size_t count = g == 0 ? pair.first : pair.second;
        cudaGraph_t graph = nullptr;
        ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
        captured[R] = !pair.p2p ? comm.allReduce(buf, buf, count, DataType::f32, RedOp::sum, s)
                      : r == 0  ? comm.send(buf, count, DataType::f32, 1, s)
                                : comm.recv(buf, count, DataType::f32, 0, s);
        ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
        ASSERT_EQ(cudaGraphInstantiate(&graphs[g], graph, 0), cudaSuccess);
        (void)cudaGraphDestroy(graph);
      }
      if (captured[R].isOk()) {
        const auto start = std::chrono::steady_clock::now();
        EXPECT_EQ(cudaGraphLaunch(graphs[r], s), cudaSuccess);
        (void)cudaStreamSynchronize(s);
        replayed[R] = comm.asyncError();
        // A send does not wait for its receiver: the sender learns of the mismatch by its next
        // operation after the receiver's kernel aborted the communicator.
        if (r == 1) receiverDone = true;
        if (pair.p2p && r == 0 && replayed[R].isOk()) {
          while (!receiverDone) std::this_thread::yield();
          EXPECT_EQ(cudaGraphLaunch(graphs[r], s), cudaSuccess);
          (void)cudaStreamSynchronize(s);
          replayed[R] = comm.asyncError();
        }
        seconds[R] =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      }
      for (cudaGraphExec_t g : graphs) (void)cudaGraphExecDestroy(g);
      (void)cudaFreeAsync(buf, s);
      (void)cudaStreamSynchronize(s);
      (void)cudaStreamDestroy(s);
    });
    int naming = 0;
    for (int r = 0; r < n; ++r) {
      const auto R = static_cast<std::size_t>(r);
      ASSERT_TRUE(captured[R].isOk()) << pair.first << ": " << captured[R].toString();
      EXPECT_FALSE(replayed[R].isOk()) << pair.first << ", rank " << r
                                       << " got success; the other: " << replayed[R ^ 1].toString()
                                       << " in " << seconds[R ^ 1] << " s";
      EXPECT_LT(seconds[R], 1.0) << pair.first << ", rank " << r << ": " << replayed[R].toString();
      const std::string& text = replayed[R].message();
      if (replayed[R].code() != Code::invalidUsage) continue;  // aborted by the other's kernel
      EXPECT_NE(text.find("WEFT_CHECK_CALLS"), std::string::npos) << text;
      if (!pair.p2p && text.find(pair.mine) != std::string::npos &&
          text.find(pair.theirs) != std::string::npos)
        ++naming;
      if (pair.p2p) ++naming;
    }
    EXPECT_GE(naming, 1) << pair.first << ": no rank named both calls: " << replayed[0].toString()
                         << " / " << replayed[1].toString();
  }
}

// Each rank a process (one case each: the check reads the peers' inboxes across processes).
class GpuCallCheckProcesses : public ::testing::TestWithParam<int> {};

TEST_P(GpuCallCheckProcesses, AMismatchedCallIsAnErrorOnEveryRank) {
  SKIP_UNLESS_FORKABLE();
  const int n = GetParam();
  ScopedEnv timeoutEnv("WEFT_TIMEOUT_S", "20");
  if (kSetHardwareQueues) unsetenv("CUDA_DEVICE_MAX_CONNECTIONS");
  for (const char* what : {"count", "collective", "send/recv"}) {
    const Mismatch* m = nullptr;
    for (const Mismatch& c : kCases) {
      if (std::string(c.what) == what) m = &c;
    }
    ASSERT_NE(m, nullptr);
    std::vector<pid_t> pids;
    const std::vector<int> codes = forkRanks(
        n,
        [&](int r, Comm& comm) {
          const std::string verdict = judge(*m, r, runCase(comm, *m, r));
          if (!verdict.empty()) std::fprintf(stderr, "%s\n", verdict.c_str());
          return verdict.empty() ? 0 : 1;
        },
        &pids, std::chrono::seconds(120));
    for (std::size_t r = 0; r < codes.size(); ++r) EXPECT_EQ(codes[r], 0) << what << ", rank " << r;
    EXPECT_EQ(segmentsOf(pids), 0);
  }
  if (kSetHardwareQueues) setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 1);
}

INSTANTIATE_TEST_SUITE_P(Ranks, GpuCallCheckProcesses, ::testing::Values(2, 4),
                         [](const auto& p) { return std::to_string(p.param) + "ranks"; });

}  // namespace
}  // namespace weft::test
