#include "perf/moe_bench.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include <unistd.h>

#include "fused/moe/host.hpp"

#ifdef WEFT_PERF_HAVE_CUDA
#include <cuda_runtime.h>

#include "fused/fp8/codec_device.hpp"
#endif

namespace weft::perf {
namespace {

float fromBf16(std::uint16_t b) {
  const std::uint32_t bits = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
std::uint16_t toBf16(float f) {  // round to nearest even
  std::uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return static_cast<std::uint16_t>((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
}

// A rank's tokens: values, k distinct experts each (uniform), weights; from an LCG seeded by
// the rank, so any rank can make any rank's.
struct Routing {
  std::vector<std::uint16_t> x;
  std::vector<std::int64_t> idx;
  std::vector<float> w;
  std::size_t rowsSent = 0;  // a token's row once per rank holding one of its experts
};

Routing routingOf(const Options& o, int rank, int nranks, std::size_t tokens, bool values = true) {
  Routing r;
  std::uint64_t s = 0x9E3779B97F4A7C15ULL * static_cast<std::uint64_t>(rank + 1) + tokens;
  auto next = [&] {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    return s >> 33;
  };
  std::uint64_t sx = s + 17;  // the values' own sequence: the routing made without them alike
  r.x.resize(values ? tokens * o.moeHidden : 0);
  for (auto& v : r.x) {
    sx = sx * 6364136223846793005ULL + 1442695040888963407ULL;
    v = toBf16((static_cast<float>((sx >> 33) % 65536) / 32768.0f - 1.0f) * 1.7f);
  }
  const int E = o.moeExperts, k = o.moeTopk, L = E / nranks;
  std::vector<std::int64_t> all(static_cast<std::size_t>(E));
  for (std::size_t t = 0; t < tokens; ++t) {
    std::iota(all.begin(), all.end(), 0);
    std::vector<bool> ranks(static_cast<std::size_t>(nranks), false);
    for (int j = 0; j < k; ++j) {  // a partial Fisher-Yates shuffle
      const auto pick = static_cast<std::size_t>(j) + next() % static_cast<std::size_t>(E - j);
      std::swap(all[static_cast<std::size_t>(j)], all[pick]);
      const std::int64_t e = all[static_cast<std::size_t>(j)];
      r.idx.push_back(e);
      r.w.push_back(0.1f + static_cast<float>(next() % 1000) / 1111.0f);
      ranks[static_cast<std::size_t>(e / L)] = true;
    }
    r.rowsSent += static_cast<std::size_t>(std::count(ranks.begin(), ranks.end(), true));
  }
  return r;
}

// Identity experts: out = Σ weight · x per token. The largest difference relative to Σ |w·x|,
// and the values beyond 2^-7 of it (two bf16 roundings). fp8 dispatch adds its elements'
// rounding (half a unit of 3 mantissa bits) and a decode to bf16, or, for an element below the
// normal range of its block (scale = the block's largest |x| / 448), half the smallest
// subnormal, 2^-10 of the scale.
// Across hosts the hierarchical path rounds each host's sum too: 2^-8 more.
void checkOut(const Options& o, const Routing& r, const std::vector<std::uint16_t>& out, bool hosts,
              double& worst, std::int64_t& wrong) {
  const double tolerance = (o.moeFp8 ? 1.0 / 16 + 1.0 / 64 : 1.0 / 128) + (hosts ? 1.0 / 256 : 0.0);
  const std::size_t H = o.moeHidden, k = static_cast<std::size_t>(o.moeTopk);
  for (std::size_t t = 0; t < out.size() / H; ++t) {
    double largest = 0;  // the row's, at least its blocks'
    for (std::size_t c = 0; o.moeFp8 && c < H; ++c)
      largest = std::max(largest, std::fabs(static_cast<double>(fromBf16(r.x[t * H + c]))));
    for (std::size_t c = 0; c < H; ++c) {
      double want = 0, scale = 1e-30, weights = 0;
      for (std::size_t j = 0; j < k; ++j) {
        const double v = static_cast<double>(r.w[t * k + j]) * fromBf16(r.x[t * H + c]);
        want += v, scale += std::fabs(v), weights += std::fabs(r.w[t * k + j]);
      }
      const double diff = std::fabs(fromBf16(out[t * H + c]) - want);
      worst = std::max(worst, diff / scale);
      if (!(diff <= tolerance * scale + weights * largest / 448 / 1024)) ++wrong;
    }
  }
}

// The plain all-to-all-v MoE on host memory: each slot's row to its expert's rank.
class Baseline {
 public:
  Baseline(const Options& o, Comm& comm, const Routing& r)
      : o_(o), comm_(comm), r_(r), n_(static_cast<std::size_t>(comm.size())) {}

  Status dispatch() {
    const std::size_t k = static_cast<std::size_t>(o_.moeTopk), H = o_.moeHidden;
    const auto L = static_cast<std::size_t>(o_.moeExperts) / n_;
    // Slots by destination rank, stably.
    std::vector<std::size_t> sendCounts(n_, 0);
    order_.clear();
    for (std::size_t q = 0; q < n_; ++q)
      for (std::size_t s = 0; s < r_.idx.size(); ++s)
        if (r_.idx[s] >= 0 && static_cast<std::size_t>(r_.idx[s]) / L == q) {
          order_.push_back(s);
          ++sendCounts[q];
        }
    send_.resize(order_.size() * H);
    sendExperts_.resize(order_.size());
    for (std::size_t i = 0; i < order_.size(); ++i) {
      const std::size_t t = order_[i] / k;
      std::memcpy(send_.data() + i * H, r_.x.data() + t * H, H * 2);
      sendExperts_[i] = static_cast<std::int32_t>(static_cast<std::size_t>(r_.idx[order_[i]]) % L);
    }
    std::vector<std::uint64_t> mine(sendCounts.begin(), sendCounts.end()), theirs(n_);
    if (Status s = comm_.allToAll(mine.data(), theirs.data(), 1, DataType::u64); !s) return s;
    sendCounts_ = sendCounts;
    recvCounts_.assign(theirs.begin(), theirs.end());
    const std::size_t got = std::accumulate(recvCounts_.begin(), recvCounts_.end(), std::size_t{0});
    recv_.resize(got * H);
    recvExperts_.resize(got);
    if (Status s = allToAllv(send_.data(), sendCounts_, recv_.data(), recvCounts_, H, weftBfloat16);
        !s)
      return s;
    if (Status s = allToAllv(sendExperts_.data(), sendCounts_, recvExperts_.data(), recvCounts_, 1,
                             weftInt32);
        !s)
      return s;
    // Grouped by local expert, stably: the rows an expert's GEMM takes.
    perm_.resize(got);
    std::iota(perm_.begin(), perm_.end(), std::size_t{0});
    std::stable_sort(perm_.begin(), perm_.end(), [&](std::size_t a, std::size_t b) {
      return recvExperts_[a] < recvExperts_[b];
    });
    grouped_.resize(got * H);
    for (std::size_t i = 0; i < got; ++i)
      std::memcpy(grouped_.data() + i * H, recv_.data() + perm_[i] * H, H * 2);
    return {};
  }

  // Identity experts: the grouped rows are the outputs.
  Status combine(std::vector<std::uint16_t>& out) {
    const std::size_t k = static_cast<std::size_t>(o_.moeTopk), H = o_.moeHidden;
    for (std::size_t i = 0; i < perm_.size(); ++i)
      std::memcpy(recv_.data() + perm_[i] * H, grouped_.data() + i * H, H * 2);
    if (Status s = allToAllv(recv_.data(), recvCounts_, send_.data(), sendCounts_, H, weftBfloat16);
        !s)
      return s;
    sum_.assign(out.size(), 0.0f);  // kept from call to call, its pages faulted in once
    std::vector<float>& sum = sum_;
    for (std::size_t i = 0; i < order_.size(); ++i) {
      const std::size_t t = order_[i] / k;
      const float w = r_.w[order_[i]];
      for (std::size_t c = 0; c < H; ++c) sum[t * H + c] += w * fromBf16(send_[i * H + c]);
    }
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = toBf16(sum[i]);
    return {};
  }

 private:
  Status allToAllv(const void* send, const std::vector<std::size_t>& sc, void* recv,
                   const std::vector<std::size_t>& rc, std::size_t width, weftDataType_t type) {
    std::vector<std::size_t> scount(n_), sdispl(n_), rcount(n_), rdispl(n_);
    std::size_t a = 0, b = 0;
    for (std::size_t q = 0; q < n_; ++q) {
      scount[q] = sc[q] * width, sdispl[q] = a, a += scount[q];
      rcount[q] = rc[q] * width, rdispl[q] = b, b += rcount[q];
    }
    const weftResult_t res = weftAllToAllv(send, scount.data(), sdispl.data(), recv, rcount.data(),
                                           rdispl.data(), type, comm_.handle(), nullptr);
    if (res != weftSuccess) return {Code::internalError, weftGetLastError()};
    return {};
  }

  const Options& o_;
  Comm& comm_;
  const Routing& r_;
  std::size_t n_;
  std::vector<std::size_t> order_, sendCounts_, recvCounts_, perm_;
  std::vector<std::uint16_t> send_, recv_, grouped_;
  std::vector<std::int32_t> sendExperts_, recvExperts_;
  std::vector<float> sum_;
};

class MoeBench {
 public:
  MoeBench(ProcessContext& ctx, int thread, Comm& comm, Control& control, GpuRank* gpu)
      : opt_(ctx.options),
        rank_(ctx.proc * ctx.options.threads + thread),
        nranks_(ctx.nprocs * ctx.options.threads),
        comm_(comm),
        control_(control),
        gpu_(gpu) {}

  Status run(int& exitCode) {
    if (opt_.moeExperts % nranks_ != 0)
      return invalidArgument("moe: --experts " + std::to_string(opt_.moeExperts) +
                             " must be a multiple of the " + std::to_string(nranks_) + " ranks");
    // Whether the ranks span hosts (their host names differ), for the check's tolerance.
    char name[256] = {};
    gethostname(name, sizeof name - 1);
    const std::uint64_t mine = std::hash<std::string>{}(name);
    std::vector<std::uint64_t> all(static_cast<std::size_t>(nranks_));
    if (!gpu_) {
      if (Status s = comm_.allGather(&mine, all.data(), 1, DataType::u64); !s) return s;
      severalHosts_ =
          std::any_of(all.begin(), all.end(), [&](std::uint64_t h) { return h != mine; });
    }
    if (rank_ == 0) {
      std::printf(
          "# weft-perf moe: dispatch and combine, %s, uniform top-%d of %d experts, hidden %zu, "
          "%d ranks, %s memory; times in us (%s over ranks, %d timed calls after %d warm-up); "
          "GB/s: the token rows a rank receives (once per token and rank), as DeepEP counts; %s; "
          "maxerr: combine's output (identity experts) against sum(w x) in double, relative\n",
          opt_.moeFp8 ? "fp8 dispatch (e4m3, a scale per 128; GB/s of its bytes), bf16 combine"
                      : "bf16",
          opt_.moeTopk, opt_.moeExperts, opt_.moeHidden, nranks_, gpu_ ? "GPU" : "host",
          opt_.average == 1   ? "mean"
          : opt_.average == 3 ? "max"
                              : "combined",
          opt_.iters, opt_.warmupIters,
          gpu_ ? "eager: the calls as made; graph: replayed from CUDA graphs; the kernels' mode "
                 "and channels the selector's (WEFT_MOE_MODE, WEFT_MOE_CHANNELS force them; "
                 "WEFT_DEBUG=INFO WEFT_DEBUG_SUBSYS=TUNING says which)"
               : "a2av: a plain all-to-all-v MoE in the same run; speedup = a2av / weft, both "
                 "halves");
      std::printf("# %7s %-12s %11s %11s %9s %9s %9s %9s\n", "tokens", "mode", "dispatch",
                  "combine", "GB/s d", "GB/s c", "speedup", "maxerr");
    }
    for (std::size_t tokens : opt_.moeTokens) {
      if (Status s = row(tokens, exitCode); !s) return s;
    }
    return {};
  }

 private:
  struct Times {
    double dispatch = 0, combine = 0;
  };

  // Seconds of each half over the timed iterations, combined over ranks (-a), in us a call.
  Result<Times> timed(const std::function<Status(Times&)>& iteration) {
    Times t;
    for (int i = 0; i < opt_.warmupIters; ++i) {
      Times ignored;
      if (Status s = iteration(ignored); !s) return s;
    }
    if (Status s = control_.barrier(); !s) return s;
    for (int i = 0; i < opt_.iters; ++i) {
      if (Status s = iteration(t); !s) return s;
    }
    if (Status s = control_.barrier(); !s) return s;
    auto d = control_.combine(t.dispatch / opt_.iters * 1e6, opt_.average);
    if (!d) return d.status();
    auto c = control_.combine(t.combine / opt_.iters * 1e6, opt_.average);
    if (!c) return c.status();
    return Times{*d, *c};
  }

  Status print(std::size_t tokens, const char* mode, const Times& t, double rowBytes,
               double speedup, double worst) {
    if (rank_ != 0) return {};
    char sp[16] = "-";
    if (speedup > 0) std::snprintf(sp, sizeof sp, "%.2f", speedup);
    std::printf("  %7zu %-12s %11.1f %11.1f %9.1f %9.1f %9s %9.2e\n", tokens, mode, t.dispatch,
                t.combine, rowBytes / (t.dispatch * 1e3), rowBytes / (t.combine * 1e3), sp, worst);
    return {};
  }

  Status row(std::size_t tokens, int& exitCode) {
    const Routing r = routingOf(opt_, rank_, nranks_, tokens);
    const std::size_t H = opt_.moeHidden, k = static_cast<std::size_t>(opt_.moeTopk);
    const std::size_t L = static_cast<std::size_t>(opt_.moeExperts / nranks_);
    // Rows: about tokens · k a rank under uniform routing; twice that is the capacity.
    const std::size_t capacity = 2 * tokens * k + 64;
    // What this rank receives: every rank's rows to it, once per token.
    std::size_t received = 0;
    for (int s = 0; s < nranks_; ++s) {
      const Routing other = s == rank_ ? Routing{} : routingOf(opt_, s, nranks_, tokens, false);
      const Routing& from = s == rank_ ? r : other;
      for (std::size_t t = 0; t < tokens; ++t) {
        bool here = false;
        for (std::size_t j = 0; j < k; ++j)
          here = here || static_cast<std::size_t>(from.idx[t * k + j]) / L ==
                             static_cast<std::size_t>(rank_);
        received += here ? 1 : 0;
      }
    }
    auto bytes = control_.combine(static_cast<double>(received * H * 2), 1);
    if (!bytes) return bytes.status();
    // fp8 dispatch's GB/s count its rows' bytes (elements and scales).
    const double sent =
        opt_.moeFp8
            ? *bytes * static_cast<double>(fused::moe::dispatchCodec().encodedBytes(H)) / (2.0 * H)
            : *bytes;
    std::vector<std::uint16_t> out(tokens * H);
    double worst = 0;
    std::int64_t wrong = 0;
    if (gpu_ == nullptr) {
      std::vector<std::uint16_t> recv(capacity * H), y;
      std::vector<float> scales;
      std::vector<std::int32_t> counts(L);
      weftMoeDispatchArgs a{r.x.data(),  r.idx.data(), r.w.data(),      tokens,
                            H,           opt_.moeTopk, opt_.moeExperts, weftBfloat16,
                            recv.data(), capacity,     counts.data(),   nullptr,
                            0,           nullptr};
      const auto codec = fused::moe::dispatchCodec();
      if (opt_.moeFp8) {
        scales.resize(capacity * codec.blocks(H));
        a.fp8Dispatch = 1, a.recvScales = scales.data();
      }
      // Identity experts: their outputs are the rows received (fp8 ones decoded, untimed).
      auto outputs = [&](std::size_t rows) -> Result<const void*> {
        if (!opt_.moeFp8) return static_cast<const void*>(recv.data());
        y.resize(rows * H);
        std::vector<std::byte> row(codec.encodedBytes(H));
        const auto* elements = reinterpret_cast<const std::byte*>(recv.data());
        for (std::size_t i = 0; i < rows; ++i) {
          std::memcpy(row.data(), elements + i * H, H);
          std::memcpy(row.data() + H, scales.data() + i * codec.blocks(H), codec.blocks(H) * 4);
          if (Status s = fused::fp8::decode(codec, DataType::bf16, row.data(), H, y.data() + i * H);
              !s)
            return s;
        }
        return static_cast<const void*>(y.data());
      };
      using Clock = std::chrono::steady_clock;
      auto weft = timed([&](Times& t) -> Status {
        const auto t0 = Clock::now();
        auto h = comm_.moeDispatch(a);
        if (!h) return h.status();
        t.dispatch += std::chrono::duration<double>(Clock::now() - t0).count();
        auto ys = outputs(h->rows());
        if (!ys) return ys.status();
        const auto t1 = Clock::now();
        if (Status s = comm_.moeCombine(*h, *ys, out.data()); !s) return s;
        t.combine += std::chrono::duration<double>(Clock::now() - t1).count();
        return {};
      });
      if (!weft) return weft.status();
      checkOut(opt_, r, out, severalHosts_, worst, wrong);
      if (opt_.moeFp8) {  // the plain MoE sends bf16: no like-for-like speedup
        if (Status s = print(tokens, "weft fp8", *weft, sent, 0, worst); !s) return s;
        return finish(wrong, exitCode);
      }
      Baseline base(opt_, comm_, r);
      auto plain = timed([&](Times& t) -> Status {
        const auto t0 = Clock::now();
        if (Status s = base.dispatch(); !s) return s;
        const auto t1 = Clock::now();
        if (Status s = base.combine(out); !s) return s;
        t.dispatch += std::chrono::duration<double>(t1 - t0).count();
        t.combine += std::chrono::duration<double>(Clock::now() - t1).count();
        return {};
      });
      if (!plain) return plain.status();
      checkOut(opt_, r, out, severalHosts_, worst, wrong);
      const double speedup = (plain->dispatch + plain->combine) / (weft->dispatch + weft->combine);
      if (Status s = print(tokens, "weft", *weft, *bytes, speedup, worst); !s) return s;
      if (Status s = print(tokens, "a2av", *plain, *bytes, 0, worst); !s) return s;
    } else {
      if (Status s = onGpu(tokens, r, capacity, sent, out, worst, wrong); !s) return s;
    }
    return finish(wrong, exitCode);
  }

  // Every rank's wrong values summed: any fails the run.
  Status finish(std::int64_t wrong, int& exitCode) {
    auto bad = control_.sum(wrong);
    if (!bad) return bad.status();
    if (*bad > 0) {
      if (rank_ == 0) std::printf("# %lld wrong values\n", static_cast<long long>(*bad));
      exitCode = kExitFailed;
    }
    return {};
  }

#ifdef WEFT_PERF_HAVE_CUDA
  Status onGpu(std::size_t tokens, const Routing& r, std::size_t capacity, double bytes,
               std::vector<std::uint16_t>& out, double& worst, std::int64_t& wrong) {
    const std::size_t H = opt_.moeHidden, L = static_cast<std::size_t>(opt_.moeExperts / nranks_);
    const auto codec = fused::moe::dispatchCodec();
    // fp8: recv_x's elements then recv_scales in one buffer, the layout of one encoding of
    // capacity · H values, so that one decode gives the experts' bf16 inputs (y).
    const std::size_t recvBytes = opt_.moeFp8 ? codec.encodedBytes(capacity * H) : capacity * H * 2;
    std::byte *x, *idx, *w, *recv, *counts, *dout, *y;
    for (auto [p, n] : {std::pair{&x, r.x.size() * 2},
                        {&idx, r.idx.size() * 8},
                        {&w, r.w.size() * 4},
                        {&recv, recvBytes},
                        {&counts, L * 4},
                        {&dout, tokens * H * 2},
                        {&y, opt_.moeFp8 ? capacity * H * 2 : 16}}) {
      auto d = gpu_->allocate(n + 256);
      if (!d) return d.status();
      *p = *d;
    }
    for (auto [p, h, n] : {std::tuple{x, static_cast<const void*>(r.x.data()), r.x.size() * 2},
                           {idx, r.idx.data(), r.idx.size() * 8},
                           {w, r.w.data(), r.w.size() * 4}}) {
      if (Status s = gpu_->copyIn(p, h, n); !s) return s;
    }
    auto* stream = static_cast<cudaStream_t>(gpu_->stream());
    weftMoeDispatchArgs a{x,
                          reinterpret_cast<const std::int64_t*>(idx),
                          reinterpret_cast<const float*>(w),
                          tokens,
                          H,
                          opt_.moeTopk,
                          opt_.moeExperts,
                          weftBfloat16,
                          recv,
                          capacity,
                          reinterpret_cast<std::int32_t*>(counts),
                          nullptr,
                          opt_.moeFp8 ? 1 : 0,
                          opt_.moeFp8 ? reinterpret_cast<float*>(recv + capacity * H) : nullptr};
    // Identity experts: their outputs are the rows received (fp8 ones decoded, untimed).
    const std::byte* expertOut = opt_.moeFp8 ? y : recv;
    auto experts = [&]() -> Status {
      if (!opt_.moeFp8) return {};
      return fused::fp8::decodeOnDevice(codec, DataType::bf16, recv, capacity * H, y, stream);
    };
    cudaEvent_t ev[4] = {};
    for (auto& e : ev)
      if (cudaEventCreate(&e) != cudaSuccess) return {Code::systemError, "moe: cudaEventCreate"};
    auto halves = [&](Times& t) -> Status {
      float d = 0, c = 0;
      if (cudaStreamSynchronize(stream) != cudaSuccess ||
          cudaEventElapsedTime(&d, ev[0], ev[1]) != cudaSuccess ||
          cudaEventElapsedTime(&c, ev[3], ev[2]) != cudaSuccess)
        return {Code::systemError, "moe: timing"};
      t.dispatch += d * 1e-3, t.combine += c * 1e-3;
      return {};
    };
    // Eager calls (dispatch waits for its status outside a capture).
    auto normal = timed([&](Times& t) -> Status {
      cudaEventRecord(ev[0], stream);
      auto h = comm_.moeDispatch(a, stream);
      if (!h) return h.status();
      cudaEventRecord(ev[1], stream);
      if (Status s = experts(); !s) return s;
      cudaEventRecord(ev[3], stream);
      if (Status s = comm_.moeCombine(*h, expertOut, dout, stream); !s) return s;
      cudaEventRecord(ev[2], stream);
      return halves(t);
    });
    if (!normal) return normal.status();
    if (Status s = gpu_->copyOut(out.data(), dout, out.size() * 2); !s) return s;
    checkOut(opt_, r, out, severalHosts_, worst, wrong);
    if (Status s = print(tokens, "eager", *normal, bytes, 0, worst); !s) return s;
    // Dispatch and combine captured once each, replayed.
    cudaGraph_t g[2] = {};
    cudaGraphExec_t exec[2] = {};
    MoeHandle h;
    for (int i = 0; i < 2; ++i) {
      if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess)
        return {Code::systemError, "moe: capture"};
      Status s;
      if (i == 0) {
        auto made = comm_.moeDispatch(a, stream);
        if (made) h = std::move(*made);
        s = made.status();
      } else {
        s = comm_.moeCombine(h, expertOut, dout, stream);
      }
      if (cudaStreamEndCapture(stream, &g[i]) != cudaSuccess || !s ||
          cudaGraphInstantiate(&exec[i], g[i], 0) != cudaSuccess)
        return s ? Status{Code::systemError, "moe: the graph"} : s;
    }
    auto replayed = timed([&](Times& t) -> Status {
      cudaEventRecord(ev[0], stream);
      cudaGraphLaunch(exec[0], stream);
      cudaEventRecord(ev[1], stream);
      if (Status s = experts(); !s) return s;
      cudaEventRecord(ev[3], stream);
      cudaGraphLaunch(exec[1], stream);
      cudaEventRecord(ev[2], stream);
      return halves(t);
    });
    if (!replayed) return replayed.status();
    if (Status s = gpu_->copyOut(out.data(), dout, out.size() * 2); !s) return s;
    checkOut(opt_, r, out, severalHosts_, worst, wrong);
    for (int i = 0; i < 2; ++i) {
      (void)cudaGraphExecDestroy(exec[i]);
      (void)cudaGraphDestroy(g[i]);
    }
    for (auto& e : ev) (void)cudaEventDestroy(e);
    return print(tokens, "graph", *replayed, bytes, 0, worst);
  }
#else
  Status onGpu(std::size_t, const Routing&, std::size_t, double, std::vector<std::uint16_t>&,
               double&, std::int64_t&) {
    return {Code::unsupported, "moe on GPU memory needs a build with CUDA"};
  }
#endif

  const Options& opt_;
  int rank_, nranks_;
  Comm& comm_;
  bool severalHosts_ = false;
  Control& control_;
  GpuRank* gpu_;
};

}  // namespace

Status runMoeBench(ProcessContext& context, int thread, Comm& comm, Control& control, GpuRank* gpu,
                   int& exitCode) {
  return MoeBench(context, thread, comm, control, gpu).run(exitCode);
}

}  // namespace weft::perf
