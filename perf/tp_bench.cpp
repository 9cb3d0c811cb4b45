#include "perf/tp_bench.hpp"

#include <cstdio>
#include <string>
#include <vector>

#ifdef WEFT_PERF_HAVE_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>

#include "algorithms/overlap.hpp"
#include "fused/cuda_steps.hpp"
#include "fused/tp/overlap.hpp"
#include "perf/calibrate_common.hpp"
#include "perf/element.hpp"
#include "src/core/config.hpp"
#endif

namespace weft::perf {

#ifndef WEFT_PERF_HAVE_CUDA

Status runTpBench(ProcessContext&, int, Comm&, Control&, GpuRank*, int&) {
  return {Code::unsupported, "ag-gemm and gemm-rs need a build with CUDA"};
}

#else

namespace {

double loadElement(const std::byte* p, std::size_t i, DataType t) {
  return withElement(t, [&](auto e) -> double {
    using E = decltype(e);
    typename E::Storage v;
    std::memcpy(&v, p + i * sizeof v, sizeof v);
    if constexpr (E::kFloating) {
      return E::toDouble(v);
    } else {
      return static_cast<double>(v);
    }
  });
}

void storeElement(std::byte* p, std::size_t i, DataType t, double x) {
  withElement(t, [&](auto e) {
    using E = decltype(e);
    typename E::Storage v;
    if constexpr (E::kFloating) {
      v = E::fromDouble(x);
    } else {
      v = static_cast<typename E::Storage>(x);
    }
    std::memcpy(p + i * sizeof v, &v, sizeof v);
  });
}

// The bf16/f16/f32 values of [-1, 1) the ranks' matrices hold (an LCG: filling hundreds of MB
// must not take longer than measuring).
void fillRandom(std::vector<std::byte>& out, DataType type, std::size_t count, std::uint64_t seed) {
  out.resize(count * sizeOf(type));
  std::uint64_t x = seed * 6364136223846793005ULL + 1442695040888963407ULL;
  for (std::size_t i = 0; i < count; ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    const double v = static_cast<double>(x >> 40) / static_cast<double>(1ULL << 24) * 2.0 - 1.0;
    storeElement(out.data(), i, type, v);
  }
}

class TpBench {
 public:
  TpBench(ProcessContext& ctx, int thread, Comm& comm, Control& control, GpuRank& gpu)
      : ctx_(ctx),
        opt_(ctx.options),
        rank_(ctx.proc * ctx.options.threads + thread),
        thread_(thread),
        nranks_(ctx.nprocs * ctx.options.threads),
        comm_(comm),
        control_(control),
        gpu_(gpu),
        ag_(opt_.tp == TpMode::allGatherGemm) {}

  Status run(int& exitCode) {
    // The sequential reference and each --algos variant: a communicator each.
    std::vector<std::string> variants{"unfused"};
    for (const ForcedAlgorithm& f : opt_.algos) variants.push_back(f.algorithm);
    for (const std::string& v : variants) {
      auto c =
          joinWithEnvironment(ctx_, thread_, rank_, nranks_, control_, {{"WEFT_TP_OVERLAP", v}});
      if (!c) return c.status();
      forced_.push_back(std::move(*c));
    }
    auto gemms = fused::tp::Gemms::create();
    if (!gemms) return gemms.status();
    gemms_ = std::move(*gemms);
    // The bench's own GEMMs tuned as the calls' are (WEFT_TP_GEMM_TUNE), the ranks together.
    auto config = Config::fromEnvironment();
    gemmStreams_ = config ? fused::tp::gemmStreams(*config, op()) : 1;
    if (gemmStreams_ > 1) {
      if (Status s = second_.create(); !s) return s;
    }
    gemms_->setFitting(!config || config->tpGemmFit);
    gemms_->setTuning(config && config->tpGemmTune, [this](std::vector<float>& v) -> Status {
      for (float& x : v) {
        auto slowest = control_.combine(x, 3);  // 3: the largest over ranks
        if (!slowest) return slowest.status();
        x = static_cast<float>(*slowest);
      }
      return {};
    });
    header();
    for (DataType type : opt_.types) {
      for (std::size_t m : opt_.gemmM) {
        if (Status s = row(type, m, exitCode); !s) return s;
      }
    }
    return {};
  }

 private:
  algo::TpOp op() const { return ag_ ? algo::TpOp::allGatherGemm : algo::TpOp::gemmReduceScatter; }
  std::size_t cols() const { return opt_.gemmN != 0 ? opt_.gemmN : ag_ ? 28672 : 8192; }
  std::size_t depth() const { return opt_.gemmK != 0 ? opt_.gemmK : ag_ ? 8192 : 28672; }

  void header() const {
    if (rank_ != 0) return;
    std::printf(
        "# weft-perf %s: %s, %d ranks; times in us (%s over ranks, %d timed calls after "
        "%d warm-up); overlap = (sequential - pick) / min(gemm, collective); maxdiff: "
        "the pick's C against the sequential one's, over the largest |C|\n",
        ag_ ? "ag-gemm" : "gemm-rs",
        ag_ ? "C [m, n/s] = allgather(A [m/s, k]) * B [k, n/s]"
            : "C [m/s, n] = reducescatter(A [m, k/s] * B [k/s, n])",
        nranks_,
        opt_.average == 1   ? "mean"
        : opt_.average == 3 ? "max"
                            : "combined",
        opt_.iters, opt_.warmupIters);
    std::printf("# %8s %7s %7s %9s %10s %10s %11s %10s %10s %8s", "m", "n", "k", "type", "gemm",
                "collective", "sequential", "pick", "plan", "overlap");
    for (const ForcedAlgorithm& f : opt_.algos) std::printf(" %10s", f.algorithm.c_str());
    for (const ForcedAlgorithm& f : opt_.algos)
      std::printf(" %10s", ("gemms:" + f.algorithm.substr(f.algorithm.find(':') + 1)).c_str());
    std::printf(" %9s %7s\n", "maxdiff", "#wrong");
  }

  // Seconds per call of `call`, timed on the rank's stream, combined over ranks.
  Result<double> timeUs(const std::function<Status()>& call) {
    for (int i = 0; i < opt_.warmupIters; ++i) {
      if (Status s = call(); !s) return s;
    }
    if (Status s = gpu_.synchronize(); !s) return s;
    if (Status s = control_.barrier(); !s) return s;
    if (Status s = gpu_.recordStart(); !s) return s;
    for (int i = 0; i < opt_.iters; ++i) {
      if (Status s = call(); !s) return s;
    }
    if (Status s = gpu_.recordStop(); !s) return s;
    if (Status s = gpu_.synchronize(); !s) return s;
    auto seconds = gpu_.elapsedSeconds();
    if (!seconds) return seconds.status();
    return control_.combine(*seconds / opt_.iters * 1e6, opt_.average);
  }

  // C's type: A's, or bf16 for fp8 A and B (whose B is given transposed, scales 1, per tensor
  // or per block).
  static DataType outOf(DataType t) { return t == DataType::f8e4m3 ? DataType::bf16 : t; }

  Status tp(Comm& comm, DataType t, std::size_t m, void* c) {
    void* s = gpu_.stream();
    if (t == DataType::f8e4m3) {
      const weftTpFp8 fp8{weftBfloat16, blocks_ ? ones_ : nullptr, blocks_ ? ones_ : nullptr,
                          blocks_ ? weftTpFp8Block128 : weftTpFp8PerTensor, nullptr};
      return ag_ ? comm.allGatherGemmFp8(a_, b_, c, m, cols(), depth(), fp8, s)
                 : comm.gemmReduceScatterFp8(a_, b_, c, m, cols(), depth(), fp8, s);
    }
    return ag_ ? comm.allGatherGemm(a_, b_, c, m, cols(), depth(), t, s)
               : comm.gemmReduceScatter(a_, b_, c, m, cols(), depth(), t, s);
  }

  Status row(DataType t, std::size_t m, int& exitCode) {
    const auto n = static_cast<std::size_t>(nranks_);
    if (m % n != 0 || (ag_ ? cols() : depth()) % n != 0)
      return invalidArgument("m " + std::to_string(m) + " or " + (ag_ ? "n " : "k ") +
                             " does not divide among " + std::to_string(n) + " ranks");
    const DataType ot = outOf(t);
    const std::size_t es = sizeOf(t), cs = sizeOf(ot), rows = m / n;
    const std::size_t aRows = ag_ ? rows : m, aCols = ag_ ? depth() : depth() / n;
    const std::size_t bRows = aCols, bCols = ag_ ? cols() / n : cols();
    const std::size_t cRows = ag_ ? m : rows;
    // The collective alone: all-gather of A into `staging`; reduce-scatter of the GEMM's
    // partial C (`staging`) into C.
    const std::size_t stagingCount = ag_ ? m * depth() : m * cols();
    if (Status s = buffers(aRows * aCols * es, bRows * bCols * es, cRows * bCols * cs,
                           stagingCount * (ag_ ? es : cs));
        !s)
      return s;
    // Block scales (all 1): A's rows' and Bᵀ's tiles', or a GEMM's repacked A scales, batches
    // padded (fused::tp::Gemms::blockScaleFloats).
    blocks_ = t == DataType::f8e4m3 && opt_.fp8Blocks;
    if (blocks_) {
      const std::size_t kb = (aCols + 127) / 128;
      if (Status s = scaleOnes((m + 4 * n) * (kb + 1) + (bCols / 128 + 1) * (kb + 4)); !s) return s;
    }
    std::vector<std::byte> host;
    fillRandom(host, t, aRows * aCols, 2 * static_cast<std::uint64_t>(rank_) + 1);
    if (Status s = gpu_.copyIn(a_, host.data(), host.size()); !s) return s;
    fillRandom(host, t, bRows * bCols, 2 * static_cast<std::uint64_t>(rank_) + 2);
    if (Status s = gpu_.copyIn(b_, host.data(), host.size()); !s) return s;
    // One call through the API before any GEMM of the bench's own: a shape weft refuses (fp8's
    // alignment rules, say) fails with weft's message instead of cuBLASLt's "not supported".
    if (Status s = tp(comm_, t, m, c_); !s) return s;

    const std::size_t rowGrain = blocks_ ? 4 : 1;  // block-scaled rows go in fours
    const algo::TpShape shape{op(), m, cols(), depth(), es, nranks_, cs, rowGrain};
    fused::tp::GemmShape g = fused::tp::chunkGemm(shape, t, ot, 1, 0).shape;  // whole
    g.blockScales = blocks_;
    auto scales = [&](const fused::tp::GemmShape& gemm) {
      if (!blocks_) return fused::tp::GemmScales{};
      return fused::tp::GemmScales{ones_, ones_, fused::tp::Gemms::blockScaleFloats(gemm.m, aCols)};
    };
    void* stream = gpu_.stream();
    auto timeGemm = [&]() -> Result<double> {
      return timeUs([&] {
        return gemms_->run(g, ag_ ? staging_ : a_, b_, ag_ ? c_ : staging_, nullptr, gemmWs_,
                           stream, scales(g));
      });
    };
    auto timeCollective = [&]() -> Result<double> {
      return timeUs([&] {
        const auto type = static_cast<weftDataType_t>(ag_ ? t : ot);
        return ag_ ? checked(
                         weftAllGather(a_, staging_, rows * depth(), type, comm_.handle(), stream),
                         "weftAllGather")
                   : checked(weftReduceScatter(staging_, c_, rows * cols(), type, weftSum,
                                               comm_.handle(), stream),
                             "weftReduceScatter");
      });
    };
    // Every column's timing: the collective and the GEMM (the all-gather fills the GEMM's A;
    // the GEMM the reduce-scatter's input), the sequential call, the pick, each variant, each
    // chunked variant's GEMMs alone, one after another, as it cuts them (fused: none).
    std::vector<std::function<Result<double>()> > columns;
    if (ag_) columns.push_back(timeCollective);
    columns.push_back(timeGemm);
    if (!ag_) columns.push_back(timeCollective);
    columns.push_back([&] { return timeUs([&] { return tp(forced_[0], t, m, ref_); }); });
    columns.push_back([&] { return timeUs([&] { return tp(comm_, t, m, c_); }); });
    for (std::size_t v = 1; v < forced_.size(); ++v)
      columns.push_back([&, v] { return timeUs([&] { return tp(forced_[v], t, m, c_); }); });
    for (const ForcedAlgorithm& f : opt_.algos) {
      const int chunks = *algo::parseTpChunks(f.algorithm);
      if (chunks == algo::kTpFusedInPlace) {  // its GEMMs (algo::tpInPlacePieces) in turn
        columns.push_back([&] {
          return timeUs([&]() -> Status {
            fused::tp::GemmShape piece = g;
            for (const algo::TpPiece& p : algo::tpInPlacePieces(nranks_)) {
              const auto j = static_cast<std::size_t>(p.first);
              piece.m = rows * static_cast<std::size_t>(p.count);
              const std::byte* in =
                  ag_ ? staging_ + j * rows * aCols * es : a_ + j * rows * aCols * es;
              std::byte* out = ag_ ? c_ + j * rows * bCols * cs : staging_ + j * rows * bCols * cs;
              if (Status st =
                      gemms_->run(piece, in, b_, out, nullptr, gemmWs_, stream, scales(piece));
                  !st)
                return st;
            }
            return {};
          });
        });
        continue;
      }
      if (chunks < 1) {  // fused: a GEMM a run of blocks, each waiting for its copies
        columns.push_back([]() -> Result<double> { return -1.0; });
        continue;
      }
      const int k = static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(chunks), rows));
      // On the GEMM streams in turn, as the call runs them (WEFT_TP_GEMM_STREAMS).
      const bool two = fused::tp::gemmLane(gemmStreams_, k, 1) != 0;
      columns.push_back([&, k, two] {
        auto main = static_cast<cudaStream_t>(stream);
        return timeUs([&]() -> Status {
          if (two) {
            if (Status st = fused::follow(second_.stream, main, second_.fork); !st) return st;
          }
          for (int i = 0; i < k; ++i) {
            fused::tp::ChunkGemm ch = fused::tp::chunkGemm(shape, t, ot, k, i);
            ch.shape.blockScales = blocks_;
            std::byte* in = (ag_ ? staging_ : a_) + ch.aOffset * es;
            std::byte* out = (ag_ ? c_ : staging_) + ch.cOffset * cs;
            const int l = fused::tp::gemmLane(gemmStreams_, k, i);
            if (Status st = gemms_->run(
                    ch.shape, in, b_, out, nullptr,
                    gemmWs_ + static_cast<std::size_t>(l) * fused::tp::Gemms::kWorkspaceBytes,
                    l == 0 ? main : second_.stream, scales(ch.shape));
                !st)
              return st;
          }
          return two ? fused::follow(main, second_.stream, second_.join) : Status{};
        });
      });
    }
    // --rounds: the columns in turn, every other round in reverse; each column's median.
    std::vector<std::vector<double> > times(columns.size());
    for (int round = 0; round < opt_.tpRounds; ++round) {
      for (std::size_t i = 0; i < columns.size(); ++i) {
        const std::size_t c = round % 2 == 0 ? i : columns.size() - 1 - i;
        auto us = columns[c]();
        if (!us) return us.status();
        times[c].push_back(*us);
      }
    }
    std::vector<double> medians;
    for (const std::vector<double>& v : times) medians.push_back(calib::median(v));
    const std::size_t nv = forced_.size() - 1;
    const double collUs = medians[ag_ ? 0 : 1], gemmUs = medians[ag_ ? 1 : 0];
    const double sequentialUs = medians[2], pickUs = medians[3];
    const std::vector<double> variants(medians.begin() + 4,
                                       medians.begin() + 4 + static_cast<std::ptrdiff_t>(nv));
    const std::vector<double> chunkGemms(medians.begin() + 4 + static_cast<std::ptrdiff_t>(nv),
                                         medians.end());
    char plan[64] = "?";
    (void)weftTpPlan(comm_.handle(), ag_ ? weftTpAllGatherGemm : weftTpGemmReduceScatter, m, cols(),
                     depth(), static_cast<weftDataType_t>(t), plan, sizeof plan);
    // The check: the pick's C and the sequential one's, from the same inputs.
    double maxDiff = 0;
    std::int64_t wrong = 0;
    if (opt_.checkIters > 0) {
      if (Status s = tp(comm_, t, m, c_); !s) return s;
      if (Status s = tp(forced_[0], t, m, ref_); !s) return s;
      if (Status s = gpu_.synchronize(); !s) return s;
      const std::size_t count = cRows * bCols;
      std::vector<std::byte> got(count * cs), want(count * cs);
      if (Status s = gpu_.copyOut(got.data(), c_, got.size()); !s) return s;
      if (Status s = gpu_.copyOut(want.data(), ref_, want.size()); !s) return s;
      double largest = 0, worst = 0;
      for (std::size_t i = 0; i < count; ++i)
        largest = std::max(largest, std::fabs(loadElement(want.data(), i, ot)));
      for (std::size_t i = 0; i < count; ++i) {
        const double d =
            std::fabs(loadElement(got.data(), i, ot) - loadElement(want.data(), i, ot));
        worst = std::max(worst, std::isnan(d) ? INFINITY : d);
        // Beyond a few bf16 roundings of the largest value: not the same product.
        if (!(d <= 0.02 * largest)) ++wrong;
      }
      auto w = control_.sum(wrong);
      if (!w) return w.status();
      wrong = *w;
      auto worstAll = control_.combine(largest > 0 ? worst / largest : worst, 3);
      if (!worstAll) return worstAll.status();
      maxDiff = *worstAll;
      if (wrong > 0) exitCode = kExitFailed;
    }
    if (rank_ == 0) {
      const double overlap = (sequentialUs - pickUs) / std::min(gemmUs, collUs);
      const std::string type = std::string(tableName(t)) + (blocks_ ? "/128" : "");
      std::printf("  %8zu %7zu %7zu %9s %10.1f %10.1f %11.1f %10.1f %10s %8.2f", m, cols(), depth(),
                  type.c_str(), gemmUs, collUs, sequentialUs, pickUs, plan, overlap);
      for (double us : variants) std::printf(" %10.1f", us);
      for (double us : chunkGemms) {
        if (us < 0) {
          std::printf(" %10s", "N/A");
        } else {
          std::printf(" %10.1f", us);
        }
      }
      if (opt_.checkIters > 0) {
        std::printf(" %9.2e %7lld\n", maxDiff, static_cast<long long>(wrong));
      } else {
        std::printf(" %9s %7s\n", "N/A", "N/A");
      }
    }
    return {};
  }

  // Device buffers for a row, in bytes, grown as the rows do (freed with the GpuRank).
  Status buffers(std::size_t a, std::size_t b, std::size_t c, std::size_t staging) {
    auto grow = [&](std::byte*& p, std::size_t& have, std::size_t bytes) -> Status {
      if (bytes <= have) return {};
      auto fresh = gpu_.allocate(bytes);
      if (!fresh) return fresh.status();
      p = *fresh;
      have = bytes;
      return {};
    };
    if (Status s = grow(a_, aBytes_, a); !s) return s;
    if (Status s = grow(b_, bBytes_, b); !s) return s;
    if (Status s = grow(c_, cBytes_, c); !s) return s;
    if (Status s = grow(ref_, refBytes_, c); !s) return s;
    if (Status s = grow(staging_, stagingBytes_, staging); !s) return s;
    return grow(gemmWs_, gemmWsBytes_, 2 * fused::tp::Gemms::kWorkspaceBytes);
  }

  // At least `count` floats of 1 at ones_.
  Status scaleOnes(std::size_t count) {
    if (count <= onesCount_) return {};
    auto fresh = gpu_.allocate(count * sizeof(float));
    if (!fresh) return fresh.status();
    const std::vector<float> one(count, 1.0f);
    if (Status s = gpu_.copyIn(*fresh, one.data(), count * sizeof(float)); !s) return s;
    ones_ = reinterpret_cast<float*>(*fresh);
    onesCount_ = count;
    return {};
  }

  ProcessContext& ctx_;
  const Options& opt_;
  int rank_, thread_, nranks_;
  Comm& comm_;
  Control& control_;
  GpuRank& gpu_;
  bool ag_;
  std::vector<Comm> forced_;  // [0]: unfused; then each --algos variant
  std::unique_ptr<fused::tp::Gemms> gemms_;
  int gemmStreams_ = 1;  // the chunks' GEMMs' streams (WEFT_TP_GEMM_STREAMS)
  fused::SideStream second_;
  std::byte *a_ = nullptr, *b_ = nullptr, *c_ = nullptr, *ref_ = nullptr, *staging_ = nullptr,
            *gemmWs_ = nullptr;
  std::size_t aBytes_ = 0, bBytes_ = 0, cBytes_ = 0, refBytes_ = 0, stagingBytes_ = 0,
              gemmWsBytes_ = 0;
  bool blocks_ = false;  // this row's fp8 scales per block
  float* ones_ = nullptr;
  std::size_t onesCount_ = 0;
};

}  // namespace

Status runTpBench(ProcessContext& context, int thread, Comm& comm, Control& control, GpuRank* gpu,
                  int& exitCode) {
  if (gpu == nullptr) return {Code::unsupported, "ag-gemm and gemm-rs run on GPU memory"};
  TpBench bench(context, thread, comm, control, *gpu);
  return bench.run(exitCode);
}

#endif

}  // namespace weft::perf
