// MoE dispatch and combine between processes (weft.hpp's Comm::moe*): each rank reads its records
// and its tokens' parts straight from its peers' workspaces (weftHostAlloc memory it maps), or
// with WEFT_HOST_DIRECT=0 through all-to-all-v. Either way every row is its source token's
// values, bit for bit, grouped by local expert, and combine of outputs that scale each expert's
// rows by (expert + 1) equals Σ weight · (expert + 1) · x in double; nothing is left behind.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "tests/runtime/fork.hpp"
#include "tests/runtime/moe_inputs.hpp"
#include "weft/weft.hpp"

namespace weft {
namespace {

using test::forkRanks;
using test::hostAllocMaps;
using test::segmentsOf;

constexpr int kRanks = 3, kExperts = 6, kTopk = 3;
constexpr std::size_t kTokens = 300, kHidden = 1024;

using Inputs = test::MoeInputs;

// Rank r's tokens, made alike in every process.
Inputs inputsOf(int r) {
  return test::moeInputsOf(static_cast<unsigned>(29 + r), kTokens, kHidden, kExperts, kTopk);
}

// Exit codes: 0 when every row and every output is right and the mappings are as `direct` says.
int roundTrip(int r, Comm& comm, bool direct) {
  const int L = kExperts / kRanks;
  std::vector<Inputs> all;
  for (int s = 0; s < kRanks; ++s) all.push_back(inputsOf(s));
  Inputs& in = all[static_cast<std::size_t>(r)];
  const std::size_t capacity = kRanks * kTokens * kTopk;
  std::vector<float> recv(capacity * kHidden, NAN), out(kTokens * kHidden, NAN);
  std::vector<std::int32_t> counts(L, -1), source(2 * capacity, -1);
  weftMoeDispatchArgs a{};
  a.x = in.x.data(), a.topkIdx = in.idx.data(), a.topkWeights = in.w.data();
  a.tokens = kTokens, a.hidden = kHidden, a.topk = kTopk, a.experts = kExperts;
  a.datatype = weftFloat32, a.recvX = recv.data(), a.capacity = capacity;
  a.expertCounts = counts.data(), a.recvSource = source.data();
  for (int round = 0; round < 2; ++round) {  // the second reuses the workspaces and mappings
    auto h = comm.moeDispatch(a);
    if (!h) {
      std::fprintf(stderr, "rank %d: dispatch: %s\n", r, h.status().toString().c_str());
      return 2;
    }
    // Every row its source token's values; the expert's output scales it by (expert + 1).
    std::vector<float> y(h->rows() * kHidden);
    std::size_t row = 0;
    for (int e = 0; e < L; ++e) {
      for (std::int32_t i = 0; i < counts[static_cast<std::size_t>(e)]; ++i, ++row) {
        const auto s = static_cast<std::size_t>(source[2 * row]);
        const auto t = static_cast<std::size_t>(source[2 * row + 1]);
        if (std::memcmp(&recv[row * kHidden], &all[s].x[t * kHidden], kHidden * 4) != 0) return 3;
        for (std::size_t c = 0; c < kHidden; ++c)
          y[row * kHidden + c] = recv[row * kHidden + c] * static_cast<float>(r * L + e + 1);
      }
    }
    if (row != h->rows()) return 4;
    if (Status s = comm.moeCombine(*h, y.data(), out.data()); !s) {
      std::fprintf(stderr, "rank %d: combine: %s\n", r, s.toString().c_str());
      return 5;
    }
    for (std::size_t t = 0; t < kTokens; ++t) {
      for (std::size_t c = 0; c < kHidden; ++c) {
        double want = 0, size = 0;
        for (std::size_t j = 0; j < kTopk; ++j) {
          const std::int64_t e = in.idx[t * kTopk + j];
          if (e < 0) continue;
          const double v =
              static_cast<double>(in.w[t * kTopk + j]) * (e + 1) * in.x[t * kHidden + c];
          want += v, size += std::fabs(v);
        }
        if (!(std::fabs(out[t * kHidden + c] - want) <= 8 * std::ldexp(size, -24) + 1e-30))
          return 6;
      }
    }
  }
  // Its own workspace, and with the peers' read in place, every peer's mapped here.
  const int maps = hostAllocMaps();
  if (direct ? maps < kRanks : maps != 1) {
    std::fprintf(stderr, "rank %d: %d weftHostAlloc mappings\n", r, maps);
    return 7;
  }
  return 0;
}

TEST(MoeProcesses, RanksReadPeersWorkspacesOrGoThroughAllToAllv) {
  WEFT_SKIP_UNDER_TSAN();
  for (bool direct : {true, false}) {
    SCOPED_TRACE(direct ? "peers' workspaces" : "WEFT_HOST_DIRECT=0");
    std::vector<pid_t> pids;
    const std::vector<int> codes = forkRanks(
        kRanks, [direct](int r, Comm& comm) { return roundTrip(r, comm, direct); }, &pids,
        std::chrono::seconds(120),
        [direct](int) {
          if (!direct) setenv("WEFT_HOST_DIRECT", "0", 1);
        });
    for (std::size_t r = 0; r < codes.size(); ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
    EXPECT_EQ(segmentsOf(pids), 0);
  }
}

}  // namespace
}  // namespace weft
