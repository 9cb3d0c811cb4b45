#include "algorithms/rank_graph.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "algorithms/patterns.hpp"
#include "topology/system.hpp"

namespace weft::algo {

int Placement::hosts() const {
  return hostOf.empty() ? 0 : *std::max_element(hostOf.begin(), hostOf.end()) + 1;
}

Placement Placement::regular(int nranks, int hosts, int gpus) {
  Placement p;
  const int perHost = (nranks + std::max(1, hosts) - 1) / std::max(1, hosts);
  for (int r = 0; r < nranks; ++r) {
    p.hostOf.push_back(r / perHost);
    p.gpuOf.push_back(gpus > 0 ? r % perHost % gpus : -1);
  }
  return p;
}

RankGraph RankGraph::fromSystem(const topo::System& system, const std::vector<int>& localGpus) {
  const topo::Topology& host = system.host();
  // The GPUs a host's ranks use, in local-rank order (node ids).
  std::vector<int> gpus;
  if (localGpus.empty()) gpus = host.gpus();
  for (int l : localGpus) gpus.push_back(host.gpus().at(static_cast<std::size_t>(l)));
  // A GPU's bandwidth to the network: min(GPU->NIC path, NIC speed); 0 without NICs.
  auto networkBandwidth = [&](int gpu) {
    const int nic = host.nearestNic(gpu);
    if (nic < 0) return 0.0;
    return std::min(host.path(gpu, nic).bandwidth,
                    host.nodes()[static_cast<std::size_t>(nic)].speedGBs);
  };
  RankGraph g;
  g.ranksPerHost = std::max(1, static_cast<int>(gpus.size()));
  g.hosts = system.hosts();
  g.nranks = g.ranksPerHost * g.hosts;
  g.intraBandwidth = 1e30;  // no host peers: nothing inside a host limits anything
  for (int a : gpus) {
    for (int b : gpus) {
      if (a == b) continue;
      const topo::Path& p = host.path(a, b);
      g.intraBandwidth = std::min(g.intraBandwidth, p.bandwidth);
      g.intraClass = std::max(g.intraClass, p.cls);
    }
  }
  std::map<int, int> sharers;  // NIC -> GPUs using it
  for (int gpu : gpus) ++sharers[host.nearestNic(gpu)];
  g.netPerRank = gpus.empty() ? 0 : 1e30;
  for (std::size_t i = 0; i < gpus.size(); ++i) {
    const int nic = host.nearestNic(gpus[i]);
    const double own = networkBandwidth(gpus[i]);
    const double share =
        nic >= 0 ? host.nodes()[static_cast<std::size_t>(nic)].speedGBs / sharers[nic] : 0;
    g.netPerRank = std::min(g.netPerRank, std::min(own, share));
    g.netAlone = i == 0 ? own : std::min(g.netAlone, own);
  }
  // Traffic patterns inside a host: load every link with the pattern's flows along their routes,
  // and take the tightest share.
  const int G = g.ranksPerHost;
  auto pattern = [&](auto&& peersOf) {
    std::map<std::pair<int, bool>, int> load;
    std::vector<std::pair<int, int>> pairs;
    for (int l = 0; l < G; ++l) {
      for (int m : peersOf(l)) {
        if (m == l) continue;
        pairs.push_back({l, m});
        for (const topo::Hop& h :
             host.route(gpus[static_cast<std::size_t>(l)], gpus[static_cast<std::size_t>(m)])) {
          ++load[{h.link, h.forward}];
        }
      }
    }
    double bw = 1e30;
    for (const auto& [key, count] : load)
      bw = std::min(bw, host.links()[static_cast<std::size_t>(key.first)].bandwidth / count);
    return pairs.empty() ? 1e30 : bw;
  };
  g.shiftBw.assign(static_cast<std::size_t>(G), 1e30);
  g.xorBw.assign(static_cast<std::size_t>(G), 1e30);
  for (int d = 1; d < G; ++d) {
    g.shiftBw[static_cast<std::size_t>(d)] =
        pattern([&](int l) { return std::vector<int>{(l + d) % G}; });
    if ((G & (G - 1)) == 0)
      g.xorBw[static_cast<std::size_t>(d)] =
          pattern([&](int l) { return std::vector<int>{l ^ d}; });
  }
  g.allPairsBw = pattern([&](int) {
    std::vector<int> all(static_cast<std::size_t>(G));
    for (int m = 0; m < G; ++m) all[static_cast<std::size_t>(m)] = m;
    return all;
  });
  {
    // The two trees of the double binary tree on one host's ranks, every edge both ways.
    const auto tree = binaryTree(G);
    g.treeBw = pattern([&](int l) {
      std::vector<int> peers;
      for (int t = 0; t < 2; ++t) {
        const int pos = t == 0 ? l : (G % 2 == 0 ? G - 1 - l : mod(l - 1, G));
        auto rankAt = [&](int p) { return t == 0 ? p : (G % 2 == 0 ? G - 1 - p : mod(p + 1, G)); };
        const TreeNode& node = tree[static_cast<std::size_t>(pos)];
        if (node.parent >= 0) peers.push_back(rankAt(node.parent));
        for (int c : node.children) peers.push_back(rankAt(c));
      }
      return peers;
    });
  }
  {
    const int n = g.nranks;
    const auto tree = binaryTree(n);
    // A hop across hosts between GPUs of one rail (the same NIC index) crosses one fabric switch,
    // between rails three (the simulator's rule, and rhd's below).
    auto railOf = [&](int r) { return host.nearestNic(gpus[static_cast<std::size_t>(r % G)]); };
    struct Path {
      int across = 0, crossRail = 0, inside = 0;
      auto key() const { return std::make_tuple(across, crossRail, inside); }
    };
    Path deepest;
    for (int t = 0; t < 2; ++t) {
      // Position -> rank as the all-reduce trees place them (dbtree.cpp).
      auto rankAt = [&](int p) { return t == 0 ? p : (n % 2 == 0 ? n - 1 - p : mod(p + 1, n)); };
      // Children come after parents in no fixed order, so walk from the root.
      std::vector<Path> hops(static_cast<std::size_t>(n));
      std::vector<int> stack{0};
      while (!stack.empty()) {
        const int p = stack.back();
        stack.pop_back();
        for (int c : tree[static_cast<std::size_t>(p)].children) {
          Path h = hops[static_cast<std::size_t>(p)];
          const int a = rankAt(p), b = rankAt(c);
          if (a / G == b / G) {
            ++h.inside;
          } else {
            ++h.across;
            if (railOf(a) != railOf(b)) ++h.crossRail;
          }
          hops[static_cast<std::size_t>(c)] = h;
          stack.push_back(c);
        }
      }
      for (const Path& h : hops) {
        if (h.key() > deepest.key()) deepest = h;
      }
    }
    g.treeHopsAcross = deepest.across;
    g.treeHopsCrossRail = deepest.crossRail;
    g.treeHopsInside = deepest.inside;
  }
  const bool hasNic = !gpus.empty() && host.nearestNic(gpus[0]) >= 0;
  for (int C = 1; C <= std::max(1, std::min(G, 16)); ++C) {
    // Load in units of "one block": each channel's flows carry 1/C of it.
    std::map<std::pair<int, bool>, double> load;
    std::map<int, std::pair<double, double>> nicLoad;  // NIC -> (out, in)
    std::vector<std::vector<topo::Hop>> chain, cross;
    auto gpu = [&](int l) { return gpus[static_cast<std::size_t>(mod(l, G))]; };
    for (int c = 0; c < C; ++c) {
      for (int k = 0; k + 1 < G; ++k) chain.push_back(host.route(gpu(c + k), gpu(c + k + 1)));
      if (hasNic) {
        const int out = host.nearestNic(gpu(c - 1)), in = host.nearestNic(gpu(c));
        cross.push_back(host.route(gpu(c - 1), out));
        cross.push_back(host.route(in, gpu(c)));
        nicLoad[out].first += 1.0 / C;
        nicLoad[in].second += 1.0 / C;
      }
    }
    for (const auto* part : {&chain, &cross}) {
      for (const auto& route : *part) {
        for (const topo::Hop& h : route) load[{h.link, h.forward}] += 1.0 / C;
      }
    }
    auto timePerUnit = [&](const std::vector<std::vector<topo::Hop>>& routes) {
      double worst = 0;
      for (const auto& route : routes) {
        for (const topo::Hop& h : route) {
          worst = std::max(worst, load[{h.link, h.forward}] /
                                      host.links()[static_cast<std::size_t>(h.link)].bandwidth);
        }
      }
      return worst;
    };
    const double intra = timePerUnit(chain);
    g.ringIntraBw.push_back(intra > 0 ? 1 / intra : 1e30);
    double crossing = timePerUnit(cross);
    for (const auto& [nic, io] : nicLoad) {
      crossing = std::max(crossing, std::max(io.first, io.second) /
                                        host.nodes()[static_cast<std::size_t>(nic)].speedGBs);
    }
    g.ringCrossBw.push_back(hasNic && crossing > 0 ? 1 / crossing : 0);
  }
  // Shifts by d across a row of hosts: the flows that wrap leave through their NIC and enter
  // the next host through the receiver's.
  g.nicOf.assign(static_cast<std::size_t>(G), -1);
  for (int l = 0; l < G; ++l)
    g.nicOf[static_cast<std::size_t>(l)] = host.nearestNic(gpus[static_cast<std::size_t>(l)]);
  for (int l = 0; l < G; ++l) {
    const int nic = g.nicOf[static_cast<std::size_t>(l)];
    if (nic >= 0)
      g.ranksPerNic = std::max(g.ranksPerNic,
                               static_cast<int>(std::count(g.nicOf.begin(), g.nicOf.end(), nic)));
  }
  g.switchLatency = system.fabric().switchLatency;
  g.shiftInsideBw.assign(static_cast<std::size_t>(G), 1e30);
  g.shiftCrossBw.assign(static_cast<std::size_t>(G), 0);
  for (int d = 1; d < G && hasNic; ++d) {
    std::map<std::pair<int, bool>, int> load;
    std::map<int, std::pair<int, int>> nicFlows;  // NIC -> (out, in)
    std::vector<std::vector<topo::Hop>> inside, cross;
    auto gpu = [&](int l) { return gpus[static_cast<std::size_t>(l)]; };
    for (int l = 0; l < G; ++l) {
      const int m = l + d;
      if (m < G) {
        inside.push_back(host.route(gpu(l), gpu(m)));
        continue;
      }
      const int out = g.nicOf[static_cast<std::size_t>(l)];
      const int in = g.nicOf[static_cast<std::size_t>(m - G)];
      cross.push_back(host.route(gpu(l), out));     // leaving this host
      cross.push_back(host.route(in, gpu(m - G)));  // entering the next (the same links here)
      ++nicFlows[out].first;
      ++nicFlows[in].second;
    }
    for (const auto* part : {&inside, &cross}) {
      for (const auto& route : *part) {
        for (const topo::Hop& h : route) ++load[{h.link, h.forward}];
      }
    }
    auto rate = [&](const std::vector<std::vector<topo::Hop>>& routes) {
      double bw = 1e30;
      for (const auto& route : routes) {
        for (const topo::Hop& h : route) {
          bw = std::min(bw, host.links()[static_cast<std::size_t>(h.link)].bandwidth /
                                load[{h.link, h.forward}]);
        }
      }
      return bw;
    };
    double crossBw = rate(cross);
    for (const auto& [nic, io] : nicFlows) {
      const double speed = host.nodes()[static_cast<std::size_t>(nic)].speedGBs;
      crossBw = std::min(crossBw, speed / std::max(io.first, io.second));
    }
    g.shiftInsideBw[static_cast<std::size_t>(d)] = rate(inside);
    g.shiftCrossBw[static_cast<std::size_t>(d)] = crossBw;
  }
  double inverse = 0;
  for (int k = 0; k < G; ++k)
    inverse += 1.0 / pattern([&](int l) { return std::vector<int>{mod(k - l, G)}; });
  g.matchingBw = G > 1 ? G / inverse : 1e30;
  g.fabricLatency = 2 * system.fabric().switchLatency;  // between one (same rail) and three hops
  return g;
}

RankGraph uniformRankGraph(int nranks, topo::PathClass cls, double bandwidth, double treeBw) {
  RankGraph g;
  g.nranks = nranks;
  g.ranksPerHost = nranks;
  g.hosts = 1;
  g.intraClass = cls;
  g.intraBandwidth = bandwidth;
  g.netPerRank = g.netAlone = bandwidth;
  g.shiftBw.assign(static_cast<std::size_t>(nranks) + 1, bandwidth);
  g.xorBw.assign(static_cast<std::size_t>(nranks) + 1, bandwidth);
  g.allPairsBw = bandwidth / std::max(1, nranks - 1);
  g.matchingBw = bandwidth;
  g.treeBw = treeBw;
  g.ringIntraBw.assign(16, bandwidth);
  g.ringCrossBw.assign(16, bandwidth);
  int depth = 0;
  for (int m = 1; m < nranks; m *= 2) ++depth;
  g.treeHopsInside = depth;
  return g;
}

RankGraph sharedMemoryRankGraph(int nranks, const GraphConstants& c) {
  // Shared memory is one copy in and one copy out through the caches: every pattern gets the
  // same per-rank bandwidth, and every hop is a PCIe-class hop in the model's latency table. A
  // tree edge gets an eighth of the copy bandwidth (each slice crosses a rank's FIFOs to and
  // from three neighbours while its other tree runs too), and a rank folds its reductions in
  // series with its copies (36-55 GB/s of bytes folded on the 2-core CI-class VM). Figures:
  // docs/perf.md, "Host all-reduce on 2 ranks, the 2-core CI-class machine".
  RankGraph g = uniformRankGraph(nranks, topo::PathClass::phb, c.hostCopyGBs, c.hostCopyGBs / 8);
  g.hostReduceGBs = c.hostFoldGBs;
  g.hostMemory = true;
  return g;
}

RankGraph sameDeviceRankGraph(int nranks, const DeviceShape& shape, const GraphConstants& c) {
  // Every message is a copy through the GPU's memory, which the ranks' kernels share: an
  // algorithm costs its memory traffic (reads and writes, the FIFO slots' included) over the
  // device's copy bandwidth (4.1 TB/s on the H200), plus its chains of flags (NVLink-class hops,
  // through L2), and two-shot's all-peers waits 12 us per peer past one in every pass. Figures:
  // docs/perf-gpu.md, "where 8 ranks' time went".
  const double perRank = 2000.0 / std::max(1, nranks);
  RankGraph g = uniformRankGraph(nranks, topo::PathClass::nvl, perRank, perRank / 4);
  g.deviceCopyGBs = c.deviceCopyGBs;
  g.deviceChannels = shape.channels;
  g.deviceBytesPerChannel = static_cast<double>(shape.bytesPerChannel);
  g.deviceSlotBytes = static_cast<double>(shape.slotBytes);
  g.deviceAllPeersUs = c.deviceAllPeersUs;
  return g;
}

RankGraph hostRankGraph(const Placement& placement, double netGBs, const GraphConstants& c) {
  const int n = placement.nranks();
  const int hosts = std::max(1, placement.hosts());
  RankGraph g = sharedMemoryRankGraph(n, c);
  if (hosts == 1) return g;
  // Several hosts: each host's ranks share its network; inside a host, shared memory.
  std::vector<int> perHost(static_cast<std::size_t>(hosts), 0);
  for (int h : placement.hostOf) ++perHost[static_cast<std::size_t>(h)];
  const int G = *std::max_element(perHost.begin(), perHost.end());
  const double copy = g.intraBandwidth;
  g.hosts = hosts;
  g.ranksPerHost = G;
  g.netAlone = std::min(copy, netGBs);
  g.netPerRank = std::min(copy, netGBs / G);
  g.ranksPerNic = G;
  g.nicOf.assign(static_cast<std::size_t>(G), 0);
  g.shiftBw.assign(static_cast<std::size_t>(G), copy);
  g.xorBw.assign(static_cast<std::size_t>(G), copy);
  g.allPairsBw = copy / std::max(1, G - 1);
  g.shiftInsideBw.assign(static_cast<std::size_t>(G), copy);
  g.shiftCrossBw.assign(static_cast<std::size_t>(G), g.netPerRank);
  g.ringIntraBw.assign(16, copy);
  g.ringCrossBw.assign(16, g.netAlone);
  int across = 0, inside = 0;
  for (int m = 1; m < hosts; m *= 2) ++across;
  for (int m = 1; m < G; m *= 2) ++inside;
  g.treeHopsAcross = across;
  g.treeHopsInside = inside;
  return g;
}

GpuGraph gpuRankGraph(const topo::Topology& host, const Placement& placement,
                      const DeviceShape& shape, const GraphConstants& c) {
  GpuGraph out;
  const int n = placement.nranks();
  const int hosts = std::max(1, placement.hosts());
  // Host 0's GPUs in local-rank order, and whether any host's ranks share a GPU or run on GPUs
  // the topology does not know.
  std::vector<int> local;
  bool shared = false, unknown = false;
  std::map<int, std::set<int>> used;  // host -> GPUs
  for (int r = 0; r < n; ++r) {
    const auto R = static_cast<std::size_t>(r);
    const int gpu = placement.gpuOf[R];
    if (gpu < 0 || gpu >= static_cast<int>(host.gpus().size())) {
      unknown = true;
      continue;
    }
    if (!used[placement.hostOf[R]].insert(gpu).second) shared = true;
    if (placement.hostOf[R] == 0) local.push_back(gpu);
  }
  if (n <= 1 || shared || unknown) {
    out.graph = sameDeviceRankGraph(n, shape, c);
    out.sameDevice = true;
    out.description =
        std::to_string(n) + " rank(s) " +
        (unknown ? "on GPUs the topology does not list, priced as sharing one" : "sharing a GPU") +
        " (memory traffic at the device's copy bandwidth)";
    return out;
  }
  const topo::System system(host, hosts);
  out.graph = RankGraph::fromSystem(system, local);
  out.graph.nranks = n;
  out.description = std::to_string(n) + " rank(s), " + std::to_string(local.size()) +
                    " GPU(s) a host on " + std::to_string(hosts) + " host(s)";
  if (local.size() > 1) {
    out.description += ": GPU-GPU " + std::string(topo::name(out.graph.intraClass)) + " " +
                       std::to_string(static_cast<int>(out.graph.intraBandwidth + 0.5)) + " GB/s";
  }
  if (hosts > 1) {
    out.description += ", network " + std::to_string(static_cast<int>(out.graph.netPerRank + 0.5)) +
                       " GB/s a rank";
  }
  return out;
}

}  // namespace weft::algo
