// Collectives and point-to-point on GPU memory, against the double-precision reference with
// outputs poisoned:
// ranks as threads of one process (a stream each) and as processes sharing the GPU (CUDA IPC);
// every dtype at the tuner's picks, and every algorithm x protocol forced; CUDA graph capture and
// replay. Failures (timeouts, abort, bad input, leaks): test_gpu_faults.cpp. Skipped without a
// GPU.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <initializer_list>
#include <thread>
#include <tuple>

#include "algorithms/algorithm.hpp"
#include "tests/gpu/gpu_harness.hpp"
#include "tests/runtime/fork.hpp"
#include "tests/runtime/harness.hpp"

namespace weft::test {
namespace {

constexpr Collective kCollectives[] = {Collective::allReduce, Collective::reduceScatter,
                                       Collective::reduce,    Collective::allGather,
                                       Collective::broadcast, Collective::allToAll};

class GpuThreads : public ::testing::TestWithParam<int> {};

// Every collective x dtype x op x size x placement at the tuner's picks (the host matrix).
TEST_P(GpuThreads, EveryCollectiveTypeOpAndSize) {
  SKIP_WITHOUT_GPU();
  const int n = GetParam();
  std::vector<Comm> comms = threadRanks(n);
  ASSERT_EQ(comms.size(), static_cast<std::size_t>(n));
  Streams streams(n, -1, true);
  const DeviceMemory mem = deviceMemory(streams);
  const std::vector<std::string> failures = runMatrix(comms, n, -1, &mem);
  for (const std::string& f : failures) ADD_FAILURE() << f;
  EXPECT_EQ(comms[0].device(), 0);
  EXPECT_NE(comms[0].summary().find("cuda_ipc"), std::string::npos) << comms[0].summary();
}

// The cases of one forced algorithm: every collective it builds at n ranks, the four dtypes the
// GPU path serves most, from one element to beyond many slots (300001 elements in the `large`
// dtypes only), in and out of place. Case k's root (and what the run checks it with) comes from
// seed + k; `seed` ends past the last case.
std::vector<Case> forcedCases(const algo::Algorithm& a, int n, std::uint64_t& seed,
                              std::initializer_list<DataType> large) {
  std::vector<Case> cases;
  for (Collective coll : kCollectives) {
    algo::Params params;
    params.groupSize = n;
    if (!a.supports(coll) || !a.build(coll, n, params)) continue;
    for (DataType type : {DataType::f32, DataType::bf16, DataType::f16, DataType::f8e4m3}) {
      for (std::size_t count : {1ul, 4099ul, 300001ul}) {
        if (count > 4099 && std::find(large.begin(), large.end(), type) == large.end()) continue;
        for (bool inPlace : {false, true}) {
          const RedOp op = type == DataType::bf16 ? RedOp::max : RedOp::sum;
          const int root = static_cast<int>(seed++ % static_cast<std::uint64_t>(n));
          cases.push_back({coll, type, isReduction(coll) ? op : RedOp::sum, count, inPlace, root});
        }
      }
    }
  }
  return cases;
}

// WEFT_TEST_FORCED="ring/ll dbtree/ll" runs only those pairs (to chase one on the GPU).
bool forcedWanted(const std::string& pair) {
  const char* only = std::getenv("WEFT_TEST_FORCED");
  return only == nullptr ||
         (" " + std::string(only) + " ").find(" " + pair + " ") != std::string::npos;
}

// Every algorithm and protocol forced, for each collective it implements (forcedCases).
TEST_P(GpuThreads, EveryAlgorithmAndProtocolForced) {
  SKIP_WITHOUT_GPU();
  const int n = GetParam();
  std::uint64_t seed = 7;
  for (const algo::Algorithm* a : algo::algorithms()) {
    for (const char* proto : {"ll", "simple"}) {
      const std::string pair = std::string(a->name()) + "/" + proto;
      // A pair left out still takes its seeds, so the others' cases stay as in the full run.
      const std::uint64_t first = seed;
      const std::vector<Case> cases = forcedCases(*a, n, seed, {DataType::f32, DataType::bf16});
      if (!forcedWanted(pair) || cases.empty()) continue;
      ScopedEnv algoEnv("WEFT_ALGO", std::string(a->name()));
      ScopedEnv protoEnv("WEFT_PROTO", proto);
      Streams streams(n, -1, true);
      const DeviceMemory mem = deviceMemory(streams);
      std::vector<Comm> comms = threadRanks(n);
      ASSERT_EQ(comms.size(), static_cast<std::size_t>(n));
      for (std::size_t k = 0; k < cases.size(); ++k) {
        const std::string err = runCase(comms, cases[k], first + k, n, -1, &mem);
        EXPECT_EQ(err, "") << pair << " " << describe(cases[k], n);
        if (!err.empty()) return;
      }
    }
  }
}

// One-shot and two-shot all-reduce both ways: the direct kernel (the default; each element
// summed in rank order by one rank, so every rank holds the same bits, which is checked) and the
// schedule through the FIFOs (WEFT_GPU_DIRECT=0); sizes up to four rounds of the direct kernel's
// slabs (WEFT_GPU_DIRECT=4), in and out of place. One-shot's calls to 256 KiB push ll lines by
// default (on one block to 8 KiB, on more past it), and take the slabs with
// WEFT_GPU_LL_DIRECT_BYTES=0; the slabs' blocks take at least 16 KiB of a call (the default)
// or 512 bytes (many blocks, small uneven shares).
TEST_P(GpuThreads, OneShotDirectAndThroughTheFifos) {
  SKIP_WITHOUT_GPU();
  const int n = GetParam();
  std::uint64_t seed = 501;
  struct Way {
    const char *algo, *direct, *ll, *block;
  };
  for (const auto& [algo, direct, ll, block] :
       std::vector<Way>{{"oneshot", "4", "262144", "16384"},
                        {"oneshot", "4", "0", "16384"},
                        {"oneshot", "4", "0", "512"},
                        {"oneshot", "0", "262144", "16384"},
                        {"twoshot", "4", "262144", "16384"},
                        {"twoshot", "4", "262144", "512"},
                        {"twoshot", "0", "262144", "16384"}}) {
    ScopedEnv algoEnv("WEFT_ALGO", algo);
    ScopedEnv directEnv("WEFT_GPU_DIRECT", direct);
    ScopedEnv llEnv("WEFT_GPU_LL_DIRECT_BYTES", ll);
    ScopedEnv blockEnv("WEFT_GPU_DIRECT_BLOCK_BYTES", block);
    std::vector<Comm> comms = threadRanks(n);
    ASSERT_EQ(comms.size(), static_cast<std::size_t>(n));
    Streams streams(n, -1, true);
    const DeviceMemory mem = deviceMemory(streams);
    for (DataType type : {DataType::f32, DataType::bf16, DataType::f16, DataType::f8e4m3}) {
      // 1310731 floats: 2.5 rounds of the direct kernels' slabs at 8 ranks (16 blocks of 128
      // KiB per round), 1.25 at 4 and 2, with a ragged last round.
      for (std::size_t count :
           {1ul, 33ul, 4095ul, 8191ul, 16383ul, 65537ul, 1ul << 20, 1310731ul}) {
        // The rounds' case in two types only: in all four the 8-rank test did not finish in
        // 207 s on the H200 (the four sizes before took 129).
        if (count == 1310731ul && type != DataType::f32 && type != DataType::bf16) continue;
        for (bool inPlace : {false, true}) {
          for (RedOp op : {RedOp::sum, RedOp::avg, RedOp::max}) {
            // The direct kernels run up to four rounds of their slabs (8 MiB at 8 ranks on the
            // H200); larger calls run the schedule. Either way every rank holds the same bits.
            const bool viaKernel = std::string(direct) != "0";
            const Case c{Collective::allReduce, type, op, count, inPlace, 0, viaKernel};
            const std::string err = runCase(comms, c, seed++, n, -1, &mem);
            ASSERT_EQ(err, "") << algo << ", WEFT_GPU_DIRECT=" << direct
                               << ", WEFT_GPU_LL_DIRECT_BYTES=" << ll
                               << ", WEFT_GPU_DIRECT_BLOCK_BYTES=" << block << " "
                               << describe(c, n);
          }
        }
      }
    }
  }
}

// One-shot all-gather, reduce-scatter and all-to-all three ways: ll lines (pieces to 64 or 256
// KiB with WEFT_GPU_LL_DIRECT_BYTES=65536 or 262144, each block taking at least 1 KiB of a
// piece, the default, or 512 bytes, 2 KiB or 8 KiB), the direct kernel through the slabs (past
// the ll pieces, or with WEFT_GPU_LL_DIRECT_BYTES=0; each block taking at least 16 KiB or 512
// bytes of a call) and the schedule through the FIFOs (WEFT_GPU_DIRECT=0, which the GPU tuner
// takes only when WEFT_ALGO names one-shot), in and out of place, with ragged counts and one past
// a slab's share of every piece; reduce-scatter also in bf16 with max.
TEST_P(GpuThreads, BlockOneShotDirectAndThroughTheFifos) {
  SKIP_WITHOUT_GPU();
  const int n = GetParam();
  std::uint64_t seed = 901;
  struct Way {
    const char *direct, *ll, *block, *llBlock;
  };
  for (const auto& [direct, ll, block, llBlock] :
       std::vector<Way>{{"4", "65536", "16384", "1024"},
                        {"4", "262144", "16384", "2048"},
                        {"4", "262144", "16384", "512"},
                        {"4", "262144", "16384", "8192"},
                        {"4", "0", "16384", "2048"},
                        {"4", "0", "512", "2048"},
                        {"0", "65536", "16384", "2048"}}) {
    ScopedEnv algoEnv("WEFT_ALGO", "oneshot");
    ScopedEnv directEnv("WEFT_GPU_DIRECT", direct);
    ScopedEnv llEnv("WEFT_GPU_LL_DIRECT_BYTES", ll);
    ScopedEnv blockEnv("WEFT_GPU_DIRECT_BLOCK_BYTES", block);
    ScopedEnv llBlockEnv("WEFT_GPU_LL_BLOCK_BYTES", llBlock);
    std::vector<Comm> comms = threadRanks(n);
    ASSERT_EQ(comms.size(), static_cast<std::size_t>(n));
    Streams streams(n, -1, true);
    const DeviceMemory mem = deviceMemory(streams);
    std::vector<Case> cases;
    for (Collective coll :
         {Collective::allGather, Collective::reduceScatter, Collective::allToAll}) {
      for (std::size_t count : {1ul, 1029ul, 4099ul, 16384ul, 65536ul, 100003ul}) {
        for (bool inPlace : {false, true})
          cases.push_back(Case{coll, DataType::f32, RedOp::sum, count, inPlace, 0});
      }
    }
    for (std::size_t count : {7ul, 32767ul})
      cases.push_back(Case{Collective::reduceScatter, DataType::bf16, RedOp::max, count, false, 0});
    for (const Case& c : cases) {
      const std::string err = runCase(comms, c, seed++, n, -1, &mem);
      ASSERT_EQ(err, "") << "WEFT_GPU_DIRECT=" << direct << ", WEFT_GPU_LL_DIRECT_BYTES=" << ll
                         << ", WEFT_GPU_DIRECT_BLOCK_BYTES=" << block
                         << ", WEFT_GPU_LL_BLOCK_BYTES=" << llBlock << " " << describe(c, n);
    }
  }
}

// 256 MB of float32 all-reduced, every element checked.
TEST_P(GpuThreads, LargeAllReduce) {
  SKIP_WITHOUT_GPU();
  const int n = GetParam();
  if (n != 2 && n != 8) GTEST_SKIP() << "2 and 8 ranks only (time)";
  std::vector<Comm> comms = threadRanks(n);
  ASSERT_EQ(comms.size(), static_cast<std::size_t>(n));
  Streams streams(n, -1, true);
  const DeviceMemory mem = deviceMemory(streams);
  const Case c{Collective::allReduce, DataType::f32, RedOp::sum, 64ul << 20, false, 0};
  EXPECT_EQ(runCase(comms, c, 99, n, -1, &mem), "");
}

// Registered inputs (weftCommRegister): the one-shot and two-shot direct kernels read them in
// place on the peers. Every rank registers a buffer and passes inputs at the same offsets in it:
// exact sums (small integers), outputs poisoned, inputs unchanged, and the same once deregistered
// (the slabs again), in place (two-shot still reads in place; one-shot takes the slabs, since
// its sum would overwrite what a peer may still read) and inside a CUDA graph captured after the
// first call. With the outputs registered too, two-shot writes every rank's output from every
// rank (unless WEFT_GPU_REGISTERED=0). Sizes up to 2.6 rounds of the slabs (8 ranks).
TEST_P(GpuThreads, RegisteredInputsAreReadInPlace) {
  SKIP_WITHOUT_GPU();
  const int n = GetParam();
  // 1: read in place wherever every rank's buffer is registered; auto: one-shot only up to
  // 2 ranks (the slabs beyond), so both paths meet these checks.
  // regOut: the outputs registered too (two-shot then writes every rank's output from every
  // rank in both modes, also once the inputs are deregistered at the end).
  for (const char* mode : {"1", "auto"}) {
    for (const auto& [algo, regOut] : std::vector<std::pair<const char*, bool>>{
             {"oneshot", false}, {"twoshot", false}, {"twoshot", true}}) {
      ScopedEnv modeEnv("WEFT_GPU_REGISTERED", mode);
      ScopedEnv algoEnv("WEFT_ALGO", algo);
      std::vector<Comm> comms = threadRanks(n);
      ASSERT_EQ(comms.size(), static_cast<std::size_t>(n));
      Streams streams(n);
      const std::size_t region = std::size_t{8} << 20;
      std::vector<std::byte*> base(static_cast<std::size_t>(n)), out(base.size());
      std::vector<void*> handle(base.size()), outHandle(base.size());
      for (int r = 0; r < n; ++r) {
        const auto R = static_cast<std::size_t>(r);
        ASSERT_EQ(cudaMalloc(&base[R], region), cudaSuccess);
        ASSERT_EQ(cudaMalloc(&out[R], region), cudaSuccess);
        auto h = comms[R].registerBuffer(base[R], region);
        ASSERT_TRUE(h.isOk()) << h.status().toString();
        handle[R] = *h;
        if (regOut) {
          auto o = comms[R].registerBuffer(out[R], region);
          ASSERT_TRUE(o.isOk()) << o.status().toString();
          outHandle[R] = *o;
        }
      }
      auto value = [](int r, std::size_t i, int round) {
        return static_cast<float>((i * 7 + static_cast<std::size_t>(r) * 13 + round) % 101);
      };
      // One round: fill every input, poison every output, run `call` on every rank, check.
      auto check = [&](std::size_t offset, std::size_t count, bool inPlace, int tag,
                       const std::function<Status(int, float*, float*)>& call) {
        const std::size_t bytes = count * sizeof(float);
        std::vector<std::string> errors(base.size());
        onEveryRank(n, [&](int r) {
          const auto R = static_cast<std::size_t>(r);
          std::vector<float> host(count);
          for (std::size_t i = 0; i < count; ++i) host[i] = value(r, i, tag);
          auto* in = reinterpret_cast<float*>(base[R] + offset);
          auto* to = inPlace ? in : reinterpret_cast<float*>(out[R]);
          EXPECT_EQ(cudaMemcpyAsync(in, host.data(), bytes, cudaMemcpyHostToDevice, streams[r]),
                    cudaSuccess);
          if (!inPlace) {
            EXPECT_EQ(cudaMemsetAsync(to, 0xA5, bytes, streams[r]), cudaSuccess);
          }
          const Status st = call(r, in, to);
          if (!st.isOk()) errors[R] = st.toString();
          EXPECT_EQ(cudaStreamSynchronize(streams[r]), cudaSuccess);
          const Status async = comms[R].asyncError();
          if (!async.isOk()) errors[R] = async.toString();
        });
        for (const std::string& e : errors) ASSERT_EQ(e, "") << "count " << count;
        for (int r = 0; r < n; ++r) {
          const auto R = static_cast<std::size_t>(r);
          std::vector<float> got(count), kept(count);
          ASSERT_EQ(cudaMemcpy(got.data(), inPlace ? base[R] + offset : out[R], bytes,
                               cudaMemcpyDeviceToHost),
                    cudaSuccess);
          if (!inPlace) {
            ASSERT_EQ(cudaMemcpy(kept.data(), base[R] + offset, bytes, cudaMemcpyDeviceToHost),
                      cudaSuccess);
          }
          for (std::size_t i = 0; i < count; ++i) {
            float sum = 0;
            for (int q = 0; q < n; ++q) sum += value(q, i, tag);
            ASSERT_EQ(got[i], sum) << algo << (regOut ? " (registered outputs)" : "") << " rank "
                                   << r << " i " << i << " count " << count;
            if (!inPlace) {
              ASSERT_EQ(kept[i], value(r, i, tag)) << "input changed, rank " << r;
            }
          }
        }
      };
      auto plain = [&](int r, float* in, float* to, std::size_t count) {
        return comms[static_cast<std::size_t>(r)].allReduce(in, to, count, RedOp::sum, streams[r]);
      };
      int tag = 0;
      for (std::size_t offset : {std::size_t{0}, std::size_t{4096} + 16}) {
        for (std::size_t count : {1ul, 33ul, 65537ul, 1ul << 19, 1310731ul}) {
          for (bool inPlace : {false, true}) {
            check(offset, count, inPlace, ++tag,
                  [&](int r, float* in, float* to) { return plain(r, in, to, count); });
          }
        }
      }
      // Captured after the first call mapped the peers' buffers; replayed with fresh inputs.
      const std::size_t count = 65537;
      std::vector<cudaGraphExec_t> graphs(base.size());
      onEveryRank(n, [&](int r) {
        const auto R = static_cast<std::size_t>(r);
        auto* in = reinterpret_cast<float*>(base[R]);
        auto* to = reinterpret_cast<float*>(out[R]);
        cudaGraph_t graph = nullptr;
        EXPECT_EQ(cudaStreamBeginCapture(streams[r], cudaStreamCaptureModeThreadLocal),
                  cudaSuccess);
        EXPECT_TRUE(plain(r, in, to, count).isOk());
        EXPECT_EQ(cudaStreamEndCapture(streams[r], &graph), cudaSuccess);
        EXPECT_EQ(cudaGraphInstantiate(&graphs[R], graph, 0), cudaSuccess);
        (void)cudaGraphDestroy(graph);
      });
      for (int replay = 0; replay < 3; ++replay) {
        check(0, count, false, ++tag, [&](int r, float*, float*) {
          return cudaGraphLaunch(graphs[static_cast<std::size_t>(r)], streams[r]) == cudaSuccess
                     ? Status{}
                     : Status(Code::systemError, "graph launch");
        });
      }
      for (cudaGraphExec_t g : graphs) (void)cudaGraphExecDestroy(g);
      for (int r = 0; r < n; ++r) {
        const auto R = static_cast<std::size_t>(r);
        EXPECT_TRUE(comms[R].deregisterBuffer(handle[R]).isOk());
        EXPECT_FALSE(comms[R].deregisterBuffer(handle[R]).isOk());  // twice: unknown
      }
      check(16, 65537, false, ++tag,
            [&](int r, float* in, float* to) { return plain(r, in, to, 65537); });
      if (regOut) {
        for (int r = 0; r < n; ++r) {
          EXPECT_TRUE(comms[static_cast<std::size_t>(r)]
                          .deregisterBuffer(outHandle[static_cast<std::size_t>(r)])
                          .isOk());
        }
      }
      for (int r = 0; r < n; ++r) {
        (void)cudaFree(base[static_cast<std::size_t>(r)]);
        (void)cudaFree(out[static_cast<std::size_t>(r)]);
      }
    }
  }
}

// Captured once into a CUDA graph per rank, replayed with fresh inputs each time.
TEST_P(GpuThreads, GraphCaptureAndReplay) {
  SKIP_WITHOUT_GPU();
  const int n = GetParam();
  std::vector<Comm> comms = threadRanks(n);
  ASSERT_EQ(comms.size(), static_cast<std::size_t>(n));
  Streams streams(n);
  for (std::size_t count : {1ul, 4099ul, 1ul << 20}) {
    const std::size_t bytes = count * sizeof(float);
    std::vector<float*> in(static_cast<std::size_t>(n)), out(in.size());
    std::vector<cudaGraphExec_t> graphs(in.size());
    std::vector<std::string> errors(in.size());
    onEveryRank(n, [&](int r) {
      const auto R = static_cast<std::size_t>(r);
      cudaStream_t s = streams[r];
      EXPECT_EQ(cudaMalloc(&in[R], bytes), cudaSuccess);
      EXPECT_EQ(cudaMalloc(&out[R], bytes), cudaSuccess);
      // The first call of a size sets up (outside the capture), then the capture.
      EXPECT_TRUE(comms[R].allReduce(in[R], out[R], count, RedOp::sum, s).isOk());
      EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
      cudaGraph_t graph = nullptr;
      EXPECT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
      const Status st = comms[R].allReduce(in[R], out[R], count, DataType::f32, RedOp::avg, s);
      EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
      if (!st.isOk()) errors[R] = st.toString();
      EXPECT_EQ(cudaGraphInstantiate(&graphs[R], graph, 0), cudaSuccess);
      (void)cudaGraphDestroy(graph);
    });
    for (const std::string& e : errors) ASSERT_EQ(e, "");
    for (int replay = 0; replay < 3; ++replay) {
      std::vector<std::vector<float>> host(in.size(), std::vector<float>(count));
      for (int r = 0; r < n; ++r) {
        for (std::size_t i = 0; i < count; ++i)
          host[static_cast<std::size_t>(r)][i] =
              static_cast<float>((i * 7 + static_cast<std::size_t>(r) * 3 + replay) % 64);
      }
      onEveryRank(n, [&](int r) {
        const auto R = static_cast<std::size_t>(r);
        EXPECT_EQ(cudaMemcpyAsync(in[R], host[R].data(), bytes, cudaMemcpyHostToDevice, streams[r]),
                  cudaSuccess);
        EXPECT_EQ(cudaMemsetAsync(out[R], 0xA5, bytes, streams[r]), cudaSuccess);
        EXPECT_EQ(cudaGraphLaunch(graphs[R], streams[r]), cudaSuccess);
        EXPECT_EQ(cudaStreamSynchronize(streams[r]), cudaSuccess);
      });
      for (int r = 0; r < n; ++r) {
        std::vector<float> got(count);
        ASSERT_EQ(
            cudaMemcpy(got.data(), out[static_cast<std::size_t>(r)], bytes, cudaMemcpyDeviceToHost),
            cudaSuccess);
        for (std::size_t i = 0; i < count; ++i) {
          double sum = 0;
          for (int q = 0; q < n; ++q) sum += host[static_cast<std::size_t>(q)][i];
          ASSERT_NEAR(got[i], sum / n, 1e-5) << "replay " << replay << " rank " << r << " i " << i;
        }
      }
    }
    for (std::size_t r = 0; r < in.size(); ++r) {
      (void)cudaGraphExecDestroy(graphs[r]);
      (void)cudaFree(in[r]);
      (void)cudaFree(out[r]);
    }
  }
}

// Each call's input is the output its predecessor on the stream just wrote: what the ll kernels
// launched as programmatic dependents must wait for (griddepcontrol.wait) before reading their
// input, counts or inboxes. Six sum all-reduces, in place and out of place in turn, on a stream
// and replayed from a CUDA graph, with dependent launch on and off; small integers keep every
// sum exact (at most 3 * 8^6 < 2^24).
TEST_P(GpuThreads, ChainedCallsReadTheirPredecessorsOutput) {
  SKIP_WITHOUT_GPU();
  const int n = GetParam();
  constexpr int kCalls = 6;
  for (const char* pdl : {"1", "0"}) {
    ScopedEnv pdlEnv("WEFT_GPU_PDL", pdl);
    std::vector<Comm> comms = threadRanks(n);
    ASSERT_EQ(comms.size(), static_cast<std::size_t>(n));
    Streams streams(n, -1, true);  // rank r on GPU r mod the count
    for (std::size_t count : {1ul, 4099ul, 65536ul}) {
      const std::size_t bytes = count * sizeof(float);
      std::vector<float*> a(static_cast<std::size_t>(n)), b(a.size());
      std::vector<std::vector<float>> host(a.size(), std::vector<float>(count));
      for (std::size_t r = 0; r < a.size(); ++r) {
        for (std::size_t i = 0; i < count; ++i) host[r][i] = static_cast<float>((i * 5 + r) % 4);
      }
      std::vector<std::string> errors(a.size());
      // a -> b, b -> b, b -> a, a -> a, a -> b, b -> b: the result lands in b.
      auto chain = [&](std::size_t r, cudaStream_t s) {
        float* from = a[r];
        for (int k = 0; k < kCalls; ++k) {
          float* to = k % 2 == 1 ? from : (from == a[r] ? b[r] : a[r]);
          if (Status st = comms[r].allReduce(from, to, count, RedOp::sum, s); !st.isOk()) {
            errors[r] = st.toString();
            return;
          }
          from = to;
        }
      };
      for (bool graph : {false, true}) {
        onEveryRank(n, [&](int r) {
          const auto R = static_cast<std::size_t>(r);
          cudaStream_t s = streams[r];
          EXPECT_EQ(cudaSetDevice(streams.deviceOf(r)), cudaSuccess);
          if (a[R] == nullptr) {
            EXPECT_EQ(cudaMalloc(&a[R], bytes), cudaSuccess);
            EXPECT_EQ(cudaMalloc(&b[R], bytes), cudaSuccess);
          }
          // On the rank's stream (a non-blocking one), before the calls.
          EXPECT_EQ(cudaMemcpyAsync(a[R], host[R].data(), bytes, cudaMemcpyHostToDevice, s),
                    cudaSuccess);
          EXPECT_EQ(cudaMemsetAsync(b[R], 0xA5, bytes, s), cudaSuccess);
          EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
          if (!graph) {
            chain(R, s);
          } else {
            cudaGraph_t g = nullptr;
            cudaGraphExec_t exec = nullptr;
            EXPECT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
            chain(R, s);
            EXPECT_EQ(cudaStreamEndCapture(s, &g), cudaSuccess);
            EXPECT_EQ(cudaGraphInstantiate(&exec, g, 0), cudaSuccess);
            EXPECT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
            EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
            (void)cudaGraphExecDestroy(exec);
            (void)cudaGraphDestroy(g);
          }
          EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
        });
        for (const std::string& e : errors) ASSERT_EQ(e, "");
        double scale = 1;
        for (int k = 1; k < kCalls; ++k) scale *= n;
        for (std::size_t r = 0; r < a.size(); ++r) {
          std::vector<float> got(count);
          ASSERT_EQ(cudaMemcpy(got.data(), b[r], bytes, cudaMemcpyDeviceToHost), cudaSuccess);
          for (std::size_t i = 0; i < count; ++i) {
            double sum = 0;
            for (std::size_t q = 0; q < a.size(); ++q) sum += host[q][i];
            ASSERT_EQ(got[i], sum * scale) << "WEFT_GPU_PDL=" << pdl << (graph ? " graph" : "")
                                           << " rank " << r << " count " << count << " i " << i;
          }
        }
      }
      for (std::size_t r = 0; r < a.size(); ++r) {
        (void)cudaFree(a[r]);
        (void)cudaFree(b[r]);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, GpuThreads, ::testing::Values(1, 2, 3, 4, 8),
                         [](const auto& p) { return std::to_string(p.param) + "ranks"; });

// Point-to-point on GPU memory: a ring exchange in a group (sizes from nothing to several
// slots), a send to itself, and all-to-all-v with uneven counts; every byte checked.
class GpuP2p : public ::testing::TestWithParam<int> {};

std::vector<float> pattern(std::size_t count, int rank, int salt) {
  std::vector<float> v(count);
  for (std::size_t i = 0; i < count; ++i)
    v[i] = static_cast<float>((i * 31 + static_cast<std::size_t>(rank) * 7 + salt) % 1000);
  return v;
}

TEST_P(GpuP2p, RingExchangeSelfSendAndAllToAllv) {
  SKIP_WITHOUT_GPU();
  const int n = GetParam();
  std::vector<Comm> comms = threadRanks(n);
  ASSERT_EQ(comms.size(), static_cast<std::size_t>(n));
  Streams streams(n);
  std::vector<std::string> errors(static_cast<std::size_t>(n));
  onEveryRank(n, [&](int r) {
    std::string& err = errors[static_cast<std::size_t>(r)];
    cudaStream_t s = streams[r];
    weftComm_t h = comms[static_cast<std::size_t>(r)].handle();
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    for (std::size_t count : {0ul, 1ul, 4099ul, 700001ul}) {
      const std::size_t bytes = std::max<std::size_t>(count, 1) * sizeof(float);
      float *in = nullptr, *out = nullptr, *self = nullptr;
      (void)cudaMallocAsync(&in, bytes, s);
      (void)cudaMallocAsync(&out, bytes, s);
      (void)cudaMallocAsync(&self, bytes, s);
      const std::vector<float> mine = pattern(count, r, 1);
      (void)cudaMemcpyAsync(in, mine.data(), count * sizeof(float), cudaMemcpyHostToDevice, s);
      (void)cudaMemsetAsync(out, 0xA5, bytes, s);
      (void)cudaMemsetAsync(self, 0xA5, bytes, s);
      bool ok = weftGroupStart() == weftSuccess;
      ok = ok && weftSend(in, count, weftFloat32, next, h, s) == weftSuccess;
      ok = ok && weftRecv(out, count, weftFloat32, prev, h, s) == weftSuccess;
      ok = ok && weftSend(in, count, weftFloat32, r, h, s) == weftSuccess;
      ok = ok && weftRecv(self, count, weftFloat32, r, h, s) == weftSuccess;
      ok = weftGroupEnd() == weftSuccess && ok;
      if (!ok) err = std::string("group: ") + weftGetLastError();
      (void)cudaStreamSynchronize(s);
      if (Status a = comms[static_cast<std::size_t>(r)].asyncError(); !a) err = a.toString();
      std::vector<float> got(count), gotSelf(count);
      (void)cudaMemcpy(got.data(), out, count * sizeof(float), cudaMemcpyDeviceToHost);
      (void)cudaMemcpy(gotSelf.data(), self, count * sizeof(float), cudaMemcpyDeviceToHost);
      if (err.empty() && got != pattern(count, prev, 1))
        err = "ring exchange of " + std::to_string(count) + " floats: wrong data";
      if (err.empty() && gotSelf != mine)
        err = "send to itself of " + std::to_string(count) + " floats: wrong data";
      (void)cudaFreeAsync(in, s);
      (void)cudaFreeAsync(out, s);
      (void)cudaFreeAsync(self, s);
      if (!err.empty()) return;
    }
    // All-to-all-v: rank r sends (r + q) % 3 * 1000 + q elements to q.
    const auto N = static_cast<std::size_t>(n);
    std::vector<std::size_t> sc(N), sd(N), rc(N), rd(N);
    std::size_t st = 0, rt = 0;
    for (std::size_t q = 0; q < N; ++q) {
      sc[q] = (static_cast<std::size_t>(r) + q) % 3 * 1000 + q;
      rc[q] = (q + static_cast<std::size_t>(r)) % 3 * 1000 + static_cast<std::size_t>(r);
      sd[q] = st;
      rd[q] = rt;
      st += sc[q];
      rt += rc[q];
    }
    float *in = nullptr, *out = nullptr;
    (void)cudaMallocAsync(&in, st * sizeof(float) + 4, s);
    (void)cudaMallocAsync(&out, rt * sizeof(float) + 4, s);
    const std::vector<float> mine = pattern(st, r, 2);
    (void)cudaMemcpyAsync(in, mine.data(), st * sizeof(float), cudaMemcpyHostToDevice, s);
    if (weftAllToAllv(in, sc.data(), sd.data(), out, rc.data(), rd.data(), weftFloat32, h, s) !=
        weftSuccess)
      err = std::string("all-to-all-v: ") + weftGetLastError();
    (void)cudaStreamSynchronize(s);
    std::vector<float> got(rt);
    (void)cudaMemcpy(got.data(), out, rt * sizeof(float), cudaMemcpyDeviceToHost);
    for (std::size_t q = 0; err.empty() && q < N; ++q) {
      // What q sent this rank: its block for r, from its own input.
      std::size_t off = 0;
      for (std::size_t k = 0; k < static_cast<std::size_t>(r); ++k) off += (q + k) % 3 * 1000 + k;
      const std::vector<float> theirs = pattern(off + rc[q], static_cast<int>(q), 2);
      for (std::size_t i = 0; i < rc[q]; ++i) {
        if (got[rd[q] + i] != theirs[off + i]) {
          err = "all-to-all-v from rank " + std::to_string(q) + " element " + std::to_string(i);
          break;
        }
      }
    }
    (void)cudaFreeAsync(in, s);
    (void)cudaFreeAsync(out, s);
    (void)cudaStreamSynchronize(s);
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[static_cast<std::size_t>(r)], "") << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Ranks, GpuP2p, ::testing::Values(1, 2, 3, 4, 8),
                         [](const auto& p) { return std::to_string(p.param) + "ranks"; });

// ---- ranks as processes sharing the GPU --------------------------------------------------

class GpuProcesses : public ::testing::TestWithParam<int> {
 protected:
  // Forks n ranks, each its own process (CUDA IPC between them), that run `cases` in order (the
  // k-th with seed firstSeed + k) and check their own output; `label` prefixes what fails.
  // Returns each rank's exit code; the forked pids in `pids`.
  static std::vector<int> runForked(int n, const std::vector<Case>& cases, std::uint64_t firstSeed,
                                    const std::string& label, std::vector<pid_t>* pids) {
    // One rank per process needs no extra hardware queues, and under MPS all clients' queues
    // come from one pool: at 32 each only 3 processes got a GPU on the H200 (cudaSetDevice: out
    // of memory in the 4th). The parent has not started CUDA (SKIP_UNLESS_FORKABLE).
    if (kSetHardwareQueues) unsetenv("CUDA_DEVICE_MAX_CONNECTIONS");
    struct Restore {
      ~Restore() {
        if (kSetHardwareQueues) setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 1);
      }
    } restore;
    return forkRanks(
        n,
        [&](int r, Comm& comm) {
          if (cudaSetDevice(spreadDevice(r)) != cudaSuccess) return 3;
          const Streams streams(n, r, true);
          const DeviceMemory mem = deviceMemory(streams);
          std::vector<Comm> mine;
          mine.push_back(std::move(comm));
          int bad = 0;
          std::uint64_t seed = firstSeed;
          for (const Case& c : cases) {
            const std::string err = runCase(mine, c, seed++, n, r, &mem);
            if (!err.empty()) {
              std::fprintf(stderr, "rank %d: %s%s: %s\n", r, label.c_str(), describe(c, n).c_str(),
                           err.c_str());
              ++bad;
            }
          }
          if (mine.front().summary().find("peer(s) in other processes") == std::string::npos) ++bad;
          comm = std::move(mine.front());
          return bad == 0 ? 0 : 1;
        },
        pids, std::chrono::seconds(600));
  }
};

// Every collective, the four dtypes the GPU path serves most, as the tuner picks.
TEST_P(GpuProcesses, CollectivesAcrossProcesses) {
  SKIP_UNLESS_FORKABLE();
  const int n = GetParam();
  const std::uint64_t first = 11;
  std::uint64_t seed = first;
  std::vector<Case> cases;
  for (Collective coll : kCollectives) {
    for (DataType type : {DataType::f32, DataType::bf16, DataType::f16, DataType::f8e4m3}) {
      for (std::size_t count : {1ul, 4099ul, 300001ul}) {
        for (bool inPlace : {false, true}) {
          const int root = static_cast<int>(seed++ % static_cast<std::uint64_t>(n));
          const RedOp op = type == DataType::f16 ? RedOp::avg : RedOp::sum;
          cases.push_back({coll, type, isReduction(coll) ? op : RedOp::sum, count, inPlace, root});
        }
      }
    }
  }
  std::vector<pid_t> pids;
  const std::vector<int> codes = runForked(n, cases, first, "", &pids);
  for (std::size_t r = 0; r < codes.size(); ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
  EXPECT_EQ(segmentsOf(pids), 0);
}

// Every algorithm and protocol forced between processes (a fork per pair, WEFT_ALGO and
// WEFT_PROTO inherited): the FIFOs mapped with CUDA IPC rather than shared in one process. The
// threads' cases, sizes past 4099 elements in f32 only. Slow when the processes' kernels
// time-slice: scripts/gpu-check.sh runs it under MPS only.
TEST_P(GpuProcesses, EveryAlgorithmAndProtocolForced) {
  SKIP_UNLESS_FORKABLE();
  const int n = GetParam();
  std::uint64_t first = 13;
  for (const algo::Algorithm* a : algo::algorithms()) {
    std::uint64_t seed = first;
    const std::vector<Case> cases = forcedCases(*a, n, seed, {DataType::f32});
    if (cases.empty()) continue;
    for (const char* proto : {"ll", "simple"}) {
      ScopedEnv algoEnv("WEFT_ALGO", std::string(a->name()));
      ScopedEnv protoEnv("WEFT_PROTO", proto);
      const std::string pair = std::string(a->name()) + "/" + proto;
      if (!forcedWanted(pair)) continue;
      std::vector<pid_t> pids;
      const std::vector<int> codes = runForked(n, cases, first, pair + " ", &pids);
      for (std::size_t r = 0; r < codes.size(); ++r)
        EXPECT_EQ(codes[r], 0) << pair << ", rank " << r;
      EXPECT_EQ(segmentsOf(pids), 0);
    }
    first += 1000;
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, GpuProcesses, ::testing::Values(2, 3, 4, 8),
                         [](const auto& p) { return std::to_string(p.param) + "ranks"; });

}  // namespace
}  // namespace weft::test
