// The harness's own traffic between ranks (combined times, wrong counts, ids, rank lines), and
// the extra communicators it makes with some variables of the environment set (--algos forces
// WEFT_ALGO, --calibrate sets WEFT_PROTO and WEFT_TUNING_FILE). It never runs inside a timed loop.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "perf/bench.hpp"
#include "weft/status.hpp"
#include "weft/weft.h"
#include "weft/weft.hpp"

namespace weft::perf {

class Control {
 public:
  Control(weftComm_t comm, int nranks) : comm_(comm), nranks_(nranks) {}

  // A time as -a asks: 0 rank 0's, 1 the mean, 2 the minimum, 3 the maximum over ranks.
  Result<double> combine(double value, int average);
  // Rank `root`'s value, on every rank.
  Result<double> from(int root, double value);
  Result<std::int64_t> sum(std::int64_t value);
  Status barrier();
  // Rank 0's `bytes` to every rank.
  Status broadcast(void* bytes, std::size_t n);
  // Every rank's line, in rank order.
  Result<std::vector<std::string>> gather(const std::string& line);

 private:
  weftComm_t comm_;
  int nranks_;
};

// A variable's value while a communicator is made; nothing unsets it for that time.
using EnvironmentSetting = std::pair<std::string, std::optional<std::string>>;

std::optional<std::string> environment(const char* name);
void setEnvironment(const char* name, const std::optional<std::string>& value);

// A new communicator of every rank, created while `settings` hold in this process (the runtime
// reads WEFT_ALGO, WEFT_PROTO and WEFT_TUNING_FILE when a communicator is created); the variables
// are restored afterwards. Every rank calls it with the same settings; `control` hands rank 0's
// new id out. Environment writes race with reads in other threads, so thread 0 of each process
// writes while the process's other ranks wait at its barrier.
Result<Comm> joinWithEnvironment(ProcessContext& context, int thread, int rank, int nranks,
                                 Control& control, const std::vector<EnvironmentSetting>& settings);

}  // namespace weft::perf
