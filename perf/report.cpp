#include "perf/report.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace weft::perf {
namespace {

// Extra columns after nccl-tests' thirteen: the plan, then the peer, then each forced algorithm.
constexpr int kPlanWidth = 20;

std::string wrongText(const std::optional<std::int64_t>& wrong) {
  return wrong ? std::to_string(*wrong) : "N/A";
}

std::string format(const char* fmt, auto... args) {
  char buf[512];
  std::snprintf(buf, sizeof buf, fmt, args...);
  return buf;
}

std::string measurementCells(const Measurement& m) {
  return format("  %7s  %6.2f  %6.2f  %5s", formatTime(m.timeUs).c_str(), m.algBw, m.busBw,
                wrongText(m.wrong).c_str());
}

// The extra columns pad their cells; a line ends at its last character.
std::string trimmed(std::string line) {
  line.erase(line.find_last_not_of(' ') + 1);
  return line;
}

// A label centred over its columns.
std::string centred(const std::string& text, std::size_t width) {
  if (text.size() >= width) return text;
  const std::size_t left = (width - text.size()) / 2;
  return std::string(left, ' ') + text + std::string(width - text.size() - left, ' ');
}

}  // namespace

std::string formatTime(double us) {
  if (us >= 10000.0) return format("%7.0f", us);
  if (us >= 100.0) return format("%7.1f", us);
  return format("%7.2f", us);
}

Report::Report(const Options& options, int nranks, std::string peerName)
    : options_(options), nranks_(nranks), peerName_(std::move(peerName)) {}

void Report::printPreamble(const std::vector<std::string>& rankLines,
                           const std::vector<std::string>& notes) const {
  const Options& o = options_;
  std::printf(
      "# nThread %d nGpus %d minBytes %zu maxBytes %zu step: %zu(%s) warmup iters: %d iters: %d "
      "agg iters: %d validation: %d graph: %d\n",
      o.threads, 1, o.minBytes, o.maxBytes, o.stepFactor > 1 ? o.stepFactor : o.stepBytes,
      o.stepFactor > 1 ? "factor" : "bytes", o.warmupIters, o.iters, o.aggIters, o.checkIters,
      o.graphLaunches);
  if (o.blocking)
    std::printf("# Blocking Enabled: wait for completion and barrier after each collective \n");
  std::printf("#\n# Using devices\n");
  for (const std::string& line : rankLines) std::printf("%s\n", line.c_str());
  for (const std::string& note : notes) std::printf("# %s\n", note.c_str());
}

void Report::printHeader() const {
  const char* time = options_.reportCpuTime ? "cputime" : "time";
  std::string groups = format(
      "# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          ",
      "", "", "", "", "");
  std::string names = format("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s",
                             "size", "count", "type", "redop", "root", time, "algbw", "busbw",
                             "#wrong", time, "algbw", "busbw", "#wrong");
  std::string units = format("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s",
                             "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "",
                             "(us)", "(GB/s)", "(GB/s)", "");
  if (options_.plain) {
    std::printf("#\n%s\n%s\n%s\n", groups.c_str(), names.c_str(), units.c_str());
    return;
  }
  groups += format("  %-*s", kPlanWidth, "weft");
  names += format("  %-*s", kPlanWidth, "algo/proto");
  units += format("  %-*s", kPlanWidth, "");
  if (options_.compress) {
    groups += "  " + centred("deviation", 17);
    names += format("  %7s  %8s", "maxrel", "meanrel");
    units += format("  %7s  %8s", "", "");
  }
  if (!peerName_.empty()) {
    groups += "  " + centred(peerName_, 15);
    names += format("  %7s  %6s", time, "ratio");
    units += format("  %7s  %6s", "(us)", "");
  }
  for (const ForcedAlgorithm& f : options_.algos) {
    const std::string label = "forced " + f.label();
    groups += "  " + centred(label.size() <= 22 ? label : f.label(), 22);
    names += format("  %7s  %6s %6s", time, "busbw", "#wrong");
    units += format("  %7s  %6s  %5s", "(us)", "(GB/s)", "");
  }
  std::printf("#\n%s\n%s\n%s\n", trimmed(groups).c_str(), trimmed(names).c_str(),
              trimmed(units).c_str());
}

void Report::add(Row row) {
  std::string line = format("%12zu  %12zu  %8s  %6s  %6i", row.bytes, row.count,
                            std::string(tableName(row.type)).c_str(),
                            row.op ? std::string(tableName(*row.op)).c_str() : "none", row.root);
  line += measurementCells(row.outOfPlace) + measurementCells(row.inPlace);
  if (!options_.plain) line += extraCells(row);
  std::printf("%s\n", trimmed(line).c_str());
  std::fflush(stdout);
  rows_.push_back(std::move(row));
}

std::string Report::extraCells(const Row& row) const {
  std::string line = format("  %-*s", kPlanWidth, row.plan.c_str());
  if (options_.compress) {
    const Measurement& m = row.outOfPlace;
    line += m.maxRelError ? format("  %7.1e  %8.1e", *m.maxRelError, *m.meanRelError)
                          : format("  %7s  %8s", "N/A", "N/A");
  }
  if (!peerName_.empty()) {
    if (row.peerTimeUs) {
      const double ratio =
          row.outOfPlace.timeUs > 0 ? *row.peerTimeUs / row.outOfPlace.timeUs : 0.0;
      line += format("  %7s  %6.2f", formatTime(*row.peerTimeUs).c_str(), ratio);
    } else {
      line += format("  %7s  %6s", "N/A", "N/A");
    }
  }
  for (const ForcedResult& f : row.forced) {
    if (f.outOfPlace) {
      line += format("  %7s  %6.2f  %5s", formatTime(f.outOfPlace->timeUs).c_str(),
                     f.outOfPlace->busBw, wrongText(f.outOfPlace->wrong).c_str());
    } else {
      line += format("  %7s  %6s  %5s", "n/a", "n/a", "n/a");
    }
  }
  return line;
}

bool Report::finish() {
  // As nccl-tests: the count of checked runs with a wrong element, and the mean of every row's
  // out-of-place and in-place bus bandwidth.
  int failed = 0;
  double busBw = 0;
  int measured = 0;
  auto count = [&](const Measurement& m) { failed += m.wrong && *m.wrong > 0 ? 1 : 0; };
  for (const Row& r : rows_) {
    count(r.outOfPlace);
    count(r.inPlace);
    for (const ForcedResult& f : r.forced) {
      if (f.outOfPlace) count(*f.outOfPlace);
    }
    busBw += r.outOfPlace.busBw + r.inPlace.busBw;
    measured += 2;
  }
  if (measured > 0) busBw /= measured;
  const char* minBw = std::getenv("NCCL_TESTS_MIN_BW");
  const double floor = minBw != nullptr ? std::atof(minBw) : -1;
  const bool slow = floor >= 0 && busBw < floor * 0.9;
  std::printf("# Out of bounds values : %d %s\n", failed, failed > 0 ? "FAILED" : "OK");
  std::printf("# Avg bus bandwidth    : %g %s\n", busBw, floor < 0 ? "" : (slow ? "FAILED" : "OK"));
  // weft's own summaries, worded so that nccl-tests parsers do not mistake them for the above.
  for (std::size_t i = 0; i < options_.algos.size(); ++i) {
    double sum = 0;
    int n = 0;
    for (const Row& r : rows_) {
      if (r.forced[i].outOfPlace) sum += r.forced[i].outOfPlace->busBw, ++n;
    }
    if (n > 0)
      std::printf("# WEFT_ALGO=%s: mean out-of-place busbw %g GB/s over %d row(s)\n",
                  options_.algos[i].label().c_str(), sum / n, n);
  }
  if (!peerName_.empty()) {
    double logSum = 0;
    int n = 0;
    for (const Row& r : rows_) {
      if (r.peerTimeUs && r.outOfPlace.timeUs > 0 && *r.peerTimeUs > 0)
        logSum += std::log(*r.peerTimeUs / r.outOfPlace.timeUs), ++n;
    }
    if (n > 0)
      std::printf("# %s time / weft time: geometric mean %.3f over %d row(s)\n", peerName_.c_str(),
                  std::exp(logSum / n), n);
  }
  std::printf("#\n");
  bool ok = failed == 0 && !slow;
  if (!options_.jsonPath.empty()) {
    if (writeJson(options_.jsonPath, options_, nranks_, peerName_, rows_)) {
      std::printf("# wrote %s\n", options_.jsonPath.c_str());
    } else {
      std::fprintf(stderr, "weft-perf: could not write %s\n", options_.jsonPath.c_str());
      ok = false;
    }
  }
  if (!options_.svgPath.empty()) {
    if (writeSvg(options_.svgPath, options_, nranks_, peerName_, rows_)) {
      std::printf("# wrote %s\n", options_.svgPath.c_str());
    } else {
      std::fprintf(stderr, "weft-perf: could not write %s\n", options_.svgPath.c_str());
      ok = false;
    }
  }
  std::fflush(stdout);
  return ok;
}

}  // namespace weft::perf
