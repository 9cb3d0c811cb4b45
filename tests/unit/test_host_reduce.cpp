// The CPU executor's numeric code: narrow-float conversions against an independent reference
// built from the formats' definitions, and reduce()/divide() for every dtype and op.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

#include "src/exec/host_reduce.hpp"
#include "src/exec/host_reduce_isa.hpp"
#include "src/exec/numeric.hpp"
#include "weft/types.hpp"

namespace weft::exec {
namespace {

// The conversions are usable in constant expressions.
static_assert(floatToE4m3(448.0f) == 0x7e && e4m3ToFloat(0x7e) == 448.0f);
static_assert(floatToE5m2(57344.0f) == 0x7b && e5m2ToFloat(0x7b) == 57344.0f);
static_assert(floatToHalf(1.0f) == 0x3c00 && halfToFloat(0x3c00) == 1.0f);
static_assert(floatToBf16(1.0f) == 0x3f80 && bf16ToFloat(0x3f80) == 1.0f);

// ---- an independent reference for the narrow formats ----------------------------------------
// Values come from the definition (significand times a power of two, via ldexp in double), and
// rounding picks the nearer of the two representable neighbours by comparing with their exact
// midpoint, ties to the even encoding.

struct Format {
  const char* name;
  int expBits;
  int manBits;
  bool ieeeSpecials;  // inf and NaN in the all-ones exponent; otherwise only S.1111.111 is NaN
  bool saturate;      // overflow goes to the largest finite value instead of inf
  std::uint32_t (*encode)(float);
  float (*decode)(std::uint32_t);

  int width() const { return expBits + manBits; }
  std::uint32_t signBit() const { return 1u << width(); }
  std::uint32_t patterns() const { return 2u << width(); }
  std::uint32_t magnitude(std::uint32_t e) const { return e & (signBit() - 1); }
  std::uint32_t field(std::uint32_t e) const { return magnitude(e) >> manBits; }
  std::uint32_t mantissa(std::uint32_t e) const { return e & ((1u << manBits) - 1); }
  std::uint32_t maxField() const { return (1u << expBits) - 1; }
  bool isNan(std::uint32_t e) const {
    return ieeeSpecials ? field(e) == maxField() && mantissa(e) != 0
                        : magnitude(e) == signBit() - 1;
  }
  bool isInf(std::uint32_t e) const {
    return ieeeSpecials && field(e) == maxField() && mantissa(e) == 0;
  }
  // Finite encodings only.
  double value(std::uint32_t e) const {
    const int bias = (1 << (expBits - 1)) - 1;
    const double m = mantissa(e);
    const double v = field(e) == 0 ? std::ldexp(m, 1 - bias - manBits)
                                   : std::ldexp(m + (1 << manBits), int(field(e)) - bias - manBits);
    return (e & signBit()) ? -v : v;
  }
  std::uint32_t maxFinite() const {
    std::uint32_t e = signBit() - 1;
    while (isNan(e) || isInf(e)) --e;
    return e;
  }

  // Nearest-even encoding of a non-NaN value.
  std::uint32_t roundToNearestEven(double x) const {
    const std::uint32_t sign = std::signbit(x) ? signBit() : 0;
    double a = std::fabs(x);
    const std::uint32_t maxE = maxFinite();
    if (saturate) a = std::min(a, value(maxE));
    // Candidates in increasing order; past the largest finite value comes the value the next
    // binade would start with, which IEEE rounding turns into inf.
    std::uint32_t lo = 0;
    std::uint32_t hi = maxE;
    if (a >= value(maxE)) {
      if (a == value(maxE)) return sign | maxE;
      const double next = std::ldexp(1.0, std::ilogb(value(maxE)) + 1);
      const double mid = (value(maxE) + next) / 2;
      return sign | (a < mid ? maxE : maxE + 1);  // maxE is odd, so a tie goes up as well
    }
    while (hi - lo > 1) {  // invariant: value(lo) <= a < value(hi)
      const std::uint32_t m = (lo + hi) / 2;
      (value(m) <= a ? lo : hi) = m;
    }
    if (a == value(lo)) return sign | lo;
    const double mid = (value(lo) + value(hi)) / 2;  // exact: one bit more than the format
    if (a < mid) return sign | lo;
    if (a > mid) return sign | hi;
    return sign | ((lo & 1) == 0 ? lo : hi);
  }
};

template <auto Encode>
std::uint32_t encodeWith(float f) {
  return Encode(f);
}
template <typename S, float (*Decode)(S)>
float decodeWith(std::uint32_t e) {
  return Decode(static_cast<S>(e));
}

const Format kHalfFormat{
    "f16", 5, 10, true, false, encodeWith<floatToHalf>, decodeWith<std::uint16_t, halfToFloat>};
const Format kBf16Format{
    "bf16", 8, 7, true, false, encodeWith<floatToBf16>, decodeWith<std::uint16_t, bf16ToFloat>};
const Format kE4m3Format{
    "e4m3", 4, 3, false, true, encodeWith<floatToE4m3>, decodeWith<std::uint8_t, e4m3ToFloat>};
const Format kE5m2Format{
    "e5m2", 5, 2, true, true, encodeWith<floatToE5m2>, decodeWith<std::uint8_t, e5m2ToFloat>};
const Format* const kFormats[] = {&kHalfFormat, &kBf16Format, &kE4m3Format, &kE5m2Format};

std::uint32_t bitsOf(float f) {
  return std::bit_cast<std::uint32_t>(f);
}

// Every pattern decodes to its defined value and encodes back to itself; NaNs stay NaN, and
// E5M2's infinities saturate.
void expectRoundTrip(const Format& fmt) {
  for (std::uint32_t e = 0; e < fmt.patterns(); ++e) {
    const float f = fmt.decode(e);
    if (fmt.isNan(e)) {
      ASSERT_TRUE(std::isnan(f)) << fmt.name << " " << e;
      ASSERT_TRUE(fmt.isNan(fmt.encode(f))) << fmt.name << " " << e;
      continue;
    }
    if (fmt.isInf(e)) {
      ASSERT_TRUE(std::isinf(f) && std::signbit(f) == bool(e & fmt.signBit())) << fmt.name << e;
      // E5M2 decodes inf, but the satfinite conversion back gives the largest finite value.
      const std::uint32_t back = fmt.saturate ? (e & fmt.signBit()) | fmt.maxFinite() : e;
      ASSERT_EQ(fmt.encode(f), back) << fmt.name << " " << e;
      continue;
    } else {
      ASSERT_EQ(double(f), fmt.value(e)) << fmt.name << " " << e;
      ASSERT_EQ(std::signbit(f), bool(e & fmt.signBit())) << fmt.name << " " << e;
    }
    ASSERT_EQ(fmt.encode(f), e) << fmt.name << " " << e;
  }
}

// Random floats: all bit patterns; values spread over the format's exponent range and a little
// beyond; and every midpoint between neighbours with the floats just beside it.
void expectRoundsLikeReference(const Format& fmt, std::size_t samples) {
  std::mt19937 rng(7 + fmt.width());
  const int bias = (1 << (fmt.expBits - 1)) - 1;
  const int lowField = std::max(0, 127 - bias - fmt.manBits - 3);
  const int highField = std::min(254, 127 + bias + 3);
  std::uniform_int_distribution<int> fieldDist(lowField, highField);
  std::vector<float> inputs;
  for (std::size_t i = 0; i < samples; ++i) {
    const std::uint32_t r = rng();
    inputs.push_back(std::bit_cast<float>(r));
    const auto field = static_cast<std::uint32_t>(fieldDist(rng));
    inputs.push_back(std::bit_cast<float>((r & 0x807fffffu) | (field << 23)));
  }
  for (std::uint32_t e = 0; e < fmt.maxFinite(); ++e) {
    const float mid = static_cast<float>((fmt.value(e) + fmt.value(e + 1)) / 2);
    for (float f : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e30f)}) {
      inputs.push_back(f);
      inputs.push_back(-f);
    }
  }
  for (float f : inputs) {
    const std::uint32_t got = fmt.encode(f);
    if (std::isnan(f)) {
      ASSERT_TRUE(fmt.isNan(got)) << fmt.name << " " << std::hex << bitsOf(f);
      continue;
    }
    ASSERT_EQ(got, fmt.roundToNearestEven(f)) << fmt.name << " " << std::hexfloat << f;
  }
}

TEST(HostNumeric, EveryPatternRoundTrips) {
  for (const Format* fmt : kFormats) expectRoundTrip(*fmt);
}

TEST(HostNumeric, HalfAndBf16RoundRandomFloatsLikeTheReference) {
  expectRoundsLikeReference(kHalfFormat, 400000);
  expectRoundsLikeReference(kBf16Format, 400000);
}

TEST(HostNumeric, Fp8RoundRandomFloatsLikeTheReference) {
  expectRoundsLikeReference(kE4m3Format, 200000);
  expectRoundsLikeReference(kE5m2Format, 200000);
}

TEST(HostNumeric, NanBecomesTheCanonicalQuietNan) {
  // What CUDA's conversions produce: positive, all mantissa bits set, whatever the input.
  for (std::uint32_t bits : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff812345u}) {
    const float nan = std::bit_cast<float>(bits);
    EXPECT_EQ(floatToHalf(nan), 0x7fff);
    EXPECT_EQ(floatToBf16(nan), 0x7fff);
    EXPECT_EQ(floatToE4m3(nan), 0x7f);
    EXPECT_EQ(floatToE5m2(nan), 0x7f);
  }
  EXPECT_TRUE(std::isnan(e4m3ToFloat(0xff)));
  EXPECT_TRUE(std::isnan(e5m2ToFloat(0xfd)));
  EXPECT_TRUE(std::isnan(halfToFloat(0x7c01)));  // signalling in f16, quiet once widened
  EXPECT_TRUE(std::isnan(bf16ToFloat(0xff81)));
}

TEST(HostNumeric, HalfAndBf16HandChecked) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(floatToHalf(1.0f + 0x1p-11f), 0x3c00);  // tie, to even
  EXPECT_EQ(floatToHalf(1.0f + 0x3p-11f), 0x3c02);  // tie, to even (up)
  EXPECT_EQ(floatToHalf(65504.0f), 0x7bff);         // largest finite
  EXPECT_EQ(floatToHalf(65519.0f), 0x7bff);         // below the midpoint to 2^16
  EXPECT_EQ(floatToHalf(65520.0f), 0x7c00);         // the midpoint overflows to inf
  EXPECT_EQ(floatToHalf(-inf), 0xfc00);
  EXPECT_EQ(floatToHalf(0x1p-24f), 0x0001);      // smallest subnormal
  EXPECT_EQ(floatToHalf(0x1p-25f), 0x0000);      // half of it: tie to zero
  EXPECT_EQ(floatToHalf(-0x1.8p-24f), 0x8002);   // 1.5 units: tie to 2
  EXPECT_EQ(floatToHalf(0x1.ffcp-15f), 0x0400);  // tie past the largest subnormal
  EXPECT_EQ(halfToFloat(0x03ff), 0x1.ff8p-15f);  // largest subnormal
  EXPECT_EQ(floatToBf16(1.0f + 0x1p-8f), 0x3f80);
  EXPECT_EQ(floatToBf16(1.0f + 0x3p-8f), 0x3f82);
  EXPECT_EQ(floatToBf16(std::numeric_limits<float>::max()), 0x7f80);  // overflows to inf
  EXPECT_EQ(floatToBf16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(floatToBf16(0x1p-133f), 0x0001);  // bf16's smallest subnormal
  EXPECT_EQ(bf16ToFloat(0x0001), 0x1p-133f);
}

TEST(HostNumeric, Fp8SaturatesLikeSatfinite) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(floatToE4m3(1e6f), 0x7e);
  EXPECT_EQ(floatToE4m3(-1e6f), 0xfe);
  EXPECT_EQ(floatToE4m3(inf), 0x7e);
  EXPECT_EQ(floatToE4m3(-inf), 0xfe);
  EXPECT_EQ(floatToE4m3(464.0f), 0x7e);  // the midpoint to the (absent) 480
  EXPECT_EQ(floatToE4m3(470.0f), 0x7e);
  EXPECT_EQ(e4m3ToFloat(0x7e), 448.0f);
  EXPECT_EQ(e4m3ToFloat(0xfe), -448.0f);
  EXPECT_EQ(floatToE5m2(1e6f), 0x7b);
  EXPECT_EQ(floatToE5m2(-1e6f), 0xfb);
  EXPECT_EQ(floatToE5m2(inf), 0x7b);
  EXPECT_EQ(floatToE5m2(-inf), 0xfb);
  EXPECT_EQ(floatToE5m2(61440.0f), 0x7b);  // the midpoint to 65536
  EXPECT_EQ(e5m2ToFloat(0x7b), 57344.0f);
  EXPECT_TRUE(std::isinf(e5m2ToFloat(0x7c)));  // E5M2 still decodes inf
  EXPECT_TRUE(std::isnan(e4m3ToFloat(floatToE4m3(std::nanf("")))));
  EXPECT_TRUE(std::isnan(e5m2ToFloat(floatToE5m2(std::nanf("")))));
}

TEST(HostNumeric, Fp8HandCheckedRoundingAndSubnormals) {
  EXPECT_EQ(floatToE4m3(1.0f), 0x38);
  EXPECT_EQ(floatToE4m3(1.0625f), 0x38);      // tie between 1 and 1.125: even
  EXPECT_EQ(floatToE4m3(1.1875f), 0x3a);      // tie between 1.125 and 1.25: even
  EXPECT_EQ(floatToE4m3(1.07f), 0x39);        // above the tie
  EXPECT_EQ(floatToE4m3(0x1p-9f), 0x01);      // smallest subnormal
  EXPECT_EQ(floatToE4m3(0x1p-10f), 0x00);     // half of it: tie to zero
  EXPECT_EQ(floatToE4m3(-0x1p-10f), 0x80);    // keeps the sign
  EXPECT_EQ(floatToE4m3(0x1.01p-10f), 0x01);  // just above half
  EXPECT_EQ(floatToE4m3(0x3p-10f), 0x02);     // 1.5 units: tie to 2
  EXPECT_EQ(floatToE4m3(0x7p-9f), 0x07);      // largest subnormal
  EXPECT_EQ(floatToE4m3(0xfp-10f), 0x08);     // 7.5 units: tie to the smallest normal
  EXPECT_EQ(e4m3ToFloat(0x05), 0x5p-9f);
  EXPECT_EQ(floatToE5m2(1.0f), 0x3c);
  EXPECT_EQ(floatToE5m2(1.125f), 0x3c);    // tie between 1 and 1.25: even
  EXPECT_EQ(floatToE5m2(1.375f), 0x3e);    // tie between 1.25 and 1.5: even
  EXPECT_EQ(floatToE5m2(0x1p-16f), 0x01);  // smallest subnormal
  EXPECT_EQ(floatToE5m2(0x1p-17f), 0x00);
  EXPECT_EQ(floatToE5m2(0x3p-17f), 0x02);
  EXPECT_EQ(e5m2ToFloat(0x03), 0x3p-16f);
}

// ---- reduce() and divide() --------------------------------------------------------------------

RedOp elementOp(RedOp op) {
  return op == RedOp::avg ? RedOp::sum : op;
}

// The GPU kernel's comparisons, which decide what happens to NaN.
template <typename C>
C referenceOp(C x, C y, RedOp op) {
  switch (elementOp(op)) {
    case RedOp::sum:
      return x + y;
    case RedOp::prod:
      return x * y;
    case RedOp::min:
      return y < x ? y : x;
    case RedOp::max:
      return x < y ? y : x;
    default:
      return C{};
  }
}

// Per dtype: a random operand and the reference result of one element.
template <typename S>
struct IntCase {
  static S random(std::mt19937_64& rng) { return static_cast<S>(rng()); }
  static S reference(S x, S y, RedOp op) {
    // Wraparound modulo 2^64 then truncation is wraparound modulo 2^bits.
    const auto ux = static_cast<std::uint64_t>(x), uy = static_cast<std::uint64_t>(y);
    switch (elementOp(op)) {
      case RedOp::sum:
        return static_cast<S>(ux + uy);
      case RedOp::prod:
        return static_cast<S>(ux * uy);
      default:
        return referenceOp(x, y, op);
    }
  }
};

struct F64Case {
  static double random(std::mt19937_64& rng) {
    return std::ldexp(std::uniform_real_distribution<double>(-1, 1)(rng),
                      std::uniform_int_distribution<int>(-300, 300)(rng));
  }
  static double reference(double x, double y, RedOp op) { return referenceOp(x, y, op); }
};

// f32 and the narrow floats: exact in double, then one rounding to float (rounding twice through
// double is harmless: 53 >= 2 * 24 + 2), then the narrow types round to their format.
struct F32Case {
  static float random(std::mt19937_64& rng) {
    // Exponent fields 0..187: subnormals through 2^60, so products stay finite.
    const auto field = static_cast<std::uint32_t>(rng() % 188);
    return std::bit_cast<float>((static_cast<std::uint32_t>(rng()) & 0x807fffffu) | (field << 23));
  }
  static float reference(float x, float y, RedOp op) {
    return static_cast<float>(referenceOp(double(x), double(y), op));
  }
};

template <const Format& F, typename S, int kMaxMagnitude>
struct NarrowCase {
  // Any finite pattern up to kMaxMagnitude, so products stay finite and subnormals appear.
  static S random(std::mt19937_64& rng) {
    for (;;) {
      const auto e = static_cast<std::uint32_t>(rng() % F.patterns());
      if (!F.isNan(e) && !F.isInf(e) && std::fabs(F.value(e)) <= kMaxMagnitude) {
        return static_cast<S>(e);
      }
    }
  }
  static S reference(S x, S y, RedOp op) {
    const float r = static_cast<float>(referenceOp(double(F.decode(x)), double(F.decode(y)), op));
    return static_cast<S>(F.encode(r));
  }
};

template <typename S>
::testing::AssertionResult sameBits(const std::vector<S>& got, const std::vector<S>& want) {
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(S)) != 0) {
      return ::testing::AssertionFailure() << "element " << i << " of " << want.size() << ": got "
                                           << +got[i] << ", want " << +want[i];
    }
  }
  return ::testing::AssertionSuccess();
}

template <typename Case>
void expectReduceMatches(DataType type) {
  using S = decltype(Case::random(std::declval<std::mt19937_64&>()));
  std::mt19937_64 rng(99 + static_cast<int>(type));
  for (RedOp op : kAllRedOps) {
    for (std::size_t count : {0, 1, 7, 1023}) {
      SCOPED_TRACE(::testing::Message() << name(type) << " " << name(op) << " count " << count);
      std::vector<S> a(count), b(count), want(count);
      for (auto& x : a) x = Case::random(rng);
      for (auto& x : b) x = Case::random(rng);
      for (std::size_t i = 0; i < count; ++i) want[i] = Case::reference(a[i], b[i], op);

      std::vector<S> out(count);
      reduce(out.data(), a.data(), b.data(), count, type, op);
      EXPECT_TRUE(sameBits(out, want)) << "out of place";
      std::vector<S> inA = a;
      reduce(inA.data(), inA.data(), b.data(), count, type, op);
      EXPECT_TRUE(sameBits(inA, want)) << "dst == a";
      std::vector<S> inB = b;
      reduce(inB.data(), a.data(), inB.data(), count, type, op);
      EXPECT_TRUE(sameBits(inB, want)) << "dst == b";
    }
  }
}

TEST(HostReduce, EveryDtypeAndOpMatchesTheReference) {
  expectReduceMatches<F64Case>(DataType::f64);
  expectReduceMatches<F32Case>(DataType::f32);
  expectReduceMatches<NarrowCase<kHalfFormat, std::uint16_t, 200>>(DataType::f16);
  expectReduceMatches<NarrowCase<kBf16Format, std::uint16_t, 1000000000>>(DataType::bf16);
  expectReduceMatches<NarrowCase<kE4m3Format, std::uint8_t, 16>>(DataType::f8e4m3);
  expectReduceMatches<NarrowCase<kE5m2Format, std::uint8_t, 200>>(DataType::f8e5m2);
  expectReduceMatches<IntCase<std::int8_t>>(DataType::i8);
  expectReduceMatches<IntCase<std::uint8_t>>(DataType::u8);
  expectReduceMatches<IntCase<std::int32_t>>(DataType::i32);
  expectReduceMatches<IntCase<std::uint32_t>>(DataType::u32);
  expectReduceMatches<IntCase<std::int64_t>>(DataType::i64);
  expectReduceMatches<IntCase<std::uint64_t>>(DataType::u64);
}

TEST(HostReduce, Fp8EveryPairOfPatterns) {
  for (const Format* fmt : {&kE4m3Format, &kE5m2Format}) {
    const DataType type = fmt == &kE4m3Format ? DataType::f8e4m3 : DataType::f8e5m2;
    std::vector<std::uint8_t> a, b;
    for (std::uint32_t x = 0; x < 256; ++x) {
      for (std::uint32_t y = 0; y < 256; ++y) {
        a.push_back(static_cast<std::uint8_t>(x));
        b.push_back(static_cast<std::uint8_t>(y));
      }
    }
    for (RedOp op : {RedOp::sum, RedOp::prod, RedOp::min, RedOp::max}) {
      std::vector<std::uint8_t> out(a.size()), want(a.size());
      for (std::size_t i = 0; i < a.size(); ++i) {
        const float r = referenceOp(fmt->decode(a[i]), fmt->decode(b[i]), op);
        want[i] = static_cast<std::uint8_t>(fmt->encode(r));
      }
      reduce(out.data(), a.data(), b.data(), a.size(), type, op);
      EXPECT_TRUE(sameBits(out, want)) << fmt->name << " " << name(op);
    }
  }
}

TEST(HostReduce, MinMaxTreatNanLikeTheGpuKernel) {
  // A NaN in a survives, one in b loses: the comparison is false and the kernel keeps a.
  const float nan = std::bit_cast<float>(0x7fc01234u);
  std::vector<float> a = {nan, 1.0f, nan}, b = {1.0f, nan, nan}, out(3);
  for (RedOp op : {RedOp::min, RedOp::max}) {
    reduce(out.data(), a.data(), b.data(), 3, DataType::f32, op);
    EXPECT_EQ(bitsOf(out[0]), 0x7fc01234u) << name(op);
    EXPECT_EQ(out[1], 1.0f) << name(op);
    EXPECT_EQ(bitsOf(out[2]), 0x7fc01234u) << name(op);
  }
  // Narrow types round the kept NaN through float: the canonical NaN.
  std::vector<std::uint16_t> ha = {0xfe01, 0x3c00}, hb = {0x3c00, 0x7c01}, hout(2);
  reduce(hout.data(), ha.data(), hb.data(), 2, DataType::f16, RedOp::min);
  EXPECT_EQ(hout[0], 0x7fff);
  EXPECT_EQ(hout[1], 0x3c00);
  // Signed zeros: neither compares smaller, so a is kept.
  std::vector<float> za = {0.0f, -0.0f}, zb = {-0.0f, 0.0f}, zout(2);
  reduce(zout.data(), za.data(), zb.data(), 2, DataType::f32, RedOp::min);
  EXPECT_FALSE(std::signbit(zout[0]));
  EXPECT_TRUE(std::signbit(zout[1]));
}

TEST(HostReduce, Fp32ArithmeticGivesTheGpusCanonicalNan) {
  // Seen on an H200: fp32 add and multiply return 0x7fffffff for any NaN result, whatever the
  // operands' payloads. Long enough to run through the blocked (vectorized) loop and the tail.
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::bit_cast<float>(0xffc01234u);
  std::vector<float> a, b;
  for (int i = 0; i < 21; ++i) {
    a.insert(a.end(), {nan, inf, 0.0f, 2.0f});
    b.insert(b.end(), {1.0f, -inf, inf, nan});
  }
  std::vector<float> out(a.size());
  reduce(out.data(), a.data(), b.data(), a.size(), DataType::f32, RedOp::sum);
  for (std::size_t i = 0; i < out.size(); ++i) {
    EXPECT_EQ(bitsOf(out[i]), i % 4 == 2 ? bitsOf(inf) : 0x7fffffffu) << i;
  }
  reduce(out.data(), a.data(), b.data(), a.size(), DataType::f32, RedOp::prod);
  for (std::size_t i = 0; i < out.size(); ++i) {
    EXPECT_EQ(bitsOf(out[i]), i % 4 == 1 ? bitsOf(-inf) : 0x7fffffffu) << i;
  }
}

TEST(HostReduce, IntegersWrapAround) {
  std::vector<std::int8_t> a = {127, -128, 100}, b = {1, -1, 3}, out(3);
  reduce(out.data(), a.data(), b.data(), 3, DataType::i8, RedOp::sum);
  EXPECT_EQ(out, (std::vector<std::int8_t>{-128, 127, 103}));
  reduce(out.data(), a.data(), b.data(), 3, DataType::i8, RedOp::prod);
  EXPECT_EQ(out, (std::vector<std::int8_t>{127, -128, 44}));  // 300 mod 256
  std::vector<std::int64_t> c = {std::numeric_limits<std::int64_t>::max()}, d = {2}, o(1);
  reduce(o.data(), c.data(), d.data(), 1, DataType::i64, RedOp::prod);
  EXPECT_EQ(o[0], -2);
}

TEST(HostReduce, ZeroCountTouchesNothing) {
  reduce(nullptr, nullptr, nullptr, 0, DataType::f32, RedOp::sum);
  divide(nullptr, nullptr, 0, DataType::i32, 4);
}

// Truncation toward zero, from C++'s own integer division, as the reference.
template <typename S>
S truncatingQuotient(S x, std::uint64_t divisor) {
  if constexpr (std::is_signed_v<S>) {
    if (divisor > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      // Only -2^63 / 2^63 reaches magnitude one.
      return static_cast<S>(static_cast<std::int64_t>(x) ==
                                        std::numeric_limits<std::int64_t>::min() &&
                                    divisor == std::uint64_t{1} << 63
                                ? -1
                                : 0);
    }
    return static_cast<S>(static_cast<std::int64_t>(x) / static_cast<std::int64_t>(divisor));
  } else {
    return static_cast<S>(static_cast<std::uint64_t>(x) / divisor);
  }
}

template <typename S>
void expectIntegerDivideTruncates(DataType type) {
  std::mt19937_64 rng(5);
  for (std::uint64_t divisor : {std::uint64_t{1}, std::uint64_t{2}, std::uint64_t{3},
                                std::uint64_t{8}, std::uint64_t{1} << 63, ~std::uint64_t{0}}) {
    SCOPED_TRACE(::testing::Message() << name(type) << " divisor " << divisor);
    std::vector<S> src(1023), out(1023), want(1023);
    for (auto& x : src) x = static_cast<S>(rng());
    src[0] = std::numeric_limits<S>::min();
    src[1] = std::numeric_limits<S>::max();
    src[2] = static_cast<S>(-7);
    for (std::size_t i = 0; i < src.size(); ++i) want[i] = truncatingQuotient(src[i], divisor);
    divide(out.data(), src.data(), src.size(), type, divisor);
    EXPECT_TRUE(sameBits(out, want));
    divide(src.data(), src.data(), src.size(), type, divisor);
    EXPECT_TRUE(sameBits(src, want)) << "in place";
  }
}

TEST(HostReduce, AvgOfIntegersTruncatesTowardZero) {
  // avg = a sum, then one division by the number of contributions.
  std::vector<std::int32_t> a = {-7, 5, 3, -1}, b = {0, 0, 0, -2}, out(4);
  reduce(out.data(), a.data(), b.data(), 4, DataType::i32, RedOp::avg);
  divide(out.data(), out.data(), 4, DataType::i32, 2);
  EXPECT_EQ(out, (std::vector<std::int32_t>{-3, 2, 1, -1}));

  expectIntegerDivideTruncates<std::int8_t>(DataType::i8);
  expectIntegerDivideTruncates<std::uint8_t>(DataType::u8);
  expectIntegerDivideTruncates<std::int32_t>(DataType::i32);
  expectIntegerDivideTruncates<std::uint32_t>(DataType::u32);
  expectIntegerDivideTruncates<std::int64_t>(DataType::i64);
  expectIntegerDivideTruncates<std::uint64_t>(DataType::u64);
}

TEST(HostReduce, FloatDivideIsWithinOneRounding) {
  std::mt19937_64 rng(11);
  for (std::uint64_t divisor : {1, 2, 3, 7, 24}) {
    SCOPED_TRACE(::testing::Message() << "divisor " << divisor);
    // f64 and f32 divide correctly rounded: exactly the quotient rounded once.
    std::vector<double> d(1023), dOut(1023);
    for (auto& x : d) x = F64Case::random(rng);
    divide(dOut.data(), d.data(), d.size(), DataType::f64, divisor);
    for (std::size_t i = 0; i < d.size(); ++i) ASSERT_EQ(dOut[i], d[i] / double(divisor)) << i;
    std::vector<float> f(1023), fOut(1023);
    for (auto& x : f) x = F32Case::random(rng);
    divide(fOut.data(), f.data(), f.size(), DataType::f32, divisor);
    for (std::size_t i = 0; i < f.size(); ++i) {
      ASSERT_EQ(fOut[i], static_cast<float>(double(f[i]) / double(divisor))) << i;
    }
    // The narrow types divide in float and round again: the result is one of the two
    // representable neighbours of the exact quotient, and the nearest but for double rounding.
    for (const Format* fmt : kFormats) {
      const DataType type = fmt == &kHalfFormat   ? DataType::f16
                            : fmt == &kBf16Format ? DataType::bf16
                            : fmt == &kE4m3Format ? DataType::f8e4m3
                                                  : DataType::f8e5m2;
      const std::size_t bytes = sizeOf(type);
      std::vector<std::uint32_t> src;
      for (std::uint32_t e = 0; e < fmt->patterns(); ++e) {
        if (!fmt->isNan(e) && !fmt->isInf(e)) src.push_back(e);
      }
      std::vector<std::uint8_t> in(src.size() * bytes), out(src.size() * bytes);
      for (std::size_t i = 0; i < src.size(); ++i) std::memcpy(&in[i * bytes], &src[i], bytes);
      divide(out.data(), in.data(), src.size(), type, divisor);
      for (std::size_t i = 0; i < src.size(); ++i) {
        std::uint32_t got = 0;
        std::memcpy(&got, &out[i * bytes], bytes);
        const double exact = fmt->value(src[i]) / double(divisor);
        const std::uint32_t nearest = fmt->roundToNearestEven(exact);
        const float viaFloat = static_cast<float>(fmt->value(src[i])) / float(divisor);
        ASSERT_EQ(got, fmt->encode(viaFloat)) << fmt->name << " " << src[i];
        const bool adjacent = got + 1 == nearest || got == nearest + 1;
        const bool brackets = (fmt->value(got) - exact) * (fmt->value(nearest) - exact) <= 0;
        ASSERT_TRUE(got == nearest || (adjacent && brackets)) << fmt->name << " " << src[i];
      }
    }
  }
}

// Every instruction-set variant this CPU runs gives the baseline's bits: every dtype and op,
// random bit patterns (NaNs with payloads, infinities, subnormals and -0 among them), lengths
// around the vector widths, misaligned starts, in place and out of place; and avg's division.
TEST(HostReduce, EveryInstructionSetGivesTheBaselinesBits) {
  const std::vector<ReduceVariant>& variants = reduceVariants();
  ASSERT_STREQ(variants.front().name, "baseline");
  std::mt19937_64 rng(7);
  int compared = 0;
  for (const ReduceVariant& v : variants) {
    if (!v.runs) {
      std::printf("(%s: not on this CPU)\n", v.name);
      continue;
    }
    for (DataType type : kAllDataTypes) {
      const std::size_t es = sizeOf(type);
      for (RedOp op : kAllRedOps) {
        for (std::size_t count : {1ul, 15ul, 16ul, 63ul, 64ul, 65ul, 1000ul, 4099ul}) {
          for (std::size_t skew : {0ul, 1ul}) {
            std::vector<std::byte> a((count + skew) * es), b(a.size());
            for (auto* buf : {&a, &b}) {
              for (std::byte& x : *buf) x = static_cast<std::byte>(rng());
            }
            std::vector<std::byte> want(a.size()), got(a.size());
            const std::size_t at = skew * es;
            variants.front().reduce(want.data() + at, a.data() + at, b.data() + at, count, type,
                                    op);
            v.reduce(got.data() + at, a.data() + at, b.data() + at, count, type, op);
            ASSERT_EQ(want, got) << v.name << " " << name(type) << " " << name(op) << " count "
                                 << count << " skew " << skew;
            std::vector<std::byte> inPlace = a;
            v.reduce(inPlace.data() + at, inPlace.data() + at, b.data() + at, count, type, op);
            ASSERT_EQ(
                std::vector<std::byte>(want.begin() + static_cast<std::ptrdiff_t>(at), want.end()),
                std::vector<std::byte>(inPlace.begin() + static_cast<std::ptrdiff_t>(at),
                                       inPlace.end()))
                << v.name << " in place " << name(type) << " " << name(op) << " count " << count;
            ++compared;
          }
        }
      }
      for (std::uint64_t divisor : {3ull, 8ull, 1000003ull}) {
        std::vector<std::byte> a(4099 * es), want(a.size()), got(a.size());
        for (std::byte& x : a) x = static_cast<std::byte>(rng());
        variants.front().divide(want.data(), a.data(), 4099, type, divisor);
        v.divide(got.data(), a.data(), 4099, type, divisor);
        ASSERT_EQ(want, got) << v.name << " divide " << name(type) << " by " << divisor;
      }
    }
  }
  EXPECT_GT(compared, 0);
  std::printf("reduce() runs the %s variant here\n", reduceVariant().name);
}

}  // namespace
}  // namespace weft::exec
