// The compressed collectives on host memory (weftAllReduceEx and friends, compression
// "always"), ranks as threads: each result equals, bit for bit,
// the codec applied as the scheme says (inputs quantized once, f32 sums in rank order, the
// reduced shard quantized once more), is within the documented bound of a double reference,
// is the same on every rank, and marks non-finite blocks NaN; ops and types that cannot be
// compressed are errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "fused/fp8/codec.hpp"
#include "src/exec/numeric.hpp"
#include "tests/runtime/fork.hpp"
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

// The all-reduce scheme, emulated with the host codec: stage 1 on each rank's share-sized
// chunks, f32 sums in rank order, stage 2 on each reduced share; and each element's bounds.
struct Scheme {
  std::size_t share = 0;
  std::vector<float> sums, firstBound, secondScale;
  std::vector<std::byte> want;  // the output, as `type`
};
Scheme emulate(int n, const Codec& c, DataType type, RedOp op,
               const std::vector<std::vector<std::byte>>& inputs) {
  const std::size_t count = inputs[0].size() / sizeOf(type);
  Scheme x;
  // Shares of whole blocks (every block of values starts at a multiple of the block).
  const auto block = static_cast<std::size_t>(c.block);
  const std::size_t share = x.share = ((count + n - 1) / n + block - 1) / block * block;
  std::vector<float>& sums = x.sums;
  std::vector<float>& firstBound = x.firstBound;
  sums.assign(share * n, 0.0f);
  firstBound.assign(share * n, 0.0f);
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
    for (float& v : sums) v /= static_cast<float>(n);
  std::vector<float> expect(share * n);
  x.secondScale.assign(share * n, 0.0f);
  for (int q = 0; q < n; ++q) {
    std::vector<float> part(sums.begin() + q * share, sums.begin() + (q + 1) * share);
    std::vector<float> scales;
    const auto got = quantized(c, DataType::f32, asType(DataType::f32, part), &scales);
    for (std::size_t i = 0; i < share; ++i) {
      expect[q * share + i] = got[i];
      x.secondScale[q * share + i] = scales[i];
    }
  }
  x.want = asType(type, std::vector<float>(expect.begin(), expect.begin() + count));
  return x;
}

// Checks weftAllReduceEx(c always) of `inputs` (one per rank, values of `type`) on n thread
// ranks: every rank's output is the scheme, emulated, bit for bit, and within both stages'
// bounds of a double reference (elements whose inputs are not all finite must be NaN).
void checkAllReduce(int n, const Codec& c, DataType type, RedOp op,
                    const std::vector<std::vector<std::byte>>& inputs) {
  const std::size_t count = inputs[0].size() / sizeOf(type);
  const Scheme scheme = emulate(n, c, type, op, inputs);
  const std::size_t share = scheme.share;
  const std::vector<float>& sums = scheme.sums;
  const std::vector<float>& firstBound = scheme.firstBound;
  const std::vector<float>& secondScale = scheme.secondScale;
  const std::vector<std::byte>& wantBytes = scheme.want;

  std::vector<std::vector<std::byte>> outputs(n);
  onRanks(n, [&](int r, weftComm_t comm) {
    outputs[r].assign(count * sizeOf(type), std::byte{0xA5});  // poisoned
    EXPECT_TRUE(
        compressedAllReduce(comm, c, type, op, inputs[r].data(), outputs[r].data(), count).isOk())
        << weftGetLastError();
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(outputs[r], wantBytes)
        << c.name() << " " << name(type) << " " << name(op) << " rank " << r << " of " << n;
  }
  // Against a double reference: both stages' bounds, f32 accumulation, the output's rounding.
  const auto got = asFloats(type, outputs[0]);
  std::vector<std::vector<float>> in;
  for (int r = 0; r < n; ++r) in.push_back(asFloats(type, inputs[r]));
  for (std::size_t i = 0; i < count; ++i) {
    if (std::isnan(got[i])) {
      // Only a block (of its share, in either stage) holding a NaN or an infinity decodes so.
      const std::size_t q = i / share;
      const std::size_t begin = q * share + (i - q * share) / c.block * c.block;
      bool nonFinite = false;
      for (int r = 0; r < n; ++r)
        for (std::size_t j = begin; j < std::min(begin + c.block, count); ++j)
          nonFinite = nonFinite || !std::isfinite(in[r][j]);
      ASSERT_TRUE(nonFinite) << c.name() << " " << name(type) << " element " << i << " is NaN";
      continue;
    }
    double ref = 0, mag = 0;
    for (int r = 0; r < n; ++r) {
      const double x = in[r][i];
      ref += x;
      mag += std::fabs(x);
    }
    double bound = firstBound[i] + c.errorBound(sums[i], secondScale[i]) + mag * n * 0x1p-23;
    if (op == RedOp::avg) {
      ref /= n;
      bound = firstBound[i] / n + c.errorBound(sums[i], secondScale[i]) + mag * 0x1p-22;
    }
    // The output's rounding, and subnormal results' (products and sums below 2^-126).
    // (half a step of the type's subnormals at least: 2^-134 for bf16, 2^-150 for f32).
    const bool bf16 = type == DataType::bf16;
    bound += std::max(std::fabs(got[i]) * (bf16 ? 0x1p-8 : 0x1p-24), bf16 ? 0x1p-134 : 0x1p-150) +
             (n + 2) * 0x1p-149;
    ASSERT_LE(std::fabs(got[i] - ref), bound)
        << c.name() << " " << name(type) << " " << name(op) << " element " << i;
  }
}

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
        checkAllReduce(n, c, type, op, inputs);
      }
    }
  }
}

// Blocks that test the scheme's edges: one huge value among small ones, all equal values,
// subnormals of the input type, zeros, values near the element's largest, and non-finite ones.
TEST_P(Fp8Collectives, AdversarialBlocksStayWithinTheBoundOrBecomeNaN) {
  const int n = GetParam();
  std::mt19937 rng(77 + n);
  std::uniform_real_distribution<float> uniform(-1, 1);
  const std::size_t count = 128 * 12;
  for (const char* name_ : {"e4m3:32", "e5m2:32", "e4m3:128", "e5m2:128"}) {
    const Codec c = *Codec::parse(name_);
    for (DataType type : {DataType::f32, DataType::bf16}) {
      std::vector<std::vector<std::byte>> inputs;
      for (int r = 0; r < n; ++r) {
        std::vector<float> v(count);
        for (std::size_t i = 0; i < count; ++i) {
          const std::size_t kind = (i / 128) % 6, k = i % 128;
          const float u = uniform(rng);
          switch (kind) {
            case 0:  // one huge value per block of 32
              v[i] = k % 32 == 7 ? 3e30f * (r % 2 ? -1.0f : 1.0f) : u * 1e-3f;
              break;
            case 1:  // all equal
              v[i] = 0.3f + 0.01f * static_cast<float>(r);
              break;
            case 2:  // subnormals (of f32; bf16 keeps its own)
              v[i] = u * 1e-39f;
              break;
            case 3:  // zeros
              v[i] = 0.0f;
              break;
            case 4:  // near the largest finite float
              v[i] = u * 1e38f / static_cast<float>(n);
              break;
            default:  // a NaN, an infinity, finite values: the block becomes NaN
              v[i] = k == 3    ? std::numeric_limits<float>::quiet_NaN()
                     : k == 40 ? -std::numeric_limits<float>::infinity()
                               : u;
              break;
          }
        }
        inputs.push_back(asType(type, v));
      }
      checkAllReduce(n, c, type, RedOp::sum, inputs);
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

// In place (all-reduce: one buffer; reduce-scatter: the output at rank r's block of the input;
// all-gather: the input at rank r's block of the output) gives the bits out of place gives.
TEST_P(Fp8Collectives, InPlaceGivesTheSameBitsAsOutOfPlace) {
  const int n = GetParam();
  const Codec c = *Codec::parse("e4m3:32");
  const std::size_t count = 700;  // a rank's block: not whole codec blocks
  std::mt19937 rng(31 + n);
  std::normal_distribution<float> normal(0, 1);
  std::vector<std::vector<std::byte>> inputs;
  for (int r = 0; r < n; ++r) {
    std::vector<float> v(count * n);
    for (float& x : v) x = normal(rng);
    inputs.push_back(asType(DataType::bf16, v));
  }
  const std::size_t block = count * 2;  // bytes of a rank's block
  onRanks(n, [&](int r, weftComm_t comm) {
    const auto R = static_cast<std::size_t>(r);
    const std::vector<std::byte>& in = inputs[R];
    // All-reduce of count * n values.
    std::vector<std::byte> out(in.size(), std::byte{0xA5}), buf = in;
    ASSERT_TRUE(
        compressedAllReduce(comm, c, DataType::bf16, RedOp::sum, in.data(), out.data(), count * n)
            .isOk());
    ASSERT_TRUE(
        compressedAllReduce(comm, c, DataType::bf16, RedOp::sum, buf.data(), buf.data(), count * n)
            .isOk());
    EXPECT_EQ(buf, out) << "all-reduce rank " << r;
    // Reduce-scatter: count values a rank.
    std::vector<std::byte> share(block, std::byte{0xA5});
    buf = in;
    ASSERT_TRUE(
        compressedReduceScatter(comm, c, DataType::bf16, RedOp::sum, in.data(), share.data(), count)
            .isOk());
    ASSERT_TRUE(compressedReduceScatter(comm, c, DataType::bf16, RedOp::sum, buf.data(),
                                        buf.data() + R * block, count)
                    .isOk());
    EXPECT_TRUE(std::equal(share.begin(), share.end(), buf.begin() + R * block))
        << "reduce-scatter rank " << r;
    // All-gather: rank r's first block.
    std::vector<std::byte> all(in.size(), std::byte{0xA5});
    buf.assign(in.size(), std::byte{0xA5});
    std::copy(in.begin(), in.begin() + block, buf.begin() + R * block);
    ASSERT_TRUE(compressedAllGather(comm, c, DataType::bf16, in.data(), all.data(), count).isOk());
    ASSERT_TRUE(
        compressedAllGather(comm, c, DataType::bf16, buf.data() + R * block, buf.data(), count)
            .isOk());
    EXPECT_EQ(buf, all) << "all-gather rank " << r;
  });
}

// Ranks as processes: every process gets the scheme's bits, and leaves no segment behind.
TEST(Fp8CollectivesProcesses, AllReduceAcrossProcessesIsTheScheme) {
  WEFT_SKIP_UNDER_TSAN();
  for (int n : {2, 4}) {
    std::vector<pid_t> pids;
    const std::vector<int> codes = test::forkRanks(
        n,
        [n](int r, Comm& comm) {
          const Codec c = *Codec::parse("e4m3:32");
          std::vector<std::vector<std::byte>> inputs;
          for (int q = 0; q < n; ++q) {
            std::mt19937 rng(500 + q);
            std::normal_distribution<float> normal(0, 2);
            std::vector<float> v(5000);
            for (float& x : v) x = normal(rng);
            inputs.push_back(asType(DataType::bf16, v));
          }
          std::vector<std::byte> out(inputs[0].size(), std::byte{0xA5});
          const Status s =
              compressedAllReduce(comm.handle(), c, DataType::bf16, RedOp::avg,
                                  inputs[static_cast<std::size_t>(r)].data(), out.data(), 5000);
          if (!s) return 2;
          return out == emulate(n, c, DataType::bf16, RedOp::avg, inputs).want ? 0 : 1;
        },
        &pids);
    for (std::size_t r = 0; r < codes.size(); ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
    EXPECT_EQ(test::segmentsOf(pids), 0);
  }
}

TEST(Fp8CollectivesArgs, OpsAndTypesThatCannotBeCompressedAreErrors) {
  onRanks(2, [&](int, weftComm_t comm) {
    const Codec c = *Codec::parse("e4m3:32");
    std::vector<float> in(64, 1.0f), out(64, -7.0f);
    const Status max =
        compressedAllReduce(comm, c, DataType::f32, RedOp::max, in.data(), out.data(), 64);
    EXPECT_EQ(max.code(), Code::invalidArgument);
    EXPECT_NE(max.message().find("max cannot be compressed"), std::string::npos) << max.message();
    const Status i32 =
        compressedAllReduce(comm, c, DataType::i32, RedOp::sum, in.data(), out.data(), 64);
    EXPECT_EQ(i32.code(), Code::invalidArgument);
    EXPECT_NE(i32.message().find("cannot be compressed (bf16, f16 and f32 can)"), std::string::npos)
        << i32.message();
    // Refused calls change nothing.
    EXPECT_EQ(out[0], -7.0f);
    // The communicator is still usable after the refusals.
    EXPECT_TRUE(
        compressedAllReduce(comm, c, DataType::f32, RedOp::sum, in.data(), out.data(), 64).isOk());
    EXPECT_EQ(out[0], 2.0f);
  });
}

TEST(Fp8CollectivesArgs, CompressionsWeftCannotRunAreErrorsThatChangeNothing) {
  onRanks(2, [&](int, weftComm_t comm) {
    std::vector<float> in(64, 1.0f), out(64, -7.0f);
    const weftCompression bad[] = {
        {weftCompressFp8E4M3, weftScaleE8M0, 64, 0},  // E8M0 takes blocks of 32
        {weftCompressFp8E5M2, weftScaleF32, 32, 0},   // f32 scales take 128
        {static_cast<weftCompressFormat_t>(9), weftScaleE8M0, 32, 0},
        {weftCompressFp8E4M3, static_cast<weftScaleKind_t>(5), 32, 0},
        {weftCompressFp8E4M3, weftScaleE8M0, 32, 2}};
    for (const weftCompression& w : bad) {
      EXPECT_EQ(weftAllReduceEx(in.data(), out.data(), 64, weftFloat32, weftSum, comm, nullptr, &w),
                weftInvalidArgument);
      EXPECT_NE(std::string(weftGetLastError()).find("weftAllReduceEx"), std::string::npos);
      EXPECT_EQ(weftCommSetCompression(comm, &w), weftInvalidArgument);
    }
    EXPECT_EQ(out[0], -7.0f);
    weftCompression parsed{};
    for (const char* text : {"e4m3", "fp8e4m3:64", "int8:32", "e4m3:32:sometimes"}) {
      EXPECT_EQ(weftCompressionParse(text, &parsed), weftInvalidArgument) << text;
      EXPECT_NE(std::string(weftGetLastError()).find("fp8e4m3:32"), std::string::npos);
    }
    EXPECT_EQ(weftCompressionParse("fp8e5m2:128:always", &parsed), weftSuccess);
    EXPECT_EQ(parsed.format, weftCompressFp8E5M2);
    EXPECT_EQ(parsed.scale, weftScaleF32);
    EXPECT_EQ(parsed.block, 128);
    EXPECT_EQ(parsed.always, 1);
  });
}

// The communicator's default serves the calls it can and leaves the rest exact; a plan says
// which way a call goes.
TEST(Fp8CollectivesArgs, TheDefaultServesWhatItCanAndThePlanSaysSo) {
  onRanks(2, [&](int r, weftComm_t comm) {
    weftCompression w{};
    ASSERT_EQ(weftCommGetCompression(comm, &w), weftSuccess);
    EXPECT_EQ(w.format, weftCompressNone);
    ASSERT_EQ(weftCompressionParse("fp8e4m3:32:always", &w), weftSuccess);
    ASSERT_EQ(weftCommSetCompression(comm, &w), weftSuccess);
    // 1 + 1/64 is not an e4m3 value: compressed, each rank's becomes 1.
    std::vector<float> in(256, 1.015625f), out(256, 0.0f);
    ASSERT_EQ(
        weftAllReduceEx(in.data(), out.data(), 256, weftFloat32, weftSum, comm, nullptr, nullptr),
        weftSuccess);
    EXPECT_EQ(out[0], 2.0f);
    // int32 and max: the default does not apply; exact.
    std::vector<std::int32_t> a(256, 1000001 + r), b(256);
    ASSERT_EQ(weftAllReduceEx(a.data(), b.data(), 256, weftInt32, weftSum, comm, nullptr, nullptr),
              weftSuccess);
    EXPECT_EQ(b[0], 2000003);
    ASSERT_EQ(
        weftAllReduceEx(in.data(), out.data(), 256, weftFloat32, weftMax, comm, nullptr, nullptr),
        weftSuccess);
    EXPECT_EQ(out[0], 1.015625f);
    // Plain calls never compress.
    ASSERT_EQ(weftAllReduce(in.data(), out.data(), 256, weftFloat32, weftSum, comm, nullptr),
              weftSuccess);
    EXPECT_EQ(out[0], 2.03125f);
    char plan[64] = {};
    ASSERT_EQ(weftCommPlanEx(comm, weftCollAllReduce, 256, weftFloat32, weftHostMemory, nullptr,
                             plan, sizeof plan),
              weftSuccess);
    EXPECT_EQ(std::string(plan), "compressed e4m3:32/simple");
    const weftCompression none{weftCompressNone, weftScaleE8M0, 0, 0};
    ASSERT_EQ(weftCommPlanEx(comm, weftCollAllReduce, 256, weftFloat32, weftHostMemory, &none, plan,
                             sizeof plan),
              weftSuccess);
    EXPECT_EQ(std::string(plan).find("compressed"), std::string::npos) << plan;
    // Without `always` the selector prices it: a few hundred bytes never pay for the codec.
    ASSERT_EQ(weftCompressionParse("fp8e4m3:32", &w), weftSuccess);
    ASSERT_EQ(weftCommPlanEx(comm, weftCollAllReduce, 256, weftFloat32, weftHostMemory, &w, plan,
                             sizeof plan),
              weftSuccess);
    EXPECT_EQ(std::string(plan).find("compressed"), std::string::npos) << plan;
  });
}

// Inside a group, a compressed call runs at the group's end with the others, in call order.
TEST(Fp8CollectivesArgs, CompressedCallsInAGroup) {
  onRanks(3, [&](int, weftComm_t comm) {
    weftCompression w{};
    ASSERT_EQ(weftCompressionParse("e4m3:32:always", &w), weftSuccess);
    std::vector<float> in(300, 1.015625f), out(300, 0.0f), plain(300, 0.0f);
    ASSERT_EQ(weftGroupStart(), weftSuccess);
    ASSERT_EQ(weftAllReduceEx(in.data(), out.data(), 300, weftFloat32, weftSum, comm, nullptr, &w),
              weftSuccess);
    ASSERT_EQ(weftAllReduce(in.data(), plain.data(), 300, weftFloat32, weftSum, comm, nullptr),
              weftSuccess);
    ASSERT_EQ(weftGroupEnd(), weftSuccess) << weftGetLastError();
    EXPECT_EQ(out[299], 3.0f);
    EXPECT_EQ(plain[299], 3.046875f);
  });
}

TEST(Fp8CollectivesArgs, WeftCompressSetsTheDefaultAndABadValueFailsInit) {
  setenv("WEFT_COMPRESS", "fp8e5m2:128", 1);
  {
    onRanks(2, [&](int, weftComm_t comm) {
      weftCompression w{};
      ASSERT_EQ(weftCommGetCompression(comm, &w), weftSuccess);
      EXPECT_EQ(w.format, weftCompressFp8E5M2);
      EXPECT_EQ(w.block, 128);
      EXPECT_EQ(w.always, 0);
    });
  }
  setenv("WEFT_COMPRESS", "fp8e4m3:48", 1);
  std::vector<weftComm_t> comms(2);
  EXPECT_EQ(weftCommInitAll(comms.data(), 2), weftInvalidArgument);
  EXPECT_NE(std::string(weftGetLastError()).find("WEFT_COMPRESS"), std::string::npos);
  unsetenv("WEFT_COMPRESS");
}

}  // namespace
}  // namespace weft::fused::fp8
