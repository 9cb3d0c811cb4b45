// Bit-exact conversions between float and the narrow floating types (f16, bf16, fp8 E4M3/E5M2),
// round to nearest even, with the NaN and saturation choices of CUDA's constructors, so the CPU
// executor's reductions agree bit for bit with src/device/reduce_kernel.cu.
#pragma once

#include <bit>
#include <cstdint>

// A file compiled for another instruction set (host_reduce_*.cpp) defines WEFT_NUMERIC_NS to
// keep its copies of these inline functions apart: the linker keeps one copy of an inline
// function, and the AVX-512 one must not serve the baseline's callers.
#ifdef WEFT_NUMERIC_NS
namespace weft::exec::WEFT_NUMERIC_NS {
#else
namespace weft::exec {
#endif
namespace detail {

// One encoder and one decoder serve all four formats; a format is its field widths plus the two
// places where the formats (and CUDA's treatment of them) differ.
struct NarrowFormat {
  int expBits;
  int manBits;
  // The all-ones exponent holds inf and NaN, as in IEEE. E4M3 instead spends it on finite values
  // up to 448, keeping only S.1111.111 for NaN.
  bool ieeeSpecials;
  // Finite overflow and inf become the largest finite value: the fp8 constructors pass
  // __NV_SATFINITE. f16 and bf16 overflow to inf as IEEE rounding does.
  bool saturate;
  // Every NaN converts to this one positive quiet NaN: CUDA's conversions drop sign and payload.
  std::uint32_t nan;

  constexpr int bias() const { return (1 << (expBits - 1)) - 1; }
  constexpr std::uint32_t infinity() const { return ((1u << expBits) - 1) << manBits; }
  constexpr std::uint32_t maxFinite() const {
    return ieeeSpecials ? infinity() - 1 : infinity() | ((1u << manBits) - 2);
  }
};

inline constexpr NarrowFormat kHalf{5, 10, true, false, 0x7fff};
inline constexpr NarrowFormat kBf16{8, 7, true, false, 0x7fff};
inline constexpr NarrowFormat kE4m3{4, 3, false, true, 0x7f};
inline constexpr NarrowFormat kE5m2{5, 2, true, true, 0x7f};

inline constexpr std::uint32_t kFloatInfBits = 0x7f800000;
inline constexpr std::uint32_t kFloatQuietBit = 0x00400000;

// v / 2^shift rounded to nearest, ties to the even result; shift in [1, 31], v + 2^(shift-1)
// must fit. A carry out of the mantissa bumps the exponent, which is what rounding up to the next
// binade (or to inf) means.
constexpr std::uint32_t roundShiftEven(std::uint32_t v, int shift) {
  const std::uint32_t halfMinusOne = (1u << (shift - 1)) - 1;
  return (v + halfMinusOne + ((v >> shift) & 1u)) >> shift;
}

template <NarrowFormat F>
constexpr float decode(std::uint32_t v) {
  if constexpr (F.expBits == 8) {
    // bf16 is float's upper half: every pattern, NaNs and subnormals included, widens exactly.
    return std::bit_cast<float>(v << 16);
  } else {
    constexpr int kWidth = F.expBits + F.manBits;
    constexpr int kDrop = 23 - F.manBits;
    constexpr std::uint32_t kRebias = static_cast<std::uint32_t>(127 - F.bias()) << 23;
    const std::uint32_t sign = ((v >> kWidth) & 1u) << 31;
    const std::uint32_t mag = v & ((1u << kWidth) - 1);
    const std::uint32_t mantissa = mag & ((1u << F.manBits) - 1);
    if (mag < (1u << F.manBits)) {
      // Subnormal: a whole number of the smallest subnormal, a power of two well inside float's
      // normal range, so the product is exact.
      constexpr float kUnit =
          std::bit_cast<float>(static_cast<std::uint32_t>(128 - F.bias() - F.manBits) << 23);
      return std::bit_cast<float>(sign |
                                  std::bit_cast<std::uint32_t>(static_cast<float>(mag) * kUnit));
    }
    const bool special = F.ieeeSpecials ? mag >= F.infinity() : mag > F.maxFinite();
    if (special) {
      if (F.ieeeSpecials && mantissa == 0) return std::bit_cast<float>(sign | kFloatInfBits);
      return std::bit_cast<float>(sign | kFloatInfBits | kFloatQuietBit | (mantissa << kDrop));
    }
    return std::bit_cast<float>(sign | ((mag << kDrop) + kRebias));
  }
}

template <NarrowFormat F>
constexpr std::uint32_t encode(float value) {
  constexpr int kDrop = 23 - F.manBits;
  constexpr std::uint32_t kRebias = static_cast<std::uint32_t>(127 - F.bias()) << 23;
  // Float exponent field of the format's smallest normal, 2^(1 - bias).
  constexpr std::uint32_t kMinNormalField = static_cast<std::uint32_t>(128 - F.bias());
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  const std::uint32_t sign = (bits >> 31) << (F.expBits + F.manBits);
  std::uint32_t mag = bits & 0x7fffffffu;
  if (mag > kFloatInfBits) return F.nan;
  if constexpr (F.saturate) {
    // Clamping first equals rounding then saturating: whatever lies above the largest finite
    // value rounds either to it or past it.
    constexpr std::uint32_t kMaxMag = std::bit_cast<std::uint32_t>(decode<F>(F.maxFinite()));
    if (mag > kMaxMag) mag = kMaxMag;
  }
  std::uint32_t out = 0;
  if ((mag >> 23) >= kMinNormalField) {
    out = roundShiftEven(mag - kRebias, kDrop);
  } else {
    // Below the format's normal range: round the significand to whole units of the smallest
    // subnormal. Float subnormals (field 0) scale like field 1 without the implicit bit.
    const std::uint32_t field = mag >> 23;
    const std::uint32_t significand = field == 0 ? mag : (mag & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = kDrop + kMinNormalField - (field == 0 ? 1 : field);
    // Past 25 the significand (< 2^24) is under half a unit: the result is zero.
    out = shift > 25 ? 0 : roundShiftEven(significand, static_cast<int>(shift));
  }
  if constexpr (F.ieeeSpecials && !F.saturate) {
    if (out > F.infinity()) out = F.infinity();
  }
  return sign | out;
}

}  // namespace detail

constexpr float halfToFloat(std::uint16_t h) {
  return detail::decode<detail::kHalf>(h);
}
constexpr std::uint16_t floatToHalf(float f) {
  return static_cast<std::uint16_t>(detail::encode<detail::kHalf>(f));
}

constexpr float bf16ToFloat(std::uint16_t h) {
  return detail::decode<detail::kBf16>(h);
}
constexpr std::uint16_t floatToBf16(float f) {
  return static_cast<std::uint16_t>(detail::encode<detail::kBf16>(f));
}

constexpr float e4m3ToFloat(std::uint8_t b) {
  return detail::decode<detail::kE4m3>(b);
}
constexpr std::uint8_t floatToE4m3(float f) {
  return static_cast<std::uint8_t>(detail::encode<detail::kE4m3>(f));
}

constexpr float e5m2ToFloat(std::uint8_t b) {
  return detail::decode<detail::kE5m2>(b);
}
constexpr std::uint8_t floatToE5m2(float f) {
  return static_cast<std::uint8_t>(detail::encode<detail::kE5m2>(f));
}

}  // namespace weft::exec(::WEFT_NUMERIC_NS)
