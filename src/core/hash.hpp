// FNV-1a over bytes: the runtime's ids and fingerprints (host ids, topologies, agreed settings)
// that ranks compare, not a guard against anyone choosing collisions.
#pragma once

#include <cstdint>
#include <string_view>

namespace weft {

inline std::uint64_t fnv1a(std::string_view s) {
  std::uint64_t h = 1469598103934665603ull;
  for (char ch : s) h = (h ^ static_cast<unsigned char>(ch)) * 1099511628211ull;
  return h;
}

}  // namespace weft
