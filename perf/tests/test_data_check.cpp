// weft-perf's check against the library's own arithmetic: inputs reduced with the CPU
// executor's reduce() in several orders (as different algorithms would) must count 0 wrong;
// one changed element must count 1. Plus nccl-tests' size conventions and the size parser.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "perf/collective.hpp"
#include "perf/data_check.hpp"
#include "perf/options.hpp"
#include "src/exec/host_reduce.hpp"

namespace weft::perf {
namespace {

constexpr std::size_t kCount = 257;

// Rank inputs, reduced in `order` (a permutation of the ranks) with the library's reduce().
std::vector<std::byte> reduceInOrder(const DataCheck& data, DataType type, RedOp op, int nranks,
                                     const std::vector<int>& order) {
  const std::size_t bytes = kCount * sizeOf(type);
  std::vector<std::byte> acc(bytes), next(bytes);
  data.fill(acc.data(), kCount, order[0], 0);
  for (std::size_t i = 1; i < order.size(); ++i) {
    data.fill(next.data(), kCount, order[i], 0);
    exec::reduce(acc.data(), acc.data(), next.data(), kCount, type, op);
  }
  if (op == RedOp::avg) exec::divide(acc.data(), acc.data(), kCount, type, nranks);
  return acc;
}

// A binary tree's order of combination: pairs, then pairs of pairs (recursive doubling).
std::vector<std::byte> reduceAsTree(const DataCheck& data, DataType type, RedOp op, int nranks) {
  const std::size_t bytes = kCount * sizeOf(type);
  std::vector<std::vector<std::byte>> partial(static_cast<std::size_t>(nranks),
                                              std::vector<std::byte>(bytes));
  for (int r = 0; r < nranks; ++r)
    data.fill(partial[static_cast<std::size_t>(r)].data(), kCount, r, 0);
  for (int step = 1; step < nranks; step *= 2) {
    for (int r = 0; r + step < nranks; r += 2 * step) {
      auto& a = partial[static_cast<std::size_t>(r)];
      exec::reduce(a.data(), a.data(), partial[static_cast<std::size_t>(r + step)].data(), kCount,
                   type, op);
    }
  }
  if (op == RedOp::avg) exec::divide(partial[0].data(), partial[0].data(), kCount, type, nranks);
  return partial[0];
}

class ReducedTest : public testing::TestWithParam<std::tuple<DataType, RedOp, int>> {};

TEST_P(ReducedTest, AnyOrderIsRightAndAChangedElementIsWrong) {
  const auto [type, op, nranks] = GetParam();
  const DataCheck data(type, op, nranks, 42);
  std::vector<int> forward(static_cast<std::size_t>(nranks));
  std::iota(forward.begin(), forward.end(), 0);
  std::vector<int> backward(forward.rbegin(), forward.rend());
  std::vector<int> rotated = forward;
  std::rotate(rotated.begin(), rotated.begin() + nranks / 2, rotated.end());
  const Expect all{Expect::Kind::reduced, 0, kCount, 0, 0};
  for (const auto& out :
       {reduceInOrder(data, type, op, nranks, forward),
        reduceInOrder(data, type, op, nranks, backward),
        reduceInOrder(data, type, op, nranks, rotated), reduceAsTree(data, type, op, nranks)}) {
    EXPECT_EQ(data.wrong(out.data(), all), 0);
    if (data.exact()) {
      // The lowest bit of element 7: a different value in every type.
      auto changed = out;
      changed[7 * sizeOf(type)] ^= std::byte{1};
      EXPECT_EQ(data.wrong(changed.data(), all), 1);
    }
    auto poisoned = out;
    data.poison(poisoned.data() + 3 * sizeOf(type), 2);
    EXPECT_GE(data.wrong(poisoned.data(), all), isFloating(type) ? 2 : 1);
  }
}

constexpr DataType kTypes[] = {DataType::f64,    DataType::f32,    DataType::f16, DataType::bf16,
                               DataType::f8e4m3, DataType::f8e5m2, DataType::i8,  DataType::u8,
                               DataType::i32,    DataType::u32,    DataType::i64, DataType::u64};

INSTANTIATE_TEST_SUITE_P(AllTypesOps, ReducedTest,
                         testing::Combine(testing::ValuesIn(kTypes),
                                          testing::Values(RedOp::sum, RedOp::prod, RedOp::min,
                                                          RedOp::max, RedOp::avg),
                                          testing::Values(1, 2, 3, 5, 8, 17, 40)));

TEST(DataCheck, ExactUnlessTheGridRunsOut) {
  EXPECT_TRUE(DataCheck(DataType::f8e4m3, RedOp::sum, 16, 1).exact());
  EXPECT_FALSE(DataCheck(DataType::f8e4m3, RedOp::sum, 17, 1).exact());
  EXPECT_TRUE(DataCheck(DataType::f8e4m3, RedOp::prod, 1000, 1).exact());
  EXPECT_TRUE(DataCheck(DataType::bf16, RedOp::avg, 256, 1).exact());
  EXPECT_FALSE(DataCheck(DataType::bf16, RedOp::avg, 257, 1).exact());
  EXPECT_TRUE(DataCheck(DataType::f32, RedOp::sum, 4096, 1).exact());
}

TEST(DataCheck, CopiesAreBitExactAndNeverThePoison) {
  for (DataType type : kTypes) {
    const DataCheck data(type, std::nullopt, 4, 7);
    std::vector<std::byte> out(kCount * sizeOf(type)), poison(kCount * sizeOf(type));
    data.fill(out.data(), kCount, 2, 100);
    data.poison(poison.data(), kCount);
    EXPECT_EQ(data.wrong(out.data(), {Expect::Kind::copied, 0, kCount, 2, 100}), 0);
    EXPECT_EQ(data.wrong(out.data(), {Expect::Kind::poisoned, 0, kCount, 0, 0}),
              static_cast<std::int64_t>(kCount));
    EXPECT_EQ(data.wrong(poison.data(), {Expect::Kind::poisoned, 0, kCount, 0, 0}), 0);
    // Another rank's data, or another offset, is wrong almost everywhere.
    EXPECT_GT(data.wrong(out.data(), {Expect::Kind::copied, 0, kCount, 1, 100}),
              static_cast<std::int64_t>(kCount / 2));
  }
}

TEST(Collective, NcclTestsSizeConventions) {
  // allgather, 3 ranks, 1 KiB of float: 256 elements, 85 per rank rounded down to 84 (16 bytes).
  const Layout ag = layoutFor(Collective::allGather, 1024, 4, 3);
  EXPECT_EQ(ag.count, 84u);
  EXPECT_EQ(ag.bytes(4), 1008u);
  EXPECT_DOUBLE_EQ(algBytes(Collective::allGather, ag, 4, 3), 1008.0);
  const Layout a2a = layoutFor(Collective::allToAll, 1 << 20, 2, 8);
  EXPECT_EQ(a2a.count, 65536u);
  EXPECT_EQ(a2a.sendCount, 524288u);
  const Layout ar = layoutFor(Collective::allReduce, 8, 4, 2);
  EXPECT_EQ(ar.count, 2u);
  EXPECT_DOUBLE_EQ(busFactor(Collective::allReduce, 4), 1.5);
  EXPECT_DOUBLE_EQ(busFactor(Collective::reduceScatter, 4), 0.75);
  EXPECT_DOUBLE_EQ(busFactor(Collective::broadcast, 4), 1.0);
  EXPECT_DOUBLE_EQ(busFactor(Collective::sendRecv, 4), 1.0);
}

TEST(Collective, TimedCallsMoveThroughTheBuffersAsNcclTestsDo) {
  // -e 16M, a 1 MB call: sixteen slices, call 17 back in the second.
  const Rotation r = rotationFor(1 << 20, 16 << 20);
  EXPECT_EQ(r.slices, 16u);
  EXPECT_EQ(r.at(0), 0u);
  EXPECT_EQ(r.at(3), 3u << 20);
  EXPECT_EQ(r.at(17), 1u << 20);
  // A size that does not divide -e keeps whole slices inside the buffers.
  const Rotation odd = rotationFor(3000, 10000);
  EXPECT_EQ(odd.slices, 3u);
  EXPECT_LE(odd.at(2) + 3000, 10000u);
  // The largest size, and an empty call, stay at the start.
  EXPECT_EQ(rotationFor(16 << 20, 16 << 20).at(5), 0u);
  EXPECT_EQ(rotationFor(0, 16 << 20).at(5), 0u);
}

TEST(Options, SizesAsNcclTestsParsesThem) {
  EXPECT_EQ(parseSize("8"), 8u);
  EXPECT_EQ(parseSize("1K"), 1024u);
  EXPECT_EQ(parseSize("128M"), 128u << 20);
  EXPECT_EQ(parseSize("1MB"), 1u << 20);
  EXPECT_EQ(parseSize("0.5G"), 512u << 20);
  EXPECT_FALSE(parseSize("8X"));
  EXPECT_FALSE(parseSize("M"));
  Options o;
  o.minBytes = 8;
  o.maxBytes = 1 << 20;
  o.stepFactor = 4;
  EXPECT_EQ(sweepSizes(o).size(), 9u);  // 8, 32, ..., 512K (2M is past the end)
  o.stepFactor = 1;
  o.minBytes = 1000;
  o.maxBytes = 3000;
  o.stepBytes = 1000;
  EXPECT_EQ(sweepSizes(o), (std::vector<std::size_t>{1000, 2000, 3000}));
}

}  // namespace
}  // namespace weft::perf
