// Host reduction and avg division: the body (host_reduce_impl.hpp) compiled for the baseline
// x86-64 (or whatever the target is), AVX2 and AVX-512, and the pick of the widest this CPU runs.
// The widths matter where the data are in cache: on the H200 machine's host (Xeon, AVX-512) a
// two-shot all-reduce of 1 MB over 8 ranks of 2 threads summed in 241 us with SSE2 and 82 us with
// AVX-512 (a float sum that keeps the GPU's canonical NaN), 3.6 against 1.3 ms at 16 MB.
#include "src/exec/host_reduce.hpp"

#include "src/exec/host_reduce_isa.hpp"

namespace weft::exec {

const std::vector<ReduceVariant>& reduceVariants() {
  static const std::vector<ReduceVariant> variants = [] {
    std::vector<ReduceVariant> v{{"baseline", true, baseline::reduce, baseline::divide}};
#if WEFT_REDUCE_X86
    __builtin_cpu_init();
    v.push_back({"avx2", __builtin_cpu_supports("avx2") != 0, avx2::reduce, avx2::divide});
    v.push_back({"avx512",
                 __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                     __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"),
                 avx512::reduce, avx512::divide});
#endif
    return v;
  }();
  return variants;
}

const ReduceVariant& reduceVariant() {
  static const ReduceVariant* const best = [] {
    const std::vector<ReduceVariant>& v = reduceVariants();
    for (auto it = v.rbegin(); it != v.rend(); ++it) {
      if (it->runs) return &*it;
    }
    return &v.front();
  }();
  return *best;
}

void reduce(void* dst, const void* a, const void* b, std::size_t count, DataType type, RedOp op) {
  reduceVariant().reduce(dst, a, b, count, type, op);
}

void divide(void* dst, const void* src, std::size_t count, DataType type, std::uint64_t divisor) {
  reduceVariant().divide(dst, src, count, type, divisor);
}

}  // namespace weft::exec
