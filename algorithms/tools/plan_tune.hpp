// weft-plan tune: picks, estimates, simulated times and regret.
#pragma once

#include <optional>
#include <string>

#include "algorithms/tuner.hpp"
#include "topology/topology.hpp"

namespace weft::algo {

struct TuneArgs {
  std::string topo;         // comma-separated topology files
  std::string nodes = "1";  // comma-separated host counts
  std::string colls;        // comma-separated collectives
  std::string sizes = "8:4G";
  std::string svg;
  std::string tuningFile;
  bool summary = false;     // the worst regret per combination instead of the per-size table
  bool candidates = false;  // the per-size table lists every candidate's estimate and sim
  bool settle = false;      // replay each candidate until its link sharing settles
  bool fluid = false;       // replay each candidate with links shared at every instant
  bool schedules = false;   // the tuner's picks among schedules alone, not the runtime selector's
  std::string compress;     // "fp8e4m3:32": calls allowed to cross compressed (bf16 values)
  // Host memory: this many ranks a host (0: GPU memory, a rank a GPU), with this share of a
  // core each (below 1: more ranks than CPUs), priced as the runtime prices them; no replay.
  int hostRanks = 0;
  double coresPerRank = 1;
  // GPU memory, this many ranks sharing one GPU of `sms` SMs (processes under MPS), priced as
  // the runtime prices them (0: a rank a GPU); no replay.
  int share = 0;
  int sms = 132;
  double memoryPeakGBs = 0;  // with share: the GPU's peak memory rate (0: the H200's)
};

int runTune(const TuneArgs& args);

// The environment's tuner options, with `tuningFile`'s constants where one is named.
Result<TunerOptions> tunerOptions(const std::string& tuningFile);

// Those options and the topology file's host, or (printed to stderr) why not.
struct Described {
  TunerOptions options;
  topo::Topology host;
};
std::optional<Described> describedMachine(const std::string& topoFile,
                                          const std::string& tuningFile);

}  // namespace weft::algo
