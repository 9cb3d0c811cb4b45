// Fitting the cost model's constants to timed calls: what weft-perf --calibrate --gpu does with
// the calls it times on GPU buffers, where no point-to-point call can time a single hop. At any
// fixed size the model is affine in a protocol's base latency and a link class's hop latency (a
// call pays the base once and each dependent step's hop), so those two are a least-squares fit to
// small calls whose step counts differ; the class's bandwidth scale is what each large call asks
// for, solved alone, and their geometric mean; fitModel alternates the two until they settle.
// perf/README.md (Calibration) has the formulas.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "algorithms/cost_model.hpp"
#include "weft/status.hpp"
#include "weft/types.hpp"

namespace weft::algo {

// One forced (algorithm, protocol) call and its measured time.
struct TimedCall {
  Collective coll = Collective::allReduce;
  std::string algorithm;
  Protocol protocol = Protocol::simple;
  // What the tuner prices: the call's message (an all-gather's whole output).
  std::size_t bytes = 0;
  double measuredUs = 0;
};

// The model's estimate of each call with constants `c` (the order of `calls`).
Result<std::vector<double>> modelTimes(const CostConstants& c, const RankGraph& g,
                                       const std::vector<TimedCall>& calls);

struct LatencyFit {
  double baseUs = 0;
  double hopUs = 0;
  // A value the fit put below the floor, held at the floor while the other was fitted again.
  bool baseFloored = false;
  bool hopFloored = false;
  std::vector<double> modelUs;  // each call's estimate with the fitted pair
};

// Fits baseLatency[p] and hopLatency[p][cls] (every other constant as in `c`) to `calls`, all of
// protocol p, least squares on their times; neither goes below `least` us. Fails when the calls
// cannot tell the two apart (every call pays them in the same proportion), when the model is not
// affine in them for some call, or when the model cannot price a call.
Result<LatencyFit> fitLatencies(const CostConstants& c, const RankGraph& g, Protocol p,
                                LinkClass cls, const std::vector<TimedCall>& calls, double least);

struct BandwidthFit {
  double scale = 1;
  // The scale each call alone asks for (its estimate equal to its time); 0 where the call's time
  // is below what the model charges it at any scale (its latency alone), so it does not count.
  std::vector<double> perCall;
  std::vector<double> modelUs;  // each call's estimate with `scale`
};

// Fits bandwidthScale[cls] (every other constant as in `c`) to `calls`: the geometric mean of
// what each asks for. Fails when no call asks for a scale, or the model cannot price one.
Result<BandwidthFit> fitBandwidthScale(const CostConstants& c, const RankGraph& g, LinkClass cls,
                                       const std::vector<TimedCall>& calls);

// Both: the latencies of both protocols fitted to `small` (by protocol) at the current scale,
// then the scale to `large` at those latencies, in turn until the scale settles (small calls
// feel the bandwidth a little, large ones the latencies). `start` gives every other constant.
struct ModelFit {
  CostConstants constants;
  std::array<LatencyFit, 2> latency;  // by protocol, the last round's
  BandwidthFit bandwidth;
  int rounds = 0;
};
Result<ModelFit> fitModel(const CostConstants& start, const RankGraph& g, LinkClass cls,
                          const std::array<std::vector<TimedCall>, 2>& small,
                          const std::vector<TimedCall>& large, double least);

// A GEMM rate fitted to GEMMs timed alone on a device: their flops and µs. GemmConstants' model
// t = launch + (flops + half) / rate is a line in the flops; the fit minimizes the relative
// errors. `launchUs` stays; the intercept beyond it is the half (floored at 1e-3 GFLOP).
struct GemmFit {
  double tflops = 0, halfGflop = 0;
  std::vector<double> modelUs;  // each GEMM's time by the fitted constants
};
Result<GemmFit> fitGemmRate(const std::vector<std::pair<double, double>>& flopsUs, double launchUs);

}  // namespace weft::algo
