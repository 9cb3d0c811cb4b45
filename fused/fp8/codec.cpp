#include "fused/fp8/codec.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "fused/fp8/codec_math.hpp"
#include "fused/fp8/values.hpp"
#include "src/exec/numeric.hpp"

namespace weft::fused::fp8 {
namespace {

constexpr std::uint8_t kScaleNaN = 0xff;    // E8M0's NaN
constexpr std::uint8_t kElementNaN = 0x7f;  // S.1111.111 (E4M3) and S.11111.11 (E5M2): NaN

std::uint8_t toElement(Element e, float y) {
  return e == Element::e4m3 ? exec::floatToE4m3(y) : exec::floatToE5m2(y);
}

float fromElement(Element e, std::uint8_t q) {
  return e == Element::e4m3 ? exec::e4m3ToFloat(q) : exec::e5m2ToFloat(q);
}

}  // namespace

Result<Codec> Codec::parse(std::string_view text) {
  const auto colon = text.find(':');
  const std::string_view format = text.substr(0, colon);
  const std::string_view block = colon == std::string_view::npos ? "" : text.substr(colon + 1);
  Codec c;
  if (format == "e4m3" || format == "fp8e4m3") {
    c.element = Element::e4m3;
  } else if (format == "e5m2" || format == "fp8e5m2") {
    c.element = Element::e5m2;
  } else {
    return invalidArgument(std::string(text) +
                           ": expected FORMAT:BLOCK, FORMAT e4m3 or e5m2, BLOCK 32 (E8M0 scales) "
                           "or 128 (f32 scales), e.g. e4m3:32");
  }
  if (block == "32") {
    c.block = 32;
    c.scale = ScaleKind::e8m0;
  } else if (block == "128") {
    c.block = 128;
    c.scale = ScaleKind::f32;
  } else {
    return invalidArgument(std::string(text) +
                           ": the block must be 32 (E8M0 scales, MX-style) or 128 (f32 scales)");
  }
  return c;
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
  if (!encodable(type))
    return invalidArgument("fp8 " + codec.name() + ": " + std::string(name(type)) +
                           " cannot be compressed (bf16, f16 and f32 can)");
  auto* elements = reinterpret_cast<std::uint8_t*>(out);
  std::byte* scales = out + count;
  const float maxFinite = codec.maxFinite();
  for (std::size_t b = 0, begin = 0; begin < count; ++b, begin += codec.block) {
    const std::size_t end = std::min(count, begin + codec.block);
    float amax = 0;
    bool finite = true;
    for (std::size_t i = begin; i < end; ++i) {
      const float v = loadValue(type, in, i);
      finite = finite && std::isfinite(v);
      amax = std::max(amax, std::fabs(v));
    }
    if (!finite) {
      std::fill(elements + begin, elements + end, kElementNaN);
      if (codec.scale == ScaleKind::e8m0) {
        scales[b] = std::byte{kScaleNaN};
      } else {
        const float nan = std::numeric_limits<float>::quiet_NaN();
        std::memcpy(scales + 4 * b, &nan, 4);
      }
      continue;
    }
    if (codec.scale == ScaleKind::e8m0) {
      const int k = e8m0Exponent(amax, codec.element == Element::e4m3);
      scales[b] = std::byte(static_cast<std::uint8_t>(k + 127));
      for (std::size_t i = begin; i < end; ++i)
        elements[i] = toElement(codec.element, std::ldexp(loadValue(type, in, i), -k));
    } else {
      const float s = f32Scale(amax, maxFinite);
      std::memcpy(scales + 4 * b, &s, 4);
      for (std::size_t i = begin; i < end; ++i)
        elements[i] = toElement(codec.element, loadValue(type, in, i) / s);
    }
  }
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
  if (!encodable(type))
    return invalidArgument("fp8 " + codec.name() + ": cannot decode into " +
                           std::string(name(type)) + " (bf16, f16 and f32 can)");
  const auto* elements = reinterpret_cast<const std::uint8_t*>(in);
  for (std::size_t b = 0, begin = 0; begin < count; ++b, begin += codec.block) {
    const std::size_t end = std::min(count, begin + codec.block);
    const float s = scaleOf(codec, in, count, b);
    // A non-finite block decodes to one quiet NaN (0x7fc00000), whatever its elements hold.
    for (std::size_t i = begin; i < end; ++i)
      storeValue(type, out, i,
                 std::isnan(s) ? std::numeric_limits<float>::quiet_NaN()
                               : fromElement(codec.element, elements[i]) * s);
  }
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
  std::vector<float> part(seg.padded);
  for (std::size_t s = 0; s < seg.segments; ++s) {
    if (Status st =
            decode(codec, DataType::f32, in + s * seg.segmentBytes, seg.padded, part.data());
        !st)
      return st;
    for (std::size_t i = 0; i < seg.padded; ++i) sums[i] += part[i];
  }
  if (divisor != 1.0f) {
    for (std::size_t i = 0; i < seg.padded; ++i) sums[i] /= divisor;
  }
  return {};
}

}  // namespace weft::fused::fp8
