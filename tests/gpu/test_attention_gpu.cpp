// weft's own attention kernel (fused/attention/local.hpp) against attention in double on the same
// bf16/f16 inputs: packed sequences of ragged lengths (1 and 0 among them), grouped K/V heads,
// head dims 64 and 128, causal and not; a ring step's parts; results merged into f32 partials
// equal to one attention over every key; on Hopper both its kernels (warpgroup and mma.sync);
// cuDNN's kernel likewise where it loads. Skipped without a GPU.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "fused/attention/cudnn.hpp"
#include "fused/attention/local.hpp"

namespace weft::fused::attention {
namespace {

bool haveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

void* upload(const void* host, std::size_t bytes) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice), cudaSuccess);
  return p;
}

// One problem: packed sequences, each of the same length for queries and keys.
struct Problem {
  std::vector<std::int32_t> cu;
  int heads = 4, kvHeads = 2, dim = 128;
  DataType type = DataType::bf16;
  float scale = 0;
  std::vector<float> q, k, v;  // as the kernel reads them (rounded to `type`)
  std::vector<std::uint16_t> qRaw, kRaw, vRaw;

  std::size_t tokens() const { return static_cast<std::size_t>(cu.back()); }
  std::uint16_t narrow(float x) const {
    if (type == DataType::bf16) return static_cast<__nv_bfloat16_raw>(__float2bfloat16(x)).x;
    return static_cast<__half_raw>(__float2half(x)).x;
  }
  float widen(std::uint16_t b) const {
    if (type == DataType::bf16) {
      __nv_bfloat16_raw r;
      r.x = b;
      return __bfloat162float(__nv_bfloat16(r));
    }
    __half_raw r;
    r.x = b;
    return __half2float(__half(r));
  }
  void fill(std::mt19937& rng) {
    std::normal_distribution<float> normal(0, 1);
    scale = 1.0f / std::sqrt(static_cast<float>(dim));
    auto make = [&](std::vector<float>& x, std::vector<std::uint16_t>& raw, int h) {
      raw.resize(tokens() * static_cast<std::size_t>(h * dim));
      x.resize(raw.size());
      for (std::size_t i = 0; i < raw.size(); ++i)
        raw[i] = narrow(normal(rng)), x[i] = widen(raw[i]);
    };
    make(q, qRaw, heads);
    make(k, kRaw, kvHeads);
    make(v, vRaw, kvHeads);
  }

  // Row (token, head)'s output and log-sum-exp over the piece's keys, in double; false where
  // the row is outside the piece's queries.
  bool reference(const Piece& p, std::size_t token, int head, std::vector<double>& out,
                 double& lse) const {
    std::size_t seq = 0;
    while (static_cast<std::size_t>(cu[seq + 1]) <= token) ++seq;
    const int begin = cu[seq], length = cu[seq + 1] - begin, i = static_cast<int>(token) - begin;
    auto span = [&](Part part) {
      if (part == Part::first) return std::pair{0, length / 2};
      if (part == Part::second) return std::pair{length / 2, length};
      return std::pair{0, length};
    };
    const auto [qLo, qHi] = span(p.q);
    const auto [kLo, kHi] = span(p.kv);
    if (i < qLo || i >= qHi) return false;
    const int kvHead = head / (heads / kvHeads);
    const std::size_t D = static_cast<std::size_t>(dim);
    std::vector<double> s;
    std::vector<int> keys;
    for (int j = kLo; j < kHi; ++j) {
      if (p.causal && j - kLo > i - qLo) continue;
      double dot = 0;
      const std::size_t kt = static_cast<std::size_t>(begin + j);
      for (std::size_t c = 0; c < D; ++c)
        dot += static_cast<double>(q[(token * heads + head) * D + c]) *
               k[(kt * kvHeads + kvHead) * D + c];
      s.push_back(dot * scale);
      keys.push_back(j);
    }
    out.assign(D, 0);
    if (s.empty()) {
      lse = -INFINITY;
      return true;
    }
    double most = -INFINITY, sum = 0;
    for (double x : s) most = std::max(most, x);
    for (std::size_t x = 0; x < s.size(); ++x) {
      const double w = std::exp(s[x] - most);
      sum += w;
      const std::size_t kt = static_cast<std::size_t>(begin + keys[x]);
      for (std::size_t c = 0; c < D; ++c) out[c] += w * v[(kt * kvHeads + kvHead) * D + c];
    }
    for (double& o : out) o /= sum;
    lse = most + std::log(sum);
    return true;
  }
};

struct Device {
  void *q = nullptr, *k = nullptr, *v = nullptr, *out = nullptr;
  float* lse = nullptr;
  std::int32_t* cu = nullptr;
  bool portable = false;  // mma.sync's kernel where Hopper's would run
  explicit Device(const Problem& p, std::size_t outBytes) {
    q = upload(p.qRaw.data(), p.qRaw.size() * 2);
    k = upload(p.kRaw.data(), p.kRaw.size() * 2);
    v = upload(p.vRaw.data(), p.vRaw.size() * 2);
    cu = static_cast<std::int32_t*>(upload(p.cu.data(), p.cu.size() * 4));
    EXPECT_EQ(cudaMalloc(&out, outBytes), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&lse, p.tokens() * static_cast<std::size_t>(p.heads) * 4), cudaSuccess);
  }
  ~Device() {
    for (void* x : {q, k, v, out, static_cast<void*>(lse), static_cast<void*>(cu)})
      (void)cudaFree(x);
  }
  LocalAttention call(const Problem& p, const Piece& piece, bool merge) const {
    LocalAttention a;
    a.q = q, a.k = k, a.v = v, a.cuSeqlensQ = cu, a.cuSeqlensK = cu;
    a.sequences = static_cast<int>(p.cu.size()) - 1;
    a.tokensQ = p.tokens();
    for (std::size_t s = 0; s + 1 < p.cu.size(); ++s)
      a.maxSeqlenQ =
          std::max<std::size_t>(a.maxSeqlenQ, static_cast<std::size_t>(p.cu[s + 1] - p.cu[s]));
    a.heads = p.heads, a.kvHeads = p.kvHeads, a.dim = p.dim, a.type = p.type, a.scale = p.scale;
    a.piece = piece;
    a.out = out, a.lse = lse, a.merge = merge, a.portable = portable;
    return a;
  }
};

// Compares every row the piece covers: out within the output's rounding, lse closely.
void expectRows(const Problem& p, const Piece& piece, const std::vector<float>& out,
                const std::vector<float>& lse, const std::string& what) {
  const std::size_t D = static_cast<std::size_t>(p.dim);
  int bad = 0;
  std::vector<double> want;
  double wantLse = 0;
  for (std::size_t t = 0; t < p.tokens(); ++t) {
    for (int h = 0; h < p.heads; ++h) {
      if (!p.reference(piece, t, h, want, wantLse)) continue;
      const float gotLse = lse[static_cast<std::size_t>(h) * p.tokens() + t];
      const bool lseOk = wantLse == -INFINITY
                             ? gotLse == -INFINITY
                             : std::fabs(gotLse - wantLse) <= 1e-4 * (1 + std::fabs(wantLse));
      if (!lseOk && bad++ < 3)
        ADD_FAILURE() << what << ": lse of token " << t << " head " << h << " = " << gotLse
                      << ", expected " << wantLse;
      for (std::size_t c = 0; c < D; ++c) {
        const double got = out[(t * p.heads + h) * D + c];
        if (!(std::fabs(got - want[c]) <= 8e-3 * (1 + std::fabs(want[c]))) && bad++ < 3)
          ADD_FAILURE() << what << ": out of token " << t << " head " << h << " [" << c
                        << "] = " << got << ", expected " << want[c];
      }
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

// Runs `a` (written, not merged) on outputs poisoned with NaN and checks every row of `piece`.
void expectWritten(const Problem& p, const Device& d, const LocalAttention& a, const Piece& piece,
                   const std::string& what) {
  const std::size_t values = p.tokens() * static_cast<std::size_t>(p.heads * p.dim);
  ASSERT_EQ(cudaMemset(d.out, 0xFF, values * 2), cudaSuccess);  // NaN
  Status s = attendOnDevice(a, nullptr);
  ASSERT_TRUE(s.isOk()) << what << ": " << s.toString();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<std::uint16_t> raw(values);
  std::vector<float> out(values), lse(p.tokens() * static_cast<std::size_t>(p.heads));
  ASSERT_EQ(cudaMemcpy(raw.data(), d.out, values * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(lse.data(), d.lse, lse.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  for (std::size_t i = 0; i < values; ++i) out[i] = p.widen(raw[i]);
  expectRows(p, piece, out, lse, what);
}

TEST(AttentionGpu, MatchesAttentionInDouble) {
  if (!haveGpu()) GTEST_SKIP() << "no GPU";
  std::mt19937 rng(11);
  for (DataType type : {DataType::bf16, DataType::f16}) {
    for (int dim : {64, 128}) {
      for (int kvHeads : {4, 2, 1}) {
        Problem p;
        p.cu = {0, 37, 38, 38, 102, 232, 533};  // 37, 1, 0, 64, 130 and 301 tokens
        p.kvHeads = kvHeads, p.dim = dim, p.type = type;
        p.fill(rng);
        const std::size_t values = p.tokens() * static_cast<std::size_t>(p.heads * dim);
        Device d(p, values * 2);
        for (bool portable : {false, true}) {
          d.portable = portable;
          for (bool causal : {false, true}) {
            const Piece piece{Part::all, Part::all, causal};
            expectWritten(p, d, d.call(p, piece, false), piece,
                          std::string(name(type)) + " dim " + std::to_string(dim) + " kv heads " +
                              std::to_string(kvHeads) + (causal ? " causal" : " full") +
                              (portable ? " (mma.sync)" : ""));
          }
        }
      }
    }
  }
}

// A ring's steps in merge mode: f32 partials merged step by step equal one attention over all
// the keys; each step's parts alone match their own reference.
TEST(AttentionGpu, MergedPartsEqualTheWholeAttention) {
  if (!haveGpu()) GTEST_SKIP() << "no GPU";
  std::mt19937 rng(12);
  Problem p;
  p.cu = {0, 48, 50, 178, 480};  // halves of 24, 1, 64 and 151
  p.fill(rng);
  const std::size_t values = p.tokens() * static_cast<std::size_t>(p.heads * p.dim);
  Device d(p, values * 4);
  for (int run = 0; run < 4; ++run) {
    const bool causal = run % 2 == 1;
    d.portable = run >= 2;
    std::vector<float> zero(values, 0.0f), none(p.tokens() * 4, -INFINITY);
    ASSERT_EQ(cudaMemcpy(d.out, zero.data(), values * 4, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(d.lse, none.data(), none.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    // Causal as the ring's zigzag does it for the own block's halves: the first half's keys
    // under the mask for the first half's queries, in full for the second's, then the second
    // half under the mask for the second half's.
    const std::vector<Piece> steps = causal ? std::vector<Piece>{{Part::first, Part::first, true},
                                                                 {Part::second, Part::first, false},
                                                                 {Part::second, Part::second, true}}
                                            : std::vector<Piece>{{Part::all, Part::second, false},
                                                                 {Part::all, Part::first, false}};
    for (const Piece& s : steps) ASSERT_TRUE(attendOnDevice(d.call(p, s, true), nullptr).isOk());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<float> out(values), lse(none.size());
    ASSERT_EQ(cudaMemcpy(out.data(), d.out, values * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(lse.data(), d.lse, lse.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    expectRows(
        p, {Part::all, Part::all, causal}, out, lse,
        std::string(causal ? "merged causal" : "merged full") + (d.portable ? " (mma.sync)" : ""));
  }
}

// cuDNN's kernel (where libcudnn loads) on one sequence: written whole, and a ring's parts
// merged into f32 partials, against double.
TEST(AttentionGpu, CudnnMatchesAttentionInDouble) {
  if (!haveGpu()) GTEST_SKIP() << "no GPU";
  if (Status s = cudnnAvailable(); !s) GTEST_SKIP() << s.message();
  std::mt19937 rng(13);
  void* scratch = nullptr;
  const std::size_t scratchBytes = std::size_t{16} << 20;
  ASSERT_EQ(cudaMalloc(&scratch, scratchBytes), cudaSuccess);
  for (DataType type : {DataType::bf16, DataType::f16}) {
    for (int dim : {64, 128}) {
      for (int kvHeads : {4, 1}) {
        Problem p;
        p.cu = {0, 202};  // halves of 101
        p.kvHeads = kvHeads, p.dim = dim, p.type = type;
        p.fill(rng);
        const std::size_t values = p.tokens() * static_cast<std::size_t>(p.heads * dim);
        Device d(p, values * 4);
        const std::string what = std::string(name(type)) + " dim " + std::to_string(dim) +
                                 " kv heads " + std::to_string(kvHeads);
        for (bool causal : {false, true}) {
          const Piece piece{Part::all, Part::all, causal};
          LocalAttention a = d.call(p, piece, false);
          a.kernel = algo::AttentionKernel::cudnn, a.scratch = scratch;
          a.scratchBytes = scratchBytes;
          ASSERT_TRUE(cudnnCovers(a));
          expectWritten(p, d, a, piece, "cuDNN " + what + (causal ? " causal" : " full"));
        }
        // The zigzag's own block in parts, merged.
        std::vector<float> zero(values, 0.0f), none(p.tokens() * 4, -INFINITY);
        ASSERT_EQ(cudaMemcpy(d.out, zero.data(), values * 4, cudaMemcpyHostToDevice), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(d.lse, none.data(), none.size() * 4, cudaMemcpyHostToDevice),
                  cudaSuccess);
        for (const Piece& step :
             {Piece{Part::first, Part::first, true}, Piece{Part::second, Part::first, false},
              Piece{Part::second, Part::second, true}}) {
          LocalAttention a = d.call(p, step, true);
          a.kernel = algo::AttentionKernel::cudnn, a.scratch = scratch;
          a.scratchBytes = scratchBytes;
          Status s = attendOnDevice(a, nullptr);
          ASSERT_TRUE(s.isOk()) << s.toString();
        }
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        std::vector<float> out(values), lse(none.size());
        ASSERT_EQ(cudaMemcpy(out.data(), d.out, values * 4, cudaMemcpyDeviceToHost), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(lse.data(), d.lse, lse.size() * 4, cudaMemcpyDeviceToHost),
                  cudaSuccess);
        expectRows(p, {Part::all, Part::all, true}, out, lse, "cuDNN merged causal " + what);
      }
    }
  }
  (void)cudaFree(scratch);
}

// What cuDNN's graph does not cover stays with weft's kernel: packed sequences, a causal piece
// of unequal parts, f32.
TEST(AttentionGpu, CudnnCoversOneSequence) {
  LocalAttention a;
  a.sequences = 1, a.heads = 4, a.kvHeads = 2, a.dim = 128, a.merge = true;
  EXPECT_TRUE(cudnnCovers(a));
  a.sequences = 2;
  EXPECT_FALSE(cudnnCovers(a));
  a.sequences = 1, a.piece = {Part::second, Part::first, true};
  EXPECT_FALSE(cudnnCovers(a));
  a.piece = {Part::all, Part::all, false}, a.dim = 96;
  EXPECT_FALSE(cudnnCovers(a));
}

TEST(AttentionGpu, BadShapesAreRefused) {
  LocalAttention a;
  a.sequences = 1;
  a.heads = 6, a.kvHeads = 4, a.dim = 128;
  EXPECT_NE(checkLocal(a).message().find("do not group"), std::string::npos);
  a.kvHeads = 2, a.dim = 96;
  EXPECT_NE(checkLocal(a).message().find("head dim 96"), std::string::npos);
  a.dim = 64, a.type = DataType::f32;
  EXPECT_NE(checkLocal(a).message().find("f32"), std::string::npos);
  a.type = DataType::bf16;
  EXPECT_NE(checkLocal(a).message().find("NULL"), std::string::npos);
  EXPECT_EQ(attendOnDevice(a, nullptr).code(), Code::invalidArgument);
}

}  // namespace
}  // namespace weft::fused::attention
