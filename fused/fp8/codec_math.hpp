// The scale arithmetic both codecs share (codec.cpp on the host, codec_kernel.cu on the device),
// written once so that they agree bit for bit.
#pragma once

#include <math.h>

#if defined(__CUDACC__)
#define WEFT_FP8_HD __host__ __device__
#else
#define WEFT_FP8_HD
#endif

namespace weft::fused::fp8 {

// The smallest k with amax / 2^k <= the element's largest finite value, in E8M0's [-127, 127].
// That value is 0.875 * 2^9 (E4M3's 448) or 0.875 * 2^16 (E5M2's 57344); with amax = m 2^e,
// m in [0.5, 1), k is e - 9 (or - 16), one more where m exceeds 0.875.
WEFT_FP8_HD inline int e8m0Exponent(float amax, bool e4m3) {
  if (amax == 0) return 0;
  int e = 0;
  const float m = frexpf(amax, &e);
  const int k = e - (e4m3 ? 9 : 16) + (m > 0.875f ? 1 : 0);
  return k < -127 ? -127 : k > 127 ? 127 : k;
}

// amax / maxFinite, rounded up where the float division back would exceed maxFinite.
WEFT_FP8_HD inline float f32Scale(float amax, float maxFinite) {
  if (amax == 0) return 1.0f;
  float s = amax / maxFinite;
  if (s == 0) s = 1.401298464e-45f;  // the smallest subnormal
  while (amax / s > maxFinite) s = nextafterf(s, 3.402823466e+38f);
  return s;
}

// Whether a block's values are multiplied by its f32 scale's reciprocal: unless the scale is so
// small (below 2^-128, a block of subnormals) that the reciprocal overflows; those divide.
WEFT_FP8_HD inline bool reciprocalFinite(float inverse) {
  return inverse <= 3.402823466e+38f;
}

}  // namespace weft::fused::fp8
