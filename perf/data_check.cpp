#include "perf/data_check.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "perf/element.hpp"

namespace weft::perf {
namespace {

// splitmix64's finalizer: a cheap, well-mixed hash of (key + index).
constexpr std::uint64_t mix(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

constexpr unsigned char kFloatPoison = 0xFF;
constexpr unsigned char kIntegerPoison = 0xCD;

template <typename S>
S poisonValue(bool floating) {
  S v;
  std::memset(&v, floating ? kFloatPoison : kIntegerPoison, sizeof v);
  return v;
}

// The bits of a value, for bit-for-bit comparison of floating types.
template <typename S>
auto bitsOf(S v) {
  if constexpr (sizeof(S) == 8) {
    return std::bit_cast<std::uint64_t>(v);
  } else if constexpr (sizeof(S) == 4) {
    return std::bit_cast<std::uint32_t>(v);
  } else if constexpr (sizeof(S) == 2) {
    return std::bit_cast<std::uint16_t>(v);
  } else {
    return std::bit_cast<std::uint8_t>(v);
  }
}

}  // namespace

DataCheck::DataCheck(DataType type, std::optional<RedOp> op, int nranks, std::uint64_t seed)
    : type_(type), op_(op), nranks_(nranks) {
  for (int r = 0; r < nranks; ++r) {
    rankKeys_.push_back(mix(seed ^ (static_cast<std::uint64_t>(r + 1) * 0xd1b54a32d192ed03ull)));
  }
  withElement(type, [&](auto e) {
    using E = decltype(e);
    if constexpr (E::kFloating) {
      const std::int64_t exactLimit = std::int64_t{1} << std::min(E::kPrecision, 62);
      const bool sums = op_ && (*op_ == RedOp::sum || *op_ == RedOp::avg);
      const std::int64_t spread = sums ? exactLimit / nranks : exactLimit;
      grid_ = std::clamp<std::int64_t>(spread, 1, 4096);
      exact_ = !sums || grid_ * nranks <= exactLimit;
    }
  });
}

template <typename E>
typename E::Storage DataCheck::input(int rank, std::size_t index) const {
  using S = typename E::Storage;
  const std::uint64_t h = mix(rankKeys_[static_cast<std::size_t>(rank)] + index);
  if constexpr (E::kFloating) {
    if (op_ == RedOp::prod) {
      const double magnitude = (h & 3) == 0 ? 2.0 : 1.0;
      return E::fromDouble((h & 4) != 0 ? -magnitude : magnitude);
    }
    const auto j =
        static_cast<std::int64_t>((h >> 8) % static_cast<std::uint64_t>(2 * grid_ + 1)) - grid_;
    return E::fromDouble(static_cast<double>(j) * 0.25);
  } else {
    if (op_ == RedOp::prod) return static_cast<S>(h | 1);  // odd: products never collapse to 0
    auto v = static_cast<S>(h);
    if (!op_ && v == poisonValue<S>(false)) v = static_cast<S>(v ^ 1);
    return v;
  }
}

void DataCheck::fill(void* buf, std::size_t count, int rank, std::size_t first) const {
  withElement(type_, [&](auto e) {
    using E = decltype(e);
    auto* out = static_cast<typename E::Storage*>(buf);
    for (std::size_t i = 0; i < count; ++i) out[i] = input<E>(rank, first + i);
  });
}

void DataCheck::poison(void* buf, std::size_t count) const {
  std::memset(buf, isFloating(type_) ? kFloatPoison : kIntegerPoison, count * sizeOf(type_));
}

template <typename E>
bool DataCheck::reducedIsWrong(typename E::Storage got, std::size_t index) const {
  using S = typename E::Storage;
  const RedOp op = *op_;
  if constexpr (E::kFloating) {
    const double g = E::toDouble(got);
    if (std::isnan(g)) return true;
    // Every input is exact in double and so are sums of a few thousand of them (j/4, |j| <=
    // 4096) and products of powers of two: the exact result, rounded once at the end.
    double acc = op == RedOp::prod ? 1.0 : 0.0, magnitude = 0;
    for (int r = 0; r < nranks_; ++r) {
      const double x = E::toDouble(input<E>(r, index));
      magnitude += std::fabs(x);
      switch (op) {
        case RedOp::sum:
        case RedOp::avg:
          acc += x;
          break;
        case RedOp::prod:
          acc *= x;
          break;
        case RedOp::min:
          acc = r == 0 ? x : std::min(acc, x);
          break;
        case RedOp::max:
          acc = r == 0 ? x : std::max(acc, x);
          break;
      }
    }
    if (exact_) {
      const S rounded = E::fromDouble(acc);
      const S want = op == RedOp::avg ? E::average(rounded, nranks_) : rounded;
      return g != E::toDouble(want);
    }
    const double eps = std::ldexp(1.0, 1 - E::kPrecision);
    const double bound = nranks_ * eps * magnitude;
    if (op == RedOp::avg) {
      const double mean = acc / nranks_;
      return std::fabs(g - mean) > bound / nranks_ + eps * std::fabs(mean);
    }
    return std::fabs(g - acc) > bound;
  } else {
    // Wrapping arithmetic in 64 bits, then the modular conversion to S (C++20): what the
    // library's wrapping sum and product give in any order.
    std::uint64_t acc = op == RedOp::prod ? 1 : 0;
    S best{};
    for (int r = 0; r < nranks_; ++r) {
      const S x = input<E>(r, index);
      switch (op) {
        case RedOp::sum:
        case RedOp::avg:
          acc += static_cast<std::uint64_t>(x);
          break;
        case RedOp::prod:
          acc *= static_cast<std::uint64_t>(x);
          break;
        case RedOp::min:
          best = r == 0 ? x : std::min(best, x);
          break;
        case RedOp::max:
          best = r == 0 ? x : std::max(best, x);
          break;
      }
    }
    S want = best;
    if (op == RedOp::sum || op == RedOp::prod) want = static_cast<S>(acc);
    if (op == RedOp::avg) want = E::average(static_cast<S>(acc), nranks_);
    return got != want;
  }
}

template <typename E>
std::int64_t DataCheck::wrongAs(const void* out, const Expect& e) const {
  using S = typename E::Storage;
  const S* got = static_cast<const S*>(out) + e.outBegin;
  std::int64_t wrong = 0;
  for (std::size_t i = 0; i < e.length; ++i) {
    switch (e.kind) {
      case Expect::Kind::reduced:
        wrong += reducedIsWrong<E>(got[i], e.srcBegin + i) ? 1 : 0;
        break;
      case Expect::Kind::copied:
        wrong += bitsOf(got[i]) != bitsOf(input<E>(e.srcRank, e.srcBegin + i)) ? 1 : 0;
        break;
      case Expect::Kind::poisoned:
        wrong += bitsOf(got[i]) != bitsOf(poisonValue<S>(E::kFloating)) ? 1 : 0;
        break;
    }
  }
  return wrong;
}

std::int64_t DataCheck::wrong(const void* out, const Expect& e) const {
  return withElement(type_, [&](auto el) { return wrongAs<decltype(el)>(out, e); });
}

void Deviation::add(const Deviation& o) {
  maxError = std::max(maxError, o.maxError);
  sumError += o.sumError;
  maxExact = std::max(maxExact, o.maxExact);
  sumExact += o.sumExact;
  notFinite += o.notFinite;
}

template <typename E>
Deviation DataCheck::deviationAs(const void* out, const Expect& e) const {
  using S = typename E::Storage;
  const S* got = static_cast<const S*>(out) + e.outBegin;
  Deviation d;
  for (std::size_t i = 0; i < e.length; ++i) {
    double exact = 0;
    if (e.kind == Expect::Kind::reduced) {
      for (int r = 0; r < nranks_; ++r) exact += E::toDouble(input<E>(r, e.srcBegin + i));
      if (op_ == RedOp::avg) exact /= nranks_;
    } else if (e.kind == Expect::Kind::copied) {
      exact = E::toDouble(input<E>(e.srcRank, e.srcBegin + i));
    } else {
      continue;
    }
    const double g = E::toDouble(got[i]);
    if (!std::isfinite(g)) {
      ++d.notFinite;
      continue;
    }
    const double error = std::fabs(g - exact);
    d.maxError = std::max(d.maxError, error);
    d.sumError += error;
    d.maxExact = std::max(d.maxExact, std::fabs(exact));
    d.sumExact += std::fabs(exact);
  }
  return d;
}

Deviation DataCheck::deviation(const void* out, const Expect& e) const {
  return withElement(type_, [&](auto el) {
    using E = decltype(el);
    if constexpr (E::kFloating) {
      return deviationAs<E>(out, e);
    } else {
      Deviation d;
      d.notFinite = wrongAs<E>(out, e);  // integers are exact: what is wrong
      return d;
    }
  });
}

}  // namespace weft::perf
