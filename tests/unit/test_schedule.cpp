#include <gtest/gtest.h>

#include "algorithms/algorithm.hpp"
#include "algorithms/patterns.hpp"
#include "algorithms/schedule.hpp"
#include "algorithms/verifier.hpp"

namespace weft::algo {
namespace {

using enum Buf;

TEST(BlockList, FoldsConstantStridesIntoOneSpan) {
  BlockList l;
  for (std::uint32_t b : {3u, 5u, 7u, 9u}) l.add(input, b);
  ASSERT_EQ(l.spans().size(), 1u);
  EXPECT_EQ(l.spans()[0], (Span{input, 3, 4, 2}));
  EXPECT_EQ(l.size(), 4u);
}

TEST(BlockList, FoldsDescendingRuns) {
  BlockList l;
  for (std::uint32_t b : {4u, 3u, 2u, 1u, 0u}) l.add(output, b);
  ASSERT_EQ(l.spans().size(), 1u);
  EXPECT_EQ(l.spans()[0].stride, -1);
  EXPECT_EQ(l.spans()[0].last(), 0u);
}

TEST(BlockList, StartsANewSpanOnBufferOrStrideChange) {
  BlockList l;
  l.add(input, 0).add(input, 1).add(input, 5).add(scratch, 6).addRange(scratch, 7, 3);
  ASSERT_EQ(l.spans().size(), 3u);
  EXPECT_EQ(l.spans()[0], (Span{input, 0, 2, 1}));
  EXPECT_EQ(l.spans()[1], (Span{input, 5, 1, 1}));
  EXPECT_EQ(l.spans()[2], (Span{scratch, 6, 4, 1}));
  EXPECT_EQ(l.size(), 7u);
}

TEST(Program, StoresPeersAndSpansInPools) {
  Program p;
  p.recvReduceSend({1, 2}, range(input, 0, 2), {3});
  p.recv(3, BlockList(output, 1));
  ASSERT_EQ(p.steps().size(), 2u);
  const Step& s = p.steps()[0];
  EXPECT_EQ(s.kind, StepKind::recvReduceSend);
  EXPECT_EQ(std::vector<int>(p.recvPeers(s).begin(), p.recvPeers(s).end()),
            (std::vector<int>{1, 2}));
  EXPECT_EQ(p.sendPeers(s)[0], 3);
  EXPECT_EQ(p.blocks(s), 2u);
  EXPECT_EQ(p.blocks(p.steps()[1]), 1u);
  EXPECT_EQ(p.dst(p.steps()[1])[0].buf, output);
}

TEST(Schedule, SegmentsFollowTheCollective) {
  EXPECT_EQ(segments(Collective::allGather, 8).output, 8u);
  EXPECT_EQ(segments(Collective::allGather, 8).input, 1u);
  EXPECT_EQ(segments(Collective::reduceScatter, 8).input, 8u);
  EXPECT_EQ(segments(Collective::allToAll, 8).message(), 8u);
  EXPECT_EQ(segments(Collective::allReduce, 8).message(), 1u);
}

TEST(Schedule, SplitChannelsGivesEachCopyItsOwnPart) {
  const Schedule base = *ringAlgorithm().build(Collective::allReduce, 5);
  const Schedule split = splitChannels(base, 3);
  EXPECT_EQ(split.partsPerBlock, 3u);
  ASSERT_EQ(split.channels.size(), 3u);
  for (std::uint32_t c = 0; c < 3; ++c) EXPECT_EQ(split.channels[c].part, c);
  EXPECT_TRUE(verify(split).ok());
  // Bytes per rank do not change with channels: each channel moves a third of every block.
  EXPECT_DOUBLE_EQ(verify(split).maxBytes, verify(base).maxBytes);
}

TEST(Schedule, DescribeListsOneRanksSteps) {
  const Schedule s = *ringAlgorithm().build(Collective::allReduce, 4);
  const std::string text = describe(s, 1);
  EXPECT_NE(text.find("send src in[1] to 2"), std::string::npos) << text;
  EXPECT_NE(text.find("recvReduceCopySend from 0 src in[2] dst out[2] to 2"), std::string::npos)
      << text;
  EXPECT_NE(text.find("7 steps"), std::string::npos) << text;
}

TEST(Patterns, BinaryTreeIsATreeWithOddLeaves) {
  for (int n = 1; n <= 200; ++n) {
    const auto tree = binaryTree(n);
    int roots = 0;
    for (int p = 0; p < n; ++p) {
      const TreeNode& node = tree[static_cast<std::size_t>(p)];
      EXPECT_LE(node.children.size(), 2u) << "n=" << n << " p=" << p;
      if (node.parent < 0) ++roots;
      if (p > 0) {
        EXPECT_EQ(node.children.empty(), p % 2 == 1) << "n=" << n << " p=" << p;
      }
      // Walking up always reaches the root: no cycles.
      int hops = 0;
      for (int q = p; q != 0 && hops <= n; q = tree[static_cast<std::size_t>(q)].parent) ++hops;
      EXPECT_LE(hops, n);
    }
    EXPECT_EQ(roots, 1);
    if (n > 1) {
      EXPECT_EQ(tree[0].children.size(), 1u);
    }
  }
}

TEST(Patterns, Arithmetic) {
  EXPECT_EQ(mod(-1, 5), 4);
  EXPECT_EQ(mod(7, 5), 2);
  EXPECT_EQ(pow2Floor(1000), 512u);
  EXPECT_EQ(pow2Floor(1), 1u);
  EXPECT_EQ(ceilLog2(1), 0);
  EXPECT_EQ(ceilLog2(2), 1);
  EXPECT_EQ(ceilLog2(5), 3);
  EXPECT_EQ(ceilLog2(1024), 10);
}

}  // namespace
}  // namespace weft::algo
