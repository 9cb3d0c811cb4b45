// The tensor-core attention kernels' pieces (local*.cu, backward*.cu): a part's span of a
// sequence, a block of queries and its keys, shared-memory tiles of D-value rows in 16-byte chunks
// XOR-swizzled by row (ldmatrix's eight rows fall in distinct banks), cp.async loads, ldmatrix,
// mma.sync m16n8k16 with f32 accumulators, and the quad reductions of its accumulator layout.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "fused/attention/ring_plan.hpp"
#include "fused/cuda_steps.hpp"
#include "weft/status.hpp"
#include "weft/types.hpp"

namespace weft::fused::attention {

constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

struct Span {
  int lo, hi;  // within the sequence
};

__device__ inline Span partOf(Part p, int length) {
  const int half = length / 2;
  if (p == Part::first) return {0, half};
  if (p == Part::second) return {half, length};
  return {0, length};
}

// A block's R queries of one sequence and head (blockIdx: tile, head, sequence) and the keys
// they attend: pointers at the part's first query row of the block and first key, rows ld apart.
template <typename T, int D>
struct QueryBlock {
  const T *q, *k, *v;
  std::size_t at;  // q's offset (elements): the block's first row's, of its head
  std::size_t ldq, ldk;
  std::size_t first;  // the part's first token
  int qLen;           // the part's queries
  int r0, rows;       // the block's first row within the part, and its rows
  int keyEnd;         // the keys it attends: 0..keyEnd-1 of the part
  int head;
};
// False where the sequence has no such block. Call: LocalAttention or LocalBackward.
template <typename T, int D, typename Call>
__device__ __forceinline__ bool queryBlock(const Call& a, int R, QueryBlock<T, D>& b) {
  const int seq = static_cast<int>(blockIdx.z);
  b.head = static_cast<int>(blockIdx.y);
  const int bq = a.cuSeqlensQ[seq], bk = a.cuSeqlensK[seq];
  const Span qp = partOf(a.piece.q, a.cuSeqlensQ[seq + 1] - bq);
  const Span kp = partOf(a.piece.kv, a.cuSeqlensK[seq + 1] - bk);
  b.qLen = qp.hi - qp.lo;
  const int kLen = kp.hi - kp.lo, tiles = (b.qLen + R - 1) / R;
  if (static_cast<int>(blockIdx.x) >= tiles) return false;
  // Under the mask the last tiles have the most keys: first.
  const int tile =
      a.piece.causal ? tiles - 1 - static_cast<int>(blockIdx.x) : static_cast<int>(blockIdx.x);
  b.r0 = tile * R, b.rows = min(R, b.qLen - b.r0);
  b.keyEnd = max(a.piece.causal ? min(kLen, b.r0 + b.rows) : kLen, 0);
  const int kvHead = b.head / (a.heads / a.kvHeads);
  b.ldq = static_cast<std::size_t>(a.heads) * D;
  b.ldk = static_cast<std::size_t>(a.kvHeads) * D;
  b.first = static_cast<std::size_t>(bq + qp.lo);
  b.at = ((b.first + b.r0) * a.heads + b.head) * D;
  b.q = static_cast<const T*>(a.q) + b.at;
  const std::size_t key0 = static_cast<std::size_t>(bk + kp.lo);
  b.k = static_cast<const T*>(a.k) + (key0 * a.kvHeads + kvHead) * D;
  b.v = static_cast<const T*>(a.v) + (key0 * a.kvHeads + kvHead) * D;
  return true;
}

// A tile of `rows` rows of D values in shared memory: element offset of row r's chunk c.
template <int D>
__device__ __forceinline__ int swizzled(int r, int c) {
  return (r * (D / 8) + (c ^ (r & 7))) * 8;
}

__device__ __forceinline__ std::uint32_t sharedAddress(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

// `rows` rows of D values from g (rows ld values apart) into s at where(row, 16-byte chunk)
// elements; rows from `valid` on zeroed.
template <int D, int Threads, typename T, typename Where>
__device__ __forceinline__ void loadRows(T* s, const T* g, std::size_t ld, int rows, int valid,
                                         Where where) {
  constexpr int kChunks = D / 8;
  for (int x = static_cast<int>(threadIdx.x); x < rows * kChunks; x += Threads) {
    const int r = x / kChunks, c = x % kChunks;
    const bool in = r < valid;
    const T* src = in ? g + static_cast<std::size_t>(r) * ld + c * 8 : g;
    asm volatile(
        "cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(sharedAddress(s + where(r, c))),
        "l"(src), "r"(in ? 16 : 0));
  }
  asm volatile("cp.async.commit_group;\n" ::);
}
// The same into a tile swizzled as `swizzled`.
template <int D, int Threads, typename T>
__device__ __forceinline__ void loadTile(T* s, const T* g, std::size_t ld, int rows, int valid) {
  loadRows<D, Threads>(s, g, ld, rows, valid, [](int r, int c) { return swizzled<D>(r, c); });
}
template <int N>
__device__ __forceinline__ void awaitLoads() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix4(std::uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(sharedAddress(p)));
}
__device__ __forceinline__ void ldmatrix4T(std::uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(sharedAddress(p)));
}

// c += a · b on a 16 × 8 × 16 tile.
template <typename T>
__device__ __forceinline__ void mma(float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                    std::uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

template <typename T>
__device__ __forceinline__ std::uint32_t pack(float lo, float hi) {
  T two[2] = {static_cast<T>(lo), static_cast<T>(hi)};
  std::uint32_t r;
  memcpy(&r, two, sizeof r);
  return r;
}

// f(T(), std::integral_constant<int, D>()) for a call's element type (bf16 or f16) and head dim
// (64 or 128).
template <typename F>
Status withTypeAndDim(DataType type, int dim, F f) {
  using D64 = std::integral_constant<int, 64>;
  using D128 = std::integral_constant<int, 128>;
  if (type == DataType::bf16)
    return dim == 64 ? f(__nv_bfloat16(), D64()) : f(__nv_bfloat16(), D128());
  return dim == 64 ? f(__half(), D64()) : f(__half(), D128());
}

// A kernel may take `bytes` of dynamic shared memory (set per call: the attribute is the
// device's, and costs a microsecond).
template <typename K>
Status allowShared(K kernel, int bytes, const char* who) {
  return cudaStatus(
      who, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

// 2^x by the special-function unit (denormal results flushed to 0, as softmax does not mind).
__device__ __forceinline__ float exp2Fast(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float quadMax(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quadSum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

}  // namespace weft::fused::attention
