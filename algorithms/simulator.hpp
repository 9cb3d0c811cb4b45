// The simulator: replays a schedule's steps over the system's links with contention, the
// reference the alpha-beta estimates are checked against.
//
// Every message is a flow over the links of its route (GPU -> NVSwitch -> GPU, GPU -> PCIe switch
// -> NIC -> fabric -> NIC -> GPU, ...). A flow's rate is its tightest share of the links it
// crosses; its time is its posting cost plus bytes / rate, and it lands a hop latency later.
// One pass of the step list moves one slice of every block. The pass is replayed with the flows
// of one step index sharing links as a first guess, then again with each flow sharing a link with
// the flows whose transfers overlap its own in time (weighted by the overlap), until it settles.
// The executor pipelines the slices, so the total is that pass plus (slices - 1) slice periods;
// in the steady state every step is busy on some slice, so a period is the larger of the busiest
// rank's serial work and the busiest link's bytes per pass over its bandwidth.
//
// Two ways to replay, and the result says which ran:
//  - full: every rank, steps start when their messages have arrived (trees, chains, small jobs);
//  - representative: only host 0's ranks, for translation-symmetric schedules (ring, PAT,
//    one-shot, two-shot, Bruck, send/recv: a rank's peers are fixed offsets from it). Rank q
//    then lives the timeline of host 0's rank q mod G shifted by whole hosts, and a host's
//    inbound flows mirror its outbound ones, so host 0's links see what every host's do. This is
//    how 16,384 ranks replay in seconds: the generator builds host 0's programs only.
//    Host-swap-symmetric schedules (pairwise and hierarchical all-to-all on an even number of
//    hosts: a matching of hosts per round) replay host 0 the same way, but a message from host
//    b's rank m to host 0's rank l is read from host 0's m to host b's l (the mirror).
//    Halving-doubling (XOR pairs) and trees replay in full.
#pragma once

#include <cstddef>

#include "algorithms/algorithm.hpp"
#include "algorithms/cost_model.hpp"
#include "topology/system.hpp"

namespace weft::algo {

struct SimOptions {
  Protocol protocol = Protocol::simple;
  int channels = 1;
  std::size_t chunkBytes = 512 * 1024;  // one slice of one message on one channel
  int aggregation = 0;                  // PAT's A (0: the cost model's choice for the size)
  bool forceFull = false;               // replay every rank even where symmetry would do
  bool forceRepresentative = false;     // replay host 0 only even where the job is small
  // Iterate the time-based link sharing until the replay settles (Simulator::run says how)
  // instead of the fixed three passes.
  bool settle = false;
  // Replay once with the links shared fluidly: at every instant each link is split evenly among
  // the transfers on it then, re-rated at every start and end of one (exact for that sharing, no
  // iterations; slower). The cross-check of the time-averaged passes, not the tuner's grids.
  bool fluid = false;
};

struct SimResult {
  double timeUs = 0;
  double passUs = 0;        // one pass of the step list over one slice, latency included
  double busyUs = 0;        // one slice period of the pipelined steady state
  bool timeShared = false;  // links shared by overlapping time (false: by step index, too big,
                            // or the fluid replay ran)
  int sharingPasses = 0;    // replays with time-based sharing
  bool settled = false;     // they settled (SimOptions::settle; Simulator::run says when)
  double swingUs = 0;       // > 0: they kept swinging; passUs is the mean of the last few, which
                            // spread this much
  int slices = 1;
  bool representative = false;
};

class Simulator {
 public:
  explicit Simulator(topo::System system, CostConstants constants = {});

  Result<SimResult> run(const Algorithm& algorithm, Collective coll, std::size_t bytes,
                        const SimOptions& options = {}) const;

  // Whether the schedule may be replayed on host 0 alone (Algorithm::translationSymmetric).
  bool usesSymmetry(const Algorithm& algorithm, Collective coll) const;
  // Whether run() does so by default on this system (symmetric, and past the full-replay size).
  bool replaysHostZero(const Algorithm& algorithm, Collective coll) const;

 private:
  struct Flow {
    std::vector<int> resources;
    double alpha = 0;     // latency after the sender is done
    double overhead = 0;  // the sender's own cost of the message
  };
  Flow flow(int from, int to, Protocol p, bool hostZeroOnly) const;
  int resourcesPerHost() const;

  topo::System system_;
  CostConstants c_;
};

}  // namespace weft::algo
