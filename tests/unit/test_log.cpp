// The log: NCCL_DEBUG's levels in any case, subsystems with ^, the file with %h and %p, the
// "host:pid:tid [rank] weft LEVEL" prefix, warnings whatever the subsystems.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "src/core/log.hpp"

namespace weft::log {
namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(Log, LevelsParseInAnyCase) {
  EXPECT_EQ(*parseLevel("info"), Level::info);
  EXPECT_EQ(*parseLevel("Warn"), Level::warn);
  EXPECT_EQ(*parseLevel("TRACE"), Level::trace);
  EXPECT_EQ(*parseLevel("version"), Level::version);
  EXPECT_EQ(*parseLevel(""), Level::none);
  EXPECT_FALSE(parseLevel("LOUD").isOk());
}

TEST(Log, SubsystemsParseWithExclusion) {
  EXPECT_EQ(*parseSubsys("INIT,coll"), kInit | kColl);
  EXPECT_EQ(*parseSubsys("ALL"), kAll);
  EXPECT_EQ(*parseSubsys("^NET"), ~static_cast<std::uint32_t>(kNet));
  EXPECT_EQ(*parseSubsys("PROXY"), 1u << 10);  // NCCL's, accepted though weft logs none there
  auto bad = parseSubsys("INIT,NOPE");
  ASSERT_FALSE(bad.isOk());
  EXPECT_NE(bad.status().message().find("NOPE"), std::string::npos);
}

TEST(Log, LinesGoToTheFileWithThePrefixAndOnlyTheSubsystemsAsked) {
  const std::string pattern = ::testing::TempDir() + "weft-log-%h-%p.txt";
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  std::string shortHost = host;
  shortHost = shortHost.substr(0, shortHost.find('.'));
  const std::string path =
      ::testing::TempDir() + "weft-log-" + shortHost + "-" + std::to_string(getpid()) + ".txt";
  setenv("NCCL_DEBUG", "info", 1);
  setenv("NCCL_DEBUG_SUBSYS", "^COLL", 1);
  setenv("WEFT_DEBUG_FILE", pattern.c_str(), 1);
  configure();
  {
    RankScope rank(3);
    WEFT_INFO(kInit, "an init line %d", 42);
    WEFT_INFO(kColl, "a call line");  // excluded
    WEFT_WARN(kColl, "a warning");    // warnings print whatever the subsystems
  }
  WEFT_INFO(kTuning, "outside any rank");
  WEFT_TRACE(kInit, "too detailed");  // TRACE is above INFO
  unsetenv("NCCL_DEBUG");
  unsetenv("NCCL_DEBUG_SUBSYS");
  unsetenv("WEFT_DEBUG_FILE");
  configure();  // back to nothing, on stderr; closes the file
  WEFT_WARN(kInit, "not printed");
  const std::string text = slurp(path);
  std::remove(path.c_str());
  const std::string prefix = shortHost + ":" + std::to_string(getpid()) + ":";
  EXPECT_NE(text.find("weft version "), std::string::npos) << text;
  EXPECT_NE(text.find(prefix), std::string::npos) << text;
  EXPECT_NE(text.find(" [3] weft INFO an init line 42\n"), std::string::npos) << text;
  EXPECT_NE(text.find(" [3] weft WARN a warning\n"), std::string::npos) << text;
  EXPECT_NE(text.find(" [-] weft INFO outside any rank\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("a call line"), std::string::npos) << text;
  EXPECT_EQ(text.find("too detailed"), std::string::npos) << text;
  EXPECT_EQ(text.find("not printed"), std::string::npos) << text;
}

}  // namespace
}  // namespace weft::log
