// Call signatures (WEFT_CHECK_CALLS, on by default): ranks that make one collective call
// differently (count, dtype, op, collective, root) all get an error naming both calls, within a
// second, instead of success with wrong data or a wait for the timeout.
#include <gtest/gtest.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "tests/runtime/fork.hpp"
#include "weft/weft.h"

namespace {

struct Call {
  weftCollective_t coll = weftCollAllReduce;
  weftDataType_t type = weftFloat32;
  size_t count = 100;
  weftRedOp_t op = weftSum;
  int root = 0;
};

// Buffers for either call of a case, made before the timed call (large ones take a while under
// the sanitizers).
struct Buffers {
  std::vector<unsigned char> in, out;
  Buffers(const Call& a, const Call& b, int n) {
    const size_t bytes = std::max(a.count * weftTypeSize(a.type), b.count * weftTypeSize(b.type)) *
                         static_cast<size_t>(n);
    in.assign(bytes, 1);
    out.assign(bytes, 0);
  }
};

weftResult_t make(const Call& c, weftComm_t comm, int rank, Buffers& buffers) {
  std::vector<unsigned char>& in = buffers.in;
  std::vector<unsigned char>& out = buffers.out;
  switch (c.coll) {
    case weftCollAllReduce:
      return weftAllReduce(in.data(), out.data(), c.count, c.type, c.op, comm, nullptr);
    case weftCollBroadcast:
      return weftBroadcast(in.data(), out.data(), c.count, c.type, c.root, comm, nullptr);
    case weftCollReduce:
      return weftReduce(in.data(), out.data(), c.count, c.type, c.op, c.root, comm, nullptr);
    case weftCollAllGather:
      return weftAllGather(in.data(), out.data(), c.count, c.type, comm, nullptr);
    default:
      (void)rank;
      return weftInternalError;
  }
}

// Over UCX (WEFT_TRANSPORT=ucx) a receiver compares the 32-bit signature in each message's tag:
// the rank that sees another call's message names its own call and the other's signature, and
// the other ranks learn of it through the abort (or see it themselves). A rank that only sent (a
// broadcast's root) sees it at its next call, in the stale message it then receives.
bool overUcx() {
  const char* t = std::getenv("WEFT_TRANSPORT");
  return t != nullptr && std::string(t) == "ucx";
}
bool blamesTheCalls(const std::string& message) {
  return message.find("WEFT_CHECK_CALLS") != std::string::npos &&
         message.find("another call") != std::string::npos;
}

struct Case {
  const char* what;
  Call everyone, odd;  // rank 1 makes `odd`
  const char* mine;    // how the calls are named
  const char* theirs;
};

class CallCheck : public ::testing::TestWithParam<int> {};

TEST_P(CallCheck, AMismatchedCallIsAnErrorOnEveryRankNamingBothCalls) {
  const int n = GetParam();
  const Case cases[] = {
      {"count",
       {},
       {weftCollAllReduce, weftFloat32, 200},
       "allreduce(f32, 100, sum)",
       "allreduce(f32, 200, sum)"},
      {"count, 10k",
       {weftCollAllReduce, weftFloat32, 10000},
       {weftCollAllReduce, weftFloat32, 20000},
       "allreduce(f32, 10000, sum)",
       "allreduce(f32, 20000, sum)"},
      {"count, 100k",
       {weftCollAllReduce, weftFloat32, 100000},
       {weftCollAllReduce, weftFloat32, 200000},
       "allreduce(f32, 100000, sum)",
       "allreduce(f32, 200000, sum)"},
      {"dtype",
       {},
       {weftCollAllReduce, weftFloat64, 100},
       "allreduce(f32, 100, sum)",
       "allreduce(f64, 100, sum)"},
      {"op",
       {},
       {weftCollAllReduce, weftFloat32, 100, weftProd},
       "allreduce(f32, 100, sum)",
       "allreduce(f32, 100, prod)"},
      {"collective",
       {},
       {weftCollBroadcast, weftFloat32, 100},
       "allreduce(f32, 100, sum)",
       "broadcast(f32, 100, root 0)"},
      {"root",
       {weftCollBroadcast, weftFloat32, 100},
       {weftCollBroadcast, weftFloat32, 100, weftSum, 1},
       "broadcast(f32, 100, root 0)",
       "broadcast(f32, 100, root 1)"},
      {"reduce's root, 1M",
       {weftCollReduce, weftFloat32, 1 << 20},
       {weftCollReduce, weftFloat32, 1 << 20, weftSum, 1},
       "reduce(f32, 1048576, sum, root 0)",
       "reduce(f32, 1048576, sum, root 1)"},
  };
  for (const Case& c : cases) {
    // Over UCX a mismatch is seen in a message: ranks that each believe themselves the root of a
    // reduce only wait to receive, and end at the timeout (docs/security.md).
    if (overUcx() && std::string(c.what).rfind("reduce's root", 0) == 0) continue;
    std::vector<weftComm_t> comms(static_cast<size_t>(n), nullptr);
    ASSERT_EQ(weftCommInitAll(comms.data(), n), weftSuccess) << weftGetLastError();
    // A good call first: the mismatch is the second call of each rank.
    std::vector<weftResult_t> good(static_cast<size_t>(n)), bad(static_cast<size_t>(n));
    std::vector<std::string> messages(static_cast<size_t>(n));
    std::vector<double> seconds(static_cast<size_t>(n));
    std::vector<std::thread> threads;
    std::barrier<> allGood(n);
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        const auto R = static_cast<size_t>(r);
        Buffers buffers(c.everyone, c.odd, n);
        good[R] = make(c.everyone, comms[R], r, buffers);
        // No rank's mismatch may abort the communicator before every rank is done with its good
        // call (over UCX a rank forwarding a broadcast finishes before the ranks downstream, and
        // leaves weft's barrier before the others have): the threads wait for each other here.
        if (good[R] == weftSuccess) good[R] = weftBarrier(comms[R], nullptr);
        allGood.arrive_and_wait();
        const auto start = std::chrono::steady_clock::now();
        bad[R] = make(r == 1 ? c.odd : c.everyone, comms[R], r, buffers);
        // Over UCX a rank that only sent (a broadcast's root) learns of it by its next call.
        if (overUcx() && bad[R] == weftSuccess) bad[R] = weftBarrier(comms[R], nullptr);
        seconds[R] =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        messages[R] = weftGetLastError();
      });
    }
    for (std::thread& t : threads) t.join();
    for (int r = 0; r < n; ++r) {
      const auto R = static_cast<size_t>(r);
      EXPECT_EQ(good[R], weftSuccess) << c.what << ", rank " << r << ": " << messages[R];
      EXPECT_NE(bad[R], weftSuccess) << c.what << ", rank " << r << " got success";
      // Over UCX the rank that aborts first waits up to a second for its notice to leave
      // (UcxTransport::notifyAbort), for peers that no longer progress their control worker.
      EXPECT_LT(seconds[R], overUcx() ? 2.0 : 1.0) << c.what << ", rank " << r;
      if (overUcx()) {
        EXPECT_TRUE(blamesTheCalls(messages[R])) << c.what << ", rank " << r << ": " << messages[R];
        continue;
      }
      EXPECT_NE(messages[R].find(c.mine), std::string::npos)
          << c.what << ", rank " << r << ": " << messages[R];
      EXPECT_NE(messages[R].find(c.theirs), std::string::npos)
          << c.what << ", rank " << r << ": " << messages[R];
    }
    for (weftComm_t comm : comms) EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
  }
}

// Sends and receives (and all-to-all-v's) of different sizes: the receiver's call fails before
// anything moves, naming both sizes, and the communicator is aborted, so the sender's call, or
// at the latest its next one, fails too. 2 ranks as threads; small, and large enough that the
// receiver reads the sender's buffer in place.
TEST(CallCheckPointToPoint, ASendAndAReceiveOfDifferentSizesAreAnError) {
  struct P2p {
    const char* what;
    size_t sent, received;  // floats
    bool alltoallv;
  };
  const P2p cases[] = {{"send/recv", 100, 200, false},
                       {"send/recv, 400 KB", 100000, 200000, false},
                       {"all-to-all-v", 10, 20, true}};
  for (const P2p& c : cases) {
    std::vector<weftComm_t> comms(2, nullptr);
    ASSERT_EQ(weftCommInitAll(comms.data(), 2), weftSuccess) << weftGetLastError();
    std::vector<weftResult_t> first(2), second(2);
    std::vector<std::string> messages(2);
    std::vector<double> seconds(2);
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        const auto R = static_cast<size_t>(r);
        std::vector<float> buf(2 * c.received + 16, 1.0f);
        const auto start = std::chrono::steady_clock::now();
        if (c.alltoallv) {
          // Rank 0 sends rank 1 `sent` floats; rank 1 expects `received` from rank 0.
          size_t sc[2] = {0, 0}, sd[2] = {0, 0}, rc[2] = {0, 0}, rd[2] = {0, c.received};
          if (r == 0) sc[1] = c.sent;
          if (r == 1) rc[0] = c.received;
          first[R] = weftAllToAllv(buf.data(), sc, sd, buf.data() + c.received + 8, rc, rd,
                                   weftFloat32, comms[R], nullptr);
        } else if (r == 0) {
          first[R] = weftSend(buf.data(), c.sent, weftFloat32, 1, comms[R], nullptr);
        } else {
          first[R] = weftRecv(buf.data(), c.received, weftFloat32, 0, comms[R], nullptr);
        }
        messages[R] = weftGetLastError();
        second[R] = first[R] == weftSuccess ? weftBarrier(comms[R], nullptr) : first[R];
        if (first[R] == weftSuccess) messages[R] = weftGetLastError();
        seconds[R] =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      });
    }
    for (std::thread& t : threads) t.join();
    const std::string named = "is " + std::to_string(c.sent * 4) + " bytes but rank 1 receives " +
                              std::to_string(c.received * 4);
    EXPECT_NE(first[1], weftSuccess) << c.what << ": the receiver got success";
    // Over UCX each message's size is compared on arrival: the receive's size is named.
    const std::string arrival =
        "receive from rank 0 of " + std::to_string(c.received * 4) + " bytes met a send";
    for (size_t r = 0; r < 2; ++r) {
      EXPECT_NE(second[r], weftSuccess)
          << c.what << ", rank " << r << ": no error by its next call";
      EXPECT_LT(seconds[r], 1.0) << c.what << ", rank " << r;
      EXPECT_NE(messages[r].find(overUcx() ? arrival : named), std::string::npos)
          << c.what << ", rank " << r << ": " << messages[r];
    }
    for (weftComm_t comm : comms) EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
  }
}

// The same between processes (inboxes mapped through /proc): a count and a root mismatch, each
// an error on both ranks within a second, with both calls named.
TEST(CallCheckProcesses, AMismatchedCallIsAnErrorOnEveryProcess) {
  WEFT_SKIP_UNDER_TSAN();
  struct Mismatch {
    const char* what;
    std::function<weft::Status(int, weft::Comm&, std::vector<float>&)> call;
    const char* named;
  };
  const Mismatch cases[] = {
      {"count",
       [](int r, weft::Comm& c, std::vector<float>& b) {
         return c.allReduce(b.data(), b.data(), r == 0 ? 1000 : 2000, weft::DataType::f32,
                            weft::RedOp::sum);
       },
       "allreduce(f32, 2000, sum)"},
      {"root",
       [](int r, weft::Comm& c, std::vector<float>& b) {
         return c.broadcast(b.data(), b.data(), 1000, weft::DataType::f32, r);
       },
       "broadcast(f32, 1000, root 1)"},
  };
  for (const Mismatch& m : cases) {
    const std::vector<int> codes = weft::test::forkRanks(2, [&](int r, weft::Comm& comm) {
      std::vector<float> buf(4096, 1.0f);
      const auto start = std::chrono::steady_clock::now();
      weft::Status s = m.call(r, comm, buf);
      if (overUcx() && s.isOk()) s = comm.barrier();  // a root learns of it by its next call
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (s.isOk()) return 1;
      if (seconds > (overUcx() ? 2.0 : 1.0)) return 2;  // (see the threads' test)
      const bool named =
          overUcx() ? blamesTheCalls(s.message()) : s.message().find(m.named) != std::string::npos;
      if (!named) {
        std::fprintf(stderr, "rank %d: %s\n", r, s.message().c_str());
        return 3;
      }
      return 0;
    });
    for (std::size_t r = 0; r < codes.size(); ++r)
      EXPECT_EQ(codes[r], 0) << m.what << ", rank " << r << " (1 success, 2 slow, 3 unnamed)";
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, CallCheck, ::testing::Values(2, 3, 4),
                         [](const auto& p) { return std::to_string(p.param) + "ranks"; });

}  // namespace
