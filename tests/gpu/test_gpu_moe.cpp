// MoE dispatch and combine on GPU memory (weftMoeDispatch/weftMoeCombine with device buffers)
// against the host path on the same communicator (the reference, itself checked against the
// routing in test_moe_api.cpp and test_moe_host.cpp), bit for bit: recv_x, the expert counts,
// the sources and combine's output; routings uniform, all to one expert, all dropped, top-1 to
// top-8, bf16 and f32, fp8 dispatch (recv_x's e4m3 bytes and recv_scales); ranks as threads
// (1-4) and as processes (2, 4); a CUDA graph of dispatch and combine replayed with different
// routings; rows over the capacity, an error.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tests/gpu/gpu_harness.hpp"
#include "tests/runtime/fork.hpp"
#include "weft/weft.hpp"

namespace weft::test {
namespace {

enum class Routing { uniform, oneExpert, dropped };

struct Case {
  int n, experts, topk;
  std::size_t tokens, hidden;
  weftDataType_t type;
  Routing routing;
  bool fp8 = false;  // e4m3 with a scale per 128 values: hidden a multiple of 128
};

std::size_t sizeOfType(weftDataType_t t) {
  return t == weftFloat32 ? 4 : 2;
}

// Rank r's inputs for round `round`: values, routing (distinct experts, a slot dropped now and
// then) and weights.
struct Inputs {
  std::vector<std::byte> x;
  std::vector<std::int64_t> idx;
  std::vector<float> w;
  Inputs(const Case& c, int r, int round) {
    std::mt19937 rng(static_cast<unsigned>(1000 * round + 31 * r + c.topk));
    std::normal_distribution<float> normal(0, 1);
    std::uniform_real_distribution<float> weight(0.1f, 1);
    const std::size_t values = c.tokens * c.hidden;
    x.resize(values * sizeOfType(c.type));
    for (std::size_t i = 0; i < values; ++i) {
      const float v = normal(rng);
      if (c.type == weftFloat32) {
        std::memcpy(x.data() + 4 * i, &v, 4);
      } else {
        std::uint32_t bits;
        std::memcpy(&bits, &v, 4);
        const auto b = static_cast<std::uint16_t>(bits >> 16);
        std::memcpy(x.data() + 2 * i, &b, 2);
      }
    }
    std::vector<std::int64_t> all(static_cast<std::size_t>(c.experts));
    for (std::size_t t = 0; t < c.tokens; ++t) {
      for (int e = 0; e < c.experts; ++e) all[static_cast<std::size_t>(e)] = e;
      std::shuffle(all.begin(), all.end(), rng);
      for (int j = 0; j < c.topk; ++j) {
        idx.push_back(c.routing == Routing::dropped               ? -1
                      : c.routing == Routing::oneExpert && j == 0 ? 0
                      : c.routing == Routing::oneExpert           ? -1
                      : (t % 7 == 3 && j == c.topk - 1)           ? -1
                                                        : all[static_cast<std::size_t>(j)]);
        w.push_back(weight(rng));
      }
    }
  }
};

struct Device {
  void* p = nullptr;
  std::size_t bytes = 0;
  Device(std::size_t b, cudaStream_t s) : bytes(b) {
    EXPECT_EQ(cudaMallocAsync(&p, std::max<std::size_t>(b, 16), s), cudaSuccess);
    EXPECT_EQ(cudaMemsetAsync(p, 0xA5, std::max<std::size_t>(b, 16), s), cudaSuccess);  // poison
  }
  template <typename T>
  void put(const std::vector<T>& host, cudaStream_t s) {
    EXPECT_EQ(cudaMemcpyAsync(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice, s),
              cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  }
  template <typename T>
  std::vector<T> get(std::size_t count, cudaStream_t s) const {
    std::vector<T> host(count);
    EXPECT_EQ(cudaMemcpyAsync(host.data(), p, count * sizeof(T), cudaMemcpyDeviceToHost, s),
              cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    return host;
  }
};

// A dispatch of `c`'s shape on the device buffers.
weftMoeDispatchArgs argsOn(const Case& c, const Device& x, const Device& idx, const Device& w,
                           const Device& recv, std::size_t capacity, const Device& counts,
                           void* source) {
  weftMoeDispatchArgs a{};
  a.x = x.p, a.topkIdx = static_cast<const std::int64_t*>(idx.p);
  a.topkWeights = static_cast<const float*>(w.p);
  a.tokens = c.tokens, a.hidden = c.hidden, a.topk = c.topk, a.experts = c.experts;
  a.datatype = c.type, a.recvX = recv.p, a.capacity = capacity;
  a.expertCounts = static_cast<std::int32_t*>(counts.p);
  a.recvSource = static_cast<std::int32_t*>(source);
  return a;
}

// Expert outputs from recv_x: each row scaled by (its local expert + 1), computed on the host
// (bf16 rows as bf16 bits, so the same input feeds both paths).
std::vector<std::byte> expertOutputs(const Case& c, const std::vector<std::byte>& recv,
                                     const std::vector<std::int32_t>& counts) {
  const std::size_t es = sizeOfType(c.type);
  std::vector<std::byte> y(recv.size());
  std::size_t row = 0;
  for (std::size_t e = 0; e < counts.size(); ++e) {
    for (std::int32_t i = 0; i < counts[e]; ++i, ++row) {
      for (std::size_t h = 0; h < c.hidden; ++h) {
        const std::size_t at = (row * c.hidden + h) * es;
        float v;
        if (es == 4) {
          std::memcpy(&v, recv.data() + at, 4);
        } else {
          std::uint16_t b;
          std::memcpy(&b, recv.data() + at, 2);
          const std::uint32_t bits = static_cast<std::uint32_t>(b) << 16;
          std::memcpy(&v, &bits, 4);
        }
        v *= static_cast<float>(e + 1);
        if (es == 4) {
          std::memcpy(y.data() + at, &v, 4);
        } else {
          std::uint32_t bits;
          std::memcpy(&bits, &v, 4);
          const auto b = static_cast<std::uint16_t>(bits >> 16);  // truncated: any value will do
          std::memcpy(y.data() + at, &b, 2);
        }
      }
    }
  }
  return y;
}

// fp8 dispatch's expert outputs ([rows, hidden] of the values' type): a pattern of the row and
// column, fed to both paths alike.
std::vector<std::byte> patternOutputs(const Case& c, std::size_t rows) {
  const std::size_t es = sizeOfType(c.type);
  std::vector<std::byte> y(rows * c.hidden * es);
  for (std::size_t i = 0; i < rows * c.hidden; ++i) {
    const float v = static_cast<float>(static_cast<int>((i * 37) % 29) - 14) * 0.0625f;
    std::uint32_t bits;
    std::memcpy(&bits, &v, 4);
    const auto b = static_cast<std::uint16_t>(bits >> 16);
    if (es == 4) {
      std::memcpy(y.data() + 4 * i, &v, 4);
    } else {
      std::memcpy(y.data() + 2 * i, &b, 2);
    }
  }
  return y;
}

// One rank's rounds: the host path and the GPU path on the same inputs, compared bit for bit.
// Returns the mismatches (0: all equal); `graph`: the GPU calls captured once, replayed per round.
// `split`: each call in its halves, with other work on the stream between them.
int runRank(const Case& c, int r, Comm& comm, cudaStream_t stream, int rounds, bool graph,
            bool split = false) {
  const int L = c.experts / c.n;
  const std::size_t es = sizeOfType(c.type), rowBytes = c.hidden * es;
  const std::size_t capacity = static_cast<std::size_t>(c.n) * c.tokens * c.topk;
  // fp8: recv_x holds a row's e4m3 bytes, recv_scales its 128-value blocks' scales.
  const std::size_t recvRow = c.fp8 ? c.hidden : rowBytes, blocks = c.fp8 ? c.hidden / 128 : 0;
  Device x(c.tokens * rowBytes, stream), idx(c.tokens * c.topk * 8, stream),
      w(c.tokens * c.topk * 4, stream), recv(capacity * recvRow, stream),
      counts(static_cast<std::size_t>(L) * 4, stream), source(capacity * 8, stream),
      y(capacity * rowBytes, stream), out(c.tokens * rowBytes, stream),
      scales(capacity * blocks * 4, stream), scratch(split ? 1 << 20 : 16, stream);
  int bad = 0;
  auto expectSame = [&](const auto& got, const auto& want, const char* what, int round) {
    if (got == want) return;
    ++bad;
    ADD_FAILURE() << "rank " << r << " round " << round << ": " << what << " differs";
  };
  cudaGraphExec_t exec = nullptr;
  weftMoeHandle_t gh = nullptr;
  for (int round = 0; round < rounds; ++round) {
    Inputs in(c, r, round);
    // The host path: the reference.
    std::vector<std::byte> hRecv(capacity * recvRow);
    std::vector<std::int32_t> hCounts(static_cast<std::size_t>(L)), hSource(2 * capacity);
    std::vector<float> hScales(capacity * blocks);
    weftMoeDispatchArgs a{in.x.data(),    in.idx.data(),  in.w.data(), c.tokens,      c.hidden,
                          c.topk,         c.experts,      c.type,      hRecv.data(),  capacity,
                          hCounts.data(), hSource.data(), c.fp8,       hScales.data()};
    auto hh = comm.moeDispatch(a);
    if (!hh.isOk()) {
      ADD_FAILURE() << "rank " << r << ": host dispatch: " << hh.status().toString();
      return bad + 1;
    }
    const std::size_t rows = hh->rows();
    hRecv.resize(rows * recvRow);
    hScales.resize(rows * blocks);
    const auto hY = c.fp8 ? patternOutputs(c, rows) : expertOutputs(c, hRecv, hCounts);
    std::vector<std::byte> hOut(c.tokens * rowBytes);
    if (Status s = comm.moeCombine(*hh, hY.data(), hOut.data()); !s) {
      ADD_FAILURE() << "rank " << r << ": host combine: " << s.toString();
      return bad + 1;
    }
    // The GPU path on the same inputs.
    x.put(in.x, stream), idx.put(in.idx, stream), w.put(in.w, stream);
    weftMoeDispatchArgs g = argsOn(c, x, idx, w, recv, capacity, counts, source.p);
    g.fp8Dispatch = c.fp8, g.recvScales = static_cast<float*>(scales.p);
    EXPECT_EQ(cudaMemsetAsync(recv.p, 0xA5, recv.bytes, stream), cudaSuccess);
    EXPECT_EQ(cudaMemsetAsync(scales.p, 0xA5, scales.bytes, stream), cudaSuccess);
    EXPECT_EQ(cudaMemsetAsync(out.p, 0xA5, out.bytes, stream), cudaSuccess);
    if (!graph || round < 1) {
      weftMoeHandle_t h = nullptr;
      weftResult_t sent = split ? weftMoeDispatchSend(&g, &h, comm.handle(), stream)
                                : weftMoeDispatch(&g, &h, comm.handle(), stream);
      if (sent == weftSuccess && split) {
        EXPECT_EQ(cudaMemsetAsync(scratch.p, 0x3C, scratch.bytes, stream), cudaSuccess);  // overlap
        sent = weftMoeDispatchRecv(h, comm.handle(), stream);
      }
      if (sent != weftSuccess) {
        ADD_FAILURE() << "rank " << r << ": GPU dispatch: " << weftGetLastError();
        return bad + 1;
      }
      size_t gRows = 0;
      EXPECT_EQ(weftMoeRows(h, &gRows), weftSuccess);
      expectSame(gRows, rows, "rows", round);
      y.put(c.fp8 ? patternOutputs(c, rows)
                  : expertOutputs(c, recv.get<std::byte>(rows * rowBytes, stream), hCounts),
            stream);
      if (split) {
        EXPECT_EQ(weftMoeCombineSend(h, y.p, comm.handle(), stream), weftSuccess)
            << weftGetLastError();
        EXPECT_EQ(cudaMemsetAsync(scratch.p, 0x3C, scratch.bytes, stream), cudaSuccess);  // overlap
        EXPECT_EQ(weftMoeCombineRecv(h, out.p, comm.handle(), stream), weftSuccess)
            << weftGetLastError();
      } else {
        EXPECT_EQ(weftMoeCombine(h, y.p, out.p, comm.handle(), stream), weftSuccess)
            << weftGetLastError();
      }
      EXPECT_EQ(weftMoeHandleDestroy(h), weftSuccess);
    } else {
      // The expert outputs the host computed stand in for the experts between the two halves.
      y.put(hY, stream);
      if (exec == nullptr) {
        cudaGraph_t gr = nullptr;
        EXPECT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed), cudaSuccess);
        EXPECT_EQ(weftMoeDispatch(&g, &gh, comm.handle(), stream), weftSuccess)
            << weftGetLastError();
        EXPECT_EQ(weftMoeCombine(gh, y.p, out.p, comm.handle(), stream), weftSuccess)
            << weftGetLastError();
        EXPECT_EQ(cudaStreamEndCapture(stream, &gr), cudaSuccess);
        EXPECT_EQ(cudaGraphInstantiate(&exec, gr, 0), cudaSuccess);
        (void)cudaGraphDestroy(gr);
      }
      EXPECT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    }
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    expectSame(counts.get<std::int32_t>(static_cast<std::size_t>(L), stream), hCounts, "counts",
               round);
    expectSame(recv.get<std::byte>(rows * recvRow, stream), hRecv, "recv_x", round);
    if (c.fp8) expectSame(scales.get<float>(rows * blocks, stream), hScales, "recv_scales", round);
    auto gSource = source.get<std::int32_t>(2 * rows, stream);
    hSource.resize(2 * rows);
    expectSame(gSource, hSource, "recv_source", round);
    expectSame(out.get<std::byte>(c.tokens * rowBytes, stream), hOut, "combine's out", round);
  }
  if (exec != nullptr) (void)cudaGraphExecDestroy(exec);
  (void)weftMoeHandleDestroy(gh);
  return bad;
}

class GpuMoe : public ::testing::TestWithParam<Case> {};

// The communicators made while it lives run MoE on GPU memory in `mode` (WEFT_MOE_MODE), with
// `channels` (WEFT_MOE_CHANNELS; 0: the selector's).
struct MoeMode {
  MoeMode(const char* mode, int channels = 0) {
    EXPECT_EQ(setenv("WEFT_MOE_MODE", mode, 1), 0);
    EXPECT_EQ(setenv("WEFT_MOE_CHANNELS", std::to_string(channels).c_str(), 1), 0);
  }
  ~MoeMode() {
    unsetenv("WEFT_MOE_MODE");
    unsetenv("WEFT_MOE_CHANNELS");
  }
};

// c.n ranks as threads, each runRank's rounds; every rank's mismatches 0.
void expectThreadRanks(const Case& c, int rounds, bool graph, bool split = false) {
  auto comms = threadRanks(c.n);
  ASSERT_EQ(comms.size(), static_cast<std::size_t>(c.n));
  Streams streams(c.n);
  std::vector<int> bad(static_cast<std::size_t>(c.n));
  onEveryRank(c.n, [&](int r) {
    bad[static_cast<std::size_t>(r)] =
        runRank(c, r, comms[static_cast<std::size_t>(r)], streams[r], rounds, graph, split);
  });
  for (int b : bad) EXPECT_EQ(b, 0);
}

TEST_P(GpuMoe, DispatchAndCombineEqualTheHostPath) {
  SKIP_WITHOUT_GPU();
  expectThreadRanks(GetParam(), 2, false);
}

// Both modes, with few channels (a block copies many rows, a destination's blocks share its
// tokens) and many, give the host path's bits.
TEST_P(GpuMoe, EachModeAndChannelCountEqualsTheHostPath) {
  SKIP_WITHOUT_GPU();
  for (const char* mode : {"normal-counted", "normal-table", "low-latency"}) {
    for (int channels : {1, 3, 64}) {
      SCOPED_TRACE(std::string(mode) + ", " + std::to_string(channels) + " channels");
      MoeMode m(mode, channels);
      expectThreadRanks(GetParam(), 2, false);
    }
  }
}

std::string caseName(const ::testing::TestParamInfo<Case>& p) {
  const Case& c = p.param;
  const char* routing = c.routing == Routing::uniform     ? "uniform"
                        : c.routing == Routing::oneExpert ? "oneExpert"
                                                          : "dropped";
  return std::to_string(c.n) + "ranks_top" + std::to_string(c.topk) + "_" + routing +
         (c.type == weftFloat32 ? "_f32" : "_bf16") + (c.fp8 ? "_fp8" : "");
}

INSTANTIATE_TEST_SUITE_P(
    Routings, GpuMoe,
    ::testing::Values(Case{1, 4, 2, 40, 64, weftBfloat16, Routing::uniform},
                      Case{2, 8, 1, 64, 128, weftBfloat16, Routing::uniform},
                      Case{2, 8, 8, 64, 128, weftFloat32, Routing::uniform},
                      Case{3, 6, 3, 50, 64, weftBfloat16, Routing::uniform},
                      Case{4, 16, 4, 96, 256, weftBfloat16, Routing::uniform},
                      Case{4, 16, 4, 32, 64, weftBfloat16, Routing::oneExpert},
                      Case{4, 8, 2, 32, 64, weftBfloat16, Routing::dropped},
                      Case{1, 4, 2, 24, 128, weftBfloat16, Routing::uniform, true},
                      Case{2, 8, 8, 64, 256, weftFloat32, Routing::uniform, true},
                      Case{4, 16, 4, 96, 384, weftBfloat16, Routing::uniform, true}),
    caseName);

// Each call in its halves with other work between (weftMoeDispatchSend ... weftMoeCombineRecv):
// the same bits as the host path.
TEST(GpuMoeSplit, HalvesWithWorkBetweenEqualTheHostPath) {
  SKIP_WITHOUT_GPU();
  for (const char* mode : {"normal-counted", "normal-table", "low-latency"}) {
    SCOPED_TRACE(mode);
    MoeMode m(mode);
    expectThreadRanks(Case{2, 8, 4, 64, 128, weftBfloat16, Routing::uniform}, 2, false, true);
    expectThreadRanks(Case{4, 16, 4, 48, 256, weftBfloat16, Routing::uniform, true}, 2, false,
                      true);
  }
}

TEST(GpuMoeGraph, ReplaysWithDifferentRoutings) {
  SKIP_WITHOUT_GPU();
  for (const char* mode : {"normal-counted", "normal-table", "low-latency"}) {
    SCOPED_TRACE(mode);
    MoeMode m(mode);
    expectThreadRanks(Case{4, 16, 4, 64, 128, weftBfloat16, Routing::uniform}, 4, true);
    expectThreadRanks(Case{2, 8, 4, 64, 256, weftBfloat16, Routing::uniform, true}, 3, true);
  }
}

// More tokens than a block scans at once (the low-latency send's chunks carry each expert's
// count over) and 40 experts a rank (six packed words of counts).
TEST(GpuMoeLowLatency, ManyTokensAndExpertsEqualTheHostPath) {
  SKIP_WITHOUT_GPU();
  MoeMode m("low-latency", 8);
  expectThreadRanks(Case{2, 80, 8, 700, 64, weftBfloat16, Routing::uniform}, 2, false);
  expectThreadRanks(Case{2, 80, 8, 600, 64, weftBfloat16, Routing::oneExpert}, 1, false);
}

// 80 experts a rank: past the table the receivers place from (algo::moeTableFits), normal mode
// counts and places each expert's rows in a block of its own; low latency is refused.
TEST(GpuMoeWide, ManyExpertsARankAreCountedAndPlaced) {
  SKIP_WITHOUT_GPU();
  for (int channels : {0, 5}) {
    MoeMode m("auto", channels);
    expectThreadRanks(Case{2, 160, 6, 300, 64, weftBfloat16, Routing::uniform}, 2, false);
    expectThreadRanks(Case{2, 160, 4, 64, 128, weftBfloat16, Routing::uniform, true}, 2, true);
  }
}

void expectCapacityError();

TEST(GpuMoeCapacity, RowsOverTheCapacityAreEveryRanksError) {
  SKIP_WITHOUT_GPU();
  for (const char* mode : {"normal-counted", "normal-table", "low-latency"}) {
    SCOPED_TRACE(mode);
    MoeMode m(mode);
    expectCapacityError();
  }
}

void expectCapacityError() {
  const Case c{2, 4, 2, 32, 64, weftBfloat16, Routing::uniform};
  auto comms = threadRanks(c.n);
  ASSERT_EQ(comms.size(), 2u);
  Streams streams(c.n);
  onEveryRank(c.n, [&](int r) {
    cudaStream_t s = streams[r];
    Inputs in(c, r, 0);
    Device x(c.tokens * c.hidden * 2, s), idx(in.idx.size() * 8, s), w(in.w.size() * 4, s),
        recv(4 * c.hidden * 2, s), counts(8, s);
    x.put(in.x, s), idx.put(in.idx, s), w.put(in.w, s);
    const weftMoeDispatchArgs g = argsOn(c, x, idx, w, recv, 4, counts, nullptr);
    weftMoeHandle_t h = nullptr;
    EXPECT_EQ(weftMoeDispatch(&g, &h, comms[static_cast<std::size_t>(r)].handle(), s),
              weftInvalidArgument);
    EXPECT_NE(std::string(weftGetLastError()).find("over the ranks' capacity"), std::string::npos)
        << weftGetLastError();
    EXPECT_EQ(h, nullptr);
  });
}

TEST(GpuMoeProcesses, DispatchAndCombineAcrossProcesses) {
  SKIP_UNLESS_FORKABLE();
  if (kSetHardwareQueues) unsetenv("CUDA_DEVICE_MAX_CONNECTIONS");
  const std::pair<Case, const char*> cases[] = {
      {Case{2, 8, 4, 64, 128, weftBfloat16, Routing::uniform}, "normal"},
      {Case{4, 16, 8, 96, 256, weftBfloat16, Routing::uniform}, "normal-counted"},
      {Case{4, 16, 8, 96, 256, weftBfloat16, Routing::uniform}, "normal-table"},
      {Case{4, 16, 8, 96, 256, weftBfloat16, Routing::uniform}, "low-latency"}};
  for (const auto& [c, mode] : cases) {
    MoeMode m(mode);
    std::vector<pid_t> pids;
    const std::vector<int> codes = forkRanks(
        c.n,
        [&](int r, Comm& comm) {
          if (cudaSetDevice(spreadDevice(r)) != cudaSuccess) return 3;
          cudaStream_t s = nullptr;
          if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) return 3;
          const int bad = runRank(c, r, comm, s, 2, true);  // round 1 from a graph
          (void)cudaStreamDestroy(s);
          return bad == 0 ? 0 : 1;
        },
        &pids, std::chrono::seconds(120));
    for (std::size_t r = 0; r < codes.size(); ++r)
      EXPECT_EQ(codes[r], 0) << c.n << " ranks, rank " << r;
    EXPECT_EQ(segmentsOf(pids), 0);
  }
  if (kSetHardwareQueues) setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 1);
}

}  // namespace
}  // namespace weft::test
