// ncclRedOpCreatePreMulSum's multiply, done before weft sums: out[i] = in[i] * scalar, where the
// scalar is a value of the call's type (out may be in).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "weft/types.hpp"

namespace weft::nccl {

// On `stream`: the scalar read now from scalarHost, or by the kernel from scalarDevice.
cudaError_t scaleOnDevice(void* out, const void* in, std::size_t count, DataType type,
                          const void* scalarHost, const void* scalarDevice, cudaStream_t stream);
// Host memory, now.
void scaleOnHost(void* out, const void* in, std::size_t count, DataType type, const void* scalar);

}  // namespace weft::nccl
