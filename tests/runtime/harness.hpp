// Shared by the runtime tests: typed element access for every DataType, fresh random inputs, a
// double-precision reference, poisoned outputs, and running one function per rank on threads.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "src/exec/numeric.hpp"
#include "weft/types.hpp"
#include "weft/weft.hpp"

namespace weft::test {

// Element i of a buffer of `type`, as a double.
inline double load(const std::vector<std::byte>& buf, std::size_t i, DataType type) {
  const std::byte* p = buf.data() + i * sizeOf(type);
  auto as = [&](auto v) {
    std::memcpy(&v, p, sizeof v);
    return v;
  };
  switch (type) {
    case DataType::f64:
      return as(double{});
    case DataType::f32:
      return as(float{});
    case DataType::f16:
      return exec::halfToFloat(as(std::uint16_t{}));
    case DataType::bf16:
      return exec::bf16ToFloat(as(std::uint16_t{}));
    case DataType::f8e4m3:
      return exec::e4m3ToFloat(as(std::uint8_t{}));
    case DataType::f8e5m2:
      return exec::e5m2ToFloat(as(std::uint8_t{}));
    case DataType::i8:
      return as(std::int8_t{});
    case DataType::u8:
      return as(std::uint8_t{});
    case DataType::i32:
      return as(std::int32_t{});
    case DataType::u32:
      return as(std::uint32_t{});
    case DataType::i64:
      return static_cast<double>(as(std::int64_t{}));
    case DataType::u64:
      return static_cast<double>(as(std::uint64_t{}));
  }
  return 0;
}

// Stores v (already representable, or rounded) as element i.
inline void store(std::vector<std::byte>& buf, std::size_t i, DataType type, double v) {
  std::byte* p = buf.data() + i * sizeOf(type);
  auto put = [&](auto x) { std::memcpy(p, &x, sizeof x); };
  switch (type) {
    case DataType::f64:
      put(v);
      break;
    case DataType::f32:
      put(static_cast<float>(v));
      break;
    case DataType::f16:
      put(exec::floatToHalf(static_cast<float>(v)));
      break;
    case DataType::bf16:
      put(exec::floatToBf16(static_cast<float>(v)));
      break;
    case DataType::f8e4m3:
      put(exec::floatToE4m3(static_cast<float>(v)));
      break;
    case DataType::f8e5m2:
      put(exec::floatToE5m2(static_cast<float>(v)));
      break;
    case DataType::i8:
      put(static_cast<std::int8_t>(v));
      break;
    case DataType::u8:
      put(static_cast<std::uint8_t>(v));
      break;
    case DataType::i32:
      put(static_cast<std::int32_t>(v));
      break;
    case DataType::u32:
      put(static_cast<std::uint32_t>(v));
      break;
    case DataType::i64:
      put(static_cast<std::int64_t>(v));
      break;
    case DataType::u64:
      put(static_cast<std::uint64_t>(v));
      break;
  }
}

// Random inputs every type holds exactly, in ranges where sums and products of a few ranks stay
// meaningful: floats in [-1, 1] ([0.5, 1.5] for products), integers small.
inline std::vector<std::byte> randomBuffer(std::size_t count, DataType type, RedOp op,
                                           std::mt19937_64& rng) {
  std::vector<std::byte> buf(count * sizeOf(type));
  std::uniform_real_distribution<double> real(op == RedOp::prod ? 0.5 : -1.0,
                                              op == RedOp::prod ? 1.5 : 1.0);
  std::uniform_int_distribution<int> small(0, 60);
  const bool isSigned = type == DataType::i8 || type == DataType::i32 || type == DataType::i64;
  for (std::size_t i = 0; i < count; ++i) {
    if (isFloating(type)) {
      store(buf, i, type, real(rng));
    } else {
      const int v = op == RedOp::prod ? 1 + small(rng) % 3 : small(rng) - (isSigned ? 30 : 0);
      store(buf, i, type, v);
    }
  }
  return buf;
}

// The poison every output starts as: 0xA5 bytes (a NaN-free, recognisable pattern).
inline std::vector<std::byte> poisoned(std::size_t bytes) {
  return std::vector<std::byte>(bytes, std::byte{0xA5});
}

// How a floating type rounds (both 0 for integers: exact): the unit roundoff of one step, and
// the gap between zero and the smallest subnormal (rounding near zero is absolute, not relative).
struct Rounding {
  double unit = 0;
  double smallest = 0;
};

inline Rounding roundingOf(DataType t) {
  switch (t) {
    case DataType::f64:
      return {0x1p-52, 0x1p-1074};
    case DataType::f32:
      return {0x1p-23, 0x1p-149};
    case DataType::f16:
      return {0x1p-10, 0x1p-24};
    case DataType::bf16:
      return {0x1p-7, 0x1p-133};
    case DataType::f8e4m3:
      return {0x1p-3, 0x1p-9};
    case DataType::f8e5m2:
      return {0x1p-2, 0x1p-16};
    default:
      return {};
  }
}

// Integers wrap in their type: the reference is computed in the type's own arithmetic.
inline double wrap(double v, DataType t) {
  switch (t) {
    case DataType::i8:
      return static_cast<std::int8_t>(static_cast<std::int64_t>(v));
    case DataType::u8:
      return static_cast<std::uint8_t>(static_cast<std::int64_t>(v));
    case DataType::i32:
      return static_cast<std::int32_t>(static_cast<std::int64_t>(v));
    case DataType::u32:
      return static_cast<std::uint32_t>(static_cast<std::int64_t>(v));
    default:
      return v;
  }
}

// The reduction of `values` (one per rank, in rank order) and the error it may carry: each of
// the n-1 combining steps rounds once, and avg rounds once more.
struct Expected {
  double value;
  double tolerance;
};

inline Expected reference(const std::vector<double>& values, DataType t, RedOp op) {
  const double n = static_cast<double>(values.size());
  double v = values[0], scale = std::fabs(values[0]);
  for (std::size_t i = 1; i < values.size(); ++i) {
    const double x = values[i];
    switch (op) {
      case RedOp::sum:
      case RedOp::avg:
        v = wrap(v + x, t);
        scale += std::fabs(x);
        break;
      case RedOp::prod:
        v = wrap(v * x, t);
        scale = std::fabs(v);
        break;
      case RedOp::min:
        v = std::min(v, x);
        break;
      case RedOp::max:
        v = std::max(v, x);
        break;
    }
  }
  if (op == RedOp::avg) {
    if (isFloating(t)) {
      v /= n;
      scale /= n;
    } else {
      v = std::trunc(v / n);
    }
  }
  const Rounding r = roundingOf(t);
  const double steps = n + (op == RedOp::avg ? 1 : 0);
  return {v, steps * (2 * r.unit * std::max(scale, std::fabs(v)) + r.smallest)};
}

// Runs fn(rank) on one thread per rank and waits for all.
inline void onEveryRank(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(fn, r);
  for (std::thread& t : threads) t.join();
}

}  // namespace weft::test
