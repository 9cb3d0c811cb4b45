// MoE dispatch and combine on host memory (fused/moe/host.hpp), ranks as threads: every row
// received is its source token's values, bit for bit, grouped by local expert in (source rank,
// token) order with the right counts and sources; combine of expert outputs (each expert
// scaling its rows) equals Σ weight · output in double within two bf16 roundings, the same bits
// on a second run; routings uniform, skewed, all to one expert, all dropped, top-1 to top-8,
// 1–8 ranks; ranks reading each other's workspaces or going through all-to-all-v, the same bits;
// ranks on several hosts through the flat and the hierarchical path; a bad expert index or a rank
// over its capacity is every rank's error, nothing written.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "fused/moe/host.hpp"
#include "src/bootstrap/bootstrap.hpp"
#include "src/exec/numeric.hpp"

namespace weft::fused::moe {
namespace {

// skewed: each token's experts drawn without replacement with weights 1 / (expert + 1) (a
// Zipf law: the low experts, and so rank 0, get most rows).
enum class Pattern { uniform, skewed, oneExpert, dropped };

struct World {
  int n, experts, topk;
  std::size_t tokens, hidden = 64;
  Pattern pattern = Pattern::uniform;
  // Every rank's inputs, made alike on every thread from the seed.
  std::vector<std::vector<std::uint16_t>> x;  // bf16
  std::vector<std::vector<std::int64_t>> idx;
  std::vector<std::vector<float>> w;
  World(int ranks, int e, int k, std::size_t count, Pattern p, std::size_t h = 64)
      : n(ranks), experts(e), topk(k), tokens(count), hidden(h), pattern(p) {
    std::mt19937 rng(static_cast<unsigned>(7 * ranks + 3 * k + static_cast<int>(p)));
    std::normal_distribution<float> normal(0, 1);
    std::uniform_real_distribution<float> weight(0.1f, 1);
    for (int r = 0; r < n; ++r) {
      std::vector<std::uint16_t> xs(tokens * hidden);
      for (auto& v : xs) v = exec::floatToBf16(normal(rng));
      std::vector<std::int64_t> is(tokens * static_cast<std::size_t>(k));
      std::vector<float> ws(is.size());
      for (std::size_t t = 0; t < tokens; ++t) {
        std::vector<int> all(static_cast<std::size_t>(e));
        for (int i = 0; i < e; ++i) all[static_cast<std::size_t>(i)] = i;
        std::shuffle(all.begin(), all.end(), rng);
        if (pattern == Pattern::skewed) {  // by u^(1/weight), largest first
          std::uniform_real_distribution<double> u(0, 1);
          std::vector<double> key(all.size());
          for (std::size_t i = 0; i < all.size(); ++i)
            key[i] = std::pow(u(rng), static_cast<double>(all[i] + 1));
          std::vector<std::size_t> order(all.size());
          for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
          std::sort(order.begin(), order.end(),
                    [&](std::size_t a, std::size_t b) { return key[a] > key[b]; });
          std::vector<int> drawn;
          for (std::size_t i : order) drawn.push_back(all[i]);
          all = drawn;
        }
        for (int j = 0; j < k; ++j) {
          const std::size_t at = t * static_cast<std::size_t>(k) + static_cast<std::size_t>(j);
          is[at] = pattern == Pattern::dropped               ? -1
                   : pattern == Pattern::oneExpert && j == 0 ? 0
                   : pattern == Pattern::oneExpert           ? -1
                   : (t % 7 == 3 && j == k - 1)              ? -1  // a dropped slot now and then
                                                             : all[static_cast<std::size_t>(j)];
          ws[at] = weight(rng);
        }
      }
      x.push_back(std::move(xs)), idx.push_back(std::move(is)), w.push_back(std::move(ws));
    }
  }
  algo::MoeShape shape() const {
    return algo::MoeShape::of(tokens, hidden, topk, experts, n, false);
  }
  float scaleOf(int expert) const { return 1.0f + static_cast<float>(expert) / 8; }
};

// Ranks across hosts: each rank's host (claimed through the test host id), and the path
// across them (WEFT_MOE_PATH's; none: the selector's).
struct Hosts {
  std::vector<int> of;  // by rank; empty: one host
  std::optional<bool> hierarchical;
  bool direct = true;  // false: WEFT_HOST_DIRECT=0, so no rank reads another's workspace
};

std::vector<std::unique_ptr<Communicator>> ranks(int n, const Hosts& hosts = {}) {
  boot::BootstrapOptions bo;
  bo.timeoutSeconds = 30;
  auto boots = boot::makeInProcess(n, bo);
  EXPECT_TRUE(boots.isOk());
  std::vector<std::unique_ptr<Communicator>> comms(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      Config config;
      if (!hosts.of.empty())
        config.testHostId = std::to_string(hosts.of[static_cast<std::size_t>(r)]);
      config.moeHierarchical = hosts.hierarchical;
      if (!hosts.direct) config.hostDirect = 0;
      auto c = Communicator::create(std::move((*boots)[static_cast<std::size_t>(r)]), config);
      EXPECT_TRUE(c.isOk()) << c.status().toString();
      if (c) comms[static_cast<std::size_t>(r)] = std::move(*c);
    });
  }
  for (auto& t : threads) t.join();
  return comms;
}

template <typename F>
void everyRank(int n, F f) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(f, r);
  for (auto& t : threads) t.join();
}

// Dispatch, check every row, let each expert scale its rows, combine, check against double;
// each rank's combined output.
std::vector<std::vector<std::uint16_t>> expectRoundTrip(const World& wd, const Hosts& hosts = {}) {
  std::vector<std::vector<std::uint16_t>> outs(static_cast<std::size_t>(wd.n));
  auto comms = ranks(wd.n, hosts);
  EXPECT_EQ(comms.size(), static_cast<std::size_t>(wd.n));
  if (comms.size() != static_cast<std::size_t>(wd.n)) return outs;
  const algo::MoeShape shape = wd.shape();
  const int L = shape.localExperts();
  const std::size_t H = wd.hidden, capacity = wd.tokens * static_cast<std::size_t>(wd.n * wd.topk);
  everyRank(wd.n, [&](int r) {
    const auto R = static_cast<std::size_t>(r);
    std::vector<std::uint16_t> recv(capacity * H, 0xFFFF);  // poisoned
    std::vector<std::int32_t> counts(static_cast<std::size_t>(L), -1), source(2 * capacity, -1);
    DispatchCall call;
    call.x = wd.x[R].data(), call.topkIdx = wd.idx[R].data(), call.topkWeights = wd.w[R].data();
    call.recvX = recv.data(), call.capacity = capacity;
    call.expertCounts = counts.data(), call.recvSource = source.data();
    auto layout = dispatchHost(*comms[R], shape, call);
    ASSERT_TRUE(layout.isOk()) << layout.status().toString();
    if (hosts.hierarchical) {
      EXPECT_EQ(layout->hierarchical, *hosts.hierarchical);
    }
    // Each local expert's rows: every (source rank, token) routed to it, in that order.
    std::size_t row = 0;
    for (int e = 0; e < L; ++e) {
      const std::int64_t expert = static_cast<std::int64_t>(r) * L + e;
      std::size_t want = 0;
      for (int s = 0; s < wd.n; ++s) {
        for (std::size_t t = 0; t < wd.tokens; ++t) {
          const std::int64_t* slots =
              wd.idx[static_cast<std::size_t>(s)].data() + t * static_cast<std::size_t>(wd.topk);
          if (std::find(slots, slots + wd.topk, expert) == slots + wd.topk) continue;
          ++want;
          ASSERT_LT(row, capacity);
          EXPECT_EQ(source[2 * row], s) << "rank " << r << " row " << row;
          EXPECT_EQ(source[2 * row + 1], static_cast<std::int32_t>(t)) << "rank " << r;
          EXPECT_EQ(std::memcmp(&recv[row * H], &wd.x[static_cast<std::size_t>(s)][t * H], H * 2),
                    0)
              << "rank " << r << " row " << row;
          ++row;
        }
      }
      EXPECT_EQ(counts[static_cast<std::size_t>(e)], static_cast<std::int32_t>(want));
    }
    EXPECT_EQ(layout->rows, row);
    // The experts: row values times the expert's scale, in bf16.
    std::vector<std::uint16_t> y(row * H);
    std::size_t at = 0;
    for (int e = 0; e < L; ++e) {
      for (std::int32_t i = 0; i < counts[static_cast<std::size_t>(e)]; ++i, ++at) {
        for (std::size_t c = 0; c < H; ++c)
          y[at * H + c] =
              exec::floatToBf16(exec::bf16ToFloat(recv[at * H + c]) * wd.scaleOf(r * L + e));
      }
    }
    std::vector<std::uint16_t> out(wd.tokens * H, 0xFFFF), again(wd.tokens * H, 0xFFFF);
    ASSERT_TRUE(combineHost(*comms[R], *layout, y.data(), out.data()).isOk());
    ASSERT_TRUE(combineHost(*comms[R], *layout, y.data(), again.data()).isOk());
    EXPECT_EQ(out, again) << "rank " << r << ": combine is not deterministic";
    int bad = 0;
    for (std::size_t t = 0; t < wd.tokens; ++t) {
      for (std::size_t c = 0; c < H; ++c) {
        double want = 0, size = 0;
        for (int j = 0; j < wd.topk; ++j) {
          const std::size_t slot =
              t * static_cast<std::size_t>(wd.topk) + static_cast<std::size_t>(j);
          const std::int64_t e = wd.idx[R][slot];
          if (e < 0) continue;
          const double v = exec::bf16ToFloat(exec::floatToBf16(
              exec::bf16ToFloat(wd.x[R][t * H + c]) * wd.scaleOf(static_cast<int>(e))));
          want += wd.w[R][slot] * v;
          size += std::fabs(wd.w[R][slot] * v);
        }
        const double got = exec::bf16ToFloat(out[t * H + c]);
        // Each rank's partial and the sum rounded to bf16 (2^-8 relative each); the
        // hierarchical path rounds each host's sum of them too.
        const double roundings = layout->hierarchical ? 3 : 2;
        if (!(std::fabs(got - want) <= roundings * std::ldexp(size, -8) + 1e-30) && bad++ < 3)
          ADD_FAILURE() << "rank " << r << " token " << t << " [" << c << "]: " << got
                        << ", expected " << want;
      }
    }
    EXPECT_EQ(bad, 0) << "rank " << r;
    outs[R] = std::move(out);
  });
  return outs;
}

TEST(MoeHost, UniformRoutingsAtEveryRankCountAndTopK) {
  for (int n : {1, 2, 3, 4}) {
    for (int k : {1, 2, 4}) {
      SCOPED_TRACE(std::to_string(n) + " ranks, top-" + std::to_string(k));
      expectRoundTrip(World(n, 4 * n, k, 37, Pattern::uniform));
    }
  }
}

// What the host path builds on: every rank's workspace as each reads it (empty on every rank
// with WEFT_HOST_DIRECT=0), and the rank's threads running every share of a loop once.
TEST(MoeHost, PeersWorkspacesAndTheRanksThreads) {
  for (bool direct : {true, false}) {
    auto comms = ranks(3, Hosts{{}, std::nullopt, direct});
    ASSERT_EQ(comms.size(), 3u);
    everyRank(3, [&](int r) {
      Communicator& c = *comms[static_cast<std::size_t>(r)];
      auto mine = c.workspace(100, false);
      ASSERT_TRUE(mine.isOk());
      (*mine)[99] = static_cast<std::byte>(40 + r);
      auto all = c.peerWorkspaces(100);  // written before: every rank's is there to read
      ASSERT_TRUE(all.isOk()) << all.status().toString();
      ASSERT_EQ(all->size(), direct ? 3u : 0u);
      for (std::size_t q = 0; q < all->size(); ++q)
        EXPECT_EQ((*all)[q][99], static_cast<std::byte>(40 + q)) << "rank " << r;
      ASSERT_TRUE(c.doneWithPeerWorkspaces(*all).isOk());  // nobody writes while a peer reads
      std::vector<int> ran(7, 0);
      c.parallel(ran.size(), [&](std::size_t i) { ++ran[i]; });
      EXPECT_EQ(ran, std::vector<int>(7, 1));
      EXPECT_GE(c.hostThreads(), 1u);
    });
  }
}

// Ranks reading each other's workspaces, or going through all-to-all-v (WEFT_HOST_DIRECT=0):
// the same bits; rows of 4 KiB, so that calls split across a rank's threads where it has two.
TEST(MoeHost, PeersWorkspacesAndAllToAllvGiveTheSameBits) {
  for (int n : {1, 2, 3}) {
    SCOPED_TRACE(std::to_string(n) + " ranks");
    const World wd(n, 4 * n, 4, 300, Pattern::uniform, 2048);
    const auto direct = expectRoundTrip(wd);
    const auto through = expectRoundTrip(wd, Hosts{{}, std::nullopt, false});
    EXPECT_EQ(direct, through);
  }
}

// Skewed routings (most rows to rank 0) at up to 8 ranks and top-8.
TEST(MoeHost, SkewedRoutingsAtEightRanksAndTopEight) {
  for (int n : {2, 5, 8}) {
    for (int k : {3, 8}) {
      SCOPED_TRACE(std::to_string(n) + " ranks, top-" + std::to_string(k));
      expectRoundTrip(World(n, 2 * n * k, k, 41, Pattern::skewed));
    }
  }
}

TEST(MoeHost, EveryTokenToOneExpertAndEverySlotDropped) {
  expectRoundTrip(World(3, 6, 2, 29, Pattern::oneExpert));
  expectRoundTrip(World(3, 6, 2, 29, Pattern::dropped));
  expectRoundTrip(World(2, 4, 2, 0, Pattern::uniform));  // no tokens
}

// Ranks on several hosts, host-major or interleaved, every routing pattern, both paths: the
// same rows, the same layout, the combine within its roundings.
TEST(MoeHost, AcrossHostsFlatAndHierarchical) {
  const std::vector<std::vector<int>> placements = {{0, 0, 1, 1}, {0, 1, 0, 1}, {0, 0, 1, 1, 2, 2}};
  for (const auto& of : placements) {
    const int n = static_cast<int>(of.size());
    for (bool hierarchical : {false, true}) {
      for (int k : {1, 2, 4}) {
        SCOPED_TRACE(std::to_string(n) + " ranks, " + std::to_string(of[1]) + " second, top-" +
                     std::to_string(k) + (hierarchical ? ", hierarchical" : ", flat"));
        expectRoundTrip(World(n, 4 * n, k, 23, Pattern::uniform), Hosts{of, hierarchical});
      }
      expectRoundTrip(World(n, 2 * n, 2, 9, Pattern::oneExpert), Hosts{of, hierarchical});
      expectRoundTrip(World(n, 2 * n, 2, 9, Pattern::dropped), Hosts{of, hierarchical});
    }
  }
}

// A bad index on one rank, or one rank over its capacity: every rank fails, naming it; the
// receive buffers stay as they were.
TEST(MoeHost, BadRoutingsAndOverCapacityAreEveryRanksError) {
  const World wd(3, 6, 2, 16, Pattern::uniform);
  auto comms = ranks(3);
  const algo::MoeShape shape = wd.shape();
  for (int failing : {0, 1}) {
    everyRank(3, [&](int r) {
      const auto R = static_cast<std::size_t>(r);
      std::vector<std::int64_t> idx = wd.idx[R];
      if (failing == 0 && r == 2) idx[5] = 6;  // no expert 6
      std::size_t capacity = 16 * 3 * 2;
      if (failing == 1 && r == 1) capacity = 3;
      std::vector<std::uint16_t> recv(capacity * wd.hidden, 0xABCD);
      std::vector<std::int32_t> counts(2, -7);
      DispatchCall call;
      call.x = wd.x[R].data(), call.topkIdx = idx.data(), call.topkWeights = wd.w[R].data();
      call.recvX = recv.data(), call.capacity = capacity, call.expertCounts = counts.data();
      auto layout = dispatchHost(*comms[R], shape, call);
      ASSERT_FALSE(layout.isOk()) << "rank " << r;
      const std::string why = layout.status().message();
      if (failing == 0) {
        EXPECT_NE(why.find(r == 2 ? "expert 6" : "rank 2"), std::string::npos) << why;
      } else {
        EXPECT_NE(why.find("rank 1 receives"), std::string::npos) << why;
        EXPECT_NE(why.find("over its capacity"), std::string::npos) << why;
      }
      EXPECT_EQ(counts, (std::vector<std::int32_t>{-7, -7}));
      EXPECT_TRUE(
          std::all_of(recv.begin(), recv.end(), [](std::uint16_t v) { return v == 0xABCD; }));
    });
  }
}

}  // namespace
}  // namespace weft::fused::moe
