#include "algorithms/tuner.hpp"

#include <algorithm>
#include <cstdlib>
#include <iomanip>
#include <sstream>

#include "algorithms/algorithm.hpp"

namespace weft::algo {

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

}  // namespace

Result<TunerOptions> TunerOptions::from(const std::string& algo, const std::string& proto,
                                        const std::string& tuningFile) {
  TunerOptions o;
  std::stringstream ss(lower(algo));
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    if (findAlgorithm(item) == nullptr) {
      std::string known;
      for (const Algorithm* a : weft::algo::algorithms())
        known += (known.empty() ? "" : ", ") + std::string(a->name());
      return invalidArgument("WEFT_ALGO names an unknown algorithm '" + item +
                             "' (known: " + known + ")");
    }
    o.algorithms.push_back(item);
  }
  if (!proto.empty()) {
    o.protocol = parseProtocol(lower(proto));
    if (!o.protocol) return invalidArgument("WEFT_PROTO must be ll or simple, not '" + proto + "'");
  }
  if (!tuningFile.empty()) {
    auto c = CostConstants::fromJsonFile(tuningFile);
    if (!c) return c.status();
    o.constants = *c;
    o.tuningFile = tuningFile;
  }
  return o;
}

Result<TunerOptions> TunerOptions::fromNccl(const std::string& algo, const std::string& proto,
                                            const std::string& tuningFile) {
  // Items of a list that may be split per collective ("allreduce:ring,tree;broadcast:ring"),
  // lower case, with whether the list excludes them ("^nvls").
  auto items = [](const std::string& value, bool& excluding) {
    std::vector<std::string> out;
    excluding = false;
    std::stringstream groups(lower(value));
    std::string group;
    while (std::getline(groups, group, ';')) {
      if (const auto colon = group.find(':'); colon != std::string::npos)
        group = group.substr(colon + 1);
      if (!group.empty() && group[0] == '^') {
        excluding = true;
        group = group.substr(1);
      }
      std::stringstream list(group);
      std::string item;
      while (std::getline(list, item, ',')) {
        if (!item.empty()) out.push_back(item);
      }
    }
    return out;
  };
  bool excludeAlgos = false, excludeProtos = false;
  std::string allowed;
  std::vector<std::string> excluded;
  for (const std::string& a : items(algo, excludeAlgos)) {
    const std::string name = a == "tree" ? "dbtree" : a;
    if (name != "ring" && name != "dbtree" && name != "pat") continue;  // CollNet, NVLS: none here
    if (excludeAlgos) {
      excluded.push_back(name);
    } else if (allowed.find(name) == std::string::npos) {
      allowed += (allowed.empty() ? "" : ",") + name;
    }
  }
  bool ll = false, simple = false;
  for (const std::string& p : items(proto, excludeProtos)) {
    ll = ll || p == "ll";
    simple = simple || p == "simple" || p == "ll128";
  }
  if (excludeProtos) std::swap(ll, simple);  // "^LL": what is left
  std::string protocol;
  if (ll != simple) protocol = ll ? "ll" : "simple";
  auto o = from(allowed, protocol, tuningFile);
  if (!o) return o;
  o->unpriced.insert(o->unpriced.end(), excluded.begin(), excluded.end());
  return o;
}

Result<TunerOptions> TunerOptions::fromEnvironment() {
  const std::string file = env("WEFT_TUNING_FILE");
  // WEFT_ names are weft's own and checked strictly; NCCL's are read as NCCL reads them.
  const std::string algo = env("WEFT_ALGO"), proto = env("WEFT_PROTO");
  if (!algo.empty() && !proto.empty()) return from(algo, proto, file);
  auto nccl =
      fromNccl(algo.empty() ? env("NCCL_ALGO") : "", proto.empty() ? env("NCCL_PROTO") : "", file);
  if (!nccl) return nccl;
  auto own = from(algo, proto, "");
  if (!own) return own.status();
  if (!algo.empty()) nccl->algorithms = own->algorithms;
  if (!proto.empty()) nccl->protocol = own->protocol;
  return nccl;
}

Tuner::Tuner(RankGraph graph, TunerOptions options)
    : graph_(graph), options_(std::move(options)), model_(options_.constants) {}

std::vector<Estimate> Tuner::candidates(Collective coll, std::size_t bytes, bool restricted,
                                        std::optional<Protocol> only) const {
  std::vector<Estimate> out;
  for (const Algorithm* a : algorithms()) {
    if (!a->supports(coll)) continue;
    if (restricted && !options_.algorithms.empty() &&
        std::find(options_.algorithms.begin(), options_.algorithms.end(), a->name()) ==
            options_.algorithms.end()) {
      continue;
    }
    if (restricted && options_.algorithms.empty() &&
        std::find(options_.unpriced.begin(), options_.unpriced.end(), a->name()) !=
            options_.unpriced.end()) {
      continue;
    }
    for (Protocol p : kAllProtocols) {
      if (restricted && options_.protocol && *options_.protocol != p) continue;
      if (restricted && !options_.protocol && only && *only != p) continue;
      if (auto e = model_.estimate(*a, coll, bytes, p, graph_)) out.push_back(*e);
    }
  }
  // Stable: equal times keep the registry's order, so every rank picks the same plan.
  std::stable_sort(out.begin(), out.end(),
                   [](const Estimate& x, const Estimate& y) { return x.timeUs < y.timeUs; });
  return out;
}

std::vector<Estimate> Tuner::explain(Collective coll, std::size_t bytes) const {
  return candidates(coll, bytes, true);
}

std::vector<Estimate> Tuner::allCandidates(Collective coll, std::size_t bytes) const {
  return candidates(coll, bytes, false);
}

void Tuner::shape(const Estimate& e, std::size_t bytes, int& channels,
                  std::size_t& chunkBytes) const {
  CostModel::shape(e.protocol, bytes, graph_.ranksPerHost, channels, chunkBytes);
}

Result<Plan> Tuner::plan(Collective coll, std::size_t bytes, std::optional<Protocol> only) const {
  std::vector<Estimate> c = candidates(coll, bytes, true, only);
  std::string reason;
  if (c.empty()) {
    c = candidates(coll, bytes, false);
    reason =
        "no algorithm allowed by WEFT_ALGO/WEFT_PROTO implements " + std::string(name(coll)) + "; ";
  }
  if (c.empty()) return unsupported("no algorithm implements " + std::string(name(coll)));
  const Estimate& best = c.front();
  Plan p;
  p.algorithm = best.algorithm;
  p.protocol = best.protocol;
  p.aggregation = best.aggregation;
  p.estimateUs = best.timeUs;
  shape(best, bytes, p.channels, p.chunkBytes);
  std::ostringstream why;
  why << reason << "cheapest of " << c.size() << " candidate(s)";
  // The pick and the runner-up, with their estimates (WEFT_DEBUG=INFO prints the reason).
  auto label = [](const Estimate& e) {
    std::ostringstream s;
    s << e.algorithm << "/" << name(e.protocol) << " " << std::fixed << std::setprecision(1)
      << e.timeUs << " us";
    return s.str();
  };
  why << ": " << label(best);
  if (c.size() > 1) why << ", runner-up " << label(c[1]);
  if (!options_.algorithms.empty() || options_.protocol) why << " allowed by WEFT_ALGO/WEFT_PROTO";
  if (!options_.tuningFile.empty()) why << ", constants from " << options_.tuningFile;
  p.reason = why.str();
  return p;
}

}  // namespace weft::algo
