// What the kernel files share on the host side: launch errors, the dispatch from run-time
// protocols, direct kinds and types to template instances, and the preloads of each file's
// kernels (preload() in schedule_kernel.cu calls them all).
#pragma once

#include <cuda_runtime.h>

#include <string>
#include <type_traits>

#include "src/device/arith.cuh"
#include "src/device/schedule_kernel.hpp"

namespace weft::device {

inline Status launchError(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return {};
  return {Code::systemError, std::string(what) + " launch failed: " + cudaGetErrorString(err)};
}

template <typename Fn>
decltype(auto) withProtocol(Protocol p, Fn&& fn) {
  if (p == Protocol::ll) return fn(std::integral_constant<Protocol, Protocol::ll>{});
  return fn(std::integral_constant<Protocol, Protocol::simple>{});
}

// Calls fn(Op{}, integral_constant<DirectKind, K>{}) for `kind`: the reducing kinds with `op`,
// the copying kinds (built for one op) with Sum.
template <typename Fn>
void withKind(DirectKind kind, RedOp op, Fn&& fn) {
  using K = DirectKind;
  if (kind == K::gather) {
    fn(Sum{}, std::integral_constant<K, K::gather>{});
  } else if (kind == K::exchange) {
    fn(Sum{}, std::integral_constant<K, K::exchange>{});
  } else {
    withOp(op, [&](auto reduction) {
      if (kind == K::allReduce) {
        fn(reduction, std::integral_constant<K, K::allReduce>{});
      } else {
        fn(reduction, std::integral_constant<K, K::reduceScatter>{});
      }
    });
  }
}

// Calls fn(T*, Op, integral_constant<Protocol>) for every dtype x element-wise op x protocol the
// kernels are instantiated for, until it returns an error.
template <typename Fn>
cudaError_t forEachInstance(Fn&& fn) {
  for (int t = 0; t < kNumDataTypes; ++t) {
    for (RedOp op : {RedOp::sum, RedOp::prod, RedOp::min, RedOp::max}) {
      for (Protocol p : algo::kAllProtocols) {
        const cudaError_t err = withType(static_cast<DataType>(t), [&](auto* tag) {
          return withOp(op, [&](auto reduction) {
            return withProtocol(p, [&](auto pc) { return fn(tag, reduction, pc); });
          });
        });
        if (err != cudaSuccess) return err;
      }
    }
  }
  return cudaSuccess;
}

// Each kernel file's instances made resident before any rank spins on another's (lazy module
// loading would otherwise wait for a spinning kernel).
cudaError_t preloadDirect();
cudaError_t preloadLl();

}  // namespace weft::device
