// weft-plan moe: MoE dispatch and combine on a described machine for simulated routings (uniform
// or Zipf-skewed experts): each rank's traffic, the busiest rank, and the selector's estimates
// (the runtime's algo::Selector::planMoe); on host memory across hosts, the flat and the
// hierarchical path.
#pragma once

#include <cstddef>
#include <string>

namespace weft::algo {

struct MoeArgs {
  std::string topo;         // topology file
  std::string nodes = "1";  // hosts of that topology, a list
  std::size_t tokens = 4096, hidden = 7168;
  int topk = 8, experts = 256;
  std::string dispatch = "fp8";  // fp8 (with scales) or bf16
  std::string routing = "uniform,zipf:1.0";
  unsigned long long seed = 1;
  std::string tuningFile;
  // Host memory with this many ranks a host (the flat and the hierarchical path priced across
  // hosts, as the runtime's host selector does); 0: GPU memory, a rank a GPU.
  int hostRanks = 0;
};

int runMoe(const MoeArgs& args);

}  // namespace weft::algo
