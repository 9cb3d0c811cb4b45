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

// Values in [-1, 1] as `type` (exactly what the GEMM multiplies).
Bytes randomValues(std::size_t count, std::mt19937& rng, DataType type = DataType::bf16) {
  std::uniform_real_distribution<float> u(-1, 1);
  Bytes out(count * sizeOf(type));
  for (std::size_t i = 0; i < count; ++i) store(out, i, type, u(rng));
  return out;
}

double at(const Bytes& b, std::size_t i, DataType type = DataType::bf16) {
  return load(b, i, type);
}

// The shape and one call's buffers on every rank.
struct Problem {
  bool allGather = true;
  std::size_t m = 0, cols = 0, k = 0;
  int n = 1;
  bool bias = false;
  // A's and B's type; C and the bias are bf16. fp8: B given transposed, C scaled per tensor, or
  // per block (A's 128 values along k of a row, Bᵀ's 128 × 128 tiles; each rank's, row-major).
  DataType type = DataType::bf16;
  float aScale = 0.5f, bScale = 3.0f;
  bool blocks = false;
  std::vector<Bytes> a, b, biases;  // each rank's A and B, as the call takes them
  std::vector<std::vector<float>> aScales, bScales;
  bool fp8() const { return type == DataType::f8e4m3; }
  std::size_t kBlocks() const { return (aCols() + 127) / 128; }
  std::size_t tileRows() const { return (bCols() + 127) / 128; }
  std::size_t es() const { return sizeOf(type); }
  // Rows and columns of each rank's A, B and C.
  std::size_t aRows() const { return allGather ? m / n : m; }
  std::size_t aCols() const { return allGather ? k : k / n; }
  std::size_t bRows() const { return allGather ? k : k / n; }
  std::size_t bCols() const { return allGather ? cols / n : cols; }
  std::size_t cRows() const { return allGather ? m : m / n; }
  std::size_t cCols() const { return bCols(); }
  // Rank q's A[row][x], times its block's scale.
  double aAt(std::size_t q, std::size_t row, std::size_t x) const {
    const double v = at(a[q], row * aCols() + x, type);
    return blocks ? v * aScales[q][row * kBlocks() + x / 128] : v;
  }
  // Rank q's B[x][j] (stored as Bᵀ for fp8), times the scales (per tensor: both here).
  double bAt(std::size_t q, std::size_t x, std::size_t j) const {
    if (!fp8()) return at(b[q], x * bCols() + j);
    const double v = at(b[q], j * bRows() + x, type);
    return blocks ? v * bScales[q][j / 128 * kBlocks() + x / 128] : v * aScale * bScale;
  }

  void fill(std::mt19937& rng) {
    a.clear(), b.clear(), biases.clear(), aScales.clear(), bScales.clear();
    // Block scales from 1/8 to 6, no two blocks alike.
    std::uniform_real_distribution<float> mantissa(1, 1.5f);
    std::uniform_int_distribution<int> exponent(-3, 2);
    auto scales = [&](std::size_t count) {
      std::vector<float> s(count);
      for (float& x : s) x = std::ldexp(mantissa(rng), exponent(rng));
      return s;
    };
    for (int r = 0; r < n; ++r) {
      a.push_back(randomValues(aRows() * aCols(), rng, type));
      b.push_back(randomValues(bRows() * bCols(), rng, type));
      biases.push_back(randomValues(bCols(), rng));
      if (blocks) {
        aScales.push_back(scales(aRows() * kBlocks()));
        bScales.push_back(scales(tileRows() * kBlocks()));
      }
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
            const double t = aAt(src, row, x) * bAt(R, x, j);
            sum += t, mag += std::fabs(t);
          }
          if (bias) sum += at(biases[0], j), mag += std::fabs(at(biases[0], j));
        } else {  // row i of rank r's block: row r·rows + i of every rank's A · B
          const std::size_t row = R * (m / n) + i;
          for (int q = 0; q < n; ++q) {
            const auto Q = static_cast<std::size_t>(q);
            for (std::size_t x = 0; x < aCols(); ++x) {
              const double t = aAt(Q, row, x) * bAt(Q, x, j);
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

// fp8's scales on the device: A's and B's (per tensor or per block), and where a block-scaled
// all-gather puts the gathered A's.
struct DeviceScales {
  const float* a = nullptr;
  const float* b = nullptr;
  float* gathered = nullptr;
};

// Rank r's call on device buffers (bias: rank 0's, on every rank, for all-gather; reduce-scatter
// adds it once).
weftResult_t call(const Problem& p, Comm& comm, cudaStream_t stream, void* a, void* b, void* c,
                  void* gathered, void* bias, DeviceScales scales = {}, void* ws = nullptr,
                  std::size_t wsBytes = 0) {
  if (p.fp8()) {
    const weftTpFp8 fp8{weftBfloat16, scales.a, scales.b,
                        p.blocks ? weftTpFp8Block128 : weftTpFp8PerTensor, scales.gathered};
    if (p.allGather)
      return weftAllGatherGemmFp8(a, b, c, gathered, p.bias ? bias : nullptr, p.m, p.cols, p.k,
                                  weftFloat8e4m3, &fp8, ws, wsBytes, comm.handle(), stream);
    return weftGemmReduceScatterFp8(a, b, c, p.bias ? bias : nullptr, p.m, p.cols, p.k,
                                    weftFloat8e4m3, &fp8, ws, wsBytes, comm.handle(), stream);
  }
  if (p.allGather)
    return weftAllGatherGemm(a, b, c, gathered, p.bias ? bias : nullptr, p.m, p.cols, p.k,
                             weftBfloat16, ws, wsBytes, comm.handle(), stream);
  return weftGemmReduceScatter(a, b, c, p.bias ? bias : nullptr, p.m, p.cols, p.k, weftBfloat16, ws,
                               wsBytes, comm.handle(), stream);
}

struct DeviceBuffers {
  std::byte *a = nullptr, *b = nullptr, *c = nullptr, *gathered = nullptr, *bias = nullptr;
  float* scales = nullptr;  // per tensor: A's, B's 16 bytes on (cuBLASLt aligns them)
  float *blockA = nullptr, *blockB = nullptr, *gatheredScales = nullptr;
  DeviceScales fp8(const Problem& p, bool gather) const {
    if (!p.blocks) return {scales, scales + 4, nullptr};
    return {blockA, blockB, gather ? gatheredScales : nullptr};
  }
  void allocate(const Problem& p) {
    if (p.blocks) {
      EXPECT_EQ(cudaMalloc(&blockA, p.aRows() * p.kBlocks() * sizeof(float)), cudaSuccess);
      EXPECT_EQ(cudaMalloc(&blockB, p.tileRows() * p.kBlocks() * sizeof(float)), cudaSuccess);
      EXPECT_EQ(cudaMalloc(&gatheredScales, p.m * p.kBlocks() * sizeof(float)), cudaSuccess);
    }
    EXPECT_EQ(cudaMalloc(&a, p.aRows() * p.aCols() * p.es()), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&b, p.bRows() * p.bCols() * p.es()), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&c, p.cRows() * p.cCols() * 2), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&gathered, p.m * p.k * p.es()), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&bias, p.cCols() * 2), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&scales, 8 * sizeof(float)), cudaSuccess);
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
    const float both[8] = {p.aScale, 0, 0, 0, p.bScale};
    EXPECT_EQ(cudaMemcpyAsync(scales, both, sizeof both, cudaMemcpyHostToDevice, s), cudaSuccess);
    if (p.blocks) {
      EXPECT_EQ(cudaMemcpyAsync(blockA, p.aScales[R].data(), p.aScales[R].size() * sizeof(float),
                                cudaMemcpyHostToDevice, s),
                cudaSuccess);
      EXPECT_EQ(cudaMemcpyAsync(blockB, p.bScales[R].data(), p.bScales[R].size() * sizeof(float),
                                cudaMemcpyHostToDevice, s),
                cudaSuccess);
      EXPECT_EQ(cudaMemsetAsync(gatheredScales, 0xFF, p.m * p.kBlocks() * sizeof(float), s),
                cudaSuccess);
    }
    EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);  // `both` leaves scope
    // Poisoned outputs: NaN bf16.
    EXPECT_EQ(cudaMemsetAsync(c, 0xFF, p.cRows() * p.cCols() * 2, s), cudaSuccess);
    EXPECT_EQ(cudaMemsetAsync(gathered, 0xFF, p.m * p.k * p.es(), s), cudaSuccess);
  }
  ~DeviceBuffers() {
    for (std::byte* x : {a, b, c, gathered, bias}) (void)cudaFree(x);
    for (float* x : {scales, blockA, blockB, gatheredScales}) (void)cudaFree(x);
  }
};

// Rank r's C (and gathered A) against the reference: within the bf16 roundings the scheme
// takes, relative to the sum of the terms' magnitudes (one for C; for reduce-scatter, one for
// each rank's partial and one for each sum).
void expectClose(const Problem& p, int r, const Bytes& c, const Bytes& gathered,
                 const std::string& what, const std::vector<float>& gatheredScales = {}) {
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
      const std::size_t bytes = rows * p.k * p.es();
      const Bytes part(gathered.begin() + static_cast<std::ptrdiff_t>(Q * bytes),
                       gathered.begin() + static_cast<std::ptrdiff_t>((Q + 1) * bytes));
      ASSERT_EQ(part, p.a[Q]) << what << " rank " << r << ": the gathered A's block " << q;
    }
  }
  if (p.allGather && p.blocks) {
    std::vector<float> want;
    for (const auto& s : p.aScales) want.insert(want.end(), s.begin(), s.end());
    EXPECT_EQ(gatheredScales, want) << what << " rank " << r << ": the gathered scales";
  }
}

// Every variant forced in turn (and the pick), both operations, with and without bias, at n
// ranks; the plan each call reports is the variant forced.
void everyVariant(int n, DataType type, const std::vector<const char*>& variants,
                  bool blocks = false) {
  const auto N = static_cast<std::size_t>(n);
  std::mt19937 rng(17 + n);
  const bool fp8 = type == DataType::f8e4m3;
  for (const char* variant : variants) {
    ScopedEnv env("WEFT_TP_OVERLAP", variant);
    auto comms = threadRanks(n);
    ASSERT_EQ(comms.size(), N);
    Streams streams(n);
    for (bool allGather : {true, false}) {
      for (bool bias : {false, true}) {
        // Nothing a multiple of 128; 37 rows a rank, so 2, 3 and 4 chunks cut unevenly (a
        // batch of GEMMs), 36 with a bias (an all-gather's chunks interleave their rows: one
        // GEMM a chunk); fp8's k a rank a multiple of 16. Block-scaled: 36 rows a rank (GEMMs of
        // 4 rows at a time; 2 chunks cut unevenly, 3 interleave), k of 2 blocks, the second
        // partial, Bᵀ of 2 tile rows.
        Problem p;
        p.allGather = allGather;
        p.n = n;
        p.m = (blocks || bias ? 36 : 37) * N;
        p.cols = blocks ? (allGather ? 136 * N : 200) : allGather ? 40 * N : 72;
        p.k = allGather ? (fp8 ? 144 : 136) : (blocks ? 144 : 48) * N;
        p.bias = bias;
        p.type = type;
        p.blocks = blocks;
        p.fill(rng);
        const std::string what = std::string(variant) + (allGather ? " AG+GEMM" : " GEMM+RS") +
                                 (bias ? " with bias" : "") + " " + std::string(name(type)) +
                                 (blocks ? " block-scaled" : "") + " at " + std::to_string(n);
        if (std::string(variant) != "auto") {
          char plan[32] = "";
          EXPECT_EQ(weftTpPlan(comms[0].handle(),
                               allGather ? weftTpAllGatherGemm : weftTpGemmReduceScatter, p.m,
                               p.cols, p.k, static_cast<weftDataType_t>(type), plan, sizeof plan),
                    weftSuccess)
              << weftGetLastError();
          // One rank maps no peer: fused forced runs unfused there.
          const bool fusedAlone = n == 1 && std::string(variant).starts_with("fused");
          EXPECT_STREQ(plan, fusedAlone ? "unfused" : variant) << what;
        }
        std::vector<Bytes> c(N), gathered(N);
        std::vector<std::vector<float>> scales(N);
        // Buffers made before any rank calls and freed after every rank is done: cudaFree waits
        // for the whole device, where other ranks' kernels wait for this rank's next launch.
        std::vector<DeviceBuffers> d(N);
        for (int r = 0; r < n; ++r) d[static_cast<std::size_t>(r)].allocate(p);
        onEveryRank(n, [&](int r) {
          const auto R = static_cast<std::size_t>(r);
          d[R].upload(p, r, streams[r]);
          EXPECT_EQ(call(p, comms[R], streams[r], d[R].a, d[R].b, d[R].c,
                         allGather ? d[R].gathered : nullptr, d[R].bias, d[R].fp8(p, allGather)),
                    weftSuccess)
              << what << ": " << weftGetLastError();
          EXPECT_EQ(cudaStreamSynchronize(streams[r]), cudaSuccess);
          EXPECT_TRUE(comms[R].asyncError().isOk())
              << what << ": " << comms[R].asyncError().toString();
          c[R].resize(p.cRows() * p.cCols() * 2);
          EXPECT_EQ(cudaMemcpy(c[R].data(), d[R].c, c[R].size(), cudaMemcpyDeviceToHost),
                    cudaSuccess);
          if (allGather) {
            gathered[R].resize(p.m * p.k * p.es());
            EXPECT_EQ(cudaMemcpy(gathered[R].data(), d[R].gathered, gathered[R].size(),
                                 cudaMemcpyDeviceToHost),
                      cudaSuccess);
          }
          if (allGather && blocks) {
            scales[R].resize(p.m * p.kBlocks());
            EXPECT_EQ(cudaMemcpy(scales[R].data(), d[R].gatheredScales,
                                 scales[R].size() * sizeof(float), cudaMemcpyDeviceToHost),
                      cudaSuccess);
          }
        });
        for (int r = 0; r < n; ++r) expectClose(p, r, c[r], gathered[r], what, scales[r]);
      }
    }
  }
}

class GpuTp : public ::testing::TestWithParam<int> {};

TEST_P(GpuTp, EveryVariantMatchesADoubleGemm) {
  SKIP_WITHOUT_GPU();
  everyVariant(GetParam(), DataType::bf16,
               {"unfused", "chunked:2", "chunked:3", "fused", "fused:inplace", "auto"});
}

// The fused GEMMs over runs of blocks whatever the copies cost: a block each, two at most, and
// whole runs (algo::tpFusedPieces); the tiny shapes above price a copy dearer than a GEMM.
TEST_P(GpuTp, FusedGemmsOverRunsOfBlocks) {
  SKIP_WITHOUT_GPU();
  for (const char* most : {"1", "2", "128"}) {
    ScopedEnv env("WEFT_TP_FUSED_BLOCKS", most);
    everyVariant(GetParam(), DataType::bf16, {"fused"});
  }
}

// Tuning on: the ranks time cuBLASLt's candidates together at each shape's first GEMM
// (fused::tp::Gemms::Agree). Their GEMM shapes differ where fused runs of two blocks at most
// give 3 ranks different piece sizes (rank 1 runs none of two), and where a reduce-scatter's
// bias is rank 0's GEMMs' alone: every rank primes every rank's shapes, or they part.
TEST_P(GpuTp, TunedTogetherMatchADoubleGemm) {
  SKIP_WITHOUT_GPU();
  ScopedEnv tune("WEFT_TP_GEMM_TUNE", "1");
  ScopedEnv most("WEFT_TP_FUSED_BLOCKS", "2");
  everyVariant(GetParam(), DataType::bf16, {"chunked:2", "fused", "fused:inplace"});
}

// The chunks' GEMMs on two streams in turn (WEFT_TP_GEMM_STREAMS=2): the same results.
TEST_P(GpuTp, ChunksOnTwoGemmStreamsMatchADoubleGemm) {
  SKIP_WITHOUT_GPU();
  ScopedEnv streams("WEFT_TP_GEMM_STREAMS", "2");
  everyVariant(GetParam(), DataType::bf16, {"unfused", "chunked:2", "chunked:3", "chunked:4"});
}

// e4m3 A and B (B transposed), scaled, into bf16: the GEMMs cuBLASLt runs on fp8 tensor cores.
class GpuTpFp8 : public ::testing::TestWithParam<int> {};

TEST_P(GpuTpFp8, EveryVariantMatchesADoubleGemm) {
  SKIP_WITHOUT_GPU();
  everyVariant(GetParam(), DataType::f8e4m3, {"unfused", "chunked:3", "fused", "fused:inplace"});
}

// The same with DeepSeek-V3's block scales (weftTpFp8Block128): A's rows' 128-value blocks and
// Bᵀ's 128 × 128 tiles, gathered with A and repacked for cuBLASLt.
class GpuTpFp8Blocks : public ::testing::TestWithParam<int> {};

TEST_P(GpuTpFp8Blocks, EveryVariantMatchesADoubleGemm) {
  SKIP_WITHOUT_GPU();
  everyVariant(GetParam(), DataType::f8e4m3,
               {"unfused", "chunked:2", "chunked:3", "fused", "fused:inplace"}, true);
  {
    ScopedEnv env("WEFT_TP_FUSED_BLOCKS", "128");  // the scales of a run of blocks, repacked
    everyVariant(GetParam(), DataType::f8e4m3, {"fused"}, true);
  }
  // Two GEMM streams: each repacks its chunks' scales apart.
  ScopedEnv streams("WEFT_TP_GEMM_STREAMS", "2");
  everyVariant(GetParam(), DataType::f8e4m3, {"chunked:2", "chunked:3"}, true);
}

// Each variant that splits the call into steps between streams (chunks; the fused flags), and
// the chunks' GEMMs on one stream or two (WEFT_TP_GEMM_STREAMS); 64 rows a rank: 3 chunks cut
// unevenly, 4 interleave.
class GpuTpGraphs : public ::testing::TestWithParam<std::tuple<int, const char*, int>> {};

TEST_P(GpuTpGraphs, CallsReplayFromAGraph) {
  SKIP_WITHOUT_GPU();
  const int n = std::get<0>(GetParam());
  const auto N = static_cast<std::size_t>(n);
  ScopedEnv env("WEFT_TP_OVERLAP", std::get<1>(GetParam()));
  ScopedEnv gemmStreams("WEFT_TP_GEMM_STREAMS", std::to_string(std::get<2>(GetParam())).c_str());
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
    // Allocations may wait for the device's other work: every rank's before any rank's call.
    onEveryRank(n, [&](int r) {
      const auto R = static_cast<std::size_t>(r);
      d[R].allocate(p);
      d[R].upload(p, r, streams[r]);
    });
    onEveryRank(n, [&](int r) {
      const auto R = static_cast<std::size_t>(r);
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
      // A graph's first launch would upload it, which may wait for the device's other work:
      // with ranks as threads on one GPU, for a peer's replay that waits for this rank.
      EXPECT_EQ(cudaGraphUpload(graphs[R], streams[r]), cudaSuccess);
      EXPECT_EQ(cudaStreamSynchronize(streams[r]), cudaSuccess);
    });
    for (int replay = 0; replay < 3; ++replay) {
      p.fill(rng);
      std::vector<Bytes> c(N), gathered(N);
      // Every rank's inputs in place before any rank's replay starts waiting for its peers.
      onEveryRank(n, [&](int r) { d[static_cast<std::size_t>(r)].upload(p, r, streams[r]); });
      onEveryRank(n, [&](int r) {
        const auto R = static_cast<std::size_t>(r);
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
INSTANTIATE_TEST_SUITE_P(Ranks, GpuTpFp8, ::testing::Values(1, 2, 4), ranksName);
INSTANTIATE_TEST_SUITE_P(Ranks, GpuTpFp8Blocks, ::testing::Values(1, 2, 3, 4), ranksName);
std::string graphName(const ::testing::TestParamInfo<std::tuple<int, const char*, int>>& p) {
  std::string v = std::get<1>(p.param);
  v.erase(std::remove(v.begin(), v.end(), ':'), v.end());
  const int streams = std::get<2>(p.param);
  return std::to_string(std::get<0>(p.param)) + "ranks_" + v +
         (streams > 1 ? "_" + std::to_string(streams) + "streams" : "");
}
INSTANTIATE_TEST_SUITE_P(Ranks, GpuTpGraphs,
                         ::testing::Combine(::testing::Values(1, 2, 4),
                                            ::testing::Values("unfused", "chunked:3", "fused",
                                                              "fused:inplace"),
                                            ::testing::Values(1)),
                         graphName);
INSTANTIATE_TEST_SUITE_P(TwoGemmStreams, GpuTpGraphs,
                         ::testing::Combine(::testing::Values(2, 4),
                                            ::testing::Values("chunked:3", "chunked:4"),
                                            ::testing::Values(2)),
                         graphName);

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
    // fp8: e4m3 only, into bf16 or f16, through the Fp8 calls; k a rank a multiple of 16.
    expectRefused(weftAllGatherGemm(d.a, d.b, d.c, nullptr, nullptr, 64, 64, 64, weftFloat8e4m3,
                                    nullptr, 0, comm.handle(), s),
                  "f8e4m3 into f8e4m3");
    const weftTpFp8 fp8{weftBfloat16, nullptr, nullptr, weftTpFp8PerTensor, nullptr};
    expectRefused(weftGemmReduceScatterFp8(d.a, d.b, d.c, nullptr, 64, 64, 64, weftFloat8e5m2, &fp8,
                                           nullptr, 0, comm.handle(), s),
                  "must be weftFloat8e4m3");
    expectRefused(weftGemmReduceScatterFp8(d.a, d.b, d.c, nullptr, 64, 64, 48, weftFloat8e4m3, &fp8,
                                           nullptr, 0, comm.handle(), s),
                  "multiple of 16");
    const weftTpFp8 unaligned{weftBfloat16, d.scales, d.scales + 1, weftTpFp8PerTensor, nullptr};
    expectRefused(weftGemmReduceScatterFp8(d.a, d.b, d.c, nullptr, 64, 64, 64, weftFloat8e4m3,
                                           &unaligned, nullptr, 0, comm.handle(), s),
                  "multiples of 16 bytes");
    const weftTpFp8 toFp8{weftFloat8e4m3, nullptr, nullptr, weftTpFp8PerTensor, nullptr};
    expectRefused(weftAllGatherGemmFp8(d.a, d.b, d.c, nullptr, nullptr, 64, 64, 64, weftFloat8e4m3,
                                       &toFp8, nullptr, 0, comm.handle(), s),
                  "into f8e4m3");
    expectRefused(weftAllGatherGemmFp8(d.a, d.b, d.c, nullptr, nullptr, 64, 64, 64, weftFloat8e4m3,
                                       nullptr, nullptr, 0, comm.handle(), s),
                  "fp8 is NULL");
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
