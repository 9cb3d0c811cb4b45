#include "topology/discovery.hpp"

#include <hwloc.h>
#include <sys/utsname.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <set>

#include "topology/cuda_loader.hpp"
#include "topology/nvml_loader.hpp"

namespace weft::topo {
namespace {

std::string readSysfs(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string hex(unsigned v, int digits) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%0*x", digits, v);
  return buf;
}

std::string busIdOf(const hwloc_obj_t o) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%04x:%02x:%02x.%x", o->attr->pcidev.domain, o->attr->pcidev.bus,
                o->attr->pcidev.dev, o->attr->pcidev.func);
  return buf;
}

// Link speed and width as NCCL records them: the device's maximum, from sysfs.
void setLink(XmlElement& pci, const std::string& busId) {
  const std::string base = "/sys/bus/pci/devices/" + busId + "/";
  std::string speed = readSysfs(base + "max_link_speed");
  std::string width = readSysfs(base + "max_link_width");
  pci.set("link_speed", speed.empty() ? "" : speed);
  pci.set("link_width", width.empty() ? "0" : width);
}

// A NIC port's speed in Mb/s: InfiniBand rate ("400 Gb/sec (4X NDR)") or Ethernet speed.
int netSpeed(const std::string& name, hwloc_obj_osdev_type_t type) {
  if (type == HWLOC_OBJ_OSDEV_OPENFABRICS) {
    const std::string rate = readSysfs("/sys/class/infiniband/" + name + "/ports/1/rate");
    const double gbps = std::strtod(rate.c_str(), nullptr);
    if (gbps > 0) return static_cast<int>(gbps * 1000);
  } else {
    const int mbps = std::atoi(readSysfs("/sys/class/net/" + name + "/speed").c_str());
    if (mbps > 0) return mbps;
  }
  return 10000;  // unknown: NCCL's default
}

class HwlocWalker {
 public:
  HwlocWalker(hwloc_topology_t t, XmlElement& system, const DiscoveryOptions& opt)
      : t_(t), system_(system), opt_(opt) {}

  void run() {
    struct utsname u {};
    uname(&u);
    const int numas = hwloc_get_nbobjs_by_type(t_, HWLOC_OBJ_NUMANODE);
    for (int i = 0; i < numas; ++i) {
      hwloc_obj_t numa = hwloc_get_obj_by_type(t_, HWLOC_OBJ_NUMANODE, static_cast<unsigned>(i));
      XmlElement& cpu = system_.add("cpu");
      cpu.set("numaid", std::to_string(numa->os_index));
      char affinity[1024] = "";
      hwloc_bitmap_snprintf(affinity, sizeof affinity, numa->cpuset);
      cpu.set("affinity", affinity);
      cpu.set("arch", std::string(u.machine) == "aarch64" ? "arm64" : u.machine);
      hwloc_obj_t pkg = hwloc_get_ancestor_obj_by_type(t_, HWLOC_OBJ_PACKAGE, numa);
      if (pkg == nullptr) pkg = hwloc_get_obj_by_type(t_, HWLOC_OBJ_PACKAGE, 0);
      auto info = [&](const char* key) {
        const char* v = pkg != nullptr ? hwloc_obj_get_info_by_name(pkg, key) : nullptr;
        return std::string(v != nullptr ? v : "");
      };
      cpu.set("vendor", info("CPUVendor"));
      cpu.set("familyid", info("CPUFamilyNumber").empty() ? "0" : info("CPUFamilyNumber"));
      cpu.set("modelid", info("CPUModelNumber").empty() ? "0" : info("CPUModelNumber"));
      cpuByNuma_[numa] = system_.children.size() - 1;
    }
    if (system_.children.empty()) {  // no NUMA information: one CPU
      XmlElement& cpu = system_.add("cpu");
      cpu.set("numaid", "0").set("arch", u.machine);
    }
    if (!opt_.useHwlocPci) return;
    // Host bridges hang below the normal object closest to them; their PCI trees go under the
    // first NUMA node of that object.
    for (hwloc_obj_t b = hwloc_get_next_bridge(t_, nullptr); b != nullptr;
         b = hwloc_get_next_bridge(t_, b)) {
      if (b->attr->bridge.upstream_type != HWLOC_OBJ_BRIDGE_HOST) continue;
      XmlElement& cpu = system_.children[cpuIndexFor(b)];
      for (hwloc_obj_t c = b->io_first_child; c != nullptr; c = c->next_sibling) walk(c, cpu);
    }
  }

 private:
  std::size_t cpuIndexFor(hwloc_obj_t io) {
    hwloc_obj_t p = hwloc_get_non_io_ancestor_obj(t_, io);
    for (auto& [numa, idx] : cpuByNuma_) {
      if (p != nullptr && hwloc_bitmap_isincluded(numa->cpuset, p->cpuset)) return idx;
    }
    return 0;
  }

  void walk(hwloc_obj_t o, XmlElement& parent) {
    if (o->type == HWLOC_OBJ_BRIDGE) {
      if (o->attr->bridge.upstream_type != HWLOC_OBJ_BRIDGE_PCI) return;
      XmlElement sw;
      sw.name = "pci";
      sw.set("busid", busIdOf(o)).set("class", "0x060400");
      sw.set("vendor", hex(o->attr->pcidev.vendor_id, 4))
          .set("device", hex(o->attr->pcidev.device_id, 4));
      setLink(sw, busIdOf(o));
      for (hwloc_obj_t c = o->io_first_child; c != nullptr; c = c->next_sibling) walk(c, sw);
      if (!sw.children.empty())
        parent.children.push_back(std::move(sw));  // keep switches with devices
      return;
    }
    if (o->type != HWLOC_OBJ_PCI_DEVICE) return;
    const unsigned cls = o->attr->pcidev.class_id;  // base class << 8 | subclass
    const bool nvidiaGpu = o->attr->pcidev.vendor_id == 0x10de && (cls >> 8) == 0x03;
    const bool network = (cls >> 8) == 0x02;
    if (!nvidiaGpu && !network) return;
    XmlElement dev;
    dev.name = "pci";
    const std::string bus = busIdOf(o);
    dev.set("busid", bus).set("class", hex(cls << 8, 6));
    dev.set("vendor", hex(o->attr->pcidev.vendor_id, 4))
        .set("device", hex(o->attr->pcidev.device_id, 4));
    setLink(dev, bus);
    if (nvidiaGpu) {
      dev.add("gpu")
          .set("dev", std::to_string(gpus_))
          .set("sm", "0")
          .set("rank", std::to_string(gpus_))
          .set("gdr", "1");
      ++gpus_;
    } else {
      XmlElement& nic = dev.add("nic");
      for (hwloc_obj_t c = o->io_first_child; c != nullptr; c = c->next_sibling) {
        if (c->type != HWLOC_OBJ_OS_DEVICE) continue;
        const auto type = c->attr->osdev.type;
        if (type != HWLOC_OBJ_OSDEV_OPENFABRICS && type != HWLOC_OBJ_OSDEV_NETWORK) continue;
        nic.add("net")
            .set("name", c->name)
            .set("dev", std::to_string(nics_++))
            .set("speed", std::to_string(netSpeed(c->name, type)))
            .set("port", "1")
            .set("gdr", "0");
      }
      if (nic.children.empty()) return;
    }
    parent.children.push_back(std::move(dev));
  }

  hwloc_topology_t t_;
  XmlElement& system_;
  const DiscoveryOptions& opt_;
  std::map<hwloc_obj_t, std::size_t> cpuByNuma_;
  int gpus_ = 0, nics_ = 0;
};

// Finds the <pci> element of a bus id anywhere in the tree.
XmlElement* findPci(XmlElement& e, const std::string& busId) {
  if (e.name == "pci" && e.attrOr("busid", "") == busId) return &e;
  for (XmlElement& c : e.children) {
    if (XmlElement* f = findPci(c, busId)) return f;
  }
  return nullptr;
}

// NVML numbers the GPUs and knows their NVLinks. A GPU hwloc did not see (a container hiding
// the PCI tree) is placed under the first CPU.
// Removes the <pci> elements of GPUs NVML does not report: once NVML answers, it is authoritative.
void dropUnknownGpus(XmlElement& e, const std::set<std::string>& known) {
  auto unknownGpu = [&](const XmlElement& c) {
    if (c.name != "pci") return false;
    const bool isGpu = std::any_of(c.children.begin(), c.children.end(),
                                   [](const XmlElement& x) { return x.name == "gpu"; });
    return isGpu && known.count(c.attrOr("busid", "")) == 0;
  };
  e.children.erase(std::remove_if(e.children.begin(), e.children.end(), unknownGpu),
                   e.children.end());
  for (XmlElement& c : e.children) dropUnknownGpus(c, known);
}

void applyNvml(XmlElement& system, const std::vector<NvmlGpu>& gpus) {
  std::set<std::string> gpuBuses;
  for (const NvmlGpu& g : gpus) gpuBuses.insert(g.busId);
  dropUnknownGpus(system, gpuBuses);
  for (const NvmlGpu& g : gpus) {
    XmlElement* pci = findPci(system, g.busId);
    if (pci == nullptr) {
      pci = &system.children.front().add("pci");
      pci->set("busid", g.busId).set("class", "0x030200").set("vendor", "0x10de");
      pci->set("link_speed", "").set("link_width", "0");
    }
    pci->children.erase(std::remove_if(pci->children.begin(), pci->children.end(),
                                       [](const XmlElement& c) { return c.name == "gpu"; }),
                        pci->children.end());
    XmlElement& gpu = pci->add("gpu");
    gpu.set("dev", std::to_string(g.index)).set("sm", std::to_string(g.sm));
    gpu.set("rank", std::to_string(g.index)).set("gdr", "1");
    std::map<std::string, std::pair<int, bool>> targets;  // bus -> (count, isSwitch)
    for (const NvmlLink& l : g.nvlinks) {
      auto& [count, isSwitch] = targets[l.remoteBusId];
      ++count;
      // NCCL's rule: a target that is not a GPU of this host is taken for an NVSwitch.
      isSwitch = l.remoteIsSwitch || gpuBuses.count(l.remoteBusId) == 0;
    }
    for (const auto& [bus, info] : targets) {
      gpu.add("nvlink")
          .set("target", bus)
          .set("count", std::to_string(info.first))
          .set("tclass", info.second ? "0x068000" : "0x030200");
    }
  }
}

// Records each GPU's peers as dev numbers on its <gpu>, matching CUDA's devices to the XML's by
// PCI bus id (CUDA's numbering need not be NVML's).
void applyCuda(XmlElement& e, const CudaP2p& cuda, const std::map<std::string, int>& devOf) {
  if (e.name == "pci") {
    const std::string bus = e.attrOr("busid", "");
    for (XmlElement& c : e.children) {
      if (c.name != "gpu") continue;
      const auto self = std::find(cuda.busIds.begin(), cuda.busIds.end(), bus);
      if (self == cuda.busIds.end()) continue;
      const auto a = static_cast<std::size_t>(self - cuda.busIds.begin());
      std::set<int> peers, atomics;  // dev numbers, listed in order
      for (std::size_t b = 0; b < cuda.busIds.size(); ++b) {
        auto dev = devOf.find(cuda.busIds[b]);
        if (b == a || dev == devOf.end()) continue;
        if (cuda.at(a, b).access) peers.insert(dev->second);
        if (cuda.at(a, b).atomics) atomics.insert(dev->second);
      }
      auto join = [](const std::set<int>& devs) {
        std::string out;
        for (int d : devs) out += (out.empty() ? "" : ",") + std::to_string(d);
        return out;
      };
      c.set("p2p_peers", join(peers)).set("p2p_atomics", join(atomics));
    }
  }
  for (XmlElement& c : e.children) applyCuda(c, cuda, devOf);
}

void gpuDevs(const XmlElement& e, std::map<std::string, int>& devOf) {
  if (e.name == "pci") {
    for (const XmlElement& c : e.children) {
      if (c.name == "gpu") devOf[e.attrOr("busid", "")] = std::atoi(c.attrOr("dev", "-1").c_str());
    }
  }
  for (const XmlElement& c : e.children) gpuDevs(c, devOf);
}

}  // namespace

Result<XmlElement> discoverXml(const DiscoveryOptions& options) {
  XmlElement system;
  system.name = "system";
  system.set("version", "1");
  hwloc_topology_t t = nullptr;
  if (hwloc_topology_init(&t) != 0) return Status(Code::systemError, "hwloc_topology_init failed");
  std::unique_ptr<hwloc_topology, void (*)(hwloc_topology_t)> guard(t, hwloc_topology_destroy);
  hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  // Devices come from NVML and the CUDA driver below, and only when asked: hwloc's own GPU
  // plugins would start CUDA or OpenCL in a process that may fork afterwards.
  for (const char* plugin : {"cuda", "nvml", "opencl", "gl", "rsmi", "levelzero"})
    (void)hwloc_topology_set_components(t, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, plugin);
  if (hwloc_topology_load(t) != 0) return Status(Code::systemError, "hwloc_topology_load failed");
  HwlocWalker(t, system, options).run();
  if (options.useNvml) {
    if (auto gpus = queryNvml(options.nvmlLibrary); gpus) applyNvml(system, *gpus);
  }
  if (options.useCuda) {
    if (auto cuda = queryCudaP2p(options.cudaLibrary); cuda) {
      std::map<std::string, int> devOf;
      gpuDevs(system, devOf);
      applyCuda(system, *cuda, devOf);
    }
  }
  return system;
}

Result<Topology> discover(const DiscoveryOptions& options) {
  auto xml = discoverXml(options);
  if (!xml) return xml.status();
  return Topology::fromXml(std::move(*xml), "discovered");
}

Result<Topology> topologyFromEnvironmentOrDiscovery() {
  for (const char* var : {"WEFT_TOPO_FILE", "NCCL_TOPO_FILE"}) {
    const char* path = std::getenv(var);
    if (path != nullptr && *path != '\0') return Topology::load(path);
  }
  return discover();
}

}  // namespace weft::topo
