// SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), for the rendezvous' challenge-response: the
// id's secret proves itself without crossing the wire. Internal to src/bootstrap.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>

namespace weft::boot::detail {

using Digest = std::array<unsigned char, 32>;

class Sha256 {
 public:
  Sha256();
  void update(const void* data, std::size_t bytes);
  Digest finish();

 private:
  void block(const unsigned char* p);
  std::array<std::uint32_t, 8> h_;
  std::array<unsigned char, 64> buf_{};
  std::size_t used_ = 0;
  std::uint64_t total_ = 0;
};

Digest sha256(const void* data, std::size_t bytes);

// HMAC-SHA256 of the concatenation of `parts` under `key`.
struct Part {
  const void* data;
  std::size_t bytes;
};
Digest hmacSha256(const void* key, std::size_t keyBytes, std::initializer_list<Part> parts);

// Compares in time independent of where the first difference is.
bool sameDigest(const unsigned char* a, const unsigned char* b, std::size_t bytes);

}  // namespace weft::boot::detail
