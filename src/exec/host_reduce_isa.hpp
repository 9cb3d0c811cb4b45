// The instruction-set variants of the host reduction (host_reduce.cpp picks one): each is the
// same body, host_reduce_impl.hpp, compiled with its own flags into its own namespace.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "weft/types.hpp"

#if defined(__x86_64__)
#define WEFT_REDUCE_X86 1
#else
#define WEFT_REDUCE_X86 0
#endif

namespace weft::exec {

using ReduceFn = void (*)(void*, const void*, const void*, std::size_t, DataType, RedOp);
using DivideFn = void (*)(void*, const void*, std::size_t, DataType, std::uint64_t);

struct ReduceVariant {
  const char* name;
  bool runs;  // this CPU has the instructions
  ReduceFn reduce;
  DivideFn divide;
};

// Every variant built, the baseline first and the widest last.
const std::vector<ReduceVariant>& reduceVariants();
// The widest this CPU runs: what reduce() and divide() call.
const ReduceVariant& reduceVariant();

#define WEFT_DECLARE_REDUCE_ISA(isa)                                                     \
  namespace isa {                                                                        \
  void reduce(void* dst, const void* a, const void* b, std::size_t count, DataType type, \
              RedOp op);                                                                 \
  void divide(void* dst, const void* src, std::size_t count, DataType type,              \
              std::uint64_t divisor);                                                    \
  }
WEFT_DECLARE_REDUCE_ISA(baseline)
#if WEFT_REDUCE_X86
WEFT_DECLARE_REDUCE_ISA(avx2)
WEFT_DECLARE_REDUCE_ISA(avx512)
#endif
#undef WEFT_DECLARE_REDUCE_ISA

}  // namespace weft::exec
