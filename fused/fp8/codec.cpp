#include "fused/fp8/codec.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "algorithms/compression.hpp"
#include "fused/fp8/codec_math.hpp"
#include "src/exec/numeric.hpp"

namespace weft::fused::fp8 {
namespace {

constexpr std::uint8_t kScaleNaN = 0xff;    // E8M0's NaN
constexpr std::uint8_t kElementNaN = 0x7f;  // S.1111.111 (E4M3) and S.11111.11 (E5M2): NaN

// The value types, by how they widen to float and round back (to nearest even).
struct F32 {
  using S = float;
  static float load(S v) { return v; }
  static S store(float v) { return v; }
};
struct F16 {
  using S = std::uint16_t;
  static float load(S v) { return exec::halfToFloat(v); }
  static S store(float v) { return exec::floatToHalf(v); }
};
struct Bf16 {
  using S = std::uint16_t;
  static float load(S v) { return exec::bf16ToFloat(v); }
  // exec::floatToBf16 without a branch (to nearest even; NaN as its 0x7fff), so loops vectorize.
  static S store(float v) {
    const auto u = std::bit_cast<std::uint32_t>(v);
    const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return static_cast<S>((u & 0x7fffffffu) > 0x7f800000u ? 0x7fffu : rounded);
  }
};

// Calls f with the value type's tag; false for a type the codecs do not take.
template <typename F>
bool byType(DataType type, F f) {
  switch (type) {
    case DataType::f32:
      f(F32{});
      return true;
    case DataType::f16:
      f(F16{});
      return true;
    case DataType::bf16:
      f(Bf16{});
      return true;
    default:
      return false;
  }
}

// An element of a scaled, finite y (|y| at most the largest finite element), as
// exec::floatToE4m3 / floatToE5m2 round it, without a branch so that loops of it vectorize: the
// normal range drops mantissa bits to nearest even; below it, adding a power of two whose unit in
// the last place is the smallest subnormal rounds (to nearest even) to whole subnormals.
template <bool E4m3>
inline std::uint32_t elementOf(float y) {
  constexpr int kBias = E4m3 ? 7 : 15, kDrop = E4m3 ? 20 : 21;
  constexpr std::uint32_t kMaxMag = E4m3 ? 0x43e00000u : 0x47600000u;  // 448, 57344
  constexpr std::uint32_t kMinNormal = static_cast<std::uint32_t>(128 - kBias) << 23;
  constexpr std::uint32_t kRebias = static_cast<std::uint32_t>(127 - kBias) << 23;
  constexpr float kMagic = E4m3 ? 16384.0f : 128.0f;  // 2^14: ulp 2^-9; 2^7: ulp 2^-16
  const std::uint32_t u = std::bit_cast<std::uint32_t>(y);
  const std::uint32_t mag = std::min(u & 0x7fffffffu, kMaxMag);
  const std::uint32_t v = mag - kRebias;
  const std::uint32_t normal = (v + ((1u << (kDrop - 1)) - 1) + ((v >> kDrop) & 1u)) >> kDrop;
  const std::uint32_t sub = std::bit_cast<std::uint32_t>(std::bit_cast<float>(mag) + kMagic) -
                            std::bit_cast<std::uint32_t>(kMagic);
  return ((u >> 24) & 0x80u) | (mag >= kMinNormal ? normal : sub);
}

// An element's value, as exec::e4m3ToFloat / e5m2ToFloat give it (NaN and inf codes too),
// without a branch.
template <bool E4m3>
inline float valueOf(std::uint32_t c) {
  constexpr int kBias = E4m3 ? 7 : 15, kMan = E4m3 ? 3 : 2, kDrop = 23 - kMan;
  constexpr float kUnit = E4m3 ? 0x1p-9f : 0x1p-16f;  // the smallest subnormal
  const std::uint32_t mag = c & 0x7fu, mantissa = mag & ((1u << kMan) - 1);
  const std::uint32_t sub = std::bit_cast<std::uint32_t>(static_cast<float>(mag) * kUnit);
  const std::uint32_t normal = (mag << kDrop) + (static_cast<std::uint32_t>(127 - kBias) << 23);
  const std::uint32_t special =
      !E4m3 && mantissa == 0 ? 0x7f800000u : 0x7fc00000u | (mantissa << kDrop);
  const bool isSpecial = E4m3 ? mag == 0x7fu : mag >= 0x7cu;
  const std::uint32_t bits = mag < (1u << kMan) ? sub : isSpecial ? special : normal;
  return std::bit_cast<float>(((c & 0x80u) << 24) | bits);
}

// The loops every block runs, compiled for the baseline and the wider x86 vector units, the
// widest this CPU runs picked at load time (GCC's target clones). Not under ThreadSanitizer,
// whose instrumented resolvers would run before its runtime is up.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define WEFT_CODEC_CLONES __attribute__((target_clones("default", "avx2", "avx512f")))
#else
#define WEFT_CODEC_CLONES
#endif

// n values times `factor` (or over it) as elements; inlined into each clone below.
template <bool E4m3, bool Divide>
[[gnu::always_inline]] inline void scaledElements(const float* v, std::size_t n, float factor,
                                                  std::uint8_t* out) {
  for (std::size_t i = 0; i < n; ++i)
    out[i] = static_cast<std::uint8_t>(elementOf<E4m3>(Divide ? v[i] / factor : v[i] * factor));
}

WEFT_CODEC_CLONES void toElements(const float* v, std::size_t n, float factor, bool e4m3,
                                  std::uint8_t* out) {
  e4m3 ? scaledElements<true, false>(v, n, factor, out)
       : scaledElements<false, false>(v, n, factor, out);
}

// Blocks so small that their scale's reciprocal overflows (codec_math.hpp): rare, one at a time.
void dividedElements(const float* v, std::size_t n, float scale, bool e4m3, std::uint8_t* out) {
  e4m3 ? scaledElements<true, true>(v, n, scale, out)
       : scaledElements<false, true>(v, n, scale, out);
}

// n elements' values times `scale`.
WEFT_CODEC_CLONES void fromElements(const std::uint8_t* in, std::size_t n, float scale, bool e4m3,
                                    float* out) {
  if (e4m3) {
    for (std::size_t i = 0; i < n; ++i) out[i] = valueOf<true>(in[i]) * scale;
  } else {
    for (std::size_t i = 0; i < n; ++i) out[i] = valueOf<false>(in[i]) * scale;
  }
}

// One block of `n` values (at most 128) into elements and its scale.
template <typename V, bool E4m3, bool E8m0>
void encodeBlock(const typename V::S* in, std::size_t n, std::uint8_t* elements, std::byte* scale) {
  float v[128];
  // The largest magnitude as bits (ordered as the magnitudes are); at or past infinity's a
  // value was not finite. No branch a value, so the loop vectorizes.
  std::uint32_t most = 0;
  for (std::size_t i = 0; i < n; ++i) {
    v[i] = V::load(in[i]);
    most = std::max(most, std::bit_cast<std::uint32_t>(v[i]) & 0x7fffffffu);
  }
  const float amax = std::bit_cast<float>(most);
  if (most >= 0x7f800000u) {
    std::fill(elements, elements + n, kElementNaN);
    if constexpr (E8m0) {
      scale[0] = std::byte{kScaleNaN};
    } else {
      const float nan = std::numeric_limits<float>::quiet_NaN();
      std::memcpy(scale, &nan, 4);
    }
    return;
  }
  if constexpr (E8m0) {
    const int k = e8m0Exponent(amax, E4m3);
    scale[0] = std::byte(static_cast<std::uint8_t>(k + 127));
    // An exact power of two: the product rounds as ldexp(v, -k) does (once, to nearest even).
    toElements(v, n, std::ldexp(1.0f, -k), E4m3, elements);
  } else {
    const float s = f32Scale(amax, E4m3 ? 448.0f : 57344.0f);
    std::memcpy(scale, &s, 4);
    // Times the scale's reciprocal (rounded once), as the device does: one division a block.
    const float inverse = 1.0f / s;
    if (reciprocalFinite(inverse)) {
      toElements(v, n, inverse, E4m3, elements);
    } else {
      dividedElements(v, n, s, E4m3, elements);
    }
  }
}

template <typename V, bool E4m3, bool E8m0>
void encodeAll(const Codec& codec, const void* in, std::size_t count, std::byte* out) {
  const auto* values = static_cast<const typename V::S*>(in);
  auto* elements = reinterpret_cast<std::uint8_t*>(out);
  std::byte* scales = out + count;
  const auto block = static_cast<std::size_t>(codec.block);
  for (std::size_t b = 0, begin = 0; begin < count; ++b, begin += block) {
    encodeBlock<V, E4m3, E8m0>(values + begin, std::min(block, count - begin), elements + begin,
                               scales + b * codec.scaleBytes());
  }
}

// Decoded values of a block (a NaN scale: every value NaN), handed to `put(i, value)`.
template <typename Put>
void decodeBlocks(const Codec& codec, const std::byte* in, std::size_t count, Put put) {
  const auto* elements = reinterpret_cast<const std::uint8_t*>(in);
  const auto block = static_cast<std::size_t>(codec.block);
  float v[128];
  for (std::size_t b = 0, begin = 0; begin < count; ++b, begin += block) {
    const std::size_t n = std::min(count - begin, block);
    const float s = scaleOf(codec, in, count, b);
    // A non-finite block decodes to one quiet NaN (0x7fc00000), whatever its elements hold.
    if (std::isnan(s)) {
      std::fill(v, v + n, std::numeric_limits<float>::quiet_NaN());
    } else {
      fromElements(elements + begin, n, s, codec.element == Element::e4m3, v);
    }
    for (std::size_t i = 0; i < n; ++i) put(begin + i, v[i]);
  }
}

}  // namespace

Result<Codec> Codec::parse(std::string_view text) {
  // weft.h's text form (algorithms/compression.hpp), without "none" or ":always".
  auto c = parseCompression(text);
  if (!c) return c.status();
  if (!compresses(*c) || c->always != 0)
    return invalidArgument(std::string(text) +
                           ": a codec is FORMAT:BLOCK, FORMAT e4m3 or e5m2, BLOCK 32 (E8M0 scales) "
                           "or 128 (f32 scales), e.g. e4m3:32");
  return from(*c);
}

Codec Codec::from(const weftCompression& c) {
  Codec codec;
  codec.element = c.format == weftCompressFp8E5M2 ? Element::e5m2 : Element::e4m3;
  codec.scale = c.scale == weftScaleF32 ? ScaleKind::f32 : ScaleKind::e8m0;
  codec.block = c.block;
  return codec;
}

std::string Codec::name() const {
  return std::string(element == Element::e4m3 ? "e4m3" : "e5m2") + ":" + std::to_string(block);
}

double Codec::errorBound(double x, double blockScale) const {
  const double y = std::fabs(x) / blockScale;
  int e = minExponent();
  if (y > 0) e = std::max(e, static_cast<int>(std::floor(std::log2(y))));
  // f32 scales: the product by the scale's rounded reciprocal strays up to two f32 roundings.
  const double reciprocal = scale == ScaleKind::f32 ? std::fabs(x) * 0x1p-22 : 0.0;
  return blockScale * std::ldexp(1.0, e - mantissaBits() - 1) + reciprocal;
}

bool encodable(DataType type) {
  return type == DataType::f32 || type == DataType::f16 || type == DataType::bf16;
}

Status encode(const Codec& codec, DataType type, const void* in, std::size_t count,
              std::byte* out) {
  const bool e4m3 = codec.element == Element::e4m3, e8m0 = codec.scale == ScaleKind::e8m0;
  const bool known = byType(type, [&](auto tag) {
    using V = decltype(tag);
    if (e4m3) {
      e8m0 ? encodeAll<V, true, true>(codec, in, count, out)
           : encodeAll<V, true, false>(codec, in, count, out);
    } else {
      e8m0 ? encodeAll<V, false, true>(codec, in, count, out)
           : encodeAll<V, false, false>(codec, in, count, out);
    }
  });
  if (!known)
    return invalidArgument("fp8 " + codec.name() + ": " + std::string(name(type)) +
                           " cannot be compressed (bf16, f16 and f32 can)");
  return {};
}

float scaleOf(const Codec& codec, const std::byte* encoded, std::size_t count, std::size_t block) {
  const std::byte* scales = encoded + count;
  if (codec.scale == ScaleKind::e8m0) {
    const auto code = static_cast<std::uint8_t>(scales[block]);
    return code == kScaleNaN ? std::numeric_limits<float>::quiet_NaN()
                             : std::ldexp(1.0f, static_cast<int>(code) - 127);
  }
  float s = 0;
  std::memcpy(&s, scales + 4 * block, 4);
  return s;
}

Status decode(const Codec& codec, DataType type, const std::byte* in, std::size_t count,
              void* out) {
  const bool known = byType(type, [&](auto tag) {
    using V = decltype(tag);
    auto* values = static_cast<typename V::S*>(out);
    decodeBlocks(codec, in, count, [&](std::size_t i, float v) { values[i] = V::store(v); });
  });
  if (!known)
    return invalidArgument("fp8 " + codec.name() + ": cannot decode into " +
                           std::string(name(type)) + " (bf16, f16 and f32 can)");
  return {};
}

Status fromFloats(DataType type, const float* in, std::size_t count, void* out) {
  const bool known = byType(type, [&](auto tag) {
    using V = decltype(tag);
    auto* values = static_cast<typename V::S*>(out);
    for (std::size_t i = 0; i < count; ++i) values[i] = V::store(in[i]);
  });
  if (!known)
    return invalidArgument("fp8: " + std::string(name(type)) + " is not bf16, f16 or f32");
  return {};
}

Status toFloats(DataType type, const void* in, std::size_t count, float* out) {
  const bool known = byType(type, [&](auto tag) {
    using V = decltype(tag);
    const auto* values = static_cast<const typename V::S*>(in);
    for (std::size_t i = 0; i < count; ++i) out[i] = V::load(values[i]);
  });
  if (!known)
    return invalidArgument("fp8: " + std::string(name(type)) + " is not bf16, f16 or f32");
  return {};
}

Segments Segments::of(const Codec& codec, std::size_t segments, std::size_t stride,
                      std::size_t count) {
  Segments s;
  s.segments = segments;
  s.stride = stride;
  s.count = count;
  const auto block = static_cast<std::size_t>(codec.block);
  s.padded = (stride + block - 1) / block * block;
  s.segmentBytes = (codec.encodedBytes(s.padded) + 15) / 16 * 16;
  return s;
}

Status encodeSegments(const Codec& codec, DataType type, const void* in, const Segments& seg,
                      std::byte* out) {
  const std::size_t size = sizeOf(type);
  std::vector<std::byte> padded(seg.padded * size);
  for (std::size_t s = 0; s < seg.segments; ++s) {
    const std::size_t valid = seg.valid(s);
    std::fill(padded.begin(), padded.end(), std::byte{0});
    if (valid > 0)
      std::memcpy(padded.data(), static_cast<const std::byte*>(in) + s * seg.stride * size,
                  valid * size);
    std::byte* to = out + s * seg.segmentBytes;
    if (Status st = encode(codec, type, padded.data(), seg.padded, to); !st) return st;
    std::fill(to + codec.encodedBytes(seg.padded), to + seg.segmentBytes, std::byte{0});
  }
  return {};
}

Status decodeSegments(const Codec& codec, DataType type, const std::byte* in, const Segments& seg,
                      void* out) {
  const std::size_t size = sizeOf(type);
  std::vector<std::byte> values(seg.padded * size);
  for (std::size_t s = 0; s < seg.segments; ++s) {
    const std::size_t valid = seg.valid(s);
    if (valid == 0) continue;
    if (Status st = decode(codec, type, in + s * seg.segmentBytes, seg.padded, values.data()); !st)
      return st;
    std::memcpy(static_cast<std::byte*>(out) + s * seg.stride * size, values.data(), valid * size);
  }
  return {};
}

Status sumSegments(const Codec& codec, const std::byte* in, const Segments& seg, float divisor,
                   float* sums) {
  std::fill(sums, sums + seg.padded, 0.0f);
  for (std::size_t s = 0; s < seg.segments; ++s) {
    decodeBlocks(codec, in + s * seg.segmentBytes, seg.padded,
                 [&](std::size_t i, float v) { sums[i] += v; });
  }
  if (divisor != 1.0f) {
    for (std::size_t i = 0; i < seg.padded; ++i) sums[i] /= divisor;
  }
  return {};
}

}  // namespace weft::fused::fp8
