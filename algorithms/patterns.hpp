// Pattern math: pure functions of (rank, nranks). No buffers, no transports.
#pragma once

#include <bit>
#include <cstdint>
#include <vector>

namespace weft::algo {

// (a mod n) in [0, n) for any a.
constexpr int mod(long long a, int n) {
  const long long m = a % n;
  return static_cast<int>(m < 0 ? m + n : m);
}

// Largest power of two <= x (x >= 1).
constexpr std::uint32_t pow2Floor(std::uint32_t x) {
  return x == 0 ? 0 : std::bit_floor(x);
}

// ceil(log2(x)) for x >= 1.
constexpr int ceilLog2(std::uint32_t x) {
  return x <= 1 ? 0 : static_cast<int>(std::bit_width(x - 1));
}

// Parent of position p in weft's in-order binary tree over positions [0, n): position 0 is the
// root and has one child; a position's height is its number of trailing zero bits, so odd
// positions are the leaves. p goes up to (p without its lowest bit) plus the next bit, or to
// (p without its lowest bit) when that is past the end. Returns -1 for the root.
constexpr int binaryTreeParent(int p, int n) {
  if (p == 0) return -1;
  const int low = p & -p;
  const int up = (p ^ low) | (low << 1);
  return up < n ? up : (p ^ low);
}

// Every rank but r, starting at r+1 and going round.
inline std::vector<int> allPeersOf(int r, int n) {
  std::vector<int> out;
  for (int k = 1; k < n; ++k) out.push_back(mod(r + k, n));
  return out;
}

// A round-robin schedule of m rounds on m players in which every round is an involution, every
// pair of distinct players meets in exactly one round and every player meets itself in one.
// Returns x's partner in round k. m even: round 0 is the identity and rounds 1..m-1 are the
// circle method's perfect matchings (reflection on m-1 players, the one it fixes meeting player
// m-1), so nobody idles while others exchange; m odd: round k reflects, x meets k - x, and the one
// player it fixes has its own round then.
constexpr int roundPartner(int x, int k, int m) {
  if (m % 2 == 1) return mod(k - x, m);
  if (k == 0) return x;
  const int last = m - 1;
  if (x == last) return k - 1;
  const int q = mod(2 * (k - 1) - x, last);
  return q == x ? last : q;
}

struct TreeNode {
  int parent = -1;
  std::vector<int> children;  // ascending
};

// The whole tree over positions [0, n), children derived from binaryTreeParent.
std::vector<TreeNode> binaryTree(int n);

}  // namespace weft::algo
