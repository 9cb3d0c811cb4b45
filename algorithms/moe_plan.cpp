#include "algorithms/moe_plan.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <random>

#include "algorithms/selector.hpp"

namespace weft::algo {

MoeShape MoeShape::of(std::size_t tokens, std::size_t hidden, int topk, int experts, int nranks,
                      bool fp8Dispatch) {
  MoeShape s;
  s.tokens = tokens, s.hidden = hidden, s.topk = topk, s.experts = experts, s.nranks = nranks;
  s.dispatchBytes = fp8Dispatch ? hidden + (hidden + 127) / 128 * 4 : hidden * 2;
  s.combineBytes = hidden * 2;
  return s;
}

Status checkMoeShape(const MoeShape& s) {
  if (s.nranks < 1 || s.experts < 1 || s.experts % s.nranks != 0)
    return invalidArgument("moe: " + std::to_string(s.experts) + " experts do not spread over " +
                           std::to_string(s.nranks) + " ranks");
  if (s.topk < 1 || s.topk > s.experts)
    return invalidArgument("moe: top-" + std::to_string(s.topk) + " of " +
                           std::to_string(s.experts) + " experts");
  if (s.hidden == 0) return invalidArgument("moe: a hidden size of 0");
  return {};
}

Result<RankRoute> routeTokens(const MoeShape& s, const std::int64_t* topkIdx) {
  if (Status st = checkMoeShape(s); !st) return st;
  if (topkIdx == nullptr && s.tokens > 0) return invalidArgument("moe: topk_idx is NULL");
  const auto n = static_cast<std::size_t>(s.nranks), k = static_cast<std::size_t>(s.topk);
  RankRoute r;
  r.perExpert.assign(static_cast<std::size_t>(s.experts), 0);
  std::vector<std::size_t> count(n, 0);
  // Pass one: check and count; a token counts once for each rank that holds one of its experts.
  std::vector<int> lastToken(n, -1);
  for (std::size_t t = 0; t < s.tokens; ++t) {
    const std::int64_t* row = topkIdx + t * k;
    for (std::size_t j = 0; j < k; ++j) {
      const std::int64_t e = row[j];
      if (e == -1) {
        ++r.dropped;
        continue;
      }
      if (e < -1 || e >= s.experts)
        return invalidArgument("moe: token " + std::to_string(t) + " routes to expert " +
                               std::to_string(e) + " (experts 0 … " +
                               std::to_string(s.experts - 1) + ", or −1 to drop)");
      for (std::size_t i = 0; i < j; ++i) {
        if (row[i] == e)
          return invalidArgument("moe: token " + std::to_string(t) + " routes to expert " +
                                 std::to_string(e) + " twice");
      }
      ++r.perExpert[static_cast<std::size_t>(e)];
      const auto q = static_cast<std::size_t>(s.rankOf(static_cast<int>(e)));
      if (lastToken[q] != static_cast<int>(t)) {
        lastToken[q] = static_cast<int>(t);
        ++count[q];
      }
    }
  }
  r.offsets.assign(n + 1, 0);
  std::partial_sum(count.begin(), count.end(), r.offsets.begin() + 1);
  r.tokens.resize(r.offsets[n]);
  // Pass two: each destination's tokens in token order.
  std::vector<std::size_t> at(r.offsets.begin(), r.offsets.end() - 1);
  std::fill(lastToken.begin(), lastToken.end(), -1);
  for (std::size_t t = 0; t < s.tokens; ++t) {
    for (std::size_t j = 0; j < k; ++j) {
      const std::int64_t e = topkIdx[t * k + j];
      if (e < 0) continue;
      const auto q = static_cast<std::size_t>(s.rankOf(static_cast<int>(e)));
      if (lastToken[q] == static_cast<int>(t)) continue;
      lastToken[q] = static_cast<int>(t);
      r.tokens[at[q]++] = static_cast<std::int32_t>(t);
    }
  }
  return r;
}

std::size_t MoeTraffic::sentBy(int s) const {
  std::size_t sum = 0;
  for (int q = 0; q < nranks; ++q)
    if (q != s) sum += tokens[static_cast<std::size_t>(s * nranks + q)];
  return sum;
}

std::size_t MoeTraffic::receivedBy(int q) const {
  std::size_t sum = 0;
  for (int s = 0; s < nranks; ++s)
    if (q != s) sum += tokens[static_cast<std::size_t>(s * nranks + q)];
  return sum;
}

std::size_t MoeTraffic::busiest() const {
  std::size_t most = 0;
  for (int r = 0; r < nranks; ++r) most = std::max({most, sentBy(r), receivedBy(r)});
  return most;
}

double MoeTraffic::skew() const {
  std::size_t all = 0;
  for (int r = 0; r < nranks; ++r) all += sentBy(r);
  const double mean = static_cast<double>(all) / nranks;
  return mean > 0 ? static_cast<double>(busiest()) / mean : 1.0;
}

MoeTraffic trafficOf(const std::vector<RankRoute>& ranks) {
  MoeTraffic t;
  t.nranks = static_cast<int>(ranks.size());
  const auto n = ranks.size();
  t.tokens.assign(n * n, 0);
  for (std::size_t s = 0; s < n; ++s) {
    for (std::size_t q = 0; q < n; ++q) t.tokens[s * n + q] = ranks[s].toRank(static_cast<int>(q));
    if (t.perExpert.empty()) t.perExpert.assign(ranks[s].perExpert.size(), 0);
    for (std::size_t e = 0; e < t.perExpert.size(); ++e) t.perExpert[e] += ranks[s].perExpert[e];
  }
  return t;
}

Result<Routing> parseRouting(std::string_view text) {
  Routing r;
  if (text == "uniform") return r;
  if (text.starts_with("zipf:")) {
    const std::string number(text.substr(5));
    char* end = nullptr;
    r.alpha = std::strtod(number.c_str(), &end);
    if (!number.empty() && *end == '\0' && r.alpha > 0 && r.alpha <= 8) {
      r.zipf = true;
      return r;
    }
  }
  return invalidArgument("'" + std::string(text) +
                         "' is not a routing (uniform, or zipf:ALPHA with 0 < ALPHA <= 8)");
}

MoeTraffic simulateRouting(const MoeShape& s, const Routing& r) {
  const auto n = static_cast<std::size_t>(s.nranks), E = static_cast<std::size_t>(s.experts);
  std::mt19937_64 rng(r.seed);
  // Expert popularity: the i-th most popular is order[i]; Zipf weights 1 / (i + 1)^alpha.
  std::vector<int> order(E);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<double> cdf(E);
  double sum = 0;
  for (std::size_t i = 0; i < E; ++i) {
    sum += r.zipf ? std::pow(static_cast<double>(i + 1), -r.alpha) : 1.0;
    cdf[i] = sum;
  }
  std::uniform_real_distribution<double> unit(0, sum);
  std::vector<RankRoute> ranks;
  ranks.reserve(n);
  const auto k = static_cast<std::size_t>(s.topk);
  std::vector<std::int64_t> table(s.tokens * k);
  std::vector<char> taken(E, 0);
  std::vector<std::size_t> picked(k);  // a token's experts by popularity
  for (std::size_t rank = 0; rank < n; ++rank) {
    for (std::size_t t = 0; t < s.tokens; ++t) {
      std::int64_t* row = table.data() + t * k;
      for (std::size_t j = 0; j < k; ++j) {
        // A draw not yet taken by this token; after 64 tries, the most popular one left.
        std::size_t i = 0;
        for (int tries = 0; tries < 64; ++tries) {
          i = static_cast<std::size_t>(std::lower_bound(cdf.begin(), cdf.end(), unit(rng)) -
                                       cdf.begin());
          i = std::min(i, E - 1);
          if (!taken[i]) break;
        }
        while (taken[i]) i = (i + 1) % E;
        taken[i] = 1;
        picked[j] = i;
        row[j] = order[i];
      }
      for (std::size_t i : picked) taken[i] = 0;
    }
    auto route = routeTokens(s, table.data());
    ranks.push_back(route ? std::move(*route) : RankRoute{});
  }
  return trafficOf(ranks);
}

Result<MoePlan> Selector::planMoe(const MoeShape& s, const MoeTraffic& traffic) const {
  if (Status st = checkMoeShape(s); !st) return st;
  MoePlan p;
  p.skew = traffic.skew();
  const std::size_t busiest = traffic.busiest();
  p.busiestBytes = busiest * s.dispatchBytes;
  const auto n = static_cast<std::size_t>(s.nranks);
  // Each way an all-to-all whose every rank moves what the busiest one does, spread evenly over
  // its peers (plan's bytes count a rank's whole buffer, its own block included).
  auto priced = [&](std::size_t bytes) -> Result<double> {
    if (n == 1 || bytes == 0) return 0.0;
    auto a = plan(Collective::allToAll, bytes * n / (n - 1));
    if (!a) return a.status();
    return a->estimateUs;
  };
  auto d = priced(p.busiestBytes);
  if (!d) return d.status();
  auto c = priced(busiest * s.combineBytes);
  if (!c) return c.status();
  p.dispatchUs = *d, p.combineUs = *c;
  p.reason = "busiest rank " + std::to_string(busiest) + " tokens one way (skew " +
             std::to_string(p.skew).substr(0, 4) + ")";
  return p;
}

}  // namespace weft::algo
