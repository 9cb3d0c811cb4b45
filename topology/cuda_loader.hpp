// The CUDA driver (libcuda.so.1), loaded with dlopen at run time for what discovery asks it: which
// GPU pairs have peer access, with native atomics, and their relative P2P performance. Like NVML,
// nothing links against it, so a machine without a driver still discovers its CPUs and NICs.
#pragma once

#include <string>
#include <vector>

#include "weft/status.hpp"

namespace weft::topo {

struct CudaPeer {
  bool access = false;      // CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED
  bool atomics = false;     // CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED
  int performanceRank = 0;  // CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK (lower is better)
};

struct CudaP2p {
  std::vector<std::string> busIds;  // by CUDA ordinal, normalized ("0000:18:00.0")
  std::vector<CudaPeer> peers;      // busIds.size()^2, row = source ordinal
  const CudaPeer& at(std::size_t from, std::size_t to) const {
    return peers[from * busIds.size() + to];
  }
};

// Every visible device and every pair's attributes, or an error when the driver cannot be
// loaded or initialised. `library` is the file to dlopen (tests pass a fake).
Result<CudaP2p> queryCudaP2p(const std::string& library = "libcuda.so.1");

}  // namespace weft::topo
