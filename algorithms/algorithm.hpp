// The registry of algorithms: each turns (collective, nranks, parameters) into a Schedule.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "algorithms/schedule.hpp"
#include "weft/status.hpp"

namespace weft::algo {

struct Params {
  int root = 0;  // broadcast and reduce
  int aggregation =
      0;  // PAT: blocks per message (1..nranks/2, rounded down to a power of two); 0: default
  int groupSize = 0;  // ranks per host. hierarchical: must divide nranks (0: the largest divisor
                      // <= 8). ring with channels > 1: each channel's ring rotates within hosts
  int channels = 1;   // split every channel into this many, each moving a part of every block
  // Build only these ranks' programs (the others stay empty): how the simulator replays a few
  // representative ranks of a very large job. Such a schedule is not for the verifier.
  std::vector<int> onlyRanks = {};
};

// The ranks a generator fills: params.onlyRanks, or every rank.
std::vector<int> ranksToBuild(const Params& params, int nranks);

class Pricing;

class Algorithm {
 public:
  Algorithm(std::string_view name, std::string_view summary, std::vector<Collective> collectives)
      : name_(name), summary_(summary), collectives_(std::move(collectives)) {}
  virtual ~Algorithm() = default;
  Algorithm(const Algorithm&) = delete;
  Algorithm& operator=(const Algorithm&) = delete;

  std::string_view name() const { return name_; }
  std::string_view summary() const { return summary_; }
  const std::vector<Collective>& collectives() const { return collectives_; }
  bool supports(Collective c) const;

  // Whether every rank's peers are fixed offsets from it (rank r + G behaves as rank r shifted
  // by G), so a simulator may replay one host's ranks and shift their timelines.
  virtual bool translationSymmetric(Collective) const { return false; }

  // Whether, on nranks ranks in hosts of groupSize, every host lives host 0's timeline and the
  // message from (host b, local m) to (host 0, local l) leaves when host 0's rank m sends to
  // (host b, local l): in every round each host exchanges with one other host, which exchanges
  // with it in that round too (a matching of hosts per round, as the circle method and XOR
  // pairings make), and every host's ranks pair their local indices alike. A simulator may then
  // replay host 0's ranks alone, reading each message from the mirrored connection.
  virtual bool hostSwapSymmetric(Collective, int /*nranks*/, int /*groupSize*/) const {
    return false;
  }

  // The schedule, or an error saying why this algorithm cannot serve the request.
  Result<Schedule> build(Collective coll, int nranks, const Params& params = {}) const;

  // Its own part of an estimate (algorithms/pricing.hpp): the hop latencies, postings and bytes
  // of P's call on P's rank graph; an error where it has no estimate for the collective.
  virtual Status price(Pricing& P) const;
  // Whether its steps wait on every peer at once (two-shot's reduce and gather): ranks sharing a
  // device pay RankGraph::deviceAllPeersUs per peer past one in every pass.
  virtual bool waitsOnEveryPeer() const { return false; }

 protected:
  // Called with validated arguments: coll supported, nranks >= 1, root in range.
  virtual Result<Schedule> generate(Collective coll, int nranks, const Params& params) const = 0;

 private:
  std::string_view name_;
  std::string_view summary_;
  std::vector<Collective> collectives_;
};

// Every algorithm, in a fixed order. The registry is the one piece of global state, and it is
// immutable.
std::span<const Algorithm* const> algorithms();
const Algorithm* findAlgorithm(std::string_view name);

// One accessor per generator file.
const Algorithm& ringAlgorithm();
const Algorithm& dbtreeAlgorithm();
const Algorithm& patAlgorithm();
const Algorithm& rhdAlgorithm();
const Algorithm& oneshotAlgorithm();
const Algorithm& twoshotAlgorithm();
const Algorithm& pairwiseAlgorithm();
const Algorithm& linearAlgorithm();
const Algorithm& bruckAlgorithm();
const Algorithm& hierarchicalAlgorithm();
const Algorithm& p2pAlgorithm();

// Defaults the generators use, exposed so tools and tests can print and reuse them.
int patAggregation(int nranks, int requested);
int hierarchicalGroupSize(int nranks, int requested);

}  // namespace weft::algo
