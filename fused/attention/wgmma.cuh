// Hopper's warpgroup matrix multiply (wgmma, sm_90a) for the attention kernels: shared-memory
// matrix descriptors of 128-byte-swizzled tiles, the fences, and m64nNk16 products with f32
// accumulators. A tile of R rows × D values lies as D/64 column blocks of R rows × 128 bytes,
// each row's eight 16-byte chunks XOR-swizzled by row % 8 (the pattern wgmma's descriptor names);
// blocks 1024-byte aligned. PTX ISA, "Matrix Descriptor Format" and "Asynchronous Warpgroup
// Level Matrix Multiply-Accumulate".
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace weft::fused::attention {

// Element offset of row r's value c in such a tile of R rows.
template <int R>
__device__ __forceinline__ int swizzled128(int r, int c) {
  const int chunk = c / 8;
  return (chunk / 8) * R * 64 + r * 64 + ((chunk % 8) ^ (r % 8)) * 8 + c % 8;
}

// A descriptor of the tile at shared address `at`: `leading` and `stride` byte offsets (K-major:
// stride the 8-row groups' 1024; N-major: leading the column blocks', stride the 8-row groups').
__device__ __forceinline__ std::uint64_t descriptor(std::uint32_t at, std::uint32_t leading,
                                                    std::uint32_t stride) {
  return static_cast<std::uint64_t>((at & 0x3FFFF) >> 4) |
         static_cast<std::uint64_t>(leading >> 4) << 16 |
         static_cast<std::uint64_t>(stride >> 4) << 32 | 1ull << 62;  // 128-byte swizzle
}

// Before a warpgroup's products read registers others wrote; then commit them as a group; wait
// until at most N groups are in flight.
__device__ __forceinline__ void wgmmaFence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Shared memory written by the threads (cp.async, stores) made visible to wgmma's reads.
__device__ __forceinline__ void sharedToAsyncProxy() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

#define WEFT_WGMMA_D64                                                                          \
  "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),     \
      "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), \
      "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), \
      "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
      "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), \
      "+f"(d[7][2]), "+f"(d[7][3])
#define WEFT_WGMMA_R64                                                                          \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
#define WEFT_WGMMA_D128                                                                           \
  "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),       \
      "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),   \
      "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),   \
      "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),   \
      "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),   \
      "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),   \
      "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), \
      "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]),             \
      "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]),             \
      "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]),             \
      "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]),             \
      "+f"(d[15][2]), "+f"(d[15][3])
#define WEFT_WGMMA_R128                                                                         \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "  \
  "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "  \
  "%56, %57, %58, %59, %60, %61, %62, %63}, "

// d (64 × N) = A · B (+ d where `accumulate`), N 64 or 128: A [64 × 16] and B [16 × N] in shared
// memory, both K-major (descriptors).
template <typename T, int N>
__device__ __forceinline__ void wgmmaSS(float (&d)[N / 8][4], std::uint64_t a, std::uint64_t b,
                                        int accumulate) {
  constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  if constexpr (N == 64 && kBf16) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " WEFT_WGMMA_R64
        "%32, %33, p, 1, 1, 0, 0;\n}\n"
        : WEFT_WGMMA_D64
        : "l"(a), "l"(b), "r"(accumulate));
  } else if constexpr (N == 64) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " WEFT_WGMMA_R64
        "%32, %33, p, 1, 1, 0, 0;\n}\n"
        : WEFT_WGMMA_D64
        : "l"(a), "l"(b), "r"(accumulate));
  } else if constexpr (kBf16) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " WEFT_WGMMA_R128
        "%64, %65, p, 1, 1, 0, 0;\n}\n"
        : WEFT_WGMMA_D128
        : "l"(a), "l"(b), "r"(accumulate));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " WEFT_WGMMA_R128
        "%64, %65, p, 1, 1, 0, 0;\n}\n"
        : WEFT_WGMMA_D128
        : "l"(a), "l"(b), "r"(accumulate));
  }
}

// d (64 × N) = a · B (+ d where `accumulate`), N 64 or 128: a [64 × 16] in registers (each warp
// its 16 rows, as mma.sync's A fragments) and B [16 × N] in shared memory, N-major (descriptor).
template <typename T, int N>
__device__ __forceinline__ void wgmmaRS(float (&d)[N / 8][4], const std::uint32_t (&a)[4],
                                        std::uint64_t b, int accumulate) {
  constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  if constexpr (N == 64 && kBf16) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " WEFT_WGMMA_R64
        "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
        : WEFT_WGMMA_D64
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
  } else if constexpr (N == 64) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " WEFT_WGMMA_R64
        "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
        : WEFT_WGMMA_D64
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
  } else if constexpr (kBf16) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " WEFT_WGMMA_R128
        "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
        : WEFT_WGMMA_D128
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " WEFT_WGMMA_R128
        "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
        : WEFT_WGMMA_D128
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
  }
}

#undef WEFT_WGMMA_D64
#undef WEFT_WGMMA_R64
#undef WEFT_WGMMA_D128
#undef WEFT_WGMMA_R128

}  // namespace weft::fused::attention
