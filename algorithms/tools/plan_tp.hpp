// weft-plan tp: the selector's pick for the tensor-parallel GEMMs with their collective on a
// described machine, each variant's estimate beside it (the runtime's algo::Selector::planTp).
#pragma once

#include <cstddef>
#include <string>

namespace weft::algo {

struct TpArgs {
  std::string topo;  // topology file
  int nodes = 1;
  std::string op;  // ag-gemm, gemm-rs
  std::string m = "128,1024,4096,16384";
  std::size_t n = 0, k = 0;  // 0: Llama-70B's MLP (as weft-perf's); ranks: every GPU
  std::string tuningFile;
  // Ranks sharing the topology's first GPU (processes under MPS), priced as the runtime prices
  // them (0: a rank a GPU), and that GPU's SMs (the channels their collectives get).
  int share = 0;
  int sms = 132;
  // The GPUs' peak memory rate, GB/s, as the runtime reads it from the device (0: the H200's;
  // 3352 for an H100 SXM): scales the GEMMs' memory rate unless a tuning file gives it.
  double memoryPeakGBs = 0;
};

int runTp(const TpArgs& args);

}  // namespace weft::algo
