// --json: every row as the table has it, plus the run's parameters. Hand-written: the schema is
// small and flat, and weft-perf has no other use for a JSON library.
#include <unistd.h>

#include <cmath>
#include <ctime>
#include <fstream>
#include <sstream>

#include "perf/report.hpp"
#include "src/tools/cli.hpp"

namespace weft::perf {

std::string jsonString(std::string_view s) {
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (static_cast<unsigned char>(ch) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", ch);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

std::string jsonNumber(double x) {
  if (!std::isfinite(x)) return "null";
  std::ostringstream s;
  s.precision(10);
  s << x;
  return s.str();
}

namespace {

std::string measurement(const Measurement& m) {
  return "{\"time_us\": " + jsonNumber(m.timeUs) + ", \"algbw\": " + jsonNumber(m.algBw) +
         ", \"busbw\": " + jsonNumber(m.busBw) +
         ", \"wrong\": " + (m.wrong ? std::to_string(*m.wrong) : std::string("null")) +
         (m.maxRelError ? ", \"max_rel_error\": " + jsonNumber(*m.maxRelError) +
                              ", \"mean_rel_error\": " + jsonNumber(*m.meanRelError)
                        : std::string()) +
         "}";
}

}  // namespace

bool writeJson(const std::string& path, const Options& options, int nranks,
               const std::string& peerName, const std::vector<Row>& rows) {
  std::ofstream out(path);
  if (!out) return false;
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  char date[32] = "";
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", &utc);
  out << "{\n  \"tool\": \"weft-perf\",\n  \"version\": " << jsonString(tools::version())
      << ",\n  \"host\": " << jsonString(host) << ",\n  \"date\": " << jsonString(date)
      << ",\n  \"command\": " << jsonString(options.commandLine)
      << ",\n  \"memory\": " << jsonString(options.gpu() ? "gpu" : "host") << ",\n  \"compress\": "
      << jsonString(options.compressText.empty() ? "none" : options.compressText)
      << ",\n  \"collective\": " << jsonString(name(options.collective))
      << ",\n  \"nranks\": " << nranks << ",\n  \"threads_per_process\": " << options.threads
      << ",\n  \"minbytes\": " << options.minBytes << ",\n  \"maxbytes\": " << options.maxBytes
      << ",\n  \"stepbytes\": " << options.stepBytes
      << ",\n  \"stepfactor\": " << options.stepFactor << ",\n  \"iters\": " << options.iters
      << ",\n  \"warmup_iters\": " << options.warmupIters
      << ",\n  \"agg_iters\": " << options.aggIters << ",\n  \"check\": " << options.checkIters
      << ",\n  \"average\": " << options.average
      << ",\n  \"peer\": " << (peerName.empty() ? std::string("null") : jsonString(peerName))
      << ",\n  \"algos\": [";
  for (std::size_t i = 0; i < options.algos.size(); ++i)
    out << (i ? ", " : "") << jsonString(options.algos[i].label());
  out << "],\n  \"rows\": [";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    out << (i ? "," : "") << "\n    {\"collective\": " << jsonString(name(r.collective))
        << ", \"size\": " << r.bytes << ", \"count\": " << r.count
        << ", \"type\": " << jsonString(tableName(r.type))
        << ", \"op\": " << (r.op ? jsonString(tableName(*r.op)) : std::string("null"))
        << ", \"root\": " << r.root << ",\n     \"oop\": " << measurement(r.outOfPlace)
        << ",\n     \"ip\": " << measurement(r.inPlace)
        << ",\n     \"algo\": " << jsonString(r.plan)
        << ", \"peer_time_us\": " << (r.peerTimeUs ? jsonNumber(*r.peerTimeUs) : "null")
        << ", \"peer_ratio\": "
        << (r.peerTimeUs && r.outOfPlace.timeUs > 0
                ? jsonNumber(*r.peerTimeUs / r.outOfPlace.timeUs)
                : "null")
        << ",\n     \"forced\": {";
    for (std::size_t k = 0; k < r.forced.size(); ++k) {
      const ForcedResult& f = r.forced[k];
      out << (k ? ", " : "") << jsonString(options.algos[k].label())
          << ": {\"plan\": " << jsonString(f.plan)
          << ", \"oop\": " << (f.outOfPlace ? measurement(*f.outOfPlace) : "null") << "}";
    }
    out << "}}";
  }
  out << "\n  ]\n}\n";
  return static_cast<bool>(out);
}

}  // namespace weft::perf
