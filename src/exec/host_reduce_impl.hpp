// The body of the host reduction and avg division, compiled once per instruction set
// (host_reduce_*.cpp define WEFT_REDUCE_ISA, the namespace it lands in): one templated body per
// operation, instantiated for every dtype through a single dtype switch and a single op switch.
// Nothing here may depend on the instruction set's arithmetic: every variant gives the same bits
// (the files are compiled without FMA contraction; tests/unit/test_host_reduce.cpp compares them).
#include <bit>
#include <cassert>
#include <cstring>
#include <type_traits>

#include "src/exec/host_reduce.hpp"
#include "src/exec/numeric.hpp"

#ifndef WEFT_REDUCE_ISA
#error "define WEFT_REDUCE_ISA before including host_reduce_impl.hpp"
#endif

namespace weft::exec::WEFT_REDUCE_ISA {
namespace {

// How a dtype is stored and widened for its arithmetic. The narrow floats compute in float, like
// the GPU kernel, and round once on store.
template <typename T>
struct Plain {
  using Storage = T;
  static T load(T v) { return v; }
  static T store(T v) { return v; }
};

template <typename S, float (*Load)(S), S (*Store)(float)>
struct Narrow {
  using Storage = S;
  static float load(S v) { return Load(v); }
  static S store(float v) { return Store(v); }
};

using Half = Narrow<std::uint16_t, halfToFloat, floatToHalf>;
using Bf16 = Narrow<std::uint16_t, bf16ToFloat, floatToBf16>;
using E4m3 = Narrow<std::uint8_t, e4m3ToFloat, floatToE4m3>;
using E5m2 = Narrow<std::uint8_t, e5m2ToFloat, floatToE5m2>;

// Integer sums and products wrap. Signed overflow is undefined in C++, and narrow types would
// promote to (signed) int, so the arithmetic runs in an unsigned type at least as wide as
// unsigned int; converting back is modular since C++20.
template <typename C, bool = std::is_integral_v<C>>
struct Wrapping {
  using type = C;
};
template <typename C>
struct Wrapping<C, true> {
  using type = std::make_unsigned_t<decltype(C{} + 0u)>;
};

// NVIDIA's fp32 add and multiply return the canonical NaN 0x7fffffff whatever the operands'
// payloads, where x86 keeps an operand's payload. For fp64 both keep it (as seen on an H200).
template <typename C>
C asGpuArithmetic(C r) {
  if constexpr (std::is_same_v<C, float>) {
    return r != r ? std::bit_cast<float>(0x7fffffffu) : r;
  } else {
    return r;
  }
}

struct Sum {
  template <typename C>
  static C apply(C x, C y) {
    using W = typename Wrapping<C>::type;
    return asGpuArithmetic(static_cast<C>(static_cast<W>(x) + static_cast<W>(y)));
  }
};
struct Prod {
  template <typename C>
  static C apply(C x, C y) {
    using W = typename Wrapping<C>::type;
    return asGpuArithmetic(static_cast<C>(static_cast<W>(x) * static_cast<W>(y)));
  }
};
// The GPU kernel's comparisons, not fminf/fmaxf: with a NaN the comparison is false and x wins.
struct Min {
  template <typename C>
  static C apply(C x, C y) {
    return y < x ? y : x;
  }
};
struct Max {
  template <typename C>
  static C apply(C x, C y) {
    return x < y ? y : x;
  }
};

// dst[i] = element(i) in blocks of one cache line. Within a block every load comes before any
// store, so dst may be an input; and a fixed-length inner loop over a local array is what GCC
// vectorizes at -O2, whose cost model neither versions loops for aliasing nor adds epilogues.
template <typename S, typename Element>
void forEachElement(S* dst, std::size_t count, Element element) {
  constexpr std::size_t kBlock = 64 / sizeof(S);
  std::size_t i = 0;
  for (; i + kBlock <= count; i += kBlock) {
    S block[kBlock];
    for (std::size_t k = 0; k < kBlock; ++k) block[k] = element(i + k);
    std::memcpy(dst + i, block, sizeof block);
  }
  for (; i < count; ++i) dst[i] = element(i);
}

template <typename Codec, typename Op>
void reduceAs(void* dst, const void* a, const void* b, std::size_t count) {
  using S = typename Codec::Storage;
  const auto* x = static_cast<const S*>(a);
  const auto* y = static_cast<const S*>(b);
  forEachElement(static_cast<S*>(dst), count, [x, y](std::size_t i) {
    return Codec::store(Op::apply(Codec::load(x[i]), Codec::load(y[i])));
  });
}

template <typename C>
C quotient(C x, std::uint64_t divisor) {
  if constexpr (std::is_floating_point_v<C>) {
    return x / static_cast<C>(divisor);
  } else if constexpr (std::is_signed_v<C>) {
    // Divide magnitudes in 64 bits: exact for every divisor and no overflow at the minimum value.
    const auto u = static_cast<std::uint64_t>(x);
    const std::uint64_t q = (x < 0 ? 0 - u : u) / divisor;
    return static_cast<C>(x < 0 ? 0 - q : q);
  } else {
    return static_cast<C>(x / divisor);
  }
}

template <typename Codec>
void divideAs(void* dst, const void* src, std::size_t count, std::uint64_t divisor) {
  using S = typename Codec::Storage;
  const auto* x = static_cast<const S*>(src);
  forEachElement(static_cast<S*>(dst), count, [x, divisor](std::size_t i) {
    return Codec::store(quotient(Codec::load(x[i]), divisor));
  });
}

// The one dtype switch: calls fn with a value of the dtype's codec type.
template <typename Fn>
void withCodec(DataType type, Fn&& fn) {
  switch (type) {
    case DataType::f64:
      return fn(Plain<double>{});
    case DataType::f32:
      return fn(Plain<float>{});
    case DataType::f16:
      return fn(Half{});
    case DataType::bf16:
      return fn(Bf16{});
    case DataType::f8e4m3:
      return fn(E4m3{});
    case DataType::f8e5m2:
      return fn(E5m2{});
    case DataType::i8:
      return fn(Plain<std::int8_t>{});
    case DataType::u8:
      return fn(Plain<std::uint8_t>{});
    case DataType::i32:
      return fn(Plain<std::int32_t>{});
    case DataType::u32:
      return fn(Plain<std::uint32_t>{});
    case DataType::i64:
      return fn(Plain<std::int64_t>{});
    case DataType::u64:
      return fn(Plain<std::uint64_t>{});
  }
  assert(false && "invalid DataType");
}

// The one op switch. avg reduces as a sum; divide() finishes it.
template <typename Fn>
void withOp(RedOp op, Fn&& fn) {
  switch (op) {
    case RedOp::sum:
    case RedOp::avg:
      return fn(Sum{});
    case RedOp::prod:
      return fn(Prod{});
    case RedOp::min:
      return fn(Min{});
    case RedOp::max:
      return fn(Max{});
  }
  assert(false && "invalid RedOp");
}

}  // namespace

void reduce(void* dst, const void* a, const void* b, std::size_t count, DataType type, RedOp op) {
  withCodec(type, [&](auto codec) {
    withOp(op, [&](auto reduction) {
      reduceAs<decltype(codec), decltype(reduction)>(dst, a, b, count);
    });
  });
}

void divide(void* dst, const void* src, std::size_t count, DataType type, std::uint64_t divisor) {
  assert(divisor != 0);
  withCodec(type, [&](auto codec) { divideAs<decltype(codec)>(dst, src, count, divisor); });
}

}  // namespace weft::exec::WEFT_REDUCE_ISA
