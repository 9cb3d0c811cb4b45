// The backward pass of weft's attention kernel (fused/attention/backward.hpp) against gradients
// in double on the same bf16/f16 inputs: packed sequences of ragged lengths (1 and 0 among them),
// grouped K/V heads, head dims 64 and 128, causal and not; delta; the ring's zigzag pieces added
// up equal the whole backward; central differences of the forward in double agree with the
// gradients. On Hopper both kernels (warpgroup and mma.sync). Skipped without a GPU.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "fused/attention/backward.hpp"

namespace weft::fused::attention {
namespace {

bool haveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// Device memory, freed with it.
struct Memory {
  std::vector<void*> held;
  Memory() = default;
  Memory(const Memory&) = delete;
  Memory& operator=(const Memory&) = delete;
  ~Memory() {
    for (void* p : held) (void)cudaFree(p);
  }
  template <typename T>
  T* copy(const std::vector<T>& host) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, std::max<std::size_t>(host.size(), 1) * sizeof(T)), cudaSuccess);
    held.push_back(p);
    if (!host.empty()) {
      EXPECT_EQ(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
                cudaSuccess);
    }
    return static_cast<T*>(p);
  }
};

template <typename T>
std::vector<T> download(const T* device, std::size_t n) {
  std::vector<T> host(n);
  EXPECT_EQ(cudaMemcpy(host.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return host;
}

std::vector<float> narrowed(const std::vector<double>& x) {
  return std::vector<float>(x.begin(), x.end());
}

struct Grads {
  std::vector<double> dq, dk, dv;
};

// One problem: packed sequences, each of the same length for queries and keys.
struct Problem {
  std::vector<std::int32_t> cu;
  int heads = 4, kvHeads = 2, dim = 128;
  DataType type = DataType::bf16;
  float scale = 0;
  std::vector<double> q, k, v, dOut;  // as the kernel reads them (rounded to `type`)

  std::size_t tokens() const { return static_cast<std::size_t>(cu.back()); }
  std::size_t D() const { return static_cast<std::size_t>(dim); }
  std::size_t longest() const {
    std::size_t most = 0;
    for (std::size_t s = 0; s + 1 < cu.size(); ++s)
      most = std::max(most, static_cast<std::size_t>(cu[s + 1] - cu[s]));
    return most;
  }
  std::uint16_t narrow(double x) const {
    const auto f = static_cast<float>(x);
    if (type == DataType::bf16) return static_cast<__nv_bfloat16_raw>(__float2bfloat16(f)).x;
    return static_cast<__half_raw>(__float2half(f)).x;
  }
  double widen(std::uint16_t b) const {
    if (type == DataType::bf16) {
      __nv_bfloat16_raw r;
      r.x = b;
      return static_cast<double>(__bfloat162float(__nv_bfloat16(r)));
    }
    __half_raw r;
    r.x = b;
    return static_cast<double>(__half2float(__half(r)));
  }
  std::vector<std::uint16_t> raw(const std::vector<double>& x) const {
    std::vector<std::uint16_t> r(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) r[i] = narrow(x[i]);
    return r;
  }
  std::vector<double> rounded(const std::vector<double>& x) const {
    std::vector<double> r(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) r[i] = widen(narrow(x[i]));
    return r;
  }
  void fill(std::mt19937& rng) {
    std::normal_distribution<double> normal(0, 1);
    scale = 1.0f / std::sqrt(static_cast<float>(dim));
    auto make = [&](std::vector<double>& x, int h) {
      x.resize(tokens() * static_cast<std::size_t>(h) * D());
      for (double& e : x) e = widen(narrow(normal(rng)));
    };
    make(q, heads);
    make(k, kvHeads);
    make(v, kvHeads);
    make(dOut, heads);
  }
  Grads zeros() const {
    const std::size_t kv = tokens() * static_cast<std::size_t>(kvHeads) * D();
    return {std::vector<double>(tokens() * static_cast<std::size_t>(heads) * D(), 0.0),
            std::vector<double>(kv, 0.0), std::vector<double>(kv, 0.0)};
  }

  // Calls f(query token, key token) for every pair the piece computes, in every sequence: key j
  // of its part with query i of its part where (under the mask) j ≤ i.
  template <typename F>
  void forPairs(const Piece& p, F&& f) const {
    for (std::size_t s = 0; s + 1 < cu.size(); ++s) {
      const int begin = cu[s], length = cu[s + 1] - begin;
      auto span = [&](Part part) {
        if (part == Part::first) return std::pair{0, length / 2};
        if (part == Part::second) return std::pair{length / 2, length};
        return std::pair{0, length};
      };
      const auto [qLo, qHi] = span(p.q);
      const auto [kLo, kHi] = span(p.kv);
      for (int i = qLo; i < qHi; ++i)
        for (int j = kLo; j < kHi && (!p.causal || j - kLo <= i - qLo); ++j)
          f(static_cast<std::size_t>(begin + i), static_cast<std::size_t>(begin + j));
    }
  }
  const double* row(const std::vector<double>& x, std::size_t token, int h, int of) const {
    return x.data() + (token * static_cast<std::size_t>(of) + static_cast<std::size_t>(h)) * D();
  }
  double dotRows(const double* a, const double* b) const {
    double s = 0;
    for (std::size_t c = 0; c < D(); ++c) s += a[c] * b[c];
    return s;
  }
  int kvOf(int h) const { return h / (heads / kvHeads); }
  double score(std::size_t i, int h, std::size_t j) const {
    return dotRows(row(q, i, h, heads), row(k, j, kvOf(h), kvHeads)) * scale;
  }
  std::size_t at(int h, std::size_t token) const {
    return static_cast<std::size_t>(h) * tokens() + token;
  }

  // The piece's out [tokens, heads, dim] and lse [heads, tokens] in double (rows of no key: 0
  // and −inf).
  void forward(const Piece& p, std::vector<double>& out, std::vector<double>& lse) const {
    out.assign(tokens() * static_cast<std::size_t>(heads) * D(), 0.0);
    lse.assign(tokens() * static_cast<std::size_t>(heads), -INFINITY);
    for (int h = 0; h < heads; ++h) {
      std::vector<double> most(tokens(), -INFINITY), sum(tokens(), 0.0);
      forPairs(p,
               [&](std::size_t i, std::size_t j) { most[i] = std::max(most[i], score(i, h, j)); });
      forPairs(p, [&](std::size_t i, std::size_t j) {
        const double w = std::exp(score(i, h, j) - most[i]);
        sum[i] += w;
        double* o = out.data() + (i * static_cast<std::size_t>(heads) + h) * D();
        const double* vj = row(v, j, kvOf(h), kvHeads);
        for (std::size_t c = 0; c < D(); ++c) o[c] += w * vj[c];
      });
      for (std::size_t i = 0; i < tokens(); ++i) {
        if (sum[i] == 0) continue;
        double* o = out.data() + (i * static_cast<std::size_t>(heads) + h) * D();
        for (std::size_t c = 0; c < D(); ++c) o[c] /= sum[i];
        lse[at(h, i)] = most[i] + std::log(sum[i]);
      }
    }
  }
  // delta [heads, tokens] of out.
  std::vector<double> delta(const std::vector<double>& out) const {
    std::vector<double> d(tokens() * static_cast<std::size_t>(heads));
    for (std::size_t t = 0; t < tokens(); ++t)
      for (int h = 0; h < heads; ++h)
        d[at(h, t)] = dotRows(row(dOut, t, h, heads), row(out, t, h, heads));
    return d;
  }
  // Adds the piece's gradients by backward.hpp's formulas, from the final lse and delta.
  void backward(const Piece& p, const std::vector<double>& lse, const std::vector<double>& delta,
                Grads& g) const {
    for (int h = 0; h < heads; ++h) {
      const auto kvh = static_cast<std::size_t>(kvOf(h));
      forPairs(p, [&](std::size_t i, std::size_t j) {
        const double P = std::exp(score(i, h, j) - lse[at(h, i)]);
        const double* dOi = row(dOut, i, h, heads);
        const double dS = P * (dotRows(dOi, row(v, j, kvOf(h), kvHeads)) - delta[at(h, i)]);
        const std::size_t qi = (i * static_cast<std::size_t>(heads) + h) * D();
        const std::size_t kj = (j * static_cast<std::size_t>(kvHeads) + kvh) * D();
        for (std::size_t c = 0; c < D(); ++c) {
          g.dv[kj + c] += P * dOi[c];
          g.dq[qi + c] += scale * dS * k[kj + c];
          g.dk[kj + c] += scale * dS * q[qi + c];
        }
      });
    }
  }
};

// The problem on the device with the final lse and delta, and f32 gradients of `start`.
struct OnDevice {
  Memory m;
  LocalBackward b;
  OnDevice(const Problem& p, const Piece& piece, const std::vector<double>& lse,
           const std::vector<double>& delta, const Grads& start) {
    b.q = m.copy(p.raw(p.q)), b.k = m.copy(p.raw(p.k)), b.v = m.copy(p.raw(p.v));
    b.cuSeqlensQ = b.cuSeqlensK = m.copy(p.cu);
    b.sequences = static_cast<int>(p.cu.size()) - 1;
    b.tokensQ = b.tokensK = p.tokens();
    b.maxSeqlenQ = b.maxSeqlenK = p.longest();
    b.heads = p.heads, b.kvHeads = p.kvHeads, b.dim = p.dim, b.type = p.type, b.scale = p.scale;
    b.piece = piece;
    b.dOut = m.copy(p.raw(p.dOut));
    b.lse = m.copy(narrowed(lse)), b.delta = m.copy(narrowed(delta));
    b.dq = m.copy(narrowed(start.dq)), b.dk = m.copy(narrowed(start.dk));
    b.dv = m.copy(narrowed(start.dv));
  }
  Grads got() const {
    auto widened = [](const std::vector<float>& x) {
      return std::vector<double>(x.begin(), x.end());
    };
    const std::size_t kv = b.tokensK * static_cast<std::size_t>(b.kvHeads * b.dim);
    return {widened(download(b.dq, b.tokensQ * static_cast<std::size_t>(b.heads * b.dim))),
            widened(download(b.dk, kv)), widened(download(b.dv, kv))};
  }
};

// Every gradient within 1% of the tensor's largest plus 2% of its own size: the kernels multiply
// P and dS rounded to the inputs' type (as FlashAttention does), the rest is f32.
void expectGrads(const Problem& p, const Grads& want, const Grads& got, const std::string& what) {
  int bad = 0;
  auto check = [&](const char* name, const std::vector<double>& w, const std::vector<double>& g,
                   int heads) {
    ASSERT_EQ(w.size(), g.size());
    double most = 0;
    for (double x : w) most = std::max(most, std::fabs(x));
    for (std::size_t x = 0; x < w.size(); ++x) {
      if (std::fabs(g[x] - w[x]) <= 1e-2 * most + 2e-2 * std::fabs(w[x]) || bad++ >= 5) continue;
      const std::size_t row = x / p.D();
      ADD_FAILURE() << what << ": " << name << " of token " << row / static_cast<std::size_t>(heads)
                    << " head " << row % static_cast<std::size_t>(heads) << " [" << x % p.D()
                    << "] = " << g[x] << ", expected " << w[x] << " (largest " << most << ")";
    }
  };
  check("dq", want.dq, got.dq, p.heads);
  check("dk", want.dk, got.dk, p.kvHeads);
  check("dv", want.dv, got.dv, p.kvHeads);
  EXPECT_EQ(bad, 0) << what;
}

TEST(AttentionBackwardGpu, MatchesGradientsInDouble) {
  if (!haveGpu()) GTEST_SKIP() << "no GPU";
  std::mt19937 rng(21);
  for (DataType type : {DataType::bf16, DataType::f16}) {
    for (int dim : {64, 128}) {
      for (int kvHeads : {4, 2, 1}) {
        Problem p;
        p.cu = {0, 37, 38, 38, 102, 232, 533};  // 37, 1, 0, 64, 130 and 301 tokens
        p.kvHeads = kvHeads, p.dim = dim, p.type = type;
        p.fill(rng);
        for (int run = 0; run < 4; ++run) {
          const bool causal = run % 2 == 1, portable = run >= 2;
          const std::string what = std::string(name(type)) + " dim " + std::to_string(dim) +
                                   " kv heads " + std::to_string(kvHeads) +
                                   (causal ? " causal" : " full") + (portable ? " (mma.sync)" : "");
          const Piece piece{Part::all, Part::all, causal};
          std::vector<double> out, lse;
          p.forward(piece, out, lse);
          const std::vector<double> delta = p.delta(out);
          OnDevice d(p, piece, lse, delta, p.zeros());
          d.b.portable = portable;
          // delta from out as the forward writes it (rounded to type): f32 sums of D products.
          float* gotDelta = d.m.copy(std::vector<float>(delta.size(), NAN));
          ASSERT_TRUE(computeDelta(d.m.copy(p.raw(out)), d.b.dOut, type, p.tokens(), p.heads, dim,
                                   gotDelta, nullptr)
                          .isOk());
          ASSERT_TRUE(attendBackwardOnDevice(d.b, nullptr).isOk());
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          const std::vector<double> wantDelta = p.delta(p.rounded(out));
          const std::vector<float> deltas = download(gotDelta, delta.size());
          int bad = 0;
          for (std::size_t x = 0; x < deltas.size(); ++x)
            if (!(std::fabs(deltas[x] - wantDelta[x]) <= 1e-4 * (1 + std::fabs(wantDelta[x]))) &&
                bad++ < 3)
              ADD_FAILURE() << what << ": delta [" << x << "] = " << deltas[x] << ", expected "
                            << wantDelta[x];
          EXPECT_EQ(bad, 0) << what;
          Grads want = p.zeros();
          p.backward(piece, lse, delta, want);
          expectGrads(p, want, d.got(), what);
        }
      }
    }
  }
}

// The ring's zigzag pieces of the own block (first half under the mask, the second half's
// queries against the first in full, the second half under the mask), added one by one into
// gradients that are not zero: each adds its own share, touches nothing else, and all three
// add the whole causal backward.
TEST(AttentionBackwardGpu, ZigzagPiecesAddUpToTheWholeBackward) {
  if (!haveGpu()) GTEST_SKIP() << "no GPU";
  std::mt19937 rng(22);
  Problem p;
  // Odd lengths too: the halves still tile the causal square.
  p.cu = {0, 37, 38, 38, 102, 232, 533};
  p.fill(rng);
  const Piece whole{Part::all, Part::all, true};
  std::vector<double> out, lse;
  p.forward(whole, out, lse);
  const std::vector<double> delta = p.delta(out);
  Grads start = p.zeros();
  std::uniform_real_distribution<float> uniform(-1, 1);
  for (auto* x : {&start.dq, &start.dk, &start.dv})
    for (double& e : *x) e = uniform(rng);
  Grads all = start;
  p.backward(whole, lse, delta, all);
  for (bool portable : {false, true}) {
    OnDevice d(p, whole, lse, delta, start);
    d.b.portable = portable;
    Grads want = start;
    for (const Piece& piece :
         {Piece{Part::first, Part::first, true}, Piece{Part::second, Part::first, false},
          Piece{Part::second, Part::second, true}}) {
      d.b.piece = piece;
      ASSERT_TRUE(attendBackwardOnDevice(d.b, nullptr).isOk());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      p.backward(piece, lse, delta, want);
      expectGrads(p, want, d.got(),
                  std::string("piece ") + std::to_string(static_cast<int>(piece.q)) + "/" +
                      std::to_string(static_cast<int>(piece.kv)) + (portable ? " (mma.sync)" : ""));
    }
    expectGrads(p, all, d.got(),
                std::string("the pieces added up") + (portable ? " (mma.sync)" : ""));
  }
}

// With L = Σ dOut ∘ out(q, k, v) in double, central differences of L by entries of the rounded
// q, k and v agree with the device's gradients within 2e-2 of the largest.
TEST(AttentionBackwardGpu, GradientsMatchCentralDifferences) {
  if (!haveGpu()) GTEST_SKIP() << "no GPU";
  std::mt19937 rng(23);
  Problem p;
  p.cu = {0, 6};
  p.heads = 2, p.kvHeads = 1, p.dim = 64;
  p.fill(rng);
  const Piece causal{Part::all, Part::all, true};
  std::vector<double> out, lse;
  p.forward(causal, out, lse);
  OnDevice d(p, causal, lse, p.delta(out), p.zeros());
  ASSERT_TRUE(attendBackwardOnDevice(d.b, nullptr).isOk());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const Grads got = d.got();
  auto loss = [&](const Problem& x) {
    std::vector<double> o, l;
    x.forward(causal, o, l);
    double s = 0;
    for (std::size_t i = 0; i < o.size(); ++i) s += x.dOut[i] * o[i];
    return s;
  };
  constexpr double h = 1e-3;
  auto check = [&](std::vector<double> Problem::*input, const std::vector<double>& grad,
                   const char* what) {
    double most = 0;
    for (double g : grad) most = std::max(most, std::fabs(g));
    EXPECT_GT(most, 0) << what;
    std::uniform_int_distribution<std::size_t> pick(0, grad.size() - 1);
    for (int n = 0; n < 12; ++n) {
      const std::size_t x = pick(rng);
      Problem moved = p;
      (moved.*input)[x] += h;
      const double up = loss(moved);
      (moved.*input)[x] -= 2 * h;
      const double down = loss(moved);
      EXPECT_NEAR(grad[x], (up - down) / (2 * h), 2e-2 * most) << what << " [" << x << "]";
    }
  };
  check(&Problem::q, got.dq, "dq");
  check(&Problem::k, got.dk, "dk");
  check(&Problem::v, got.dv, "dv");
}

TEST(AttentionBackwardGpu, BadShapesAreRefused) {
  LocalBackward b;
  b.sequences = 1;
  b.heads = 6, b.kvHeads = 4, b.dim = 128;
  EXPECT_NE(checkBackward(b).message().find("do not group"), std::string::npos);
  b.kvHeads = 2, b.dim = 96;
  EXPECT_NE(checkBackward(b).message().find("head dim 96"), std::string::npos);
  b.dim = 64, b.type = DataType::f32;
  EXPECT_NE(checkBackward(b).message().find("f32"), std::string::npos);
  b.type = DataType::bf16;
  EXPECT_NE(checkBackward(b).message().find("NULL"), std::string::npos);
  EXPECT_EQ(attendBackwardOnDevice(b, nullptr).code(), Code::invalidArgument);
  EXPECT_EQ(computeDelta(nullptr, nullptr, DataType::f32, 1, 1, 64, nullptr, nullptr).code(),
            Code::invalidArgument);
}

}  // namespace
}  // namespace weft::fused::attention
