// docs/algorithms.md's cost table, evaluated and compared with the verifier's counts.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "algorithms/algorithm.hpp"
#include "algorithms/verifier.hpp"
#include "unit/formula.hpp"

namespace weft::algo {
namespace {

struct DocRow {
  std::string algo, coll;
  std::map<std::string, std::string> formula;  // column -> expression
  int line = 0;
};

std::vector<std::string> cells(const std::string& line) {
  std::vector<std::string> out;
  std::stringstream ss(line);
  std::string cell;
  std::getline(ss, cell, '|');  // before the first bar
  while (std::getline(ss, cell, '|')) {
    const auto b = cell.find_first_not_of(' ');
    const auto e = cell.find_last_not_of(' ');
    out.push_back(b == std::string::npos ? "" : cell.substr(b, e - b + 1));
  }
  if (!out.empty() && out.back().empty()) out.pop_back();
  return out;
}

std::vector<DocRow> readTable() {
  std::ifstream in(std::string(WEFT_SOURCE_DIR) + "/docs/algorithms.md");
  EXPECT_TRUE(in.good()) << "docs/algorithms.md not found";
  std::vector<std::string> header;
  std::vector<DocRow> rows;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.rfind("| algorithm |", 0) == 0) {
      header = cells(line);
      continue;
    }
    if (line.rfind('|', 0) != 0) header.clear();  // the table ended; later ones are others'
    if (header.empty() || line.rfind("| ", 0) != 0 || line.rfind("| ---", 0) == 0) continue;
    const auto c = cells(line);
    if (c.size() != header.size()) continue;
    DocRow row{c[0], c[1], {}, n};
    for (std::size_t i = 2; i < c.size(); ++i) {
      std::string f = c[i];
      if (f.size() >= 2 && f.front() == '`' && f.back() == '`') f = f.substr(1, f.size() - 2);
      row.formula[header[i]] = f;
    }
    rows.push_back(row);
  }
  return rows;
}

TEST(AlgorithmsDoc, TableCoversEveryAlgorithmAndCollective) {
  const auto rows = readTable();
  for (const Algorithm* a : algorithms()) {
    for (Collective c : a->collectives()) {
      bool found = false;
      for (const DocRow& r : rows) found = found || (r.algo == a->name() && r.coll == name(c));
      EXPECT_TRUE(found) << a->name() << " " << name(c) << " has no row in docs/algorithms.md";
    }
  }
}

TEST(AlgorithmsDoc, FormulasMatchTheVerifier) {
  const auto rows = readTable();
  ASSERT_GE(rows.size(), 18u);
  std::vector<int> counts;
  for (int n = 2; n <= 64; ++n) counts.push_back(n);
  for (int n : {96, 127, 128, 255, 256}) counts.push_back(n);
  for (const DocRow& row : rows) {
    const Algorithm* a = findAlgorithm(row.algo);
    const auto coll = parseCollective(row.coll);
    ASSERT_NE(a, nullptr) << "line " << row.line << ": unknown algorithm " << row.algo;
    ASSERT_TRUE(coll.has_value()) << "line " << row.line << ": unknown collective " << row.coll;
    for (int n : counts) {
      std::vector<int> aggregations{0};
      if (row.algo == "pat") {
        aggregations.clear();
        for (int A = 1; A <= n / 2; A *= 2) aggregations.push_back(A);
      }
      for (int A : aggregations) {
        Params params;
        params.aggregation = A;
        const Schedule s = *a->build(*coll, n, params);
        const VerifyReport rep = verify(s, {false, 1});
        ASSERT_TRUE(rep.ok()) << rep.message;
        const int G = hierarchicalGroupSize(n, 0);
        const std::map<std::string, double> vars{{"n", n}, {"A", A}, {"G", G}, {"N", n / G}};
        const std::map<std::string, double> actual{
            {"steps", rep.maxSteps},
            {"messages", rep.maxMessages},
            {"bytes", rep.maxBytes},
            {"largest message",
             double(rep.maxMessageBlocks) / (double(s.messageBlocks()) * s.partsPerBlock)}};
        for (const auto& [column, value] : actual) {
          const auto it = row.formula.find(column);
          ASSERT_NE(it, row.formula.end()) << "no column " << column;
          std::string error;
          const auto expected = test::evaluate(it->second, vars, &error);
          ASSERT_TRUE(expected.has_value())
              << "line " << row.line << " " << column << ": " << error;
          EXPECT_NEAR(*expected, value, 1e-9)
              << "docs/algorithms.md line " << row.line << ": " << row.algo << " " << row.coll
              << " " << column << " `" << it->second << "` at n=" << n
              << (row.algo == "pat" ? " A=" + std::to_string(A) : "");
        }
      }
    }
  }
}

TEST(Formula, Evaluates) {
  const std::map<std::string, double> v{{"n", 12}};
  EXPECT_EQ(test::evaluate("2*(n - 1)/n", v), 2.0 * 11 / 12);
  EXPECT_EQ(test::evaluate("n == 12 ? 1 : 2", v), 1);
  EXPECT_EQ(test::evaluate("log2c(n) + pow2(n) + bitsum(4)", v), 4 + 8 + 4);
  EXPECT_EQ(test::evaluate("max(3, floor(n/5)) - -1", v), 4);
  EXPECT_FALSE(test::evaluate("n +", v).has_value());
  EXPECT_FALSE(test::evaluate("m", v).has_value());
  EXPECT_FALSE(test::evaluate("nosuch(1)", v).has_value());
}

}  // namespace
}  // namespace weft::algo
