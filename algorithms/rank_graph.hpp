// Rank graphs: what the cost model knows of where a communicator's ranks sit. From a topology
// (one host's, discovered or from a file) and a placement (which host and GPU each rank has) the
// runtime builds the graph its calls are priced on; weft-plan builds the same graph from the same
// topology, so both make the same picks.
#pragma once

#include <string>
#include <vector>

#include "algorithms/cost_model.hpp"
#include "topology/topology.hpp"

namespace weft::algo {

// Where a communicator's ranks run, as the runtime learns it at init.
struct Placement {
  std::vector<int> hostOf;  // by rank: hosts numbered in the order of their first rank
  std::vector<int> gpuOf;   // by rank: its GPU's index among the host topology's GPUs; -1: unknown
  int nranks() const { return static_cast<int>(hostOf.size()); }
  int hosts() const;
  // n ranks on `hosts` hosts, host-major, each host's local rank l on GPU l mod `gpus` (NCCL's
  // convention, and what the runtime assumes before a rank's device is known; gpus 0: unknown).
  static Placement regular(int nranks, int hosts, int gpus);
};

// How a bulk GPU call is cut where ranks share one device (RankGraph's device fields).
struct DeviceShape {
  // Thread blocks a call, by default: the largest power of two at most kMaxAutoChannels and at
  // most a device's SMs divided among the ranks sharing it.
  static constexpr int kMaxAutoChannels = 64;
  static constexpr int autoChannels(int sms, int ranksSharing) {
    const int room = sms / (ranksSharing > 0 ? ranksSharing : 1);
    int c = 1;
    while (c * 2 <= room && c * 2 <= kMaxAutoChannels) c *= 2;
    return c;
  }
  int channels = 64;
  std::size_t slotBytes = 256 * 1024;
  std::size_t bytesPerChannel = 512 * 1024;
};

// n ranks on one host where every pattern gets the same per-rank bandwidth (GB/s) over hops of
// one class, and a tree edge gets treeBw.
RankGraph uniformRankGraph(int nranks, topo::PathClass cls, double bandwidth, double treeBw);
// n ranks on one host talking through shared memory (host buffers).
RankGraph sharedMemoryRankGraph(int nranks, const GraphConstants& c = {});
// n ranks whose kernels share the memory of one GPU.
RankGraph sameDeviceRankGraph(int nranks, const DeviceShape& shape = {},
                              const GraphConstants& c = {});

// The graph calls on host memory are priced on: shared memory within a host, and between hosts
// the host's network (netGBs per host, its fastest NIC; shared by its ranks).
RankGraph hostRankGraph(const Placement& placement, double netGBs, const GraphConstants& c = {});

// The graph calls on GPU memory are priced on, and how it was made (for WEFT_DEBUG=INFO).
struct GpuGraph {
  RankGraph graph;
  bool sameDevice = false;  // ranks share a device: priced by its memory traffic
  std::string description;
};
// Ranks of a host that share a GPU (or whose GPUs are unknown): the same-device graph; ranks on
// GPUs of their own: the topology's paths between those GPUs (NVLink, NVSwitch, PCIe) and, across
// hosts, their NICs (RankGraph::fromSystem on the GPUs host 0's ranks use).
GpuGraph gpuRankGraph(const topo::Topology& host, const Placement& placement,
                      const DeviceShape& shape = {}, const GraphConstants& c = {});

}  // namespace weft::algo
