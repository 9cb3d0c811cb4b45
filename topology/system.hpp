// Several identical hosts on a network: what a job spans. Ranks are placed one per GPU, host by
// host (rank = host * gpusPerHost + local GPU). Hosts talk through each GPU's nearest NIC over a
// rail-optimized fabric: NIC k of every host sits on leaf switch k (one switch hop between hosts on
// the same rail), other rails go leaf-spine-leaf (three hops).
#pragma once

#include "topology/topology.hpp"

namespace weft::topo {

struct Fabric {
  double nicLatency = 1.0;     // us, each end (NIC and its software)
  double switchLatency = 0.5;  // us per switch traversed
};

class System {
 public:
  System(Topology host, int hosts, Fabric fabric = {});

  const Topology& host() const { return host_; }
  int hosts() const { return hosts_; }
  int gpusPerHost() const { return static_cast<int>(host_.gpus().size()); }
  int ranks() const { return hosts_ * gpusPerHost(); }
  const Fabric& fabric() const { return fabric_; }

  int hostOf(int rank) const { return rank / gpusPerHost(); }
  // The path between the GPUs of two ranks (class net between hosts).
  Path path(int rankA, int rankB) const;
  // A host's GPU's network bandwidth: min(GPU->NIC path, NIC speed); 0 without NICs.
  double networkBandwidth(int localGpu) const;

  std::string summary() const;

 private:
  Topology host_;
  int hosts_;
  Fabric fabric_;
  std::vector<int> nicOf_;   // local GPU -> NIC node (or -1)
  std::vector<int> railOf_;  // local GPU -> rail (the NIC's position among the host's NICs)
};

}  // namespace weft::topo
