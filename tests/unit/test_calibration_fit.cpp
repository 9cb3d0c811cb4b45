// Fitting the GPU tuner's constants to timed calls (weft-perf --calibrate --gpu): times made by the
// model from known constants give those constants back; calls that cannot tell the constants
// apart, and times no constant can explain, are clear errors or floored values.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <vector>

#include "algorithms/calibration_fit.hpp"
#include "algorithms/rank_graph.hpp"
#include "src/core/communicator.hpp"

namespace weft::algo {
namespace {

constexpr auto kNv = static_cast<std::size_t>(LinkClass::nvlink);

// Calls of weft-perf's probes (ring for the block collectives and all-reduce, pairwise for
// all-to-all) at `bytes`, timed as the model prices them with `truth`.
std::vector<TimedCall> timedBy(const CostConstants& truth, const RankGraph& g, Protocol p,
                               std::size_t bytes) {
  std::vector<TimedCall> calls;
  for (auto [coll, algorithm] :
       {std::pair{Collective::allReduce, "ring"}, std::pair{Collective::allGather, "ring"},
        std::pair{Collective::reduceScatter, "ring"},
        std::pair{Collective::allToAll, "pairwise"}}) {
    TimedCall c{coll, algorithm, p, bytes, 0};
    auto e = CostModel(truth).estimate(algorithm, coll, bytes, p, g);
    EXPECT_TRUE(e.isOk()) << e.status().toString();
    c.measuredUs = e->timeUs;
    calls.push_back(c);
  }
  return calls;
}

TEST(CalibrationFit, RecoversTheConstantsThatMadeTheTimes) {
  for (int n : {2, 4, 8}) {
    SCOPED_TRACE(n);
    const RankGraph g = sameDeviceRankGraph(n, {64, 256 * 1024});
    CostConstants truth;
    truth.baseLatency = {2.5, 4.0};
    truth.hopLatency[0][kNv] = 0.9;
    truth.hopLatency[1][kNv] = 3.1;
    truth.bandwidthScale[kNv] = 0.12;
    const std::array<std::vector<TimedCall>, 2> small = {timedBy(truth, g, Protocol::ll, 4096),
                                                         timedBy(truth, g, Protocol::simple, 4096)};
    const auto large = timedBy(truth, g, Protocol::simple, std::size_t{256} << 20);
    // One round from the defaults (the GPU tuner's start): small calls feel the bandwidth a
    // little, which the latencies' fit has not seen yet.
    CostConstants c;
    for (Protocol p : kAllProtocols) {
      const auto pi = static_cast<std::size_t>(p);
      auto fit = fitLatencies(c, g, p, LinkClass::nvlink, small[pi], 0.1);
      ASSERT_TRUE(fit.isOk()) << fit.status().toString();
      EXPECT_NEAR(fit->baseUs, truth.baseLatency[pi], 0.25);  // ll at 8 ranks: 0.105 high
      EXPECT_NEAR(fit->hopUs, truth.hopLatency[pi][kNv], 0.25);
      EXPECT_FALSE(fit->baseFloored || fit->hopFloored);
    }
    // In turn with the scale until it settles: every constant back.
    auto m = fitModel(CostConstants{}, g, LinkClass::nvlink, small, large, 0.1);
    ASSERT_TRUE(m.isOk()) << m.status().toString();
    EXPECT_LT(m->rounds, 10);
    for (std::size_t pi : {0, 1}) {
      EXPECT_NEAR(m->constants.baseLatency[pi], truth.baseLatency[pi], 1e-4);
      EXPECT_NEAR(m->constants.hopLatency[pi][kNv], truth.hopLatency[pi][kNv], 1e-4);
      for (std::size_t i = 0; i < small[pi].size(); ++i)
        EXPECT_NEAR(m->latency[pi].modelUs[i], small[pi][i].measuredUs, 1e-3);
    }
    EXPECT_NEAR(m->constants.bandwidthScale[kNv], 0.12, 0.12 * 1e-5);
    ASSERT_EQ(m->bandwidth.modelUs.size(), large.size());
    for (std::size_t i = 0; i < large.size(); ++i)
      EXPECT_NEAR(m->bandwidth.modelUs[i], large[i].measuredUs, large[i].measuredUs * 1e-5);
  }
}

TEST(CalibrationFit, TheBandwidthScaleAppliesToOneDevicesCopyRate) {
  const RankGraph g = sameDeviceRankGraph(4, {64, 256 * 1024});
  CostConstants half;
  half.bandwidthScale[kNv] = 0.5;
  const std::size_t S = std::size_t{1} << 30;
  auto full = CostModel().estimate("ring", Collective::allGather, S, Protocol::simple, g);
  auto slow = CostModel(half).estimate("ring", Collective::allGather, S, Protocol::simple, g);
  ASSERT_TRUE(full.isOk() && slow.isOk());
  EXPECT_NEAR(slow->bandwidthUs, 2 * full->bandwidthUs, 1e-6 * full->bandwidthUs);
}

TEST(CalibrationFit, CallsOfOneShapeCannotTellBaseFromHop) {
  const RankGraph g = sameDeviceRankGraph(2, {64, 256 * 1024});
  // At 2 ranks all-gather's and reduce-scatter's rings take one step each, as does pairwise.
  auto calls = timedBy(CostConstants{}, g, Protocol::ll, 4096);
  calls.erase(calls.begin());  // without all-reduce's two steps
  auto fit = fitLatencies(CostConstants{}, g, Protocol::ll, LinkClass::nvlink, calls, 0.1);
  ASSERT_FALSE(fit.isOk());
  EXPECT_EQ(fit.status().code(), Code::invalidArgument);
  EXPECT_NE(fit.status().message().find("cannot tell them apart"), std::string::npos)
      << fit.status().message();
  // A call of the other protocol is refused by name.
  auto mixed = timedBy(CostConstants{}, g, Protocol::ll, 4096);
  mixed[1].protocol = Protocol::simple;
  fit = fitLatencies(CostConstants{}, g, Protocol::ll, LinkClass::nvlink, mixed, 0.1);
  ASSERT_FALSE(fit.isOk());
  EXPECT_NE(fit.status().message().find("allgather"), std::string::npos) << fit.status().message();
}

TEST(CalibrationFit, TimesBelowTheModelsFloorAreHeldThere) {
  const RankGraph g = sameDeviceRankGraph(8, {64, 256 * 1024});
  // Every call faster than the model can make it: both latencies at the floor.
  auto calls = timedBy(CostConstants{}, g, Protocol::simple, 4096);
  for (TimedCall& c : calls) c.measuredUs = 0.01;
  auto fit = fitLatencies(CostConstants{}, g, Protocol::simple, LinkClass::nvlink, calls, 0.1);
  ASSERT_TRUE(fit.isOk()) << fit.status().toString();
  EXPECT_DOUBLE_EQ(fit->baseUs, 0.1);
  EXPECT_DOUBLE_EQ(fit->hopUs, 0.1);
  EXPECT_TRUE(fit->baseFloored);
  EXPECT_TRUE(fit->hopFloored);
  // Calls whose steps cost nothing but whose base is large: the hop floored, the base fitted.
  CostConstants flat;
  flat.baseLatency[1] = 9.0;
  flat.hopLatency[1][kNv] = 0;
  fit = fitLatencies(CostConstants{}, g, Protocol::simple, LinkClass::nvlink,
                     timedBy(flat, g, Protocol::simple, 4096), 0.1);
  ASSERT_TRUE(fit.isOk()) << fit.status().toString();
  EXPECT_TRUE(fit->hopFloored);
  EXPECT_FALSE(fit->baseFloored);
  // The floored hop's mean share taken back off: 14 steps of all-reduce's ring, 7 of the others.
  EXPECT_NEAR(fit->baseUs, 9.0 - 0.1 * (14 + 7 + 7 + 7) / 4, 0.01);
  // A large call faster than its latency alone asks for no scale; when none asks, an error.
  auto large = timedBy(CostConstants{}, g, Protocol::simple, std::size_t{256} << 20);
  large[0].measuredUs = 0.5;
  auto bw = fitBandwidthScale(CostConstants{}, g, LinkClass::nvlink, large);
  ASSERT_TRUE(bw.isOk()) << bw.status().toString();
  EXPECT_EQ(bw->perCall[0], 0);
  EXPECT_NEAR(bw->scale, 1.0, 1e-3);  // the others were made at the default scale
  for (TimedCall& c : large) c.measuredUs = 0.5;
  bw = fitBandwidthScale(CostConstants{}, g, LinkClass::nvlink, large);
  ASSERT_FALSE(bw.isOk());
  EXPECT_NE(bw.status().message().find("time larger calls"), std::string::npos);
}

// GEMMs timed on the model's own line give its rate and half back; bad timings are refused.
TEST(CalibrationFit, TheGemmRateAndHalfComeBackFromTheirLine) {
  const double launch = 5, tflops = 700, half = 8;
  std::vector<std::pair<double, double>> timed;
  for (double f : {2e9, 3e10, 5e11, 4e12})
    timed.emplace_back(f, launch + (f + half * 1e9) / (tflops * 1e12) * 1e6);
  auto fit = fitGemmRate(timed, launch);
  ASSERT_TRUE(fit.isOk()) << fit.status().toString();
  EXPECT_NEAR(fit->tflops, tflops, 1e-6 * tflops);
  EXPECT_NEAR(fit->halfGflop, half, 1e-6 * half);
  ASSERT_EQ(fit->modelUs.size(), timed.size());
  for (std::size_t i = 0; i < timed.size(); ++i)
    EXPECT_NEAR(fit->modelUs[i], timed[i].second, 1e-6 * timed[i].second);
  // Faster than the launch alone: the half floors, the rate still fits the slope.
  auto quick = fitGemmRate({{1e12, 1e12 / 7e14 * 1e6}, {2e12, 2e12 / 7e14 * 1e6}}, launch);
  ASSERT_TRUE(quick.isOk());
  EXPECT_NEAR(quick->tflops, 700, 1e-6);
  EXPECT_EQ(quick->halfGflop, 1e-3);
  EXPECT_FALSE(fitGemmRate({{1e12, 100}}, launch).isOk());
  EXPECT_FALSE(fitGemmRate({{1e12, 100}, {2e12, 90}}, launch).isOk());
  EXPECT_FALSE(fitGemmRate({{1e12, 0}, {2e12, 90}}, launch).isOk());
}

}  // namespace
}  // namespace weft::algo
