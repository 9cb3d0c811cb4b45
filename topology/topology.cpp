#include "topology/topology.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <queue>
#include <set>
#include <sstream>

namespace weft::topo {

std::string_view name(NodeKind k) {
  switch (k) {
    case NodeKind::cpu:
      return "CPU";
    case NodeKind::pciSwitch:
      return "PCI";
    case NodeKind::gpu:
      return "GPU";
    case NodeKind::nic:
      return "NIC";
    case NodeKind::nvswitch:
      return "NVS";
  }
  return "?";
}

std::string_view name(LinkKind k) {
  switch (k) {
    case LinkKind::nvlink:
      return "NVLink";
    case LinkKind::pcie:
      return "PCIe";
    case LinkKind::smp:
      return "SMP";
    case LinkKind::c2c:
      return "C2C";
  }
  return "?";
}

std::string_view name(PathClass c) {
  switch (c) {
    case PathClass::loc:
      return "LOC";
    case PathClass::nvl:
      return "NVL";
    case PathClass::nvb:
      return "NVB";
    case PathClass::c2c:
      return "C2C";
    case PathClass::pix:
      return "PIX";
    case PathClass::pxb:
      return "PXB";
    case PathClass::phb:
      return "PHB";
    case PathClass::sys:
      return "SYS";
    case PathClass::net:
      return "NET";
  }
  return "?";
}

// Per-link NVLink bandwidth by GPU generation, as NCCL's topology code rates it (not the
// marketing figure): NVLink3 (sm80) 20 GB/s, NVLink4 (sm90) 20.6 GB/s, NVLink5 (sm100) 40.1 GB/s.
double nvlinkBandwidth(int sm) {
  if (sm >= 100) return 40.1;
  if (sm >= 90) return 20.6;
  if (sm >= 70) return 20.0;
  return 18.0;
}

// PCIe: per-lane rate from the generation, times the width, as GB/s usable (gen3 x16 = 12,
// gen4 x16 = 24, gen5 x16 = 48).
double pcieBandwidth(std::string_view linkSpeed, int width) {
  static const std::pair<std::string_view, double> kPerLane[] = {
      {"2.5 GT/s", 0.1875}, {"5 GT/s", 0.375}, {"5.0 GT/s", 0.375}, {"8 GT/s", 0.75},
      {"8.0 GT/s", 0.75},   {"16 GT/s", 1.5},  {"16.0 GT/s", 1.5},  {"32 GT/s", 3.0},
      {"32.0 GT/s", 3.0},   {"64 GT/s", 6.0},  {"64.0 GT/s", 6.0}};
  double lane = 0.75;  // unknown: gen3
  for (const auto& [prefix, gbs] : kPerLane) {
    if (linkSpeed.substr(0, prefix.size()) == prefix) lane = gbs;
  }
  return lane * (width > 0 ? width : 16);
}

namespace {

constexpr double kNvlinkLatency = 0.6;  // us per hop
constexpr double kPcieLatency = 1.0;
constexpr double kC2cLatency = 0.6;
constexpr double kSmpLatency = 1.0;
constexpr double kLocalBandwidth = 5000.0;  // a device to itself

// SMP (inter-socket) bandwidth by CPU generation, GB/s, as NCCL rates them: Intel QPI 6,
// Skylake UPI 10, Sapphire/Emerald Rapids 22, Granite Rapids 40; AMD Zen1/2 16, Zen3/4 24,
// Zen5 32; POWER9 32; Arm 6.
double smpBandwidth(const XmlElement& cpu) {
  const std::string arch = cpu.attrOr("arch", "");
  const std::string vendor = cpu.attrOr("vendor", "");
  const long family = std::strtol(cpu.attrOr("familyid", "0").c_str(), nullptr, 0);
  const long model = std::strtol(cpu.attrOr("modelid", "0").c_str(), nullptr, 0);
  if (arch == "ppc64") return 32.0;
  if (arch == "arm64" || arch == "aarch64") return 6.0;
  if (vendor == "AuthenticAMD") return family >= 0x1a ? 32.0 : family >= 0x19 ? 24.0 : 16.0;
  if (vendor == "GenuineIntel") {
    if (model == 0xad || model == 0xae) return 40.0;
    if (model >= 0x8f) return 22.0;
    return model >= 0x55 ? 10.0 : 6.0;
  }
  return 10.0;
}

bool startsWith(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

std::string lowerBusId(std::string id) {
  std::transform(id.begin(), id.end(), id.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return id;
}

int toInt(const XmlElement& e, std::string_view key, int fallback) {
  const std::string* v = e.attr(key);
  if (v == nullptr || v->empty()) return fallback;
  return static_cast<int>(std::strtol(v->c_str(), nullptr, 0));
}

class Builder {
 public:
  Builder(std::vector<Node>& nodes, std::vector<Link>& links, std::vector<PeerAccess>& peers,
          std::string_view source)
      : nodes_(nodes), links_(links), peers_(peers), source_(source) {}

  Status build(const XmlElement& system) {
    if (system.name != "system")
      return err(system, "the root element is <" + system.name + ">, expected <system>");
    for (const XmlElement& c : system.children) {
      if (c.name != "cpu") continue;
      const int cpu = addNode(
          {NodeKind::cpu, toInt(c, "numaid", static_cast<int>(cpuXml_.size())), "", "", -1, 0, 0});
      nodes_[static_cast<std::size_t>(cpu)].numa = cpu;
      nodes_[static_cast<std::size_t>(cpu)].label =
          "CPU" + std::to_string(nodes_[static_cast<std::size_t>(cpu)].index);
      cpuXml_.push_back({cpu, &c});
      if (Status s = walk(c, cpu, cpu); !s) return s;
    }
    if (cpuXml_.empty()) return err(system, "no <cpu> element: a topology needs at least one CPU");
    for (std::size_t i = 0; i < cpuXml_.size(); ++i) {
      for (std::size_t j = i + 1; j < cpuXml_.size(); ++j) {
        const double bw =
            std::min(smpBandwidth(*cpuXml_[i].second), smpBandwidth(*cpuXml_[j].second));
        links_.push_back({cpuXml_[i].first, cpuXml_[j].first, LinkKind::smp, bw, kSmpLatency, 1});
      }
    }
    if (Status s = resolveNvlinks(); !s) return s;
    return resolvePeerAccess();
  }

 private:
  Status err(const XmlElement& e, const std::string& what) const {
    return invalidArgument(std::string(source_) + ":" + std::to_string(e.line) + ": " + what);
  }

  int addNode(Node n) {
    nodes_.push_back(std::move(n));
    return static_cast<int>(nodes_.size()) - 1;
  }

  Status walk(const XmlElement& parentXml, int parent, int cpu) {
    for (const XmlElement& c : parentXml.children) {
      if (c.name == "pci") {
        if (Status s = pci(c, parent, cpu); !s) return s;
      } else if (c.name == "nic") {
        if (Status s = nic(c, parent, cpu, "", LinkKind::pcie, kLocalBandwidth); !s) return s;
      } else if (c.name == "gpu") {
        return err(c, "<gpu> must sit inside the <pci> element of its device");
      }
    }
    return {};
  }

  Status pci(const XmlElement& e, int parent, int cpu) {
    const std::string* busId = e.attr("busid");
    if (busId == nullptr) return err(e, "<pci> without a busid attribute");
    const double bw = pcieBandwidth(e.attrOr("link_speed", ""), toInt(e, "link_width", 16));
    const XmlElement* gpu = nullptr;
    const XmlElement* nicEl = nullptr;
    for (const XmlElement& c : e.children) {
      if (c.name == "gpu") gpu = &c;
      if (c.name == "nic") nicEl = &c;
    }
    if (gpu != nullptr) {
      const int sm = toInt(*gpu, "sm", 0);
      const int dev = toInt(*gpu, "dev", -1);
      if (dev < 0) return err(*gpu, "<gpu> without a dev attribute");
      for (int g : gpuNodes_) {
        if (nodes_[static_cast<std::size_t>(g)].index == dev)
          return err(*gpu, "GPU dev " + std::to_string(dev) + " appears twice");
      }
      const int n = addNode(
          {NodeKind::gpu, dev, lowerBusId(*busId), "GPU" + std::to_string(dev), cpu, sm, 0});
      gpuNodes_.push_back(n);
      gpuXml_.push_back({n, gpu});
      links_.push_back({parent, n, LinkKind::pcie, bw, kPcieLatency, 1});
      return {};
    }
    if (nicEl != nullptr) return nic(*nicEl, parent, cpu, lowerBusId(*busId), LinkKind::pcie, bw);
    if (startsWith(e.attrOr("class", ""), "0x0604")) {
      const int n = addNode(
          {NodeKind::pciSwitch, switches_++, lowerBusId(*busId), "PCI " + *busId, cpu, 0, 0});
      links_.push_back({parent, n, LinkKind::pcie, bw, kPcieLatency, 1});
      return walk(e, n, cpu);
    }
    return {};  // another PCI device (storage, ...): kept in the XML, not part of the graph
  }

  Status nic(const XmlElement& e, int parent, int cpu, const std::string& busId, LinkKind kind,
             double bw) {
    for (const XmlElement& net : e.children) {
      if (net.name != "net") continue;
      const int dev = toInt(net, "dev", -1);
      if (dev < 0) return err(net, "<net> without a dev attribute");
      const double speed = toInt(net, "speed", 0) / 8000.0;  // Mb/s -> GB/s
      if (speed <= 0)
        return err(net, "<net> " + net.attrOr("name", "?") + " has no positive speed");
      const int n =
          addNode({NodeKind::nic, dev, busId,
                   "NIC" + std::to_string(dev) + " " + net.attrOr("name", ""), cpu, 0, speed});
      links_.push_back({parent, n, kind, bw, kPcieLatency, 1});
    }
    return {};
  }

  // NVLinks name their far end by PCI bus id: a GPU (direct), or an NVSwitch (class 0x068000),
  // which NCCL and weft fold into one switch node. C2C links join a GPU to its CPU.
  Status resolveNvlinks() {
    std::map<std::string, int> gpuByBus;
    for (int g : gpuNodes_) gpuByBus[nodes_[static_cast<std::size_t>(g)].busId] = g;
    std::set<std::pair<int, int>> direct;
    int nvswitch = -1;
    for (const auto& [g, xml] : gpuXml_) {
      const Node& gpu = nodes_[static_cast<std::size_t>(g)];
      int switchLinks = 0;  // every NVSwitch link of this GPU, added into one GPU<->NVS link
      for (const XmlElement& c : xml->children) {
        const int count = toInt(c, "count", 1);
        if (c.name == "c2c") {
          const double bw = count * std::strtod(c.attrOr("bw", "0").c_str(), nullptr);
          if (bw <= 0) return err(c, "<c2c> needs a positive bw");
          links_.push_back({g, gpu.numa, LinkKind::c2c, bw, kC2cLatency, count});
          continue;
        }
        if (c.name != "nvlink") continue;
        if (count <= 0) return err(c, "<nvlink> count must be positive");
        const std::string target = lowerBusId(c.attrOr("target", ""));
        const std::string tclass = c.attrOr("tclass", "");
        const double bw = count * nvlinkBandwidth(gpu.sm);
        if (startsWith(tclass, "0x0680")) {
          switchLinks += count;
        } else if (auto it = gpuByBus.find(target); it != gpuByBus.end()) {
          const auto key = std::minmax(g, it->second);
          if (it->second == g) return err(c, "<nvlink> from a GPU to itself");
          if (direct.insert(key).second) {
            links_.push_back({g, it->second, LinkKind::nvlink, bw, kNvlinkLatency, count});
          }
        } else {
          return err(c, "<nvlink> target " + c.attrOr("target", "(none)") +
                            " is neither a GPU of this system nor an NVSwitch (tclass 0x068000)");
        }
      }
      if (switchLinks > 0) {
        if (nvswitch < 0) nvswitch = addNode({NodeKind::nvswitch, 0, "", "NVSwitch", -1, 0, 0});
        links_.push_back({g, nvswitch, LinkKind::nvlink, switchLinks * nvlinkBandwidth(gpu.sm),
                          kNvlinkLatency, switchLinks});
      }
    }
    return {};
  }

  // p2p_peers / p2p_atomics on a <gpu>: the dev numbers it reaches with CUDA peer access and with
  // native atomics. A GPU carrying them is known; every other pair stays unknown.
  Status resolvePeerAccess() {
    std::map<int, int> gpuByDev;
    for (int g : gpuNodes_) gpuByDev[nodes_[static_cast<std::size_t>(g)].index] = g;
    const std::size_t n = nodes_.size();
    for (const auto& [g, xml] : gpuXml_) {
      const std::string* peers = xml->attr("p2p_peers");
      if (peers == nullptr) continue;
      if (peers_.empty()) peers_.assign(n * n, PeerAccess{});
      for (int other : gpuNodes_) {
        if (other == g) continue;
        PeerAccess& pa = peers_[static_cast<std::size_t>(g) * n + static_cast<std::size_t>(other)];
        pa.known = true;
        pa.access = false;
      }
      for (const char* key : {"p2p_peers", "p2p_atomics"}) {
        const std::string list = xml->attrOr(key, "");
        std::size_t at = 0;
        while (at < list.size()) {
          const std::size_t comma = std::min(list.find(',', at), list.size());
          const std::string item = list.substr(at, comma - at);
          at = comma + 1;
          char* end = nullptr;
          const long dev = std::strtol(item.c_str(), &end, 10);
          auto it = gpuByDev.find(static_cast<int>(dev));
          if (item.empty() || *end != '\0' || it == gpuByDev.end() || it->second == g) {
            return err(*xml,
                       std::string(key) + " lists '" + item + "', which is not another GPU's dev");
          }
          PeerAccess& pa =
              peers_[static_cast<std::size_t>(g) * n + static_cast<std::size_t>(it->second)];
          (std::string_view(key) == "p2p_peers" ? pa.access : pa.atomics) = true;
        }
      }
    }
    return {};
  }

  std::vector<Node>& nodes_;
  std::vector<Link>& links_;
  std::vector<PeerAccess>& peers_;
  std::string_view source_;
  std::vector<std::pair<int, const XmlElement*>> cpuXml_, gpuXml_;
  std::vector<int> gpuNodes_;
  int switches_ = 0;
};

}  // namespace

Result<Topology> Topology::fromXml(XmlElement system, std::string_view source) {
  Topology t;
  t.xml_ = std::move(system);
  if (Status s = Builder(t.nodes_, t.links_, t.peers_, source).build(t.xml_); !s) return s;
  for (std::size_t i = 0; i < t.nodes_.size(); ++i) {
    const auto id = static_cast<int>(i);
    switch (t.nodes_[i].kind) {
      case NodeKind::gpu:
        t.gpus_.push_back(id);
        break;
      case NodeKind::nic:
        t.nics_.push_back(id);
        break;
      case NodeKind::cpu:
        t.cpus_.push_back(id);
        break;
      default:
        break;
    }
  }
  auto byIndex = [&t](int a, int b) {
    return t.nodes_[static_cast<std::size_t>(a)].index <
           t.nodes_[static_cast<std::size_t>(b)].index;
  };
  std::stable_sort(t.gpus_.begin(), t.gpus_.end(), byIndex);
  std::stable_sort(t.nics_.begin(), t.nics_.end(), byIndex);
  std::stable_sort(t.cpus_.begin(), t.cpus_.end(), byIndex);
  t.computePaths();
  t.assignNics();
  return t;
}

Result<Topology> Topology::load(const std::string& path) {
  auto xml = loadXmlFile(path);
  if (!xml) return xml.status();
  return fromXml(std::move(*xml), path);
}

// For each source: the widest path (largest bottleneck bandwidth) and, among those, the one with
// the least latency. Found as shortest-latency paths over the links at or above each bandwidth
// threshold, from the widest threshold down. Traffic may pass through switches and CPUs, through
// a GPU only from NVLink to NVLink (NCCL's NVB), and never through a NIC.
void Topology::computePaths() {
  const std::size_t n = nodes_.size();
  paths_.assign(n * n, {});
  routes_.assign(n * n, {});
  routes_.assign(n * n, {});
  std::vector<std::vector<int>> adj(n);
  std::vector<double> thresholds;
  for (std::size_t l = 0; l < links_.size(); ++l) {
    adj[static_cast<std::size_t>(links_[l].a)].push_back(static_cast<int>(l));
    adj[static_cast<std::size_t>(links_[l].b)].push_back(static_cast<int>(l));
    thresholds.push_back(links_[l].bandwidth);
  }
  std::sort(thresholds.begin(), thresholds.end(), std::greater<>());
  thresholds.erase(std::unique(thresholds.begin(), thresholds.end()), thresholds.end());

  constexpr double kInf = std::numeric_limits<double>::infinity();
  // State = node * 2 + (arrived over NVLink).
  std::vector<double> dist(2 * n);
  std::vector<int> predState(2 * n), predLink(2 * n);
  for (std::size_t src = 0; src < n; ++src) {
    std::vector<bool> done(n, false);
    done[src] = true;
    paths_[src * n + src] = {kLocalBandwidth, 0, 0, PathClass::loc};
    for (double threshold : thresholds) {
      std::fill(dist.begin(), dist.end(), kInf);
      using Item = std::pair<double, int>;
      std::priority_queue<Item, std::vector<Item>, std::greater<>> pq;
      dist[2 * src] = 0;
      predState[2 * src] = -1;
      pq.push({0, static_cast<int>(2 * src)});
      while (!pq.empty()) {
        const auto [d, state] = pq.top();
        pq.pop();
        if (d > dist[static_cast<std::size_t>(state)]) continue;
        const auto u = static_cast<std::size_t>(state / 2);
        const bool viaNv = state % 2 == 1;
        const NodeKind uk = nodes_[u].kind;
        if (u != src && (uk == NodeKind::nic || (uk == NodeKind::gpu && !viaNv))) continue;
        for (int li : adj[u]) {
          const Link& l = links_[static_cast<std::size_t>(li)];
          if (l.bandwidth < threshold) continue;
          if (u != src && uk == NodeKind::gpu && l.kind != LinkKind::nvlink) continue;
          const auto w = static_cast<std::size_t>(l.a == static_cast<int>(u) ? l.b : l.a);
          const int next = static_cast<int>(2 * w + (l.kind == LinkKind::nvlink ? 1 : 0));
          const double nd = d + l.latency;
          if (nd < dist[static_cast<std::size_t>(next)]) {
            dist[static_cast<std::size_t>(next)] = nd;
            predState[static_cast<std::size_t>(next)] = state;
            predLink[static_cast<std::size_t>(next)] = li;
            pq.push({nd, next});
          }
        }
      }
      for (std::size_t v = 0; v < n; ++v) {
        if (done[v]) continue;
        const int best =
            dist[2 * v] <= dist[2 * v + 1] ? static_cast<int>(2 * v) : static_cast<int>(2 * v + 1);
        if (dist[static_cast<std::size_t>(best)] == kInf) continue;
        done[v] = true;
        Path p{kInf, dist[static_cast<std::size_t>(best)], 0, PathClass::loc};
        bool allNv = true, anySmp = false, anyC2c = false, viaCpu = false, viaGpu = false;
        int switches = 0;
        std::vector<Hop>& route = routes_[src * n + v];
        for (int s = best; predState[static_cast<std::size_t>(s)] >= 0;
             s = predState[static_cast<std::size_t>(s)]) {
          const int li = predLink[static_cast<std::size_t>(s)];
          const Link& l = links_[static_cast<std::size_t>(li)];
          route.insert(route.begin(), Hop{li, l.b == s / 2});
          p.bandwidth = std::min(p.bandwidth, l.bandwidth);
          ++p.hops;
          allNv = allNv && l.kind == LinkKind::nvlink;
          anySmp = anySmp || l.kind == LinkKind::smp;
          anyC2c = anyC2c || l.kind == LinkKind::c2c;
          const auto from = static_cast<std::size_t>(predState[static_cast<std::size_t>(s)] / 2);
          if (from != src) {
            viaCpu = viaCpu || nodes_[from].kind == NodeKind::cpu;
            viaGpu = viaGpu || nodes_[from].kind == NodeKind::gpu;
            switches += nodes_[from].kind == NodeKind::pciSwitch ? 1 : 0;
          }
        }
        if (allNv) {
          p.cls = viaGpu ? PathClass::nvb : PathClass::nvl;
        } else if (anySmp) {
          p.cls = PathClass::sys;
        } else if (anyC2c && !viaCpu) {
          p.cls = PathClass::c2c;
        } else if (viaCpu) {
          p.cls = PathClass::phb;
        } else {
          p.cls = switches <= 1 ? PathClass::pix : PathClass::pxb;
        }
        const PeerAccess& pa = peerAccess(static_cast<int>(src), static_cast<int>(v));
        if (pa.known && !pa.access && p.cls < PathClass::phb) p.cls = PathClass::phb;
        paths_[src * n + v] = p;
      }
    }
  }
}

const PeerAccess& Topology::peerAccess(int fromGpu, int toGpu) const {
  static const PeerAccess kUnknown;
  if (peers_.empty()) return kUnknown;
  return peers_[static_cast<std::size_t>(fromGpu) * nodes_.size() +
                static_cast<std::size_t>(toGpu)];
}

int Topology::nearestNic(int gpuNode) const {
  return nicOfNode_[static_cast<std::size_t>(gpuNode)];
}

void Topology::assignNics() {
  nicOfNode_.assign(nodes_.size(), -1);
  std::map<std::vector<int>, int> turns;  // a set of equally close NICs -> GPUs given one so far
  for (int g : gpus_) {
    std::vector<int> best;
    for (int nic : nics_) {
      if (best.empty()) {
        best.push_back(nic);
        continue;
      }
      const Path& a = path(g, nic);
      const Path& b = path(g, best.front());
      if (a.bandwidth > b.bandwidth || (a.bandwidth == b.bandwidth && a.latency < b.latency)) {
        best.assign(1, nic);
      } else if (a.bandwidth == b.bandwidth && a.latency == b.latency) {
        best.push_back(nic);
      }
    }
    if (best.empty()) continue;
    int& turn = turns[best];
    nicOfNode_[static_cast<std::size_t>(g)] = best[static_cast<std::size_t>(turn++) % best.size()];
  }
}

std::string Topology::summary() const {
  std::ostringstream os;
  std::map<int, int> sms;
  for (int g : gpus_) ++sms[nodes_[static_cast<std::size_t>(g)].sm];
  os << gpus_.size() << " GPU(s)";
  for (const auto& [sm, count] : sms)
    os << (sms.size() > 1 ? " " + std::to_string(count) + "x" : "") << " sm" << sm;
  os << ", " << nics_.size() << " NIC(s)";
  if (!nics_.empty()) {
    char buf[64];
    std::snprintf(buf, sizeof buf, " (%.0f Gb/s)",
                  nodes_[static_cast<std::size_t>(nics_[0])].speedGBs * 8);
    os << buf;
  }
  os << ", " << cpus_.size() << " CPU(s)";
  const bool hasSwitch = std::any_of(nodes_.begin(), nodes_.end(),
                                     [](const Node& x) { return x.kind == NodeKind::nvswitch; });
  if (hasSwitch) os << ", NVSwitch";
  if (gpus_.size() >= 2) {
    double lo = kLocalBandwidth, hi = 0;
    std::set<std::string_view> classes;
    for (int a : gpus_) {
      for (int b : gpus_) {
        if (a == b) continue;
        lo = std::min(lo, path(a, b).bandwidth);
        hi = std::max(hi, path(a, b).bandwidth);
        classes.insert(name(path(a, b).cls));
      }
    }
    os << "; GPU<->GPU";
    for (auto c : classes) os << " " << c;
    char buf[96];
    std::snprintf(buf, sizeof buf, " %.1f-%.1f GB/s", lo, hi);
    os << buf;
  }
  return os.str();
}

std::string Topology::matrix() const {
  std::vector<int> cols = gpus_;
  cols.insert(cols.end(), nics_.begin(), nics_.end());
  std::ostringstream os;
  auto label = [&](int id) {
    const Node& x = nodes_[static_cast<std::size_t>(id)];
    return std::string(name(x.kind)) + std::to_string(x.index);
  };
  char cell[32];
  os << "        ";
  for (int c : cols) {
    std::snprintf(cell, sizeof cell, "%-10s", label(c).c_str());
    os << cell;
  }
  os << "CPU\n";
  for (int r : cols) {
    std::snprintf(cell, sizeof cell, "%-8s", label(r).c_str());
    os << cell;
    for (int c : cols) {
      const Path& p = path(r, c);
      if (r == c) {
        std::snprintf(cell, sizeof cell, "%-10s", "X");
      } else {
        const PeerAccess& pa = peerAccess(r, c);
        std::snprintf(cell, sizeof cell, "%s%s %-*.0f", std::string(name(p.cls)).c_str(),
                      pa.known && !pa.access ? "*" : "", pa.known && !pa.access ? 5 : 6,
                      p.bandwidth);
      }
      os << cell;
    }
    os << "CPU" << nodes_[static_cast<std::size_t>(nodes_[static_cast<std::size_t>(r)].numa)].index
       << "\n";
  }
  os << "\ncells: path class and bottleneck bandwidth in GB/s per direction "
        "(NVL NVLink, NVB NVLink via a GPU, C2C chip-to-chip, PIX one PCIe switch, PXB several, "
        "PHB via a CPU, SYS across CPUs; * no CUDA peer access: through host memory)\n";
  return os.str();
}

}  // namespace weft::topo
