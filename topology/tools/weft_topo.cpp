// weft-topo: show or dump the machine's topology.
//   weft-topo show [--file F] [--nodes N]
//   weft-topo dump --out F [--file F]
#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>

#include "src/tools/cli.hpp"
#include "topology/discovery.hpp"
#include "topology/system.hpp"

int main(int argc, char** argv) {
  using namespace weft::topo;
  CLI::App app{"weft-topo: the topology weft sees (discovered, or from an NCCL-format XML file)"};
  weft::tools::addVersionFlag(app, "weft-topo");
  app.require_subcommand(1);
  std::string file, out;
  int nodes = 1;
  auto* show = app.add_subcommand("show", "print the GPU/NIC matrix and a summary");
  show->add_option("--file", file, "NCCL topology XML (default: WEFT_TOPO_FILE, else discover)");
  show->add_option("--nodes", nodes, "hosts of this kind on a rail-optimized fabric")
      ->check(CLI::Range(1, 1 << 20));
  auto* dump = app.add_subcommand("dump", "write the topology as NCCL-format XML");
  dump->add_option("--out", out, "file to write")->required();
  dump->add_option("--file", file, "read this file instead of discovering");
  if (auto rc = weft::tools::parse(app, argc, argv)) return *rc;

  auto topo = file.empty() ? topologyFromEnvironmentOrDiscovery() : Topology::load(file);
  if (!topo) {
    std::cerr << "weft-topo: " << topo.status().toString() << "\n";
    return weft::tools::kExitFailed;
  }
  if (app.got_subcommand("dump")) {
    if (auto s = saveXmlFile(topo->xml(), out); !s) {
      std::cerr << "weft-topo: " << s.toString() << "\n";
      return weft::tools::kExitFailed;
    }
    std::printf("wrote %s: %s\n", out.c_str(), topo->summary().c_str());
    return weft::tools::kExitOk;
  }
  const System system(std::move(*topo), nodes);
  std::printf("%s\n%s\n\n%s", system.host().summary().c_str(), system.summary().c_str(),
              system.host().matrix().c_str());
  return 0;
}
