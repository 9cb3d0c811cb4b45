#include "src/core/machine.hpp"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>

#include "src/core/hash.hpp"
#include "src/exec/cuda_executor.hpp"
#include "topology/discovery.hpp"

namespace weft {
namespace {

std::string lower(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

// A host with CPUs only: what a failed discovery leaves.
std::shared_ptr<const topo::Topology> bareHost() {
  topo::XmlElement system;
  system.name = "system";
  system.set("version", "1");
  auto t = topo::Topology::fromXml(std::move(system), "no discovery");
  return t ? std::make_shared<const topo::Topology>(std::move(*t)) : nullptr;
}

}  // namespace

Result<std::shared_ptr<const topo::Topology>> hostTopology(const std::string& topoFile) {
  static std::mutex mutex;
  static std::map<std::string, std::shared_ptr<const topo::Topology>> known;  // by file ("": ours)
  std::lock_guard lock(mutex);
  if (auto it = known.find(topoFile); it != known.end()) return it->second;
  std::shared_ptr<const topo::Topology> host;
  if (!topoFile.empty()) {
    auto t = topo::Topology::load(topoFile);
    if (!t) {
      return Status(t.status().code(), "WEFT_TOPO_FILE=" + topoFile + ": " + t.status().message());
    }
    host = std::make_shared<const topo::Topology>(std::move(*t));
  } else {
    // CUDA's peer access only where this process runs CUDA already: the driver must not start
    // in a process that may fork (a host-only program, a launcher).
    topo::DiscoveryOptions options;
    options.useCuda = exec::currentDevice() >= 0;
    auto t = topo::discover(options);
    host = t ? std::make_shared<const topo::Topology>(std::move(*t)) : bareHost();
  }
  if (host == nullptr) return internalError("no host topology could be made");
  known.emplace(topoFile, host);
  return host;
}

Result<Machine> Machine::agree(boot::Bootstrap& bootstrap, const std::string& topoFile,
                               const std::vector<std::uint64_t>& hostIds) {
  Machine m;
  auto own = hostTopology(topoFile);
  if (!own) return own.status();
  m.host = *own;
  m.source = topoFile.empty() ? "discovered" : topoFile;
  const std::string xml = topo::writeXml(m.host->xml());
  struct Record {
    std::uint64_t hash, xmlBytes;
  };
  const auto N = static_cast<std::size_t>(bootstrap.size());
  const auto ME = static_cast<std::size_t>(bootstrap.rank());
  std::vector<Record> all(N);
  all[ME] = {fnv1a(xml), xml.size()};
  if (Status s = bootstrap.allGather(all.data(), sizeof(Record)); !s) return s;
  const bool differ =
      std::any_of(all.begin(), all.end(), [&](const Record& r) { return r.hash != all[0].hash; });
  if (differ) {
    // Hosts of different shapes: rank 0's host stands for all, so every rank prices alike.
    const auto bytes = static_cast<std::size_t>(all[0].xmlBytes);
    std::vector<char> text(N * bytes);
    if (ME == 0) std::memcpy(text.data(), xml.data(), bytes);
    if (Status s = bootstrap.allGather(text.data(), bytes); !s) return s;
    if (all[ME].hash != all[0].hash) {
      auto parsed = topo::parseXml(std::string_view(text.data(), bytes), "rank 0's host");
      if (!parsed) return parsed.status();
      auto t = topo::Topology::fromXml(std::move(*parsed), "rank 0's host");
      if (!t) return t.status();
      m.host = std::make_shared<const topo::Topology>(std::move(*t));
      m.source = "rank 0's host";
    }
  }
  std::map<std::uint64_t, int> hostNumber;
  for (std::uint64_t id : hostIds) {
    hostNumber.emplace(id, static_cast<int>(hostNumber.size()));
    m.placement.hostOf.push_back(hostNumber[id]);
  }
  // Until the ranks' devices are known: local rank l on GPU l (NCCL's convention).
  const int gpus = static_cast<int>(m.host->gpus().size());
  std::vector<int> local(hostNumber.size(), 0);
  for (int h : m.placement.hostOf) {
    const int l = local[static_cast<std::size_t>(h)]++;
    m.placement.gpuOf.push_back(gpus > 0 ? l % gpus : -1);
  }
  m.netGBs = m.host->fastestNicGBs();
  return m;
}

Status Machine::learnDevices(boot::Bootstrap& bootstrap, int device, const std::string& busId) {
  struct Record {
    std::int32_t device;
    char busId[28];
  };
  const auto N = static_cast<std::size_t>(bootstrap.size());
  std::vector<Record> all(N);
  Record& self = all[static_cast<std::size_t>(bootstrap.rank())];
  self.device = device;
  std::snprintf(self.busId, sizeof self.busId, "%s", lower(busId).c_str());
  if (Status s = bootstrap.allGather(all.data(), sizeof(Record)); !s) return s;
  // By bus id where the topology's GPUs match the devices (discovery, or a file of this
  // machine); else by device number (a file of another machine, as NCCL_TOPO_FILE is used).
  const std::vector<int>& gpus = host->gpus();
  auto byBus = [&](const Record& r) {
    for (std::size_t i = 0; i < gpus.size(); ++i) {
      if (lower(host->nodes()[static_cast<std::size_t>(gpus[i])].busId) == r.busId)
        return static_cast<int>(i);
    }
    return -1;
  };
  auto byNumber = [&](const Record& r) {
    for (std::size_t i = 0; i < gpus.size(); ++i) {
      if (host->nodes()[static_cast<std::size_t>(gpus[i])].index == r.device)
        return static_cast<int>(i);
    }
    return -1;
  };
  const bool busMatches =
      std::all_of(all.begin(), all.end(), [&](const Record& r) { return byBus(r) >= 0; });
  for (std::size_t q = 0; q < N; ++q)
    placement.gpuOf[q] = busMatches ? byBus(all[q]) : byNumber(all[q]);
  gpusKnown = true;
  return {};
}

algo::GpuGraph Machine::gpuGraph(const algo::DeviceShape& shape,
                                 const algo::GraphConstants& c) const {
  algo::GpuGraph g = algo::gpuRankGraph(*host, placement, shape, c);
  g.description +=
      std::string(gpusKnown ? "" : ", GPUs assumed by local rank") + "; topology " + source;
  return g;
}

std::string bootId() {
  char line[64] = {};  // the file closed before anything allocates (and may throw)
  if (std::FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
    if (std::fgets(line, sizeof line, f) == nullptr) line[0] = '\0';
    std::fclose(f);
  }
  return line;
}

CpuClaim CpuClaim::ofThisProcess(std::uint64_t fallbackId) {
  CpuClaim c;
  const std::string boot = bootId();
  c.machineId = boot.empty() ? fallbackId : fnv1a("boot/" + boot);
  cpu_set_t set;
  CPU_ZERO(&set);
  const bool known = sched_getaffinity(0, sizeof set, &set) == 0;
  const long online = std::min(sysconf(_SC_NPROCESSORS_ONLN), 1024L);
  for (int cpu = 0; cpu < 1024; ++cpu)
    if (known ? CPU_ISSET(cpu, &set) : cpu < online)
      c.cpus[cpu / 64] |= std::uint64_t{1} << (cpu % 64);
  return c;
}

double coreShareOf(const std::vector<CpuClaim>& all, std::size_t me) {
  const CpuClaim& mine = all[me];
  int sharing = 0;
  std::uint64_t pool[16] = {};
  for (const CpuClaim& r : all) {
    if (r.machineId != mine.machineId) continue;
    bool overlaps = false;
    for (int w = 0; w < 16; ++w) overlaps = overlaps || (r.cpus[w] & mine.cpus[w]) != 0;
    if (!overlaps) continue;
    ++sharing;
    for (int w = 0; w < 16; ++w) pool[w] |= r.cpus[w];
  }
  long cpus = 0, own = 0;
  for (int w = 0; w < 16; ++w) {
    cpus += std::popcount(pool[w]);
    own += std::popcount(mine.cpus[w]);
  }
  return std::min(static_cast<double>(std::max(1L, own)),
                  static_cast<double>(std::max(1L, cpus)) / std::max(1, sharing));
}

long coresOf(const std::vector<CpuClaim>& all, std::size_t me) {
  return static_cast<long>(coreShareOf(all, me));
}

double fewestCores(const std::vector<CpuClaim>& all) {
  double fewest = all.empty() ? 1.0 : coreShareOf(all, 0);
  for (std::size_t q = 1; q < all.size(); ++q) fewest = std::min(fewest, coreShareOf(all, q));
  return fewest;
}

}  // namespace weft
