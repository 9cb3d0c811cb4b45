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
  return a == CpAlgo::ring ? "ring" : "ulysses";
}

Result<CpAlgo> parseCpAlgo(std::string_view text) {
  if (text == "ring") return CpAlgo::ring;
  if (text == "ulysses") return CpAlgo::ulysses;
  return invalidArgument("'" + std::string(text) +
                         "' is not a context-parallel attention (ring, ulysses)");
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
  const auto n = static_cast<std::size_t>(std::max(1, s.nranks));
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
  // Ring: n steps, each a piece of the attention (a kernel each) beside the next block's hop:
  // one neighbour's part of a ring all-gather of the blocks, and no faster than the GPU
  // send/recv kernel moves it (`device_p2p_gbs`). Backward, the block's f32 gradients hop
  // after their step.
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
  const double step = gc.launchUs + s.rankFlops() / static_cast<double>(n) / rate * 1e6 + merge;
  // Ranks sharing a GPU, cuDNN's kernels left the hops no room: they ran after the steps
  // (docs/perf-fused.md, "Ring attention"), so there they add.
  const bool serial = cudnn && kernels_.sameDevice;
  best.ringUs = static_cast<double>(n) *
                ((serial ? step + *kv : std::max(step, *kv)) + (s.backward ? *grads : 0.0));
  // Ulysses (forward): q, k and v all-to-all'd from sequence to head shards, attention of the
  // whole sequences on heads / n, then out and the log-sum-exp back; each way packed and
  // unpacked by a copy kernel through the device's memory.
  const bool ulyssesFits = s.headsSplit() && !s.backward && n > 1;
  if (ulyssesFits) {
    const double in = tokens * (s.heads + 2.0 * s.kvHeads) * dim * vb;
    const double out = tokens * s.heads * (dim * vb + 4.0);
    auto a = plan(Collective::allToAll, static_cast<std::size_t>(in));
    auto b = plan(Collective::allToAll, static_cast<std::size_t>(out));
    if (!a) return a.status();
    if (!b) return b.status();
    const double copies = 4.0 * (in + out) * share / (graphs.deviceCopyGBs * 1e3);
    best.ulyssesUs = a->estimateUs + b->estimateUs + best.attentionUs + copies + 4 * gc.launchUs;
  }
  const bool ulysses = forced ? *forced == CpAlgo::ulysses && ulyssesFits
                              : ulyssesFits && best.ulyssesUs < best.ringUs;
  best.algo = ulysses ? CpAlgo::ulysses : CpAlgo::ring;
  best.estimateUs = ulysses ? best.ulyssesUs : best.ringUs;
  auto us = [](double t) { return std::to_string(static_cast<long>(t + 0.5)) + " us"; };
  std::string why;
  if (forced && *forced == CpAlgo::ulysses && !ulyssesFits)
    why =
        "forced ulysses, but it needs heads and K/V heads that the ranks divide (and the "
        "forward pass)";
  else if (forced)
    why = "forced";
  else if (!ulyssesFits)
    why = n == 1       ? "one rank"
          : s.backward ? "the backward pass runs on the ring"
                       : std::to_string(s.heads) + " heads and " + std::to_string(s.kvHeads) +
                             " K/V heads do not split " + std::to_string(n) + " ways";
  else
    why = "the cheaper";
  best.reason = std::string(name(best.algo)) + " " + us(best.estimateUs) + " (ring " +
                us(best.ringUs) + (ulyssesFits ? ", ulysses " + us(best.ulyssesUs) : "") +
                ", attention alone " + us(best.attentionUs) + "): " + why + "; " +
                std::string(name(best.kernel)) + "'s kernel" +
                (cudnnRefused ? " (cuDNN's needs it loaded, the forward pass and one sequence)"
                 : kernel     ? " (forced)"
                              : "");
  return best;
}

}  // namespace weft::algo
