// The element-wise work of a whole thread block: vectorized copies and reductions over operands
// that may live in peers' memory (read through L2).
#pragma once

#include <cstddef>
#include <cstdint>

#include "src/device/arith.cuh"
#include "src/device/ordering.cuh"

namespace weft::device {

__device__ __forceinline__ bool aligned16(const void* p) {
  return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0;
}

// Loads a message word written by a peer: through L2, never a stale L1 line from the slot's
// previous use.
__device__ __forceinline__ uint4 loadShared(const uint4* p, bool fromPeer) {
  return fromPeer ? __ldcg(p) : *p;
}

template <int Bytes>
struct BitsOf;
template <>
struct BitsOf<1> {
  using type = std::uint8_t;
};
template <>
struct BitsOf<2> {
  using type = std::uint16_t;
};
template <>
struct BitsOf<4> {
  using type = std::uint32_t;
};
template <>
struct BitsOf<8> {
  using type = std::uint64_t;
};

// One element; from a peer's slot through a volatile load (not a stale L1 line).
template <typename T>
__device__ __forceinline__ T loadElem(const T* p, bool fromPeer) {
  if (!fromPeer) return *p;
  using U = typename BitsOf<sizeof(T)>::type;
  const U u = *reinterpret_cast<const volatile U*>(p);
  T t;
  memcpy(&t, &u, sizeof t);
  return t;
}

template <typename T, typename Op>
__device__ __forceinline__ uint4 combineVec(uint4 x, uint4 y) {
  constexpr int kPerVec = sizeof(uint4) / sizeof(T);
  uint4 r;
  const T* ex = reinterpret_cast<const T*>(&x);
  const T* ey = reinterpret_cast<const T*>(&y);
  T* er = reinterpret_cast<T*>(&r);
#pragma unroll
  for (int k = 0; k < kPerVec; ++k) er[k] = combine<T, Op>(ex[k], ey[k]);
  return r;
}

// outs[o][i] = ins[0][i] (op) ins[1][i] (op) ... for i < n, every out the same. ins[k] for
// k >= firstPeer are slots peers wrote. Each thread handles the same elements in every operand,
// so an out may alias an in.
template <typename T, typename Op>
__device__ void elementwise(T* const* outs, int nouts, const T* const* ins, int nins, int firstPeer,
                            std::size_t n) {
  if (n == 0 || nouts == 0) return;
  constexpr std::size_t kPerVec = sizeof(uint4) / sizeof(T);
  constexpr int kUnroll = WEFT_GPU_UNROLL;
  bool vec = true;
  for (int k = 0; k < nins; ++k) vec = vec && aligned16(ins[k]);
  for (int o = 0; o < nouts; ++o) vec = vec && aligned16(outs[o]);
  std::size_t done = 0;
  if (vec) {
    const std::size_t nvec = n / kPerVec;
    const std::size_t step = std::size_t{blockDim.x} * kUnroll;
    const std::size_t whole = nvec / step * step;
    for (std::size_t base = threadIdx.x; base < whole; base += step) {
      uint4 acc[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        acc[u] = loadShared(reinterpret_cast<const uint4*>(ins[0]) + base + u * blockDim.x,
                            firstPeer == 0);
      for (int k = 1; k < nins; ++k) {
        uint4 v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
          v[u] = loadShared(reinterpret_cast<const uint4*>(ins[k]) + base + u * blockDim.x,
                            k >= firstPeer);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) acc[u] = combineVec<T, Op>(acc[u], v[u]);
      }
      for (int o = 0; o < nouts; ++o) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
          reinterpret_cast<uint4*>(outs[o])[base + u * blockDim.x] = acc[u];
      }
    }
    for (std::size_t i = whole + threadIdx.x; i < nvec; i += blockDim.x) {
      uint4 acc = loadShared(reinterpret_cast<const uint4*>(ins[0]) + i, firstPeer == 0);
      for (int k = 1; k < nins; ++k)
        acc = combineVec<T, Op>(
            acc, loadShared(reinterpret_cast<const uint4*>(ins[k]) + i, k >= firstPeer));
      for (int o = 0; o < nouts; ++o) reinterpret_cast<uint4*>(outs[o])[i] = acc;
    }
    done = nvec * kPerVec;
  }
  for (std::size_t i = done + threadIdx.x; i < n; i += blockDim.x) {
    T acc = loadElem(ins[0] + i, firstPeer == 0);
    for (int k = 1; k < nins; ++k) acc = combine<T, Op>(acc, loadElem(ins[k] + i, k >= firstPeer));
    for (int o = 0; o < nouts; ++o) outs[o][i] = acc;
  }
}

// Bytes from `from` to `to` by the whole block (16-byte vectors where both allow), loading
// through L2 when a peer wrote them.
__device__ inline void copyBytes(std::byte* to, const std::byte* from, std::size_t n,
                                 bool fromPeer) {
  std::size_t done = 0;
  if (aligned16(to) && aligned16(from)) {
    const std::size_t nvec = n / 16;
    const auto* src = reinterpret_cast<const uint4*>(from);
    auto* dst = reinterpret_cast<uint4*>(to);
    for (std::size_t i = threadIdx.x; i < nvec; i += blockDim.x)
      dst[i] = loadShared(src + i, fromPeer);
    done = nvec * 16;
  }
  for (std::size_t i = done + threadIdx.x; i < n; i += blockDim.x)
    to[i] =
        static_cast<std::byte>(loadElem(reinterpret_cast<const std::uint8_t*>(from) + i, fromPeer));
}

__device__ __forceinline__ std::size_t lesser(std::size_t a, std::size_t b) {
  return a < b ? a : b;
}

}  // namespace weft::device
