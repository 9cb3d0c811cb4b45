// Discovery: the host's topology as NCCL-format XML, from hwloc (CPUs, NUMA nodes, the PCI tree,
// NICs, GPUs' PCI positions), NVML (GPU numbering, compute capability, NVLinks) and the CUDA
// driver (which GPU pairs have peer access and native atomics). Each source is optional: without
// NVML there are no NVLinks; without the driver peer access is unknown; without visible PCI
// devices there are only CPUs.
#pragma once

#include <string>

#include "topology/topology.hpp"

namespace weft::topo {

struct DiscoveryOptions {
  std::string nvmlLibrary = "libnvidia-ml.so.1";
  std::string cudaLibrary = "libcuda.so.1";
  bool useNvml = true;
  bool useCuda = true;
  bool useHwlocPci = true;
};

// The XML, for dumping or editing before use.
Result<XmlElement> discoverXml(const DiscoveryOptions& options = {});
Result<Topology> discover(const DiscoveryOptions& options = {});

// WEFT_TOPO_FILE (or NCCL_TOPO_FILE) when set, else discovery. For tools; the runtime passes its
// Config instead.
Result<Topology> topologyFromEnvironmentOrDiscovery();

}  // namespace weft::topo
