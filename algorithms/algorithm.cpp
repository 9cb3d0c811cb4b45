#include "algorithms/algorithm.hpp"

#include <algorithm>
#include <array>

namespace weft::algo {

bool Algorithm::supports(Collective c) const {
  return std::find(collectives_.begin(), collectives_.end(), c) != collectives_.end();
}

Result<Schedule> Algorithm::build(Collective coll, int nranks, const Params& params) const {
  const std::string what = std::string(name()) + " " + std::string(weft::name(coll));
  if (!supports(coll))
    return unsupported(std::string(name()) + " does not implement " +
                       std::string(weft::name(coll)));
  if (nranks < 1)
    return invalidArgument(what + ": nranks is " + std::to_string(nranks) + ", must be >= 1");
  if (hasRoot(coll) && (params.root < 0 || params.root >= nranks)) {
    return invalidArgument(what + ": root " + std::to_string(params.root) + " is not a rank of " +
                           std::to_string(nranks));
  }
  if (params.channels < 1) return invalidArgument(what + ": channels must be >= 1");
  for (int r : params.onlyRanks) {
    if (r < 0 || r >= nranks)
      return invalidArgument(what + ": onlyRanks names rank " + std::to_string(r));
  }
  auto s = generate(coll, nranks, params);
  if (!s) return s;
  if (hasRoot(coll)) s->root = params.root;
  // Generators that lay out their own channels (rotated rings) return them already in parts.
  if (params.channels > 1 && s->partsPerBlock == 1)
    return splitChannels(*s, static_cast<std::uint32_t>(params.channels));
  return s;
}

std::vector<int> ranksToBuild(const Params& params, int nranks) {
  if (!params.onlyRanks.empty()) return params.onlyRanks;
  std::vector<int> all(static_cast<std::size_t>(nranks));
  for (int r = 0; r < nranks; ++r) all[static_cast<std::size_t>(r)] = r;
  return all;
}

std::span<const Algorithm* const> algorithms() {
  static const std::array<const Algorithm*, 11> kAll = {
      &ringAlgorithm(),         &dbtreeAlgorithm(),  &patAlgorithm(),      &rhdAlgorithm(),
      &oneshotAlgorithm(),      &twoshotAlgorithm(), &pairwiseAlgorithm(), &bruckAlgorithm(),
      &hierarchicalAlgorithm(), &linearAlgorithm(),  &p2pAlgorithm()};
  return kAll;
}

const Algorithm* findAlgorithm(std::string_view name) {
  for (const Algorithm* a : algorithms()) {
    if (a->name() == name) return a;
  }
  return nullptr;
}

Status Algorithm::price(Pricing&) const {
  return unsupported("no estimate for algorithm " + std::string(name()));
}

}  // namespace weft::algo
