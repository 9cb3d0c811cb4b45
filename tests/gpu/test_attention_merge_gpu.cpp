// The log-sum-exp merge of partial attention results (fused/attention/merge.hpp) against the
// same merge in double: rows that attended keys on both sides, on one, on neither; head dims
// that are and are not multiples of a warp; bf16 and f32 block outputs. Skipped without a GPU.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "fused/attention/merge.hpp"

namespace weft::fused::attention {
namespace {

bool haveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

template <typename T>
T* upload(const std::vector<T>& host) {
  T* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, host.size() * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
            cudaSuccess);
  return p;
}

template <typename T>
std::vector<T> download(const T* p, std::size_t count) {
  std::vector<T> host(count);
  EXPECT_EQ(cudaMemcpy(host.data(), p, count * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return host;
}

TEST(AttentionMergeGpu, MatchesTheMergeInDouble) {
  if (!haveGpu()) GTEST_SKIP() << "no GPU";
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0, 1);
  std::uniform_real_distribution<float> logits(-20, 20);
  for (bool bf16 : {false, true}) {
    for (std::size_t dim : {64, 72, 128}) {
      const MergeShape s{37, 3, dim};
      const std::size_t rows = s.tokens * s.heads, values = rows * dim;
      std::vector<float> out(values), block(values), lse(rows), blockLse(rows);
      for (float& x : out) x = normal(rng);
      for (float& x : block) x = normal(rng);
      for (std::size_t r = 0; r < rows; ++r) {
        lse[r] = logits(rng), blockLse[r] = logits(rng);
        // Rows that attended nothing so far, nothing in the block, nothing at all.
        if (r % 7 == 1) lse[r] = -INFINITY;
        if (r % 7 == 2) blockLse[r] = -INFINITY;
        if (r % 7 == 3) lse[r] = blockLse[r] = -INFINITY;
        if (r % 7 == 4) blockLse[r] = lse[r];
      }
      for (std::size_t r = 0; r < rows; ++r) {
        if (lse[r] == -INFINITY) {
          for (std::size_t d = 0; d < dim; ++d) out[r * dim + d] = 0;
        }
      }
      std::vector<__nv_bfloat16> narrow(values);
      for (std::size_t i = 0; i < values; ++i) {
        narrow[i] = __float2bfloat16(block[i]);
        if (bf16) block[i] = __bfloat162float(narrow[i]);  // what the kernel reads
      }
      float* dOut = upload(out);
      float* dLse = upload(lse);
      float* dBlockLse = upload(blockLse);
      void* dBlock = bf16 ? static_cast<void*>(upload(narrow)) : static_cast<void*>(upload(block));
      ASSERT_TRUE(mergeOnDevice(dOut, dLse, dBlock, dBlockLse,
                                bf16 ? DataType::bf16 : DataType::f32, s, nullptr)
                      .isOk());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const auto gotOut = download(dOut, values);
      const auto gotLse = download(dLse, rows);
      for (std::size_t row = 0; row < rows; ++row) {
        const std::size_t t = row / s.heads, h = row % s.heads, at = h * s.tokens + t;
        const double l = lse[at], b = blockLse[at];
        double merged = l, wa = 1, wb = 0;
        if (b != -INFINITY) {
          merged = l == -INFINITY
                       ? b
                       : std::max(l, b) + std::log1p(std::exp(std::min(l, b) - std::max(l, b)));
          wa = l == -INFINITY ? 0 : std::exp(l - merged);
          wb = std::exp(b - merged);
        }
        if (merged == -INFINITY) {
          EXPECT_EQ(gotLse[at], -INFINITY) << row;
        } else {
          EXPECT_NEAR(gotLse[at], merged, 1e-5 * (1 + std::fabs(merged))) << row;
        }
        for (std::size_t d = 0; d < dim; ++d) {
          const double want = wa * out[row * dim + d] + wb * block[row * dim + d];
          ASSERT_NEAR(gotOut[row * dim + d], want, 2e-6 * (1 + std::fabs(want)))
              << (bf16 ? "bf16" : "f32") << " dim " << dim << " row " << row << " d " << d;
        }
      }
      for (void* p : {static_cast<void*>(dOut), static_cast<void*>(dLse),
                      static_cast<void*>(dBlockLse), dBlock})
        (void)cudaFree(p);
    }
  }
}

TEST(AttentionMergeGpu, RefusesIntegerOutputs) {
  if (!haveGpu()) GTEST_SKIP() << "no GPU";
  const Status s =
      mergeOnDevice(nullptr, nullptr, nullptr, nullptr, DataType::i32, {1, 1, 64}, nullptr);
  EXPECT_EQ(s.code(), Code::invalidArgument);
  EXPECT_NE(s.message().find("i32"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace weft::fused::attention
