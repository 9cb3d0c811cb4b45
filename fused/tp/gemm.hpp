// GEMMs for the tensor-parallel operations, through cuBLASLt (loaded with dlopen at the first
// GEMM, so libweft needs no cuBLAS to load): row-major, f32 accumulate, an optional bias, and a
// batch of GEMMs that share B (the chunks of every rank's rows). Unsupported in builds without
// CUDA.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "weft/status.hpp"
#include "weft/types.hpp"

namespace weft::fused::tp {

// C[b] = A[b] · B (+ bias), b < batches: A[b] is m × k at a + b·strideA (rows lda apart), B is
// k × n (rows ldb apart; or given as Bᵀ, n × k), C[b] is m × n at c + b·strideC (rows ldc
// apart); strides and leading dimensions in values. bias: n values (or null), added to every row.
// fp8 (e4m3) A and B: C = scaleA · scaleB · (A · B) (+ bias) in bf16 or f16, B given as Bᵀ (the
// tensor cores read both fp8 operands along k).
struct GemmShape {
  std::size_t m = 0, n = 0, k = 0;
  std::size_t lda = 0, ldb = 0, ldc = 0;
  int batches = 1;
  std::size_t strideA = 0, strideC = 0;
  DataType type = DataType::bf16;  // of A and B: bf16, f16, f32, or f8e4m3
  DataType out = DataType::bf16;   // of C and bias: A's, or bf16 or f16 for f8e4m3
  bool bTransposed = false;        // B given as Bᵀ
  bool bias = false;
  int smCount = 0;  // the SMs cuBLASLt plans for (others run beside it); 0: the device's
  auto key() const {
    return std::make_tuple(m, n, k, lda, ldb, ldc, batches, strideA, strideC,
                           static_cast<int>(type), static_cast<int>(out), bTransposed, bias,
                           smCount);
  }
};

// Device pointers to one f32 each (null: 1), fp8 GEMMs' dequantization scales.
struct GemmScales {
  const float* a = nullptr;
  const float* b = nullptr;
};

// One rank's cuBLASLt handle on its device, and the algorithm its heuristic gave each shape.
class Gemms {
 public:
  // What cuBLASLt may use of a call's workspace (its advice for Hopper).
  static constexpr std::size_t kWorkspaceBytes = std::size_t{32} << 20;

  // Loads cuBLASLt (the first time) and makes a handle on the current device.
  static Result<std::unique_ptr<Gemms>> create();
  ~Gemms();
  Gemms(const Gemms&) = delete;
  Gemms& operator=(const Gemms&) = delete;

  // Enqueues the GEMM on `stream`; `workspace`: kWorkspaceBytes of device memory.
  Status run(const GemmShape& shape, const void* a, const void* b, void* c, const void* bias,
             void* workspace, void* stream, GemmScales scales = {});

  // Which (A and B, C) types run: bf16, f16, f32 alike; f8e4m3 into bf16 or f16.
  static bool supports(DataType type, DataType out) {
    if (type == DataType::f8e4m3) return out == DataType::bf16 || out == DataType::f16;
    return type == out &&
           (type == DataType::bf16 || type == DataType::f16 || type == DataType::f32);
  }

  struct Cached;  // a shape's descriptors and algorithm

 private:
  Gemms() = default;
  void* handle_ = nullptr;
  std::map<decltype(GemmShape{}.key()), std::shared_ptr<Cached>> cache_;
};

}  // namespace weft::fused::tp
