// The tensor-parallel GEMMs' tuning (fused::tp::Gemms::setTuning, WEFT_TP_GEMM_TUNE): a shape's
// first GEMM times cuBLASLt's candidates and keeps the fastest, and C is the same bits as the
// heuristic's first gives, with the kept one and with each candidate forced (wave-fitted tiles
// too, on values whose sums' order shows in C), for whole and batched GEMMs (B shared, C's batches
// apart), bf16 and fp8 (per tensor and per block); untuned, a wave-fitted tile where the
// heuristic's idles the SMs, the same bits; C near a double-precision GEMM; a shape first
// met inside a graph capture runs untuned and replays; ranks (threads here) tuning together keep
// the candidate their agreed times name, and run untuned where they tune different shapes. Skipped
// without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "fused/tp/gemm.hpp"
#include "fused/tp/tiles.hpp"
#include "src/exec/numeric.hpp"

namespace weft::fused::tp {
namespace {

bool haveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

int major() {
  int device = 0, v = 0;
  (void)cudaGetDevice(&device);
  (void)cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMajor, device);
  return v;
}

struct Case {
  std::string name;
  GemmShape shape;
};

// A's rows (every batch's, strideA apart), B (k × n, or Bᵀ for fp8), C's rows in the layout.
std::size_t aValues(const GemmShape& s) {
  return static_cast<std::size_t>(s.batches - 1) * s.strideA + s.m * s.lda;
}
std::size_t cValues(const GemmShape& s) {
  return static_cast<std::size_t>(s.batches - 1) * s.strideC + s.m * s.ldc;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  auto shape = [](std::size_t m, std::size_t n, std::size_t k, DataType type, int batches) {
    GemmShape g;
    g.m = m, g.n = n, g.k = k, g.type = type, g.out = DataType::bf16;
    g.bTransposed = type == DataType::f8e4m3;
    g.lda = k, g.ldb = g.bTransposed ? k : n, g.ldc = n;
    if (batches > 1) {  // the chunk GEMMs' layout: A's batches packed, C's a block apart
      g.batches = batches;
      g.strideA = m * k;
      g.strideC = 2 * m * n;
    }
    return g;
  };
  out.push_back({"bf16 whole", shape(1024, 1536, 2048, DataType::bf16, 1)});
  out.push_back({"bf16 batched", shape(256, 1536, 2048, DataType::bf16, 4)});
  out.push_back({"fp8 whole", shape(1024, 1536, 2048, DataType::f8e4m3, 1)});
  Case blocks{"fp8 block-scaled", shape(512, 1536, 2048, DataType::f8e4m3, 1)};
  blocks.shape.blockScales = true;
  out.push_back(blocks);
  return out;
}

// Device copies of a case's operands: values k/8 (exact in bf16 and e4m3, and so are C's sums in
// any order), or with `fine` any in [-1, 1) (C's bits tell the order of its sums); block scales
// powers of two.
struct Operands {
  GemmShape s;
  std::vector<float> a, b, aScales, bScales;  // b as stored (Bᵀ for fp8)
  void* dA = nullptr;
  void* dB = nullptr;
  void* dWs = nullptr;
  float* dAScales = nullptr;
  float* dBScales = nullptr;

  explicit Operands(const GemmShape& shape, bool fine = false) : s(shape) {
    std::mt19937 rng(7);
    std::uniform_int_distribution<int> eighths(-8, 8), exponent(-2, 2);
    std::uniform_real_distribution<float> any(-1.0f, 1.0f);
    a.resize(aValues(s));
    b.resize(s.k * s.n);
    for (std::vector<float>* v : {&a, &b})
      for (float& x : *v) x = fine ? any(rng) : static_cast<float>(eighths(rng)) / 8;
    const std::size_t kBlocks = (s.k + 127) / 128;
    if (s.blockScales) {
      aScales.assign(Gemms::blockScaleFloats(s.m, s.k), 1.0f);
      bScales.assign((s.n + 127) / 128 * Gemms::tileScaleLd(kBlocks), 1.0f);
      for (float& x : aScales) x = std::ldexp(1.0f, exponent(rng));
      for (float& x : bScales) x = std::ldexp(1.0f, exponent(rng));
    }
    const bool fp8 = s.type == DataType::f8e4m3;
    auto upload = [&](const std::vector<float>& v, void** to) {
      std::vector<std::uint8_t> bytes;
      for (float x : v) {
        if (fp8) {
          bytes.push_back(exec::floatToE4m3(x));
        } else {
          const std::uint16_t h = exec::floatToBf16(x);
          bytes.push_back(static_cast<std::uint8_t>(h & 0xff));
          bytes.push_back(static_cast<std::uint8_t>(h >> 8));
        }
      }
      ASSERT_EQ(cudaMalloc(to, bytes.size()), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(*to, bytes.data(), bytes.size(), cudaMemcpyHostToDevice), cudaSuccess);
    };
    upload(a, &dA);
    upload(b, &dB);
    EXPECT_EQ(cudaMalloc(&dWs, Gemms::kWorkspaceBytes), cudaSuccess);
    for (auto [v, to] : {std::pair{&aScales, &dAScales}, std::pair{&bScales, &dBScales}}) {
      if (v->empty()) continue;
      EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(to), v->size() * sizeof(float)), cudaSuccess);
      EXPECT_EQ(cudaMemcpy(*to, v->data(), v->size() * sizeof(float), cudaMemcpyHostToDevice),
                cudaSuccess);
    }
  }
  ~Operands() {
    for (void* p : {dA, dB, dWs, static_cast<void*>(dAScales), static_cast<void*>(dBScales)})
      if (p != nullptr) (void)cudaFree(p);
  }
  GemmScales scales() const { return {dAScales, dBScales, 0}; }

  // C[batch][i][j] in double.
  double reference(int batch, std::size_t i, std::size_t j) const {
    const std::size_t row = static_cast<std::size_t>(batch) * s.strideA + i * s.lda;
    const std::size_t kBlocks = (s.k + 127) / 128;
    double sum = 0;
    for (std::size_t x = 0; x < s.k; ++x) {
      double t =
          static_cast<double>(a[row + x]) * (s.bTransposed ? b[j * s.ldb + x] : b[x * s.ldb + j]);
      if (s.blockScales)
        t *= aScales[x / 128 * Gemms::scaleLd(s.m) + i] *
             bScales[j / 128 * Gemms::tileScaleLd(kBlocks) + x / 128];
      sum += t;
    }
    return sum;
  }
};

// How many of two runs' values of C differ in any bit (all, where their lengths differ).
std::size_t differing(const std::vector<std::uint16_t>& x, const std::vector<std::uint16_t>& y) {
  if (x.size() != y.size()) return std::max(x.size(), y.size());
  std::size_t n = 0;
  for (std::size_t i = 0; i < x.size(); ++i) n += x[i] != y[i];
  return n;
}

// C as bf16 bits after one GEMM by `gemms`, C poisoned first.
std::vector<std::uint16_t> runOnce(Gemms& gemms, const Operands& o, cudaStream_t stream) {
  std::vector<std::uint16_t> c(cValues(o.s));
  void* dC = nullptr;
  EXPECT_EQ(cudaMalloc(&dC, c.size() * 2), cudaSuccess);
  EXPECT_EQ(cudaMemsetAsync(dC, 0xFF, c.size() * 2, stream), cudaSuccess);
  const Status s = gemms.run(o.s, o.dA, o.dB, dC, nullptr, o.dWs, stream, o.scales());
  EXPECT_TRUE(s) << s.message();
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(c.data(), dC, c.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  (void)cudaFree(dC);
  return c;
}

TEST(GpuTpGemms, TuningKeepsCsBits) {
  if (!haveGpu()) GTEST_SKIP() << "no GPU on this machine";
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    Operands o(c.shape);
    auto heuristic = Gemms::create(), tuned = Gemms::create();
    ASSERT_TRUE(heuristic) << heuristic.status().message();
    ASSERT_TRUE(tuned) << tuned.status().message();
    (*heuristic)->keepCandidate(0);
    (*tuned)->setTuning(true);
    const std::vector<std::uint16_t> first = runOnce(**heuristic, o, stream);
    const std::vector<std::uint16_t> fastest = runOnce(**tuned, o, stream);
    EXPECT_EQ(differing(first, fastest), 0u) << "of " << first.size() << " values";
    // Every candidate tuning may keep, not just the one this run's timing kept: the heuristic's
    // and the wave-fitted tiles (more than the heuristic's eight where the algorithm has tiles
    // to choose, as Hopper's bf16 one does), on values whose sums' order shows in C too.
    const int offered = (*tuned)->offered(o.s);
    EXPECT_GE(offered, 1);
    if (major() >= 9 && c.shape.type == DataType::bf16) {
      EXPECT_GT(offered, 8);
    }
    Operands fine(c.shape, true);
    const std::vector<std::uint16_t> fineFirst = runOnce(**heuristic, fine, stream);
    for (int kept = 1; kept < offered; ++kept) {
      auto other = Gemms::create();
      ASSERT_TRUE(other) << other.status().message();
      (*other)->keepCandidate(kept);
      const std::vector<std::uint16_t> forced = runOnce(**other, o, stream);
      EXPECT_EQ((*other)->chosen(o.s), kept);
      EXPECT_EQ(differing(first, forced), 0u)
          << "candidate " << kept << " of " << offered << ", of " << first.size() << " values";
      EXPECT_EQ(differing(fineFirst, runOnce(**other, fine, stream)), 0u)
          << "candidate " << kept << " of " << offered << " on values in [-1, 1)";
    }
    // Sampled entries near the double GEMM (C is bf16: 2^-8 of the sum of |terms| and more).
    std::mt19937 rng(11);
    std::uniform_int_distribution<std::size_t> row(0, o.s.m - 1), col(0, o.s.n - 1);
    for (int t = 0; t < 64; ++t) {
      const int batch = t % o.s.batches;
      const std::size_t i = row(rng), j = col(rng);
      const std::size_t at = static_cast<std::size_t>(batch) * o.s.strideC + i * o.s.ldc + j;
      const double want = o.reference(batch, i, j);
      const double got = exec::bf16ToFloat(fastest[at]);
      EXPECT_NEAR(got, want, std::ldexp(std::fabs(want), -7) + 1e-3)
          << "C[" << batch << "][" << i << "][" << j << "]";
    }
  }
  (void)cudaStreamDestroy(stream);
}

// Untuned, a shape whose heuristic tile leaves the SMs idle runs a wave-fitted tile of the same
// algorithm, with the same bits of C; off, or where no tile fits better by kFitGain, the
// heuristic's own. All-gather + GEMM's chunks and whole GEMM (below).
TEST(GpuTpGemms, UntunedAWaveFittedTileWhereTheHeuristicsIdles) {
  if (!haveGpu()) GTEST_SKIP() << "no GPU on this machine";
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  int device = 0, sms = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), cudaSuccess);
  // The chunks' GEMMs of Llama-70B's MLP: 4 ranks' at K = 2, the whole, 4 ranks' and 2 ranks'
  // at K = 4.
  const std::pair<std::size_t, std::size_t> shapes[] = {
      {2048, 7168}, {4096, 7168}, {1024, 7168}, {1024, 14336}};
  for (auto [m, n] : shapes) {
    SCOPED_TRACE("m " + std::to_string(m) + ", n " + std::to_string(n));
    GemmShape g;
    g.m = m, g.n = n, g.k = 8192;
    g.lda = g.k, g.ldb = g.n, g.ldc = g.n;
    Operands o(g, true);
    auto first = Gemms::create(), fit = Gemms::create(), off = Gemms::create();
    ASSERT_TRUE(first && fit && off);
    (*first)->keepCandidate(0);
    (*off)->setFitting(false);
    const std::vector<std::uint16_t> want = runOnce(**first, o, stream);
    EXPECT_EQ(differing(want, runOnce(**fit, o, stream)), 0u) << "of " << want.size() << " values";
    EXPECT_EQ(differing(want, runOnce(**off, o, stream)), 0u) << "of " << want.size() << " values";
    EXPECT_EQ((*off)->chosen(g), 0);
    EXPECT_EQ((*off)->tile(g), (*first)->tile(g));
    const TileSize* own = tileSize(static_cast<std::uint32_t>((*first)->tile(g)));
    const TileSize* ran = tileSize(static_cast<std::uint32_t>((*fit)->tile(g)));
    ASSERT_NE(own, nullptr);
    ASSERT_NE(ran, nullptr);
    if ((*fit)->chosen(g) == Gemms::kFitted) {
      EXPECT_GE(static_cast<double>(waveCost(*own, g.m, g.n, 1, sms)),
                kFitGain * static_cast<double>(waveCost(*ran, g.m, g.n, 1, sms)))
          << ran->rows << " x " << ran->cols << " for " << own->rows << " x " << own->cols;
    } else {
      EXPECT_EQ((*fit)->chosen(g), 0);
      EXPECT_EQ(*ran, *own);
    }
    // Hopper's heuristic gives 2048 rows 320 × 128 tiles: 3 waves of 2.79 on 132 SMs, and its
    // algorithm takes 128 × 296 ones with its cluster and option; 1024 × 7168 gets 256 × 128
    // ones, 2 waves of 1.70, and its algorithm takes 112 × 256 ones with a 2 × 1 cluster;
    // 1024 × 14336 320 × 128 ones in 1 × 4 clusters, 3 waves of 2.73, and its algorithm takes
    // 296 × 128 ones in pairs (docs/perf-tp-gemms.md, "Wave-fitted tiles, untuned", "Every
    // configuration, sustained").
    if (major() == 9 && sms == 132 &&
        ((n == 7168 && m == 2048 && own->rows == 320 && own->cols == 128) ||
         (n == 7168 && m == 1024 && own->rows == 256 && own->cols == 128) ||
         (n == 14336 && m == 1024 && own->rows == 320 && own->cols == 128))) {
      EXPECT_EQ((*fit)->chosen(g), Gemms::kFitted);
    }
  }
  (void)cudaStreamDestroy(stream);
}

// Timing synchronizes, which a capture forbids: a shape met first in one runs the heuristic's
// first, and the graph's replay writes the eager GEMM's bits.
TEST(GpuTpGemms, AShapeMetInACaptureRunsUntuned) {
  if (!haveGpu()) GTEST_SKIP() << "no GPU on this machine";
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  const Case c = cases()[1];
  Operands o(c.shape);
  auto eager = Gemms::create(), captured = Gemms::create();
  ASSERT_TRUE(eager) << eager.status().message();
  ASSERT_TRUE(captured) << captured.status().message();
  (*captured)->setTuning(true);
  const std::vector<std::uint16_t> want = runOnce(**eager, o, stream);
  std::vector<std::uint16_t> got(want.size());
  void* dC = nullptr;
  ASSERT_EQ(cudaMalloc(&dC, got.size() * 2), cudaSuccess);
  ASSERT_EQ(cudaMemset(dC, 0xFF, got.size() * 2), cudaSuccess);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const Status s = (*captured)->run(o.s, o.dA, o.dB, dC, nullptr, o.dWs, stream, o.scales());
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_TRUE(s) << s.message();
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(got.data(), dC, got.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(differing(want, got), 0u) << "of " << want.size() << " values";
  (void)cudaGraphExecDestroy(exec);
  (void)cudaGraphDestroy(graph);
  (void)cudaFree(dC);
  (void)cudaStreamDestroy(stream);
}

// Gemms::Agree for ranks as threads: each value the largest any thread passed, and the threads'
// meeting point; a call whose length differs from the others' fails on every thread.
class MaxOverThreads {
 public:
  explicit MaxOverThreads(int n) : n_(n) {}
  Status reduce(std::vector<float>& v) {
    std::unique_lock lock(mu_);
    const std::uint64_t generation = generation_;
    if (arrived_ == 0) {
      acc_ = v;
      apart_ = false;
    } else if (acc_.size() != v.size()) {
      apart_ = true;
    } else {
      for (std::size_t i = 0; i < v.size(); ++i) acc_[i] = std::max(acc_[i], v[i]);
    }
    if (++arrived_ == n_) {
      result_ = acc_;
      resultApart_ = apart_;
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
    } else if (!cv_.wait_for(lock, std::chrono::seconds(60),
                             [&] { return generation_ != generation; })) {
      return Status(Code::timeout, "a thread did not arrive");
    }
    if (resultApart_) return Status(Code::invalidUsage, "the threads passed different lengths");
    v = result_;
    return {};
  }

 private:
  const int n_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<float> acc_, result_;
  bool apart_ = false, resultApart_ = false;
  int arrived_ = 0;
  std::uint64_t generation_ = 0;
};

// Two ranks (threads sharing the GPU) tune a shape together: they make the same agreement calls,
// and keep the candidate the agreed times name, here forced to the third (the times' last
// agreement: neither a meeting, one value, nor the shape check, nine) so that a rank choosing
// from its own times would show. C keeps the heuristic's first's bits.
TEST(GpuTpGemms, RanksTuningTogetherKeepTheAgreedCandidate) {
  if (!haveGpu()) GTEST_SKIP() << "no GPU on this machine";
  const Case c = cases()[1];
  Operands o(c.shape);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  auto heuristic = Gemms::create();
  ASSERT_TRUE(heuristic) << heuristic.status().message();
  const std::vector<std::uint16_t> want = runOnce(**heuristic, o, stream);
  for (bool force : {false, true}) {
    SCOPED_TRACE(force ? "the third forced" : "as timed");
    MaxOverThreads maxOver(2);
    std::vector<std::vector<std::size_t>> calls(2);
    std::vector<int> chosen(2, -2);
    std::vector<std::vector<std::uint16_t>> got(2);
    std::vector<std::thread> ranks;
    for (int r = 0; r < 2; ++r) {
      ranks.emplace_back([&, r] {
        cudaStream_t own = nullptr;
        ASSERT_EQ(cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking), cudaSuccess);
        auto gemms = Gemms::create();
        ASSERT_TRUE(gemms) << gemms.status().message();
        (*gemms)->setTuning(true, [&, r](std::vector<float>& v) {
          calls[static_cast<std::size_t>(r)].push_back(v.size());
          Status s = maxOver.reduce(v);
          if (s && force && v.size() != 1 && v.size() != 9)
            for (std::size_t i = 0; i < v.size(); ++i) v[i] = i == 2 ? 1.0f : 100.0f;
          return s;
        });
        got[static_cast<std::size_t>(r)] = runOnce(**gemms, o, own);
        chosen[static_cast<std::size_t>(r)] = (*gemms)->chosen(o.s);
        (void)cudaStreamDestroy(own);
      });
    }
    for (std::thread& t : ranks) t.join();
    ASSERT_GE(calls[0].size(), 2u) << "no tuning: fewer than two candidates";
    EXPECT_EQ(calls[0], calls[1]);
    EXPECT_EQ(calls[0].front(), 9u);
    EXPECT_EQ(chosen[0], chosen[1]);
    if (force) {
      EXPECT_EQ(chosen[0], 2);
    }
    for (int r = 0; r < 2; ++r)
      EXPECT_EQ(differing(want, got[static_cast<std::size_t>(r)]), 0u)
          << "rank " << r << ", of " << want.size() << " values";
  }
  (void)cudaStreamDestroy(stream);
}

// Ranks that meet different shapes first (a caller's bug, or ranks out of step) find it at the
// shape check and run the heuristic's first, each after that one agreement, with no wait.
TEST(GpuTpGemms, RanksTuningDifferentShapesRunUntuned) {
  if (!haveGpu()) GTEST_SKIP() << "no GPU on this machine";
  const std::vector<Case> all = cases();
  MaxOverThreads maxOver(2);
  std::vector<int> calls(2, 0), chosen(2, -2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      Operands o(all[static_cast<std::size_t>(r)].shape);
      cudaStream_t own = nullptr;
      ASSERT_EQ(cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking), cudaSuccess);
      auto gemms = Gemms::create();
      ASSERT_TRUE(gemms) << gemms.status().message();
      (*gemms)->setTuning(true, [&, r](std::vector<float>& v) {
        ++calls[static_cast<std::size_t>(r)];
        return maxOver.reduce(v);
      });
      (void)runOnce(**gemms, o, own);
      chosen[static_cast<std::size_t>(r)] = (*gemms)->chosen(o.s);
      (void)cudaStreamDestroy(own);
    });
  }
  for (std::thread& t : ranks) t.join();
  EXPECT_EQ(calls, (std::vector<int>{1, 1}));
  EXPECT_EQ(chosen, (std::vector<int>{0, 0}));
}

// An agreement that fails (a peer gone) fails the GEMM with its error.
TEST(GpuTpGemms, AFailedAgreementFailsTheGemm) {
  if (!haveGpu()) GTEST_SKIP() << "no GPU on this machine";
  Operands o(cases()[0].shape);
  auto gemms = Gemms::create();
  ASSERT_TRUE(gemms) << gemms.status().message();
  (*gemms)->setTuning(true,
                      [](std::vector<float>&) { return Status(Code::remoteError, "a peer left"); });
  void* dC = nullptr;
  ASSERT_EQ(cudaMalloc(&dC, cValues(o.s) * 2), cudaSuccess);
  const Status s = (*gemms)->run(o.s, o.dA, o.dB, dC, nullptr, o.dWs, nullptr, o.scales());
  EXPECT_EQ(s.code(), Code::remoteError) << s.message();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  (void)cudaFree(dC);
}

}  // namespace
}  // namespace weft::fused::tp
