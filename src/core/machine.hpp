// The machine a communicator runs on: each process discovers its host once (hwloc, NVML, CUDA
// peer access; or WEFT_TOPO_FILE), the ranks agree on one host topology at init, and from it and
// where each rank runs come the rank graphs the tuners price calls on (algorithms/rank_graph.hpp).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "algorithms/rank_graph.hpp"
#include "src/bootstrap/bootstrap.hpp"
#include "topology/topology.hpp"
#include "weft/status.hpp"

namespace weft {

// This process's host topology: the file's where one is named, else discovery's (once per
// process; a discovery that fails gives a host of CPUs only). A file that does not load is an
// error naming it.
Result<std::shared_ptr<const topo::Topology>> hostTopology(const std::string& topoFile);

// What a communicator knows of its machine.
struct Machine {
  std::shared_ptr<const topo::Topology> host;  // the same on every rank (rank 0's host's)
  algo::Placement placement;                   // hosts from init; GPUs guessed until known
  double netGBs = 0;                           // a host's fastest NIC (0: none listed)
  bool gpusKnown = false;                      // placement.gpuOf from the ranks' devices
  std::string source;                          // "discovered" or the file's name

  // Collective, at init: every rank's host topology (same = its hash), hostOf from the ranks'
  // host ids; a rank whose host differs from rank 0's takes rank 0's (so every rank prices on
  // one graph).
  static Result<Machine> agree(boot::Bootstrap& bootstrap, const std::string& topoFile,
                               const std::vector<std::uint64_t>& hostIds);
  // Collective, at the first GPU call: each rank's device (its PCI bus id, else its number) as a
  // GPU of the topology.
  Status learnDevices(boot::Bootstrap& bootstrap, int device, const std::string& busId);

  algo::GpuGraph gpuGraph(const algo::DeviceShape& shape, const algo::GraphConstants& c) const;
};

// This machine's boot id (/proc/sys/kernel/random/boot_id), or "" where it cannot be read.
std::string bootId();

// Where a rank may run: its machine (the boot id; ranks in network namespaces or containers of
// one machine share it) and its CPUs, a bit each (CPUs 0..1023).
struct CpuClaim {
  std::uint64_t machineId = 0;
  std::uint64_t cpus[16] = {};
  static CpuClaim ofThisProcess(std::uint64_t fallbackId);  // fallbackId: no boot id readable
};
// The cores rank `me` has: its share of the CPUs that every rank of its machine whose CPUs
// overlap its own (itself included) may run on, and no more than its own CPUs; 0 where those
// ranks outnumber the CPUs.
long coresOf(const std::vector<CpuClaim>& all, std::size_t me);
// The same share unrounded (0.25: four ranks on a CPU), and its smallest over every rank (the
// same on every rank, which all hold every claim): what the host calls are priced with.
double coreShareOf(const std::vector<CpuClaim>& all, std::size_t me);
double fewestCores(const std::vector<CpuClaim>& all);

}  // namespace weft
