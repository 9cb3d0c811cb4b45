// Element-wise arithmetic of the CPU executor: the reduction inside every recvReduce* step and the
// final division of avg. Results match the GPU kernel (src/device/reduce_kernel.cu) bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>

#include "weft/types.hpp"

namespace weft::exec {

// dst[i] = a[i] (op) b[i] for i < count. f16, bf16 and fp8 compute in float and round once to
// nearest even (fp8 saturates to its largest finite value); integers wrap; an f32 sum or product
// that is NaN is the GPU's canonical 0x7fffffff, not x86's payload. avg reduces as a sum:
// the caller divides once at the end (divide below). Floating min/max keep `a` unless `b` compares
// strictly smaller/larger, as the GPU kernel does, so a NaN in `a` survives and one in `b` does
// not. dst may be a or b (the same pointer); it must not partially overlap either.
void reduce(void* dst, const void* a, const void* b, std::size_t count, DataType type, RedOp op);

// dst[i] = src[i] / divisor, the last step of avg. Floating types divide in their compute
// precision (double for f64, float for the others, then round to nearest even); integers
// truncate toward zero. dst may be src. divisor must not be zero.
void divide(void* dst, const void* src, std::size_t count, DataType type, std::uint64_t divisor);

}  // namespace weft::exec
