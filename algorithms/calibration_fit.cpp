#include "algorithms/calibration_fit.hpp"

#include <algorithm>
#include <cmath>

namespace weft::algo {
namespace {

std::string describe(const TimedCall& call) {
  return std::string(name(call.coll)) + " " + call.algorithm + "/" +
         std::string(name(call.protocol)) + " of " + std::to_string(call.bytes) + " B";
}

Result<double> estimateUs(const CostConstants& c, const RankGraph& g, const TimedCall& call) {
  auto e = CostModel(c).estimate(call.algorithm, call.coll, call.bytes, call.protocol, g);
  if (!e)
    return Status(e.status().code(),
                  "the model cannot price the " + describe(call) + ": " + e.status().message());
  return e->timeUs;
}

// The bounds of the scales the solve looks between: far beyond any machine's.
constexpr double kLeastScale = 1e-4;
constexpr double kMostScale = 1e4;
// fitModel's most rounds: each shrinks the scale's change by the small calls' share of
// bandwidth in their time (a few percent), so a handful settle it.
constexpr int kFitRounds = 20;

}  // namespace

Result<std::vector<double>> modelTimes(const CostConstants& c, const RankGraph& g,
                                       const std::vector<TimedCall>& calls) {
  std::vector<double> out;
  for (const TimedCall& call : calls) {
    auto e = estimateUs(c, g, call);
    if (!e) return e.status();
    out.push_back(*e);
  }
  return out;
}

Result<LatencyFit> fitLatencies(const CostConstants& c, const RankGraph& g, Protocol p,
                                LinkClass cls, const std::vector<TimedCall>& calls, double least) {
  const auto pi = static_cast<std::size_t>(p), ci = static_cast<std::size_t>(cls);
  auto with = [&](double base, double hop) {
    CostConstants k = c;
    k.baseLatency[pi] = base;
    k.hopLatency[pi][ci] = hop;
    return k;
  };
  // Each call's estimate as a + beta * base + eta * hop, read off the model at three points and
  // checked at a fourth.
  const std::size_t n = calls.size();
  std::vector<double> a(n), beta(n), eta(n), rest(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (calls[i].protocol != p)
      return invalidArgument("fitLatencies: the " + describe(calls[i]) + " is not of protocol " +
                             std::string(name(p)));
    auto e00 = estimateUs(with(0, 0), g, calls[i]);
    auto e10 = estimateUs(with(1, 0), g, calls[i]);
    auto e01 = estimateUs(with(0, 1), g, calls[i]);
    auto e23 = estimateUs(with(2, 3), g, calls[i]);
    for (const auto* e : {&e00, &e10, &e01, &e23})
      if (!*e) return e->status();
    a[i] = *e00;
    beta[i] = *e10 - a[i];
    eta[i] = *e01 - a[i];
    const double affine = a[i] + 2 * beta[i] + 3 * eta[i];
    if (std::abs(*e23 - affine) > 1e-6 * std::max(1.0, std::abs(affine)))
      return unsupported("the model's estimate of the " + describe(calls[i]) +
                         " is not affine in its base and hop latencies");
    rest[i] = calls[i].measuredUs - a[i];
  }
  // The normal equations of min sum (beta b + eta h - rest)^2.
  double bb = 0, bh = 0, hh = 0, br = 0, hr = 0;
  for (std::size_t i = 0; i < n; ++i) {
    bb += beta[i] * beta[i];
    bh += beta[i] * eta[i];
    hh += eta[i] * eta[i];
    br += beta[i] * rest[i];
    hr += eta[i] * rest[i];
  }
  const double det = bb * hh - bh * bh;
  if (n < 2 || det <= 1e-9 * std::max(1.0, bb * hh))
    return invalidArgument(
        "fitLatencies: the calls pay the base and hop latencies in the same proportion, so they "
        "cannot tell them apart: time calls with different numbers of steps");
  LatencyFit fit;
  fit.baseUs = (br * hh - hr * bh) / det;
  fit.hopUs = (hr * bb - br * bh) / det;
  // A value below the floor is held there and the other refitted alone.
  if (fit.hopUs < least) {
    fit.hopUs = least;
    fit.hopFloored = true;
    fit.baseUs = (br - bh * least) / bb;
  }
  if (fit.baseUs < least) {
    fit.baseUs = least;
    fit.baseFloored = true;
    if (!fit.hopFloored) fit.hopUs = std::max(least, (hr - bh * least) / hh);
    fit.hopFloored = fit.hopUs <= least;
  }
  for (std::size_t i = 0; i < n; ++i)
    fit.modelUs.push_back(a[i] + beta[i] * fit.baseUs + eta[i] * fit.hopUs);
  return fit;
}

Result<BandwidthFit> fitBandwidthScale(const CostConstants& c, const RankGraph& g, LinkClass cls,
                                       const std::vector<TimedCall>& calls) {
  const auto ci = static_cast<std::size_t>(cls);
  auto at = [&](double scale, const TimedCall& call) {
    CostConstants k = c;
    k.bandwidthScale[ci] = scale;
    return estimateUs(k, g, call);
  };
  BandwidthFit fit;
  double logSum = 0;
  int counted = 0;
  for (const TimedCall& call : calls) {
    // The estimate falls as the scale grows: bisect on its logarithm.
    auto fastest = at(kMostScale, call);
    if (!fastest) return fastest.status();
    if (*fastest >= call.measuredUs) {
      fit.perCall.push_back(0);
      continue;
    }
    double lo = std::log(kLeastScale), hi = std::log(kMostScale);
    for (int i = 0; i < 100 && hi - lo > 1e-9; ++i) {
      const double mid = (lo + hi) / 2;
      auto e = at(std::exp(mid), call);
      if (!e) return e.status();
      (*e > call.measuredUs ? lo : hi) = mid;
    }
    const double scale = std::exp((lo + hi) / 2);
    fit.perCall.push_back(scale);
    logSum += std::log(scale);
    ++counted;
  }
  if (counted == 0)
    return invalidArgument(
        "fitBandwidthScale: every call took less than the model charges it at any bandwidth (its "
        "latency alone): time larger calls");
  fit.scale = std::exp(logSum / counted);
  CostConstants k = c;
  k.bandwidthScale[ci] = fit.scale;
  auto times = modelTimes(k, g, calls);
  if (!times) return times.status();
  fit.modelUs = std::move(*times);
  return fit;
}

Result<ModelFit> fitModel(const CostConstants& start, const RankGraph& g, LinkClass cls,
                          const std::array<std::vector<TimedCall>, 2>& small,
                          const std::vector<TimedCall>& large, double least) {
  const auto ci = static_cast<std::size_t>(cls);
  ModelFit m;
  m.constants = start;
  for (m.rounds = 1; m.rounds <= kFitRounds; ++m.rounds) {
    for (Protocol p : kAllProtocols) {
      const auto pi = static_cast<std::size_t>(p);
      auto fit = fitLatencies(m.constants, g, p, cls, small[pi], least);
      if (!fit) return fit.status();
      m.latency[pi] = *fit;
      m.constants.baseLatency[pi] = fit->baseUs;
      m.constants.hopLatency[pi][ci] = fit->hopUs;
    }
    auto bw = fitBandwidthScale(m.constants, g, cls, large);
    if (!bw) return bw.status();
    const double was = m.constants.bandwidthScale[ci];
    m.bandwidth = *bw;
    m.constants.bandwidthScale[ci] = bw->scale;
    if (std::abs(bw->scale - was) <= 1e-6 * was) break;
  }
  m.rounds = std::min(m.rounds, kFitRounds);
  return m;
}

Result<GemmFit> fitGemmRate(const std::vector<std::pair<double, double>>& flopsUs,
                            double launchUs) {
  // Weighted least squares of t = a + b·F with weights 1/t²: relative errors alike.
  double sw = 0, sf = 0, st = 0, sff = 0, sft = 0;
  for (const auto& [f, t] : flopsUs) {
    if (!(t > 0) || !(f > 0)) return invalidArgument("a GEMM timed at no time or no flops");
    const double w = 1 / (t * t);
    sw += w, sf += w * f, st += w * t, sff += w * f * f, sft += w * f * t;
  }
  const double det = sw * sff - sf * sf;
  if (flopsUs.size() < 2 || !(det > 0))
    return invalidArgument("a GEMM rate needs GEMMs of at least two sizes");
  const double b = (sw * sft - sf * st) / det, a = (st - b * sf) / sw;
  if (!(b > 0)) return invalidArgument("larger GEMMs did not take longer: no rate to fit");
  GemmFit fit;
  fit.tflops = 1e-6 / b;  // flops per µs, in TFLOP/s
  fit.halfGflop = std::max(1e-3, (a - launchUs) / b * 1e-9);
  for (const auto& fu : flopsUs)
    fit.modelUs.push_back(launchUs + (fu.first + fit.halfGflop * 1e9) * b);
  return fit;
}

}  // namespace weft::algo
