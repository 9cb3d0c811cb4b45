// The machine model of one host: devices (GPUs, CPUs/NUMA nodes, NICs, PCI switches, NVSwitch)
// and links (NVLink, PCIe, SMP, C2C), each with a bandwidth and a latency, plus the best path
// between every pair of devices. The XML tree in NCCL's topology-file format is the source of
// truth: discovery and files both produce one, and the graph is derived from it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "topology/xml.hpp"
#include "weft/status.hpp"

namespace weft::topo {

enum class NodeKind : std::uint8_t { cpu, pciSwitch, gpu, nic, nvswitch };
enum class LinkKind : std::uint8_t { nvlink, pcie, smp, c2c };

// How two devices reach each other, best first (NCCL's path types, in its order).
enum class PathClass : std::uint8_t {
  loc,  // the same device
  nvl,  // NVLink, directly or through NVSwitch
  nvb,  // NVLink through another GPU
  c2c,  // chip-to-chip (Grace <-> GPU)
  pix,  // PCIe through one switch
  pxb,  // PCIe through several switches
  phb,  // PCIe through a CPU's host bridge
  sys,  // across the CPUs' SMP interconnect
  net,  // across the network (between hosts)
};

std::string_view name(NodeKind k);
std::string_view name(LinkKind k);
std::string_view name(PathClass c);

struct Node {
  NodeKind kind = NodeKind::cpu;
  int index = 0;        // GPU: CUDA device number; CPU: NUMA id; NIC: net dev; others: order seen
  std::string busId;    // PCI bus id ("0000:19:00.0") where there is one
  std::string label;    // "GPU0", "CPU1", "NIC mlx5_0", "PCI 0000:18:00.0", "NVSwitch"
  int numa = -1;        // the CPU node it hangs under
  int sm = 0;           // GPU: compute capability * 10 + minor
  double speedGBs = 0;  // NIC: port speed
};

// Links are bidirectional; bandwidth is per direction.
struct Link {
  int a = 0, b = 0;
  LinkKind kind = LinkKind::pcie;
  double bandwidth = 0;  // GB/s
  double latency = 0;    // us
  int count = 1;         // NVLink: links bundled
};

// One link of a route and the direction it is crossed in (forward: from link.a to link.b).
struct Hop {
  int link = 0;
  bool forward = true;
};

struct Path {
  double bandwidth = 0;  // the bottleneck, GB/s
  double latency = 0;    // sum over hops, us
  int hops = 0;
  PathClass cls = PathClass::loc;
};

// What the CUDA driver says about one ordered GPU pair (discovery records it in the XML as the
// <gpu> attributes p2p_peers and p2p_atomics, lists of dev numbers; files without them leave it
// unknown).
struct PeerAccess {
  bool known = false;
  bool access = true;  // cuDeviceGetP2PAttribute ACCESS_SUPPORTED
  bool atomics = false;
};

// Defaults for link bandwidths and latencies, following the shape of NCCL's (docs/algorithms.md
// cites them). A tuning file can override the latencies later.
double nvlinkBandwidth(int sm);                               // GB/s per link
double pcieBandwidth(std::string_view linkSpeed, int width);  // "16.0 GT/s PCIe", 16 -> GB/s

class Topology {
 public:
  // Builds the graph from a <system> element; errors name the source line.
  static Result<Topology> fromXml(XmlElement system, std::string_view source = "topology");
  static Result<Topology> load(const std::string& path);

  const XmlElement& xml() const { return xml_; }
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<Link>& links() const { return links_; }
  const std::vector<int>& gpus() const { return gpus_; }  // node ids, by CUDA device number
  const std::vector<int>& nics() const { return nics_; }  // node ids, by net dev
  const std::vector<int>& cpus() const { return cpus_; }
  // The fastest NIC's port speed, GB/s (0: the host lists none).
  double fastestNicGBs() const {
    double most = 0;
    for (int nic : nics_) most = std::max(most, nodes_[static_cast<std::size_t>(nic)].speedGBs);
    return most;
  }

  const Path& path(int from, int to) const {
    return paths_[static_cast<std::size_t>(from) * nodes_.size() + static_cast<std::size_t>(to)];
  }
  // The links of path(from, to), in order.
  const std::vector<Hop>& route(int from, int to) const {
    return routes_[static_cast<std::size_t>(from) * nodes_.size() + static_cast<std::size_t>(to)];
  }

  // CUDA peer access from one GPU node to another. A pair known to lack it communicates through
  // host memory, so its path class is at best PHB (as NCCL's P2P transport would refuse it).
  const PeerAccess& peerAccess(int fromGpu, int toGpu) const;

  // The NIC a GPU uses for the network: the closest (highest bandwidth, then lowest latency);
  // GPUs with the same set of closest NICs take them in turn, so NICs are shared evenly.
  // -1 when there is no NIC.
  int nearestNic(int gpuNode) const;

  // "8 GPUs (sm90), 8 NICs (400 Gb/s), 2 CPUs; GPU<->GPU: NVL 360 GB/s"
  std::string summary() const;
  // The GPU/NIC/CPU matrix, like `nvidia-smi topo -m`, with each path's class and bandwidth.
  std::string matrix() const;

 private:
  void computePaths();
  void assignNics();

  XmlElement xml_;
  std::vector<Node> nodes_;
  std::vector<Link> links_;
  std::vector<int> gpus_, nics_, cpus_;
  std::vector<Path> paths_;               // nodes x nodes
  std::vector<std::vector<Hop>> routes_;  // nodes x nodes
  std::vector<int> nicOfNode_;            // node -> NIC node, for GPUs
  std::vector<PeerAccess> peers_;         // nodes x nodes, empty when nothing is known
};

}  // namespace weft::topo
