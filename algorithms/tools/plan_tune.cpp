// weft-plan tune: the tuner's pick per size next to every candidate's simulated time, and the
// regret (simulated time of the pick / best simulated time).
#include "algorithms/tools/plan_tune.hpp"

#include "algorithms/compression.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "algorithms/rank_graph.hpp"
#include "algorithms/selector.hpp"
#include "algorithms/simulator.hpp"
#include "algorithms/tuner.hpp"
#include "src/tools/cli.hpp"
#include "src/tools/progress.hpp"
#include "src/tools/svg_axes.hpp"
#include "topology/system.hpp"

namespace weft::algo {
namespace {

// Replays cost about steps x ranks; beyond this a candidate is reported as not simulated.
constexpr double kStepBudget = 3e7;

std::optional<std::size_t> parseBytes(std::string s) {
  if (s.empty()) return std::nullopt;
  std::size_t mult = 1;
  const char last = static_cast<char>(std::toupper(static_cast<unsigned char>(s.back())));
  if (last == 'K' || last == 'M' || last == 'G' || last == 'T') {
    mult = last == 'K'   ? 1ull << 10
           : last == 'M' ? 1ull << 20
           : last == 'G' ? 1ull << 30
                         : 1ull << 40;
    s.pop_back();
  }
  try {
    std::size_t used = 0;
    const unsigned long long v = std::stoull(s, &used);
    if (used != s.size()) return std::nullopt;
    return static_cast<std::size_t>(v) * mult;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::string human(std::size_t b) {
  const char* units[] = {"B", "K", "M", "G", "T"};
  int u = 0;
  double v = double(b);
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, v == std::floor(v) ? "%.0f%s" : "%.1f%s", v, units[u]);
  return buf;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

struct Candidate {
  Estimate estimate;
  std::optional<SimResult> sim;  // empty: too large to replay
};

struct SizeRow {
  std::size_t bytes = 0;
  Plan plan;
  std::vector<Candidate> candidates;
  double pickSim = 0, bestSim = 0;
  std::string best;
  std::optional<double> regret;
};

std::string label(const Estimate& e) {
  return e.algorithm + "/" + std::string(name(e.protocol));
}

// How every candidate is replayed.
SimOptions replayOptions(const TuneArgs& args) {
  SimOptions o;
  o.settle = args.settle;
  o.fluid = args.fluid;
  return o;
}

// Prices and replays every candidate at every size for one system and collective.
std::vector<SizeRow> sweep(const topo::System& system, Collective coll,
                           const std::vector<std::size_t>& sizes, const TunerOptions& options,
                           const SimOptions& replay, bool schedules,
                           const std::optional<weftCompression>& compress,
                           tools::Progress* progress = nullptr) {
  // The runtime's GPU selector on these ranks (schedules and the direct kernels), or with
  // --schedules the tuner alone: every pick a schedule the simulator replays.
  const Selector selector = gpuSelectorFor(system, options);
  const Tuner plain(RankGraph::fromSystem(system), options);
  const Tuner& tuner = schedules ? plain : selector.tuner();
  const Simulator sim(system, options.constants);
  std::vector<SizeRow> rows;
  std::map<std::string, double>
      stepsPerRank;  // algorithm -> steps of rank 0 (size independent but PAT's A)
  for (std::size_t bytes : sizes) {
    SizeRow row;
    row.bytes = bytes;
    // With --compress the selector weighs the compressed variant too (its codec unreplayed).
    auto plan = compress
                    ? selector.planCompressed(coll, bytes, codecShapeOf(*compress, DataType::bf16),
                                              compress->always != 0)
                : schedules ? tuner.plan(coll, bytes)
                            : selector.plan(coll, bytes);
    if (progress != nullptr) progress->step();  // a size begun: what the line counts
    if (!plan) continue;
    row.plan = *plan;
    for (const Estimate& e : tuner.allCandidates(coll, bytes)) {
      Candidate c{e, std::nullopt};
      const Algorithm& a = *findAlgorithm(e.algorithm);
      SimOptions o = replay;
      o.protocol = e.protocol;
      o.aggregation = e.aggregation;
      tuner.shape(e, bytes, o.channels, o.chunkBytes);
      // Budget: a full replay runs every rank's steps; a symmetric one only host 0's.
      Params probe;
      probe.onlyRanks = {0};
      probe.aggregation = e.aggregation;
      probe.groupSize = system.gpusPerHost();
      const std::string key = e.algorithm + "/" + std::to_string(e.aggregation);
      if (!stepsPerRank.count(key)) {
        auto s = a.build(coll, system.ranks(), probe);
        stepsPerRank[key] = s ? double(s->program(0, 0).steps().size() + 1) : 0;
      }
      const double replayed = sim.replaysHostZero(a, coll) ? system.gpusPerHost() : system.ranks();
      if (stepsPerRank[key] * replayed * o.channels <= kStepBudget) {
        if (auto r = sim.run(a, coll, bytes, o)) c.sim = *r;
      }
      row.candidates.push_back(c);
    }
    row.bestSim = 0;
    for (const Candidate& c : row.candidates) {
      if (!c.sim) continue;
      if (row.best.empty() || c.sim->timeUs < row.bestSim) {
        row.bestSim = c.sim->timeUs;
        row.best = label(c.estimate);
      }
      if (c.estimate.algorithm == row.plan.algorithm && c.estimate.protocol == row.plan.protocol)
        row.pickSim = c.sim->timeUs;
    }
    if (row.pickSim > 0 && row.bestSim > 0) row.regret = row.pickSim / row.bestSim;
    rows.push_back(std::move(row));
  }
  return rows;
}

double busbw(Collective coll, int n, std::size_t bytes, double us) {
  return us > 0 ? double(bytes) * busBandwidthFactor(coll, n) / (us * 1e3) : 0;
}

// "ring/simple", or "oneshot/direct" for a direct kernel: the pick as the table prints it.
std::string pickLabel(const Plan& p) {
  if (!p.codec.empty()) return "compressed " + p.codec;
  return p.algorithm + "/" +
         (p.kernel == Kernel::gpuDirect ? std::string("direct") : std::string(name(p.protocol)));
}

// Busbw from the simulated time against size (log2), one line per algorithm at its better
// protocol, and the tuner's pick at each size as a marker (colour: algorithm, shape: protocol) on
// a grey band; the legend right of the plot area, clear of the data.
void writeSvg(const std::string& path, const std::vector<SizeRow>& rows, Collective coll, int n,
              const std::string& title) {
  namespace svg = tools::svg;
  std::map<std::string, std::vector<std::pair<double, double>>> lines;  // (bytes, busbw)
  struct Pick {
    double bytes, busbw;
    std::string plan;
  };
  std::vector<Pick> picks;
  int unsimulated = 0;  // sizes whose pick was not replayed: no marker
  double lo = HUGE_VAL, hi = 0;
  for (const SizeRow& r : rows) {
    std::map<std::string, double> best;
    for (const Candidate& c : r.candidates) {
      if (c.sim) {
        best[c.estimate.algorithm] =
            std::max(best[c.estimate.algorithm], busbw(coll, n, r.bytes, c.sim->timeUs));
      }
    }
    for (const auto& [a, bw] : best) {
      if (bw <= 0) continue;
      lines[a].push_back({double(r.bytes), bw});
      lo = std::min(lo, bw);
      hi = std::max(hi, bw);
    }
    if (r.pickSim > 0) {
      picks.push_back({double(r.bytes), busbw(coll, n, r.bytes, r.pickSim), pickLabel(r.plan)});
    } else {
      ++unsimulated;
    }
  }
  if (!std::isfinite(lo)) lo = 0;

  constexpr double kLeft = 92, kPlotW = 600, kTop = 76, kPlotH = 380;
  const svg::Axis x = svg::sizeAxis(rows.empty() ? 1 : double(rows.front().bytes),
                                    rows.empty() ? 2 : double(rows.back().bytes), kLeft,
                                    kLeft + kPlotW, "message size (bytes, log scale)");
  svg::Axis y = svg::valueAxis(lo, hi, kTop + kPlotH, kTop, "");
  y.title = std::string("simulated bus bandwidth (GB/s") + (y.logarithmic() ? ", log scale)" : ")");

  std::string body = svg::frame(x, y);
  constexpr const char* kBand = "#d6d6d6";  // under the lines: the pick's busbw, size to size
  std::vector<std::pair<double, double>> band;
  for (const Pick& p : picks) {
    if (y.shows(p.busbw)) band.push_back({x.pixel(p.bytes), y.pixel(p.busbw)});
  }
  body += svg::polyline(band, kBand, 11);
  svg::Legend legend(kLeft + kPlotW + 28, kTop - 6);
  legend.heading("Algorithm (better protocol)");
  for (const auto& [a, pts] : lines) {
    const std::string color = svg::algorithmColor(a);
    std::vector<std::pair<double, double>> pixels;
    for (const auto& [bytes, bw] : pts) pixels.push_back({x.pixel(bytes), y.pixel(bw)});
    body += svg::polyline(pixels, color, 1.8);
    for (const auto& [px, py] : pixels) body += svg::marker(svg::Shape::circle, px, py, 2.2, color);
    legend.line(a, color, 1.8);
  }
  legend.heading("Tuner's pick per size");
  legend.line("path of the picks", kBand, 11);
  std::vector<std::string> seen;
  for (const Pick& p : picks) {
    const auto [algorithm, protocol] = svg::splitPlan(p.plan);
    const svg::Shape shape = svg::protocolShape(protocol);
    const std::string color = svg::algorithmColor(algorithm);
    if (y.shows(p.busbw))
      body += svg::marker(shape, x.pixel(p.bytes), y.pixel(p.busbw), 5, color, "#111111", 0.9);
    if (std::find(seen.begin(), seen.end(), p.plan) != seen.end()) continue;
    seen.push_back(p.plan);
    legend.point(p.plan, shape, color, "#111111", 0.9);
  }
  if (unsimulated > 0) legend.note(std::to_string(unsimulated) + " size(s): pick not simulated");

  const double width = std::max(860.0, kLeft + kPlotW + 28 + legend.width() + 16);
  const double height = std::max(kTop + kPlotH + 58, legend.bottom() + 16);
  std::ofstream out(path);
  out << svg::open(width, height)
      << svg::text(kLeft, 28, "weft-plan tune: " + title + ", " + std::to_string(n) + " ranks", 16,
                   "start", "font-weight='bold'")
      << svg::text(kLeft, 50,
                   "bus bandwidth from the simulator's time; each algorithm at its better protocol",
                   12, "start", "fill='#555'")
      << body << legend.svg() << "</svg>\n";
}

// Every candidate's estimate beside the selector's pick, per size: where no replay prices them
// (host memory, ranks sharing a GPU).
void printEstimates(const Selector& selector, Collective coll,
                    const std::vector<std::size_t>& sizes, const TuneArgs& args,
                    const std::optional<weftCompression>& compress) {
  const Tuner& tuner = selector.tuner();
  std::vector<std::vector<Estimate>> all;
  std::set<std::string> algos;
  for (std::size_t bytes : sizes) {
    all.push_back(tuner.allCandidates(coll, bytes));
    for (const Estimate& e : all.back()) algos.insert(e.algorithm);
  }
  std::printf("%8s  %-20s %10s", "size", "pick", "est us");
  for (const auto& a : algos) std::printf(" %12s", a.c_str());
  std::printf("   (each algorithm's estimate, us, at its cheaper protocol)\n");
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const std::size_t bytes = sizes[i];
    auto plan = compress
                    ? selector.planCompressed(coll, bytes, codecShapeOf(*compress, DataType::bf16),
                                              compress->always != 0)
                : args.schedules ? tuner.plan(coll, bytes)
                                 : selector.plan(coll, bytes);
    char est[32] = "-";
    if (plan) std::snprintf(est, sizeof est, "%.1f", plan->estimateUs);
    std::printf("%8s  %-20s %10s", human(bytes).c_str(), plan ? pickLabel(*plan).c_str() : "none",
                est);
    for (const auto& a : algos) {
      double best = 0;
      for (const Estimate& e : all[i]) {
        if (e.algorithm == a && (best == 0 || e.timeUs < best)) best = e.timeUs;
      }
      if (best > 0) {
        std::printf(" %12.1f", best);
      } else {
        std::printf(" %12s", "");
      }
    }
    std::printf("\n");
    if (!args.candidates) continue;
    for (const Estimate& e : all[i]) {
      std::printf("%8s  %-20s %10.1f   latency %.1f, bytes %.1f\n", "", label(e).c_str(), e.timeUs,
                  e.latencyUs, e.bandwidthUs);
    }
    // Ranks sharing a device: the direct kernels at their own memory traffic, whether or not
    // they serve this size.
    const RankGraph& g = tuner.graph();
    if (g.deviceCopyGBs <= 0 || CostModel::directTraffic(coll, false, g.nranks) < 0) continue;
    for (bool two : {false, true}) {
      if (two && coll != Collective::allReduce) continue;
      for (Protocol proto : {Protocol::ll, Protocol::simple}) {
        auto e = tuner.model().directEstimate(coll, bytes, proto, g, two);
        if (!e) continue;
        std::printf("%8s  %-20s %10.1f   latency %.1f, bytes %.1f (direct kernel)\n", "",
                    label(*e).c_str(), e->timeUs, e->latencyUs, e->bandwidthUs);
      }
    }
  }
}

// Host memory (--host-ranks): the runtime's host selector on hosts of that many ranks, with
// every candidate's estimate beside the pick. The simulator replays GPU systems only: no regret.
int tuneHosts(const TuneArgs& args, const std::vector<std::size_t>& sizes,
              const std::vector<int>& nodes, const std::vector<Collective>& colls,
              const TunerOptions& options, const std::vector<topo::Topology>& hosts,
              const std::optional<weftCompression>& compress) {
  // The runtime's host selector: the network's rate from the tuning file's net_gbs, else the
  // topology's fastest NIC, else 10 GbE.
  const double nicGBs = hosts.empty() ? 0 : hosts[0].fastestNicGBs();
  const char* netFrom = options.constants.graphs.netGBs > 0 ? "net_gbs of the tuning file"
                        : nicGBs > 0                        ? "the topology's fastest NIC"
                                                            : "10 GbE: no NIC known";
  for (int hostCount : nodes) {
    const Placement placement = Placement::regular(args.hostRanks * hostCount, hostCount, 0);
    const Selector selector = hostSelectorFor(placement, nicGBs, options, args.coresPerRank);
    for (Collective coll : colls) {
      std::printf(
          "host memory, %d host(s) x %d rank(s): %s; copying at %.3g GB/s, %.3g core(s) a "
          "rank; ",
          hostCount, args.hostRanks, std::string(name(coll)).c_str(),
          selector.options().constants.graphs.hostCopyGBs, args.coresPerRank);
      if (hostCount == 1) {
        std::printf("one host: the runtime's slots and direct path are not priced here\n");
      } else {
        std::printf("%.3g GB/s a host's network (%s)\n",
                    hostNetworkGBs(options.constants.graphs, nicGBs), netFrom);
      }
      printEstimates(selector, coll, sizes, args, compress);
    }
  }
  return 0;
}

// Ranks sharing one GPU (--share): the runtime's selector for them (sharedGpuSelectorFor), every
// candidate's estimate beside the pick; the simulator replays a rank a GPU only.
int tuneShared(const TuneArgs& args, const std::vector<std::size_t>& sizes,
               const std::vector<Collective>& colls, const TunerOptions& options,
               const std::optional<weftCompression>& compress) {
  const Selector selector = sharedGpuSelectorFor(args.share, args.sms, options,
                                                 !args.tuningFile.empty(), args.memoryPeakGBs);
  const RankGraph& g = selector.tuner().graph();
  for (Collective coll : colls) {
    std::printf(
        "%d ranks sharing one GPU of %d SMs: %s; its memory at %.4g GB/s, %d channel(s) a "
        "call\n",
        args.share, args.sms, std::string(name(coll)).c_str(), g.deviceCopyGBs, g.deviceChannels);
    printEstimates(selector, coll, sizes, args, compress);
  }
  return 0;
}

}  // namespace

Result<TunerOptions> tunerOptions(const std::string& tuningFile) {
  auto options = TunerOptions::fromEnvironment();
  if (!options || tuningFile.empty()) return options;
  auto c = CostConstants::fromJsonFile(tuningFile);
  if (!c) return c.status();
  options->constants = *c;
  options->tuningFile = tuningFile;
  return options;
}

std::optional<Described> describedMachine(const std::string& topoFile,
                                          const std::string& tuningFile) {
  auto options = tunerOptions(tuningFile);
  if (!options) {
    std::cerr << "weft-plan: " << options.status().toString() << "\n";
    return std::nullopt;
  }
  auto host = topo::Topology::load(topoFile);
  if (!host) {
    std::cerr << "weft-plan: " << host.status().toString() << "\n";
    return std::nullopt;
  }
  return Described{std::move(*options), std::move(*host)};
}

int runTune(const TuneArgs& args) {
  const auto sizeParts = [&] {
    std::vector<std::string> p;
    std::stringstream ss(args.sizes);
    std::string item;
    while (std::getline(ss, item, ':')) p.push_back(item);
    return p;
  }();
  const auto lo = sizeParts.size() >= 1 ? parseBytes(sizeParts[0]) : std::nullopt;
  const auto hi = sizeParts.size() >= 2 ? parseBytes(sizeParts[1]) : lo;
  const int factor = sizeParts.size() >= 3 ? std::atoi(sizeParts[2].c_str()) : 2;
  if (!lo || !hi || *lo < 1 || *hi < *lo || factor < 2) {
    std::cerr << "weft-plan: --sizes must read MIN:MAX[:FACTOR], e.g. 8:4G or 8:4G:4\n";
    return tools::kExitUsage;
  }
  std::vector<std::size_t> sizes;
  for (std::size_t b = *lo; b <= *hi; b *= static_cast<std::size_t>(factor)) sizes.push_back(b);

  auto options = tunerOptions(args.tuningFile);
  if (!options) {
    std::cerr << "weft-plan: " << options.status().toString() << "\n";
    return tools::kExitFailed;
  }
  std::vector<topo::Topology> hosts;
  std::vector<std::string> hostNames;
  for (const std::string& f : split(args.topo)) {
    auto t = topo::Topology::load(f);
    if (!t) {
      std::cerr << "weft-plan: " << t.status().toString() << "\n";
      return tools::kExitFailed;
    }
    hosts.push_back(std::move(*t));
    hostNames.push_back(f.substr(f.find_last_of('/') + 1));
  }
  std::vector<int> nodes;
  for (const std::string& s : split(args.nodes)) nodes.push_back(std::max(1, std::atoi(s.c_str())));
  std::vector<Collective> colls;
  for (const std::string& s : split(args.colls)) {
    auto c = parseCollective(s);
    if (!c) {
      std::cerr << "weft-plan: unknown collective '" << s << "'\n";
      return tools::kExitUsage;
    }
    colls.push_back(*c);
  }
  const bool onHosts = args.hostRanks > 0, shared = args.share > 0;
  if ((hosts.empty() && !onHosts && !shared) || nodes.empty() || colls.empty()) {
    std::cerr << "weft-plan: tune needs --topo (or --host-ranks, or --share), --nodes and --coll\n";
    return tools::kExitUsage;
  }
  if (onHosts && shared) {
    std::cerr << "weft-plan: --host-ranks and --share price different memories: pick one\n";
    return tools::kExitUsage;
  }
  if ((onHosts || shared) && (args.summary || !args.svg.empty() || args.settle || args.fluid)) {
    std::cerr << "weft-plan: " << (onHosts ? "--host-ranks" : "--share")
              << " is priced without the simulator's replay: drop --summary, --svg, --settle and "
                 "--fluid\n";
    return tools::kExitUsage;
  }
  if (!(args.coresPerRank > 0)) {
    std::cerr << "weft-plan: --cores-per-rank must be above 0\n";
    return tools::kExitUsage;
  }

  std::optional<weftCompression> compress;
  if (!args.compress.empty()) {
    auto c = parseCompression(args.compress);
    if (!c) {
      std::cerr << "weft-plan: --compress " << c.status().message() << "\n";
      return tools::kExitUsage;
    }
    for (Collective coll : colls) {
      if (Status s = compressible(coll, DataType::bf16, RedOp::sum, "--compress"); !s) {
        std::cerr << "weft-plan: " << s.message() << "\n";
        return tools::kExitUsage;
      }
    }
    if (args.schedules) {
      std::cerr << "weft-plan: --compress weighs the selector's picks: drop --schedules\n";
      return tools::kExitUsage;
    }
    if (compresses(*c)) compress = *c;
  }

  if (onHosts) return tuneHosts(args, sizes, nodes, colls, *options, hosts, compress);
  if (shared) return tuneShared(args, sizes, colls, *options, compress);

  const bool detailed =
      hosts.size() == 1 && nodes.size() == 1 && colls.size() == 1 && !args.summary;
  if (detailed) {
    const topo::System system(hosts[0], nodes[0]);
    const Collective coll = colls[0];
    std::vector<SizeRow> rows;
    {
      tools::Progress progress("weft-plan tune: sizes", sizes.size());
      rows = sweep(system, coll, sizes, *options, replayOptions(args), args.schedules, compress,
                   &progress);
    }
    std::printf("%s, %s: %s\n", hostNames[0].c_str(), system.summary().c_str(),
                std::string(name(coll)).c_str());
    std::set<std::string> algos;
    for (const auto& r : rows) {
      for (const auto& c : r.candidates) algos.insert(c.estimate.algorithm);
    }
    std::printf("%8s  %-16s %10s %10s %-16s %7s", "size", "pick", "est us", "sim us", "best (sim)",
                "regret");
    for (const auto& a : algos) std::printf(" %12s", (a + " bw").c_str());
    std::printf("\n");
    for (const SizeRow& r : rows) {
      char sim[32] = "-";  // a compressed pick is not replayed
      if (r.pickSim > 0) std::snprintf(sim, sizeof sim, "%.1f", r.pickSim);
      std::printf("%8s  %-16s %10.1f %10s %-16s %7s", human(r.bytes).c_str(),
                  pickLabel(r.plan).c_str(), r.plan.estimateUs, sim, r.best.c_str(),
                  r.regret ? (std::to_string(*r.regret).substr(0, 5)).c_str() : "n/a");
      for (const auto& a : algos) {
        double best = 0;
        bool any = false, simulated = false;
        for (const auto& c : r.candidates) {
          if (c.estimate.algorithm != a) continue;
          any = true;
          if (c.sim) {
            simulated = true;
            best = std::max(best, busbw(coll, system.ranks(), r.bytes, c.sim->timeUs));
          }
        }
        if (!any) {
          std::printf(" %12s", "");
        } else if (!simulated) {
          std::printf(" %12s", "not sim.");
        } else {
          std::printf(" %12.2f", best);
        }
      }
      std::printf("\n");
      if (!args.candidates) continue;
      // Every candidate, cheapest estimate first: where the model and the simulator disagree.
      for (const Candidate& c : r.candidates) {
        std::printf(
            "%8s  %-16s %10.1f %10s   est/sim %s", "", label(c.estimate).c_str(), c.estimate.timeUs,
            c.sim ? std::to_string(c.sim->timeUs).substr(0, 9).c_str() : "n/a",
            c.sim ? std::to_string(c.estimate.timeUs / c.sim->timeUs).substr(0, 5).c_str() : "n/a");
        if (c.sim) {
          std::printf(
              "   est latency %.1f bytes %.1f; sim pass %.1f, %d slices, period %.2f, %d sharing "
              "passes%s",
              c.estimate.latencyUs, c.estimate.bandwidthUs, c.sim->passUs, c.sim->slices,
              c.sim->busyUs, c.sim->sharingPasses,
              args.fluid                       ? " (fluid)"
              : !c.sim->timeShared             ? " (too big: shared by step index)"
              : args.settle && !c.sim->settled ? " (not settled)"
                                               : "");
          if (c.sim->swingUs > 0) std::printf(", swinging by %.1f", c.sim->swingUs);
        }
        std::printf("\n");
      }
    }
    std::printf(
        "(busbw in GB/s from the simulated time, each algorithm at its better protocol; "
        "regret = simulated time of the pick / best simulated time)\n");
    if (!args.svg.empty()) {
      writeSvg(args.svg, rows, coll, system.ranks(),
               hostNames[0] + " x" + std::to_string(nodes[0]) + ": " + std::string(name(coll)));
      std::printf("wrote %s\n", args.svg.c_str());
    }
    return 0;
  }

  // Summary over the grid: the worst regret of each (fixture, nodes, collective), in parallel.
  struct Job {
    std::size_t host;
    int nodes;
    Collective coll;
    double worst = 0;
    std::size_t worstBytes = 0;
    std::string worstPick = {}, worstBest = {};
    int unsimulated = 0;  // sizes whose pick was not simulated (no regret there)
    int skipped = 0;      // candidates not simulated, over all sizes (left out of "best")
  };
  std::vector<Job> jobs;
  for (std::size_t h = 0; h < hosts.size(); ++h) {
    for (int nn : nodes) {
      for (Collective c : colls) jobs.push_back({h, nn, c});
    }
  }
  std::atomic<std::size_t> next{0};
  tools::Progress progress("weft-plan tune", jobs.size());
  auto worker = [&] {
    for (std::size_t i = next++; i < jobs.size(); i = next++, progress.step()) {
      Job& j = jobs[i];
      const topo::System system(hosts[j.host], j.nodes);
      for (const SizeRow& r :
           sweep(system, j.coll, sizes, *options, replayOptions(args), args.schedules, compress)) {
        for (const Candidate& c : r.candidates) j.skipped += c.sim ? 0 : 1;
        if (!r.regret) {
          ++j.unsimulated;
          continue;
        }
        if (*r.regret > j.worst) {
          j.worst = *r.regret;
          j.worstBytes = r.bytes;
          j.worstPick = pickLabel(r.plan);
          j.worstBest = r.best;
        }
      }
    }
  };
  const unsigned threads = std::max(1u, std::min(8u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  std::printf("%-24s %6s %7s %-14s %8s %8s %-16s %-16s %s\n", "fixture", "nodes", "ranks",
              "collective", "regret", "at", "pick there", "best there",
              "sizes not simulated, candidates not simulated");
  double overall = 0;
  for (const Job& j : jobs) {
    overall = std::max(overall, j.worst);
    std::printf("%-24s %6d %7d %-14s %8.3f %8s %-16s %-16s %d, %d\n", hostNames[j.host].c_str(),
                j.nodes, j.nodes * static_cast<int>(hosts[j.host].gpus().size()),
                std::string(name(j.coll)).c_str(), j.worst, human(j.worstBytes).c_str(),
                j.worstPick.c_str(), j.worstBest.c_str(), j.unsimulated, j.skipped);
  }
  std::printf("worst regret over %zu sizes (%s..%s, x%d): %.3f\n", sizes.size(),
              human(sizes.front()).c_str(), human(sizes.back()).c_str(), factor, overall);
  return 0;
}

}  // namespace weft::algo
