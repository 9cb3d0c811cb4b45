// A small expression evaluator for the formulas in docs/algorithms.md, so the table is tested.
// Grammar: ternary (c ? a : b), comparisons, + - * / %, unary minus, parentheses, numbers,
// variables, and the functions ceil floor min max log2 log2c pow2 bitsum.
#pragma once

#include <map>
#include <optional>
#include <string>

namespace weft::test {

// The value of `expr` with the given variables, or nullopt with `error` set.
std::optional<double> evaluate(const std::string& expr, const std::map<std::string, double>& vars,
                               std::string* error = nullptr);

}  // namespace weft::test
