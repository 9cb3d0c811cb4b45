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

MoeTraffic simulateRouting(const MoeShape& s, const Routing& r, const std::optional<Rails>& rails) {
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
  std::vector<std::size_t> hostRows;   // [rank · hosts + h]
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
    if (rails) {
      const HostRoute toHosts = routeToHosts(s, table.data(), *rails);
      for (std::size_t h = 0; h + 1 < toHosts.offsets.size(); ++h)
        hostRows.push_back(toHosts.toHost(h));
    }
  }
  MoeTraffic traffic = trafficOf(ranks);
  if (rails) traffic.rails = rails, traffic.toHost = std::move(hostRows);
  return traffic;
}

std::optional<Rails> Rails::of(const std::vector<int>& hostOf) {
  Rails r;
  r.hostOf = hostOf;
  r.hosts = hostOf.empty() ? 0 : *std::max_element(hostOf.begin(), hostOf.end()) + 1;
  if (r.hosts < 2) return std::nullopt;
  std::vector<int> count(static_cast<std::size_t>(r.hosts), 0);
  r.localOf.resize(hostOf.size());
  for (std::size_t q = 0; q < hostOf.size(); ++q) {
    if (hostOf[q] < 0) return std::nullopt;
    r.localOf[q] = count[static_cast<std::size_t>(hostOf[q])]++;
  }
  r.perHost = count[0];
  for (int c : count)
    if (c != r.perHost) return std::nullopt;
  r.rankAt.resize(hostOf.size());
  for (std::size_t q = 0; q < hostOf.size(); ++q)
    r.rankAt[static_cast<std::size_t>(hostOf[q] * r.perHost + r.localOf[q])] = static_cast<int>(q);
  return r;
}

HostRoute routeToHosts(const MoeShape& s, const std::int64_t* topkIdx, const Rails& rails) {
  const auto H = static_cast<std::size_t>(rails.hosts), k = static_cast<std::size_t>(s.topk);
  // Each host's tokens, in token order: a token once per host (the last one listed per host).
  std::vector<std::vector<std::int32_t>> per(H);
  for (std::size_t t = 0; t < s.tokens; ++t) {
    for (std::size_t j = 0; j < k; ++j) {
      const std::int64_t e = topkIdx[t * k + j];
      if (e < 0 || e >= s.experts) continue;
      auto& list = per[static_cast<std::size_t>(
          rails.hostOf[static_cast<std::size_t>(s.rankOf(static_cast<int>(e)))])];
      if (list.empty() || list.back() != static_cast<std::int32_t>(t))
        list.push_back(static_cast<std::int32_t>(t));
    }
  }
  HostRoute r;
  r.offsets.assign(H + 1, 0);
  for (std::size_t h = 0; h < H; ++h) {
    r.offsets[h + 1] = r.offsets[h] + per[h].size();
    r.tokens.insert(r.tokens.end(), per[h].begin(), per[h].end());
  }
  return r;
}

namespace {

// One way of a dispatch or combine across hosts, `bytes` a token's: the busiest host's network
// rows (sent or received, to or from other hosts) at the host's network rate, and the busiest
// rank's rows through shared memory (received, or forwarded, from its own host) at a rank's
// copy rate, after `fixedUs` (an all-to-all's; twice for the hierarchical path's two).
struct WayCost {
  std::vector<std::size_t> netOut, netIn, local;  // per host, per host, per rank
  explicit WayCost(const MoeTraffic& t)
      : netOut(static_cast<std::size_t>(t.rails->hosts), 0),
        netIn(netOut.size(), 0),
        local(static_cast<std::size_t>(t.nranks), 0) {}
  double us(std::size_t bytes, double netGBs, double copyGBs, double fixedUs) const {
    std::size_t net = 0, shm = 0;
    for (std::size_t h = 0; h < netOut.size(); ++h) net = std::max({net, netOut[h], netIn[h]});
    for (std::size_t r : local) shm = std::max(shm, r);
    return fixedUs + static_cast<double>(net * bytes) / (netGBs * 1e3) +
           static_cast<double>(shm * bytes) / (copyGBs * 1e3);
  }
};

WayCost flatWay(const MoeTraffic& t) {
  const Rails& r = *t.rails;
  const auto n = static_cast<std::size_t>(t.nranks);
  WayCost w(t);
  for (std::size_t s = 0; s < n; ++s) {
    for (std::size_t q = 0; q < n; ++q) {
      const std::size_t rows = t.tokens[s * n + q];
      const auto hs = static_cast<std::size_t>(r.hostOf[s]),
                 hq = static_cast<std::size_t>(r.hostOf[q]);
      if (hs != hq) {
        w.netOut[hs] += rows, w.netIn[hq] += rows;
      } else if (s != q) {
        w.local[q] += rows;
      }
    }
  }
  return w;
}

WayCost hierarchicalWay(const MoeTraffic& t) {
  const Rails& r = *t.rails;
  const auto n = static_cast<std::size_t>(t.nranks), H = static_cast<std::size_t>(r.hosts);
  WayCost w(t);
  for (std::size_t s = 0; s < n; ++s) {
    const auto hs = static_cast<std::size_t>(r.hostOf[s]);
    for (std::size_t h = 0; h < H; ++h) {
      if (h == hs) continue;
      w.netOut[hs] += t.toHost[s * H + h], w.netIn[h] += t.toHost[s * H + h];
    }
    // The rail's rank on q's host forwards s's rows to q: both copy them.
    for (std::size_t q = 0; q < n; ++q) {
      const auto f = static_cast<std::size_t>(r.peer(static_cast<int>(s), r.hostOf[q]));
      if (f == q) continue;
      w.local[q] += t.tokens[s * n + q], w.local[f] += t.tokens[s * n + q];
    }
  }
  return w;
}

}  // namespace

Result<MoePlan> Selector::planMoe(const MoeShape& s, const MoeTraffic& traffic,
                                  std::optional<bool> hierarchical) const {
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
  const RankGraph& g = tuner_.graph();
  if (!traffic.rails || traffic.toHost.empty() || kernels_.gpu || g.netPerRank <= 0) return p;
  // Across hosts: both paths by the same measure, so that the comparison is fair.
  auto fixed = plan(Collective::allToAll, n * 64);
  if (!fixed) return fixed.status();
  const double net = g.netPerRank * g.ranksPerHost, copy = options_.constants.graphs.hostCopyGBs;
  const WayCost flat = flatWay(traffic), hier = hierarchicalWay(traffic);
  const double f[2] = {flat.us(s.dispatchBytes, net, copy, fixed->estimateUs),
                       flat.us(s.combineBytes, net, copy, fixed->estimateUs)};
  const double h[2] = {hier.us(s.dispatchBytes, net, copy, 2 * fixed->estimateUs),
                       hier.us(s.combineBytes, net, copy, 2 * fixed->estimateUs)};
  p.flatUs = f[0] + f[1], p.hierarchicalUs = h[0] + h[1];
  p.hierarchical = hierarchical.value_or(p.hierarchicalUs < p.flatUs);
  p.dispatchUs = p.hierarchical ? h[0] : f[0], p.combineUs = p.hierarchical ? h[1] : f[1];
  p.reason += std::string(p.hierarchical ? "; hierarchical " : "; flat ") +
              std::to_string(static_cast<int>(p.hierarchical ? p.hierarchicalUs : p.flatUs)) +
              " us against " +
              std::to_string(static_cast<int>(p.hierarchical ? p.flatUs : p.hierarchicalUs)) +
              (p.hierarchical ? " flat" : " hierarchical") + (hierarchical ? " (forced)" : "");
  return p;
}

}  // namespace weft::algo
