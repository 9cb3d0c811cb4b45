// The tuner: for a collective and a message size, every (algorithm, protocol) the registry can run
// is priced by the cost model and the cheapest is the plan. A pure function of its inputs, so every
// rank computes the same plan; ties go to the registry's order. WEFT_ALGO and WEFT_PROTO restrict
// the candidates, a tuning file replaces the model's constants.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "algorithms/cost_model.hpp"

namespace weft::algo {

struct TunerOptions {
  std::vector<std::string> algorithms;  // allowed algorithms (WEFT_ALGO="ring,pat"); empty: all
  // Never picked unless `algorithms` names them: those the cost model does not price truly where
  // this tuner runs (set by the runtime, not the environment; allCandidates still lists them).
  std::vector<std::string> unpriced;
  std::optional<Protocol> protocol;  // WEFT_PROTO
  CostConstants constants;           // WEFT_TUNING_FILE, else the defaults
  std::string tuningFile;            // where the constants came from, for explanations

  // WEFT_ALGO / WEFT_PROTO / WEFT_TUNING_FILE (and NCCL_ALGO / NCCL_PROTO when the WEFT_ names
  // are unset). Unknown names are errors that list what is allowed.
  static Result<TunerOptions> fromEnvironment();
  static Result<TunerOptions> from(const std::string& algo, const std::string& proto,
                                   const std::string& tuningFile);
  // NCCL_ALGO / NCCL_PROTO as NCCL reads them, in weft's terms, so the values users already set
  // for NCCL never fail: Ring, Tree (weft's dbtree) and PAT map, NCCL's algorithms weft lacks
  // (CollNet*, NVLS*) are dropped, "^a,b" excludes (TunerOptions::unpriced), per-collective
  // lists ("allreduce:tree;allgather:ring") are merged; LL and Simple map and LL128 counts as
  // Simple, and a list naming both protocols leaves the choice free.
  static Result<TunerOptions> fromNccl(const std::string& algo, const std::string& proto,
                                       const std::string& tuningFile);
};

// How a plan runs: its algorithm's schedule through the FIFOs, or one of the runtime's kernels
// that need none (algorithms/selector.hpp).
enum class Kernel : std::uint8_t { schedule, slots, hostDirect, gpuDirect };
std::string_view name(Kernel k);

struct Plan {
  std::string algorithm;
  Kernel kernel = Kernel::schedule;
  Protocol protocol = Protocol::simple;
  int channels = 1;
  std::size_t chunkBytes = 0;  // bytes of one slice on one channel
  int aggregation = 0;         // PAT's A (0 for other algorithms)
  double estimateUs = 0;
  std::string reason;  // "cheapest of 6 candidates" / "forced by WEFT_ALGO=ring"
  // A compressed plan's codec ("e4m3:32"): the values cross the wire encoded, the inner
  // collectives planned on the encoded bytes (Selector::planCompressed); "" for every other.
  std::string codec;
};

class Tuner {
 public:
  Tuner(RankGraph graph, TunerOptions options = {});

  // `only`: among the candidates the options allow, just this protocol's (the caller knows a
  // protocol does not serve the call well); the options' own WEFT_PROTO wins over it.
  Result<Plan> plan(Collective coll, std::size_t bytes,
                    std::optional<Protocol> only = std::nullopt) const;
  // Every candidate the options allow, cheapest first.
  std::vector<Estimate> explain(Collective coll, std::size_t bytes) const;
  // The same without the options' restrictions: what each algorithm would cost.
  std::vector<Estimate> allCandidates(Collective coll, std::size_t bytes) const;

  // The channels and slice size a plan for this candidate would use.
  void shape(const Estimate& e, std::size_t bytes, int& channels, std::size_t& chunkBytes) const;

  const RankGraph& graph() const { return graph_; }
  const CostModel& model() const { return model_; }

 private:
  std::vector<Estimate> candidates(Collective coll, std::size_t bytes, bool restricted,
                                   std::optional<Protocol> only = std::nullopt) const;

  RankGraph graph_;
  TunerOptions options_;
  CostModel model_;
};

}  // namespace weft::algo
