// The compressed collectives on host memory (weftAllReduceEx and friends, compression
// "always"), ranks as threads: each result equals, bit for bit,
// the codec applied as the scheme says (inputs quantized once, f32 sums in rank order, the
// reduced shard quantized once more), is within the documented bound of a double reference,
// is the same on every rank, and marks non-finite blocks NaN; ops and types that cannot be
// compressed are errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "fused/fp8/codec.hpp"
#include "src/exec/numeric.hpp"
#include "tests/runtime/harness.hpp"

namespace weft::fused::fp8 {
namespace {

// Values as `type` holds them, and back (tests/runtime/harness.hpp's element access).
std::vector<std::byte> asType(DataType type, const std::vector<float>& v) {
  std::vector<std::byte> out(v.size() * sizeOf(type));
  for (std::size_t i = 0; i < v.size(); ++i) test::store(out, i, type, v[i]);
  return out;
}

std::vector<float> asFloats(DataType type, const std::vector<std::byte>& b) {
  std::vector<float> out(b.size() / sizeOf(type));
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(test::load(b, i, type));
  return out;
}

// encode then decode (to f32), and each value's scale.
std::vector<float> quantized(const Codec& c, DataType type, const std::vector<std::byte>& in,
                             std::vector<float>* scales = nullptr) {
  const std::size_t n = in.size() / sizeOf(type);
  std::vector<std::byte> enc(c.encodedBytes(n));
  EXPECT_TRUE(encode(c, type, in.data(), n, enc.data()).isOk());
  std::vector<float> out(n);
  EXPECT_TRUE(decode(c, DataType::f32, enc.data(), n, out.data()).isOk());
  if (scales != nullptr) {
    scales->resize(n);
    for (std::size_t i = 0; i < n; ++i) (*scales)[i] = scaleOf(c, enc.data(), n, i / c.block);
  }
  return out;
}

// The Ex calls with `c` always.
weftCompression always(const Codec& c) {
  weftCompression w{};
  EXPECT_EQ(weftCompressionParse((c.name() + ":always").c_str(), &w), weftSuccess);
  return w;
}
weftDataType_t cType(DataType t) {
  return static_cast<weftDataType_t>(t);
}
weftRedOp_t cOp(RedOp op) {
  return static_cast<weftRedOp_t>(op);
}
Status status(weftResult_t r) {
  return r == weftSuccess ? Status{} : Status(static_cast<Code>(r), weftGetLastError());
}
Status compressedAllReduce(weftComm_t comm, const Codec& c, DataType type, RedOp op, const void* in,
                           void* out, std::size_t count) {
  const weftCompression w = always(c);
  return status(weftAllReduceEx(in, out, count, cType(type), cOp(op), comm, nullptr, &w));
}
Status compressedReduceScatter(weftComm_t comm, const Codec& c, DataType type, RedOp op,
                               const void* in, void* out, std::size_t count) {
  const weftCompression w = always(c);
  return status(weftReduceScatterEx(in, out, count, cType(type), cOp(op), comm, nullptr, &w));
}
Status compressedAllGather(weftComm_t comm, const Codec& c, DataType type, const void* in,
                           void* out, std::size_t count) {
  const weftCompression w = always(c);
  return status(weftAllGatherEx(in, out, count, cType(type), comm, nullptr, &w));
}

// A communicator of n thread ranks, body(rank, its handle) on each.
template <typename Body>
void onRanks(int n, Body body) {
  std::vector<weftComm_t> comms(static_cast<std::size_t>(n));
  ASSERT_EQ(weftCommInitAll(comms.data(), n), weftSuccess) << weftGetLastError();
  test::onEveryRank(n, [&](int r) { body(r, comms[static_cast<std::size_t>(r)]); });
  for (weftComm_t c : comms) EXPECT_EQ(weftCommDestroy(c), weftSuccess);
}

class Fp8Collectives : public ::testing::TestWithParam<int> {};

TEST_P(Fp8Collectives, AllReduceIsTheSchemeBitForBitAndWithinTheBound) {
  const int n = GetParam();
  std::mt19937 rng(1234 + n);
  std::normal_distribution<float> normal(0, 1);
  for (const char* name_ : {"e4m3:32", "e5m2:128"}) {
    const Codec c = *Codec::parse(name_);
    for (DataType type : {DataType::f32, DataType::bf16}) {
      for (RedOp op : {RedOp::sum, RedOp::avg}) {
        const std::size_t count =
            1000 + 37 * static_cast<std::size_t>(n);  // shares not whole blocks
        std::vector<std::vector<std::byte>> inputs;
        for (int r = 0; r < n; ++r) {
          std::vector<float> v(count);
          for (std::size_t i = 0; i < count; ++i)
            v[i] = normal(rng) * std::ldexp(1.0f, static_cast<int>(i / 64) % 9 - 4);
          inputs.push_back(asType(type, v));
        }
        // The scheme, emulated: stage 1 per rank's share-sized chunks, f32 sums, stage 2.
        const std::size_t share = (count + n - 1) / n;
        std::vector<float> sums(share * n, 0.0f), firstBound(share * n, 0.0);
        for (int r = 0; r < n; ++r) {
          std::vector<std::byte> padded(share * n * sizeOf(type), std::byte{0});
          std::memcpy(padded.data(), inputs[r].data(), inputs[r].size());
          for (int q = 0; q < n; ++q) {
            std::vector<std::byte> chunk(padded.begin() + q * share * sizeOf(type),
                                         padded.begin() + (q + 1) * share * sizeOf(type));
            std::vector<float> scales;
            const auto got = quantized(c, type, chunk, &scales);
            const auto exact = asFloats(type, chunk);
            for (std::size_t i = 0; i < share; ++i) {
              sums[q * share + i] += got[i];
              firstBound[q * share + i] += static_cast<float>(c.errorBound(exact[i], scales[i]));
            }
          }
        }
        if (op == RedOp::avg)
          for (float& x : sums) x /= static_cast<float>(n);
        std::vector<float> expect(share * n);
        std::vector<float> secondScale(share * n);
        for (int q = 0; q < n; ++q) {
          std::vector<float> part(sums.begin() + q * share, sums.begin() + (q + 1) * share);
          std::vector<float> scales;
          const auto got = quantized(c, DataType::f32, asType(DataType::f32, part), &scales);
          for (std::size_t i = 0; i < share; ++i) {
            expect[q * share + i] = got[i];
            secondScale[q * share + i] = scales[i];
          }
        }
        const auto wantBytes =
            asType(type, std::vector<float>(expect.begin(), expect.begin() + count));

        std::vector<std::vector<std::byte>> outputs(n);
        onRanks(n, [&](int r, weftComm_t comm) {
          outputs[r].assign(count * sizeOf(type), std::byte{0xA5});  // poisoned
          EXPECT_TRUE(
              compressedAllReduce(comm, c, type, op, inputs[r].data(), outputs[r].data(), count)
                  .isOk())
              << weftGetLastError();
        });
        for (int r = 0; r < n; ++r) {
          EXPECT_EQ(outputs[r], wantBytes)
              << c.name() << " " << name(type) << " " << name(op) << " rank " << r << " of " << n;
        }
        // Against a double reference: both stages' bounds, f32 accumulation, the output's rounding.
        const auto got = asFloats(type, outputs[0]);
        for (std::size_t i = 0; i < count; ++i) {
          double ref = 0, mag = 0;
          for (int r = 0; r < n; ++r) {
            const double x = asFloats(type, inputs[r])[i];
            ref += x;
            mag += std::fabs(x);
          }
          double bound = firstBound[i] + c.errorBound(sums[i], secondScale[i]) + mag * n * 0x1p-23;
          if (op == RedOp::avg) {
            ref /= n;
            bound = firstBound[i] / n + c.errorBound(sums[i], secondScale[i]) + mag * 0x1p-22;
          }
          bound += std::fabs(got[i]) * (type == DataType::bf16 ? 0x1p-8 : 0x1p-24);
          ASSERT_LE(std::fabs(got[i] - ref), bound)
              << c.name() << " " << name(type) << " " << name(op) << " element " << i;
        }
      }
    }
  }
}

TEST_P(Fp8Collectives, AllGatherAndReduceScatterAreTheCodecsOnEachShare) {
  const int n = GetParam();
  const Codec c = *Codec::parse("e4m3:32");
  const std::size_t share = 100;  // not a whole number of blocks
  std::mt19937 rng(99 + n);
  std::normal_distribution<float> normal(0, 3);
  std::vector<std::vector<std::byte>> inputs;
  for (int r = 0; r < n; ++r) {
    std::vector<float> v(share * n);
    for (float& x : v) x = normal(rng);
    if (r == n - 1) v[share * (n - 1) + 5] = std::numeric_limits<float>::infinity();
    inputs.push_back(asType(DataType::bf16, v));
  }
  std::vector<std::vector<std::byte>> gathered(n), scattered(n);
  onRanks(n, [&](int r, weftComm_t comm) {
    gathered[r].assign(share * n * 2, std::byte{0xA5});
    scattered[r].assign(share * 2, std::byte{0xA5});
    EXPECT_TRUE(
        compressedAllGather(comm, c, DataType::bf16, inputs[r].data(), gathered[r].data(), share)
            .isOk());
    EXPECT_TRUE(compressedReduceScatter(comm, c, DataType::bf16, RedOp::sum, inputs[r].data(),
                                        scattered[r].data(), share)
                    .isOk());
  });
  for (int r = 0; r < n; ++r) {
    // All-gather: rank q's first `share` values, as the codec gives them back.
    for (int q = 0; q < n; ++q) {
      std::vector<std::byte> chunk(inputs[q].begin(), inputs[q].begin() + share * 2);
      const auto want = quantized(c, DataType::bf16, chunk);
      const auto got = asFloats(DataType::bf16, gathered[r]);
      for (std::size_t i = 0; i < share; ++i) {
        const float w = exec::bf16ToFloat(exec::floatToBf16(want[i]));
        const float g = got[q * share + i];
        ASSERT_TRUE(g == w || (std::isnan(g) && std::isnan(w)))
            << "all-gather rank " << r << " from " << q << " element " << i << ": " << g << " vs "
            << w;
      }
    }
    // Reduce-scatter: the f32 sum of every rank's decoded share r, rounded to bf16 once.
    const auto got = asFloats(DataType::bf16, scattered[r]);
    std::vector<float> sum(share, 0.0f);
    for (int q = 0; q < n; ++q) {
      std::vector<std::byte> chunk(inputs[q].begin() + r * share * 2,
                                   inputs[q].begin() + (r + 1) * share * 2);
      const auto part = quantized(c, DataType::bf16, chunk);
      for (std::size_t i = 0; i < share; ++i) sum[i] += part[i];
    }
    for (std::size_t i = 0; i < share; ++i) {
      const float want = exec::bf16ToFloat(exec::floatToBf16(sum[i]));
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got[i])) << "reduce-scatter rank " << r << " element " << i;
      } else {
        ASSERT_EQ(got[i], want) << "reduce-scatter rank " << r << " element " << i;
      }
    }
    // The infinity's block (rank n-1's share n-1, its first block) is NaN in the reduce-scatter.
    if (r == n - 1) {
      EXPECT_TRUE(std::isnan(got[5]));
    }
  }
}

std::string ranksName(const ::testing::TestParamInfo<int>& p) {
  return std::to_string(p.param) + "ranks";
}
INSTANTIATE_TEST_SUITE_P(Ranks, Fp8Collectives, ::testing::Values(1, 2, 3, 4, 8), ranksName);

TEST(Fp8CollectivesArgs, OpsAndTypesThatCannotBeCompressedAreErrors) {
  onRanks(2, [&](int, weftComm_t comm) {
    const Codec c = *Codec::parse("e4m3:32");
    std::vector<float> in(64, 1.0f), out(64);
    EXPECT_EQ(
        compressedAllReduce(comm, c, DataType::f32, RedOp::max, in.data(), out.data(), 64).code(),
        Code::invalidArgument);
    EXPECT_EQ(
        compressedAllReduce(comm, c, DataType::i32, RedOp::sum, in.data(), out.data(), 64).code(),
        Code::invalidArgument);
    // The communicator is still usable after the refusals.
    EXPECT_TRUE(
        compressedAllReduce(comm, c, DataType::f32, RedOp::sum, in.data(), out.data(), 64).isOk());
    EXPECT_EQ(out[0], 2.0f);
  });
}

}  // namespace
}  // namespace weft::fused::fp8
