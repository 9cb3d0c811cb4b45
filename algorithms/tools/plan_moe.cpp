#include "algorithms/tools/plan_moe.hpp"

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <optional>
#include <sstream>
#include <vector>

#include "algorithms/rank_graph.hpp"
#include "algorithms/selector.hpp"
#include "algorithms/tools/plan_tune.hpp"
#include "src/tools/cli.hpp"
#include "topology/system.hpp"

namespace weft::algo {

int runMoe(const MoeArgs& args) {
  if (args.dispatch != "fp8" && args.dispatch != "bf16") {
    std::cerr << "weft-plan: --dispatch " << args.dispatch << ": use fp8 or bf16\n";
    return tools::kExitUsage;
  }
  std::vector<int> nodes;
  std::stringstream list(args.nodes);
  for (std::string item; std::getline(list, item, ',');) {
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 1 || v > 4096) {
      std::cerr << "weft-plan: --nodes '" << item << "' is not a host count\n";
      return tools::kExitUsage;
    }
    nodes.push_back(static_cast<int>(v));
  }
  std::vector<Routing> routings;
  std::vector<std::string> names;
  std::stringstream rl(args.routing);
  for (std::string item; std::getline(rl, item, ',');) {
    auto r = parseRouting(item);
    if (!r) {
      std::cerr << "weft-plan: --routing: " << r.status().message() << "\n";
      return tools::kExitUsage;
    }
    r->seed = args.seed;
    routings.push_back(*r);
    names.push_back(item);
  }
  const std::optional<Described> machine = describedMachine(args.topo, args.tuningFile);
  if (!machine) return tools::kExitFailed;
  std::printf(
      "%s: MoE, %zu tokens a rank, hidden %zu, top-%d of %d experts, %s dispatch, bf16 combine; "
      "tokens counted once per destination rank; busiest: the most tokens a rank sends or "
      "receives (others'), skew that over the mean; GB/s: the busiest rank's bytes over the "
      "estimate\n",
      args.topo.c_str(), args.tokens, args.hidden, args.topk, args.experts, args.dispatch.c_str());
  // Host memory: priced as the runtime prices it, a core a rank.
  const double nicGBs = machine->host.fastestNicGBs();
  const double netGBs = hostNetworkGBs(machine->options.constants.graphs, nicGBs);
  const bool host = args.hostRanks > 0;
  if (host)
    std::printf(
        "# host memory, %d ranks a host, %.2f GB/s a host's network; flat and "
        "hierarchical: each path's estimate over both halves, the pick's halves beside\n",
        args.hostRanks, netGBs);
  std::printf("%6s %12s %10s %10s %6s %12s %12s %10s %10s%s\n", "ranks", "routing", "mean",
              "busiest", "skew", "dispatch us", "combine us", "disp GB/s", "comb GB/s",
              host ? "      flat us      hier us  pick" : "");
  for (int hosts : nodes) {
    std::optional<Selector> chosen;
    std::optional<Rails> rails;
    if (host) {
      const Placement placement = Placement::regular(args.hostRanks * hosts, hosts, 0);
      chosen.emplace(hostSelectorFor(placement, nicGBs, machine->options, 1));
      rails = Rails::of(placement.hostOf);
    } else {
      chosen.emplace(gpuSelectorFor(topo::System(machine->host, hosts), machine->options));
    }
    const Selector& selector = *chosen;
    const int n = selector.tuner().graph().nranks;
    const MoeShape shape =
        MoeShape::of(args.tokens, args.hidden, args.topk, args.experts, n, args.dispatch == "fp8");
    if (Status s = checkMoeShape(shape); !s) {
      std::cerr << "weft-plan: " << s.message() << "\n";
      return tools::kExitUsage;
    }
    for (std::size_t i = 0; i < routings.size(); ++i) {
      const MoeTraffic traffic = simulateRouting(shape, routings[i], rails);
      auto plan = selector.planMoe(shape, traffic);
      if (!plan) {
        std::cerr << "weft-plan: " << plan.status().toString() << "\n";
        return tools::kExitFailed;
      }
      std::size_t all = 0;
      for (int r = 0; r < n; ++r) all += traffic.sentBy(r);
      const std::size_t busiest = traffic.busiest();
      auto gbs = [](double bytes, double us) { return us > 0 ? bytes / us / 1e3 : 0.0; };
      std::printf("%6d %12s %10.0f %10zu %6.2f %12.1f %12.1f %10.1f %10.1f", n, names[i].c_str(),
                  static_cast<double>(all) / n, busiest, plan->skew, plan->dispatchUs,
                  plan->combineUs,
                  gbs(static_cast<double>(busiest * shape.dispatchBytes), plan->dispatchUs),
                  gbs(static_cast<double>(busiest * shape.combineBytes), plan->combineUs));
      if (host && rails) {
        std::printf(" %12.1f %12.1f  %s", plan->flatUs, plan->hierarchicalUs,
                    plan->hierarchical ? "hierarchical" : "flat");
      } else if (host) {
        std::printf(" %12s %12s  %s", "-", "-", "flat (one host)");
      }
      std::printf("\n");
      // GPUs of one host map each other's memory: the GPU kernels' mode and channels.
      if (host || selector.tuner().graph().hosts != 1) continue;
      auto gpu = selector.planMoeGpu(shape, traffic);
      if (gpu) std::printf("#   on GPU memory: %s\n", gpu->reason.c_str());
    }
  }
  return tools::kExitOk;
}

}  // namespace weft::algo
