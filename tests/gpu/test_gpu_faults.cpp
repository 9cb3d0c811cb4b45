// GPU calls that fail: a peer that never calls times out with an error on the waiting rank and
// then on every rank; abort() ends a stuck kernel; bad input is refused and changes nothing;
// communicators give all their device memory back. Skipped without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "tests/gpu/gpu_harness.hpp"
#include "tests/runtime/harness.hpp"

namespace weft::test {
namespace {

// A rank whose peer never calls: its kernel gives up after WEFT_TIMEOUT_S and says so, and the
// peer's next call fails too (the failing kernel aborted every rank).
TEST(GpuFaults, APeerThatNeverCallsTimesOut) {
  SKIP_WITHOUT_GPU();
  ScopedEnv timeout("WEFT_TIMEOUT_S", "1");
  std::vector<Comm> comms = threadRanks(2);
  ASSERT_EQ(comms.size(), 2u);
  Streams streams(2);
  float *a = nullptr, *b = nullptr;
  ASSERT_EQ(cudaMalloc(&a, 4096), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&b, 4096), cudaSuccess);
  onEveryRank(2, [&](int r) {
    EXPECT_TRUE(comms[static_cast<std::size_t>(r)]
                    .allReduce(r == 0 ? a : b, r == 0 ? a : b, 1024, RedOp::sum, streams[r])
                    .isOk());
    EXPECT_EQ(cudaStreamSynchronize(streams[r]), cudaSuccess);
  });
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(comms[0].allReduce(a, a, 1024, RedOp::sum, streams[0]).isOk());
  ASSERT_EQ(cudaStreamSynchronize(streams[0]), cudaSuccess);
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const Status e0 = comms[0].asyncError();
  EXPECT_EQ(e0.code(), Code::timeout) << e0.toString();
  EXPECT_NE(e0.message().find("waiting for rank 1"), std::string::npos) << e0.toString();
  EXPECT_LT(waited, 10.0);
  // The survivor's next call stops at once with the abort.
  EXPECT_TRUE(comms[1].allReduce(b, b, 1024, RedOp::sum, streams[1]).isOk());
  ASSERT_EQ(cudaStreamSynchronize(streams[1]), cudaSuccess);
  EXPECT_EQ(comms[1].asyncError().code(), Code::remoteError) << comms[1].asyncError().toString();
  EXPECT_FALSE(comms[0].allReduce(a, a, 1024, RedOp::sum, streams[0]).isOk());
  (void)cudaFree(a);
  (void)cudaFree(b);
}

// abort() from another thread ends a kernel stuck waiting for a peer.
TEST(GpuFaults, AbortEndsAStuckKernel) {
  SKIP_WITHOUT_GPU();
  std::vector<Comm> comms = threadRanks(2);
  ASSERT_EQ(comms.size(), 2u);
  Streams streams(2);
  float* a = nullptr;
  float* b = nullptr;
  ASSERT_EQ(cudaMalloc(&a, 4 << 20), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&b, 4 << 20), cudaSuccess);
  onEveryRank(2, [&](int r) {
    EXPECT_TRUE(comms[static_cast<std::size_t>(r)]
                    .allReduce(r == 0 ? a : b, r == 0 ? a : b, 1 << 20, RedOp::sum, streams[r])
                    .isOk());
    EXPECT_EQ(cudaStreamSynchronize(streams[r]), cudaSuccess);
  });
  ASSERT_TRUE(comms[0].allReduce(a, a, 1 << 20, RedOp::sum, streams[0]).isOk());
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_TRUE(comms[0].abort().isOk());
  });
  const auto start = std::chrono::steady_clock::now();
  ASSERT_EQ(cudaStreamSynchronize(streams[0]), cudaSuccess);
  aborter.join();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 20.0);
  EXPECT_EQ(comms[0].asyncError().code(), Code::remoteError) << comms[0].asyncError().toString();
  (void)cudaFree(a);
  (void)cudaFree(b);
}

// Bad input is refused and changes nothing.
TEST(GpuFaults, BadInputIsRefusedAndChangesNothing) {
  SKIP_WITHOUT_GPU();
  std::vector<Comm> comms = threadRanks(2);
  ASSERT_EQ(comms.size(), 2u);
  Streams streams(2);
  std::vector<float> host(16, 1.0f), out(16, 5.0f);
  // A stream with host buffers.
  const Status s = comms[0].allReduce(host.data(), out.data(), 16, RedOp::sum, streams[0]);
  EXPECT_EQ(s.code(), Code::invalidUsage) << s.toString();
  EXPECT_EQ(out, std::vector<float>(16, 5.0f));
  // A group mixing GPU and host buffers, and a send of GPU buffers with a host-only call.
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 64), cudaSuccess);
  ASSERT_EQ(weftGroupStart(), weftSuccess);
  ASSERT_EQ(weftSend(d, 16, weftFloat32, 1, comms[0].handle(), streams[0]), weftSuccess);
  ASSERT_EQ(weftRecv(out.data(), 16, weftFloat32, 1, comms[0].handle(), nullptr), weftSuccess);
  EXPECT_EQ(weftGroupEnd(), weftInvalidUsage);
  EXPECT_NE(std::string(weftGetLastError()).find("mixes GPU and host"), std::string::npos)
      << weftGetLastError();
  EXPECT_EQ(out, std::vector<float>(16, 5.0f));
  // An invalid type on GPU buffers.
  EXPECT_EQ(comms[0].allReduce(d, d, 16, static_cast<DataType>(99), RedOp::sum, streams[0]).code(),
            Code::invalidArgument);
  (void)cudaFree(d);
}

// Communicators that used the GPU give all their device memory back.
TEST(GpuFaults, NoDeviceMemoryLeaks) {
  SKIP_WITHOUT_GPU();
  float* buf = nullptr;
  ASSERT_EQ(cudaMalloc(&buf, 1 << 20), cudaSuccess);
  std::size_t before = 0, total = 0, after = 0;
  for (int round = 0; round < 4; ++round) {
    if (round == 1) {
      ASSERT_EQ(cudaMemGetInfo(&before, &total), cudaSuccess);
    }
    std::vector<Comm> comms = threadRanks(4);
    ASSERT_EQ(comms.size(), 4u);
    Streams streams(4);
    onEveryRank(4, [&](int r) {
      float* mine = buf + r * 1024;
      EXPECT_TRUE(comms[static_cast<std::size_t>(r)]
                      .allReduce(mine, mine, 1024, RedOp::sum, streams[r])
                      .isOk());
      EXPECT_EQ(cudaStreamSynchronize(streams[r]), cudaSuccess);
    });
  }
  ASSERT_EQ(cudaMemGetInfo(&after, &total), cudaSuccess);
  EXPECT_LE(before > after ? before - after : 0, std::size_t{4} << 20)
      << "free device memory fell from " << before << " to " << after;
  (void)cudaFree(buf);
}

}  // namespace
}  // namespace weft::test
