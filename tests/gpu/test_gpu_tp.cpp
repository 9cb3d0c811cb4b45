// The tensor-parallel GEMMs with their collective (weftAllGatherGemm, weftGemmReduceScatter),
// ranks as threads sharing the GPU: every variant (unfused, chunks that do and do not divide the
// rows, the selector's pick) against a double-precision GEMM of the same bf16 values, within the
// rounding the outputs take; the gathered A exact; from a CUDA graph's replays; bad calls refused
// without touching C.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "tests/gpu/gpu_harness.hpp"
#include "weft/weft.hpp"

namespace weft::test {
namespace {

// cuBLASLt loads its kernels lazily, and a kernel's loading waits for the kernels running in the
// process, among them other ranks' waiting for this one: ranks as threads of one process on one
// GPU load every module up front (before CUDA starts; weft-perf -t does the same).
[[maybe_unused]] const int kEagerModules = setenv("CUDA_MODULE_LOADING", "EAGER", 0);

using Bytes = std::vector<std::byte>;

// Values in [-1, 1] as bf16 (exactly what the GEMM multiplies).
Bytes randomBf16(std::size_t count, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1, 1);
  Bytes out(count * 2);
  for (std::size_t i = 0; i < count; ++i) store(out, i, DataType::bf16, u(rng));
  return out;
}

double at(const Bytes& b, std::size_t i) {
  return load(b, i, DataType::bf16);
}

// The shape and one call's buffers on every rank.
struct Problem {
  bool allGather = true;
  std::size_t m = 0, cols = 0, k = 0;
  int n = 1;
  bool bias = false;
  std::vector<Bytes> a, b, biases;  // each rank's A and B, as the call takes them
  // Rows and columns of each rank's A, B and C.
  std::size_t aRows() const { return allGather ? m / n : m; }
  std::size_t aCols() const { return allGather ? k : k / n; }
  std::size_t bRows() const { return allGather ? k : k / n; }
  std::size_t bCols() const { return allGather ? cols / n : cols; }
  std::size_t cRows() const { return allGather ? m : m / n; }
  std::size_t cCols() const { return bCols(); }

  void fill(std::mt19937& rng) {
    a.clear(), b.clear(), biases.clear();
    for (int r = 0; r < n; ++r) {
      a.push_back(randomBf16(aRows() * aCols(), rng));
      b.push_back(randomBf16(bRows() * bCols(), rng));
      biases.push_back(randomBf16(bCols(), rng));
    }
  }

  // Rank r's C in double, and the sum of |terms| a value is within the rounding of.
  void reference(int r, std::vector<double>& c, std::vector<double>& magnitude) const {
    const auto R = static_cast<std::size_t>(r);
    c.assign(cRows() * cCols(), 0);
    magnitude.assign(c.size(), 0);
    for (std::size_t i = 0; i < cRows(); ++i) {
      for (std::size_t j = 0; j < cCols(); ++j) {
        double sum = 0, mag = 0;
        if (allGather) {  // row i of the gathered A is row i % rows of rank i / rows
          const std::size_t rows = m / n, src = i / rows, row = i % rows;
          for (std::size_t x = 0; x < k; ++x) {
            const double t = at(a[src], row * k + x) * at(b[R], x * cCols() + j);
            sum += t, mag += std::fabs(t);
          }
          if (bias) sum += at(biases[0], j), mag += std::fabs(at(biases[0], j));
        } else {  // row i of rank r's block: row r·rows + i of every rank's A · B
          const std::size_t row = R * (m / n) + i;
          for (int q = 0; q < n; ++q) {
            const auto Q = static_cast<std::size_t>(q);
            for (std::size_t x = 0; x < aCols(); ++x) {
              const double t = at(a[Q], row * aCols() + x) * at(b[Q], x * cols + j);
              sum += t, mag += std::fabs(t);
            }
          }
          if (bias) sum += at(biases[0], j), mag += std::fabs(at(biases[0], j));
        }
        c[i * cCols() + j] = sum;
        magnitude[i * cCols() + j] = mag;
      }
    }
  }
};

// Rank r's call on device buffers (bias: rank 0's, on every rank, for all-gather; reduce-scatter
// adds it once).
weftResult_t call(const Problem& p, Comm& comm, cudaStream_t stream, void* a, void* b, void* c,
                  void* gathered, void* bias, void* ws = nullptr, std::size_t wsBytes = 0) {
  if (p.allGather)
    return weftAllGatherGemm(a, b, c, gathered, p.bias ? bias : nullptr, p.m, p.cols, p.k,
                             weftBfloat16, ws, wsBytes, comm.handle(), stream);
  return weftGemmReduceScatter(a, b, c, p.bias ? bias : nullptr, p.m, p.cols, p.k, weftBfloat16, ws,
                               wsBytes, comm.handle(), stream);
}

struct DeviceBuffers {
  std::byte *a = nullptr, *b = nullptr, *c = nullptr, *gathered = nullptr, *bias = nullptr;
  void allocate(const Problem& p) {
    EXPECT_EQ(cudaMalloc(&a, p.aRows() * p.aCols() * 2), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&b, p.bRows() * p.bCols() * 2), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&c, p.cRows() * p.cCols() * 2), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&gathered, p.m * p.k * 2), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&bias, p.cCols() * 2), cudaSuccess);
  }
  void upload(const Problem& p, int r, cudaStream_t s) {
    const auto R = static_cast<std::size_t>(r);
    EXPECT_EQ(cudaMemcpyAsync(a, p.a[R].data(), p.a[R].size(), cudaMemcpyHostToDevice, s),
              cudaSuccess);
    EXPECT_EQ(cudaMemcpyAsync(b, p.b[R].data(), p.b[R].size(), cudaMemcpyHostToDevice, s),
              cudaSuccess);
    EXPECT_EQ(
        cudaMemcpyAsync(bias, p.biases[0].data(), p.biases[0].size(), cudaMemcpyHostToDevice, s),
        cudaSuccess);
    // Poisoned outputs: NaN bf16.
    EXPECT_EQ(cudaMemsetAsync(c, 0xFF, p.cRows() * p.cCols() * 2, s), cudaSuccess);
    EXPECT_EQ(cudaMemsetAsync(gathered, 0xFF, p.m * p.k * 2, s), cudaSuccess);
  }
  ~DeviceBuffers() {
    for (std::byte* x : {a, b, c, gathered, bias}) (void)cudaFree(x);
  }
};

// Rank r's C (and gathered A) against the reference: within the bf16 roundings the scheme
// takes, relative to the sum of the terms' magnitudes (one for C; for reduce-scatter, one for
// each rank's partial and one for each sum).
void expectClose(const Problem& p, int r, const Bytes& c, const Bytes& gathered,
                 const std::string& what) {
  std::vector<double> ref, mag;
  p.reference(r, ref, mag);
  const double unit = std::ldexp(1.0, -8);
  const double roundings = p.allGather ? 1.0 : 2.0 * p.n;
  std::size_t bad = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double got = at(c, i);
    if (!(std::fabs(got - ref[i]) <= roundings * unit * mag[i] + 1e-6)) {
      if (bad++ < 3)
        ADD_FAILURE() << what << " rank " << r << " C[" << i / p.cCols() << "][" << i % p.cCols()
                      << "] = " << got << ", expected " << ref[i] << " (terms " << mag[i] << ")";
    }
  }
  EXPECT_EQ(bad, 0u) << what << " rank " << r;
  if (p.allGather && !gathered.empty()) {
    const std::size_t rows = p.m / p.n;
    for (int q = 0; q < p.n; ++q) {
      const auto Q = static_cast<std::size_t>(q);
      const Bytes part(gathered.begin() + static_cast<std::ptrdiff_t>(Q * rows * p.k * 2),
                       gathered.begin() + static_cast<std::ptrdiff_t>((Q + 1) * rows * p.k * 2));
      ASSERT_EQ(part, p.a[Q]) << what << " rank " << r << ": the gathered A's block " << q;
    }
  }
}

class GpuTp : public ::testing::TestWithParam<int> {};

TEST_P(GpuTp, EveryVariantMatchesADoubleGemm) {
  SKIP_WITHOUT_GPU();
  const int n = GetParam();
  const auto N = static_cast<std::size_t>(n);
  std::mt19937 rng(17 + n);
  for (const char* variant : {"unfused", "chunked:2", "chunked:3", "fused", "auto"}) {
    ScopedEnv env("WEFT_TP_OVERLAP", variant);
    auto comms = threadRanks(n);
    ASSERT_EQ(comms.size(), N);
    Streams streams(n);
    for (bool allGather : {true, false}) {
      for (bool bias : {false, true}) {
        // Nothing a multiple of 128; 37 rows a rank, so 2 and 3 chunks cut unevenly.
        Problem p;
        p.allGather = allGather;
        p.n = n;
        p.m = 37 * N;
        p.cols = allGather ? 40 * N : 72;
        p.k = allGather ? 136 : 48 * N;
        p.bias = bias;
        p.fill(rng);
        const std::string what = std::string(variant) + (allGather ? " AG+GEMM" : " GEMM+RS") +
                                 (bias ? " with bias" : "") + " at " + std::to_string(n);
        std::vector<Bytes> c(N), gathered(N);
        // Buffers made before any rank calls and freed after every rank is done: cudaFree waits
        // for the whole device, where other ranks' kernels wait for this rank's next launch.
        std::vector<DeviceBuffers> d(N);
        for (int r = 0; r < n; ++r) d[static_cast<std::size_t>(r)].allocate(p);
        onEveryRank(n, [&](int r) {
          const auto R = static_cast<std::size_t>(r);
          d[R].upload(p, r, streams[r]);
          EXPECT_EQ(call(p, comms[R], streams[r], d[R].a, d[R].b, d[R].c,
                         allGather ? d[R].gathered : nullptr, d[R].bias),
                    weftSuccess)
              << what << ": " << weftGetLastError();
          EXPECT_EQ(cudaStreamSynchronize(streams[r]), cudaSuccess);
          EXPECT_TRUE(comms[R].asyncError().isOk())
              << what << ": " << comms[R].asyncError().toString();
          c[R].resize(p.cRows() * p.cCols() * 2);
          EXPECT_EQ(cudaMemcpy(c[R].data(), d[R].c, c[R].size(), cudaMemcpyDeviceToHost),
                    cudaSuccess);
          if (allGather) {
            gathered[R].resize(p.m * p.k * 2);
            EXPECT_EQ(cudaMemcpy(gathered[R].data(), d[R].gathered, gathered[R].size(),
                                 cudaMemcpyDeviceToHost),
                      cudaSuccess);
          }
        });
        for (int r = 0; r < n; ++r) expectClose(p, r, c[r], gathered[r], what);
      }
    }
  }
}

// Each variant that splits the call into steps between streams (chunks; the fused flags).
class GpuTpGraphs : public ::testing::TestWithParam<std::tuple<int, const char*>> {};

TEST_P(GpuTpGraphs, CallsReplayFromAGraph) {
  SKIP_WITHOUT_GPU();
  const int n = std::get<0>(GetParam());
  const auto N = static_cast<std::size_t>(n);
  ScopedEnv env("WEFT_TP_OVERLAP", std::get<1>(GetParam()));
  auto comms = threadRanks(n);
  ASSERT_EQ(comms.size(), N);
  Streams streams(n);
  for (bool allGather : {true, false}) {
    Problem p;
    p.allGather = allGather;
    p.n = n;
    p.m = 64 * N;
    p.cols = 96 * N;
    p.k = 80 * N;
    std::mt19937 rng(3);
    p.fill(rng);
    std::vector<DeviceBuffers> d(N);
    std::vector<cudaGraphExec_t> graphs(N);
    onEveryRank(n, [&](int r) {
      const auto R = static_cast<std::size_t>(r);
      d[R].allocate(p);
      d[R].upload(p, r, streams[r]);
      // A shape's first call sets up (the handle, the plans) outside the capture.
      EXPECT_EQ(call(p, comms[R], streams[r], d[R].a, d[R].b, d[R].c, nullptr, d[R].bias),
                weftSuccess)
          << weftGetLastError();
      EXPECT_EQ(cudaStreamSynchronize(streams[r]), cudaSuccess);
      EXPECT_TRUE(comms[R].asyncError().isOk()) << comms[R].asyncError().toString();
      cudaGraph_t graph = nullptr;
      EXPECT_EQ(cudaStreamBeginCapture(streams[r], cudaStreamCaptureModeThreadLocal), cudaSuccess);
      EXPECT_EQ(call(p, comms[R], streams[r], d[R].a, d[R].b, d[R].c,
                     allGather ? d[R].gathered : nullptr, d[R].bias),
                weftSuccess)
          << weftGetLastError();
      EXPECT_EQ(cudaStreamEndCapture(streams[r], &graph), cudaSuccess);
      EXPECT_EQ(cudaGraphInstantiate(&graphs[R], graph, 0), cudaSuccess);
      (void)cudaGraphDestroy(graph);
    });
    for (int replay = 0; replay < 3; ++replay) {
      p.fill(rng);
      std::vector<Bytes> c(N), gathered(N);
      onEveryRank(n, [&](int r) {
        const auto R = static_cast<std::size_t>(r);
        d[R].upload(p, r, streams[r]);
        EXPECT_EQ(cudaGraphLaunch(graphs[R], streams[r]), cudaSuccess);
        EXPECT_EQ(cudaStreamSynchronize(streams[r]), cudaSuccess);
        EXPECT_TRUE(comms[R].asyncError().isOk()) << comms[R].asyncError().toString();
        c[R].resize(p.cRows() * p.cCols() * 2);
        EXPECT_EQ(cudaMemcpy(c[R].data(), d[R].c, c[R].size(), cudaMemcpyDeviceToHost),
                  cudaSuccess);
        if (allGather) {
          gathered[R].resize(p.m * p.k * 2);
          EXPECT_EQ(cudaMemcpy(gathered[R].data(), d[R].gathered, gathered[R].size(),
                               cudaMemcpyDeviceToHost),
                    cudaSuccess);
        }
      });
      for (int r = 0; r < n; ++r)
        expectClose(
            p, r, c[r], gathered[r],
            std::string(allGather ? "AG+GEMM" : "GEMM+RS") + " replay " + std::to_string(replay));
    }
    for (std::size_t r = 0; r < N; ++r) (void)cudaGraphExecDestroy(graphs[r]);
  }
}

std::string ranksName(const ::testing::TestParamInfo<int>& p) {
  return std::to_string(p.param) + "ranks";
}

INSTANTIATE_TEST_SUITE_P(Ranks, GpuTp, ::testing::Values(1, 2, 3, 4, 8), ranksName);
INSTANTIATE_TEST_SUITE_P(Ranks, GpuTpGraphs,
                         ::testing::Combine(::testing::Values(1, 2, 4),
                                            ::testing::Values("unfused", "chunked:3", "fused")),
                         [](const ::testing::TestParamInfo<std::tuple<int, const char*>>& p) {
                           std::string v = std::get<1>(p.param);
                           v.erase(std::remove(v.begin(), v.end(), ':'), v.end());
                           return std::to_string(std::get<0>(p.param)) + "ranks_" + v;
                         });

// Bad calls: an error naming the problem, C untouched.
TEST(GpuTpErrors, BadCallsAreRefusedAndChangeNothing) {
  SKIP_WITHOUT_GPU();
  auto comms = threadRanks(2);
  ASSERT_EQ(comms.size(), 2u);
  Streams streams(2);
  onEveryRank(2, [&](int r) {
    Comm& comm = comms[static_cast<std::size_t>(r)];
    Problem p;
    p.n = 2;
    p.m = 64, p.cols = 64, p.k = 64;
    std::mt19937 rng(1);
    p.fill(rng);
    DeviceBuffers d;
    d.allocate(p);
    d.upload(p, r, streams[r]);
    EXPECT_EQ(cudaStreamSynchronize(streams[r]), cudaSuccess);
    auto expectRefused = [&](weftResult_t got, const char* needle) {
      EXPECT_EQ(got, weftInvalidArgument) << needle;
      EXPECT_NE(std::string(weftGetLastError()).find(needle), std::string::npos)
          << weftGetLastError();
    };
    void* s = streams[r];
    expectRefused(weftAllGatherGemm(d.a, d.b, d.c, nullptr, nullptr, 65, 64, 64, weftBfloat16,
                                    nullptr, 0, comm.handle(), s),
                  "does not divide");
    expectRefused(weftAllGatherGemm(d.a, d.b, d.c, nullptr, nullptr, 64, 63, 64, weftBfloat16,
                                    nullptr, 0, comm.handle(), s),
                  "does not divide");
    expectRefused(weftGemmReduceScatter(d.a, d.b, d.c, nullptr, 64, 64, 63, weftBfloat16, nullptr,
                                        0, comm.handle(), s),
                  "does not divide");
    expectRefused(weftGemmReduceScatter(d.a, d.b, d.c, nullptr, 64, 64, 64, weftInt32, nullptr, 0,
                                        comm.handle(), s),
                  "i32");
    expectRefused(weftAllGatherGemm(nullptr, d.b, d.c, nullptr, nullptr, 64, 64, 64, weftBfloat16,
                                    nullptr, 0, comm.handle(), s),
                  "NULL");
    std::size_t need = 0;
    EXPECT_EQ(
        weftTpWorkspaceSize(comm.handle(), weftTpAllGatherGemm, 64, 64, 64, weftBfloat16, &need),
        weftSuccess);
    EXPECT_GT(need, 64u * 64 * 2);
    expectRefused(weftAllGatherGemm(d.a, d.b, d.c, nullptr, nullptr, 64, 64, 64, weftBfloat16,
                                    d.gathered, need - 1, comm.handle(), s),
                  "too small");
    // Host memory is not a GPU buffer.
    std::vector<std::byte> host(64 * 64 * 2);
    expectRefused(weftAllGatherGemm(host.data(), d.b, d.c, nullptr, nullptr, 64, 64, 64,
                                    weftBfloat16, nullptr, 0, comm.handle(), s),
                  "not GPU memory");
    Bytes c(p.cRows() * p.cCols() * 2);
    EXPECT_EQ(cudaMemcpy(c.data(), d.c, c.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(c, Bytes(c.size(), std::byte{0xFF})) << "a refused call wrote C";
  });
}

}  // namespace
}  // namespace weft::test
