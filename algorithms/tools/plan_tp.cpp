#include "algorithms/tools/plan_tp.hpp"

#include <cstdio>
#include <iostream>
#include <sstream>
#include <vector>

#include "algorithms/selector.hpp"
#include "algorithms/tools/plan_tune.hpp"
#include "src/tools/cli.hpp"
#include "topology/system.hpp"

namespace weft::algo {

int runTp(const TpArgs& args) {
  if (args.op != "ag-gemm" && args.op != "gemm-rs") {
    std::cerr << "weft-plan: --op " << args.op << ": use ag-gemm or gemm-rs\n";
    return tools::kExitUsage;
  }
  const bool ag = args.op == "ag-gemm";
  std::vector<std::size_t> rows;
  std::stringstream list(args.m);
  for (std::string item; std::getline(list, item, ',');) {
    char* end = nullptr;
    const unsigned long long v = std::strtoull(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v == 0) {
      std::cerr << "weft-plan: --m '" << item << "' is not a row count\n";
      return tools::kExitUsage;
    }
    rows.push_back(v);
  }
  const std::optional<Described> machine = describedMachine(args.topo, args.tuningFile);
  if (!machine) return tools::kExitFailed;
  const topo::System system(machine->host, std::max(1, args.nodes));
  // As the runtime prices them once their devices are set up (Communicator::gpuTunerModel).
  const bool fromFile = !args.tuningFile.empty();
  const Selector selector =
      args.share > 0 ? sharedGpuSelectorFor(args.share, args.sms, machine->options, fromFile,
                                            args.memoryPeakGBs)
                     : gpuSelectorFor(system, machine->options, fromFile, args.memoryPeakGBs);
  const int n = selector.tuner().graph().nranks;
  const std::size_t cols = args.n != 0 ? args.n : ag ? 28672 : 8192;
  const std::size_t depth = args.k != 0 ? args.k : ag ? 8192 : 28672;
  const std::string machineText = args.share > 0
                                      ? std::to_string(args.share) + " ranks sharing its first GPU"
                                      : system.summary();
  std::printf("%s, %s: %s, n %zu, k %zu, bf16, %d ranks; estimates in us\n", args.topo.c_str(),
              machineText.c_str(), ag ? "all-gather + GEMM" : "GEMM + reduce-scatter", cols, depth,
              n);
  std::vector<int> variants{1, 2, 4, 8};
  variants.push_back(kTpFused);
  variants.push_back(kTpFusedInPlace);
  std::printf("%10s %12s %10s %10s %10s", "m", "pick", "estimate", "gemm", "collective");
  for (int v : variants) {
    TpPlan named;
    named.chunks = v;
    std::printf(" %10s", named.name().c_str());
  }
  std::printf("\n");
  for (std::size_t m : rows) {
    const TpShape shape{ag ? TpOp::allGatherGemm : TpOp::gemmReduceScatter, m, cols, depth, 2, n};
    if (m % static_cast<std::size_t>(n) != 0 || (ag ? cols : depth) % static_cast<std::size_t>(n)) {
      std::cerr << "weft-plan: m " << m << " or " << (ag ? "n" : "k") << " does not divide among "
                << n << " ranks\n";
      return tools::kExitUsage;
    }
    auto pick = selector.planTp(shape);
    if (!pick) {
      std::cerr << "weft-plan: " << pick.status().toString() << "\n";
      return tools::kExitFailed;
    }
    std::printf("%10zu %12s %10.1f %10.1f %10.1f", m, pick->name().c_str(), pick->estimateUs,
                pick->gemmUs, pick->commUs);
    for (int v : variants) {
      auto p = selector.planTp(shape, v);
      if (p && p->chunks == v) {
        std::printf(" %10.1f", p->estimateUs);
      } else {
        std::printf(" %10s", "-");
      }
    }
    std::printf("\n");
  }
  return tools::kExitOk;
}

}  // namespace weft::algo
