// weft's attention kernel on Hopper (sm_90a): local.cu's scheme with warpgroup products. A block
// of 128 queries, two warpgroups of 64; keys and values in tiles of 128 through 128-byte-swizzled
// shared memory (wgmma.cuh), the next tile loading (cp.async) while the current one is attended.
// Scores S = Q·Kᵀ with both operands from shared memory; the probabilities stay in registers as
// the A operand of O += P·V, V read N-major. Built only for sm_90a (fused/CMakeLists.txt).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "fused/attention/local_wgmma.hpp"
#include "fused/attention/mma.cuh"
#include "fused/attention/softmax.cuh"
#include "fused/attention/wgmma.cuh"

namespace weft::fused::attention {
namespace {

constexpr int kGroups = 2, kThreads = 128 * kGroups, kRows = 64 * kGroups, kKeys = 128;

// `R` rows of D values from g (rows ld values apart) into the swizzled tile s; rows from `valid`
// on zeroed.
template <int D, int R, typename T>
__device__ __forceinline__ void loadSwizzled(T* s, const T* g, std::size_t ld, int valid) {
  loadRows<D, kThreads>(s, g, ld, R, valid, [](int r, int c) { return swizzled128<R>(r, 8 * c); });
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads, 1) attendWgmmaKernel(LocalAttention a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kSteps = D / 16, kKeySteps = kKeys / 16, kKeyTiles = kKeys / 8, kDimTiles = D / 8;
  constexpr int kRowBytes = 128;  // of a column block
  extern __shared__ __align__(1024) unsigned char smem[];
  // Swizzled tiles need 1024-byte alignment (the launch adds the slack).
  const std::uint32_t at0 = sharedAddress(smem);
  T* qs = reinterpret_cast<T*>(smem + ((at0 + 1023) / 1024 * 1024 - at0));
  T* ks = qs + kRows * D;      // two tiles of keys
  T* vs = ks + 2 * kKeys * D;  // and of their values
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int group = warp / 4, g = lane / 4, t = lane % 4;
  QueryBlock<T, D> b;
  if (!queryBlock(a, kRows, b)) return;
  const int keyTiles = (b.keyEnd + kKeys - 1) / kKeys;

  loadSwizzled<D, kRows>(qs, b.q, b.ldq, b.rows);
  if (keyTiles > 0) {
    loadSwizzled<D, kKeys>(ks, b.k, b.ldk, min(kKeys, b.keyEnd));
    loadSwizzled<D, kKeys>(vs, b.v, b.ldk, min(kKeys, b.keyEnd));
  }
  float o[kDimTiles][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0, 0};
  const int row[2] = {b.r0 + warp * 16 + g, b.r0 + warp * 16 + g + 8};  // within the part
  const float scale = a.scale * kLog2e;
  // The warpgroup's 64 queries in each column block of Q.
  const std::uint32_t qAt = sharedAddress(qs) + group * 64 * kRowBytes;

  for (int kt = 0; kt < keyTiles; ++kt) {
    const int buf = kt % 2;
    awaitLoads<0>();
    sharedToAsyncProxy();
    __syncthreads();  // this tile landed everywhere; the other buffers' last readers are done
    if (kt + 1 < keyTiles) {
      const int next = (kt + 1) * kKeys;
      loadSwizzled<D, kKeys>(ks + (1 - buf) * kKeys * D,
                             b.k + static_cast<std::size_t>(next) * b.ldk, b.ldk,
                             min(kKeys, b.keyEnd - next));
      loadSwizzled<D, kKeys>(vs + (1 - buf) * kKeys * D,
                             b.v + static_cast<std::size_t>(next) * b.ldk, b.ldk,
                             min(kKeys, b.keyEnd - next));
    }
    const std::uint32_t kAt = sharedAddress(ks + buf * kKeys * D);
    const std::uint32_t vAt = sharedAddress(vs + buf * kKeys * D);
    float s[kKeyTiles][4];
    wgmmaFence();
#pragma unroll
    for (int st = 0; st < kSteps; ++st) {
      // Dims 16st..16st+15: column block st / 4, 32 bytes into it per step.
      const std::uint32_t into = (st % 4) * 32;
      wgmmaSS<T, kKeys>(s, descriptor(qAt + (st / 4) * kRows * kRowBytes + into, 16, 1024),
                        descriptor(kAt + (st / 4) * kKeys * kRowBytes + into, 16, 1024), st > 0);
    }
    wgmmaCommit();
    wgmmaWait<0>();
    const int base = kt * kKeys;
    if (base + kKeys > b.keyEnd || (a.piece.causal && base + kKeys - 1 > b.r0))
      maskScores(s, base, b.keyEnd, a.piece.causal, row, t);
    softmaxStep(s, o, m, l, scale);
    std::uint32_t p[kKeySteps][4];
#pragma unroll
    for (int st = 0; st < kKeySteps; ++st) probabilities<T>(p[st], s, st);
    wgmmaFence();
#pragma unroll
    for (int st = 0; st < kKeySteps; ++st) {
      // Keys 16st..16st+15 (two 8-row groups, 1024 bytes apart); column blocks 128 keys apart.
      const std::uint64_t v = descriptor(vAt + st * 16 * kRowBytes, kKeys * kRowBytes, 1024);
      wgmmaRS<T, D>(o, p[st], v, 1);
    }
    wgmmaCommit();
    wgmmaWait<0>();
  }
  awaitLoads<0>();  // the queries, where no key was
  finishRows<T, kDimTiles>(a, o, m, l, row, b.qLen, b.first, b.head, scale, g, t);
#else
  (void)a;
  __trap();  // built for sm_90a only
#endif
}

template <typename T, int D>
Status launchDim(const LocalAttention& a, cudaStream_t stream) {
  constexpr int kSmem = (kRows + 4 * kKeys) * D * static_cast<int>(sizeof(T)) + 1024;
  if (Status s = allowShared(attendWgmmaKernel<T, D>, kSmem, "attention"); !s) return s;
  const dim3 grid(static_cast<unsigned>((a.maxSeqlenQ + kRows - 1) / kRows),
                  static_cast<unsigned>(a.heads), static_cast<unsigned>(a.sequences));
  attendWgmmaKernel<T, D><<<grid, kThreads, kSmem, stream>>>(a);
  return launched("attention");
}

}  // namespace

bool wgmmaAttention() {
  int device = 0, major = 0, minor = 0;
  return cudaGetDevice(&device) == cudaSuccess &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
         cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess &&
         major == 9 && minor == 0;
}

Status loadWgmmaAttentionKernels() {
  return loadKernels("attention: loading the kernels", attendWgmmaKernel<__nv_bfloat16, 64>,
                     attendWgmmaKernel<__nv_bfloat16, 128>, attendWgmmaKernel<__half, 64>,
                     attendWgmmaKernel<__half, 128>);
}

Status attendWgmma(const LocalAttention& a, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  return withTypeAndDim(a.type, a.dim, [&](auto type, auto dim) {
    return launchDim<decltype(type), decltype(dim)::value>(a, s);
  });
}

}  // namespace weft::fused::attention
