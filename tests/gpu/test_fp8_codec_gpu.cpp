// The fp8 codecs on the GPU write the host codec's bytes and decode to its values, bit for bit,
// for every scheme and input type, aligned buffers and not, with partial and non-finite blocks;
// skipped without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "fused/fp8/codec.hpp"
#include "fused/fp8/codec_device.hpp"
#include "src/exec/numeric.hpp"

namespace weft::fused::fp8 {
namespace {

bool haveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// Values of `type` (as bytes): blocks of every magnitude, a zero block, NaN and infinities.
std::vector<std::uint8_t> values(DataType type, std::size_t count, std::mt19937& rng) {
  std::normal_distribution<float> normal(0, 1);
  std::uniform_int_distribution<int> exponent(-12, 12);
  const std::size_t size = type == DataType::f32 ? 4 : 2;
  std::vector<std::uint8_t> bytes(count * size);
  float magnitude = 1;
  for (std::size_t i = 0; i < count; ++i) {
    if (i % 32 == 0) magnitude = std::ldexp(1.0f, exponent(rng));
    float v = normal(rng) * magnitude;
    if (i / 32 == 3) v = 0;
    if (i == 5 * 32 + 3) v = std::numeric_limits<float>::quiet_NaN();
    if (i == 9 * 128 + 100) v = -std::numeric_limits<float>::infinity();
    if (type == DataType::f32) {
      std::memcpy(bytes.data() + 4 * i, &v, 4);
    } else {
      const std::uint16_t h = type == DataType::f16 ? exec::floatToHalf(v) : exec::floatToBf16(v);
      std::memcpy(bytes.data() + 2 * i, &h, 2);
    }
  }
  return bytes;
}

TEST(Fp8CodecGpu, TheDeviceWritesTheHostsBytesAndDecodesToItsValues) {
  if (!haveGpu()) GTEST_SKIP() << "no GPU";
  std::mt19937 rng(7);
  for (const char* scheme : {"e4m3:32", "e5m2:32", "e4m3:128", "e5m2:128"}) {
    const Codec c = *Codec::parse(scheme);
    for (DataType type : {DataType::f32, DataType::bf16, DataType::f16}) {
      const std::size_t size = type == DataType::f32 ? 4 : 2;
      // Aligned, and one value (and one encoded byte) off alignment; a partial last block.
      for (std::size_t offset : {std::size_t{0}, std::size_t{1}}) {
        const std::size_t count = 128 * 100 + 45;
        const auto in = values(type, count, rng);
        std::vector<std::byte> want(c.encodedBytes(count));
        ASSERT_TRUE(encode(c, type, in.data(), count, want.data()).isOk());
        std::vector<std::uint8_t> wantBack(in.size());
        ASSERT_TRUE(decode(c, type, want.data(), count, wantBack.data()).isOk());

        std::uint8_t* dIn = nullptr;
        std::byte* dEnc = nullptr;
        std::uint8_t* dOut = nullptr;
        ASSERT_EQ(cudaMalloc(&dIn, in.size() + offset * size), cudaSuccess);
        ASSERT_EQ(cudaMalloc(&dEnc, want.size() + offset), cudaSuccess);
        ASSERT_EQ(cudaMalloc(&dOut, in.size() + offset * size), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(dIn + offset * size, in.data(), in.size(), cudaMemcpyHostToDevice),
                  cudaSuccess);
        ASSERT_EQ(cudaMemset(dEnc, 0xA5, want.size() + offset), cudaSuccess);  // poisoned
        ASSERT_EQ(cudaMemset(dOut, 0xA5, in.size() + offset * size), cudaSuccess);
        ASSERT_TRUE(
            encodeOnDevice(c, type, dIn + offset * size, count, dEnc + offset, nullptr).isOk());
        ASSERT_TRUE(
            decodeOnDevice(c, type, dEnc + offset, count, dOut + offset * size, nullptr).isOk());
        std::vector<std::byte> got(want.size());
        std::vector<std::uint8_t> gotBack(in.size());
        ASSERT_EQ(cudaMemcpy(got.data(), dEnc + offset, got.size(), cudaMemcpyDeviceToHost),
                  cudaSuccess);
        ASSERT_EQ(cudaMemcpy(gotBack.data(), dOut + offset * size, gotBack.size(),
                             cudaMemcpyDeviceToHost),
                  cudaSuccess);
        (void)cudaFree(dIn);
        (void)cudaFree(dEnc);
        (void)cudaFree(dOut);
        std::size_t firstBad = got.size();
        for (std::size_t i = 0; i < got.size() && firstBad == got.size(); ++i)
          if (got[i] != want[i]) firstBad = i;
        EXPECT_EQ(firstBad, got.size())
            << scheme << " " << name(type) << " offset " << offset << ": encoded byte " << firstBad
            << " differs (elements end at " << count << ")";
        EXPECT_EQ(std::memcmp(gotBack.data(), wantBack.data(), gotBack.size()), 0)
            << scheme << " " << name(type) << " offset " << offset << ": decoded values differ";
      }
    }
  }
}

}  // namespace
}  // namespace weft::fused::fp8
