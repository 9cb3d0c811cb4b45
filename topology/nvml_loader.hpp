// NVML, loaded with dlopen at run time: weft's own minimal declarations of the few entry points
// discovery needs, so nothing links against the driver and a CUDA build runs on a GPU-less host.
#pragma once

#include <string>
#include <vector>

#include "weft/status.hpp"

namespace weft::topo {

struct NvmlLink {
  std::string remoteBusId;  // normalized "0000:05:00.0"
  bool remoteIsSwitch = false;
};

struct NvmlGpu {
  int index = 0;
  std::string busId;  // normalized
  int sm = 0;
  std::vector<NvmlLink> nvlinks;  // active links only
};

// Every GPU NVML reports, or an error when the library cannot be loaded or initialised.
// `library` is the file to dlopen ("libnvidia-ml.so.1" normally; tests pass a fake).
Result<std::vector<NvmlGpu>> queryNvml(const std::string& library = "libnvidia-ml.so.1");

// "00000000:18:00.0" / "0000:18:00.0" / "18:00.0" -> "0000:18:00.0", lower case.
std::string normalizeBusId(const std::string& busId);

}  // namespace weft::topo
