// The cuda_ipc inbox layout, checked without a GPU: every region of every (channel, peer) lies
// inside the inbox, aligned, and no two overlap, for the shapes the runtime uses.
#include <gtest/gtest.h>

#include <algorithm>
#include <utility>
#include <vector>

#if WEFT_TEST_CUDA_IPC
#include "src/transport/cuda_ipc.hpp"

namespace weft::transport {
namespace {

TEST(CudaIpcLayout, RegionsAreAlignedDisjointAndInside) {
  for (int n : {1, 2, 3, 8, 17}) {
    for (int channels : {1, 2, 16, 33, 64}) {
      CudaIpcGeometry g;
      g.nranks = n;
      g.channels = channels;
      std::vector<std::pair<std::size_t, std::size_t>> regions;  // [begin, end)
      regions.emplace_back(0, 256);                              // the abort word's page part
      const std::size_t data = static_cast<std::size_t>(g.slots) * (g.slotBytes + 2 * g.llPayload);
      for (int c = 0; c < channels; ++c) {
        for (int q = 0; q < n; ++q) {
          EXPECT_EQ(g.controlOffset(c, q) % 64, 0u);
          regions.emplace_back(g.controlOffset(c, q), g.controlOffset(c, q) + 256);
          EXPECT_EQ(g.dataOffset(c, q) % 16, 0u);
          regions.emplace_back(g.dataOffset(c, q), g.dataOffset(c, q) + data);
        }
      }
      const std::size_t staging = static_cast<std::size_t>(channels) * (n + 1) * g.llPayload;
      regions.emplace_back(g.stagingOffset(), g.stagingOffset() + staging);
      EXPECT_EQ(g.directOffset() % 4096, 0u);
      regions.emplace_back(g.directOffset(),
                           g.directOffset() + 4096 +
                               2 * std::size_t{CudaIpcGeometry::kDirectBlocks} * g.directSlabBytes);
      // The ll inbox: two parities of every sender's lines (twice their data), to 16 ranks.
      const std::size_t ll =
          n <= CudaIpcGeometry::kDirectLlRanks
              ? 2 * static_cast<std::size_t>(n) * 2 * CudaIpcGeometry::kDirectLlBytes
              : 0;
      EXPECT_EQ(g.directLlInboxBytes(), ll) << n << " ranks";
      EXPECT_EQ(g.directLlOffset() % 16, 0u);
      if (ll > 0) regions.emplace_back(g.directLlOffset(), g.directLlOffset() + ll);
      std::sort(regions.begin(), regions.end());
      for (std::size_t i = 1; i < regions.size(); ++i)
        EXPECT_LE(regions[i - 1].second, regions[i].first) << n << " ranks, " << channels;
      EXPECT_LE(regions.back().second, g.inboxBytes()) << n << " ranks, " << channels;
    }
  }
}

}  // namespace
}  // namespace weft::transport
#endif
