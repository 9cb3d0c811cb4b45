// A communicator's operations on GPU memory run in the order they were issued, whatever their
// streams, as NCCL's do (src/exec/launch_order.hpp): the calls of a PyTorch FSDP2 step
// (all-gather, reduce-scatter and all-reduce each on a stream of its own, which stalled when
// their kernels ran at once), 1,000 random calls spread over three streams with host delays,
// graphs replayed among eager calls on other streams, two captured streams in one graph, two host
// threads sharing a communicator, and WEFT_CHECK_PLANS. Ranks as threads and as processes;
// skipped without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include "tests/gpu/gpu_harness.hpp"
#include "tests/runtime/fork.hpp"
#include "tests/runtime/harness.hpp"

namespace weft::test {
namespace {

// A rank's own streams, non-blocking, on the current device.
struct RankStreams {
  explicit RankStreams(int count) : s(static_cast<std::size_t>(count)) {
    for (cudaStream_t& x : s)
      EXPECT_EQ(cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking), cudaSuccess);
  }
  ~RankStreams() {
    for (cudaStream_t x : s) (void)cudaStreamDestroy(x);
  }
  RankStreams(const RankStreams&) = delete;
  RankStreams& operator=(const RankStreams&) = delete;
  cudaStream_t operator[](std::size_t i) const { return s[i]; }
  std::vector<cudaStream_t> s;
};

Status issue(Comm& comm, const Case& c, const void* send, void* recv, cudaStream_t s) {
  switch (c.coll) {
    case Collective::allReduce:
      return comm.allReduce(send, recv, c.count, c.type, c.op, s);
    case Collective::allGather:
      return comm.allGather(send, recv, c.count, c.type, s);
    case Collective::reduceScatter:
      return comm.reduceScatter(send, recv, c.count, c.type, c.op, s);
    case Collective::broadcast:
      return comm.broadcast(send, recv, c.count, c.type, c.root, s);
    case Collective::reduce:
      return comm.reduce(send, recv, c.count, c.type, c.op, c.root, s);
    case Collective::allToAll:
      return comm.allToAll(send, recv, c.count, c.type, s);
    default:
      return Status(Code::internalError, "not a collective of this test");
  }
}

// Host memory to the device (or back) and waits for it, on a stream of the test's own.
bool copyNow(void* to, const void* from, std::size_t bytes, cudaStream_t s) {
  const bool ok = cudaMemcpyAsync(to, from, bytes, cudaMemcpyDefault, s) == cudaSuccess &&
                  cudaStreamSynchronize(s) == cudaSuccess;
  EXPECT_TRUE(ok) << "copying " << bytes << " bytes";
  return ok;
}

std::size_t roundUp(std::size_t x, std::size_t a) {
  return (x + a - 1) / a * a;
}

// ---- 1,000 random calls on several streams ---------------------------------------------

// One call of a random sequence: what every rank calls (the same on all), its inputs' seed, and
// how far past a 256-byte boundary this rank puts its buffers (elements: most leave the buffers
// off 16 bytes, which the kernels' vector paths must handle).
struct Call {
  Case c;
  std::uint64_t seed = 0;
  std::size_t inSkew = 0, outSkew = 0;
};

std::vector<Call> randomCalls(std::uint64_t seed, int n, std::size_t calls) {
  constexpr Collective kinds[] = {Collective::allReduce,     Collective::allGather,
                                  Collective::reduceScatter, Collective::broadcast,
                                  Collective::reduce,        Collective::allToAll};
  constexpr DataType types[] = {DataType::f32, DataType::bf16, DataType::f16,    DataType::f64,
                                DataType::i32, DataType::u8,   DataType::f8e4m3, DataType::i64};
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> logCount(0, 16);
  std::vector<Call> out(calls);
  for (std::size_t k = 0; k < calls; ++k) {
    Call& call = out[k];
    call.c.coll = kinds[rng() % std::size(kinds)];
    call.c.type = types[rng() % std::size(types)];
    call.c.op = isReduction(call.c.coll) ? kAllRedOps[rng() % std::size(kAllRedOps)] : RedOp::sum;
    call.c.count = static_cast<std::size_t>(std::exp2(logCount(rng)));  // 1 to 65536
    call.c.inPlace = rng() % 4 == 0;
    call.c.root = static_cast<int>(rng() % static_cast<std::uint64_t>(n));
    call.seed = seed * 7919 + k;
    call.inSkew = rng() % 8;
    call.outSkew = rng() % 8;
  }
  return out;
}

// Where one call's buffers sit in a rank's arena (bytes from its start), what it passes, and
// where its result is read back from.
struct Placed {
  std::size_t in = 0, out = 0, send = 0, recv = 0, result = 0;
  std::size_t inBytes = 0, outBytes = 0, resultBytes = 0;
};

// Lays out `calls` for rank r of n in one arena, filled as the harness fills a case (inputs,
// poisoned outputs, the input inside the output where the call is in place); returns the host
// image and each call's place.
std::vector<std::byte> layOut(const std::vector<Call>& calls, int r, int n,
                              std::vector<Placed>& places) {
  const auto R = static_cast<std::size_t>(r);
  std::size_t at = 0;
  places.assign(calls.size(), {});
  for (std::size_t k = 0; k < calls.size(); ++k) {
    const Case& c = calls[k].c;
    const std::size_t es = sizeOf(c.type);
    const auto [inCount, outCount] = sizes(c.coll, c.count, n);
    Placed& p = places[k];
    p.inBytes = inCount * es;
    p.outBytes = outCount * es;
    p.in = roundUp(at, 256) + calls[k].inSkew * es;
    p.out = roundUp(p.in + p.inBytes, 256) + calls[k].outSkew * es;
    at = p.out + p.outBytes;
  }
  std::vector<std::byte> image(at + 16);
  for (std::size_t k = 0; k < calls.size(); ++k) {
    const Case& c = calls[k].c;
    const std::size_t es = sizeOf(c.type);
    Placed& p = places[k];
    const std::vector<std::byte> input = caseInput(c, calls[k].seed, r, n);
    std::memcpy(image.data() + p.in, input.data(), input.size());
    std::memset(image.data() + p.out, 0xA5, p.outBytes);
    p.send = p.in;
    p.recv = p.result = p.out;
    p.resultBytes = p.outBytes;
    if (!c.inPlace) continue;
    const std::size_t mine = R * c.count * es;
    switch (c.coll) {
      case Collective::allGather:
        std::memcpy(image.data() + p.out + mine, input.data(), input.size());
        p.send = p.out + mine;
        break;
      case Collective::reduceScatter:
        p.recv = p.result = p.in + mine;
        p.resultBytes = c.count * es;
        break;
      case Collective::reduce:
        if (r != c.root) break;
        [[fallthrough]];
      default:
        std::memcpy(image.data() + p.out, input.data(), input.size());
        p.send = p.out;
        break;
    }
  }
  return image;
}

// Rank r of n runs `calls` in batches: each batch laid out in a fresh arena, every call issued
// on a stream this rank picks at random among `streams`, some after a random host delay, then
// every stream waited for and every result checked. "" or the first failure.
std::string runRandom(Comm& comm, int r, int n, const std::vector<Call>& calls, int streams,
                      std::size_t batch) {
  RankStreams work(streams), setup(1);
  std::mt19937_64 local(0x5eed + static_cast<std::uint64_t>(r) * 104729);
  for (std::size_t first = 0; first < calls.size(); first += batch) {
    const std::vector<Call> part(
        calls.begin() + static_cast<std::ptrdiff_t>(first),
        calls.begin() + static_cast<std::ptrdiff_t>(std::min(calls.size(), first + batch)));
    std::vector<Placed> places;
    std::vector<std::byte> image = layOut(part, r, n, places);
    std::byte* arena = nullptr;
    if (cudaMallocAsync(&arena, image.size(), setup[0]) != cudaSuccess)
      return "allocating the arena failed";
    if (!copyNow(arena, image.data(), image.size(), setup[0])) return "uploading the arena failed";
    std::string failure;
    for (std::size_t k = 0; k < part.size() && failure.empty(); ++k) {
      if (local() % 8 == 0) std::this_thread::sleep_for(std::chrono::microseconds(local() % 300));
      const cudaStream_t s = work[local() % static_cast<std::uint64_t>(streams)];
      const Status st = issue(comm, part[k].c, arena + places[k].send, arena + places[k].recv, s);
      if (!st.isOk())
        failure = "call " + std::to_string(first + k) + " (" + describe(part[k].c, n) +
                  "): " + st.toString();
    }
    for (cudaStream_t s : work.s) {
      if (cudaStreamSynchronize(s) != cudaSuccess && failure.empty())
        failure = "a stream failed after the batch from call " + std::to_string(first);
    }
    if (const Status a = comm.asyncError(); !a.isOk() && failure.empty()) failure = a.toString();
    if (failure.empty() && !copyNow(image.data(), arena, image.size(), setup[0]))
      failure = "downloading the arena failed";
    (void)cudaFreeAsync(arena, setup[0]);
    if (!failure.empty()) return "rank " + std::to_string(r) + ": " + failure;
    for (std::size_t k = 0; k < part.size(); ++k) {
      const Call& call = part[k];
      std::vector<std::vector<std::byte>> original;
      for (int q = 0; q < n; ++q) original.push_back(caseInput(call.c, call.seed, q, n));
      const std::vector<std::byte> got(
          image.begin() + static_cast<std::ptrdiff_t>(places[k].result),
          image.begin() + static_cast<std::ptrdiff_t>(places[k].result + places[k].resultBytes));
      if (std::string err = checkRank(call.c, n, r, original, got); !err.empty())
        return "call " + std::to_string(first + k) + " (" + describe(call.c, n) + ", stream " +
               "chosen at random): " + err;
    }
  }
  return "";
}

constexpr std::size_t kRandomCalls = 1000;
constexpr std::size_t kBatch = 50;

class GpuThreadsOrdering : public ::testing::TestWithParam<int> {};

// Ranks as threads: 1,000 random calls over three streams a rank. (WEFT_CHECK_PLANS runs
// between processes: its host barrier at every call lines the threads up, so that a rank's
// first call of a size, which copies the schedule and may allocate scratch with the device
// busy, meets its peers' kernels already spinning; see the processes' test.)
TEST_P(GpuThreadsOrdering, RandomCallsOnThreeStreams) {
  SKIP_WITHOUT_GPU();
  const int n = GetParam();
  ScopedEnv timeoutEnv("WEFT_TIMEOUT_S", "30");
  std::vector<Comm> comms = threadRanks(n);
  ASSERT_EQ(comms.size(), static_cast<std::size_t>(n));
  const std::vector<Call> calls =
      randomCalls(20261201 + static_cast<std::uint64_t>(n), n, kRandomCalls);
  std::vector<std::string> errors(static_cast<std::size_t>(n));
  onEveryRank(n, [&](int r) {
    ASSERT_EQ(cudaSetDevice(spreadDevice(r)), cudaSuccess);
    errors[static_cast<std::size_t>(r)] =
        runRandom(comms[static_cast<std::size_t>(r)], r, n, calls, 3, kBatch);
  });
  for (const std::string& e : errors) EXPECT_EQ(e, "");
}

// The calls of one FSDP2 training step as PyTorch issues them: the all-gather of the next
// layer's parameters on the all-gather stream, the reduce-scatter of this layer's gradients
// (525,568 floats to 262,784, the call that stalled; sum and avg) on the reduce-scatter stream,
// and an all-reduce of one float on the main stream, no stream waiting for another. Small
// integers make every result exact. Rank r of n, `steps` steps.
std::string runFsdpSteps(Comm& comm, int r, int n, int steps) {
  constexpr std::size_t kShard = 262784;
  const std::size_t full = kShard * static_cast<std::size_t>(n);
  RankStreams s(4);  // all-gather, reduce-scatter, main, set-up
  auto value = [](int rank, std::size_t i, int step) {
    return static_cast<float>(
        (i * 3 + static_cast<std::size_t>(rank) * 5 + static_cast<std::size_t>(step)) % 64);
  };
  struct Step {
    float *agIn, *agOut, *rsIn, *rsOut, *arIn, *arOut;
  };
  std::vector<Step> bufs(static_cast<std::size_t>(steps));
  for (int k = 0; k < steps; ++k) {
    Step& b = bufs[static_cast<std::size_t>(k)];
    for (auto [p, count] : {std::pair{&b.agIn, kShard},
                            {&b.agOut, full},
                            {&b.rsIn, full},
                            {&b.rsOut, kShard},
                            {&b.arIn, std::size_t{1}},
                            {&b.arOut, std::size_t{1}}}) {
      if (cudaMallocAsync(p, count * sizeof(float), s[3]) != cudaSuccess)
        return "allocating the buffers failed";
      if (cudaMemsetAsync(*p, 0xA5, count * sizeof(float), s[3]) != cudaSuccess)
        return "cudaMemsetAsync failed";
    }
    std::vector<float> host(full);
    for (std::size_t i = 0; i < full; ++i) host[i] = value(r, i, k);
    if (!copyNow(b.agIn, host.data(), kShard * sizeof(float), s[3]) ||
        !copyNow(b.rsIn, host.data(), full * sizeof(float), s[3]) ||
        !copyNow(b.arIn, host.data(), sizeof(float), s[3]))
      return "uploading the inputs failed";
  }
  std::string failure;
  for (int k = 0; k < steps && failure.empty(); ++k) {
    const Step& b = bufs[static_cast<std::size_t>(k)];
    const RedOp rsOp = k % 2 == 0 ? RedOp::sum : RedOp::avg;
    Status st = comm.allGather(b.agIn, b.agOut, kShard, DataType::f32, s[0]);
    if (st.isOk()) st = comm.reduceScatter(b.rsIn, b.rsOut, kShard, DataType::f32, rsOp, s[1]);
    if (st.isOk()) st = comm.allReduce(b.arIn, b.arOut, 1, DataType::f32, RedOp::sum, s[2]);
    if (!st.isOk()) failure = "step " + std::to_string(k) + ": " + st.toString();
  }
  for (int i = 0; i < 3; ++i) (void)cudaStreamSynchronize(s[static_cast<std::size_t>(i)]);
  if (const Status a = comm.asyncError(); !a.isOk() && failure.empty()) failure = a.toString();
  for (int k = 0; k < steps && failure.empty(); ++k) {
    const Step& b = bufs[static_cast<std::size_t>(k)];
    std::vector<float> ag(full), rs(kShard);
    float ar = 0;
    if (!copyNow(ag.data(), b.agOut, full * sizeof(float), s[3]) ||
        !copyNow(rs.data(), b.rsOut, kShard * sizeof(float), s[3]) ||
        !copyNow(&ar, b.arOut, sizeof(float), s[3])) {
      failure = "downloading the results failed";
      break;
    }
    for (std::size_t i = 0; i < full && failure.empty(); ++i) {
      const float want = value(static_cast<int>(i / kShard), i % kShard, k);
      if (ag[i] != want)
        failure = "step " + std::to_string(k) + " all-gather element " + std::to_string(i) + ": " +
                  std::to_string(ag[i]) + ", expected " + std::to_string(want);
    }
    for (std::size_t i = 0; i < kShard && failure.empty(); ++i) {
      double sum = 0;
      for (int q = 0; q < n; ++q) sum += value(q, static_cast<std::size_t>(r) * kShard + i, k);
      const double want = k % 2 == 0 ? sum : sum / n;
      if (rs[i] != static_cast<float>(want))
        failure = "step " + std::to_string(k) + " reduce-scatter element " + std::to_string(i) +
                  ": " + std::to_string(rs[i]) + ", expected " + std::to_string(want);
    }
    double sum = 0;
    for (int q = 0; q < n; ++q) sum += value(q, 0, k);
    if (failure.empty() && ar != static_cast<float>(sum))
      failure = "step " + std::to_string(k) + " all-reduce: " + std::to_string(ar) + ", expected " +
                std::to_string(sum);
  }
  for (const Step& b : bufs) {
    for (float* p : {b.agIn, b.agOut, b.rsIn, b.rsOut, b.arIn, b.arOut})
      (void)cudaFreeAsync(p, s[3]);
  }
  return failure.empty() ? "" : "rank " + std::to_string(r) + ": " + failure;
}

TEST_P(GpuThreadsOrdering, FsdpStepStreamsRunInIssueOrder) {
  SKIP_WITHOUT_GPU();
  const int n = GetParam();
  ScopedEnv timeoutEnv("WEFT_TIMEOUT_S", "20");
  std::vector<Comm> comms = threadRanks(n);
  ASSERT_EQ(comms.size(), static_cast<std::size_t>(n));
  std::vector<std::string> errors(static_cast<std::size_t>(n));
  onEveryRank(n, [&](int r) {
    ASSERT_EQ(cudaSetDevice(spreadDevice(r)), cudaSuccess);
    errors[static_cast<std::size_t>(r)] =
        runFsdpSteps(comms[static_cast<std::size_t>(r)], r, n, 12);
  });
  for (const std::string& e : errors) EXPECT_EQ(e, "");
}

// Graphs among eager calls: per replay, an eager all-reduce on stream E, the graph on stream G,
// another eager all-reduce on E, none waiting for another. The graph holds an all-reduce on G
// and an all-gather on G2, forked from G before either (so the capture itself orders nothing
// between them). Small integers make every result exact.
TEST_P(GpuThreadsOrdering, GraphsAmongEagerCallsOnOtherStreams) {
  SKIP_WITHOUT_GPU();
  const int n = GetParam();
  ScopedEnv timeoutEnv("WEFT_TIMEOUT_S", "20");
  std::vector<Comm> comms = threadRanks(n);
  ASSERT_EQ(comms.size(), static_cast<std::size_t>(n));
  for (std::size_t count : {4099ul, 1ul << 18}) {
    const std::size_t bytes = count * sizeof(float);
    std::vector<std::string> errors(static_cast<std::size_t>(n));
    onEveryRank(n, [&](int r) {
      ASSERT_EQ(cudaSetDevice(spreadDevice(r)), cudaSuccess);
      Comm& comm = comms[static_cast<std::size_t>(r)];
      RankStreams s(4);  // G, G2, E, set-up
      // a -> b (graph all-reduce), c -> d (graph all-gather), e -> f and g -> h (eager).
      std::vector<float*> buf(8);
      for (std::size_t i = 0; i < buf.size(); ++i) {
        const std::size_t size = i == 3 ? bytes * static_cast<std::size_t>(n) : bytes;
        ASSERT_EQ(cudaMallocAsync(&buf[i], size, s[3]), cudaSuccess);
      }
      ASSERT_EQ(cudaStreamSynchronize(s[3]), cudaSuccess);
      float *a = buf[0], *b = buf[1], *c = buf[2], *d = buf[3], *e = buf[4], *f = buf[5],
            *g = buf[6], *h = buf[7];
      // The first call of each size sets up outside any capture.
      ASSERT_TRUE(comm.allReduce(a, b, count, RedOp::sum, s[0]).isOk());
      ASSERT_TRUE(comm.allGather(c, d, count, DataType::f32, s[0]).isOk());
      ASSERT_EQ(cudaStreamSynchronize(s[0]), cudaSuccess);
      cudaEvent_t fork = nullptr, join = nullptr;
      ASSERT_EQ(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming), cudaSuccess);
      ASSERT_EQ(cudaEventCreateWithFlags(&join, cudaEventDisableTiming), cudaSuccess);
      cudaGraph_t graph = nullptr;
      ASSERT_EQ(cudaStreamBeginCapture(s[0], cudaStreamCaptureModeThreadLocal), cudaSuccess);
      ASSERT_EQ(cudaEventRecord(fork, s[0]), cudaSuccess);
      ASSERT_EQ(cudaStreamWaitEvent(s[1], fork, 0), cudaSuccess);
      const Status st1 = comm.allReduce(a, b, count, RedOp::sum, s[0]);
      const Status st2 = comm.allGather(c, d, count, DataType::f32, s[1]);
      ASSERT_EQ(cudaEventRecord(join, s[1]), cudaSuccess);
      ASSERT_EQ(cudaStreamWaitEvent(s[0], join, 0), cudaSuccess);
      ASSERT_EQ(cudaStreamEndCapture(s[0], &graph), cudaSuccess);
      ASSERT_TRUE(st1.isOk()) << st1.toString();
      ASSERT_TRUE(st2.isOk()) << st2.toString();
      cudaGraphExec_t exec = nullptr;
      ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
      std::string& err = errors[static_cast<std::size_t>(r)];
      auto input = [&](int rank, int which, int replay, std::size_t i) {
        return static_cast<float>(
            (i * 7 + static_cast<std::size_t>(rank * 11 + which * 3 + replay)) % 32);
      };
      for (int replay = 0; replay < 4 && err.empty(); ++replay) {
        std::vector<float> host(count);
        for (auto [ptr, which] : {std::pair{a, 0}, {c, 1}, {e, 2}, {g, 3}}) {
          for (std::size_t i = 0; i < count; ++i) host[i] = input(r, which, replay, i);
          copyNow(ptr, host.data(), bytes, s[3]);
        }
        for (float* p : {b, d, f, h}) {
          ASSERT_EQ(
              cudaMemsetAsync(p, 0xA5, p == d ? bytes * static_cast<std::size_t>(n) : bytes, s[3]),
              cudaSuccess);
        }
        ASSERT_EQ(cudaStreamSynchronize(s[3]), cudaSuccess);
        Status st = comm.allReduce(e, f, count, RedOp::sum, s[2]);
        if (st.isOk() && cudaGraphLaunch(exec, s[0]) != cudaSuccess)
          st = Status(Code::systemError, "cudaGraphLaunch failed");
        if (st.isOk()) st = comm.allReduce(g, h, count, RedOp::sum, s[2]);
        for (std::size_t i = 0; i < 3; ++i) (void)cudaStreamSynchronize(s[i]);
        if (!st.isOk()) err = st.toString();
        if (const Status as = comm.asyncError(); !as.isOk() && err.empty()) err = as.toString();
        std::vector<float> got(count * static_cast<std::size_t>(n));
        for (auto [ptr, which] : {std::pair{b, 0}, {d, 1}, {f, 2}, {h, 3}}) {
          if (!err.empty()) break;
          const std::size_t len = which == 1 ? count * static_cast<std::size_t>(n) : count;
          copyNow(got.data(), ptr, len * sizeof(float), s[3]);
          for (std::size_t i = 0; i < len && err.empty(); ++i) {
            double want = 0;
            if (which == 1) {
              want = input(static_cast<int>(i / count), 1, replay, i % count);
            } else {
              for (int q = 0; q < n; ++q) want += input(q, which, replay, i);
            }
            if (got[i] != static_cast<float>(want))
              err = "rank " + std::to_string(r) + " replay " + std::to_string(replay) +
                    (which == 0   ? " graph all-reduce"
                     : which == 1 ? " graph all-gather"
                     : which == 2 ? " eager all-reduce before the graph"
                                  : " eager all-reduce after the graph") +
                    " element " + std::to_string(i) + ": " + std::to_string(got[i]) +
                    ", expected " + std::to_string(want);
          }
        }
      }
      (void)cudaGraphExecDestroy(exec);
      (void)cudaGraphDestroy(graph);
      (void)cudaEventDestroy(fork);
      (void)cudaEventDestroy(join);
      for (float* p : buf) (void)cudaFreeAsync(p, s[3]);
      (void)cudaStreamSynchronize(s[3]);
    });
    for (const std::string& e : errors) EXPECT_EQ(e, "") << "count " << count;
  }
}

// Two host threads per rank share its communicator, each issuing all-reduces on a stream of its
// own: weft serializes the calls (weftComm's lock), so whatever the order the threads take, no
// FIFO is shared by two calls at once. The threads' calls pair up across ranks in any order, so
// every rank contributes the same value to each (rank + 1): every result is n(n+1)/2.
TEST_P(GpuThreadsOrdering, TwoHostThreadsShareACommunicator) {
  SKIP_WITHOUT_GPU();
  const int n = GetParam();
  ScopedEnv timeoutEnv("WEFT_TIMEOUT_S", "20");
  std::vector<Comm> comms = threadRanks(n);
  ASSERT_EQ(comms.size(), static_cast<std::size_t>(n));
  constexpr int kCalls = 100;
  constexpr std::size_t kCount = 70000;  // past the ll kernel: the slabs or the FIFOs
  std::vector<std::string> errors(static_cast<std::size_t>(2 * n));
  std::vector<std::thread> threads;
  for (int t = 0; t < 2 * n; ++t) {
    threads.emplace_back([&, t] {
      const int r = t / 2;
      std::string& err = errors[static_cast<std::size_t>(t)];
      if (cudaSetDevice(spreadDevice(r)) != cudaSuccess) {
        err = "cudaSetDevice failed";
        return;
      }
      RankStreams s(2);
      float *in = nullptr, *out = nullptr;
      if (cudaMallocAsync(&in, kCount * sizeof(float), s[1]) != cudaSuccess ||
          cudaMallocAsync(&out, kCalls * kCount * sizeof(float), s[1]) != cudaSuccess) {
        err = "allocating the buffers failed";
        return;
      }
      const std::vector<float> mine(kCount, static_cast<float>(r + 1));
      copyNow(in, mine.data(), kCount * sizeof(float), s[1]);
      for (int k = 0; k < kCalls && err.empty(); ++k) {
        const Status st = comms[static_cast<std::size_t>(r)].allReduce(
            in, out + static_cast<std::size_t>(k) * kCount, kCount, RedOp::sum, s[0]);
        if (!st.isOk()) err = st.toString();
      }
      (void)cudaStreamSynchronize(s[0]);
      std::vector<float> got(kCalls * kCount);
      if (err.empty()) copyNow(got.data(), out, got.size() * sizeof(float), s[1]);
      const auto want = static_cast<float>(n * (n + 1) / 2);
      for (std::size_t i = 0; i < got.size() && err.empty(); ++i) {
        if (got[i] != want)
          err = "rank " + std::to_string(r) + " thread " + std::to_string(t % 2) + " element " +
                std::to_string(i) + ": " + std::to_string(got[i]);
      }
      (void)cudaFreeAsync(in, s[1]);
      (void)cudaFreeAsync(out, s[1]);
      (void)cudaStreamSynchronize(s[1]);
    });
  }
  for (std::thread& th : threads) th.join();
  for (const std::string& e : errors) EXPECT_EQ(e, "");
}

INSTANTIATE_TEST_SUITE_P(Ranks, GpuThreadsOrdering, ::testing::Values(2, 3, 4),
                         [](const auto& p) { return std::to_string(p.param) + "ranks"; });

// WEFT_CHECK_PLANS: matching calls pass; a call whose count differs between ranks fails on
// every rank, each naming both ranks' calls (the call signatures, which would see it first, off).
TEST(GpuCheckPlans, AMismatchedCallIsAnErrorOnEveryRank) {
  SKIP_WITHOUT_GPU();
  ScopedEnv checkEnv("WEFT_CHECK_PLANS", "1");
  ScopedEnv callsEnv("WEFT_CHECK_CALLS", "0");
  ScopedEnv timeoutEnv("WEFT_TIMEOUT_S", "20");
  constexpr int n = 2;
  std::vector<Comm> comms = threadRanks(n);
  ASSERT_EQ(comms.size(), static_cast<std::size_t>(n));
  std::vector<Status> good(n), bad(n);
  onEveryRank(n, [&](int r) {
    const auto R = static_cast<std::size_t>(r);
    RankStreams s(1);
    float* buf = nullptr;
    ASSERT_EQ(cudaMallocAsync(&buf, 1 << 20, s[0]), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s[0]), cudaSuccess);
    good[R] = comms[R].allReduce(buf, buf, 1000, RedOp::sum, s[0]);
    if (good[R].isOk()) good[R] = comms[R].allGather(buf, buf + 4096, 100, DataType::f32, s[0]);
    (void)cudaStreamSynchronize(s[0]);
    bad[R] = comms[R].allReduce(buf, buf, r == 0 ? 100 : 200, RedOp::sum, s[0]);
    (void)cudaStreamSynchronize(s[0]);
    (void)cudaFreeAsync(buf, s[0]);
    (void)cudaStreamSynchronize(s[0]);
  });
  for (int r = 0; r < n; ++r) {
    const auto R = static_cast<std::size_t>(r);
    EXPECT_TRUE(good[R].isOk()) << good[R].toString();
    EXPECT_EQ(bad[R].code(), Code::invalidUsage) << bad[R].toString();
    EXPECT_NE(bad[R].message().find("WEFT_CHECK_PLANS"), std::string::npos) << bad[R].message();
    EXPECT_NE(bad[R].message().find("f32, 100"), std::string::npos) << bad[R].message();
    EXPECT_NE(bad[R].message().find("f32, 200"), std::string::npos) << bad[R].message();
  }
}

// ---- ranks as processes sharing the GPU ----------------------------------------------------

class GpuProcessesOrdering : public ::testing::TestWithParam<int> {};

// The FSDP2 step's streams and the 1,000 random calls, each rank a process of its own; at 2
// ranks with WEFT_CHECK_PLANS=1, every rank's plan of every call compared.
TEST_P(GpuProcessesOrdering, FsdpStepsAndRandomCallsOnThreeStreams) {
  SKIP_UNLESS_FORKABLE();
  const int n = GetParam();
  ScopedEnv timeoutEnv("WEFT_TIMEOUT_S", "30");
  ScopedEnv checkEnv("WEFT_CHECK_PLANS", n == 2 ? "1" : "0");
  if (kSetHardwareQueues) unsetenv("CUDA_DEVICE_MAX_CONNECTIONS");
  std::vector<pid_t> pids;
  const std::vector<Call> calls =
      randomCalls(20261202 + static_cast<std::uint64_t>(n), n, kRandomCalls);
  const std::vector<int> codes = forkRanks(
      n,
      [&](int r, Comm& comm) {
        if (cudaSetDevice(spreadDevice(r)) != cudaSuccess) return 3;
        std::string err = runFsdpSteps(comm, r, n, 8);
        if (err.empty()) err = runRandom(comm, r, n, calls, 3, kBatch);
        if (!err.empty()) std::fprintf(stderr, "%s\n", err.c_str());
        return err.empty() ? 0 : 1;
      },
      &pids, std::chrono::seconds(300));
  if (kSetHardwareQueues) setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 1);
  for (std::size_t r = 0; r < codes.size(); ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
  EXPECT_EQ(segmentsOf(pids), 0);
}

INSTANTIATE_TEST_SUITE_P(Ranks, GpuProcessesOrdering, ::testing::Values(2, 4),
                         [](const auto& p) { return std::to_string(p.param) + "ranks"; });

}  // namespace
}  // namespace weft::test
