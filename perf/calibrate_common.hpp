// What both calibrations (calibrate.cpp: the host's constants; calibrate_gpu.cpp: the GPU
// tuner's) share: number formats, a tuning file's opening, the cost model's table indices.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <sstream>
#include <string>
#include <vector>

#include "algorithms/cost_model.hpp"
#include "perf/report.hpp"
#include "src/core/machine.hpp"

namespace weft::perf::calib {

// --gpu's large calls, whose picks the host calibration shows too.
inline constexpr std::size_t kGpuLargeBytes = std::size_t{256} << 20;

// A base latency that the model's other terms already exceed is written as this: a tuning file
// holds only positive numbers.
inline constexpr double kLeastBaseUs = 0.1;

inline constexpr auto kLl = static_cast<std::size_t>(algo::Protocol::ll);
inline constexpr auto kSimple = static_cast<std::size_t>(algo::Protocol::simple);
inline constexpr auto kPcie = static_cast<std::size_t>(algo::LinkClass::pcie);
inline constexpr auto kNet = static_cast<std::size_t>(algo::LinkClass::network);
inline constexpr auto kNvlink = static_cast<std::size_t>(algo::LinkClass::nvlink);

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  const auto mid = v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2);
  std::nth_element(v.begin(), mid, v.end());
  return *mid;
}

inline std::string fixed(double x, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, x);
  return buf;
}

// Four significant digits: what the measurements support.
inline std::string digits(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.4g", x);
  return buf;
}

inline std::string sizeName(std::size_t bytes) {
  if (bytes >= (1u << 20) && bytes % (1u << 20) == 0) return std::to_string(bytes >> 20) + " MiB";
  if (bytes >= (1u << 10) && bytes % (1u << 10) == 0) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " B";
}

inline std::string protoName(std::size_t p) {
  return std::string(algo::name(static_cast<algo::Protocol>(p)));
}

inline std::string hostName() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  return host;
}

// A rank's CpuClaim (src/core/machine.hpp) as a line of hex words for Control::gather, and back:
// the calibration prices its ranks at the runtime's own core share (fewestCores).
inline std::string claimLine(const CpuClaim& c) {
  std::ostringstream out;
  out << std::hex << c.machineId;
  for (std::uint64_t w : c.cpus) out << ' ' << w;
  return out.str();
}

inline CpuClaim claimOf(const std::string& line) {
  CpuClaim c;
  std::istringstream in(line);
  in >> std::hex >> c.machineId;
  for (std::uint64_t& w : c.cpus) in >> w;
  return c;
}

inline std::string utcNow() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// A tuning file's opening: its comment lines, then where and when it was measured ("measured_on":
// host, date, ranks, and `more`, a run of further members each led by a comma), up to the keys.
inline std::string fileHead(const std::vector<std::string>& comment, int nranks,
                            const std::string& more) {
  std::ostringstream j;
  j << "{\n  \"comment\": [";
  for (std::size_t i = 0; i < comment.size(); ++i)
    j << (i ? "," : "") << "\n    " << jsonString(comment[i]);
  j << "\n  ],\n  \"measured_on\": {\"host\": " << jsonString(hostName())
    << ", \"date\": " << jsonString(utcNow()) << ", \"nranks\": " << nranks << more << "},\n";
  return j.str();
}

}  // namespace weft::perf::calib
