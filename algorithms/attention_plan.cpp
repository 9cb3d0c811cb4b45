#include "algorithms/attention_plan.hpp"

#include <algorithm>

#include "algorithms/selector.hpp"

namespace weft::algo {

double AttentionShape::rankFlops() const {
  const double local = static_cast<double>(tokens);
  const double pairs = local * local * std::max(1, nranks) * (causal ? 0.5 : 1.0);
  return 4.0 * pairs * heads * dim * (backward ? 2.5 : 1.0);
}

std::string_view name(CpAlgo a) {
  return a == CpAlgo::ring ? "ring" : a == CpAlgo::ulysses ? "ulysses" : "hybrid";
}

Result<CpAlgo> parseCpAlgo(std::string_view text) {
  for (CpAlgo a : {CpAlgo::ring, CpAlgo::ulysses, CpAlgo::hybrid}) {
    if (text == name(a)) return a;
  }
  return invalidArgument("'" + std::string(text) +
                         "' is not a context-parallel attention (ring, ulysses, hybrid)");
}

std::string_view name(AttentionKernel k) {
  return k == AttentionKernel::weft ? "weft" : "cudnn";
}

Result<AttentionKernel> parseAttentionKernel(std::string_view text) {
  if (text == "weft") return AttentionKernel::weft;
  if (text == "cudnn") return AttentionKernel::cudnn;
  return invalidArgument("'" + std::string(text) + "' is not an attention kernel (weft, cudnn)");
}

Result<AttentionPlan> Selector::planAttention(const AttentionShape& s, std::optional<CpAlgo> forced,
                                              std::optional<AttentionKernel> kernel) const {
  const int n = std::max(1, s.nranks);
  const GemmConstants& gc = options_.constants.gemm;
  const double share = kernels_.sameDevice ? static_cast<double>(n) : 1.0;  // of the device
  const double dim = static_cast<double>(s.dim), vb = static_cast<double>(s.valueBytes);
  const double tokens = static_cast<double>(s.tokens);
  AttentionPlan best;
  // The faster kernel of those that cover the shape (cuDNN's: forward, one sequence).
  const bool cudnnFits = s.cudnn && !s.backward;
  best.kernel = kernel                                                      ? *kernel
                : cudnnFits && gc.attentionCudnnTflops > gc.attentionTflops ? AttentionKernel::cudnn
                                                                            : AttentionKernel::weft;
  const bool cudnnRefused = best.kernel == AttentionKernel::cudnn && !cudnnFits;
  if (cudnnRefused) best.kernel = AttentionKernel::weft;
  const bool cudnn = best.kernel == AttentionKernel::cudnn;
  const double tflops = s.backward ? gc.attentionBackwardTflops
                        : cudnn    ? gc.attentionCudnnTflops
                                   : gc.attentionTflops;
  const double rate = tflops * 1e12 / share;
  best.attentionUs = gc.launchUs + s.rankFlops() / rate * 1e6;
  // The ring over r ranks: r steps, each a piece of the attention (a kernel each) beside the
  // next block's hop: one neighbour's part of a ring all-gather of the blocks, and no faster than
  // the GPU send/recv kernel moves it (`device_p2p_gbs`). Backward, the block's f32 gradients
  // hop after their step. A block is the same bytes whichever the group (u times the tokens,
  // 1 / u of the K/V heads).
  const double block = 2.0 * tokens * s.kvHeads * dim * vb;
  const GraphConstants& graphs = options_.constants.graphs;
  auto hop = [&](double bytes) -> Result<double> {
    if (n == 1) return 0.0;
    auto p = plan(Collective::allGather, static_cast<std::size_t>(bytes) * n);
    if (!p) return p.status();
    return std::max(p->estimateUs / static_cast<double>(n - 1),
                    graphs.deviceHopLatencyUs + bytes / (graphs.deviceP2pGBs * 1e3));
  };
  auto kv = hop(block);
  if (!kv) return kv.status();
  auto grads = hop(s.backward ? 2.0 * tokens * s.kvHeads * dim * 4.0 : 0.0);
  if (!grads) return grads.status();
  // cuDNN writes a step's part, which a pass through the device's memory merges (f32 partials
  // read and written, the part read); weft's kernel merges as it goes.
  const double merge =
      cudnn ? tokens * s.heads * dim * (8.0 + vb) * share / (graphs.deviceCopyGBs * 1e3) : 0.0;
  // Ranks sharing a GPU, cuDNN's kernels left the hops no room: they ran after the steps
  // (docs/perf-fused.md, "Ring attention"), so there they add.
  const bool serial = cudnn && kernels_.sameDevice;
  // Ulysses over groups of u: q, k, v (backward also dO, the log-sum-exp and delta) all-to-all'd
  // from sequence to head shards within the group, then out and the log-sum-exp back (backward
  // dq, dk, dv); each way packed and unpacked by a copy kernel through the device's memory. The
  // all-to-alls as the selector prices them on every rank, (u − 1) / u of a rank's bytes leaving
  // it instead of (n − 1) / n.
  const double rowsIn = s.backward ? 2.0 * s.heads + 2.0 * s.kvHeads : s.heads + 2.0 * s.kvHeads;
  const double in = tokens * (rowsIn * dim * vb + (s.backward ? 8.0 * s.heads : 0.0));
  const double out = s.backward ? tokens * (s.heads + 2.0 * s.kvHeads) * dim * vb
                                : tokens * s.heads * (dim * vb + 4.0);
  auto costOf = [&](int u) -> Result<double> {
    const int r = n / u;
    const double step = gc.launchUs + s.rankFlops() / r / rate * 1e6 + (r > 1 ? merge : 0.0);
    double us =
        r == 1 ? step
               : r * ((serial ? step + *kv : std::max(step, *kv)) + (s.backward ? *grads : 0.0));
    if (u == 1) return us;
    auto a = plan(Collective::allToAll, static_cast<std::size_t>(in));
    auto b = plan(Collective::allToAll, static_cast<std::size_t>(out));
    if (!a) return a.status();
    if (!b) return b.status();
    const double within = (u - 1.0) / u * n / (n - 1.0);
    const double copies = 4.0 * (in + out) * share / (graphs.deviceCopyGBs * 1e3);
    return us + (a->estimateUs + b->estimateUs) * within + copies + 4 * gc.launchUs;
  };
  auto ring = costOf(1);
  if (!ring) return ring.status();
  best.ringUs = *ring;
  const bool ulyssesFits = n > 1 && s.headsSplit(n);
  if (ulyssesFits) {
    auto u = costOf(n);
    if (!u) return u.status();
    best.ulyssesUs = *u;
  }
  int hybridGroup = 0;  // the cheapest group 1 < u < n that divides the ranks and both heads
  for (int u = 2; u < n; ++u) {
    if (n % u != 0 || !s.headsSplit(u)) continue;
    auto h = costOf(u);
    if (!h) return h.status();
    if (hybridGroup == 0 || *h < best.hybridUs) best.hybridUs = *h, hybridGroup = u;
  }
  const bool hybridFits = hybridGroup != 0;
  CpAlgo pick = CpAlgo::ring;
  if (forced) {
    pick = *forced == CpAlgo::ulysses && ulyssesFits ? CpAlgo::ulysses
           : *forced == CpAlgo::hybrid && hybridFits ? CpAlgo::hybrid
                                                     : CpAlgo::ring;
  } else {
    if (ulyssesFits && best.ulyssesUs < best.ringUs) pick = CpAlgo::ulysses;
    const double sofar = pick == CpAlgo::ulysses ? best.ulyssesUs : best.ringUs;
    if (hybridFits && best.hybridUs < sofar) pick = CpAlgo::hybrid;
  }
  best.algo = pick;
  best.group = pick == CpAlgo::ulysses ? n : pick == CpAlgo::hybrid ? hybridGroup : 1;
  best.estimateUs = pick == CpAlgo::ulysses  ? best.ulyssesUs
                    : pick == CpAlgo::hybrid ? best.hybridUs
                                             : best.ringUs;
  auto us = [](double t) { return std::to_string(static_cast<long>(t + 0.5)) + " us"; };
  std::string why;
  if (forced && *forced != pick)
    why = "forced " + std::string(name(*forced)) + ", but " +
          (*forced == CpAlgo::ulysses
               ? "it needs heads and K/V heads that the ranks divide"
               : "it needs a group of ranks (more than one, fewer than all) that divides the "
                 "ranks and both head counts");
  else if (forced)
    why = "forced";
  else if (!ulyssesFits && !hybridFits)
    why = n == 1 ? "one rank"
                 : std::to_string(s.heads) + " heads and " + std::to_string(s.kvHeads) +
                       " K/V heads do not split " + std::to_string(n) + " ways";
  else
    why = "the cheaper";
  best.reason =
      std::string(name(best.algo)) + " " + us(best.estimateUs) + " (ring " + us(best.ringUs) +
      (ulyssesFits ? ", ulysses " + us(best.ulyssesUs) : "") +
      (hybridFits ? ", hybrid " + us(best.hybridUs) + " in groups of " + std::to_string(hybridGroup)
                  : "") +
      ", attention alone " + us(best.attentionUs) + "): " + why + "; " +
      std::string(name(best.kernel)) + "'s kernel" +
      (cudnnRefused ? " (cuDNN's needs it loaded, the forward pass and one sequence)"
       : kernel     ? " (forced)"
                    : "");
  return best;
}

}  // namespace weft::algo
