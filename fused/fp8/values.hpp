// Element i of a bf16, f16 or f32 buffer as a float, and back (rounded to nearest even): what the
// codecs and the compressed collectives read and write on the host.
#pragma once

#include <cstddef>
#include <cstdint>

#include "src/exec/numeric.hpp"
#include "weft/types.hpp"

namespace weft::fused::fp8 {

inline float loadValue(DataType type, const void* in, std::size_t i) {
  switch (type) {
    case DataType::f32:
      return static_cast<const float*>(in)[i];
    case DataType::f16:
      return exec::halfToFloat(static_cast<const std::uint16_t*>(in)[i]);
    default:  // bf16
      return exec::bf16ToFloat(static_cast<const std::uint16_t*>(in)[i]);
  }
}

inline void storeValue(DataType type, void* out, std::size_t i, float v) {
  switch (type) {
    case DataType::f32:
      static_cast<float*>(out)[i] = v;
      break;
    case DataType::f16:
      static_cast<std::uint16_t*>(out)[i] = exec::floatToHalf(v);
      break;
    default:  // bf16
      static_cast<std::uint16_t*>(out)[i] = exec::floatToBf16(v);
      break;
  }
}

}  // namespace weft::fused::fp8
