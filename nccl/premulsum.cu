// ncclRedOpCreatePreMulSum's multiply: out[i] = in[i] * scalar, before weft's sum. Half types
// and fp8 are multiplied in float, float64 in double, integers as themselves.
#include "nccl/premulsum.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

namespace weft::nccl {
namespace {

template <typename T>
struct Wide {
  using type = T;  // integers: their own type
};
template <>
struct Wide<__half> {
  using type = float;
};
template <>
struct Wide<__nv_bfloat16> {
  using type = float;
};
template <>
struct Wide<__nv_fp8_e4m3> {
  using type = float;
};
template <>
struct Wide<__nv_fp8_e5m2> {
  using type = float;
};

template <typename T>
__host__ __device__ T times(T x, T s) {
  using W = typename Wide<T>::type;
  return static_cast<T>(static_cast<W>(static_cast<W>(x) * static_cast<W>(s)));
}

template <typename T>
__global__ void scaleKernel(T* out, const T* in, std::size_t n, const T* scalarDevice,
                            T scalarValue) {
  const T s = scalarDevice != nullptr ? *scalarDevice : scalarValue;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x)
    out[i] = times(in[i], s);
}

template <typename T>
cudaError_t launch(void* out, const void* in, std::size_t n, const void* scalarHost,
                   const void* scalarDevice, cudaStream_t stream) {
  T value{};
  if (scalarHost != nullptr) value = *static_cast<const T*>(scalarHost);
  const unsigned blocks = static_cast<unsigned>(n / 256 + 1 < 1024 ? n / 256 + 1 : 1024);
  scaleKernel<T><<<blocks, 256, 0, stream>>>(static_cast<T*>(out), static_cast<const T*>(in), n,
                                             static_cast<const T*>(scalarDevice), value);
  return cudaGetLastError();
}

template <typename T>
void host(void* out, const void* in, std::size_t n, const void* scalar) {
  const T s = *static_cast<const T*>(scalar);
  for (std::size_t i = 0; i < n; ++i)
    static_cast<T*>(out)[i] = times(static_cast<const T*>(in)[i], s);
}

// Calls fn with a null T* of the type's element type; false for an unknown type.
template <typename Fn>
bool byType(ncclDataType_t type, Fn fn) {
  switch (type) {
    case ncclInt8:
      fn(static_cast<std::int8_t*>(nullptr));
      return true;
    case ncclUint8:
      fn(static_cast<std::uint8_t*>(nullptr));
      return true;
    case ncclInt32:
      fn(static_cast<std::int32_t*>(nullptr));
      return true;
    case ncclUint32:
      fn(static_cast<std::uint32_t*>(nullptr));
      return true;
    case ncclInt64:
      fn(static_cast<std::int64_t*>(nullptr));
      return true;
    case ncclUint64:
      fn(static_cast<std::uint64_t*>(nullptr));
      return true;
    case ncclFloat16:
      fn(static_cast<__half*>(nullptr));
      return true;
    case ncclFloat32:
      fn(static_cast<float*>(nullptr));
      return true;
    case ncclFloat64:
      fn(static_cast<double*>(nullptr));
      return true;
    case ncclBfloat16:
      fn(static_cast<__nv_bfloat16*>(nullptr));
      return true;
    case ncclFloat8e4m3:
      fn(static_cast<__nv_fp8_e4m3*>(nullptr));
      return true;
    case ncclFloat8e5m2:
      fn(static_cast<__nv_fp8_e5m2*>(nullptr));
      return true;
    default:
      return false;
  }
}

}  // namespace

cudaError_t scaleOnDevice(void* out, const void* in, std::size_t count, ncclDataType_t type,
                          const void* scalarHost, const void* scalarDevice, cudaStream_t stream) {
  cudaError_t e = cudaErrorInvalidValue;
  byType(type, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    e = launch<T>(out, in, count, scalarHost, scalarDevice, stream);
  });
  return e;
}

bool scaleOnHost(void* out, const void* in, std::size_t count, ncclDataType_t type,
                 const void* scalar) {
  return byType(type, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    host<T>(out, in, count, scalar);
  });
}

}  // namespace weft::nccl
