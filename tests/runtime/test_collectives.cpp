// Every collective on host memory, as threads in one process: each dtype and op, sizes from 0 to
// beyond a FIFO slot, in place and out of place, 1 to 8 ranks, against a double-precision
// reference on fresh random data with outputs poisoned beforehand. Then every algorithm forced in
// turn with WEFT_ALGO, and the argument checks.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "algorithms/algorithm.hpp"
#include "tests/runtime/harness.hpp"

namespace weft::test {
namespace {

class Threads : public ::testing::TestWithParam<int> {};

TEST_P(Threads, EveryCollectiveTypeOpAndSize) {
  const int n = GetParam();
  std::vector<Comm> comms = makeComms(n);
  ASSERT_EQ(comms.size(), static_cast<std::size_t>(n));
  for (const std::string& f : runMatrix(comms, n)) ADD_FAILURE() << f;
}

TEST_P(Threads, FourMillionAndThreeElements) {
  const int n = GetParam();
  if (n > 4) GTEST_SKIP() << "the large size runs at up to 4 ranks (2-core CI)";
  std::vector<Comm> comms = makeComms(n);
  for (Collective coll : {Collective::allReduce, Collective::allGather, Collective::reduceScatter,
                          Collective::allToAll}) {
    const Case c{coll, DataType::f32, RedOp::sum, (4u << 20) + 3, false, 0};
    EXPECT_EQ(runCase(comms, c, 99), "") << describe(c, n);
  }
}

TEST_P(Threads, SendRecvAndBarrier) {
  const int n = GetParam();
  std::vector<Comm> comms = makeComms(n);
  // A ring: even ranks send first, odd ranks receive first, so any size goes through.
  for (std::size_t count : {0ul, 1ul, 1023ul, 300000ul}) {
    std::vector<std::vector<float>> got(static_cast<std::size_t>(n));
    onEveryRank(n, [&](int r) {
      Comm& c = comms[static_cast<std::size_t>(r)];
      std::vector<float> mine(count, static_cast<float>(r)), in(count, -1.f);
      const int next = (r + 1) % n, prev = (r + n - 1) % n;
      if (n > 1) {
        if (r % 2 == 0) {
          EXPECT_TRUE(c.send(mine.data(), count, DataType::f32, next).isOk());
          EXPECT_TRUE(c.recv(in.data(), count, DataType::f32, prev).isOk());
        } else {
          EXPECT_TRUE(c.recv(in.data(), count, DataType::f32, prev).isOk());
          EXPECT_TRUE(c.send(mine.data(), count, DataType::f32, next).isOk());
        }
      }
      EXPECT_TRUE(c.barrier().isOk());
      got[static_cast<std::size_t>(r)] = std::move(in);
    });
    if (n == 1) continue;
    for (int r = 0; r < n; ++r) {
      for (float v : got[static_cast<std::size_t>(r)]) {
        ASSERT_EQ(v, static_cast<float>((r + n - 1) % n)) << "rank " << r << " count " << count;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, Threads, ::testing::Values(1, 2, 3, 4, 8),
                         [](const auto& p) { return std::to_string(p.param) + "ranks"; });

// The direct path (every rank reads its peers' buffers, src/exec/host_direct.hpp) on every call
// it serves, made the path of every call with WEFT_HOST_DIRECT_BYTES=1: the whole matrix, and
// the plan names it.
TEST(DirectPath, EveryCollectiveTypeOpAndSizeWhenEveryCallTakesIt) {
  setenv("WEFT_HOST_DIRECT_BYTES", "1", 1);
  setenv("WEFT_HOST_SMALL_BYTES", "0", 1);  // not the slots either
  // Two threads a rank on 2 and 8 ranks (their shares and the rank's own barrier), whatever the
  // machine's cores.
  for (int n : {2, 3, 8}) {
    if (n != 3) setenv("WEFT_HOST_DIRECT_THREADS", "2", 1);
    std::vector<Comm> comms = makeComms(n);
    unsetenv("WEFT_HOST_DIRECT_THREADS");
    ASSERT_EQ(comms.size(), static_cast<std::size_t>(n));
    char buf[64];
    for (weftCollective_t c :
         {weftCollAllReduce, weftCollReduceScatter, weftCollAllGather, weftCollAllToAll}) {
      ASSERT_EQ(weftCommPlan(comms[0].handle(), c, 16, weftFloat32, buf, sizeof buf), weftSuccess);
      EXPECT_EQ(std::string(buf), "direct/simple") << c;
    }
    ASSERT_EQ(
        weftCommPlan(comms[0].handle(), weftCollBroadcast, 1 << 20, weftFloat32, buf, sizeof buf),
        weftSuccess);
    EXPECT_NE(std::string(buf), "direct/simple") << "broadcast";
    for (const std::string& f : runMatrix(comms, n)) ADD_FAILURE() << n << " ranks: " << f;
  }
  // Off: the schedules again.
  setenv("WEFT_HOST_DIRECT", "0", 1);
  std::vector<Comm> off = makeComms(2);
  unsetenv("WEFT_HOST_DIRECT");
  unsetenv("WEFT_HOST_DIRECT_BYTES");
  unsetenv("WEFT_HOST_SMALL_BYTES");
  char buf[64];
  ASSERT_EQ(weftCommPlan(off[0].handle(), weftCollAllReduce, 1 << 20, weftFloat32, buf, sizeof buf),
            weftSuccess);
  EXPECT_NE(std::string(buf), "direct/simple");
}

// Small calls through the slots (src/exec/host_slots.hpp), every call of the matrix whose rank's
// input fits 8 KiB; and their plans.
TEST(SmallCalls, EveryCollectiveTypeOpAndSizeThroughTheSlots) {
  setenv("WEFT_HOST_SMALL_BYTES", "8192", 1);
  for (int n : {2, 3, 8}) {
    std::vector<Comm> comms = makeComms(n);
    ASSERT_EQ(comms.size(), static_cast<std::size_t>(n));
    char buf[64];
    for (int c = 0; c < weftNumCollectives; ++c) {
      if (c == weftCollAllToAllv || c == weftCollSendRecv) continue;
      ASSERT_EQ(weftCommPlan(comms[0].handle(), static_cast<weftCollective_t>(c), 16, weftFloat32,
                             buf, sizeof buf),
                weftSuccess);
      EXPECT_EQ(std::string(buf), "slots/simple") << c;
    }
    for (const std::string& f : runMatrix(comms, n)) ADD_FAILURE() << n << " ranks: " << f;
  }
  setenv("WEFT_HOST_SMALL_BYTES", "0", 1);
  std::vector<Comm> off = makeComms(2);
  unsetenv("WEFT_HOST_SMALL_BYTES");
  char buf[64];
  ASSERT_EQ(weftCommPlan(off[0].handle(), weftCollAllReduce, 16, weftFloat32, buf, sizeof buf),
            weftSuccess);
  EXPECT_NE(std::string(buf), "slots/simple");
}

// Thousands of small calls back to back, the ranks running at their own pace (one naps now and
// then): a rank reuses a slot two calls later, when every peer has read it, so every result is
// the current call's.
TEST(SmallCalls, BackToBackCallsReuseTheSlotsSafely) {
  const int n = 4;
  std::vector<Comm> comms = makeComms(n);
  ASSERT_EQ(comms.size(), static_cast<std::size_t>(n));
  std::vector<int> bad(n, 0);
  onEveryRank(n, [&](int r) {
    Comm& c = comms[static_cast<std::size_t>(r)];
    std::vector<float> in, out(700 * n);
    for (int call = 0; call < 3000; ++call) {
      if ((call * 7 + r * 13) % 97 == 0)
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      // All-reduces of 37 elements (one shot) and of 700 (two shots), all-gathers between.
      in.resize(call % 4 == 2 ? 700 : 37);
      for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(call + r + i);
      if (call % 2 == 0) {
        if (!c.allReduce(in.data(), out.data(), in.size(), DataType::f32, RedOp::sum)) ++bad[r];
        for (std::size_t i = 0; i < in.size(); ++i) {
          const float want = static_cast<float>(n * (call + static_cast<int>(i)) + n * (n - 1) / 2);
          if (out[i] != want) ++bad[r];
        }
      } else {
        if (!c.allGather(in.data(), out.data(), in.size(), DataType::f32)) ++bad[r];
        for (int q = 0; q < n; ++q) {
          for (std::size_t i = 0; i < in.size(); ++i) {
            if (out[q * in.size() + i] != static_cast<float>(call + q + static_cast<int>(i)))
              ++bad[r];
          }
        }
      }
    }
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(bad[r], 0) << "rank " << r;
}

// Inputs that overlap their outputs other than in the collective's in-place layout: a rank's
// writes must not reach what its peers still read (it reads its input from a private copy).
TEST(DirectPath, InputsOverlappingOutputsOutOfLayout) {
  setenv("WEFT_HOST_DIRECT_BYTES", "1", 1);
  setenv("WEFT_HOST_SMALL_BYTES", "0", 1);
  const int n = 3;
  std::vector<Comm> comms = makeComms(n);
  unsetenv("WEFT_HOST_SMALL_BYTES");
  unsetenv("WEFT_HOST_DIRECT_BYTES");
  ASSERT_EQ(comms.size(), static_cast<std::size_t>(n));
  const std::size_t count = 1001;  // not a multiple of the ranks or a cache line
  auto value = [](int q, std::size_t i) { return static_cast<float>((i * 7 + q * 5) % 17); };
  for (Collective coll : {Collective::allReduce, Collective::allToAll, Collective::allGather}) {
    const std::size_t inElems = coll == Collective::allToAll ? n * count : count;
    const std::size_t outElems = coll == Collective::allReduce ? count : n * count;
    std::vector<std::vector<float>> bufs(n, std::vector<float>(inElems + outElems + 16, -1.f));
    onEveryRank(n, [&](int r) {
      std::vector<float>& b = bufs[static_cast<std::size_t>(r)];
      float* out = b.data();
      float* in = b.data() + 5;  // inside the output, off its in-place place
      for (std::size_t i = 0; i < inElems; ++i) in[i] = value(r, i);
      Comm& c = comms[static_cast<std::size_t>(r)];
      Status s = coll == Collective::allReduce
                     ? c.allReduce(in, out, count, DataType::f32, RedOp::sum)
                 : coll == Collective::allToAll ? c.allToAll(in, out, count, DataType::f32)
                                                : c.allGather(in, out, count, DataType::f32);
      EXPECT_TRUE(s.isOk()) << s.toString();
    });
    for (int r = 0; r < n; ++r) {
      const float* out = bufs[static_cast<std::size_t>(r)].data();
      for (std::size_t i = 0; i < outElems; ++i) {
        float want = 0;
        if (coll == Collective::allReduce) {
          for (int q = 0; q < n; ++q) want += value(q, i);
        } else if (coll == Collective::allToAll) {
          want =
              value(static_cast<int>(i / count), static_cast<std::size_t>(r) * count + i % count);
        } else {
          want = value(static_cast<int>(i / count), i % count);
        }
        ASSERT_EQ(out[i], want) << name(coll) << " rank " << r << " element " << i;
      }
    }
  }
}

// Every algorithm of the registry, forced with WEFT_ALGO, on the collectives it implements.
TEST(ForcedAlgorithms, EveryAlgorithmOnEveryCollectiveItServes) {
  for (const algo::Algorithm* a : algo::algorithms()) {
    for (Collective coll : a->collectives()) {
      if (coll == Collective::sendRecv || coll == Collective::allToAllv) continue;
      setenv("WEFT_ALGO", std::string(a->name()).c_str(), 1);
      for (int n : {2, 3, 4, 8}) {
        std::vector<Comm> comms = makeComms(n);
        ASSERT_EQ(comms.size(), static_cast<std::size_t>(n));
        std::uint64_t seed = 7;
        for (DataType type : {DataType::f32, DataType::f16, DataType::i32}) {
          for (std::size_t count : {1ul, 7ul, 1023ul, 65537ul}) {
            for (bool inPlace : {false, true}) {
              const RedOp op = type == DataType::i32 ? RedOp::max : RedOp::sum;
              const int root = hasRoot(coll) ? n - 1 : 0;
              const Case c{coll, type, op, count, inPlace, root};
              const std::string err = runCase(comms, c, seed++);
              EXPECT_EQ(err, "") << a->name() << ": " << describe(c, n);
            }
          }
        }
      }
      unsetenv("WEFT_ALGO");
    }
  }
}

TEST(Groups, SendAndReceiveOfAnySizeProgressTogether) {
  // Every rank sends to both neighbours and receives from both, all in one group: without the
  // group, a send larger than the FIFO would wait for a receive that comes after it.
  for (int n : {2, 3, 5}) {
    std::vector<Comm> comms = makeComms(n);
    const std::size_t count = 1'000'003;
    onEveryRank(n, [&](int r) {
      Comm& c = comms[static_cast<std::size_t>(r)];
      const int next = (r + 1) % n, prev = (r + n - 1) % n;
      std::vector<float> toNext(count, float(r)), toPrev(count, float(-r)), fromPrev(count),
          fromNext(count);
      ASSERT_EQ(weftGroupStart(), weftSuccess);
      ASSERT_TRUE(c.send(toNext.data(), count, DataType::f32, next).isOk());
      ASSERT_TRUE(c.send(toPrev.data(), count, DataType::f32, prev).isOk());
      ASSERT_TRUE(c.recv(fromPrev.data(), count, DataType::f32, prev).isOk());
      ASSERT_TRUE(c.recv(fromNext.data(), count, DataType::f32, next).isOk());
      ASSERT_EQ(weftGroupEnd(), weftSuccess) << weftGetLastError();
      // With two ranks both neighbours are the same rank: its two sends arrive in call order.
      const float a = float(prev), b = float(-next);
      EXPECT_EQ(fromPrev.front(), a);
      EXPECT_EQ(fromPrev.back(), a);
      EXPECT_EQ(fromNext.back(), b);
    });
  }
}

TEST(Groups, OneThreadDrivesEveryRank) {
  // NCCL's single-process pattern: one thread, a group, one call per communicator.
  const int n = 4;
  std::vector<Comm> comms = makeComms(n);
  std::vector<std::vector<double>> in(n), out(n);
  for (int r = 0; r < n; ++r) {
    in[static_cast<std::size_t>(r)].assign(70'000, r + 1.0);
    out[static_cast<std::size_t>(r)].assign(70'000, 0);
  }
  ASSERT_EQ(weftGroupStart(), weftSuccess);
  for (int r = 0; r < n; ++r) {
    auto& c = comms[static_cast<std::size_t>(r)];
    ASSERT_TRUE(c.allReduce(in[static_cast<std::size_t>(r)].data(),
                            out[static_cast<std::size_t>(r)].data(), 70'000, DataType::f64,
                            RedOp::sum)
                    .isOk());
  }
  ASSERT_EQ(weftGroupEnd(), weftSuccess) << weftGetLastError();
  for (int r = 0; r < n; ++r) EXPECT_EQ(out[static_cast<std::size_t>(r)].back(), 10.0);
  EXPECT_EQ(weftGroupEnd(), weftInvalidUsage);  // no group open
}

TEST(AllToAllv, UnevenCountsIncludingEmptyOnes) {
  for (int n : {1, 2, 3, 4, 8}) {
    std::vector<Comm> comms = makeComms(n);
    // Rank r sends count(r, q) elements to rank q, some of them none.
    auto count = [](int r, int q) { return static_cast<std::size_t>((r * 7 + q * 3) % 5 * 9001); };
    auto value = [](int r, int q, std::size_t i) { return float(r * 1000 + q) + float(i % 7); };
    onEveryRank(n, [&](int r) {
      std::vector<std::size_t> sc(n), sd(n), rc(n), rd(n);
      std::size_t s = 0, t = 0;
      for (int q = 0; q < n; ++q) {
        sc[q] = count(r, q), sd[q] = s, s += sc[q] + 3;  // gaps between blocks
        rc[q] = count(q, r), rd[q] = t, t += rc[q] + 5;
      }
      std::vector<float> in(s), out(t, -1.f);
      for (int q = 0; q < n; ++q) {
        for (std::size_t i = 0; i < sc[q]; ++i) in[sd[q] + i] = value(r, q, i);
      }
      ASSERT_EQ(weftAllToAllv(in.data(), sc.data(), sd.data(), out.data(), rc.data(), rd.data(),
                              weftFloat32, comms[static_cast<std::size_t>(r)].handle(), nullptr),
                weftSuccess)
          << weftGetLastError();
      for (int q = 0; q < n; ++q) {
        for (std::size_t i = 0; i < rc[q]; ++i) ASSERT_EQ(out[rd[q] + i], value(q, r, i));
        if (q + 1 < n) {
          for (std::size_t i = rd[q] + rc[q]; i < rd[q + 1]; ++i) ASSERT_EQ(out[i], -1.f);
        }
      }
    });
  }
}

TEST(Split, EvenAndOddRanksThenAllReduceInEach) {
  const int n = 6;
  std::vector<Comm> comms = makeComms(n);
  onEveryRank(n, [&](int r) {
    // Rank 5 takes no part; keys reverse the order inside each color.
    const int color = r == 5 ? -1 : r % 2;
    auto sub = comms[static_cast<std::size_t>(r)].split(color, -r);
    ASSERT_TRUE(sub.isOk()) << sub.status().toString();
    if (color < 0) {
      EXPECT_FALSE(sub->valid());
      return;
    }
    const int size = color == 0 ? 3 : 2;  // {0, 2, 4} and {1, 3}
    EXPECT_EQ(sub->size(), size);
    EXPECT_EQ(sub->rank(), color == 0 ? (4 - r) / 2 : (3 - r) / 2);
    double x = r, sum = 0;
    ASSERT_TRUE(sub->allReduce(&x, &sum, 1, DataType::f64, RedOp::sum).isOk());
    EXPECT_EQ(sum, color == 0 ? 6.0 : 4.0);
  });
}

TEST(Large, CountsBeyondTwoToThe31Elements) {
  // 2^31 + 5 one-byte elements, in place on two ranks: offsets past 32 bits everywhere.
  const std::size_t count = (std::size_t{1} << 31) + 5;
  std::vector<Comm> comms = makeComms(2);
  std::vector<std::vector<std::uint8_t>> buf(2);
  onEveryRank(2, [&](int r) {
    auto& b = buf[static_cast<std::size_t>(r)];
    b.resize(count);
    for (std::size_t i = 0; i < count; ++i)
      b[i] = static_cast<std::uint8_t>((i + static_cast<std::size_t>(r)) % 251);
    const Status s = comms[static_cast<std::size_t>(r)].allReduce(b.data(), b.data(), count,
                                                                  DataType::u8, RedOp::sum);
    EXPECT_TRUE(s.isOk()) << s.toString();
  });
  for (const auto& b : buf) {
    for (std::size_t i : {std::size_t{0}, std::size_t{1} << 31, count - 1, count / 3, count - 77}) {
      ASSERT_EQ(b[i], static_cast<std::uint8_t>(i % 251 + (i + 1) % 251)) << "element " << i;
    }
  }
}

TEST(Arguments, BadInputIsAnErrorAndTouchesNothing) {
  std::vector<Comm> comms = makeComms(2);
  weftComm_t h = comms[0].handle();
  std::vector<float> in(8, 1.f), out(8, -3.f);
  auto untouched = [&] {
    for (float v : out) {
      if (v != -3.f) return false;
    }
    return true;
  };
  EXPECT_EQ(weftAllReduce(nullptr, out.data(), 8, weftFloat32, weftSum, h, nullptr),
            weftInvalidArgument);
  EXPECT_NE(std::string(weftGetLastError()).find("sendbuff is NULL"), std::string::npos);
  EXPECT_EQ(weftAllReduce(in.data(), nullptr, 8, weftFloat32, weftSum, h, nullptr),
            weftInvalidArgument);
  EXPECT_EQ(weftAllReduce(in.data(), out.data(), 8, weftNumDataTypes, weftSum, h, nullptr),
            weftInvalidArgument);
  EXPECT_NE(std::string(weftGetLastError()).find("datatype"), std::string::npos);
  EXPECT_EQ(weftAllReduce(in.data(), out.data(), 8, weftFloat32, weftNumRedOps, h, nullptr),
            weftInvalidArgument);
  EXPECT_EQ(weftBroadcast(in.data(), out.data(), 8, weftFloat32, 2, h, nullptr),
            weftInvalidArgument);
  EXPECT_NE(std::string(weftGetLastError()).find("root 2"), std::string::npos);
  EXPECT_EQ(weftReduce(in.data(), out.data(), 8, weftFloat32, weftSum, -1, h, nullptr),
            weftInvalidArgument);
  EXPECT_EQ(weftSend(in.data(), 8, weftFloat32, 0, h, nullptr), weftInvalidArgument);  // alone
  EXPECT_EQ(weftRecv(out.data(), 8, weftFloat32, 5, h, nullptr), weftInvalidArgument);
  EXPECT_EQ(weftAllGather(in.data(), out.data(), SIZE_MAX / 2, weftFloat32, h, nullptr),
            weftInvalidArgument);
  EXPECT_NE(std::string(weftGetLastError()).find("larger than the largest possible"),
            std::string::npos);
  int dummy = 0;
  EXPECT_EQ(weftAllReduce(in.data(), out.data(), 8, weftFloat32, weftSum, h, &dummy),
            weftInvalidUsage);
  EXPECT_EQ(weftSend(in.data(), 8, weftFloat32, 1, h, &dummy), weftInvalidUsage);
  EXPECT_NE(std::string(weftGetLastError()).find("a stream was given with host buffers"),
            std::string::npos);
  // Zero elements move nothing, so the stream does not matter (a collective and a send alike).
  EXPECT_EQ(weftAllReduce(in.data(), out.data(), 0, weftFloat32, weftSum, h, &dummy), weftSuccess);
  ASSERT_EQ(weftGroupStart(), weftSuccess);
  EXPECT_EQ(weftSend(in.data(), 0, weftFloat32, 0, h, &dummy), weftSuccess);
  EXPECT_EQ(weftRecv(out.data(), 0, weftFloat32, 0, h, &dummy), weftSuccess);
  EXPECT_EQ(weftGroupEnd(), weftSuccess) << weftGetLastError();
  EXPECT_TRUE(untouched());
  // A destroyed communicator is an error, not a crash.
  weftComm_t stale = nullptr;
  {
    std::vector<Comm> gone = makeComms(1);
    stale = gone[0].handle();
  }
  EXPECT_EQ(weftAllReduce(in.data(), out.data(), 8, weftFloat32, weftSum, stale, nullptr),
            weftInvalidArgument);
  EXPECT_NE(std::string(weftGetLastError()).find("not a live communicator"), std::string::npos);
  EXPECT_TRUE(untouched());
  EXPECT_EQ(weftCommInitAll(nullptr, 2), weftInvalidArgument);
  weftComm_t one = nullptr;
  weftUniqueId id{};
  EXPECT_EQ(weftCommInitRank(&one, 2, id, 2), weftInvalidArgument);
}

TEST(Groups, ARankSendsToItselfInsideAGroup) {
  std::vector<Comm> comms = makeComms(2);
  weftComm_t h = comms[1].handle();
  std::vector<float> in(1000, 2.5f), out(1000, -1.f);
  ASSERT_EQ(weftGroupStart(), weftSuccess);
  ASSERT_EQ(weftSend(in.data(), in.size(), weftFloat32, 1, h, nullptr), weftSuccess);
  ASSERT_EQ(weftRecv(out.data(), out.size(), weftFloat32, 1, h, nullptr), weftSuccess);
  ASSERT_EQ(weftGroupEnd(), weftSuccess) << weftGetLastError();
  EXPECT_EQ(out, in);
  // Alone, or with a receive of another size, it is an error that moves nothing.
  std::fill(out.begin(), out.end(), -1.f);
  EXPECT_EQ(weftSend(in.data(), in.size(), weftFloat32, 1, h, nullptr), weftInvalidArgument);
  ASSERT_EQ(weftGroupStart(), weftSuccess);
  ASSERT_EQ(weftSend(in.data(), in.size(), weftFloat32, 1, h, nullptr), weftSuccess);
  ASSERT_EQ(weftRecv(out.data(), 10, weftFloat32, 1, h, nullptr), weftSuccess);
  EXPECT_EQ(weftGroupEnd(), weftInvalidArgument);
  EXPECT_NE(std::string(weftGetLastError()).find("meets a receive"), std::string::npos);
  EXPECT_EQ(out, std::vector<float>(1000, -1.f));
}

TEST(Arguments, PlanQueryNamesTheTunersPickAndRejectsBadInput) {
  std::vector<Comm> comms = makeComms(2);
  weftComm_t h = comms[0].handle();
  char buf[64];
  for (int c = 0; c < weftNumCollectives; ++c) {
    ASSERT_EQ(
        weftCommPlan(h, static_cast<weftCollective_t>(c), 1 << 20, weftFloat32, buf, sizeof buf),
        weftSuccess)
        << c << ": " << weftGetLastError();
    EXPECT_NE(std::string(buf).find('/'), std::string::npos) << buf;
  }
  setenv("WEFT_ALGO", "ring", 1);
  std::vector<Comm> forced = makeComms(2);
  unsetenv("WEFT_ALGO");
  ASSERT_EQ(weftCommPlan(forced[0].handle(), weftCollAllReduce, 4096, weftFloat32, buf, sizeof buf),
            weftSuccess);
  EXPECT_EQ(std::string(buf).rfind("ring/", 0), 0u) << buf;
  char tiny[3] = {'x', 'x', 'x'};
  ASSERT_EQ(weftCommPlan(h, weftCollAllReduce, 8, weftFloat32, tiny, sizeof tiny), weftSuccess);
  EXPECT_EQ(tiny[2], '\0');
  EXPECT_EQ(weftCommPlan(h, weftNumCollectives, 8, weftFloat32, buf, sizeof buf),
            weftInvalidArgument);
  EXPECT_EQ(weftCommPlan(h, weftCollAllReduce, 8, weftNumDataTypes, buf, sizeof buf),
            weftInvalidArgument);
  EXPECT_EQ(weftCommPlan(h, weftCollAllReduce, 8, weftFloat32, nullptr, 4), weftInvalidArgument);
  // GPU buffers' plans come from the GPU tuner, asked without setting up any GPU transport; a
  // forced algorithm binds it as well.
  for (int c : {weftCollAllReduce, weftCollAllGather, weftCollReduceScatter, weftCollAllToAll}) {
    ASSERT_EQ(weftCommPlanMemory(h, static_cast<weftCollective_t>(c), 1 << 20, weftFloat32,
                                 weftGpuMemory, buf, sizeof buf),
              weftSuccess)
        << c << ": " << weftGetLastError();
    EXPECT_NE(std::string(buf).find('/'), std::string::npos) << buf;
  }
  ASSERT_EQ(weftCommPlanMemory(forced[0].handle(), weftCollAllReduce, 1 << 24, weftFloat32,
                               weftGpuMemory, buf, sizeof buf),
            weftSuccess);
  EXPECT_EQ(std::string(buf).rfind("ring/", 0), 0u) << buf;
  EXPECT_EQ(weftCommPlanMemory(h, weftCollAllReduce, 8, weftFloat32, static_cast<weftMemory_t>(7),
                               buf, sizeof buf),
            weftInvalidArgument);
  EXPECT_EQ(
      weftCommPlanMemory(h, weftCollAllToAllv, 8, weftFloat32, weftGpuMemory, buf, sizeof buf),
      weftUnsupported);
  EXPECT_EQ(comms[0].device(), -1);
}

// weftHostAlloc / weftHostFree: bad input is an error that changes nothing; memory comes zeroed
// and page-aligned; a pointer frees once; ranks that are threads of one process use it as any
// host memory.
TEST(Arguments, HostAllocAndFreeCheckTheirInput) {
  void* p = reinterpret_cast<void*>(0x1);
  EXPECT_EQ(weftHostAlloc(nullptr, 64), weftInvalidArgument);
  EXPECT_NE(std::string(weftGetLastError()).find("NULL"), std::string::npos) << weftGetLastError();
  EXPECT_EQ(weftHostAlloc(&p, 0), weftInvalidArgument);
  EXPECT_EQ(p, reinterpret_cast<void*>(0x1));
  float onStack = 0;
  EXPECT_EQ(weftHostFree(&onStack), weftInvalidArgument);
  EXPECT_NE(std::string(weftGetLastError()).find("weftHostFree"), std::string::npos);
  EXPECT_EQ(weftHostFree(nullptr), weftSuccess);  // as free(NULL)
  ASSERT_EQ(weftHostAlloc(&p, 10000), weftSuccess);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 4096, 0u);
  const auto* bytes = static_cast<const unsigned char*>(p);
  EXPECT_TRUE(std::all_of(bytes, bytes + 10000, [](unsigned char b) { return b == 0; }));
  EXPECT_EQ(weftHostFree(static_cast<char*>(p) + 64), weftInvalidArgument);  // not its start
  // Two ranks as threads, buffers in it: an all-reduce as on any memory.
  std::vector<Comm> comms = makeComms(2);
  auto* f = static_cast<float*>(p);
  for (int i = 0; i < 1024; ++i) f[i] = 1.f, f[1024 + i] = 2.f;
  onEveryRank(2, [&](int r) {
    EXPECT_TRUE(comms[r].allReduce(f + 1024 * r, f + 512 * 4 + 256 * r, 256, RedOp::sum).isOk());
  });
  EXPECT_EQ(f[2048], 3.f);
  EXPECT_EQ(f[2048 + 256 + 255], 3.f);
  EXPECT_EQ(weftHostFree(p), weftSuccess);
  EXPECT_EQ(weftHostFree(p), weftInvalidArgument);  // once
  auto q = hostAlloc(1);
  ASSERT_TRUE(q.isOk());
  EXPECT_TRUE(hostFree(*q).isOk());
}

// weftCommRegister / weftCommDeregister without a GPU: bad input is an error that changes
// nothing; a handle deregisters once; host calls on registered memory run as ever; a
// communicator destroyed with registrations left frees them (the sanitizer run would see a leak).
TEST(Arguments, RegisterAndDeregisterCheckTheirInput) {
  std::vector<Comm> comms = makeComms(2);
  weftComm_t h = comms[0].handle();
  std::vector<float> buf(1024, 1.0f);
  void* handle = nullptr;
  EXPECT_EQ(weftCommRegister(h, nullptr, 64, &handle), weftInvalidArgument);
  EXPECT_NE(std::string(weftGetLastError()).find("NULL"), std::string::npos) << weftGetLastError();
  EXPECT_EQ(weftCommRegister(h, buf.data(), 0, &handle), weftInvalidArgument);
  EXPECT_EQ(weftCommRegister(h, buf.data(), 64, nullptr), weftInvalidArgument);
  EXPECT_EQ(handle, nullptr);
  EXPECT_EQ(weftCommDeregister(h, buf.data()), weftInvalidArgument);
  EXPECT_NE(std::string(weftGetLastError()).find("weftCommDeregister"), std::string::npos);
  auto a = comms[0].registerBuffer(buf.data(), buf.size() * sizeof(float));
  auto b = comms[0].registerBuffer(buf.data() + 512, 64);
  ASSERT_TRUE(a.isOk() && b.isOk());
  EXPECT_NE(*a, *b);
  EXPECT_EQ(weftCommDeregister(comms[1].handle(), *a), weftInvalidArgument);  // another comm's
  EXPECT_TRUE(comms[0].deregisterBuffer(*a).isOk());
  EXPECT_FALSE(comms[0].deregisterBuffer(*a).isOk());
  // Host buffers inside a registration: the call runs as any host call.
  std::vector<std::vector<float>> in(2, std::vector<float>(256)), out(2, std::vector<float>(256));
  for (int r = 0; r < 2; ++r) std::fill(in[r].begin(), in[r].end(), float(r + 1));
  auto c = comms[1].registerBuffer(in[1].data(), 256 * sizeof(float));
  ASSERT_TRUE(c.isOk());
  onEveryRank(2, [&](int r) {
    EXPECT_TRUE(comms[r].allReduce(in[r].data(), out[r].data(), 256, RedOp::sum).isOk());
  });
  for (int r = 0; r < 2; ++r) EXPECT_EQ(out[r][255], 3.0f);
  // b and c are left registered: destroying the communicators frees them.
}

TEST(Arguments, BadEnvironmentIsAnErrorNamingTheVariable) {
  for (const auto& [var, value] :
       std::vector<std::pair<const char*, const char*>>{{"WEFT_TIMEOUT_S", "soon"},
                                                        {"WEFT_MAX_CHANNELS", "1"},
                                                        {"WEFT_TRANSPORT", "verbs"},
                                                        {"WEFT_GPU_REGISTERED", "2"},
                                                        {"WEFT_GPU_DIRECT", "65"},
                                                        {"WEFT_GPU_DIRECT", "many"},
                                                        {"WEFT_GPU_LL_DIRECT_BYTES", "262145"},
                                                        {"WEFT_GPU_DIRECT_BLOCK_BYTES", "100"},
                                                        {"WEFT_GPU_LL_BLOCK_BYTES", "0"},
                                                        {"WEFT_GPU_LL_BLOCKS", "0"},
                                                        {"WEFT_GPU_LL_BLOCKS", "129"},
                                                        {"WEFT_HOST_CHANNEL_THREADS", "2"},
                                                        {"WEFT_GPU_PDL", "2"},
                                                        {"WEFT_HOST_DIRECT", "yes"},
                                                        {"WEFT_HOST_DIRECT_BYTES", "-1"},
                                                        {"WEFT_HOST_SMALL_BYTES", "8193"},
                                                        {"WEFT_HOST_STAGE_BYTES", "4096"},
                                                        {"WEFT_HOST_DIRECT_THREADS", "0"},
                                                        {"WEFT_ALGO", "nosuchalgo"}}) {
    setenv(var, value, 1);
    weftComm_t comms[2] = {nullptr, nullptr};
    EXPECT_EQ(weftCommInitAll(comms, 2), weftInvalidArgument) << var;
    EXPECT_NE(std::string(weftGetLastError()).find(var), std::string::npos)
        << var << ": " << weftGetLastError();
    if (std::string(var) == "WEFT_MAX_CHANNELS") {  // the range, as people write it
      EXPECT_NE(std::string(weftGetLastError()).find("from 2 to 16"), std::string::npos)
          << weftGetLastError();
    }
    EXPECT_EQ(comms[0], nullptr);
    unsetenv(var);
  }
}

TEST(Faults, AbortFromAnotherThreadUnblocksACollective) {
  std::vector<Comm> comms = makeComms(2);
  std::vector<float> in(1024, 1.f), out(1024);
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_TRUE(comms[1].abort().isOk());
  });
  // Rank 1 never joins: rank 0 is stuck until the abort.
  const auto start = std::chrono::steady_clock::now();
  const Status s = comms[0].allReduce(in.data(), out.data(), in.size(), DataType::f32, RedOp::sum);
  aborter.join();
  EXPECT_EQ(s.code(), Code::remoteError) << s.toString();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  // Later calls say the communicator is unusable.
  EXPECT_EQ(comms[0].allReduce(in.data(), out.data(), 1, DataType::f32, RedOp::sum).code(),
            Code::invalidUsage);
}

TEST(Faults, AStuckPeerTimesOut) {
  setenv("WEFT_TIMEOUT_S", "0.5", 1);
  std::vector<Comm> comms = makeComms(2);
  unsetenv("WEFT_TIMEOUT_S");
  std::vector<float> in(16, 1.f), out(16);
  const auto start = std::chrono::steady_clock::now();
  const Status s = comms[0].allReduce(in.data(), out.data(), in.size(), DataType::f32, RedOp::sum);
  EXPECT_EQ(s.code(), Code::timeout) << s.toString();
  EXPECT_NE(s.message().find("rank 1"), std::string::npos) << s.message();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

}  // namespace
}  // namespace weft::test
