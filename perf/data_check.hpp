// The data of a checked run. Every rank fills its input from (seed, rank, element index) alone,
// so any rank can compute any other rank's input, and so the expected output of any collective,
// without communicating. Outputs are poisoned before the run; the check counts the elements
// that are not what they must be (nccl-tests' #wrong).
//
// Inputs are chosen so that most results are exact whatever order the algorithm reduces in:
//   integers      any values: sums and products wrap, which is exact in every order; avg is the
//                 wrapped sum divided by nranks, truncated (the library's definition).
//   float sum/avg multiples of 1/4 up to J/4 with J = min(4096, 2^p / nranks), p the significand
//                 bits (53, 24, 11, 8, 4, 3): every partial sum is then representable, so the
//                 result is exact; avg divides that exact sum as the library does.
//                 When nranks > 2^p (bf16 past 256 ranks, fp8 past 16 or 8) no such grid exists:
//                 J = 1 and an element is wrong when |got - exact| > nranks * eps * sum|x_r|
//                 (eps = 2^(1-p)); avg divides that bound by nranks and adds one eps.
//   float prod    +-1 and +-2 only: magnitudes never fall, so overflow (inf, or fp8's saturation)
//                 happens in every order or in none; the result is exact.
//   min, max      exact; copies (gather, broadcast, all-to-all, send/receive) are compared bit
//                 for bit and never equal the poison.
// Poison: 0xFF bytes for floating types (a NaN in every format, never a correct result), 0xCD
// bytes for integer types.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "weft/types.hpp"

namespace weft::perf {

// What one range of a rank's output must hold.
struct Expect {
  enum class Kind {
    reduced,   // element i: op over every rank's input element srcBegin + i
    copied,    // element i: rank srcRank's input element srcBegin + i
    poisoned,  // untouched since the poisoning
  };
  Kind kind = Kind::reduced;
  std::size_t outBegin = 0;  // first output element of the range
  std::size_t length = 0;
  int srcRank = 0;
  std::size_t srcBegin = 0;
};

// How far a lossy run's outputs (--compress) lie from the exact results, in double: the largest
// and summed |got - exact| and |exact|, and the outputs that are not finite where the exact
// result is (or that still hold the poison).
struct Deviation {
  double maxError = 0, sumError = 0, maxExact = 0, sumExact = 0;
  std::int64_t notFinite = 0;
  void add(const Deviation& o);
  // max |got - exact| / max |exact| and mean |got - exact| / mean |exact|.
  double maxRelative() const { return maxExact > 0 ? maxError / maxExact : 0; }
  double meanRelative() const { return sumExact > 0 ? sumError / sumExact : 0; }
};

class DataCheck {
 public:
  // op: the collective's reduction, or nothing for a collective that only copies.
  DataCheck(DataType type, std::optional<RedOp> op, int nranks, std::uint64_t seed);

  // buf[i] = rank's input element first + i, for i < count.
  void fill(void* buf, std::size_t count, int rank, std::size_t first) const;
  void poison(void* buf, std::size_t count) const;
  // Elements of out[e.outBegin, e.outBegin + e.length) that differ from e.
  std::int64_t wrong(const void* out, const Expect& e) const;
  // The deviation of out[e.outBegin, e.outBegin + e.length) from e's exact values (sum and avg
  // of floating types, and copies).
  Deviation deviation(const void* out, const Expect& e) const;
  // Whether results are compared exactly (see the header comment for when they are not).
  bool exact() const { return exact_; }

 private:
  template <typename E>
  typename E::Storage input(int rank, std::size_t index) const;
  template <typename E>
  std::int64_t wrongAs(const void* out, const Expect& e) const;
  template <typename E>
  Deviation deviationAs(const void* out, const Expect& e) const;
  template <typename E>
  bool reducedIsWrong(typename E::Storage got, std::size_t index) const;

  DataType type_;
  std::optional<RedOp> op_;
  int nranks_;
  std::vector<std::uint64_t> rankKeys_;  // per rank: the hash key its inputs are drawn from
  std::int64_t grid_ = 1;                // J: floating inputs are j/4 with |j| <= J
  bool exact_ = true;
};

}  // namespace weft::perf
