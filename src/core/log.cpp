#include "src/core/log.hpp"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <vector>

namespace weft::log {
namespace {

std::atomic<int> gLevel{static_cast<int>(Level::none)};
std::atomic<std::uint32_t> gSubsys{kDefaultSubsys};
std::atomic<bool> gBannerShown{false};
// Whether configure() ran: the first line configures the log wherever it comes from (the NCCL
// interface may fail before any communicator exists). Two threads may both configure: harmless.
std::atomic<bool> gConfigured{false};
thread_local int tRank = -1;

// The file lines go to (stderr unless a debug file is set), and the name it was opened as.
std::mutex gFileMutex;
std::FILE* gFile = nullptr;
std::string gFileName;

struct Name {
  const char* name;
  std::uint32_t bits;
};
// NCCL's subsystems, so any NCCL_DEBUG_SUBSYS a job sets parses; weft logs in some of them.
constexpr Name kSubsystems[] = {{"INIT", kInit},
                                {"COLL", kColl},
                                {"P2P", kP2p},
                                {"SHM", kShm},
                                {"NET", kNet},
                                {"GRAPH", kGraph},
                                {"TUNING", kTuning},
                                {"ENV", kEnv},
                                {"ALLOC", kAlloc},
                                {"CALL", kCall},
                                {"PROXY", 1u << 10},
                                {"NVLS", 1u << 11},
                                {"BOOTSTRAP", kBootstrap},
                                {"REG", kReg},
                                {"PROFILE", 1u << 14},
                                {"RAS", 1u << 15},
                                {"ALL", kAll}};
constexpr const char* kLevelNames[] = {"NONE", "VERSION", "WARN", "INFO", "ABORT", "TRACE"};

bool sameWord(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::toupper(static_cast<unsigned char>(x)) ==
                  std::toupper(static_cast<unsigned char>(y));
         });
}

const char* setting(const char* weftName, const char* ncclName) {
  const char* v = std::getenv(weftName);
  if (v == nullptr || *v == '\0') v = std::getenv(ncclName);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

const std::string& hostName() {
  static const std::string name = [] {
    char buf[256] = "";
    gethostname(buf, sizeof buf - 1);
    std::string s = buf;
    return s.substr(0, s.find('.'));
  }();
  return name;
}

// NCCL_DEBUG_FILE's %h and %p: this host and process.
std::string expandFileName(std::string_view pattern) {
  std::string out;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '%' && i + 1 < pattern.size() &&
        (pattern[i + 1] == 'h' || pattern[i + 1] == 'p')) {
      out += pattern[i + 1] == 'h' ? hostName() : std::to_string(getpid());
      ++i;
    } else {
      out += pattern[i];
    }
  }
  return out;
}

void openFile(const char* pattern) {
  const std::string name = pattern != nullptr ? expandFileName(pattern) : std::string();
  std::lock_guard<std::mutex> lock(gFileMutex);
  if (name == gFileName) return;
  if (gFile != nullptr) std::fclose(gFile);
  gFile = nullptr;
  gFileName = name;
  if (name.empty()) return;
  gFile = std::fopen(name.c_str(), "w");
  if (gFile == nullptr) {
    std::fprintf(stderr, "%s:%d weft WARN cannot open the debug file %s; logging to stderr\n",
                 hostName().c_str(), static_cast<int>(getpid()), name.c_str());
  }
}

void emit(Level level, const char* message) {
  char prefix[320];
  const char* rankText = "-";
  char rankBuf[16];
  if (tRank >= 0) {
    std::snprintf(rankBuf, sizeof rankBuf, "%d", tRank);
    rankText = rankBuf;
  }
  // "weft WARN ...", but the banner reads "weft version 0.1.0".
  std::snprintf(prefix, sizeof prefix, "%s:%d:%ld [%s] weft %s%s", hostName().c_str(),
                static_cast<int>(getpid()), static_cast<long>(syscall(SYS_gettid)), rankText,
                level == Level::version ? "" : kLevelNames[static_cast<int>(level)],
                level == Level::version ? "" : " ");
  std::lock_guard<std::mutex> lock(gFileMutex);
  std::FILE* out = gFile != nullptr ? gFile : stderr;
  std::fputs(prefix, out);
  std::fputs(message, out);
  std::fputc('\n', out);
  std::fflush(out);
}

}  // namespace

Result<Level> parseLevel(std::string_view text) {
  if (text.empty()) return Level::none;
  for (std::size_t i = 0; i < std::size(kLevelNames); ++i) {
    if (sameWord(text, kLevelNames[i])) return static_cast<Level>(i);
  }
  return Status(Code::invalidArgument,
                std::string(text) + ": expected VERSION, WARN, INFO, TRACE, ABORT or NONE");
}

Result<std::uint32_t> parseSubsys(std::string_view text) {
  const bool exclude = !text.empty() && text.front() == '^';
  if (exclude) text.remove_prefix(1);
  std::uint32_t bits = 0;
  while (!text.empty()) {
    const std::size_t comma = text.find(',');
    const std::string_view word = text.substr(0, comma);
    text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
    if (word.empty()) continue;
    const auto* found = std::find_if(std::begin(kSubsystems), std::end(kSubsystems),
                                     [&](const Name& n) { return sameWord(word, n.name); });
    if (found == std::end(kSubsystems))
      return Status(Code::invalidArgument,
                    std::string(word) +
                        ": not a subsystem (INIT, COLL, P2P, SHM, NET, GRAPH, TUNING, ENV, "
                        "ALLOC, CALL, BOOTSTRAP, REG, ALL; ^ before the list excludes)");
    bits |= found->bits;
  }
  return exclude ? ~bits : bits;
}

void configure() {
  const char* level = setting("WEFT_DEBUG", "NCCL_DEBUG");
  const auto l = parseLevel(level != nullptr ? level : "");
  if (l) gLevel.store(static_cast<int>(*l), std::memory_order_relaxed);
  const char* subsys = setting("WEFT_DEBUG_SUBSYS", "NCCL_DEBUG_SUBSYS");
  const auto s = subsys != nullptr ? parseSubsys(subsys) : Result<std::uint32_t>(kDefaultSubsys);
  if (s) gSubsys.store(*s, std::memory_order_relaxed);
  openFile(setting("WEFT_DEBUG_FILE", "NCCL_DEBUG_FILE"));
  if (l && *l >= Level::version && !gBannerShown.exchange(true)) {
    char banner[64];
    std::snprintf(banner, sizeof banner, "version %d.%d.%d", WEFT_VERSION_MAJOR, WEFT_VERSION_MINOR,
                  WEFT_VERSION_PATCH);
    emit(Level::version, banner);
  }
  gConfigured.store(true, std::memory_order_release);
}

bool on(Level level, std::uint32_t subsys) {
  if (!gConfigured.load(std::memory_order_acquire)) configure();
  const int current = gLevel.load(std::memory_order_relaxed);
  if (static_cast<int>(level) > current || level == Level::none) return false;
  // Warnings print whatever the subsystems, as NCCL's do.
  return level <= Level::warn || (subsys & gSubsys.load(std::memory_order_relaxed)) != 0;
}

void write(Level level, std::uint32_t subsys, const char* format, ...) {
  if (!on(level, subsys)) return;
  char small[512];
  va_list args;
  va_start(args, format);
  const int n = std::vsnprintf(small, sizeof small, format, args);
  va_end(args);
  if (n < 0) return;
  if (static_cast<std::size_t>(n) < sizeof small) {
    emit(level, small);
    return;
  }
  std::vector<char> big(static_cast<std::size_t>(n) + 1);
  va_start(args, format);
  std::vsnprintf(big.data(), big.size(), format, args);
  va_end(args);
  emit(level, big.data());
}

RankScope::RankScope(int rank) : previous_(tRank) {
  tRank = rank;
}

RankScope::~RankScope() {
  tRank = previous_;
}

}  // namespace weft::log
