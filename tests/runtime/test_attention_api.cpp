// Ring attention's C API where no GPU takes it (as on CI): the description checked before
// anything runs, host buffers refused, the workspace answered from the shape alone, and the
// zigzag shares of packed sequences. tests/gpu/test_gpu_ring.cpp runs the calls on a GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tests/runtime/harness.hpp"
#include "weft/weft.h"

namespace weft::test {
namespace {

void expectRefused(weftResult_t got, const char* needle) {
  EXPECT_EQ(got, weftInvalidArgument) << needle;
  EXPECT_NE(std::string(weftGetLastError()).find(needle), std::string::npos) << weftGetLastError();
}

TEST(AttentionApi, BadCallsAreRefusedAndChangeNothing) {
  std::vector<weftComm_t> comms(2);
  ASSERT_EQ(weftCommInitAll(comms.data(), 2), weftSuccess) << weftGetLastError();
  onEveryRank(2, [&](int r) {
    weftComm_t comm = comms[static_cast<std::size_t>(r)];
    std::vector<std::uint16_t> q(64 * 4 * 128), kv(64 * 2 * 128), out(q.size(), 0x7fc0);
    std::vector<float> lse(64 * 4);
    const std::vector<std::int32_t> cu{0, 64};
    const std::vector<std::uint16_t> before = out;
    weftAttention a{q.data(), kv.data(), kv.data(), out.data(), lse.data(),   cu.data(), 1,   64,
                    64,       4,         2,         128,        weftBfloat16, 1,         0.0f};
    expectRefused(weftRingAttention(nullptr, nullptr, 0, comm, nullptr), "attention is NULL");
    weftAttention bad = a;
    bad.headDim = 96;
    expectRefused(weftRingAttention(&bad, nullptr, 0, comm, nullptr), "head dim 96");
    bad = a;
    bad.kvHeads = 3;
    expectRefused(weftRingAttention(&bad, nullptr, 0, comm, nullptr), "do not group");
    bad = a;
    bad.datatype = weftFloat32;
    expectRefused(weftRingAttention(&bad, nullptr, 0, comm, nullptr), "f32");
    bad = a;
    bad.causal = 2;
    expectRefused(weftRingAttention(&bad, nullptr, 0, comm, nullptr), "causal");
    bad = a;
    bad.softmaxScale = -1;
    expectRefused(weftRingAttention(&bad, nullptr, 0, comm, nullptr), "softmaxScale");
    bad = a;
    bad.k = q.data() + 1;
    expectRefused(weftRingAttention(&bad, nullptr, 0, comm, nullptr), "16-byte aligned");
    bad = a;
    bad.q = nullptr;
    expectRefused(weftRingAttention(&bad, nullptr, 0, comm, nullptr), "NULL");
    std::size_t need = 0;
    ASSERT_EQ(weftRingAttentionWorkspaceSize(&a, comm, &need), weftSuccess) << weftGetLastError();
    // Two K/V blocks of the rank's tokens and the f32 output.
    EXPECT_GE(need, 2 * 2 * kv.size() * 2 + q.size() * 4);
    expectRefused(weftRingAttention(&a, out.data(), need - 1, comm, nullptr), "too small");
    expectRefused(weftRingAttentionWorkspaceSize(&a, comm, nullptr), "bytes is NULL");
    // Host memory is not what the call takes (with or without a GPU here).
    EXPECT_NE(weftRingAttention(&a, nullptr, 0, comm, nullptr), weftSuccess);
    EXPECT_EQ(out, before);
    ASSERT_EQ(weftGroupStart(), weftSuccess);
    EXPECT_EQ(weftRingAttention(&a, nullptr, 0, comm, nullptr), weftInvalidUsage);
    ASSERT_EQ(weftGroupEnd(), weftSuccess);
    // The backward pass: the forward's checks, then its own.
    std::vector<std::uint16_t> dq(q.size()), dkv(kv.size()), dOut(q.size());
    const weftAttentionGrads grads{dOut.data(), dq.data(), dkv.data(), dkv.data()};
    expectRefused(weftRingAttentionBackward(&a, nullptr, nullptr, 0, comm, nullptr),
                  "grads is NULL");
    bad = a;
    bad.headDim = 96;
    expectRefused(weftRingAttentionBackward(&bad, &grads, nullptr, 0, comm, nullptr),
                  "head dim 96");
    weftAttentionGrads badGrads = grads;
    badGrads.dk = nullptr;
    expectRefused(weftRingAttentionBackward(&a, &badGrads, nullptr, 0, comm, nullptr),
                  "must not be NULL");
    badGrads = grads;
    badGrads.dq = reinterpret_cast<std::byte*>(dq.data()) + 2;
    expectRefused(weftRingAttentionBackward(&a, &badGrads, nullptr, 0, comm, nullptr),
                  "16-byte aligned");
    std::size_t backwardNeed = 0;
    ASSERT_EQ(weftRingAttentionBackwardWorkspaceSize(&a, comm, &backwardNeed), weftSuccess)
        << weftGetLastError();
    // dq in f32 and two blocks of k, v with their f32 gradients.
    EXPECT_GE(backwardNeed, q.size() * 4 + 2 * (2 * kv.size() * 2 + 2 * kv.size() * 4));
    expectRefused(
        weftRingAttentionBackward(&a, &grads, out.data(), backwardNeed - 1, comm, nullptr),
        "too small");
    EXPECT_NE(weftRingAttentionBackward(&a, &grads, nullptr, 0, comm, nullptr), weftSuccess);
    EXPECT_EQ(out, before);
  });
  for (weftComm_t c : comms) EXPECT_EQ(weftCommDestroy(c), weftSuccess);
}

TEST(AttentionApi, ZigzagSharesOfPackedSequences) {
  const std::vector<std::int32_t> cu{0, 12, 12, 24};
  std::vector<std::int32_t> local(4), positions(12);
  ASSERT_EQ(weftZigzagLocal(cu.data(), 3, 3, 2, local.data(), positions.data()), weftSuccess);
  EXPECT_EQ(local, (std::vector<std::int32_t>{0, 4, 4, 8}));
  positions.resize(8);
  EXPECT_EQ(positions, (std::vector<std::int32_t>{4, 5, 6, 7, 4, 5, 6, 7}));
  expectRefused(weftZigzagLocal(cu.data(), 3, 5, 0, local.data(), nullptr), "2 x 5");
  expectRefused(weftZigzagLocal(nullptr, 3, 2, 0, local.data(), nullptr), "NULL");
}

}  // namespace
}  // namespace weft::test
