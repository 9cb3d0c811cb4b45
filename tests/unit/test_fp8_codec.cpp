// The block-scaled fp8 codecs against a scalar reference: each element is the nearest fp8 value
// (ties to even, brute force over the 256 codes) of its value over the block's scale; the scale
// leaves no finite element saturated; decoding stays within the stated bound for normal,
// subnormal, zero, equal and outlier blocks; a block with NaN or an infinity decodes to NaN; every
// bf16 value and every code as exec's scalar conversions give them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "fused/fp8/codec.hpp"
#include "src/exec/numeric.hpp"

namespace weft::fused::fp8 {
namespace {

const Codec kCodecs[] = {*Codec::parse("e4m3:32"), *Codec::parse("e5m2:32"),
                         *Codec::parse("e4m3:128"), *Codec::parse("e5m2:128")};
const DataType kTypes[] = {DataType::f32, DataType::bf16, DataType::f16};

float element(const Codec& c, std::uint8_t q) {
  return c.element == Element::e4m3 ? exec::e4m3ToFloat(q) : exec::e5m2ToFloat(q);
}

// The nearest finite code to y, ties to the even code, beyond the largest finite value that one.
std::uint8_t nearestCode(const Codec& c, double y) {
  const std::uint8_t sign = std::signbit(y) ? 0x80 : 0x00;
  const double m = std::fabs(y);
  int best = 0;
  double bestDistance = std::numeric_limits<double>::infinity();
  for (int code = 0; code < 0x80; ++code) {
    const float v = element(c, static_cast<std::uint8_t>(code));
    if (!std::isfinite(v)) continue;
    const double d = std::fabs(static_cast<double>(v) - m);
    if (d < bestDistance || (d == bestDistance && (code & 1) == 0)) {
      best = code;
      bestDistance = d;
    }
  }
  return static_cast<std::uint8_t>(best | sign);
}

// Values as `type` holds them (each exact in it), and as floats.
struct Input {
  std::vector<std::uint8_t> bytes;
  std::vector<float> values;
};

Input make(DataType type, const std::vector<float>& wanted) {
  Input in;
  const std::size_t size = type == DataType::f32 ? 4 : 2;
  in.bytes.resize(wanted.size() * size);
  for (std::size_t i = 0; i < wanted.size(); ++i) {
    float v = wanted[i];
    if (type == DataType::f32) {
      std::memcpy(in.bytes.data() + 4 * i, &v, 4);
    } else {
      const std::uint16_t h = type == DataType::f16 ? exec::floatToHalf(v) : exec::floatToBf16(v);
      std::memcpy(in.bytes.data() + 2 * i, &h, 2);
      v = type == DataType::f16 ? exec::halfToFloat(h) : exec::bf16ToFloat(h);
    }
    in.values.push_back(v);
  }
  return in;
}

float loadOut(DataType type, const std::vector<std::uint8_t>& out, std::size_t i) {
  if (type == DataType::f32) {
    float v;
    std::memcpy(&v, out.data() + 4 * i, 4);
    return v;
  }
  std::uint16_t h;
  std::memcpy(&h, out.data() + 2 * i, 2);
  return type == DataType::f16 ? exec::halfToFloat(h) : exec::bf16ToFloat(h);
}

// Encodes and decodes `wanted` as `type`, checking every element against the reference and the
// bound; returns the decoded values.
std::vector<float> roundTrip(const Codec& c, DataType type, const std::vector<float>& wanted) {
  const Input in = make(type, wanted);
  const std::size_t n = in.values.size();
  std::vector<std::byte> encoded(c.encodedBytes(n));
  EXPECT_TRUE(encode(c, type, in.bytes.data(), n, encoded.data()).isOk());
  std::vector<std::uint8_t> out(in.bytes.size(), 0xA5);  // poisoned
  EXPECT_TRUE(decode(c, type, encoded.data(), n, out.data()).isOk());
  std::vector<float> got(n);
  for (std::size_t i = 0; i < n; ++i) {
    got[i] = loadOut(type, out, i);
    const std::size_t b = i / c.block;
    const float scale = scaleOf(c, encoded.data(), n, b);
    if (std::isnan(scale)) {
      EXPECT_TRUE(std::isnan(got[i])) << c.name() << " element " << i << " of a non-finite block";
      continue;
    }
    const double x = in.values[i];
    const auto q = static_cast<std::uint8_t>(encoded[i]);
    // The scale saturates nothing: the block's largest magnitude fits the element format.
    // (f32 scales: as the codec multiplies by the reciprocal, in float, or divides where the
    // reciprocal overflows.)
    EXPECT_LE(std::fabs(static_cast<float>(x) / scale), c.maxFinite())
        << c.name() << " element " << i;
    const double y = c.scale == ScaleKind::e8m0 ? std::ldexp(x, -std::ilogb(scale))
                     : std::isinf(1.0f / scale)
                         ? static_cast<double>(static_cast<float>(x) / scale)
                         : static_cast<double>(static_cast<float>(x) * (1.0f / scale));
    EXPECT_EQ(q, nearestCode(c, y)) << c.name() << " element " << i << ": " << x << " / " << scale;
    // The decoded value: within the codec's bound, plus the output type's own rounding.
    const double outUlp = type == DataType::f32    ? 0x1p-24
                          : type == DataType::bf16 ? 0x1p-8
                                                   : 0x1p-11;
    const double bound = c.errorBound(x, scale) * (1 + 1e-6) + std::fabs(got[i]) * outUlp +
                         (type == DataType::f16 ? 0x1p-25 : 0.0);  // f16's own subnormal step
    EXPECT_LE(std::fabs(got[i] - x), bound)
        << c.name() << " " << name(type) << " element " << i << ": " << x << " -> " << got[i];
  }
  return got;
}

TEST(Fp8Codec, ParsesTheSchemesAndRefusesOthers) {
  EXPECT_EQ(Codec::parse("e4m3:32")->scale, ScaleKind::e8m0);
  EXPECT_EQ(Codec::parse("fp8e5m2:128")->scale, ScaleKind::f32);
  EXPECT_EQ(Codec::parse("e5m2:128")->name(), "e5m2:128");
  for (const char* bad : {"e4m3", "e4m3:64", "int8:32", "e4m3:", ""}) {
    auto c = Codec::parse(bad);
    ASSERT_FALSE(c.isOk()) << bad;
    EXPECT_EQ(c.status().code(), Code::invalidArgument);
  }
  EXPECT_EQ(Codec::parse("e4m3:32")->encodedBytes(70), 70u + 3u);
  EXPECT_EQ(Codec::parse("e4m3:128")->encodedBytes(256), 256u + 8u);
}

TEST(Fp8Codec, RandomBlocksOfEveryMagnitude) {
  std::mt19937 rng(42);
  std::normal_distribution<float> normal(0, 1);
  std::uniform_int_distribution<int> exponent(-20, 20);
  for (const Codec& c : kCodecs) {
    for (DataType t : kTypes) {
      std::vector<float> v;
      for (int b = 0; b < 40; ++b) {
        const float magnitude =
            std::ldexp(1.0f, t == DataType::f16 ? exponent(rng) / 3 : exponent(rng));
        for (int i = 0; i < c.block; ++i) v.push_back(normal(rng) * magnitude);
      }
      for (int i = 0; i < 7; ++i) v.push_back(normal(rng));  // a partial last block
      roundTrip(c, t, v);
    }
  }
}

TEST(Fp8Codec, ZerosEqualValuesOutliersAndSubnormals) {
  for (const Codec& c : kCodecs) {
    for (DataType t : kTypes) {
      // All zeros, signs kept.
      std::vector<float> zeros(c.block, 0.0f);
      zeros[1] = -0.0f;
      const auto z = roundTrip(c, t, zeros);
      EXPECT_EQ(z[0], 0.0f);
      EXPECT_TRUE(std::signbit(z[1]));
      // All equal: exact where the value is a power of two times an element.
      const auto e = roundTrip(c, t, std::vector<float>(c.block, 1.0f));
      for (float x : e) EXPECT_NEAR(x, 1.0f, 1e-6) << c.name();
      // One huge value: it keeps its relative precision, the others are bounded by its scale.
      std::vector<float> outlier(c.block, 0.001f);
      outlier[3] = t == DataType::f16 ? 60000.0f : 1e30f;
      outlier[5] = -0.5f;
      const auto o = roundTrip(c, t, outlier);
      EXPECT_NEAR(o[3] / outlier[3], 1.0, std::ldexp(1.0, -c.mantissaBits() - 1));
      // Subnormal inputs (f32's and bf16's; f16's own).
      std::vector<float> tiny(c.block);
      for (int i = 0; i < c.block; ++i)
        tiny[static_cast<std::size_t>(i)] =
            t == DataType::f16 ? std::ldexp(1.0f + i, -24) : std::ldexp(1.0f + i, -140);
      roundTrip(c, t, tiny);
    }
  }
}

TEST(Fp8Codec, ABlockWithNanOrInfinityDecodesToNanAndOnlyThatBlock) {
  for (const Codec& c : kCodecs) {
    for (DataType t : kTypes) {
      for (float bad :
           {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
            -std::numeric_limits<float>::infinity()}) {
        std::vector<float> v(3 * static_cast<std::size_t>(c.block), 1.5f);
        v[static_cast<std::size_t>(c.block) + 7] = bad;
        const auto got = roundTrip(c, t, v);
        for (std::size_t i = 0; i < got.size(); ++i) {
          const bool inBad = i / c.block == 1;
          EXPECT_EQ(std::isnan(got[i]), inBad) << c.name() << " element " << i;
        }
      }
    }
  }
}

// Every bf16 value the element format holds without scaling, in blocks whose largest value is
// the format's largest (so E8M0's scale is 1): each element is exec's rounding of it, and each
// of the 256 codes decodes to exec's value, bit for bit (the vectorized loops against the
// scalar conversions).
TEST(Fp8Codec, EveryBf16ValueAndEveryCodeAsTheScalarConversions) {
  for (const Codec& c : {*Codec::parse("e4m3:32"), *Codec::parse("e5m2:32")}) {
    const bool e4m3 = c.element == Element::e4m3;
    std::vector<std::uint16_t> values;
    for (std::uint32_t b = 0; b < 0x10000; ++b) {
      const float v = exec::bf16ToFloat(static_cast<std::uint16_t>(b));
      if (std::isfinite(v) && std::fabs(v) <= c.maxFinite())
        values.push_back(static_cast<std::uint16_t>(b));
    }
    std::vector<std::uint16_t> in;
    for (std::size_t i = 0; i < values.size(); ++i) {
      if (in.size() % 32 == 0) in.push_back(exec::floatToBf16(c.maxFinite()));
      in.push_back(values[i]);
    }
    while (in.size() % 32 != 0) in.push_back(0);
    std::vector<std::byte> encoded(c.encodedBytes(in.size()));
    ASSERT_TRUE(encode(c, DataType::bf16, in.data(), in.size(), encoded.data()).isOk());
    int bad = 0;
    for (std::size_t i = 0; i < in.size(); ++i) {
      const float v = exec::bf16ToFloat(in[i]);
      const std::uint8_t want = e4m3 ? exec::floatToE4m3(v) : exec::floatToE5m2(v);
      const auto got = static_cast<std::uint8_t>(encoded[i]);
      if (got != want && bad++ < 5)
        ADD_FAILURE() << c.name() << ": " << v << " encoded as " << int(got) << ", not "
                      << int(want);
    }
    std::vector<std::byte> codes(c.encodedBytes(256));
    for (int q = 0; q < 256; ++q) codes[static_cast<std::size_t>(q)] = std::byte(q);
    for (std::size_t b = 0; b < c.blocks(256); ++b) codes[256 + b] = std::byte{127};  // 2^0
    std::vector<float> decoded(256);
    ASSERT_TRUE(decode(c, DataType::f32, codes.data(), 256, decoded.data()).isOk());
    for (int q = 0; q < 256; ++q) {
      const float want = element(c, static_cast<std::uint8_t>(q));
      const float got = decoded[static_cast<std::size_t>(q)];
      if (std::memcmp(&want, &got, 4) != 0 && bad++ < 10)
        ADD_FAILURE() << c.name() << ": code " << q << " decoded as " << got << ", not " << want;
    }
    std::vector<std::uint16_t> narrow(256);
    ASSERT_TRUE(decode(c, DataType::bf16, codes.data(), 256, narrow.data()).isOk());
    for (int q = 0; q < 256; ++q) {
      const std::uint16_t want = exec::floatToBf16(element(c, static_cast<std::uint8_t>(q)));
      if (narrow[static_cast<std::size_t>(q)] != want && bad++ < 10)
        ADD_FAILURE() << c.name() << ": code " << q << " decoded to bf16 "
                      << narrow[static_cast<std::size_t>(q)] << ", not " << want;
    }
    EXPECT_EQ(bad, 0) << c.name();
  }
}

TEST(Fp8Codec, RefusesTypesItCannotCompress) {
  const Codec c = *Codec::parse("e4m3:32");
  std::vector<std::byte> buf(c.encodedBytes(32));
  std::vector<int> ints(32);
  EXPECT_EQ(encode(c, DataType::i32, ints.data(), 32, buf.data()).code(), Code::invalidArgument);
  EXPECT_EQ(decode(c, DataType::f64, buf.data(), 32, ints.data()).code(), Code::invalidArgument);
}

}  // namespace
}  // namespace weft::fused::fp8
