// ncclRedOpCreatePreMulSum's multiply: out[i] = in[i] * scalar, before weft's sum, in the
// compute type weft's kernels use (narrow floats in fp32; the rest in their own type).
#include "nccl/premulsum.hpp"

#include <cstdint>
#include <type_traits>

#include "src/device/arith.cuh"

namespace weft::nccl {
namespace {

template <typename T>
__host__ __device__ T times(T x, T s) {
  using C = typename device::Compute<T>::type;
  return static_cast<T>(static_cast<C>(static_cast<C>(x) * static_cast<C>(s)));
}

template <typename T>
__global__ void scaleKernel(T* out, const T* in, std::size_t n, const T* scalarDevice,
                            T scalarValue) {
  const T s = scalarDevice != nullptr ? *scalarDevice : scalarValue;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x)
    out[i] = times(in[i], s);
}

}  // namespace

cudaError_t scaleOnDevice(void* out, const void* in, std::size_t count, DataType type,
                          const void* scalarHost, const void* scalarDevice, cudaStream_t stream) {
  return device::withType(type, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    T value{};
    if (scalarHost != nullptr) value = *static_cast<const T*>(scalarHost);
    const std::size_t blocks = count / 256 + 1 < 1024 ? count / 256 + 1 : 1024;
    scaleKernel<T><<<static_cast<unsigned>(blocks), 256, 0, stream>>>(
        static_cast<T*>(out), static_cast<const T*>(in), count, static_cast<const T*>(scalarDevice),
        value);
    return cudaGetLastError();
  });
}

void scaleOnHost(void* out, const void* in, std::size_t count, DataType type, const void* scalar) {
  device::withType(type, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T s = *static_cast<const T*>(scalar);
    for (std::size_t i = 0; i < count; ++i)
      static_cast<T*>(out)[i] = times(static_cast<const T*>(in)[i], s);
  });
}

}  // namespace weft::nccl
