// GEMMs for the tensor-parallel operations, through cuBLASLt (loaded with dlopen at the first
// GEMM, so libweft needs no cuBLAS to load): row-major, f32 accumulate, an optional bias, and a
// batch of GEMMs that share B (the chunks of every rank's rows). Unsupported in builds without
// CUDA.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "weft/status.hpp"
#include "weft/types.hpp"

namespace weft::fused::tp {

// C[b] = A[b] · B (+ bias), b < batches: A[b] is m × k at a + b·strideA (rows lda apart), B is
// k × n (rows ldb apart; or given as Bᵀ, n × k), C[b] is m × n at c + b·strideC (rows ldc
// apart); strides and leading dimensions in values. bias: n values (or null), added to every row.
// fp8 (e4m3) A and B: C = scaleA · scaleB · (A · B) (+ bias) in bf16 or f16, B given as Bᵀ (the
// tensor cores read both fp8 operands along k); the scales one a tensor, or (blockScales) one
// per 128 values along k of each row of A and one per 128 × 128 tile of Bᵀ (GemmScales).
struct GemmShape {
  std::size_t m = 0, n = 0, k = 0;
  std::size_t lda = 0, ldb = 0, ldc = 0;
  int batches = 1;
  std::size_t strideA = 0, strideC = 0;
  DataType type = DataType::bf16;  // of A and B: bf16, f16, f32, or f8e4m3
  DataType out = DataType::bf16;   // of C and bias: A's, or bf16 or f16 for f8e4m3
  bool bTransposed = false;        // B given as Bᵀ
  bool bias = false;
  bool blockScales = false;  // fp8's scales per block
  int smCount = 0;           // the SMs cuBLASLt plans for (others run beside it); 0: the device's
  auto key() const {
    return std::make_tuple(m, n, k, lda, ldb, ldc, batches, strideA, strideC,
                           static_cast<int>(type), static_cast<int>(out), bTransposed, bias,
                           blockScales, smCount);
  }
};

// fp8 GEMMs' dequantization scales in device memory: one f32 each (null: 1), or with
// GemmShape::blockScales cuBLASLt's layouts: A's [ceil(k/128)][scaleLd(m)] (rows fastest; batch
// b's aBatchFloats on), Bᵀ's [ceil(n/128)][tileScaleLd(ceil(k/128))]. The GEMM's m a multiple
// of 4 (cuBLASLt finds no algorithm else); both 16-byte aligned.
struct GemmScales {
  const float* a = nullptr;
  const float* b = nullptr;
  std::size_t aBatchFloats = 0;
};

// One rank's cuBLASLt handle on its device, and the algorithm it runs each shape with: the
// heuristic's first or a wave-fitted tile of its algorithm, or while tuning the fastest of its
// candidates that sum alike.
class Gemms {
 public:
  // What cuBLASLt may use of a call's workspace (its advice for Hopper).
  static constexpr std::size_t kWorkspaceBytes = std::size_t{32} << 20;

  // Loads cuBLASLt (the first time) and makes a handle on the current device.
  static Result<std::unique_ptr<Gemms>> create();
  ~Gemms();
  Gemms(const Gemms&) = delete;
  Gemms& operator=(const Gemms&) = delete;

  // Ranks that tune together: the values every rank passes become their largest over the
  // ranks, on every rank (a host all-reduce, also their meeting point: every rank makes each
  // call, for the same shapes in the same order).
  using Agree = std::function<Status(std::vector<float>&)>;
  // While on, a shape's first GEMM outside a CUDA graph capture times the heuristic's candidates
  // without split-K and its first algorithm's wave-fitted tiles (they gave the first one's bits
  // of C at every shape measured) and keeps the fastest: a synchronization, so only where no kernel
  // on the device waits for this rank's later work (docs/perf-tp-gemms.md, "Tuning
  // cuBLASLt's algorithm"). With `agree`, the ranks time each candidate at once and keep the one
  // whose slowest rank is fastest: where they share a GPU, one rank's timing alone reads the
  // others' kernels beside it.
  void setTuning(bool on, Agree agree = {}) {
    tuning_ = on;
    agree_ = std::move(agree);
  }
  // While on (the default), a shape's first GEMM untuned runs a wave-fitted tile of the
  // heuristic first's algorithm where the heuristic's own tile leaves the SMs idler by kFitGain
  // (fused/tp/tiles.hpp; the same bits of C), without timing, in a capture too.
  void setFitting(bool on) { fitting_ = on; }
  // For tests: a shape's first GEMM keeps the i-th of those candidates (the last where fewer)
  // instead of timing them; -1: as setTuning and setFitting say.
  void keepCandidate(int i) { kept_ = i; }
  // For tests: which candidate a shape runs (0 the heuristic's first; kFitted: untuned, a
  // wave-fitted tile); -1 before its first GEMM.
  static constexpr int kFitted = -2;
  int chosen(const GemmShape& shape) const;
  // For tests: the cuBLASLt tile id a shape runs with (cublasLtMatmulTile_t); -1 before its
  // first GEMM.
  int tile(const GemmShape& shape) const;
  // For tests: how many candidates a shape had to choose from; -1 before its first GEMM.
  int offered(const GemmShape& shape) const;

  // Enqueues the GEMM on `stream`; `workspace`: kWorkspaceBytes of device memory.
  Status run(const GemmShape& shape, const void* a, const void* b, void* c, const void* bias,
             void* workspace, void* stream, GemmScales scales = {});

  // Which (A and B, C) types run: bf16, f16, f32 alike; f8e4m3 into bf16 or f16.
  // The block-scaled A scales' leading dimension, and the floats they take (16-byte aligned).
  static std::size_t scaleLd(std::size_t rows) { return rows; }
  static std::size_t tileScaleLd(std::size_t kBlocks) { return (kBlocks + 3) / 4 * 4; }
  static std::size_t blockScaleFloats(std::size_t rows, std::size_t k) {
    return ((k + 127) / 128 * scaleLd(rows) + 3) / 4 * 4;
  }

  static bool supports(DataType type, DataType out) {
    if (type == DataType::f8e4m3) return out == DataType::bf16 || out == DataType::f16;
    return type == out &&
           (type == DataType::bf16 || type == DataType::f16 || type == DataType::f32);
  }

  struct Cached;  // a shape's descriptors and algorithm

 private:
  Gemms() = default;
  Status prime();
  void* handle_ = nullptr;
  bool tuning_ = false;
  bool fitting_ = true;
  Agree agree_;
  int kept_ = -1;
  std::map<decltype(GemmShape{}.key()), std::shared_ptr<Cached>> cache_;
};

}  // namespace weft::fused::tp
