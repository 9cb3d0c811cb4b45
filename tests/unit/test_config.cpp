// The settings' table: docs/configuration.md's tables are its own (scripts/update-config-docs.sh),
// every bad value is an error naming its variable, former and NCCL names are read, and ranks that
// set a setting every rank must agree on differently fail at init, naming it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "src/bootstrap/bootstrap.hpp"
#include "src/core/communicator.hpp"
#include "src/core/config.hpp"
#include "temp_file.hpp"

namespace weft {
namespace {

std::string readFile(const std::string& relative) {
  std::ifstream in(std::string(WEFT_SOURCE_DIR) + "/" + relative);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(Settings, TheDocumentedTablesAreTheTablesOwn) {
  const std::string doc = readFile("docs/configuration.md");
  for (Audience a : {Audience::user, Audience::tuning, Audience::diagnostic}) {
    EXPECT_NE(doc.find(settingsMarkdown(a)), std::string::npos)
        << "docs/configuration.md lacks weft-config --markdown " << static_cast<int>(a);
  }
  // A user's table, short: about ten settings (issue: half of the 37 rows it had).
  int users = 0;
  for (const SettingDoc& d : settingsTable()) users += d.audience == Audience::user ? 1 : 0;
  EXPECT_LE(users, 18);
}

// The README is the user's first page: short, its example the one the tests build and run, its
// settings in docs/configuration.md.
TEST(Readme, IsAQuickstartWithTheExampleVerbatim) {
  const std::string readme = readFile("README.md");
  const auto lines = std::count(readme.begin(), readme.end(), '\n');
  EXPECT_LE(lines, 150) << "README.md grew to " << lines << " lines; move detail to docs/";
  const std::string example = readFile("examples/allreduce_threads.cpp");
  ASSERT_FALSE(example.empty());
  EXPECT_NE(readme.find("```cpp\n" + example + "```"), std::string::npos)
      << "README.md's first example is not examples/allreduce_threads.cpp verbatim";
  for (const char* link : {"docs/configuration.md", "docs/perf.md", "docs/design.md",
                           "docs/algorithms.md", "find_package(weft", "pkg-config"}) {
    EXPECT_NE(readme.find(link), std::string::npos) << "README.md lacks " << link;
  }
}

TEST(Settings, EveryBadValueIsAnErrorNamingItsVariable) {
  for (const SettingDoc& d : settingsTable()) {
    std::string bad;
    if (d.kind == "text") continue;  // any text is a value
    bad = d.kind == "auto, shm, ucx" ? "verbs" : "many";
    setenv(d.name.c_str(), bad.c_str(), 1);
    auto c = Config::fromEnvironment();
    unsetenv(d.name.c_str());
    ASSERT_FALSE(c.isOk()) << d.name << "=" << bad;
    EXPECT_EQ(c.status().code(), Code::invalidArgument) << d.name;
    EXPECT_NE(c.status().message().find(d.name + "=" + bad), std::string::npos)
        << c.status().message();
  }
  // Out of range, with the range as people write it.
  setenv("WEFT_HOST_CHANNELS", "17", 1);
  auto c = Config::fromEnvironment();
  unsetenv("WEFT_HOST_CHANNELS");
  ASSERT_FALSE(c.isOk());
  EXPECT_NE(c.status().message().find("from 2 to 16"), std::string::npos) << c.status().message();
}

TEST(Settings, FormerAndNcclNamesAreReadWhereWeftsAreUnset) {
  setenv("WEFT_MAX_CHANNELS", "4", 1);
  setenv("NCCL_DEBUG", "INFO", 1);
  auto c = Config::fromEnvironment();
  ASSERT_TRUE(c.isOk()) << c.status().toString();
  EXPECT_EQ(c->maxChannels, 4);
  setenv("NCCL_DEBUG", "LOUD", 1);
  EXPECT_NE(Config::fromEnvironment().status().message().find("NCCL_DEBUG=LOUD: expected"),
            std::string::npos);
  setenv("NCCL_DEBUG", "info", 1);  // any case, as NCCL reads it
  setenv("WEFT_HOST_CHANNELS", "8", 1);
  c = Config::fromEnvironment();
  ASSERT_TRUE(c.isOk());
  EXPECT_EQ(c->maxChannels, 8);
  // A bad former name is named as the user wrote it.
  unsetenv("WEFT_HOST_CHANNELS");
  setenv("WEFT_MAX_CHANNELS", "1", 1);
  c = Config::fromEnvironment();
  ASSERT_FALSE(c.isOk());
  EXPECT_NE(c.status().message().find("WEFT_MAX_CHANNELS=1"), std::string::npos);
  unsetenv("WEFT_MAX_CHANNELS");
  unsetenv("NCCL_DEBUG");
  // Settings every rank must agree on are recorded as set.
  setenv("WEFT_GPU_DIRECT", "4", 1);
  c = Config::fromEnvironment();
  unsetenv("WEFT_GPU_DIRECT");
  ASSERT_TRUE(c.isOk());
  EXPECT_NE(c->agreed.find("WEFT_GPU_DIRECT=4\n"), std::string::npos) << c->agreed;
}

TEST(Settings, TheTuningFileHoldsTheTuningSettingsAndTheEnvironmentWins) {
  const std::string file = test::tempFileWith(
      R"({"settings": {"gpu_ll_blocks": 64, "host_slot_bytes": 262144, "host_direct": "0"}})");
  setenv("WEFT_TUNING_FILE", file.c_str(), 1);
  auto c = Config::fromEnvironment();
  ASSERT_TRUE(c.isOk()) << c.status().toString();
  EXPECT_EQ(c->gpuLlBlocks, 64);
  EXPECT_EQ(c->fifoSlotBytes, 262144u);
  EXPECT_EQ(c->hostDirect, 0);
  setenv("WEFT_GPU_LL_BLOCKS", "32", 1);
  c = Config::fromEnvironment();
  unsetenv("WEFT_GPU_LL_BLOCKS");
  ASSERT_TRUE(c.isOk());
  EXPECT_EQ(c->gpuLlBlocks, 32);
  // A bad value names the file and the key; a key that is no tuning setting is refused.
  for (const auto& [text, expect] : std::vector<std::pair<std::string, std::string>>{
           {R"({"settings": {"gpu_ll_blocks": 0}})", "settings.gpu_ll_blocks=0"},
           {R"({"settings": {"timeout_s": 5}})", "settings.timeout_s: not a tuning setting"},
           {R"({"settings": {"host_small_bytes": 5}})", "not a tuning setting"}}) {
    const std::string bad = test::tempFileWith(text);
    setenv("WEFT_TUNING_FILE", bad.c_str(), 1);
    auto e = Config::fromEnvironment();
    ASSERT_FALSE(e.isOk()) << text;
    EXPECT_NE(e.status().message().find(bad), std::string::npos) << e.status().message();
    EXPECT_NE(e.status().message().find(expect), std::string::npos) << e.status().message();
    std::remove(bad.c_str());
  }
  unsetenv("WEFT_TUNING_FILE");
  std::remove(file.c_str());
}

TEST(Settings, RanksSettingAnAgreedSettingDifferentlyFailAtInitNamingIt) {
  boot::BootstrapOptions bo;
  bo.timeoutSeconds = 30;
  auto boots = boot::makeInProcess(3, bo);
  ASSERT_TRUE(boots.isOk());
  std::vector<Status> got(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      Config config;
      config.agreed = r == 2 ? "WEFT_GPU_DIRECT=8\nWEFT_TRANSPORT=auto\n"
                             : "WEFT_GPU_DIRECT=4\nWEFT_TRANSPORT=auto\n";
      auto comm = Communicator::create(std::move((*boots)[static_cast<std::size_t>(r)]), config);
      got[static_cast<std::size_t>(r)] = comm.status();
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < 3; ++r) {
    const Status& s = got[static_cast<std::size_t>(r)];
    EXPECT_EQ(s.code(), Code::invalidUsage) << "rank " << r << ": " << s.toString();
    EXPECT_NE(s.message().find("rank 2 sets WEFT_GPU_DIRECT=8, rank 0 WEFT_GPU_DIRECT=4"),
              std::string::npos)
        << s.message();
  }
}

}  // namespace
}  // namespace weft
