// Size arithmetic shared by the executors and the transports.
#pragma once

#include <cstddef>

namespace weft {

// a / b rounded up (0 when b is 0).
constexpr std::size_t ceilDiv(std::size_t a, std::size_t b) {
  return b == 0 ? 0 : (a + b - 1) / b;
}

// a rounded up to a multiple of m (0 when m is 0).
constexpr std::size_t roundUp(std::size_t a, std::size_t m) {
  return ceilDiv(a, m) * m;
}

}  // namespace weft
