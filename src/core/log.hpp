// weft's log, as NCCL users know NCCL's: a level (WEFT_DEBUG or NCCL_DEBUG: VERSION, WARN, INFO,
// TRACE, case-insensitive), subsystems (WEFT_DEBUG_SUBSYS or NCCL_DEBUG_SUBSYS: INIT,COLL,... or
// ^NET to exclude), a file (WEFT_DEBUG_FILE or NCCL_DEBUG_FILE, %h host, %p pid; stderr
// otherwise), and lines "host:pid:tid [rank] weft LEVEL message". The settings are read again at
// every communicator's creation (configure()), as the NCCL interface's ncclResetDebugInit needs.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>

#include "weft/status.hpp"
#include "weft/weft.h"

namespace weft::log {

enum class Level : int { none = 0, version, warn, info, abort, trace };

// Subsystems, NCCL's names and bits where NCCL has them.
enum Subsys : std::uint32_t {
  kInit = 1u << 0,
  kColl = 1u << 1,
  kP2p = 1u << 2,
  kShm = 1u << 3,
  kNet = 1u << 4,
  kGraph = 1u << 5,
  kTuning = 1u << 6,
  kEnv = 1u << 7,
  kAlloc = 1u << 8,
  kCall = 1u << 9,
  kBootstrap = 1u << 12,
  kReg = 1u << 13,
  kAll = ~0u,
};
// What a level prints without a subsystem setting: NCCL's default.
inline constexpr std::uint32_t kDefaultSubsys = kInit | kBootstrap | kEnv;

// "warn", "INFO", ... (empty: none); an error names the accepted values.
Result<Level> parseLevel(std::string_view text);
// "INIT,COLL", "ALL", "^NET,SHM" (every subsystem but those).
Result<std::uint32_t> parseSubsys(std::string_view text);

// Reads the three settings from the environment (WEFT_ names before NCCL_ ones). Values that do
// not parse are left to the configuration check (Config::fromEnvironment), which fails the init.
// The first time a level of VERSION or more is set, prints the version banner.
void configure();

// Whether a line of `level` in `subsys` would print. Cheap: two relaxed loads.
bool on(Level level, std::uint32_t subsys);

// Prints one line if on(level, subsys); printf's format.
void write(Level level, std::uint32_t subsys, const char* format, ...)
    __attribute__((format(printf, 3, 4)));

// How often a wait that has not ended says so at WARN: a quarter of its timeout, from 0.25 s
// (short test timeouts) to 30 s.
inline double progressSeconds(double timeoutSeconds) {
  const double q = timeoutSeconds / 4;
  return q < 0.25 ? 0.25 : q > 30 ? 30 : q;
}

// A wait's progress lines: one due every progressSeconds of its timeout, counted from when the
// clock was made.
class ProgressClock {
 public:
  explicit ProgressClock(double timeoutSeconds)
      : every_(progressSeconds(timeoutSeconds)), start_(std::chrono::steady_clock::now()) {}
  double waited() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  // Whether a line is due now; if so, the next is due an interval after this one's.
  bool due() {
    const double w = waited();
    if (w < next_) return false;
    next_ = (std::floor(w / every_) + 1) * every_;
    return true;
  }
  double secondsUntilDue() const { return std::max(0.0, next_ - waited()); }

 private:
  double every_;
  std::chrono::steady_clock::time_point start_;
  double next_ = every_;
};

// The rank this thread works for, shown in the prefix ([-] outside any), for a scope.
class RankScope {
 public:
  explicit RankScope(int rank);
  ~RankScope();
  RankScope(const RankScope&) = delete;
  RankScope& operator=(const RankScope&) = delete;

 private:
  int previous_;
};

}  // namespace weft::log

#define WEFT_LOG(level, subsys, ...)                                                    \
  do {                                                                                  \
    if (::weft::log::on(level, subsys)) ::weft::log::write(level, subsys, __VA_ARGS__); \
  } while (0)
#define WEFT_WARN(subsys, ...) WEFT_LOG(::weft::log::Level::warn, subsys, __VA_ARGS__)
#define WEFT_INFO(subsys, ...) WEFT_LOG(::weft::log::Level::info, subsys, __VA_ARGS__)
#define WEFT_TRACE(subsys, ...) WEFT_LOG(::weft::log::Level::trace, subsys, __VA_ARGS__)

// For the NCCL interface (a library of its own, over libweft's C API): one line through this
// log, so both share one file, one prefix and one set of settings. Not part of weft.h.
extern "C" WEFT_API void weftLogLine(int level, unsigned subsys, const char* message);
