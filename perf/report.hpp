// What weft-perf prints (rank 0 only): nccl-tests' table, row by row as sizes finish, with
// weft's columns after nccl-tests' own; the footer; and at the end the JSON and SVG exports.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "perf/options.hpp"
#include "weft/types.hpp"

namespace weft::perf {

struct Measurement {
  double timeUs = 0;
  double algBw = 0;                   // GB/s
  double busBw = 0;                   // GB/s
  std::optional<std::int64_t> wrong;  // nothing: not checked (printed N/A)
  // --compress: the outputs' deviation from the exact results (DataCheck's Deviation), relative.
  std::optional<double> maxRelError, meanRelError;
};

// One forced algorithm's out-of-place run of a row; nothing when the algorithm does not serve
// this collective and size (the tuner would fall back to another).
struct ForcedResult {
  std::string plan;
  std::optional<Measurement> outOfPlace;
};

struct Row {
  Collective collective = Collective::allReduce;
  std::size_t bytes = 0;
  std::size_t count = 0;
  DataType type = DataType::f32;
  std::optional<RedOp> op;  // nothing for collectives that do not reduce
  int root = -1;
  Measurement outOfPlace, inPlace;
  std::string plan;  // weftCommPlan's "algorithm/protocol" for the call
  std::optional<double> peerTimeUs;
  std::vector<ForcedResult> forced;  // in Options::algos order
};

class Report {
 public:
  Report(const Options& options, int nranks, std::string peerName);

  // Everything above the table: the run's parameters, one line per rank, notes.
  void printPreamble(const std::vector<std::string>& rankLines,
                     const std::vector<std::string>& notes) const;
  void printHeader() const;
  void add(Row row);
  // The footer, then the exports. Returns false when a check failed or a file could not be
  // written.
  bool finish();

 private:
  // weft's columns after nccl-tests' thirteen: the plan, the peer, the forced algorithms.
  std::string extraCells(const Row& row) const;

  const Options& options_;
  int nranks_;
  std::string peerName_;  // "" without --compare
  std::vector<Row> rows_;
};

// Time as nccl-tests prints it: 7 wide, fewer decimals as it grows.
std::string formatTime(double us);

// A JSON string literal (quotes and escapes), and a number (null when not finite).
std::string jsonString(std::string_view s);
std::string jsonNumber(double x);

bool writeJson(const std::string& path, const Options& options, int nranks,
               const std::string& peerName, const std::vector<Row>& rows);
bool writeSvg(const std::string& path, const Options& options, int nranks,
              const std::string& peerName, const std::vector<Row>& rows);

}  // namespace weft::perf
