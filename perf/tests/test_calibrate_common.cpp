// The calibration's own helpers: how it hands the ranks' CpuClaims over, to price them at the
// runtime's core share.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "perf/calibrate_common.hpp"

namespace weft::perf::calib {
namespace {

// Ranks hand their CpuClaims over as lines: namespaces of one machine share its boot id, so eight
// ranks on a 2-core machine have a quarter of a core each, whatever hosts they claim.
TEST(CalibrateCommon, TheFewestCoresARankHas) {
  CpuClaim mine;
  mine.machineId = 0xfeedULL;
  mine.cpus[0] = 0b11;
  mine.cpus[15] = 0x8000'0000'0000'0001ULL;
  const CpuClaim back = claimOf(claimLine(mine));
  EXPECT_EQ(back.machineId, mine.machineId);
  for (std::size_t w = 0; w < 16; ++w) EXPECT_EQ(back.cpus[w], mine.cpus[w]) << w;
  CpuClaim two;
  two.machineId = 7;
  two.cpus[0] = 0b11;
  const std::vector<CpuClaim> eight(8, claimOf(claimLine(two)));
  EXPECT_EQ(fewestCores(eight), 0.25);
  const std::vector<CpuClaim> alone(1, claimOf(claimLine(two)));
  EXPECT_EQ(fewestCores(alone), 2);  // the runtime's share, not capped: the graph caps it at 1
}

}  // namespace
}  // namespace weft::perf::calib
