#include "perf/attention_bench.hpp"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#ifdef WEFT_PERF_HAVE_CUDA
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <functional>

#include "fused/attention/backward.hpp"
#include "fused/attention/cudnn.hpp"
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
          "# weft-perf attention: ring attention's %s pass, bf16, %d ranks, one sequence; "
          "times in us (%s over ranks, %d timed calls after %d warm-up); whole: rank 0 alone "
          "attending the whole sequence; kernel: a rank's share of the work without the ring; "
          "TFLOP/s a rank (causal: half the pairs); vs whole = whole / ring; overlap = kernel / "
          "ring; maxdiff: every rank's output (backward: dq, dk, dv) against the whole sequence's; "
          "backward FLOPs 2.5 times the forward's; whole and kernel forward on %s\n",
          opt_.attentionBackward ? "backward" : "forward", nranks_,
          opt_.average == 1   ? "mean"
          : opt_.average == 3 ? "max"
                              : "combined",
          opt_.iters, opt_.warmupIters,
          cudnnKernel() ? "cuDNN's kernel (WEFT_ATTENTION_KERNEL=weft: weft's)" : "weft's kernel");
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
    const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
    att::LocalAttention w;
    w.q = gq, w.k = gk, w.v = gv, w.cuSeqlensQ = w.cuSeqlensK = cuWhole, w.sequences = 1;
    w.tokensQ = w.maxSeqlenQ = seq, w.heads = heads, w.kvHeads = kvHeads, w.dim = dim;
    w.scale = scale, w.piece = {att::Part::all, att::Part::all, causal}, w.out = gout, w.lse = glse;
    const weftAttention a{lq,    lk,    lv,      out, lse,          cuLocal,        1,    local,
                          local, heads, kvHeads, dim, weftBfloat16, causal ? 1 : 0, scale};
    Times t;
    if (opt_.attentionBackward) {
      auto bt = backward(w, a, positions, exitCode);
      if (!bt) return bt.status();
      t = *bt;
    } else {
      auto ft = forward(w, a, partials, positions, exitCode);
      if (!ft) return ft.status();
      t = *ft;
    }
    if (rank_ == 0) {
      // Backward: 2.5 times the forward's products (FlashAttention's count).
      const double pairs =
          static_cast<double>(local) * static_cast<double>(seq) * (causal ? 0.5 : 1.0);
      const double flops =
          4.0 * pairs * static_cast<double>(H * D) * (opt_.attentionBackward ? 2.5 : 1.0);
      std::printf("  %8zu %6d %6d %4d %6d %10.1f %10.1f %10.1f %9.1f %8.2f %8.2f %9.2e %7lld\n",
                  seq, heads, kvHeads, dim, causal ? 1 : 0, t.whole, t.kernel, t.ring,
                  flops / (t.ring * 1e6), t.whole / t.ring, t.kernel / t.ring, t.worst,
                  static_cast<long long>(t.wrong));
    }
    return {};
  }

  // Whether cuDNN's kernel is the ring's here (loads, and not refused by WEFT_ATTENTION_KERNEL).
  static bool cudnnKernel() {
    const char* forced = std::getenv("WEFT_ATTENTION_KERNEL");
    return (forced == nullptr || std::string(forced) != "weft") && att::cudnnAvailable();
  }

  struct Times {
    double whole = 0, kernel = 0, ring = 0, worst = 0;
    std::int64_t wrong = 0;
  };

  // Every rank's values (bf16, its local tokens) against the whole sequence's at their
  // positions: the largest difference and how many lie beyond tol · |want| + the largest |want|
  // / 128, over ranks. The second term is two sides' bf16 probabilities: each moves an output by
  // up to 2^-9 of the values it averages, whatever the output's own size (docs/perf-fused.md).
  Status check(const std::byte* mine, const std::byte* whole, std::size_t row,
               const std::vector<std::int32_t>& positions, std::size_t local, std::size_t seq,
               Times& t, int& exitCode, double tolerance = 1e-2) {
    std::vector<std::uint16_t> got(local * row), want(seq * row);
    if (Status s = gpu_.copyOut(got.data(), mine, got.size() * 2); !s) return s;
    if (Status s = gpu_.copyOut(want.data(), whole, want.size() * 2); !s) return s;
    double worst = 0, most = 0;
    for (std::uint16_t w : want) most = std::max(most, static_cast<double>(std::fabs(widen(w))));
    std::int64_t wrong = 0;
    for (std::size_t i = 0; i < local; ++i) {
      const auto p = static_cast<std::size_t>(positions[i]);
      for (std::size_t x = 0; x < row; ++x) {
        const double g = widen(got[i * row + x]), e = widen(want[p * row + x]);
        const double d = std::fabs(g - e);
        worst = std::max(worst, std::isnan(d) ? INFINITY : d);
        if (!(d <= tolerance * std::fabs(e) + most / 128)) ++wrong;
      }
    }
    auto wrongAll = control_.sum(wrong);
    if (!wrongAll) return wrongAll.status();
    auto worstAll = control_.combine(worst, 3);
    if (!worstAll) return worstAll.status();
    if (*wrongAll > 0) exitCode = kExitFailed;
    t.wrong += *wrongAll;
    t.worst = std::max(t.worst, *worstAll);
    return {};
  }

  Result<Times> forward(const att::LocalAttention& w, const weftAttention& a, std::byte* partials,
                        const std::vector<std::int32_t>& positions, int& exitCode) {
    void* stream = gpu_.stream();
    const int n = nranks_;
    const bool causal = a.causal == 1;
    Times t;
    // A rank's share without the ring: its pieces against its own block.
    att::LocalAttention part = w;
    part.q = a.q, part.k = a.k, part.v = a.v, part.cuSeqlensQ = part.cuSeqlensK = a.cuSeqlens;
    part.tokensQ = part.maxSeqlenQ = a.tokens, part.out = partials, part.lse = a.lse;
    part.merge = true;
    // Both on cuDNN's kernel where the ring's would be (the selector picks the faster).
    att::LocalAttention whole = w;
    if (cudnnKernel()) {
      auto scratch = gpu_.allocate(att::cudnnScratchBytes(part));
      if (!scratch) return scratch.status();
      for (att::LocalAttention* l : {&whole, &part}) {
        l->kernel = algo::AttentionKernel::cudnn;
        l->scratch = *scratch, l->scratchBytes = att::cudnnScratchBytes(part);
      }
    }
    auto wholeUs = timeUs([&] { return att::attendOnDevice(whole, stream); }, true);
    if (!wholeUs) return wholeUs.status();
    const att::MergeShape shape{a.tokens, static_cast<std::size_t>(a.heads),
                                static_cast<std::size_t>(a.headDim)};
    // As the ring runs them: one rank's written, cuDNN's first step's partials fresh.
    const bool cudnn = part.kernel == algo::AttentionKernel::cudnn;
    if (n == 1) part.merge = false, part.out = a.out;
    auto kernelUs = timeUs([&]() -> Status {
      if (n > 1 && !cudnn) {
        if (Status s = att::resetPartials(reinterpret_cast<float*>(partials), a.lse, shape, stream);
            !s)
          return s;
      }
      for (int step = 0; step < n; ++step) {
        part.piece = att::ringStep(rank_, step, n, causal);
        part.fresh = n > 1 && cudnn && step == 0;
        if (Status s = att::attendOnDevice(part, stream); !s) return s;
      }
      if (n == 1) return Status{};
      return att::finishPartials(a.out, reinterpret_cast<float*>(partials), DataType::bf16, shape,
                                 stream);
    });
    if (!kernelUs) return kernelUs.status();
    auto ringUs = timeUs([&] { return comm_.ringAttention(a, stream); });
    if (!ringUs) return ringUs.status();
    t.whole = *wholeUs, t.kernel = *kernelUs, t.ring = *ringUs;
    // Every rank's rows against the whole sequence's attention (computed here too).
    if (Status s = att::attendOnDevice(whole, stream); !s) return s;
    if (Status s = comm_.ringAttention(a, stream); !s) return s;
    if (Status s = check(static_cast<const std::byte*>(a.out), static_cast<const std::byte*>(w.out),
                         shape.heads * shape.dim, positions, a.tokens, w.tokensQ, t, exitCode);
        !s)
      return s;
    return t;
  }

  // The backward pass: whole, rank 0's kernels on the whole sequence; kernel, a rank's pieces
  // against its own block (no ring); ring, weftRingAttentionBackward. dq, dk and dv checked.
  Result<Times> backward(const att::LocalAttention& w, const weftAttention& a,
                         const std::vector<std::int32_t>& positions, int& exitCode) {
    void* stream = gpu_.stream();
    const int n = nranks_;
    const bool causal = a.causal == 1;
    const auto D = static_cast<std::size_t>(a.headDim);
    const auto H = static_cast<std::size_t>(a.heads), G = static_cast<std::size_t>(a.kvHeads);
    const std::size_t seq = w.tokensQ, local = a.tokens;
    Times t;
    // The forward's results, both ways, and dO.
    if (Status s = att::attendOnDevice(w, stream); !s) return s;
    if (Status s = comm_.ringAttention(a, stream); !s) return s;
    const auto dO = randomBf16(seq * H * D, 4);
    std::vector<std::uint16_t> dOLocal(local * H * D);
    for (std::size_t i = 0; i < local; ++i)
      std::copy_n(
          dO.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(positions[i]) * H * D),
          H * D, dOLocal.begin() + static_cast<std::ptrdiff_t>(i * H * D));
    auto gdO = upload(dO);
    auto ldO = upload(dOLocal);
    if (!gdO || !ldO) return !gdO ? gdO.status() : ldO.status();
    // f32 sums: the whole's dq, dk, dv and delta, then the rank's; bf16 results of both.
    std::byte* f[8];
    const std::size_t sizes[8] = {seq * H * D * 4,   seq * G * D * 4,   seq * G * D * 4,
                                  seq * H * 4,       local * H * D * 4, local * G * D * 4,
                                  local * G * D * 4, local * H * 4};
    for (int i = 0; i < 8; ++i) {
      auto p = gpu_.allocate(sizes[i] + 256);
      if (!p) return p.status();
      f[i] = *p;
    }
    std::byte* g[6];
    const std::size_t gsizes[6] = {seq * H * D,   seq * G * D,   seq * G * D,
                                   local * H * D, local * G * D, local * G * D};
    for (int i = 0; i < 6; ++i) {
      auto p = gpu_.allocate(gsizes[i] * 2 + 256);
      if (!p) return p.status();
      g[i] = *p;
    }
    // Rank 0 alone on the whole sequence, or a rank on its own block's pieces.
    auto grads = [&](const att::LocalAttention& x, const void* dOut, std::byte** sums,
                     std::byte** out, int steps) -> Status {
      for (int i = 0; i < 3; ++i) {
        const std::size_t bytes = x.tokensQ * (i == 0 ? H : G) * D * 4;
        if (cudaMemsetAsync(sums[i], 0, bytes, static_cast<cudaStream_t>(stream)) != cudaSuccess)
          return Status(Code::systemError, "attention: clearing the gradients");
      }
      auto* delta = reinterpret_cast<float*>(sums[3]);
      if (Status s = att::computeDelta(x.out, dOut, DataType::bf16, x.tokensQ, x.heads, x.dim,
                                       delta, stream);
          !s)
        return s;
      att::LocalBackward b;
      b.q = x.q, b.k = x.k, b.v = x.v, b.cuSeqlensQ = b.cuSeqlensK = x.cuSeqlensQ;
      b.sequences = 1, b.tokensQ = b.tokensK = b.maxSeqlenQ = b.maxSeqlenK = x.tokensQ;
      b.heads = x.heads, b.kvHeads = x.kvHeads, b.dim = x.dim, b.type = DataType::bf16;
      b.scale = x.scale, b.dOut = dOut, b.lse = x.lse, b.delta = delta;
      b.dq = reinterpret_cast<float*>(sums[0]);
      b.dk = reinterpret_cast<float*>(sums[1]);
      b.dv = reinterpret_cast<float*>(sums[2]);
      for (int step = 0; step < steps; ++step) {
        b.piece = steps == 1 && x.tokensQ == seq
                      ? att::Piece{att::Part::all, att::Part::all, causal}
                      : att::ringStep(rank_, step, n, causal);
        if (Status s = att::attendBackwardOnDevice(b, stream); !s) return s;
      }
      for (int i = 0; i < 3; ++i) {
        const att::MergeShape shape{x.tokensQ, i == 0 ? H : G, D};
        if (Status s = att::finishPartials(out[i], reinterpret_cast<float*>(sums[i]),
                                           DataType::bf16, shape, stream);
            !s)
          return s;
      }
      return {};
    };
    auto wholeUs = timeUs([&] { return grads(w, *gdO, f, g, 1); }, true);
    if (!wholeUs) return wholeUs.status();
    att::LocalAttention mine = w;
    mine.q = a.q, mine.k = a.k, mine.v = a.v, mine.cuSeqlensQ = mine.cuSeqlensK = a.cuSeqlens;
    mine.tokensQ = mine.maxSeqlenQ = local, mine.out = a.out, mine.lse = a.lse;
    auto kernelUs = timeUs([&] { return grads(mine, *ldO, f + 4, g + 3, n); });
    if (!kernelUs) return kernelUs.status();
    const weftAttentionGrads rg{*ldO, g[3], g[4], g[5]};
    auto ringUs = timeUs([&] { return comm_.ringAttentionBackward(a, rg, stream); });
    if (!ringUs) return ringUs.status();
    t.whole = *wholeUs, t.kernel = *kernelUs, t.ring = *ringUs;
    if (Status s = grads(w, *gdO, f, g, 1); !s) return s;
    if (Status s = comm_.ringAttentionBackward(a, rg, stream); !s) return s;
    for (int i = 0; i < 3; ++i) {
      if (Status s =
              check(g[3 + i], g[i], (i == 0 ? H : G) * D, positions, local, seq, t, exitCode, 2e-2);
          !s)
        return s;
    }
    return t;
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
