// The compressed collectives on GPU memory (weftAllReduceEx, weftReduceScatterEx,
// weftAllGatherEx with compression "always"), ranks as threads sharing the GPU: every rank gets
// the bits the same call on host memory gives (tests/runtime/test_fp8_collectives.cpp holds those
// to the scheme and its error bound), in and out of place, and from a CUDA graph's replays.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tests/gpu/gpu_harness.hpp"
#include "weft/weft.hpp"

namespace weft::test {
namespace {

using Bytes = std::vector<std::byte>;

weftCompression always(const char* scheme) {
  weftCompression w{};
  EXPECT_EQ(weftCompressionParse((std::string(scheme) + ":always").c_str(), &w), weftSuccess);
  return w;
}

// Values of every magnitude a block, as `type`.
Bytes randomValues(DataType type, std::size_t count, std::mt19937& rng) {
  std::normal_distribution<float> normal(0, 1);
  Bytes out(count * sizeOf(type));
  for (std::size_t i = 0; i < count; ++i)
    store(out, i, type, normal(rng) * std::ldexp(1.0f, static_cast<int>(i / 40) % 11 - 5));
  return out;
}

struct Call {
  Collective coll;
  RedOp op;
};

// Elements of a rank's input and output.
std::size_t inputCount(const Call& c, std::size_t count, int n) {
  return c.coll == Collective::reduceScatter ? count * static_cast<std::size_t>(n) : count;
}
std::size_t outputCount(const Call& c, std::size_t count, int n) {
  return c.coll == Collective::allGather ? count * static_cast<std::size_t>(n) : count;
}

weftResult_t callEx(const Call& c, const void* in, void* out, std::size_t count, DataType type,
                    weftComm_t comm, void* stream, const weftCompression& w) {
  const auto t = static_cast<weftDataType_t>(type);
  const auto op = static_cast<weftRedOp_t>(c.op);
  switch (c.coll) {
    case Collective::allReduce:
      return weftAllReduceEx(in, out, count, t, op, comm, stream, &w);
    case Collective::reduceScatter:
      return weftReduceScatterEx(in, out, count, t, op, comm, stream, &w);
    default:
      return weftAllGatherEx(in, out, count, t, comm, stream, &w);
  }
}

class GpuCompressed : public ::testing::TestWithParam<int> {};

TEST_P(GpuCompressed, EveryRankGetsTheHostsBitsInAndOutOfPlace) {
  SKIP_WITHOUT_GPU();
  const int n = GetParam();
  auto comms = threadRanks(n);
  ASSERT_EQ(comms.size(), static_cast<std::size_t>(n));
  Streams streams(n);
  std::mt19937 rng(5 + n);
  const Call calls[] = {{Collective::allReduce, RedOp::sum},
                        {Collective::allReduce, RedOp::avg},
                        {Collective::reduceScatter, RedOp::sum},
                        {Collective::reduceScatter, RedOp::avg},
                        {Collective::allGather, RedOp::sum}};
  for (const char* scheme : {"e4m3:32", "e5m2:128"}) {
    const weftCompression w = always(scheme);
    for (DataType type : {DataType::bf16, DataType::f32}) {
      for (const Call& call : calls) {
        for (bool inPlace : {false, true}) {
          // Shares that are not whole blocks nor whole 16 bytes.
          const std::size_t count = call.coll == Collective::allReduce ? 20000 + 37 : 1000 + 3;
          const std::size_t inCount = inputCount(call, count, n);
          const std::size_t outCount = outputCount(call, count, n);
          const std::size_t size = sizeOf(type);
          std::vector<Bytes> inputs, host(n), gpu(n);
          for (int r = 0; r < n; ++r) inputs.push_back(randomValues(type, inCount, rng));
          RanksMeet ranks(n);
          onEveryRank(n, [&](int r) {
            RanksMeet::Meet done(ranks);
            const auto R = static_cast<std::size_t>(r);
            host[R].assign(outCount * size, std::byte{0xA5});
            EXPECT_EQ(callEx(call, inputs[R].data(), host[R].data(), count, type, comms[R].handle(),
                             nullptr, w),
                      weftSuccess)
                << weftGetLastError();
            // On the GPU: one buffer in place (the input where the call takes it), else two.
            const std::size_t span = std::max(inCount, outCount) * size;
            std::byte* a = nullptr;
            std::byte* b = nullptr;
            EXPECT_EQ(cudaMalloc(&a, span), cudaSuccess);
            EXPECT_EQ(cudaMemset(a, 0xA5, span), cudaSuccess);
            std::byte* in = a;
            std::byte* out = a;
            if (!inPlace) {
              EXPECT_EQ(cudaMalloc(&b, outCount * size), cudaSuccess);
              EXPECT_EQ(cudaMemset(b, 0xA5, outCount * size), cudaSuccess);
              out = b;
            } else if (call.coll == Collective::reduceScatter) {
              out = a + R * count * size;
            } else if (call.coll == Collective::allGather) {
              in = a + R * count * size;
            }
            // cudaMemset may return before it is done; the call's stream does not wait for it.
            EXPECT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
            EXPECT_EQ(cudaMemcpy(in, inputs[R].data(), inCount * size, cudaMemcpyHostToDevice),
                      cudaSuccess);
            EXPECT_EQ(callEx(call, in, out, count, type, comms[R].handle(), streams[r], w),
                      weftSuccess)
                << weftGetLastError();
            EXPECT_EQ(cudaStreamSynchronize(streams[r]), cudaSuccess);
            EXPECT_TRUE(comms[R].asyncError().isOk());
            done.meet();  // before anything that could wait for the whole device
            gpu[R].resize(outCount * size);
            EXPECT_EQ(cudaMemcpy(gpu[R].data(), out, gpu[R].size(), cudaMemcpyDeviceToHost),
                      cudaSuccess);
            EXPECT_EQ(cudaFree(a), cudaSuccess);
            if (b != nullptr) {
              EXPECT_EQ(cudaFree(b), cudaSuccess);
            }
          });
          for (int r = 0; r < n; ++r) {
            const auto R = static_cast<std::size_t>(r);
            ASSERT_EQ(gpu[R], host[R])
                << scheme << " " << name(type) << " " << name(call.coll) << " " << name(call.op)
                << (inPlace ? " in place" : "") << " rank " << r << " of " << n;
            if (call.coll != Collective::reduceScatter) {
              ASSERT_EQ(gpu[R], gpu[0]);
            }
          }
        }
      }
    }
  }
}

TEST_P(GpuCompressed, AllReduceReplaysFromAGraph) {
  SKIP_WITHOUT_GPU();
  const int n = GetParam();
  auto comms = threadRanks(n);
  ASSERT_EQ(comms.size(), static_cast<std::size_t>(n));
  Streams streams(n);
  const weftCompression w = always("e4m3:32");
  const std::size_t count = 1 << 16;
  const std::size_t bytes = count * 2;
  std::vector<std::byte*> in(n), out(n);
  std::vector<cudaGraphExec_t> graphs(n);
  onEveryRank(n, [&](int r) {
    const auto R = static_cast<std::size_t>(r);
    EXPECT_EQ(cudaMalloc(&in[R], bytes), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&out[R], bytes), cudaSuccess);
    EXPECT_EQ(cudaMemset(in[R], 0, bytes), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);  // before the call's stream
    // A size's first call sets up outside the capture.
    EXPECT_EQ(weftAllReduceEx(in[R], out[R], count, weftBfloat16, weftSum, comms[R].handle(),
                              streams[r], &w),
              weftSuccess);
    EXPECT_EQ(cudaStreamSynchronize(streams[r]), cudaSuccess);
    cudaGraph_t graph = nullptr;
    EXPECT_EQ(cudaStreamBeginCapture(streams[r], cudaStreamCaptureModeThreadLocal), cudaSuccess);
    EXPECT_EQ(weftAllReduceEx(in[R], out[R], count, weftBfloat16, weftSum, comms[R].handle(),
                              streams[r], &w),
              weftSuccess)
        << weftGetLastError();
    EXPECT_EQ(cudaStreamEndCapture(streams[r], &graph), cudaSuccess);
    EXPECT_EQ(cudaGraphInstantiate(&graphs[R], graph, 0), cudaSuccess);
    (void)cudaGraphDestroy(graph);
  });
  std::mt19937 rng(11);
  for (int replay = 0; replay < 3; ++replay) {
    std::vector<Bytes> inputs, host(n), gpu(n);
    for (int r = 0; r < n; ++r) inputs.push_back(randomValues(DataType::bf16, count, rng));
    onEveryRank(n, [&](int r) {
      const auto R = static_cast<std::size_t>(r);
      host[R].assign(bytes, std::byte{0xA5});
      EXPECT_EQ(weftAllReduceEx(inputs[R].data(), host[R].data(), count, weftBfloat16, weftSum,
                                comms[R].handle(), nullptr, &w),
                weftSuccess);
      EXPECT_EQ(cudaMemcpyAsync(in[R], inputs[R].data(), bytes, cudaMemcpyHostToDevice, streams[r]),
                cudaSuccess);
      EXPECT_EQ(cudaMemsetAsync(out[R], 0xA5, bytes, streams[r]), cudaSuccess);
      EXPECT_EQ(cudaGraphLaunch(graphs[R], streams[r]), cudaSuccess);
      gpu[R].resize(bytes);
      EXPECT_EQ(cudaMemcpyAsync(gpu[R].data(), out[R], bytes, cudaMemcpyDeviceToHost, streams[r]),
                cudaSuccess);
      EXPECT_EQ(cudaStreamSynchronize(streams[r]), cudaSuccess);
    });
    for (int r = 0; r < n; ++r)
      ASSERT_EQ(gpu[static_cast<std::size_t>(r)], host[static_cast<std::size_t>(r)])
          << "replay " << replay << " rank " << r;
  }
  for (int r = 0; r < n; ++r) {
    const auto R = static_cast<std::size_t>(r);
    (void)cudaGraphExecDestroy(graphs[R]);
    EXPECT_EQ(cudaFree(in[R]), cudaSuccess);
    EXPECT_EQ(cudaFree(out[R]), cudaSuccess);
  }
}

std::string ranksName(const ::testing::TestParamInfo<int>& p) {
  return std::to_string(p.param) + "ranks";
}
INSTANTIATE_TEST_SUITE_P(Ranks, GpuCompressed, ::testing::Values(1, 2, 4), ranksName);

}  // namespace
}  // namespace weft::test
