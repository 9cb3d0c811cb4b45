#include "topology/cuda_loader.hpp"

#include "topology/nvml_loader.hpp"
#include "topology/shared_library.hpp"

namespace weft::topo {
namespace {

// The driver API's ABI as cuda.h documents it (CUDA 4+). Only what discovery uses.
using CUresult = int;
using CUdevice = int;
constexpr CUresult kCudaSuccess = 0;
constexpr int kP2pPerformanceRank = 1;
constexpr int kP2pAccessSupported = 2;
constexpr int kP2pNativeAtomicSupported = 3;

struct Api {
  SharedLibrary lib;
  CUresult (*init)(unsigned) = nullptr;
  CUresult (*count)(int*) = nullptr;
  CUresult (*get)(CUdevice*, int) = nullptr;
  CUresult (*busId)(char*, int, CUdevice) = nullptr;
  CUresult (*attribute)(int*, int, CUdevice, CUdevice) = nullptr;
};

}  // namespace

Result<CudaP2p> queryCudaP2p(const std::string& library) {
  auto lib = SharedLibrary::open(library, "CUDA driver");
  if (!lib) return lib.status();
  Api api;
  api.lib = std::move(*lib);
  const SharedLibrary& cuda = api.lib;
  const bool ok = cuda.bind("cuInit", api.init) && cuda.bind("cuDeviceGetCount", api.count) &&
                  cuda.bind("cuDeviceGet", api.get) &&
                  cuda.bind("cuDeviceGetPCIBusId", api.busId) &&
                  cuda.bind("cuDeviceGetP2PAttribute", api.attribute);
  if (!ok)
    return unsupported("CUDA driver at " + library + " lacks an entry point discovery needs");
  if (api.init(0) != kCudaSuccess) return unsupported("cuInit failed (no GPU visible)");
  int n = 0;
  if (api.count(&n) != kCudaSuccess) return Status(Code::systemError, "cuDeviceGetCount failed");
  CudaP2p out;
  std::vector<CUdevice> devices;
  for (int i = 0; i < n; ++i) {
    CUdevice d = 0;
    char bus[32] = "";
    if (api.get(&d, i) != kCudaSuccess || api.busId(bus, sizeof bus, d) != kCudaSuccess) {
      return Status(Code::systemError, "CUDA device " + std::to_string(i) + ": no PCI bus id");
    }
    devices.push_back(d);
    out.busIds.push_back(normalizeBusId(bus));
  }
  out.peers.resize(devices.size() * devices.size());
  for (std::size_t a = 0; a < devices.size(); ++a) {
    for (std::size_t b = 0; b < devices.size(); ++b) {
      if (a == b) continue;
      CudaPeer& p = out.peers[a * devices.size() + b];
      int v = 0;
      p.access =
          api.attribute(&v, kP2pAccessSupported, devices[a], devices[b]) == kCudaSuccess && v != 0;
      p.atomics =
          api.attribute(&v, kP2pNativeAtomicSupported, devices[a], devices[b]) == kCudaSuccess &&
          v != 0;
      if (api.attribute(&v, kP2pPerformanceRank, devices[a], devices[b]) == kCudaSuccess)
        p.performanceRank = v;
    }
  }
  return out;
}

}  // namespace weft::topo
