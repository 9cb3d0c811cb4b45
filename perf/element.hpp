// What weft-perf needs to know of each DataType to make data and predict results: its storage,
// its conversions from and to double, and how weft finishes an average. One dispatch template
// (withElement) turns a runtime DataType into these traits.
#pragma once

#include <cstdint>
#include <type_traits>

#include "src/exec/numeric.hpp"
#include "weft/types.hpp"

namespace weft::perf {

// Integer types: weft's sums and products wrap, and avg truncates toward zero.
template <typename T>
struct IntegerElement {
  using Storage = T;
  static constexpr bool kFloating = false;
  static Storage average(Storage sum, int nranks) {
    if constexpr (std::is_signed_v<T>) {
      return static_cast<T>(static_cast<std::int64_t>(sum) / nranks);
    } else {
      return static_cast<T>(static_cast<std::uint64_t>(sum) / static_cast<std::uint64_t>(nranks));
    }
  }
};

// Floating types. kPrecision is the significand's bits (the implicit one included): integers up
// to 2^kPrecision are exact. fromDouble rounds to nearest even; average divides as the library
// does (in double for f64, in float for every other floating type).
struct F64 {
  using Storage = double;
  static constexpr bool kFloating = true;
  static constexpr int kPrecision = 53;
  static double toDouble(double v) { return v; }
  static double fromDouble(double v) { return v; }
  static double average(double sum, int nranks) { return sum / nranks; }
};

struct F32 {
  using Storage = float;
  static constexpr bool kFloating = true;
  static constexpr int kPrecision = 24;
  static double toDouble(float v) { return v; }
  static float fromDouble(double v) { return static_cast<float>(v); }
  static float average(float sum, int nranks) { return sum / static_cast<float>(nranks); }
};

// f16, bf16 and fp8 through the library's own conversions (src/exec/numeric.hpp), so rounding
// and saturation match what the reduction stores. Values pass through float, which holds every
// value these types have.
template <typename S, int Precision, float (*Load)(S), S (*Store)(float)>
struct NarrowElement {
  using Storage = S;
  static constexpr bool kFloating = true;
  static constexpr int kPrecision = Precision;
  static double toDouble(S v) { return Load(v); }
  static S fromDouble(double v) { return Store(static_cast<float>(v)); }
  static S average(S sum, int nranks) { return Store(Load(sum) / static_cast<float>(nranks)); }
};

using F16 = NarrowElement<std::uint16_t, 11, exec::halfToFloat, exec::floatToHalf>;
using Bf16 = NarrowElement<std::uint16_t, 8, exec::bf16ToFloat, exec::floatToBf16>;
using E4m3 = NarrowElement<std::uint8_t, 4, exec::e4m3ToFloat, exec::floatToE4m3>;
using E5m2 = NarrowElement<std::uint8_t, 3, exec::e5m2ToFloat, exec::floatToE5m2>;

// Calls fn with a value of the traits type of `t`.
template <typename Fn>
decltype(auto) withElement(DataType t, Fn&& fn) {
  switch (t) {
    case DataType::f64:
      return fn(F64{});
    case DataType::f32:
      return fn(F32{});
    case DataType::f16:
      return fn(F16{});
    case DataType::bf16:
      return fn(Bf16{});
    case DataType::f8e4m3:
      return fn(E4m3{});
    case DataType::f8e5m2:
      return fn(E5m2{});
    case DataType::i8:
      return fn(IntegerElement<std::int8_t>{});
    case DataType::u8:
      return fn(IntegerElement<std::uint8_t>{});
    case DataType::i32:
      return fn(IntegerElement<std::int32_t>{});
    case DataType::u32:
      return fn(IntegerElement<std::uint32_t>{});
    case DataType::i64:
      return fn(IntegerElement<std::int64_t>{});
    case DataType::u64:
      break;
  }
  return fn(IntegerElement<std::uint64_t>{});
}

}  // namespace weft::perf
