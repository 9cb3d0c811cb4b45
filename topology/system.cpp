#include "topology/system.hpp"

#include <algorithm>
#include <cstdio>

namespace weft::topo {

System::System(Topology host, int hosts, Fabric fabric)
    : host_(std::move(host)), hosts_(std::max(1, hosts)), fabric_(fabric) {
  for (int g : host_.gpus()) {
    const int nic = host_.nearestNic(g);
    nicOf_.push_back(nic);
    const auto& nics = host_.nics();
    railOf_.push_back(
        nic < 0 ? -1 : static_cast<int>(std::find(nics.begin(), nics.end(), nic) - nics.begin()));
  }
}

double System::networkBandwidth(int localGpu) const {
  const int nic = nicOf_[static_cast<std::size_t>(localGpu)];
  if (nic < 0) return 0;
  const int gpu = host_.gpus()[static_cast<std::size_t>(localGpu)];
  return std::min(host_.path(gpu, nic).bandwidth,
                  host_.nodes()[static_cast<std::size_t>(nic)].speedGBs);
}

Path System::path(int rankA, int rankB) const {
  const int g = gpusPerHost();
  const int la = rankA % g, lb = rankB % g;
  const int ga = host_.gpus()[static_cast<std::size_t>(la)];
  const int gb = host_.gpus()[static_cast<std::size_t>(lb)];
  if (hostOf(rankA) == hostOf(rankB)) return host_.path(ga, gb);
  Path p;
  p.cls = PathClass::net;
  const int na = nicOf_[static_cast<std::size_t>(la)], nb = nicOf_[static_cast<std::size_t>(lb)];
  if (na < 0 || nb < 0) return p;  // bandwidth 0: hosts without NICs cannot talk
  const bool sameRail =
      railOf_[static_cast<std::size_t>(la)] == railOf_[static_cast<std::size_t>(lb)];
  const int switches = sameRail ? 1 : 3;
  p.bandwidth = std::min(networkBandwidth(la), networkBandwidth(lb));
  p.latency = host_.path(ga, na).latency + host_.path(nb, gb).latency + 2 * fabric_.nicLatency +
              switches * fabric_.switchLatency;
  p.hops = host_.path(ga, na).hops + host_.path(nb, gb).hops + switches + 1;
  return p;
}

std::string System::summary() const {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%d host(s) x %d GPU(s) = %d ranks", hosts_, gpusPerHost(),
                ranks());
  std::string out = buf;
  if (hosts_ > 1) {
    std::snprintf(buf, sizeof buf, "; rail-optimized fabric, %.0f GB/s per GPU to the network",
                  gpusPerHost() > 0 ? networkBandwidth(0) : 0.0);
    out += buf;
  }
  return out;
}

}  // namespace weft::topo
