// How a call's elements are cut into blocks, parts and slices (exec::Geometry): every piece
// starts on a 16-byte multiple of its segment, a slice's 16-byte stride in a message never
// outgrows the message, and the cuts cover every element.
#include <gtest/gtest.h>

#include "algorithms/algorithm.hpp"
#include "src/core/sizes.hpp"
#include "src/exec/cpu_executor.hpp"

namespace weft::exec {
namespace {

TEST(Geometry, PiecesStartOnSixteenBytesAndStridesFitTheMessage) {
  for (const char* name : {"ring", "dbtree", "twoshot", "oneshot", "rhd"}) {
    for (int n : {2, 3, 4, 7, 8}) {
      auto s = algo::findAlgorithm(name)->build(Collective::allReduce, n);
      ASSERT_TRUE(s.isOk()) << name << " " << n << ": " << s.status().toString();
      const std::uint32_t maxBlocks = maxStepBlocks(*s);
      for (DataType type : {DataType::f64, DataType::f32, DataType::bf16, DataType::f8e4m3}) {
        const std::size_t es = sizeOf(type), v = 16 / es;
        for (std::size_t count : {std::size_t{1}, std::size_t{33}, std::size_t{300001},
                                  std::size_t{1} << 20, (std::size_t{32} << 20) + 7}) {
          for (std::size_t message : {std::size_t{16} * maxBlocks, std::size_t{4096},
                                      std::size_t{16} * 1024, std::size_t{256} * 1024}) {
            const Geometry g = Geometry::of(*s, count, type, maxBlocks, message);
            const std::string at = std::string(name) + " n=" + std::to_string(n) + " " +
                                   std::string(weft::name(type)) +
                                   " count=" + std::to_string(count) +
                                   " message=" + std::to_string(message);
            EXPECT_EQ(g.blockElems % v, 0u) << at;
            EXPECT_EQ(g.partElems % v, 0u) << at;
            EXPECT_EQ(g.sliceElems % v, 0u) << at;
            EXPECT_LE(roundUp(g.sliceElems * es, 16) * maxBlocks, message) << at;
            EXPECT_GE(g.blockElems * s->blocksPerSegment, count) << at;
            EXPECT_GE(g.partElems * s->partsPerBlock, g.blockElems) << at;
            EXPECT_GE(g.passes * g.sliceElems, g.partElems) << at;
            EXPECT_LT((g.passes - 1) * g.sliceElems, g.partElems) << at;  // no empty pass
          }
        }
      }
    }
  }
  // A 1 MiB part through 256 KiB messages takes four passes, not five.
  auto ring = algo::findAlgorithm("ring")->build(Collective::allReduce, 2);
  ASSERT_TRUE(ring.isOk());
  const std::size_t part = std::size_t{1} << 18;  // floats: 1 MiB
  const Geometry g = Geometry::of(*ring, part * ring->blocksPerSegment * ring->partsPerBlock,
                                  DataType::f32, 1, 256 * 1024);
  EXPECT_EQ(g.partElems, part);
  EXPECT_EQ(g.passes, 4u);
}

}  // namespace
}  // namespace weft::exec
