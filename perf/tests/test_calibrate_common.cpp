// The calibration's own helpers: the core share it prices the measured ranks at.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "perf/calibrate_common.hpp"

namespace weft::perf::calib {
namespace {

// Ranks report "<machine id> <cores>": namespaces of one machine share its boot id, so eight
// ranks on a 2-core machine have a quarter of a core each, whatever hosts they claim.
TEST(CalibrateCommon, TheFewestCoresARankHas) {
  EXPECT_EQ(fewestCoresOf({"a 2", "a 2", "a 2", "a 2", "a 2", "a 2", "a 2", "a 2"}), 0.25);
  EXPECT_EQ(fewestCoresOf({"a 16", "a 16", "b 2", "b 2", "b 2", "b 2"}), 0.5);
  EXPECT_EQ(fewestCoresOf({"a 16", "a 16"}), 1);  // never above a core
  EXPECT_EQ(fewestCoresOf({"a 4", "a 1"}), 0.5);  // the machine's least count
  EXPECT_EQ(fewestCoresOf({"a b c 3"}), 1);       // the id may hold spaces
}

}  // namespace
}  // namespace weft::perf::calib
