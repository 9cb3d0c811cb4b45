// Discovery: the host's topology as NCCL-format XML, from hwloc (CPUs, NUMA nodes, the PCI tree,
// NICs, GPUs' PCI positions) and NVML (GPU numbering, compute capability, NVLinks). Each source is
// optional: without NVML there are no NVLinks; without visible PCI devices there are only CPUs.
#pragma once

#include <string>

#include "topology/topology.hpp"

namespace weft::topo {

struct DiscoveryOptions {
  std::string nvmlLibrary = "libnvidia-ml.so.1";
  bool useNvml = true;
  bool useHwlocPci = true;
};

// The XML, for dumping or editing before use.
Result<XmlElement> discoverXml(const DiscoveryOptions& options = {});
Result<Topology> discover(const DiscoveryOptions& options = {});

// WEFT_TOPO_FILE (or NCCL_TOPO_FILE) when set, else discovery. For tools; the runtime passes its
// Config instead.
Result<Topology> topologyFromEnvironmentOrDiscovery();

}  // namespace weft::topo
