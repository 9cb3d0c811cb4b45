// MoE dispatch and combine through the public API (weft.h's weftMoe*, weft.hpp's Comm::moe*),
// ranks as threads of one process: every received row is its source token's, grouped by local
// expert with the right counts; combine of outputs that scale each expert's rows by (expert + 1)
// equals Σ weight · (expert + 1) · x in double; bad arguments are clear errors that write nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "fused/fp8/codec.hpp"
#include "tests/runtime/moe_inputs.hpp"
#include "weft/weft.hpp"

namespace weft {
namespace {

constexpr int kRanks = 4, kExperts = 8, kTopk = 3;
constexpr std::size_t kTokens = 24, kHidden = 16, kCapacity = kRanks * kTokens * kTopk;

using Inputs = test::MoeInputs;

// Rank r's tokens: distinct experts per token, a slot dropped now and then.
Inputs inputsOf(int r) {
  return test::moeInputsOf(static_cast<unsigned>(11 + r), kTokens, kHidden, kExperts, kTopk);
}

template <typename Fn>
void onEveryRank(std::vector<Comm>& comms, Fn fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r)
    threads.emplace_back([&, r] { fn(r, comms[static_cast<std::size_t>(r)]); });
  for (auto& t : threads) t.join();
}

weftMoeDispatchArgs argsOf(Inputs& in, std::vector<float>& recv, std::vector<std::int32_t>& counts,
                           std::vector<std::int32_t>& source) {
  weftMoeDispatchArgs a{};
  a.x = in.x.data(), a.topkIdx = in.idx.data(), a.topkWeights = in.w.data();
  a.tokens = kTokens, a.hidden = kHidden, a.topk = kTopk, a.experts = kExperts;
  a.datatype = weftFloat32;
  a.recvX = recv.data(), a.capacity = kCapacity;
  a.expertCounts = counts.data(), a.recvSource = source.data();
  return a;
}

TEST(MoeApi, DispatchAndCombineAgainstTheRouting) {
  auto comms = Comm::initAll(kRanks);
  ASSERT_TRUE(comms.isOk()) << comms.status().toString();
  std::vector<Inputs> all;
  for (int r = 0; r < kRanks; ++r) all.push_back(inputsOf(r));
  constexpr int L = kExperts / kRanks;
  onEveryRank(*comms, [&](int r, Comm& c) {
    Inputs in = all[static_cast<std::size_t>(r)];
    std::vector<float> recv(kCapacity * kHidden, NAN);  // poisoned
    std::vector<std::int32_t> counts(L, -1), source(2 * kCapacity, -1);
    auto h = c.moeDispatch(argsOf(in, recv, counts, source));
    ASSERT_TRUE(h.isOk()) << h.status().toString();
    // Each local expert's rows: from every rank, in token order, each the token's values.
    std::size_t row = 0;
    for (int e = 0; e < L; ++e) {
      std::size_t want = 0;
      for (int s = 0; s < kRanks; ++s) {
        const Inputs& from = all[static_cast<std::size_t>(s)];
        for (std::size_t t = 0; t < kTokens; ++t) {
          bool routed = false;
          for (int j = 0; j < kTopk; ++j)
            routed = routed || from.idx[t * kTopk + static_cast<std::size_t>(j)] == r * L + e;
          if (!routed) continue;
          ++want;
          ASSERT_EQ(source[2 * row], s) << "row " << row;
          ASSERT_EQ(source[2 * row + 1], static_cast<std::int32_t>(t)) << "row " << row;
          for (std::size_t c2 = 0; c2 < kHidden; ++c2)
            ASSERT_EQ(recv[row * kHidden + c2], from.x[t * kHidden + c2]) << "row " << row;
          ++row;
        }
      }
      EXPECT_EQ(counts[static_cast<std::size_t>(e)], static_cast<std::int32_t>(want));
    }
    EXPECT_EQ(h->rows(), row);
    // Expert e's output: its rows times (its global index + 1).
    std::vector<float> y(row * kHidden);
    std::size_t at = 0;
    for (int e = 0; e < L; ++e)
      for (int i = 0; i < counts[static_cast<std::size_t>(e)]; ++i, ++at)
        for (std::size_t c2 = 0; c2 < kHidden; ++c2)
          y[at * kHidden + c2] = recv[at * kHidden + c2] * static_cast<float>(r * L + e + 1);
    std::vector<float> out(kTokens * kHidden, NAN);
    ASSERT_TRUE(c.moeCombine(*h, y.data(), out.data()).isOk());
    for (std::size_t t = 0; t < kTokens; ++t) {
      for (std::size_t c2 = 0; c2 < kHidden; ++c2) {
        double want = 0;
        for (int j = 0; j < kTopk; ++j) {
          const std::int64_t e = in.idx[t * kTopk + static_cast<std::size_t>(j)];
          if (e >= 0)
            want += static_cast<double>(in.w[t * kTopk + static_cast<std::size_t>(j)]) *
                    static_cast<double>(e + 1) * in.x[t * kHidden + c2];
        }
        EXPECT_NEAR(out[t * kHidden + c2], want, 1e-5 * (1 + std::fabs(want)))
            << "rank " << r << " token " << t;
      }
    }
  });
}

// fp8 dispatch: each received row is its source token's row encoded once (e4m3, one f32 scale
// per 128 values), bit for bit as the host codec encodes it; combine of the decoded rows equals
// Σ weight · decoded x in double.
TEST(MoeApi, Fp8DispatchSendsTheCodecsBytes) {
  auto comms = Comm::initAll(kRanks);
  ASSERT_TRUE(comms.isOk()) << comms.status().toString();
  constexpr std::size_t H = 256, blocks = H / 128;
  constexpr int L = kExperts / kRanks;
  const fused::fp8::Codec codec{fused::fp8::Element::e4m3, fused::fp8::ScaleKind::f32, 128};
  std::vector<Inputs> all;
  for (int r = 0; r < kRanks; ++r) {
    Inputs in = inputsOf(r);
    in.x.resize(kTokens * H);
    std::mt19937 rng(static_cast<unsigned>(5 + r));
    std::normal_distribution<float> normal(0, 3);
    for (auto& v : in.x) v = normal(rng);
    all.push_back(std::move(in));
  }
  // Each rank's rows as the codec encodes them, and decoded.
  auto encoded = [&](int s, std::size_t t) {
    std::vector<std::byte> e(codec.encodedBytes(H));
    EXPECT_TRUE(fused::fp8::encode(codec, DataType::f32,
                                   all[static_cast<std::size_t>(s)].x.data() + t * H, H, e.data())
                    .isOk());
    return e;
  };
  onEveryRank(*comms, [&](int r, Comm& c) {
    Inputs in = all[static_cast<std::size_t>(r)];
    std::vector<std::uint8_t> recv(kCapacity * H, 0xA5);
    std::vector<float> scales(kCapacity * blocks, NAN);
    std::vector<std::int32_t> counts(L, -1), source(2 * kCapacity, -1);
    weftMoeDispatchArgs a{};
    a.x = in.x.data(), a.topkIdx = in.idx.data(), a.topkWeights = in.w.data();
    a.tokens = kTokens, a.hidden = H, a.topk = kTopk, a.experts = kExperts;
    a.datatype = weftFloat32, a.recvX = recv.data(), a.capacity = kCapacity;
    a.expertCounts = counts.data(), a.recvSource = source.data();
    a.fp8Dispatch = 1, a.recvScales = scales.data();
    auto h = c.moeDispatch(a);
    ASSERT_TRUE(h.isOk()) << h.status().toString();
    std::vector<float> y(h->rows() * H);
    for (std::size_t row = 0; row < h->rows(); ++row) {
      const auto want = encoded(source[2 * row], static_cast<std::size_t>(source[2 * row + 1]));
      ASSERT_EQ(std::memcmp(recv.data() + row * H, want.data(), H), 0) << "row " << row;
      ASSERT_EQ(std::memcmp(scales.data() + row * blocks, want.data() + H, blocks * 4), 0)
          << "row " << row;
      ASSERT_TRUE(
          fused::fp8::decode(codec, DataType::f32, want.data(), H, y.data() + row * H).isOk());
    }
    std::vector<float> out(kTokens * H, NAN);
    ASSERT_TRUE(c.moeCombine(*h, y.data(), out.data()).isOk());
    for (std::size_t t = 0; t < kTokens; ++t) {
      std::vector<float> xs(H);
      const auto e = encoded(r, t);
      ASSERT_TRUE(fused::fp8::decode(codec, DataType::f32, e.data(), H, xs.data()).isOk());
      for (std::size_t c2 = 0; c2 < H; ++c2) {
        double want = 0;
        for (int j = 0; j < kTopk; ++j)
          if (in.idx[t * kTopk + static_cast<std::size_t>(j)] >= 0)
            want += static_cast<double>(in.w[t * kTopk + static_cast<std::size_t>(j)]) * xs[c2];
        EXPECT_NEAR(out[t * H + c2], want, 1e-5 * (1 + std::fabs(want))) << "token " << t;
      }
    }
  });
}

TEST(MoeApi, BadArgumentsAreClearErrorsThatWriteNothing) {
  auto comms = Comm::initAll(kRanks);
  ASSERT_TRUE(comms.isOk()) << comms.status().toString();
  onEveryRank(*comms, [&](int r, Comm& c) {
    Inputs in = inputsOf(r);
    std::vector<float> recv(kCapacity * kHidden, -7.0f);
    std::vector<std::int32_t> counts(kExperts / kRanks, -1), source(2 * kCapacity, -1);
    weftMoeHandle_t h = nullptr;
    EXPECT_EQ(weftMoeDispatch(nullptr, &h, c.handle(), nullptr), weftInvalidArgument);
    weftMoeDispatchArgs a = argsOf(in, recv, counts, source);
    int stream = 0;
    EXPECT_EQ(weftMoeDispatch(&a, &h, c.handle(), &stream), weftInvalidUsage);
    EXPECT_NE(std::string(weftGetLastError()).find("stream must be NULL"), std::string::npos);
    // Rank 2's expert out of range: every rank's error, nothing written.
    if (r == 2) in.idx[4] = kExperts;
    EXPECT_EQ(weftMoeDispatch(&a, &h, c.handle(), nullptr), weftInvalidArgument);
    EXPECT_EQ(h, nullptr);
    const std::string why = weftGetLastError();
    EXPECT_NE(why.find(r == 2 ? "expert" : "rank 2"), std::string::npos) << why;
    for (float v : recv) ASSERT_EQ(v, -7.0f);
    for (std::int32_t v : counts) ASSERT_EQ(v, -1);
    if (r == 2) in.idx[4] = 0;
    // Too little capacity: every rank's error naming by how many.
    a.capacity = 1;
    EXPECT_EQ(weftMoeDispatch(&a, &h, c.handle(), nullptr), weftInvalidArgument);
    EXPECT_NE(std::string(weftGetLastError()).find("over its capacity"), std::string::npos);
    a.capacity = kCapacity;
    auto good = c.moeDispatch(a);
    ASSERT_TRUE(good.isOk()) << good.status().toString();
    EXPECT_EQ(weftMoeCombine(nullptr, recv.data(), recv.data(), c.handle(), nullptr),
              weftInvalidArgument);
    EXPECT_EQ(weftMoeRows(nullptr, nullptr), weftInvalidArgument);
  });
}

// The halves (weftMoeDispatchSend ... weftMoeCombineRecv) give the whole calls' bytes; a half out
// of order is weftInvalidUsage naming the half the handle awaits, and changes nothing.
TEST(MoeApi, HalvesEqualTheWholeCallsAndComeInOrder) {
  auto comms = Comm::initAll(kRanks);
  ASSERT_TRUE(comms.isOk()) << comms.status().toString();
  onEveryRank(*comms, [&](int r, Comm& c) {
    Inputs in = inputsOf(r);
    std::vector<float> recv(kCapacity * kHidden, NAN), recv2(kCapacity * kHidden, NAN);
    std::vector<std::int32_t> counts(kExperts / kRanks, -1), source(2 * kCapacity, -1);
    std::vector<std::int32_t> counts2 = counts, source2 = source;
    auto whole = c.moeDispatch(argsOf(in, recv, counts, source));
    ASSERT_TRUE(whole.isOk()) << whole.status().toString();
    std::vector<float> out(kTokens * kHidden, NAN), out2(kTokens * kHidden, NAN);
    ASSERT_TRUE(c.moeCombine(*whole, recv.data(), out.data()).isOk());

    auto half = c.moeDispatchSend(argsOf(in, recv2, counts2, source2));
    ASSERT_TRUE(half.isOk()) << half.status().toString();
    // Combine before the dispatch's receive: out of order.
    EXPECT_EQ(weftMoeCombineSend(half->get(), recv2.data(), c.handle(), nullptr), weftInvalidUsage);
    EXPECT_NE(std::string(weftGetLastError()).find("awaits weftMoeDispatchRecv"), std::string::npos)
        << weftGetLastError();
    ASSERT_TRUE(c.moeDispatchRecv(*half).isOk());
    EXPECT_EQ(weftMoeDispatchRecv(half->get(), c.handle(), nullptr), weftInvalidUsage);
    EXPECT_EQ(weftMoeCombineRecv(half->get(), out2.data(), c.handle(), nullptr), weftInvalidUsage);
    EXPECT_EQ(half->rows(), whole->rows());
    ASSERT_TRUE(c.moeCombineSend(*half, recv2.data()).isOk());
    ASSERT_TRUE(c.moeCombineRecv(*half, out2.data()).isOk());
    EXPECT_EQ(weftMoeCombineSend(half->get(), recv2.data(), c.handle(), nullptr), weftInvalidUsage);
    EXPECT_EQ(std::memcmp(recv.data(), recv2.data(), whole->rows() * kHidden * 4), 0);
    EXPECT_EQ(counts, counts2);
    EXPECT_EQ(source, source2);
    EXPECT_EQ(std::memcmp(out.data(), out2.data(), out.size() * 4), 0);
  });
}

}  // namespace
}  // namespace weft
