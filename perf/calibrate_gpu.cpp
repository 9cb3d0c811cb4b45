// weft-perf --calibrate --gpu: times forced ring and pairwise calls on GPU buffers and fits the
// GPU tuner's base and hop latencies (both protocols) and its nvlink bandwidth scale to them
// (algorithms/calibration_fit.hpp), then writes them as a tuning file.
#include <array>
#include <cstdio>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "algorithms/calibration_fit.hpp"
#include "perf/calibrate.hpp"
#include "perf/calibrate_common.hpp"
#include "perf/collective.hpp"
#include "src/core/communicator.hpp"

#ifdef WEFT_PERF_HAVE_CUDA
#include "fused/tp/gemm.hpp"
#endif

namespace weft::perf {
namespace {

using namespace calib;  // NOLINT(google-build-using-namespace): the calibrations' own helpers

// --gpu: the forced calls timed (schedules through the FIFOs, which the model prices; the direct
// kernels it does not), their sizes as weft-perf's (float), and how many of each. Small calls per
// protocol give the latencies: all-reduce's ring takes twice the steps of the others, which
// tells the hop from the base. Large ones (the bulk protocol) give the bandwidth scale.
struct GpuProbe {
  Collective coll;
  const char* algorithm;
};
constexpr GpuProbe kGpuProbes[] = {{Collective::allReduce, "ring"},
                                   {Collective::allGather, "ring"},
                                   {Collective::reduceScatter, "ring"},
                                   {Collective::allToAll, "pairwise"}};
constexpr std::size_t kGpuSmallBytes = 4096;  // a 16-byte line a rank up to 256 ranks
constexpr int kGpuSmallCalls = 200;           // a batch's calls
constexpr int kGpuLargeCalls = 3;
constexpr int kGpuBatches = 7;  // timed, after one untimed

// --gpu: GEMMs rank 0 times alone on its device (the tensor-parallel calls' cuBLASLt GEMMs,
// gemm.tflops and gemm.fp8_tflops): m × kGemmSide × kGemmSide for each m, bf16 and e4m3.
constexpr std::size_t kGemmSide = 8192;
constexpr std::size_t kGemmRows[] = {256, 1024, 4096, 16384};

// One type's GEMMs: flops and µs each.
struct GemmTimes {
  DataType type = DataType::bf16;
  std::vector<std::pair<double, double>> flopsUs;
};

// --gpu: the timed calls, as the fit takes them, and where they ran.
struct GpuMeasured {
  std::array<std::vector<algo::TimedCall>, 2> small;  // by protocol
  std::vector<algo::TimedCall> large;                 // the bulk protocol
  std::vector<GemmTimes> gemms;                       // rank 0's; none without CUDA
  std::string device;                                 // rank 0's GPU's name
  int gpus = 1;                                       // distinct GPUs under the ranks
};

// The GPU tuner's constants before (defaults, or the file it was given) and after the fit.
struct GpuDerived {
  algo::CostConstants before, after;
  std::array<algo::LatencyFit, 2> latency;
  algo::BandwidthFit bandwidth;
  int rounds = 0;                    // of the latencies' and the scale's fits in turn
  std::vector<algo::GemmFit> gemms;  // as GpuMeasured::gemms
  // Every call's estimate before and after: small by protocol, then large.
  std::array<std::vector<double>, 2> smallBefore, smallAfter;
  std::vector<double> largeBefore, largeAfter;
};

Result<GpuDerived> deriveGpu(const GpuMeasured& m, const Communicator::GpuModel& model) {
  const algo::LinkClass cls = algo::linkClassOf(model.graph.intraClass);
  GpuDerived d;
  d.before = model.constants;
  auto fit = algo::fitModel(d.before, model.graph, cls, m.small, m.large, kLeastBaseUs);
  if (!fit) return Status(fit.status().code(), "--calibrate --gpu: " + fit.status().message());
  d.after = fit->constants;
  d.latency = fit->latency;
  d.bandwidth = fit->bandwidth;
  d.rounds = fit->rounds;
  for (std::size_t p : {kLl, kSimple}) {
    auto before = algo::modelTimes(d.before, model.graph, m.small[p]);
    auto after = algo::modelTimes(d.after, model.graph, m.small[p]);
    if (!before || !after) return !before ? before.status() : after.status();
    d.smallBefore[p] = *before;
    d.smallAfter[p] = *after;
  }
  auto before = algo::modelTimes(d.before, model.graph, m.large);
  auto after = algo::modelTimes(d.after, model.graph, m.large);
  if (!before || !after) return !before ? before.status() : after.status();
  d.largeBefore = *before;
  d.largeAfter = *after;
  for (const GemmTimes& g : m.gemms) {
    auto rate = algo::fitGemmRate(g.flopsUs, d.before.gemm.launchUs);
    if (!rate)
      return Status(rate.status().code(), "--calibrate --gpu: " + std::string(name(g.type)) +
                                              " GEMMs: " + rate.status().message());
    // The half from bf16's fit; fp8 keeps it, its rate its own.
    if (g.type == DataType::f8e4m3) {
      d.after.gemm.fp8Tflops = rate->tflops;
    } else {
      d.after.gemm.tflops = rate->tflops;
      d.after.gemm.halfGflop = rate->halfGflop;
    }
    d.gemms.push_back(*rate);
  }
  return d;
}

// Rank 0's GEMMs alone on its device: the median of batches of each shape.
Result<std::vector<GemmTimes>> timeGemms(GpuRank& gpu) {
#ifdef WEFT_PERF_HAVE_CUDA
  auto gemms = fused::tp::Gemms::create();
  if (!gemms) return gemms.status();
  const std::size_t most = kGemmRows[std::size(kGemmRows) - 1];
  auto a = gpu.allocate(most * kGemmSide * 2);
  auto b = gpu.allocate(kGemmSide * kGemmSide * 2);
  auto c = gpu.allocate(most * kGemmSide * 2);
  auto ws = gpu.allocate(fused::tp::Gemms::kWorkspaceBytes);
  for (auto* r : {&a, &b, &c, &ws})
    if (!*r) return r->status();
  std::vector<GemmTimes> out;
  for (DataType t : {DataType::bf16, DataType::f8e4m3}) {
    GemmTimes g;
    g.type = t;
    for (std::size_t m : kGemmRows) {
      fused::tp::GemmShape s;
      s.m = m, s.n = kGemmSide, s.k = kGemmSide;
      s.lda = s.ldb = s.ldc = kGemmSide;
      s.type = t;
      s.out = DataType::bf16;
      s.bTransposed = t == DataType::f8e4m3;
      std::vector<double> batches;
      for (int batch = -1; batch < kGpuBatches; ++batch) {  // one untimed batch first
        if (Status st = gpu.recordStart(); !st) return st;
        for (int i = 0; i < kGpuLargeCalls; ++i) {
          if (Status st = (*gemms)->run(s, *a, *b, *c, nullptr, *ws, gpu.stream()); !st) return st;
        }
        if (Status st = gpu.recordStop(); !st) return st;
        if (Status st = gpu.synchronize(); !st) return st;
        auto seconds = gpu.elapsedSeconds();
        if (!seconds) return seconds.status();
        if (batch >= 0) batches.push_back(*seconds * 1e6 / kGpuLargeCalls);
      }
      g.flopsUs.emplace_back(2.0 * static_cast<double>(m * kGemmSide * kGemmSide), median(batches));
    }
    out.push_back(std::move(g));
  }
  return out;
#else
  (void)gpu;
  return std::vector<GemmTimes>{};
#endif
}

std::string callName(const algo::TimedCall& call) {
  return std::string(name(call.coll)) + " " + call.algorithm + "/" +
         std::string(algo::name(call.protocol));
}

std::string gpuTuningFile(const GpuMeasured& m, const GpuDerived& d, int nranks,
                          const std::string& summary) {
  const algo::CostConstants& c = d.after;
  auto list = [](const std::vector<algo::TimedCall>& calls) {
    std::string out;
    for (std::size_t i = 0; i < calls.size(); ++i)
      out += (i ? ", " : "") + callName(calls[i]) + " " + digits(calls[i].measuredUs) + " us";
    return out;
  };
  auto latencyLine = [&](std::size_t p) {
    const algo::LatencyFit& f = d.latency[p];
    return "base_latency_us." + protoName(p) + " and hop_latency_us." + protoName(p) +
           ".nvlink: the least-squares fit of the GPU tuner's model (a call pays the base once "
           "and the hop at each dependent step; the bandwidth scale below) to " +
           std::to_string(m.small[p].size()) + " calls of weft-perf's size " +
           std::to_string(kGpuSmallBytes) + " B with WEFT_PROTO=" + protoName(p) +
           " and WEFT_ALGO=ring,pairwise (the mean over ranks of the median of " +
           std::to_string(kGpuBatches) + " batches of " + std::to_string(kGpuSmallCalls) +
           " calls, timed by CUDA events): " + list(m.small[p]) +
           (f.hopFloored ? "; the hop came below " + digits(kLeastBaseUs) + " us and is held there"
                         : std::string()) +
           (f.baseFloored
                ? "; the base came below " + digits(kLeastBaseUs) + " us and is held there"
                : std::string()) +
           ".";
  };
  std::string perCall;
  for (std::size_t i = 0; i < m.large.size(); ++i)
    perCall += (i ? ", " : "") + callName(m.large[i]) + " " + digits(m.large[i].measuredUs) +
               " us (" + digits(d.bandwidth.perCall[i]) + ")";
  std::vector<std::string> comment = {
      "Written by weft-perf --calibrate --gpu on " + std::to_string(nranks) + " ranks on " +
          std::to_string(m.gpus) + " " + m.device +
          " GPU(s); keys not here keep CostConstants' defaults. The GPU tuner prices ranks' "
          "kernels as nvlink-class hops and their bytes as memory traffic through one device "
          "(sameDeviceRankGraph); on ranks of separate GPUs the fitted bandwidth scale turns "
          "that device's copy rate into what the links delivered. The direct kernels are not "
          "priced by the model, so no call of theirs is timed here.",
      latencyLine(kLl),
      latencyLine(kSimple),
      "bandwidth_scale.nvlink: the geometric mean of the scale at which the model's estimate of "
      "each of " +
          std::to_string(m.large.size()) + " calls of weft-perf's size " +
          std::to_string(kGpuLargeBytes) +
          " B with WEFT_PROTO=simple (the fitted latencies above; " +
          std::to_string(kGpuLargeCalls) + " calls a batch) equals its time: " + perCall +
          ". A scale of 0 marks a call faster than its latency alone, not counted. The "
          "latencies and the scale were fitted in turn until the scale settled (" +
          std::to_string(d.rounds) + " round(s)): small calls feel the bandwidth a little.",
      "This file's base latencies apply to calls on host buffers too where WEFT_TUNING_FILE "
      "names it; its nvlink keys only to the GPU tuner (host memory is priced as pcie).",
  };
  for (std::size_t i = 0; i < m.gemms.size(); ++i) {
    std::string times;
    for (const auto& [flops, us] : m.gemms[i].flopsUs)
      times += (times.empty() ? "" : ", ") + digits(flops / 1e9) + " GFLOP " + digits(us) + " us";
    const bool fp8 = m.gemms[i].type == DataType::f8e4m3;
    comment.push_back(std::string(fp8 ? "gemm.fp8_tflops" : "gemm.tflops and gemm.half_gflop") +
                      ": the line launch_us + (flops + half) / rate fitted (relative least "
                      "squares, launch_us kept) to rank 0's cuBLASLt GEMMs alone on its device, " +
                      std::string(name(m.gemms[i].type)) + " into bf16, m x " +
                      std::to_string(kGemmSide) + " x " + std::to_string(kGemmSide) + ": " + times +
                      ".");
  }
  std::ostringstream j;
  j << fileHead(comment, nranks,
                ", \"gpus\": " + std::to_string(m.gpus) + ", \"device\": " + jsonString(m.device) +
                    ", \"transport\": " + jsonString(summary))
    << "  \"hop_latency_us\": {\"ll\": {\"nvlink\": " << digits(c.hopLatency[kLl][kNvlink])
    << "}, \"simple\": {\"nvlink\": " << digits(c.hopLatency[kSimple][kNvlink]) << "}},\n"
    << "  \"bandwidth_scale\": {\"nvlink\": " << digits(c.bandwidthScale[kNvlink]) << "},\n"
    << "  \"base_latency_us\": {\"ll\": " << digits(c.baseLatency[kLl])
    << ", \"simple\": " << digits(c.baseLatency[kSimple]) << "}";
  if (!m.gemms.empty())
    j << ",\n  \"gemm\": {\"tflops\": " << digits(c.gemm.tflops)
      << ", \"fp8_tflops\": " << digits(c.gemm.fp8Tflops)
      << ", \"half_gflop\": " << digits(c.gemm.halfGflop)
      << ", \"memory_gbs\": " << digits(c.gemm.memoryGBs) << "}";
  j << "\n}\n";
  return j.str();
}

void printGpuCalibration(const GpuMeasured& m, const GpuDerived& d, int nranks,
                         const std::string& summary) {
  std::printf("#\n# Calibration of the GPU tuner's constants: %d ranks on %d %s GPU(s), %s\n",
              nranks, m.gpus, m.device.c_str(), summary.c_str());
  std::printf("#   %-34s %9s %12s %12s\n", "call (weft-perf size)", "measured", "model before",
              "model after");
  auto rows = [](const std::vector<algo::TimedCall>& calls, const std::vector<double>& before,
                 const std::vector<double>& after, std::size_t bytes) {
    for (std::size_t i = 0; i < calls.size(); ++i) {
      std::printf("#   %-34s %9s %12s %12s\n",
                  (callName(calls[i]) + ", " + sizeName(bytes)).c_str(),
                  (fixed(calls[i].measuredUs, 2) + " us").c_str(), fixed(before[i], 2).c_str(),
                  fixed(after[i], 2).c_str());
    }
  };
  for (std::size_t p : {kLl, kSimple})
    rows(m.small[p], d.smallBefore[p], d.smallAfter[p], kGpuSmallBytes);
  rows(m.large, d.largeBefore, d.largeAfter, kGpuLargeBytes);
  std::printf("#\n#   %-32s %9s %11s  %s\n", "tuning file key", "before", "calibrated", "formula");
  auto key = [](const std::string& name, double before, double after, const std::string& formula) {
    std::printf("#   %-32s %9s %11s  %s\n", name.c_str(), digits(before).c_str(),
                digits(after).c_str(), formula.c_str());
  };
  for (std::size_t p : {kLl, kSimple}) {
    const algo::LatencyFit& f = d.latency[p];
    const std::string floored = f.baseFloored && f.hopFloored ? " (base and hop floored)"
                                : f.baseFloored               ? " (base floored)"
                                : f.hopFloored                ? " (hop floored)"
                                                              : "";
    key("base_latency_us." + protoName(p), d.before.baseLatency[p], d.after.baseLatency[p],
        "least squares over the " + protoName(p) + " calls" + floored);
    key("hop_latency_us." + protoName(p) + ".nvlink", d.before.hopLatency[p][kNvlink],
        d.after.hopLatency[p][kNvlink], "the same fit");
  }
  key("bandwidth_scale.nvlink", d.before.bandwidthScale[kNvlink], d.after.bandwidthScale[kNvlink],
      "geometric mean of the large calls' scales");
  for (std::size_t i = 0; i < m.gemms.size(); ++i) {
    const bool fp8 = m.gemms[i].type == DataType::f8e4m3;
    for (std::size_t r = 0; r < m.gemms[i].flopsUs.size(); ++r)
      std::printf("#   GEMM %-6s %5zu x %zu x %zu %9s us, the fit %9s us\n",
                  std::string(name(m.gemms[i].type)).c_str(), kGemmRows[r], kGemmSide, kGemmSide,
                  fixed(m.gemms[i].flopsUs[r].second, 1).c_str(),
                  fixed(d.gemms[i].modelUs[r], 1).c_str());
    if (fp8) {
      key("gemm.fp8_tflops", d.before.gemm.fp8Tflops, d.after.gemm.fp8Tflops, "the GEMMs' line");
    } else {
      key("gemm.tflops", d.before.gemm.tflops, d.after.gemm.tflops, "the GEMMs' line");
      key("gemm.half_gflop", d.before.gemm.halfGflop, d.after.gemm.halfGflop, "its intercept");
    }
  }
}

}  // namespace

Result<double> Calibration::gpuCallUs(Comm& comm, Collective c, std::size_t bytes, int calls) {
  const Layout l = layoutFor(c, bytes, sizeOf(DataType::f32), nranks_);
  if (Status s = control_.barrier(); !s) return s;
  std::vector<double> batches;
  for (int b = -1; b < kGpuBatches; ++b) {  // one untimed batch first
    if (Status s = gpu_->recordStart(); !s) return s;
    for (int i = 0; i < calls; ++i) {
      if (Status s = launch(c, comm.handle(), deviceSend_, deviceRecv_, l, DataType::f32,
                            RedOp::sum, 0, rank_, nranks_, gpu_->stream());
          !s)
        return failed(s, std::string(name(c)) + " of " + sizeName(bytes), -1);
    }
    if (Status s = gpu_->recordStop(); !s) return s;
    if (Status s = gpu_->synchronize(); !s) return s;
    if (Status s = asyncError(comm.handle()); !s)
      return failed(s, std::string(name(c)) + " of " + sizeName(bytes), -1);
    auto seconds = gpu_->elapsedSeconds();
    if (!seconds) return seconds.status();
    if (b >= 0) batches.push_back(*seconds * 1e6 / calls);
  }
  return control_.combine(median(batches), 1);
}

Status Calibration::runGpu(bool& quietFailure) {
  for (std::byte** b : {&deviceSend_, &deviceRecv_}) {
    auto p = gpu_->allocate(kGpuLargeBytes);
    if (!p) return failed(p.status(), "allocating " + sizeName(kGpuLargeBytes) + " on its GPU", -1);
    *b = *p;
  }
  GpuMeasured m;
  auto buses = control_.gather(gpu_->busId());
  if (!buses) return buses.status();
  std::sort(buses->begin(), buses->end());
  m.gpus = static_cast<int>(std::unique(buses->begin(), buses->end()) - buses->begin());
  m.device = gpu_->name();

  // The calls, on a communicator per protocol that runs ring or pairwise whatever the size.
  std::optional<Communicator::GpuModel> model;
  for (std::size_t p : {kLl, kSimple}) {
    auto comm = joinWithEnvironment(ctx_, thread_, rank_, nranks_, control_,
                                    {{"WEFT_ALGO", "ring,pairwise"}, {"WEFT_PROTO", protoName(p)}});
    if (!comm) return failed(comm.status(), "a communicator with WEFT_PROTO=" + protoName(p), -1);
    made_.push_back(std::move(*comm));
    Comm& forced = made_.back();
    std::vector<std::size_t> sizes = {kGpuSmallBytes};
    if (p == kSimple) sizes.push_back(kGpuLargeBytes);
    for (std::size_t bytes : sizes) {
      for (const GpuProbe& probe : kGpuProbes) {
        const std::string wanted = std::string(probe.algorithm) + "/" + protoName(p);
        auto plan = planOf(forced, probe.coll, bytes);
        if (!plan) return plan.status();
        if (*plan != wanted)
          return internalError("--calibrate --gpu: WEFT_ALGO=ring,pairwise WEFT_PROTO=" +
                               protoName(p) + " runs a " + std::string(name(probe.coll)) + " of " +
                               sizeName(bytes) + " as " + *plan + ", not " + wanted);
        auto us = gpuCallUs(forced, probe.coll, bytes,
                            bytes == kGpuSmallBytes ? kGpuSmallCalls : kGpuLargeCalls);
        if (!us) return us.status();
        const Layout l = layoutFor(probe.coll, bytes, sizeOf(DataType::f32), nranks_);
        algo::TimedCall call;
        call.coll = probe.coll;
        call.algorithm = probe.algorithm;
        call.protocol = static_cast<algo::Protocol>(p);
        // What the tuner prices: the call's message, as Communicator::planFor counts it.
        call.bytes = algo::segments(probe.coll, nranks_).message() *
                     planQuery(probe.coll, l, DataType::f32).count * sizeOf(DataType::f32);
        call.measuredUs = *us;
        (bytes == kGpuSmallBytes ? m.small[p] : m.large).push_back(call);
      }
    }
    // The model the GPU tuner prices with, its channels as this device gives them.
    if (p == kSimple) {
      auto got = gpuTunerModelOf(forced.handle());
      if (!got) return got.status();
      model = *got;
    }
  }

  // Rank 0's GEMMs with the others' kernels done (they wait at the barrier after).
  if (Status s = control_.barrier(); !s) return s;
  // Without cuBLASLt the file keeps the GEMM constants it had, and says why here.
  if (rank_ == 0) {
    auto gemms = timeGemms(*gpu_);
    if (gemms) {
      m.gemms = std::move(*gemms);
    } else {
      std::printf("# --calibrate --gpu: no GEMM rate (%s)\n", gemms.status().toString().c_str());
    }
  }
  if (Status s = control_.barrier(); !s) return s;

  return publish(quietFailure, [&]() -> Result<std::string> {
    // What the GPU tuner's graph takes of the run (the host transport's summary is not it).
    const std::string summary = "GPU buffers, " + std::to_string(model->graph.deviceChannels) +
                                " channel(s) a bulk call, " +
                                sizeName(static_cast<std::size_t>(model->graph.deviceSlotBytes)) +
                                " FIFO slots";
    auto d = deriveGpu(m, *model);
    if (!d) return d.status();
    printGpuCalibration(m, *d, nranks_, summary);
    return gpuTuningFile(m, *d, nranks_, summary);
  });
}

}  // namespace weft::perf
