#include "perf/attention_bench.hpp"

#include <cstdio>
#include <string>
#include <vector>

#ifdef WEFT_PERF_HAVE_CUDA
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <functional>

#include "fused/attention/local.hpp"
#include "fused/attention/merge.hpp"
#endif

namespace weft::perf {

#ifndef WEFT_PERF_HAVE_CUDA

Status runAttentionBench(ProcessContext&, int, Comm&, Control&, GpuRank*, int&) {
  return {Code::unsupported, "attention needs a build with CUDA"};
}

#else

namespace {

namespace att = fused::attention;

// bf16 values of N(0, 1)-like spread from an LCG (the same on every rank: the whole sequence).
std::vector<std::uint16_t> randomBf16(std::size_t count, std::uint64_t seed) {
  std::vector<std::uint16_t> out(count);
  std::uint64_t x = seed * 6364136223846793005ULL + 1442695040888963407ULL;
  for (auto& b : out) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    const float v =
        (static_cast<float>(x >> 40) / static_cast<float>(1ULL << 24) * 2.0f - 1.0f) * 1.7f;
    b = static_cast<__nv_bfloat16_raw>(__float2bfloat16(v)).x;
  }
  return out;
}

float widen(std::uint16_t b) {
  __nv_bfloat16_raw r;
  r.x = b;
  return __bfloat162float(__nv_bfloat16(r));
}

class AttentionBench {
 public:
  AttentionBench(ProcessContext& ctx, int thread, Comm& comm, Control& control, GpuRank& gpu)
      : opt_(ctx.options),
        rank_(ctx.proc * ctx.options.threads + thread),
        nranks_(ctx.nprocs * ctx.options.threads),
        comm_(comm),
        control_(control),
        gpu_(gpu) {}

  Status run(int& exitCode) {
    if (rank_ == 0) {
      std::printf(
          "# weft-perf attention: ring attention's forward pass, bf16, %d ranks, one sequence; "
          "times in us (%s over ranks, %d timed calls after %d warm-up); whole: rank 0 alone "
          "attending the whole sequence; kernel: a rank's share of the work without the ring; "
          "TFLOP/s a rank (causal: half the pairs); vs whole = whole / ring; overlap = kernel / "
          "ring; maxdiff: every rank's output against the whole sequence's\n",
          nranks_,
          opt_.average == 1   ? "mean"
          : opt_.average == 3 ? "max"
                              : "combined",
          opt_.iters, opt_.warmupIters);
      std::printf("# %8s %6s %6s %4s %6s %10s %10s %10s %9s %8s %8s %9s %7s\n", "seq", "heads",
                  "kvh", "dim", "causal", "whole", "kernel", "ring", "TFLOP/s", "vs whole",
                  "overlap", "maxdiff", "#wrong");
    }
    for (std::size_t seq : opt_.attentionSeq) {
      if (Status s = row(seq, exitCode); !s) return s;
    }
    return {};
  }

 private:
  Result<double> timeUs(const std::function<Status()>& call, bool alone = false) {
    const bool runs = !alone || rank_ == 0;
    for (int i = 0; runs && i < opt_.warmupIters; ++i) {
      if (Status s = call(); !s) return s;
    }
    if (Status s = gpu_.synchronize(); !s) return s;
    if (Status s = control_.barrier(); !s) return s;
    if (Status s = gpu_.recordStart(); !s) return s;
    for (int i = 0; runs && i < opt_.iters; ++i) {
      if (Status s = call(); !s) return s;
    }
    if (Status s = gpu_.recordStop(); !s) return s;
    if (Status s = gpu_.synchronize(); !s) return s;
    auto seconds = gpu_.elapsedSeconds();
    if (!seconds) return seconds.status();
    if (Status s = control_.barrier(); !s) return s;
    return control_.combine(runs ? *seconds / opt_.iters * 1e6 : 0.0, alone ? 3 : opt_.average);
  }

  Result<std::byte*> upload(const std::vector<std::uint16_t>& host) {
    auto p = gpu_.allocate(host.size() * 2 + 256);
    if (!p) return p.status();
    if (Status s = gpu_.copyIn(*p, host.data(), host.size() * 2); !s) return s;
    return *p;
  }

  Status row(std::size_t seq, int& exitCode) {
    const int n = nranks_, heads = opt_.attentionHeads, kvHeads = opt_.attentionKvHeads;
    const int dim = opt_.attentionDim;
    const bool causal = opt_.attentionCausal;
    const auto D = static_cast<std::size_t>(dim);
    const auto H = static_cast<std::size_t>(heads), G = static_cast<std::size_t>(kvHeads);
    const std::int32_t whole[2] = {0, static_cast<std::int32_t>(seq)};
    std::int32_t mine[2] = {0, 0};
    std::vector<std::int32_t> positions(seq);
    if (weftZigzagLocal(whole, 1, n, rank_, mine, positions.data()) != weftSuccess)
      return invalidArgument(std::string("attention --seq ") + std::to_string(seq) + ": " +
                             weftGetLastError());
    const auto local = static_cast<std::size_t>(mine[1]);
    // The whole sequence (every rank the same), then this rank's share of it.
    const auto q = randomBf16(seq * H * D, 1), k = randomBf16(seq * G * D, 2),
               v = randomBf16(seq * G * D, 3);
    auto shard = [&](const std::vector<std::uint16_t>& all, std::size_t row) {
      std::vector<std::uint16_t> out(local * row);
      for (std::size_t i = 0; i < local; ++i)
        std::copy_n(
            all.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(positions[i]) * row),
            row, out.begin() + static_cast<std::ptrdiff_t>(i * row));
      return out;
    };
    std::byte *gq, *gk, *gv, *lq, *lk, *lv, *gout, *out, *partials, *cu;
    float *glse, *lse;
    for (auto [p, host] : {std::pair{&gq, &q}, {&gk, &k}, {&gv, &v}}) {
      auto d = upload(*host);
      if (!d) return d.status();
      *p = *d;
    }
    const auto sq = shard(q, H * D), sk = shard(k, G * D), sv = shard(v, G * D);
    for (auto [p, host] : {std::pair{&lq, &sq}, {&lk, &sk}, {&lv, &sv}}) {
      auto d = upload(*host);
      if (!d) return d.status();
      *p = *d;
    }
    for (auto [p, bytes] : {std::pair{&gout, seq * H * D * 2},
                            {&out, local * H * D * 2},
                            {&partials, local * H * D * 4},
                            {&cu, std::size_t{64}},
                            {reinterpret_cast<std::byte**>(&glse), seq * H * 4},
                            {reinterpret_cast<std::byte**>(&lse), local * H * 4}}) {
      auto d = gpu_.allocate(bytes + 256);
      if (!d) return d.status();
      *p = *d;
    }
    const std::int32_t cus[4] = {0, static_cast<std::int32_t>(seq), 0,
                                 static_cast<std::int32_t>(local)};
    if (Status s = gpu_.copyIn(cu, cus, sizeof cus); !s) return s;
    const auto* cuWhole = reinterpret_cast<const std::int32_t*>(cu);
    const auto* cuLocal = cuWhole + 2;
    void* stream = gpu_.stream();
    const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
    att::LocalAttention w;
    w.q = gq, w.k = gk, w.v = gv, w.cuSeqlensQ = w.cuSeqlensK = cuWhole, w.sequences = 1;
    w.tokensQ = w.maxSeqlenQ = seq, w.heads = heads, w.kvHeads = kvHeads, w.dim = dim;
    w.scale = scale, w.piece = {att::Part::all, att::Part::all, causal}, w.out = gout, w.lse = glse;
    auto wholeUs = timeUs([&] { return att::attendOnDevice(w, stream); }, true);
    if (!wholeUs) return wholeUs.status();
    // A rank's share without the ring: its pieces against its own block.
    att::LocalAttention part = w;
    part.q = lq, part.k = lk, part.v = lv, part.cuSeqlensQ = part.cuSeqlensK = cuLocal;
    part.tokensQ = part.maxSeqlenQ = local, part.out = partials, part.lse = lse, part.merge = true;
    const att::MergeShape shape{local, H, D};
    auto kernelUs = timeUs([&]() -> Status {
      if (Status s = att::resetPartials(reinterpret_cast<float*>(partials), lse, shape, stream); !s)
        return s;
      for (int step = 0; step < n; ++step) {
        part.piece = att::ringStep(rank_, step, n, causal);
        if (Status s = att::attendOnDevice(part, stream); !s) return s;
      }
      return att::finishPartials(out, reinterpret_cast<float*>(partials), DataType::bf16, shape,
                                 stream);
    });
    if (!kernelUs) return kernelUs.status();
    const weftAttention a{lq,    lk,    lv,      out, lse,          cuLocal,        1,    local,
                          local, heads, kvHeads, dim, weftBfloat16, causal ? 1 : 0, scale};
    auto ringUs = timeUs([&] { return comm_.ringAttention(a, stream); });
    if (!ringUs) return ringUs.status();
    // Every rank's rows against the whole sequence's attention (computed here too).
    if (Status s = att::attendOnDevice(w, stream); !s) return s;
    if (Status s = comm_.ringAttention(a, stream); !s) return s;
    std::vector<std::uint16_t> got(local * H * D), want(seq * H * D);
    if (Status s = gpu_.copyOut(got.data(), out, got.size() * 2); !s) return s;
    if (Status s = gpu_.copyOut(want.data(), gout, want.size() * 2); !s) return s;
    double worst = 0;
    std::int64_t wrong = 0;
    for (std::size_t i = 0; i < local; ++i) {
      const auto t = static_cast<std::size_t>(positions[i]);
      for (std::size_t x = 0; x < H * D; ++x) {
        const double g = widen(got[i * H * D + x]), e = widen(want[t * H * D + x]);
        const double d = std::fabs(g - e);
        worst = std::max(worst, std::isnan(d) ? INFINITY : d);
        if (!(d <= 1e-2 * (1 + std::fabs(e)))) ++wrong;  // beyond a few bf16 roundings
      }
    }
    auto wrongAll = control_.sum(wrong);
    if (!wrongAll) return wrongAll.status();
    auto worstAll = control_.combine(worst, 3);
    if (!worstAll) return worstAll.status();
    if (*wrongAll > 0) exitCode = kExitFailed;
    if (rank_ == 0) {
      const double pairs =
          static_cast<double>(local) * static_cast<double>(seq) * (causal ? 0.5 : 1.0);
      const double tflops = 4.0 * pairs * static_cast<double>(H * D) / (*ringUs * 1e6);
      std::printf("  %8zu %6d %6d %4d %6d %10.1f %10.1f %10.1f %9.1f %8.2f %8.2f %9.2e %7lld\n",
                  seq, heads, kvHeads, dim, causal ? 1 : 0, *wholeUs, *kernelUs, *ringUs, tflops,
                  *wholeUs / *ringUs, *kernelUs / *ringUs, *worstAll,
                  static_cast<long long>(*wrongAll));
    }
    return {};
  }

  const Options& opt_;
  int rank_, nranks_;
  Comm& comm_;
  Control& control_;
  GpuRank& gpu_;
};

}  // namespace

Status runAttentionBench(ProcessContext& context, int thread, Comm& comm, Control& control,
                         GpuRank* gpu, int& exitCode) {
  if (gpu == nullptr) return {Code::unsupported, "attention runs on GPU memory"};
  AttentionBench bench(context, thread, comm, control, *gpu);
  return bench.run(exitCode);
}

#endif

}  // namespace weft::perf
