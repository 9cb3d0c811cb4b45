// Block-scaled fp8 codecs: bf16, f16 or f32 values as fp8 elements (E4M3 or E5M2, the OCP 8-bit
// formats) plus one scale per block. Two schemes (docs/algorithms.md, "FP8 codecs"):
//   e8m0 scales, blocks of 32 (MX-style, OCP Microscaling v1.0): a power of two per block;
//   f32 scales, blocks of 128 (DeepSeek-V3 style): the block's largest magnitude over the
//   element's largest finite value.
// Either way the scale is chosen so that no finite element saturates, elements round to nearest
// even, and a block holding NaN or an infinity is marked not finite (its scale NaN), so every
// value of it decodes to NaN: reported, never hidden. The host codec here is the reference the
// device codec must match bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "weft/status.hpp"
#include "weft/types.hpp"

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
  // The element format's largest finite value (448 or 57344), smallest normal exponent and
  // mantissa bits: what the error bound is made of.
  float maxFinite() const { return element == Element::e4m3 ? 448.0f : 57344.0f; }
  int minExponent() const { return element == Element::e4m3 ? -6 : -14; }
  int mantissaBits() const { return element == Element::e4m3 ? 3 : 2; }

  // The most encode-then-decode (to f32) may move a finite value x of a block whose scale is
  // `blockScale`: half a unit in the last place of x / scale, or of the element's smallest normal
  // where x / scale is subnormal, times the scale.
  double errorBound(double x, double blockScale) const;
};

// Which input types a codec takes: bf16, f16 and f32.
bool encodable(DataType type);

// Encodes `count` values of `type` at `in` into `out` (codec.encodedBytes(count) bytes).
Status encode(const Codec& codec, DataType type, const void* in, std::size_t count, std::byte* out);
// Decodes what encode wrote back into `count` values of `type`, rounded to nearest even.
Status decode(const Codec& codec, DataType type, const std::byte* in, std::size_t count, void* out);
// One block's scale as a float (NaN where the block was not finite), for tests and tools.
float scaleOf(const Codec& codec, const std::byte* encoded, std::size_t count, std::size_t block);

}  // namespace weft::fused::fp8
