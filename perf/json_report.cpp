// --json: every row as the table has it, plus the run's parameters. Hand-written: the schema is
// small and flat, and weft-perf has no other use for a JSON library.
#include <cmath>
#include <fstream>
#include <sstream>

#include "perf/report.hpp"

namespace weft::perf {
namespace {

std::string quoted(std::string_view s) {
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

std::string number(double x) {
  if (!std::isfinite(x)) return "null";
  std::ostringstream s;
  s.precision(10);
  s << x;
  return s.str();
}

std::string measurement(const Measurement& m) {
  return "{\"time_us\": " + number(m.timeUs) + ", \"algbw\": " + number(m.algBw) +
         ", \"busbw\": " + number(m.busBw) +
         ", \"wrong\": " + (m.wrong ? std::to_string(*m.wrong) : std::string("null")) + "}";
}

}  // namespace

bool writeJson(const std::string& path, const Options& options, int nranks,
               const std::string& peerName, const std::vector<Row>& rows) {
  std::ofstream out(path);
  if (!out) return false;
  out << "{\n  \"tool\": \"weft-perf\",\n  \"collective\": " << quoted(name(options.collective))
      << ",\n  \"nranks\": " << nranks << ",\n  \"threads_per_process\": " << options.threads
      << ",\n  \"minbytes\": " << options.minBytes << ",\n  \"maxbytes\": " << options.maxBytes
      << ",\n  \"stepbytes\": " << options.stepBytes
      << ",\n  \"stepfactor\": " << options.stepFactor << ",\n  \"iters\": " << options.iters
      << ",\n  \"warmup_iters\": " << options.warmupIters
      << ",\n  \"agg_iters\": " << options.aggIters << ",\n  \"check\": " << options.checkIters
      << ",\n  \"average\": " << options.average
      << ",\n  \"peer\": " << (peerName.empty() ? std::string("null") : quoted(peerName))
      << ",\n  \"algos\": [";
  for (std::size_t i = 0; i < options.algos.size(); ++i)
    out << (i ? ", " : "") << quoted(options.algos[i].label());
  out << "],\n  \"rows\": [";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    out << (i ? "," : "") << "\n    {\"collective\": " << quoted(name(r.collective))
        << ", \"size\": " << r.bytes << ", \"count\": " << r.count
        << ", \"type\": " << quoted(tableName(r.type))
        << ", \"op\": " << (r.op ? quoted(tableName(*r.op)) : std::string("null"))
        << ", \"root\": " << r.root << ",\n     \"oop\": " << measurement(r.outOfPlace)
        << ",\n     \"ip\": " << measurement(r.inPlace) << ",\n     \"algo\": " << quoted(r.plan)
        << ", \"peer_time_us\": " << (r.peerTimeUs ? number(*r.peerTimeUs) : "null")
        << ", \"peer_ratio\": "
        << (r.peerTimeUs && r.outOfPlace.timeUs > 0 ? number(*r.peerTimeUs / r.outOfPlace.timeUs)
                                                    : "null")
        << ",\n     \"forced\": {";
    for (std::size_t k = 0; k < r.forced.size(); ++k) {
      const ForcedResult& f = r.forced[k];
      out << (k ? ", " : "") << quoted(options.algos[k].label())
          << ": {\"plan\": " << quoted(f.plan)
          << ", \"oop\": " << (f.outOfPlace ? measurement(*f.outOfPlace) : "null") << "}";
    }
    out << "}}";
  }
  out << "\n  ]\n}\n";
  return static_cast<bool>(out);
}

}  // namespace weft::perf
