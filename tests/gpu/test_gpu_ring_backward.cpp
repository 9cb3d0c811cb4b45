// Ring attention's backward pass (weftRingAttentionBackward), ranks as threads sharing the GPU:
// every rank's zigzag shard runs the forward, then the backward with its shard of a random dOut;
// dq, dk and dv of every token against the gradients in double over the whole sequences; causal
// and not, grouped K/V heads, ragged and empty sequences; both calls replayed from a CUDA graph;
// by the ring, Ulysses and the hybrid; ranks as threads and as processes.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tests/gpu/gpu_harness.hpp"
#include "tests/gpu/ring_reference.hpp"
#include "tests/runtime/fork.hpp"
#include "weft/weft.hpp"

namespace weft::test {
namespace {

// Device memory of a host vector's bytes (+16: none empty), freed with the object.
struct OnDevice {
  void* p = nullptr;
  std::size_t bytes = 0;
  template <typename T>
  explicit OnDevice(const std::vector<T>& host) : bytes(host.size() * sizeof(T)) {
    EXPECT_EQ(cudaMalloc(&p, bytes + 16), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(p, host.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
  }
  explicit OnDevice(std::size_t size) : bytes(size) {
    EXPECT_EQ(cudaMalloc(&p, bytes + 16), cudaSuccess);
    EXPECT_EQ(cudaMemset(p, 0xFF, bytes), cudaSuccess);  // poisoned: NaN in bf16 and f32
    // cudaMemset may return before it is done, and the calls' (non-blocking) streams do not
    // wait for it; the legacy stream alone (a device-wide wait could wait for a peer's kernel
    // that waits for this rank, with ranks as threads).
    EXPECT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
  }
  ~OnDevice() { (void)cudaFree(p); }
  OnDevice(const OnDevice&) = delete;
  OnDevice& operator=(const OnDevice&) = delete;
  template <typename T>
  std::vector<T> read() const {
    std::vector<T> host(bytes / sizeof(T));
    EXPECT_EQ(cudaMemcpy(host.data(), p, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }
};

// bf16 gradients within their rounding and the f32 accumulation's order: 1% of the largest
// gradient of the tensor plus 2% of the value.
int compare(const std::vector<std::uint16_t>& got, const std::vector<double>& want,
            const std::string& what) {
  double most = 0;
  for (double x : want) most = std::max(most, std::fabs(x));
  int bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = fromBf16(got[i]);
    if (!(std::fabs(g - want[i]) <= 1e-2 * most + 2e-2 * std::fabs(want[i])) && bad++ < 3)
      ADD_FAILURE() << what << " [" << i << "] = " << g << ", expected " << want[i] << " (largest "
                    << most << ")";
  }
  return bad;
}

// The whole problem: packed sequences of 10n, 0, 2n and 32n tokens (n ranks), random q, k, v
// and dO in bf16.
struct Problem {
  Global g;
  std::vector<std::uint16_t> dOutRaw;
  std::vector<float> dOut;  // as the kernels read it
  int sequences() const { return static_cast<int>(g.cu.size()) - 1; }
  explicit Problem(int n, int heads = 4, int kvHeads = 2) {
    g.heads = heads, g.kvHeads = kvHeads;
    std::mt19937 rng(70 + n);
    std::normal_distribution<float> normal(0, 1);
    const auto chunks = [&](int c) { return static_cast<std::int32_t>(2 * n * c); };
    g.cu = {0, chunks(5), chunks(5), chunks(6), chunks(22)};
    dOutRaw.resize(g.tokens() * static_cast<std::size_t>(g.heads * g.dim));
    for (auto* x : {&g.q, &g.k, &g.v, &dOutRaw}) {
      if (x != &dOutRaw)
        x->resize(g.tokens() * static_cast<std::size_t>((x == &g.q ? g.heads : g.kvHeads) * g.dim));
      for (auto& b : *x) b = toBf16(normal(rng));
    }
    dOut.resize(dOutRaw.size());
    for (std::size_t i = 0; i < dOut.size(); ++i) dOut[i] = fromBf16(dOutRaw[i]);
  }
};

// Rank r's share on the device: its q, k, v and dO, the forward's out and lse, the gradients
// (poisoned), and the calls' descriptions.
struct RankShare {
  std::vector<std::int32_t> cu, positions;
  std::size_t qWidth, kWidth;
  OnDevice q, k, v, dO, dcu, out, lse, gq, gk, gv;
  weftAttention a{};
  weftAttentionGrads grads{};
  RankShare(const Problem& p, bool causal, std::vector<std::int32_t> localCu,
            std::vector<std::int32_t> pos)
      : cu(std::move(localCu)),
        positions(std::move(pos)),
        qWidth(static_cast<std::size_t>(p.g.dim * p.g.heads)),
        kWidth(static_cast<std::size_t>(p.g.dim * p.g.kvHeads)),
        q(shardOf(p.g.q, qWidth, p.g.cu, cu, positions)),
        k(shardOf(p.g.k, kWidth, p.g.cu, cu, positions)),
        v(shardOf(p.g.v, kWidth, p.g.cu, cu, positions)),
        dO(shardOf(p.dOutRaw, qWidth, p.g.cu, cu, positions)),
        dcu(cu),
        out(q.bytes),
        lse(static_cast<std::size_t>(cu.back()) * static_cast<std::size_t>(p.g.heads) * 4),
        gq(q.bytes),
        gk(k.bytes),
        gv(v.bytes) {
    std::size_t maxSeqlen = 0;
    for (std::size_t s = 0; s + 1 < cu.size(); ++s)
      maxSeqlen = std::max<std::size_t>(maxSeqlen, static_cast<std::size_t>(cu[s + 1] - cu[s]));
    a = weftAttention{q.p,
                      k.p,
                      v.p,
                      out.p,
                      static_cast<float*>(lse.p),
                      static_cast<const std::int32_t*>(dcu.p),
                      p.sequences(),
                      static_cast<std::size_t>(cu.back()),
                      maxSeqlen,
                      p.g.heads,
                      p.g.kvHeads,
                      p.g.dim,
                      weftBfloat16,
                      causal ? 1 : 0,
                      0.0f};
    grads = weftAttentionGrads{dO.p, gq.p, gk.p, gv.p};
  }
  // Forward, then backward, on the stream.
  void run(Comm& comm, cudaStream_t stream) const {
    EXPECT_EQ(weftRingAttention(&a, nullptr, 0, comm.handle(), stream), weftSuccess)
        << weftGetLastError();
    EXPECT_EQ(weftRingAttentionBackward(&a, &grads, nullptr, 0, comm.handle(), stream), weftSuccess)
        << weftGetLastError();
  }
};

std::unique_ptr<RankShare> shareOf(const Problem& p, int n, int r, bool causal) {
  std::vector<std::int32_t> cu(p.g.cu.size()), positions(p.g.tokens());
  EXPECT_EQ(weftZigzagLocal(p.g.cu.data(), p.sequences(), n, r, cu.data(), positions.data()),
            weftSuccess)
      << weftGetLastError();
  positions.resize(static_cast<std::size_t>(cu.back()));
  return std::make_unique<RankShare>(p, causal, std::move(cu), std::move(positions));
}

// n ranks' gradients (of `heads` and `kvHeads`) against those in double over the whole
// sequences.
void expectGradients(int n, int heads = 4, int kvHeads = 2) {
  const auto N = static_cast<std::size_t>(n);
  auto comms = threadRanks(n);
  ASSERT_EQ(comms.size(), N);
  Streams streams(n);
  const Problem p(n, heads, kvHeads);
  for (bool causal : {false, true}) {
    std::vector<double> dq, dk, dv;
    p.g.gradients(causal, p.dOut, dq, dk, dv);
    std::vector<int> bad(N, 0);
    RanksMeet ranks(n);
    onEveryRank(n, [&](int r) {
      RanksMeet::Meet done(ranks);  // before x's memory is freed
      const auto R = static_cast<std::size_t>(r);
      auto x = shareOf(p, n, r, causal);
      x->run(comms[R], streams[r]);
      EXPECT_EQ(cudaStreamSynchronize(streams[r]), cudaSuccess);
      done.meet();
      EXPECT_TRUE(comms[R].asyncError().isOk()) << comms[R].asyncError().toString();
      const std::string what = std::to_string(n) + " ranks, rank " + std::to_string(r) +
                               (causal ? ", causal: " : ", full: ");
      const auto& [cu, pos] = std::pair{x->cu, x->positions};
      bad[R] += compare(x->gq.read<std::uint16_t>(), shardOf(dq, x->qWidth, p.g.cu, cu, pos),
                        what + "dq");
      bad[R] += compare(x->gk.read<std::uint16_t>(), shardOf(dk, x->kWidth, p.g.cu, cu, pos),
                        what + "dk");
      bad[R] += compare(x->gv.read<std::uint16_t>(), shardOf(dv, x->kWidth, p.g.cu, cu, pos),
                        what + "dv");
    });
    for (std::size_t r = 0; r < N; ++r) EXPECT_EQ(bad[r], 0) << "rank " << r;
  }
}

class GpuRingAttentionBackward : public ::testing::TestWithParam<int> {};

TEST_P(GpuRingAttentionBackward, MatchesTheGradientsOverTheWholeSequences) {
  SKIP_WITHOUT_GPU();
  ASSERT_EQ(setenv("WEFT_CP_ATTENTION", "ring", 1), 0);
  expectGradients(GetParam());
  unsetenv("WEFT_CP_ATTENTION");
}

// Ulysses forced (read as the communicators start), where the ranks divide both head counts,
// and the hybrid (groups of 2) on 4 ranks of 4 and 2 heads.
class GpuUlyssesAttentionBackward : public ::testing::TestWithParam<int> {};

TEST_P(GpuUlyssesAttentionBackward, MatchesTheGradientsOverTheWholeSequences) {
  SKIP_WITHOUT_GPU();
  ASSERT_EQ(setenv("WEFT_CP_ATTENTION", "ulysses", 1), 0);
  expectGradients(GetParam(), 2 * GetParam(), GetParam());
  unsetenv("WEFT_CP_ATTENTION");
}

INSTANTIATE_TEST_SUITE_P(Ranks, GpuUlyssesAttentionBackward, ::testing::Values(2, 4),
                         [](const ::testing::TestParamInfo<int>& p) {
                           return std::to_string(p.param) + "ranks";
                         });

TEST(GpuHybridAttentionBackward, MatchesTheGradientsOverTheWholeSequences) {
  SKIP_WITHOUT_GPU();
  ASSERT_EQ(setenv("WEFT_CP_ATTENTION", "hybrid", 1), 0);
  expectGradients(4);
  unsetenv("WEFT_CP_ATTENTION");
}

INSTANTIATE_TEST_SUITE_P(Ranks, GpuRingAttentionBackward, ::testing::Values(1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& p) {
                           return std::to_string(p.param) + "ranks";
                         });

// Forward and backward captured into a graph on each rank's stream (after one call outside it,
// which sets up the communicator's workspace and side stream): replays write what the calls
// wrote, bit for bit.
struct GraphCase {
  const char* way;  // WEFT_CP_ATTENTION
  int n;
};
class GpuRingAttentionGraphs : public ::testing::TestWithParam<GraphCase> {};

TEST_P(GpuRingAttentionGraphs, ForwardAndBackwardReplayFromAGraph) {
  SKIP_WITHOUT_GPU();
  const int n = GetParam().n;
  ASSERT_EQ(setenv("WEFT_CP_ATTENTION", GetParam().way, 1), 0);
  const auto N = static_cast<std::size_t>(n);
  auto comms = threadRanks(n);
  ASSERT_EQ(comms.size(), N);
  Streams streams(n);
  const Problem p(n);
  RanksMeet ranks(n), instantiated(n), replayed(n);
  onEveryRank(n, [&](int r) {
    // Met in this order; declared in the reverse, so that a failed ASSERT's return meets them
    // in the same order too.
    RanksMeet::Meet last(replayed);
    RanksMeet::Meet ready(instantiated);
    RanksMeet::Meet done(ranks);
    const auto R = static_cast<std::size_t>(r);
    auto x = shareOf(p, n, r, true);
    x->run(comms[R], streams[r]);
    ASSERT_EQ(cudaStreamSynchronize(streams[r]), cudaSuccess);
    done.meet();  // before the reads and the capture's instantiation
    const auto out = x->out.read<std::uint16_t>();
    const auto gq = x->gq.read<std::uint16_t>(), gk = x->gk.read<std::uint16_t>(),
               gv = x->gv.read<std::uint16_t>();
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaStreamBeginCapture(streams[r], cudaStreamCaptureModeThreadLocal), cudaSuccess);
    x->run(comms[R], streams[r]);
    ASSERT_EQ(cudaStreamEndCapture(streams[r], &graph), cudaSuccess);
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    (void)cudaGraphDestroy(graph);
    ready.meet();  // instantiating loads the graph's kernels, which may wait for the device
    for (int replay = 0; replay < 2; ++replay) {
      for (const OnDevice* o : {&x->out, &x->gq, &x->gk, &x->gv})
        ASSERT_EQ(cudaMemset(o->p, 0xFF, o->bytes), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);  // before the graph's stream
      ASSERT_EQ(cudaGraphLaunch(exec, streams[r]), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(streams[r]), cudaSuccess);
      EXPECT_EQ(x->out.read<std::uint16_t>(), out) << "rank " << r << " replay " << replay;
      EXPECT_EQ(x->gq.read<std::uint16_t>(), gq) << "rank " << r << " replay " << replay;
      EXPECT_EQ(x->gk.read<std::uint16_t>(), gk) << "rank " << r << " replay " << replay;
      EXPECT_EQ(x->gv.read<std::uint16_t>(), gv) << "rank " << r << " replay " << replay;
    }
    EXPECT_TRUE(comms[R].asyncError().isOk()) << comms[R].asyncError().toString();
    last.meet();
    (void)cudaGraphExecDestroy(exec);
  });
  unsetenv("WEFT_CP_ATTENTION");
}

INSTANTIATE_TEST_SUITE_P(Ranks, GpuRingAttentionGraphs,
                         ::testing::Values(GraphCase{"ring", 1}, GraphCase{"ring", 2},
                                           GraphCase{"ring", 3}, GraphCase{"ulysses", 2},
                                           GraphCase{"hybrid", 4}),
                         [](const ::testing::TestParamInfo<GraphCase>& p) {
                           return std::string(p.param.way) + std::to_string(p.param.n) + "ranks";
                         });

// The forward's out and lse of rank r's share against attention in double over the whole
// sequences (the tolerances of test_gpu_ring.cpp): the values wrong.
int forwardWrong(const Problem& p, const RankShare& x, bool causal) {
  const auto out = x.out.read<std::uint16_t>();
  const auto lse = x.lse.read<float>();
  const auto D = static_cast<std::size_t>(p.g.dim), H = static_cast<std::size_t>(p.g.heads);
  const auto local = static_cast<std::size_t>(x.cu.back());
  std::vector<double> want;
  double wantLse = 0;
  int bad = 0;
  for (std::size_t s = 0; s + 1 < x.cu.size(); ++s) {
    for (std::int32_t i = x.cu[s]; i < x.cu[s + 1]; ++i) {
      const auto t = static_cast<std::size_t>(p.g.cu[s] + x.positions[static_cast<std::size_t>(i)]);
      const auto li = static_cast<std::size_t>(i);
      for (std::size_t h = 0; h < H; ++h) {
        p.g.reference(t, static_cast<int>(h), causal, want, wantLse);
        if (!(std::fabs(lse[h * local + li] - wantLse) <= 1e-4 * (1 + std::fabs(wantLse)))) ++bad;
        for (std::size_t c = 0; c < D; ++c) {
          const double got = fromBf16(out[(li * H + h) * D + c]);
          if (!(std::fabs(got - want[c]) <= 8e-3 * (1 + std::fabs(want[c])))) ++bad;
        }
      }
    }
  }
  return bad;
}

// Ranks as processes sharing the GPU (each its own CUDA context, CUDA IPC between them): the
// forward and the backward by one way (WEFT_CP_ATTENTION, inherited), every rank checking its
// own share against the double references; nothing left in /dev/shm.
struct ProcessCase {
  const char* way;
  int n, heads, kvHeads;
};
class GpuAttentionProcesses : public ::testing::TestWithParam<ProcessCase> {};

TEST_P(GpuAttentionProcesses, ForwardAndBackwardAcrossProcesses) {
  SKIP_UNLESS_FORKABLE();
  const ProcessCase c = GetParam();
  // One rank a process needs no extra hardware queues (test_gpu_collectives.cpp's
  // GpuProcesses).
  if (kSetHardwareQueues) unsetenv("CUDA_DEVICE_MAX_CONNECTIONS");
  ASSERT_EQ(setenv("WEFT_CP_ATTENTION", c.way, 1), 0);
  const Problem p(c.n, c.heads, c.kvHeads);
  std::vector<double> grads[2][3];  // full and causal: dq, dk, dv
  for (int causal = 0; causal < 2; ++causal)
    p.g.gradients(causal == 1, p.dOut, grads[causal][0], grads[causal][1], grads[causal][2]);
  std::vector<pid_t> pids;
  const std::vector<int> codes = forkRanks(
      c.n,
      [&](int r, Comm& comm) {
        if (cudaSetDevice(spreadDevice(r)) != cudaSuccess) return 3;
        cudaStream_t stream = nullptr;
        if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) return 3;
        int bad = 0;
        for (int causal = 0; causal < 2; ++causal) {
          auto x = shareOf(p, c.n, r, causal == 1);
          x->run(comm, stream);
          if (cudaStreamSynchronize(stream) != cudaSuccess || !comm.asyncError().isOk()) {
            std::fprintf(stderr, "rank %d: %s\n", r, comm.asyncError().toString().c_str());
            return 2;
          }
          const auto& [cu, pos] = std::pair{x->cu, x->positions};
          const int wrong[4] = {
              forwardWrong(p, *x, causal == 1),
              compare(x->gq.read<std::uint16_t>(),
                      shardOf(grads[causal][0], x->qWidth, p.g.cu, cu, pos), "dq"),
              compare(x->gk.read<std::uint16_t>(),
                      shardOf(grads[causal][1], x->kWidth, p.g.cu, cu, pos), "dk"),
              compare(x->gv.read<std::uint16_t>(),
                      shardOf(grads[causal][2], x->kWidth, p.g.cu, cu, pos), "dv")};
          for (int w = 0; w < 4; ++w) {
            if (wrong[w] != 0)
              std::fprintf(stderr, "rank %d, %s: %d wrong %s\n", r, causal ? "causal" : "full",
                           wrong[w],
                           w == 0   ? "out or lse"
                           : w == 1 ? "dq"
                           : w == 2 ? "dk"
                                    : "dv");
            bad += wrong[w];
          }
        }
        (void)cudaStreamDestroy(stream);
        return bad == 0 ? 0 : 1;
      },
      &pids, std::chrono::seconds(300));
  unsetenv("WEFT_CP_ATTENTION");
  if (kSetHardwareQueues) setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 1);
  for (std::size_t r = 0; r < codes.size(); ++r) EXPECT_EQ(codes[r], 0) << c.way << ", rank " << r;
  EXPECT_EQ(segmentsOf(pids), 0);
}

INSTANTIATE_TEST_SUITE_P(Ways, GpuAttentionProcesses,
                         ::testing::Values(ProcessCase{"ring", 2, 4, 2},
                                           ProcessCase{"ring", 4, 4, 2},
                                           ProcessCase{"ulysses", 2, 4, 2},
                                           ProcessCase{"ulysses", 4, 8, 4},
                                           ProcessCase{"hybrid", 4, 4, 2}),
                         [](const ::testing::TestParamInfo<ProcessCase>& p) {
                           return std::string(p.param.way) + std::to_string(p.param.n) + "ranks";
                         });

}  // namespace
}  // namespace weft::test
