// Block-scaled fp8 GEMMs' A scales, from the caller's layout (row-major: one f32 per 128 values
// along k of each row) into the one cuBLASLt reads (gemm.hpp's GemmScales: k blocks outermost,
// rows fastest), a batch of row ranges at once.
#pragma once

#include <cstddef>

#include "weft/status.hpp"

namespace weft::fused::tp {

// Batch b < batches, r < rows, q < blocks: dst[b · dstBatch + q · ld + r] (transposed, A's:
// ld = Gemms::scaleLd(rows)), or dst[b · dstBatch + r · ld + q] (Bᵀ's tiles', ld =
// Gemms::tileScaleLd(blocks)), = src[b · srcBatch + r · blocks + q]; strides in floats.
struct ScaleRepack {
  const float* src = nullptr;
  std::size_t srcBatch = 0;
  float* dst = nullptr;
  std::size_t dstBatch = 0;
  std::size_t rows = 0, blocks = 0, ld = 0;
  int batches = 1;
  bool transposed = true;
};
// Loads the kernel (before any flag kernel spins: see flags.hpp).
Status loadScaleKernels();
Status repackScales(const ScaleRepack& r, void* stream);

}  // namespace weft::fused::tp
