#include "unit/formula.hpp"

#include <bit>
#include <cctype>
#include <cmath>
#include <stdexcept>
#include <vector>

namespace weft::test {
namespace {

class Parser {
 public:
  Parser(const std::string& text, const std::map<std::string, double>& vars)
      : s_(text), vars_(vars) {}

  double parse() {
    const double v = ternary();
    skip();
    if (pos_ != s_.size()) fail("unexpected '" + s_.substr(pos_) + "'");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& why) { throw std::runtime_error(why); }

  void skip() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  bool eat(const std::string& tok) {
    skip();
    if (s_.compare(pos_, tok.size(), tok) == 0) {
      pos_ += tok.size();
      return true;
    }
    return false;
  }

  double ternary() {
    const double c = comparison();
    if (!eat("?")) return c;
    const double a = ternary();
    if (!eat(":")) fail("expected ':'");
    const double b = ternary();
    return c != 0 ? a : b;
  }

  double comparison() {
    const double a = sum();
    if (eat("==")) return a == sum();
    if (eat("!=")) return a != sum();
    if (eat("<=")) return a <= sum();
    if (eat(">=")) return a >= sum();
    if (eat("<")) return a < sum();
    if (eat(">")) return a > sum();
    return a;
  }

  double sum() {
    double v = product();
    for (;;) {
      if (eat("+")) {
        v += product();
      } else if (eat("-")) {
        v -= product();
      } else {
        return v;
      }
    }
  }

  double product() {
    double v = unary();
    for (;;) {
      if (eat("*")) {
        v *= unary();
      } else if (eat("/")) {
        v /= unary();
      } else if (eat("%")) {
        v = std::fmod(v, unary());
      } else {
        return v;
      }
    }
  }

  double unary() { return eat("-") ? -unary() : primary(); }

  static unsigned asCount(double x) {
    if (x < 1 || x != std::floor(x)) throw std::runtime_error("expected a positive integer");
    return static_cast<unsigned>(x);
  }

  double call(const std::string& fn, const std::vector<double>& args) {
    auto want = [&](std::size_t k) {
      if (args.size() != k) fail(fn + " takes " + std::to_string(k) + " argument(s)");
    };
    if (fn == "min" || fn == "max") {
      want(2);
      return fn == "min" ? std::min(args[0], args[1]) : std::max(args[0], args[1]);
    }
    want(1);
    const double x = args[0];
    if (fn == "ceil") return std::ceil(x);
    if (fn == "floor") return std::floor(x);
    if (fn == "log2") return std::log2(x);
    if (fn == "log2c") return asCount(x) <= 1 ? 0 : std::bit_width(asCount(x) - 1);  // ceil(log2 x)
    if (fn == "pow2") return std::bit_floor(asCount(x));  // largest 2^k <= x
    if (fn == "bitsum") {                                 // sum of popcount(i) for 0 <= i < x
      double total = 0;
      for (unsigned i = 0; i < asCount(x); ++i) total += std::popcount(i);
      return total;
    }
    fail("unknown function " + fn);
  }

  double primary() {
    skip();
    if (eat("(")) {
      const double v = ternary();
      if (!eat(")")) fail("expected ')'");
      return v;
    }
    if (pos_ < s_.size() &&
        (std::isdigit(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '.')) {
      std::size_t used = 0;
      const double v = std::stod(s_.substr(pos_), &used);
      pos_ += used;
      return v;
    }
    std::string id;
    while (pos_ < s_.size() &&
           (std::isalnum(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '_')) {
      id += s_[pos_++];
    }
    if (id.empty()) fail("expected a value at '" + s_.substr(pos_) + "'");
    if (eat("(")) {
      std::vector<double> args;
      if (!eat(")")) {
        do args.push_back(ternary());
        while (eat(","));
        if (!eat(")")) fail("expected ')' after arguments of " + id);
      }
      return call(id, args);
    }
    const auto it = vars_.find(id);
    if (it == vars_.end()) fail("unknown variable " + id);
    return it->second;
  }

  const std::string& s_;
  const std::map<std::string, double>& vars_;
  std::size_t pos_ = 0;
};

}  // namespace

std::optional<double> evaluate(const std::string& expr, const std::map<std::string, double>& vars,
                               std::string* error) {
  try {
    return Parser(expr, vars).parse();
  } catch (const std::exception& e) {
    if (error != nullptr) *error = e.what();
    return std::nullopt;
  }
}

}  // namespace weft::test
