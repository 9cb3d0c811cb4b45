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
  static S store(float v) { return exec::floatToBf16(v); }
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

// Every element code's value: decoding is a lookup and one exact product.
const float* elementValues(Element e) {
  static const auto table = [] {
    std::array<std::array<float, 256>, 2> t{};
    for (int q = 0; q < 256; ++q) {
      t[0][q] = exec::e4m3ToFloat(static_cast<std::uint8_t>(q));
      t[1][q] = exec::e5m2ToFloat(static_cast<std::uint8_t>(q));
    }
    return t;
  }();
  return table[e == Element::e4m3 ? 0 : 1].data();
}

template <bool E4m3>
std::uint8_t toElement(float y) {
  return E4m3 ? exec::floatToE4m3(y) : exec::floatToE5m2(y);
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
    const float inverse = std::ldexp(1.0f, -k);
    for (std::size_t i = 0; i < n; ++i) elements[i] = toElement<E4m3>(v[i] * inverse);
  } else {
    const float s = f32Scale(amax, E4m3 ? 448.0f : 57344.0f);
    std::memcpy(scale, &s, 4);
    for (std::size_t i = 0; i < n; ++i) elements[i] = toElement<E4m3>(v[i] / s);
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
  const float* table = elementValues(codec.element);
  const auto block = static_cast<std::size_t>(codec.block);
  for (std::size_t b = 0, begin = 0; begin < count; ++b, begin += block) {
    const std::size_t end = std::min(count, begin + block);
    const float s = scaleOf(codec, in, count, b);
    // A non-finite block decodes to one quiet NaN (0x7fc00000), whatever its elements hold.
    if (std::isnan(s)) {
      for (std::size_t i = begin; i < end; ++i) put(i, std::numeric_limits<float>::quiet_NaN());
    } else {
      for (std::size_t i = begin; i < end; ++i) put(i, table[elements[i]] * s);
    }
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
  return blockScale * std::ldexp(1.0, e - mantissaBits() - 1);
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
