// weft-plan: the algorithm CLI.
//   weft-plan list
//   weft-plan verify [--algo A] [--coll C] [--ranks 1-64,96] [--aggregation A] [--group G] ...
//   weft-plan show --algo ring --coll allreduce --ranks 4 --rank 1
//   weft-plan tp --topo hgx_h100.xml --op ag-gemm --m 1024,4096
//   weft-plan moe --topo hgx_h200.xml --nodes 1,16,128 --routing uniform,zipf:1.2
#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "algorithms/algorithm.hpp"
#include "algorithms/tools/plan_moe.hpp"
#include "algorithms/tools/plan_tp.hpp"
#include "algorithms/tools/plan_tune.hpp"
#include "algorithms/verifier.hpp"
#include "src/tools/cli.hpp"

namespace {

using weft::Collective;
using namespace weft::algo;

// "1-64,96,127" -> {1..64, 96, 127}.
std::optional<std::vector<int>> parseRanks(const std::string& text) {
  std::vector<int> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      const auto dash = item.find('-');
      std::size_t used = 0;
      if (dash == std::string::npos) {
        out.push_back(std::stoi(item, &used));
        if (used != item.size()) return std::nullopt;
      } else {
        const int lo = std::stoi(item.substr(0, dash));
        const int hi = std::stoi(item.substr(dash + 1));
        if (lo > hi) return std::nullopt;
        for (int n = lo; n <= hi; ++n) out.push_back(n);
      }
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }
  if (out.empty() || *std::min_element(out.begin(), out.end()) < 1) return std::nullopt;
  return out;
}

// One algorithm with one way of setting its parameters (PAT is checked at several aggregations).
struct Variant {
  const Algorithm* algo;
  std::string label;
  int aggregation;  // -1: the largest allowed (n/2)
};

struct Row {
  std::string label;
  Collective coll;
  std::string ranks;
  int verified = 0;
  int inPlace = 0;
  int atRanks = 0;  // the rank count the costs are shown for (the largest of the range)
  VerifyReport cost;
  std::uint32_t scratch = 0;
  std::string failure;
};

std::string rangeLabel(const std::vector<int>& ranks) {
  std::string out;
  std::size_t i = 0;
  while (i < ranks.size()) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += std::to_string(ranks[i]);
    if (j > i) out += "-" + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

std::vector<int> rootsFor(Collective coll, int n) {
  if (!weft::hasRoot(coll)) return {0};
  std::vector<int> roots{0};
  if (n / 2 != 0) roots.push_back(n / 2);
  if (n - 1 != 0 && n - 1 != n / 2) roots.push_back(n - 1);
  return roots;
}

struct VerifySettings {
  int group = 0;
  int channels = 1;
  int slices = 2;
  bool inPlace = true;
};

void verifyRange(const Variant& v, Collective coll, const std::vector<int>& ranks,
                 const VerifySettings& set, Row& row) {
  row.label = v.label;
  row.coll = coll;
  row.ranks = rangeLabel(ranks);
  for (int n : ranks) {
    for (int root : rootsFor(coll, n)) {
      Params params;
      params.root = root;
      params.aggregation = v.aggregation < 0 ? std::max(1, n / 2) : v.aggregation;
      params.groupSize = set.group;
      params.channels = set.channels;
      auto schedule = v.algo->build(coll, n, params);
      if (!schedule) {
        row.failure = "n=" + std::to_string(n) + ": " + schedule.status().toString();
        return;
      }
      for (bool inPlace : {false, true}) {
        if (inPlace && !set.inPlace) continue;
        const VerifyReport rep = verify(*schedule, {inPlace, set.slices});
        if (!rep.ok()) {
          row.failure = "n=" + std::to_string(n) +
                        (weft::hasRoot(coll) ? " root=" + std::to_string(root) : "") +
                        (inPlace ? " in-place" : "") + ": " + std::string(name(rep.fault)) + ": " +
                        rep.message;
          return;
        }
        if (root == 0 && !inPlace && n >= row.atRanks) {
          row.atRanks = n;
          row.cost = rep;
          row.scratch = schedule->scratchBlocks;
        }
      }
    }
    ++row.verified;
    if (set.inPlace) ++row.inPlace;
  }
}

int runVerify(const std::string& algoName, const std::string& collName,
              const std::string& ranksText, int aggregation, const VerifySettings& set) {
  std::vector<std::vector<int>> ranges;
  if (ranksText.empty()) {
    std::vector<int> small;
    for (int n = 1; n <= 64; ++n) small.push_back(n);
    ranges = {small, {96, 127, 128, 255, 256, 1000}};
  } else {
    auto parsed = parseRanks(ranksText);
    if (!parsed) {
      std::cerr << "weft-plan: --ranks '" << ranksText << "' is not a list like 1-64,96,127\n";
      return weft::tools::kExitUsage;
    }
    ranges = {*parsed};
  }
  std::optional<Collective> onlyColl;
  if (!collName.empty()) {
    onlyColl = weft::parseCollective(collName);
    if (!onlyColl) {
      std::cerr << "weft-plan: unknown collective '" << collName << "'\n";
      return weft::tools::kExitUsage;
    }
  }
  std::vector<Variant> variants;
  for (const Algorithm* a : algorithms()) {
    if (!algoName.empty() && a->name() != algoName) continue;
    if (a->name() == "pat" && aggregation == 0) {
      variants.push_back({a, "pat(A=1)", 1});
      variants.push_back({a, "pat", 0});
      variants.push_back({a, "pat(A=n/2)", -1});
    } else {
      variants.push_back({a, std::string(a->name()), aggregation});
    }
  }
  if (variants.empty()) {
    std::cerr << "weft-plan: unknown algorithm '" << algoName << "' (see weft-plan list)\n";
    return weft::tools::kExitUsage;
  }

  const auto start = std::chrono::steady_clock::now();
  struct Job {
    const Variant* variant;
    Collective coll;
    const std::vector<int>* ranks;
  };
  std::vector<Job> jobs;
  for (const Variant& v : variants) {
    for (Collective c : v.algo->collectives()) {
      if (onlyColl && *onlyColl != c) continue;
      for (const auto& ranks : ranges) jobs.push_back({&v, c, &ranks});
    }
  }
  // Rows are independent: verify them on every core, print them in order.
  std::vector<Row> rows(jobs.size());
  std::atomic<std::size_t> next{0};
  auto worker = [&] {
    for (std::size_t i = next++; i < jobs.size(); i = next++) {
      verifyRange(*jobs[i].variant, jobs[i].coll, *jobs[i].ranks, set, rows[i]);
    }
  };
  const unsigned threads = std::max(1u, std::min(8u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (rows.empty()) {
    std::cerr << "weft-plan: " << algoName << " does not implement " << collName << "\n";
    return weft::tools::kExitUsage;
  }

  // memory stays the last column (scripts/gpu-memory-fraction.py reads it there).
  std::printf("%-13s %-14s %-22s %8s %8s %6s %6s %6s %10s %7s %7s %8s %10s\n", "algorithm",
              "collective", "ranks", "verified", "in-place", "at n", "steps", "msgs", "bytes/rank",
              "max msg", "scratch", "folded", "memory");
  int failures = 0;
  long schedules = 0;
  for (const Row& r : rows) {
    schedules += r.verified;
    std::printf("%-13s %-14s %-22s %8d %8d %6d %6u %6u %10.4f %7u %7u %8.4f %10.4f\n",
                r.label.c_str(), std::string(weft::name(r.coll)).c_str(), r.ranks.c_str(),
                r.verified, r.inPlace, r.atRanks, r.cost.maxSteps, r.cost.maxMessages,
                r.cost.maxBytes, r.cost.maxMessageBlocks, r.scratch, r.cost.maxReduced,
                r.cost.totalMemory);
    if (!r.failure.empty()) {
      ++failures;
      std::printf("  FAILED %s\n", r.failure.c_str());
    }
  }
  std::printf("\n%ld rank counts verified over %zu rows in %.1f s: %s\n", schedules, rows.size(),
              seconds, failures == 0 ? "all correct" : "FAILURES");
  std::printf(
      "(steps, msgs and bytes/rank: the largest over ranks, at n = 'at n'; bytes as a "
      "multiple of the message size; max msg in blocks; folded: bytes the busiest rank combines "
      "into others in its reductions (k inputs fold k - 1), and memory: bytes every rank "
      "together reads and writes (sources, destinations, each message into and out of a FIFO "
      "slot), both as multiples of the message size, at n = 'at n')\n");
  return failures == 0 ? 0 : 1;
}

int runShow(const std::string& algoName, const std::string& collName, int nranks, int rank,
            const weft::algo::Params& params) {
  const Algorithm* a = findAlgorithm(algoName);
  if (a == nullptr) {
    std::cerr << "weft-plan: unknown algorithm '" << algoName << "' (see weft-plan list)\n";
    return weft::tools::kExitUsage;
  }
  const auto coll = weft::parseCollective(collName);
  if (!coll) {
    std::cerr << "weft-plan: unknown collective '" << collName << "'\n";
    return weft::tools::kExitUsage;
  }
  if (rank < 0 || rank >= nranks) {
    std::cerr << "weft-plan: --rank " << rank << " is not a rank of " << nranks << "\n";
    return weft::tools::kExitUsage;
  }
  auto s = a->build(*coll, nranks, params);
  if (!s) {
    std::cerr << "weft-plan: " << s.status().toString() << "\n";
    return weft::tools::kExitUsage;
  }
  const VerifyReport rep = verify(*s);
  std::printf(
      "%s %s, %d ranks, rank %d: %u block(s) per segment, %u scratch block(s), verifier: %s\n",
      a->name().data(), std::string(weft::name(*coll)).c_str(), nranks, rank, s->blocksPerSegment,
      s->scratchBlocks,
      rep.ok() ? "correct" : (std::string(name(rep.fault)) + ": " + rep.message).c_str());
  std::cout << describe(*s, rank);
  return rep.ok() ? 0 : 1;
}

// --share N, --sms and --memory-gbs: ranks sharing one GPU, priced as the runtime prices them
// (tune and tp).
void addShareOptions(CLI::App* cmd, int& share, int& sms, double& memoryPeakGBs, int leastShare,
                     const char* shareHelp, const char* memoryHelp) {
  cmd->add_option("--share", share, shareHelp)->check(CLI::Range(leastShare, 1024));
  cmd->add_option("--sms", sms, "with --share: the GPU's SMs (its ranks' channels)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  cmd->add_option("--memory-gbs", memoryPeakGBs, memoryHelp)->check(CLI::Range(1.0, 1e6));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"weft-plan: build, verify and print weft's collective schedules"};
  weft::tools::addVersionFlag(app, "weft-plan");
  app.require_subcommand(1);

  std::string algo, coll, ranks;
  int aggregation = 0, group = 0, channels = 1, slices = 2, root = 0, rank = 0;
  bool noInPlace = false;

  app.add_subcommand("list", "list the algorithms and the collectives each implements");

  auto* verifyCmd = app.add_subcommand("verify", "verify schedules and print their costs");
  verifyCmd->add_option("--algo", algo, "only this algorithm");
  verifyCmd->add_option("--coll", coll, "only this collective");
  verifyCmd->add_option("--ranks", ranks,
                        "rank counts, e.g. 1-64,96 (default 1-64 and 96,127,128,255,256,1000)");
  verifyCmd->add_option("--aggregation", aggregation,
                        "PAT blocks per message (default: 1, 8 and n/2)");
  verifyCmd->add_option("--group", group,
                        "hierarchical and pairwise: ranks per node (default: hierarchical the\n"
                        "largest divisor <= 8, pairwise none)");
  verifyCmd->add_option("--channels", channels, "split each schedule over this many channels")
      ->check(CLI::Range(1, 64));
  verifyCmd->add_option("--slices", slices, "passes of each program back to back")
      ->check(CLI::Range(1, 16));
  verifyCmd->add_flag("--no-inplace", noInPlace, "skip the in-place variants");

  auto* showCmd = app.add_subcommand("show", "print one rank's steps");
  showCmd->add_option("--algo", algo, "algorithm")->required();
  showCmd->add_option("--coll", coll, "collective")->required();
  showCmd->add_option("--ranks", ranks, "number of ranks")->required();
  showCmd->add_option("--rank", rank, "which rank to print");
  showCmd->add_option("--root", root, "root of broadcast/reduce");
  showCmd->add_option("--aggregation", aggregation, "PAT blocks per message");
  showCmd->add_option("--group", group, "hierarchical and pairwise: ranks per node");
  showCmd->add_option("--channels", channels, "channels")->check(CLI::Range(1, 64));

  weft::algo::TuneArgs tune;
  auto* tuneCmd = app.add_subcommand(
      "tune", "the tuner's pick per size, every candidate simulated, and the regret");
  tuneCmd->add_option("--topo", tune.topo,
                      "topology file(s), comma-separated (with --host-ranks: optional, its "
                      "fastest NIC the network's rate)");
  tuneCmd->add_option("--nodes", tune.nodes,
                      "hosts of that kind on a rail-optimized fabric, comma-separated");
  tuneCmd->add_option("--coll", tune.colls, "collective(s), comma-separated")->required();
  tuneCmd->add_option("--sizes", tune.sizes,
                      "MIN:MAX[:FACTOR] in bytes, K/M/G suffixes (default 8:4G)");
  tuneCmd->add_option("--svg", tune.svg, "write busbw vs size per algorithm, picks marked");
  tuneCmd->add_option("--tuning", tune.tuningFile,
                      "JSON tuning file (else WEFT_TUNING_FILE, else defaults)");
  tuneCmd->add_flag("--summary", tune.summary, "only the worst regret of each combination");
  tuneCmd->add_flag("--schedules", tune.schedules,
                    "the tuner's picks among schedules alone (the simulator replays every one), "
                    "not the runtime selector's (which adds the GPU direct kernels)");
  tuneCmd->add_option("--compress", tune.compress,
                      "also weigh the calls crossing as fp8 (fp8e4m3:32, fp8e5m2:128; bf16 "
                      "values), as weftAllReduceEx does");
  tuneCmd->add_flag("--candidates", tune.candidates,
                    "per size, every candidate's estimate next to its simulated time");
  tuneCmd
      ->add_option("--host-ranks", tune.hostRanks,
                   "host memory, this many ranks a host, priced as the runtime prices them (the "
                   "network from the tuning file's net_gbs, else --topo's NIC, else 10 GbE); "
                   "estimates only, the simulator replays GPU memory")
      ->check(CLI::Range(0, 1024));
  tuneCmd
      ->add_option("--cores-per-rank", tune.coresPerRank,
                   "with --host-ranks: each rank's share of a core (0.25: 8 ranks on 2 cores)")
      ->capture_default_str();
  addShareOptions(tuneCmd, tune.share, tune.sms, tune.memoryPeakGBs, 0,
                  "GPU memory, this many ranks sharing one GPU (processes under MPS), priced as "
                  "the runtime prices them; estimates only",
                  "with --share: the GPU's peak memory rate in GB/s, as CUDA reports it (3352 for "
                  "an H100 SXM; default: the H200's), which the copies' price scales with");
  auto* settle = tuneCmd->add_flag(
      "--settle", tune.settle, "replay until each candidate's link sharing settles (not 3 passes)");
  tuneCmd
      ->add_flag("--fluid", tune.fluid,
                 "replay with every link shared at every instant by the transfers on it "
                 "(exact, slower; not the 3 passes)")
      ->excludes(settle);

  weft::algo::TpArgs tp;
  auto* tpCmd = app.add_subcommand(
      "tp",
      "the pick for all-gather + GEMM or GEMM + reduce-scatter per row count, and each "
      "variant's estimate (the runtime's Selector::planTp)");
  tpCmd->add_option("--topo", tp.topo, "topology file")->required();
  tpCmd->add_option("--nodes", tp.nodes, "hosts of that topology")->capture_default_str();
  tpCmd->add_option("--op", tp.op, "ag-gemm or gemm-rs")->required();
  tpCmd->add_option("--m", tp.m, "the GEMM's rows, a list")->capture_default_str();
  tpCmd->add_option("--n", tp.n, "the GEMM's columns (0: 28672 for ag-gemm, 8192 for gemm-rs)");
  tpCmd->add_option("--k", tp.k, "the GEMM's depth (0: 8192 for ag-gemm, 28672 for gemm-rs)");
  tpCmd->add_option("--tuning", tp.tuningFile, "a tuning file's constants instead of the defaults");
  addShareOptions(tpCmd, tp.share, tp.sms, tp.memoryPeakGBs, 1,
                  "this many ranks sharing the topology's first GPU (processes under MPS), "
                  "priced as the runtime prices them",
                  "the GPUs' peak memory rate in GB/s, as CUDA reports it (3352 for an H100 "
                  "SXM; default: the H200's), which the GEMMs' and copies' prices scale with");

  weft::algo::MoeArgs moe;
  auto* moeCmd = app.add_subcommand(
      "moe",
      "MoE dispatch and combine for simulated routings: each rank's traffic, the busiest rank "
      "and the estimates (the runtime's Selector::planMoe)");
  moeCmd->add_option("--topo", moe.topo, "topology file")->required();
  moeCmd->add_option("--nodes", moe.nodes, "hosts of that topology, a list")->capture_default_str();
  moeCmd->add_option("--tokens", moe.tokens, "tokens a rank")->capture_default_str();
  moeCmd->add_option("--hidden", moe.hidden, "a token's values")->capture_default_str();
  moeCmd->add_option("--topk", moe.topk, "experts a token")->capture_default_str();
  moeCmd->add_option("--experts", moe.experts, "experts in all")->capture_default_str();
  moeCmd->add_option("--dispatch", moe.dispatch, "fp8 (with per-128 scales) or bf16")
      ->capture_default_str();
  moeCmd->add_option("--routing", moe.routing, "uniform or zipf:ALPHA, a list")
      ->capture_default_str();
  moeCmd->add_option("--seed", moe.seed, "the simulation's seed")->capture_default_str();
  moeCmd
      ->add_option("--host-ranks", moe.hostRanks,
                   "host memory, this many ranks a host: across hosts the flat and the "
                   "hierarchical path, each priced, and the pick (0: GPU memory, a rank a GPU)")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  moeCmd->add_option("--tuning", moe.tuningFile,
                     "a tuning file's constants instead of the defaults");
  if (auto rc = weft::tools::parse(app, argc, argv)) return *rc;

  if (app.got_subcommand("tune")) return weft::algo::runTune(tune);
  if (app.got_subcommand("tp")) return weft::algo::runTp(tp);
  if (app.got_subcommand("moe")) return weft::algo::runMoe(moe);

  if (app.got_subcommand("list")) {
    for (const Algorithm* a : algorithms()) {
      std::string colls;
      for (Collective c : a->collectives())
        colls += (colls.empty() ? "" : ",") + std::string(weft::name(c));
      std::printf("%-13s %-50s %s\n", a->name().data(), colls.c_str(), a->summary().data());
    }
    return 0;
  }
  if (app.got_subcommand("verify")) {
    return runVerify(algo, coll, ranks, aggregation, {group, channels, slices, !noInPlace});
  }
  int n = 0;
  try {
    std::size_t used = 0;
    n = std::stoi(ranks, &used);
    if (used != ranks.size() || n < 1) throw std::invalid_argument(ranks);
  } catch (const std::exception&) {
    std::cerr << "weft-plan: --ranks must be a single rank count >= 1 for show\n";
    return weft::tools::kExitUsage;
  }
  weft::algo::Params params;
  params.root = root;
  params.aggregation = aggregation;
  params.groupSize = group;
  params.channels = channels;
  return runShow(algo, coll, n, rank, params);
}
