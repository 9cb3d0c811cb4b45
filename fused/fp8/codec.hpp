// Block-scaled fp8 codecs: bf16, f16 or f32 values as fp8 elements (E4M3 or E5M2, the OCP 8-bit
// formats) plus one scale per block. Two schemes (docs/algorithms-fused.md, "FP8 codecs"):
//   e8m0 scales, blocks of 32 (MX-style, OCP Microscaling v1.0): a power of two per block;
//   f32 scales, blocks of 128 (DeepSeek-V3 style): the block's largest magnitude over the
//   element's largest finite value.
// Either way the scale is chosen so that no finite element saturates, elements round to nearest
// even, and a block holding NaN or an infinity is marked not finite (its scale NaN), so every
// value of it decodes to NaN: reported, never hidden. The host codec here is the reference the
// device codec must match bit for bit.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "weft/status.hpp"
#include "weft/types.hpp"
#include "weft/weft.h"

namespace weft::fused::fp8 {

enum class Element : std::uint8_t { e4m3, e5m2 };
enum class ScaleKind : std::uint8_t { e8m0, f32 };

struct Codec {
  Element element = Element::e4m3;
  ScaleKind scale = ScaleKind::e8m0;
  int block = 32;

  // "e4m3:32" (E8M0 scales), "e5m2:128" (f32 scales); an error names what is accepted.
  static Result<Codec> parse(std::string_view text);
  std::string name() const;

  std::size_t blocks(std::size_t count) const { return (count + block - 1) / block; }
  std::size_t scaleBytes() const { return scale == ScaleKind::e8m0 ? 1 : 4; }
  // An encoded buffer: `count` element bytes, then blocks(count) scales.
  std::size_t encodedBytes(std::size_t count) const { return count + blocks(count) * scaleBytes(); }
  // From weft.h's form (checked by the caller: algorithms/compression.hpp).
  static Codec from(const weftCompression& c);

  // The element format's largest finite value (448 or 57344), smallest normal exponent and
  // mantissa bits: what the error bound is made of.
  float maxFinite() const { return element == Element::e4m3 ? 448.0f : 57344.0f; }
  int minExponent() const { return element == Element::e4m3 ? -6 : -14; }
  int mantissaBits() const { return element == Element::e4m3 ? 3 : 2; }

  // The most encode-then-decode (to f32) may move a finite value x of a block whose scale is
  // `blockScale`: half a unit in the last place of x / scale, or of the element's smallest normal
  // where x / scale is subnormal, times the scale; f32 scales add |x| · 2^-22 (the values are
  // multiplied by the scale's reciprocal, itself rounded).
  double errorBound(double x, double blockScale) const;
};

// Which input types a codec takes: bf16, f16 and f32.
bool encodable(DataType type);

// Encodes `count` values of `type` at `in` into `out` (codec.encodedBytes(count) bytes).
Status encode(const Codec& codec, DataType type, const void* in, std::size_t count, std::byte* out);
// Decodes what encode wrote back into `count` values of `type`, rounded to nearest even.
Status decode(const Codec& codec, DataType type, const std::byte* in, std::size_t count, void* out);
// `count` floats as values of `type` (bf16, f16 or f32), rounded to nearest even.
Status fromFloats(DataType type, const float* in, std::size_t count, void* out);
// `count` values of `type` (bf16, f16 or f32) as floats.
Status toFloats(DataType type, const void* in, std::size_t count, float* out);
// One block's scale as a float (NaN where the block was not finite), for tests and tools.
float scaleOf(const Codec& codec, const std::byte* encoded, std::size_t count, std::size_t block);

// Values cut into `segments` shares of `stride` values each (rank r's share first at r * stride;
// `count` values in all, so the last shares may hold fewer or none), each encoded on its own:
// padded with zeros to whole blocks (`padded` values), its elements then its scales, in
// `segmentBytes` (a multiple of 16, so every share starts aligned). What the compressed
// collectives exchange.
struct Segments {
  std::size_t segments = 1, stride = 0, count = 0;
  std::size_t padded = 0, segmentBytes = 0;
  static Segments of(const Codec& codec, std::size_t segments, std::size_t stride,
                     std::size_t count);
  // The values share s holds.
  std::size_t valid(std::size_t s) const {
    const std::size_t begin = s * stride;
    return begin >= count ? 0 : std::min(stride, count - begin);
  }
  std::size_t bytes() const { return segments * segmentBytes; }
};

// Each share of `in` (values of `type`) encoded into `out` (seg.bytes()).
Status encodeSegments(const Codec& codec, DataType type, const void* in, const Segments& seg,
                      std::byte* out);
// Each encoded share of `in` decoded into its place in `out` (values of `type`).
Status decodeSegments(const Codec& codec, DataType type, const std::byte* in, const Segments& seg,
                      void* out);
// The sum of `seg.segments` encoded shares of `in`, each of seg.padded values, decoded and
// added in f32 in share order, divided by `divisor` (avg: the rank count; sum: 1): seg.padded
// floats into `sums`.
Status sumSegments(const Codec& codec, const std::byte* in, const Segments& seg, float divisor,
                   float* sums);

}  // namespace weft::fused::fp8
