#include "topology/nvml_loader.hpp"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>

#include "topology/shared_library.hpp"

namespace weft::topo {
namespace {

// The NVML ABI, as documented in nvml.h (CUDA 11+). Only what discovery uses.
using nvmlReturn_t = int;
constexpr nvmlReturn_t kNvmlSuccess = 0;
using nvmlDevice_t = struct nvmlDevice_opaque*;
struct nvmlPciInfo_t {
  char busIdLegacy[16];
  unsigned int domain;
  unsigned int bus;
  unsigned int device;
  unsigned int pciDeviceId;
  unsigned int pciSubSystemId;
  char busId[32];
};
constexpr unsigned kNvlinkMaxLinks = 18;
constexpr int kNvlinkDeviceTypeSwitch = 2;
constexpr int kFeatureEnabled = 1;

struct Api {
  SharedLibrary lib;  // closed after the destructor's shutdown
  nvmlReturn_t (*init)() = nullptr;
  nvmlReturn_t (*shutdown)() = nullptr;
  nvmlReturn_t (*count)(unsigned*) = nullptr;
  nvmlReturn_t (*byIndex)(unsigned, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*pciInfo)(nvmlDevice_t, nvmlPciInfo_t*) = nullptr;
  nvmlReturn_t (*computeCapability)(nvmlDevice_t, int*, int*) = nullptr;
  nvmlReturn_t (*linkState)(nvmlDevice_t, unsigned, int*) = nullptr;
  nvmlReturn_t (*remotePci)(nvmlDevice_t, unsigned, nvmlPciInfo_t*) = nullptr;
  nvmlReturn_t (*remoteType)(nvmlDevice_t, unsigned, int*) = nullptr;  // optional

  ~Api() {
    if (shutdown != nullptr) shutdown();
  }
};

}  // namespace

std::string normalizeBusId(const std::string& busId) {
  unsigned domain = 0, bus = 0, dev = 0, fn = 0;
  if (std::sscanf(busId.c_str(), "%x:%x:%x.%x", &domain, &bus, &dev, &fn) != 4) {
    domain = 0;
    if (std::sscanf(busId.c_str(), "%x:%x.%x", &bus, &dev, &fn) != 3) {
      std::string lower = busId;
      std::transform(lower.begin(), lower.end(), lower.begin(),
                     [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
      return lower;
    }
  }
  char out[32];
  std::snprintf(out, sizeof out, "%04x:%02x:%02x.%x", domain & 0xffff, bus, dev, fn);
  return out;
}

Result<std::vector<NvmlGpu>> queryNvml(const std::string& library) {
  auto lib = SharedLibrary::open(library, "NVML");
  if (!lib) return lib.status();
  Api api;
  api.lib = std::move(*lib);
  const SharedLibrary& nvml = api.lib;
  const bool ok = nvml.bind("nvmlInit_v2", api.init) &&
                  nvml.bind("nvmlDeviceGetCount_v2", api.count) &&
                  nvml.bind("nvmlDeviceGetHandleByIndex_v2", api.byIndex) &&
                  nvml.bind("nvmlDeviceGetPciInfo_v3", api.pciInfo) &&
                  nvml.bind("nvmlDeviceGetCudaComputeCapability", api.computeCapability) &&
                  nvml.bind("nvmlDeviceGetNvLinkState", api.linkState) &&
                  nvml.bind("nvmlDeviceGetNvLinkRemotePciInfo_v2", api.remotePci);
  if (!ok) return unsupported("NVML at " + library + " lacks an entry point discovery needs");
  nvml.bind("nvmlDeviceGetNvLinkRemoteDeviceType", api.remoteType);
  if (api.init() != kNvmlSuccess) {
    return unsupported("nvmlInit failed (no driver, or no GPU visible)");
  }
  nvml.bind("nvmlShutdown", api.shutdown);  // only once init succeeded
  unsigned n = 0;
  if (api.count(&n) != kNvmlSuccess) return Status(Code::systemError, "nvmlDeviceGetCount failed");
  std::vector<NvmlGpu> gpus;
  for (unsigned i = 0; i < n; ++i) {
    nvmlDevice_t dev = nullptr;
    nvmlPciInfo_t pci{};
    if (api.byIndex(i, &dev) != kNvmlSuccess || api.pciInfo(dev, &pci) != kNvmlSuccess) continue;
    NvmlGpu g;
    g.index = static_cast<int>(i);
    g.busId = normalizeBusId(pci.busId);
    int major = 0, minor = 0;
    if (api.computeCapability(dev, &major, &minor) == kNvmlSuccess) g.sm = major * 10 + minor;
    for (unsigned l = 0; l < kNvlinkMaxLinks; ++l) {
      int state = 0;
      if (api.linkState(dev, l, &state) != kNvmlSuccess || state != kFeatureEnabled) continue;
      nvmlPciInfo_t remote{};
      if (api.remotePci(dev, l, &remote) != kNvmlSuccess) continue;
      NvmlLink link;
      link.remoteBusId = normalizeBusId(remote.busId);
      int type = -1;
      if (api.remoteType != nullptr && api.remoteType(dev, l, &type) == kNvmlSuccess) {
        link.remoteIsSwitch = type == kNvlinkDeviceTypeSwitch;
      }
      g.nvlinks.push_back(link);
    }
    gpus.push_back(std::move(g));
  }
  return gpus;
}

}  // namespace weft::topo
