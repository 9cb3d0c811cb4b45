#include "perf/calibrate.hpp"

#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>

#include "algorithms/calibration_fit.hpp"
#include "algorithms/cost_model.hpp"
#include "algorithms/rank_graph.hpp"
#include "algorithms/schedule.hpp"
#include "fused/fp8/codec.hpp"
#include "perf/calibrate_common.hpp"
#include "perf/collective.hpp"
#include "perf/report.hpp"
#include "src/core/communicator.hpp"
#include "src/exec/numeric.hpp"

namespace weft::perf {
namespace {

using namespace calib;  // NOLINT(google-build-using-namespace): the calibrations' own helpers

using Clock = std::chrono::steady_clock;

// Enough repetitions for stable medians and rates; few enough that the whole calibration takes
// about half a second on 2 or 8 ranks of an idle 16-core host.
constexpr std::size_t kSmallBytes = 8;
constexpr std::size_t kMidBytes = 64 * 1024;
constexpr std::size_t kLargeBytes = 64 * 1024 * 1024;
constexpr int kSmallRounds = 2000;                          // 8-byte round trips
constexpr int kMidRounds = 500;                             // 64 KiB round trips
constexpr int kSmallMessages = 20000;                       // 8-byte messages streamed
constexpr int kMidMessages = 2000;                          // 64 KiB messages streamed
constexpr int kLargeMessages = 8;                           // 64 MiB messages streamed
constexpr int kNetRounds = 400;                             // 8-byte round trips between hosts
constexpr int kNetMessages = 400;                           // 64 KiB messages between hosts
constexpr int kNetSmallMessages = 4000;                     // 8-byte messages between hosts
constexpr std::size_t kNetLargeBytes = 16 * 1024 * 1024;    // messages between hosts
constexpr int kBatches = 30;                                // of 8-byte all-reduces
constexpr std::size_t kCodecValues = std::size_t{1} << 20;  // bf16 values the codec times
constexpr int kCodecRounds = 5;
constexpr int kBatchCalls = 50;
// The sizes whose picks are shown before and after.
constexpr std::size_t kPickSizes[] = {64 * 1024, 1024 * 1024, 16 * 1024 * 1024};

double microseconds(Clock::duration d) {
  return std::chrono::duration<double, std::micro>(d).count();
}

// Why rank 0 could not write `path`, or "" when it can. Checked before measuring, so that a
// mistyped path costs nothing; the write itself is checked again at the end.
std::string whyUnwritable(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return "is a directory; name a file in it";
    if (access(path.c_str(), W_OK) != 0)
      return std::string("cannot write it (") + std::strerror(errno) + ")";
    return "";
  }
  const auto slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : path.substr(0, slash);
  if (access(dir.c_str(), W_OK | X_OK) != 0)
    return "cannot create a file in " + dir + " (" + std::strerror(errno) +
           "); name a file in a writable directory";
  return "";
}

int coresHere() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
}

// What the calibration measured, as rank 0 has it (the other ranks hand theirs over).
struct Measured {
  double smallUs = 0;       // one-way, kSmallBytes
  double midUs = 0;         // one-way, kMidBytes
  double messageUs = 0;     // per message of a one-way stream of kSmallBytes
  double midGBs = 0;        // 0 -> 1, kMidBytes messages
  double pairGBs = 0;       // 0 -> 1 alone, kLargeBytes messages
  double everyPairGBs = 0;  // per rank, every pair at once, kLargeBytes messages
  int pairs = 1;            // pairs of ranks of one host
  // Between hosts: rank 0 and `remote`, and each host's first rank to another's at once.
  struct Net {
    double smallUs = 0, midUs = 0, midGBs = 0, everyHostGBs = 0, messageUs = 0;
  } net;
  int hosts = 1, hostPairs = 0;
  int local = -1;           // the pcie keys' peer of rank 0: the next rank on its host (-1: none)
  int remote = -1;          // the network's: the first rank on another host (-1: one host)
  std::vector<int> hostOf;  // by rank: hosts numbered in the order of their first rank
  std::array<double, 2> allReduceUs{};  // by protocol
  std::array<std::string, 2> allReducePlan;
  double codecGBs = 0;  // the host fp8 codec's encode, bytes read + written, the ranks' mean
  // Rank 0's host: how many of the ranks run on it, its cores, its load before the run.
  int ranksHere = 1;
  int cores = 1;
  double load = 0;
  // The fewest cores a rank has on the machine it shares with others (network namespaces of one
  // machine count as one), as the runtime prices them (src/core/machine.cpp, fewestCores).
  double share = 1;
  bool crowded() const { return ranksHere + load > cores + 0.5; }
};

// The constants from the measurements, and the numbers their formulas went through.
struct Derived {
  algo::CostConstants constants;
  double midHopUs = 0;                // 64 KiB one-way less its bytes at its streaming rate
  double netMidHopUs = 0;             // the same between hosts
  std::array<double, 2> chargedUs{};  // the model's 8-byte all-reduce without its base
  double nominalGBs = 0;              // the shared-memory graph's copy rate
};

Result<Derived> derive(const Measured& m, int nranks) {
  Derived d;
  algo::CostConstants& c = d.constants;
  d.nominalGBs = algo::sharedMemoryRankGraph(nranks).intraBandwidth;
  if (m.local > 0) {
    c.hopLatency[kLl][kPcie] = m.smallUs;
    // A hop of the simple protocol is never cheaper than a small message's.
    d.midHopUs = m.midUs - double(kMidBytes) / (m.midGBs * 1e3);
    c.hopLatency[kSimple][kPcie] = std::max(d.midHopUs, m.smallUs);
    c.messageOverhead[kLl][kPcie] = c.messageOverhead[kSimple][kPcie] = m.messageUs;
    c.bandwidthScale[kPcie] = m.everyPairGBs / d.nominalGBs;
  }
  if (m.remote > 0) {
    c.hopLatency[kLl][kNet] = m.net.smallUs;
    d.netMidHopUs = m.net.midUs - double(kMidBytes) / (m.net.midGBs * 1e3);
    c.hopLatency[kSimple][kNet] = std::max(d.netMidHopUs, m.net.smallUs);
    c.messageOverhead[kLl][kNet] = c.messageOverhead[kSimple][kNet] = m.net.messageUs;
    c.graphs.netGBs = m.net.everyHostGBs;
  }
  algo::Placement placement;
  placement.hostOf = m.hostOf;
  placement.gpuOf.assign(m.hostOf.size(), -1);
  // The graph the runtime prices these ranks on, at their core share.
  algo::RankGraph graph =
      algo::hostRankGraph(placement, c.graphs.netGBs, algo::atCoreShare(c.graphs, m.share));
  graph.coresPerRank = std::min(1.0, m.share);
  // What the model charges the measured call with the constants above but no base, taken from
  // the call's time: the model then reproduces the call.
  for (std::size_t p : {kLl, kSimple}) {
    algo::CostConstants noBase = c;
    noBase.baseLatency[p] = 0;
    const std::string& plan = m.allReducePlan[p];
    auto e = algo::CostModel(noBase).estimate(plan.substr(0, plan.find('/')), Collective::allReduce,
                                              kSmallBytes, static_cast<algo::Protocol>(p), graph);
    if (!e)
      return Status(e.status().code(), "--calibrate: the model's estimate of the 8-byte " + plan +
                                           " all-reduce: " + e.status().message());
    d.chargedUs[p] = e->timeUs;
    c.baseLatency[p] = std::max(m.allReduceUs[p] - e->timeUs, kLeastBaseUs);
  }
  return d;
}

std::string crowdedNote(const Measured& m) {
  return std::to_string(m.ranksHere) + " rank(s) on this host and its load before the run (" +
         fixed(m.load, 1) + ") exceed its " + std::to_string(m.cores) +
         " core(s): ranks waited for each other's time slices, so these latencies measure the "
         "scheduler as much as weft";
}

// The tuning file's hop, message and bandwidth keys: pcie's where rank 0 had a rank beside it,
// the network's hops where the ranks span hosts.
std::string hopKeys(const Measured& m, const algo::CostConstants& c) {
  auto classes = [&](const std::array<double, 3>& v, bool withNet) {
    std::string out;
    if (m.local > 0) out += "\"pcie\": " + digits(v[kPcie]);
    if (withNet && m.remote > 0)
      out += std::string(out.empty() ? "" : ", ") + "\"network\": " + digits(v[kNet]);
    return "{" + out + "}";
  };
  std::string j = "  \"hop_latency_us\": {\"ll\": " + classes(c.hopLatency[kLl], true) +
                  ", \"simple\": " + classes(c.hopLatency[kSimple], true) + "},\n";
  if (m.local > 0 || m.remote > 0) {
    j += "  \"message_overhead_us\": {\"ll\": " + classes(c.messageOverhead[kLl], true) +
         ", \"simple\": " + classes(c.messageOverhead[kSimple], true) + "},\n";
  }
  if (m.local > 0) j += "  \"bandwidth_scale\": " + classes(c.bandwidthScale, false) + ",\n";
  return j;
}

// The tuning file: the measured keys, where and when, and how each was measured.
std::string tuningFile(const Measured& m, const Derived& d, int nranks,
                       const std::string& summary) {
  const algo::CostConstants& c = d.constants;
  auto baseLine = [&](std::size_t p) {
    const double rest = m.allReduceUs[p] - d.chargedUs[p];
    return "base_latency_us." + protoName(p) +
           ": the 8-byte all-reduce with WEFT_PROTO=" + protoName(p) + " (it ran " +
           m.allReducePlan[p] + "; the mean over ranks of the median of " +
           std::to_string(kBatches) + " batches of " + std::to_string(kBatchCalls) +
           " calls) minus what the model charges that call besides its base (its hops, "
           "postings and bytes, with the constants above): " +
           digits(m.allReduceUs[p]) + " - " + digits(d.chargedUs[p]) + " us" +
           (rest < kLeastBaseUs
                ? ", below " + digits(kLeastBaseUs) + " us, so " + digits(kLeastBaseUs) + " us"
                : std::string()) +
           ".";
  };
  const std::string codecs =
      "codecs.host_gbs: the host fp8 codec's encode (e4m3:32, " + std::to_string(kCodecValues) +
      " bf16 values, the median of " + std::to_string(kCodecRounds) +
      " runs) on every rank at once, bytes read plus written, the ranks' mean: what the selector "
      "prices a compressed call's codec passes with.";
  std::vector<std::string> comment = {
      "Written by weft-perf --calibrate on " + std::to_string(nranks) + " ranks on " +
      std::to_string(m.hosts) +
      " host(s); keys not here keep CostConstants' defaults. The runtime models ranks of one "
      "host on host memory as pcie-class hops (sharedMemoryRankGraph: path class PHB at a "
      "nominal " +
      digits(d.nominalGBs) +
      " GB/s copy rate) and hosts as network-class hops at net_gbs (hostRankGraph), so only "
      "those entries are measured: the pcie ones between rank 0 and rank " +
      std::to_string(m.local) + " (its host's next), the network ones between rank 0 and rank " +
      std::to_string(m.remote) + " (another host's first); -1: none."};
  const std::vector<std::string> pcie = {
      "hop_latency_us.ll.pcie: one-way time of an 8-byte message, ranks 0 and its host's next "
      "ping-ponging with weftSend/weftRecv while the others wait: the median of " +
          std::to_string(kSmallRounds) + " round trips / 2.",
      "hop_latency_us.simple.pcie: one-way time of a 64 KiB message (the median of " +
          std::to_string(kMidRounds) + " round trips / 2: " + digits(m.midUs) +
          " us) minus 65536 B at the rate 64 KiB messages stream between them (" +
          std::to_string(kMidMessages) + " of them: " + digits(m.midGBs) + " GB/s)" +
          (d.midHopUs < m.smallUs ? "; that came to " + digits(d.midHopUs) +
                                        " us, under the 8-byte hop, which is written instead"
                                  : std::string()) +
          ".",
      "message_overhead_us.ll.pcie and .simple.pcie: rank 0 sends " +
          std::to_string(kSmallMessages) +
          " 8-byte messages to its host's next rank inside one weftGroupStart/weftGroupEnd, "
          "received inside one, so that each costs its FIFO work rather than an API call; the "
          "receiver's time per message. Both protocols move messages through the same FIFO on "
          "host memory, so both get this value.",
      "bandwidth_scale.pcie: the one-way bandwidth per rank of " + sizeName(kLargeBytes) +
          " messages (" + std::to_string(kLargeMessages) +
          " after an untimed one, timed at the receiver, the slowest receiver counting) with "
          "every pair of ranks of one host streaming at once (" +
          std::to_string(m.pairs) + " pair(s): " + digits(m.everyPairGBs) +
          " GB/s; the first pair alone: " + digits(m.pairGBs) + " GB/s), divided by the " +
          digits(d.nominalGBs) + " GB/s the runtime's shared-memory graph assumes."};
  const std::vector<std::string> net = {
      "hop_latency_us.ll.network: one-way time of an 8-byte message between hosts, the median of " +
          std::to_string(kNetRounds) + " round trips / 2.",
      "message_overhead_us.ll.network and .simple.network: the same stream of " +
          std::to_string(kNetSmallMessages) +
          " 8-byte messages from rank 0 to another host's first rank, the receiver's time per "
          "message. Both are one rank's work with the others waiting; where ranks outnumber "
          "the cores they share, the model charges every message overhead at the ranks' core "
          "share (" +
          digits(m.share) + " here), since all of them post at once.",
      "hop_latency_us.simple.network: one-way time of a 64 KiB message between hosts (" +
          digits(m.net.midUs) +
          " us) minus 65536 B at the rate such messages stream between them (" +
          digits(m.net.midGBs) + " GB/s)" +
          (d.netMidHopUs < m.net.smallUs ? ", floored at the 8-byte hop" : std::string()) + ".",
      "graphs.net_gbs: one host's rate to another, " + sizeName(kNetLargeBytes) + " messages (" +
          std::to_string(kLargeMessages) +
          " after an untimed one) from each host's first rank to another host's at once (" +
          std::to_string(m.hostPairs) +
          " pair(s)), the slowest receiver counting: the rate hostRankGraph then gives each "
          "host's network (instead of its fastest discovered NIC's, or 10 GbE)."};
  if (m.local > 0) comment.insert(comment.end(), pcie.begin(), pcie.end());
  if (m.remote > 0) comment.insert(comment.end(), net.begin(), net.end());
  comment.insert(comment.end(), {baseLine(kLl), baseLine(kSimple), codecs});
  if (m.crowded()) comment.push_back("Caution: " + crowdedNote(m) + ".");
  std::ostringstream j;
  j << fileHead(comment, nranks,
                ", \"ranks_on_host\": " + std::to_string(m.ranksHere) + ", \"cores\": " +
                    std::to_string(m.cores) + ", \"load_average\": " + fixed(m.load, 2) +
                    ", \"transport\": " + jsonString(summary))
    << hopKeys(m, c) << "  \"base_latency_us\": {\"ll\": " << digits(c.baseLatency[kLl])
    << ", \"simple\": " << digits(c.baseLatency[kSimple]) << "},\n"
    << "  \"codecs\": {\"host_gbs\": " << digits(m.codecGBs) << "}"
    << (m.remote > 0 ? ",\n  \"graphs\": {\"net_gbs\": " + digits(c.graphs.netGBs) + "}" : "")
    << "\n}\n";
  return j.str();
}

// Writes the file, then reads it back as the runtime will.
Status writeTuningFile(const std::string& path, const std::string& text) {
  {
    std::ofstream out(path);
    out << text;
    out.close();
    if (!out)
      return Status(Code::systemError,
                    "--calibrate: rank 0 cannot write " + path + " (" + std::strerror(errno) + ")");
  }
  auto loaded = algo::CostConstants::fromJsonFile(path);
  if (!loaded)
    return internalError("--calibrate wrote a tuning file the runtime rejects: " +
                         loaded.status().message());
  return {};
}

void printCalibration(const Measured& m, const Derived& d, int nranks, const std::string& summary) {
  const algo::CostConstants defaults;
  const algo::CostConstants& c = d.constants;
  std::printf("#\n# Calibration of the cost model's host constants: %d ranks, %s\n", nranks,
              summary.c_str());
  auto row = [](const std::string& what, const std::string& value, const std::string& how) {
    std::printf("#   %-38s %11s  %s\n", what.c_str(), value.c_str(), how.c_str());
  };
  row("measured", "", "how");
  const std::string local = "0 <-> " + std::to_string(m.local);
  if (m.local > 0) {
    row("one-way latency, 8 B", fixed(m.smallUs, 2) + " us",
        local + " ping-pong, median of " + std::to_string(kSmallRounds) + " round trips / 2");
    row("one-way latency, 64 KiB", fixed(m.midUs, 2) + " us",
        local + " ping-pong, median of " + std::to_string(kMidRounds) + " round trips / 2");
    row("time per message, 8 B stream", fixed(m.messageUs, 3) + " us",
        std::to_string(kSmallMessages) + " messages 0 -> " + std::to_string(m.local) +
            " in one group, at the receiver");
    row("bandwidth 0 -> " + std::to_string(m.local) + ", 64 KiB messages",
        fixed(m.midGBs, 2) + " GB/s", std::to_string(kMidMessages) + " messages, at the receiver");
    row("bandwidth 0 -> " + std::to_string(m.local) + " alone, 64 MiB",
        fixed(m.pairGBs, 2) + " GB/s",
        std::to_string(kLargeMessages) + " messages, at the receiver");
    row("bandwidth per rank, " + std::to_string(m.pairs) + " pair(s) at once",
        fixed(m.everyPairGBs, 2) + " GB/s", "the same, ranks of one host, the slowest receiver");
  }
  if (m.remote > 0) {
    const std::string remote = "0 <-> " + std::to_string(m.remote);
    row("between hosts: one-way, 8 B", fixed(m.net.smallUs, 2) + " us",
        remote + " ping-pong, median of " + std::to_string(kNetRounds) + " round trips / 2");
    row("between hosts: one-way, 64 KiB", fixed(m.net.midUs, 2) + " us",
        remote + " ping-pong, median of " + std::to_string(kNetRounds / 4) + " round trips / 2");
    row("between hosts: 64 KiB messages", fixed(m.net.midGBs, 3) + " GB/s",
        std::to_string(kNetMessages) + " messages 0 -> " + std::to_string(m.remote));
    row("between hosts: per host, " + std::to_string(m.hostPairs) + " pair(s)",
        fixed(m.net.everyHostGBs, 3) + " GB/s",
        sizeName(kNetLargeBytes) + " messages, hosts' first ranks at once, the slowest");
  }
  for (std::size_t p : {kLl, kSimple}) {
    row("all-reduce 8 B, WEFT_PROTO=" + protoName(p), fixed(m.allReduceUs[p], 2) + " us",
        m.allReducePlan[p] + "; the model charges it " + fixed(d.chargedUs[p], 2) +
            " us besides its base");
  }
  std::printf("#\n#   %-32s %9s %11s  %s\n", "tuning file key", "default", "calibrated", "formula");
  auto key = [](const std::string& name, double before, double after, const std::string& formula) {
    std::printf("#   %-32s %9s %11s  %s\n", name.c_str(), digits(before).c_str(),
                digits(after).c_str(), formula.c_str());
  };
  if (m.local > 0) {
    key("hop_latency_us.ll.pcie", defaults.hopLatency[kLl][kPcie], c.hopLatency[kLl][kPcie],
        "8 B one-way latency");
    key("hop_latency_us.simple.pcie", defaults.hopLatency[kSimple][kPcie],
        c.hopLatency[kSimple][kPcie],
        "64 KiB one-way - 64 KiB / its streaming bw" +
            std::string(d.midHopUs < m.smallUs
                            ? " (" + digits(d.midHopUs) + ", below the 8 B hop: that)"
                            : ""));
    for (std::size_t p : {kLl, kSimple}) {
      key("message_overhead_us." + protoName(p) + ".pcie", defaults.messageOverhead[p][kPcie],
          c.messageOverhead[p][kPcie], "time per message");
    }
    key("bandwidth_scale.pcie", defaults.bandwidthScale[kPcie], c.bandwidthScale[kPcie],
        "bw per rank, every pair at once / " + digits(d.nominalGBs) + " GB/s");
  }
  if (m.remote > 0) {
    key("hop_latency_us.ll.network", defaults.hopLatency[kLl][kNet], c.hopLatency[kLl][kNet],
        "8 B one-way latency between hosts");
    key("hop_latency_us.simple.network", defaults.hopLatency[kSimple][kNet],
        c.hopLatency[kSimple][kNet],
        "64 KiB one-way - 64 KiB / its streaming bw, between hosts" +
            std::string(d.netMidHopUs < m.net.smallUs ? " (below the 8 B hop: that)" : ""));
    for (std::size_t p : {kLl, kSimple}) {
      key("message_overhead_us." + protoName(p) + ".network", defaults.messageOverhead[p][kNet],
          c.messageOverhead[p][kNet], "time per message between hosts");
    }
    key("graphs.net_gbs", 0, c.graphs.netGBs, "per host, hosts' first ranks at once (0: NIC's)");
  }
  for (std::size_t p : {kLl, kSimple}) {
    const double rest = m.allReduceUs[p] - d.chargedUs[p];
    key("base_latency_us." + protoName(p), defaults.baseLatency[p], c.baseLatency[p],
        "all-reduce 8 B - the model's charge besides the base" +
            std::string(rest < kLeastBaseUs ? " (" + digits(rest) + ": floored)" : ""));
  }
  if (m.crowded()) std::printf("# caution: %s\n", crowdedNote(m).c_str());
}

}  // namespace

Calibration::Calibration(ProcessContext& context, int thread, Comm& comm, Control& control,
                         GpuRank* gpu)
    : ctx_(context),
      thread_(thread),
      rank_(comm.rank()),
      nranks_(comm.size()),
      comm_(comm),
      control_(control),
      gpu_(gpu) {}

void Calibration::abort() {
  for (Comm& c : made_) (void)c.abort();
}

Status Calibration::shareRank0(const Status& onRank0, bool& quietFailure) {
  auto ok = control_.from(0, onRank0.isOk() ? 1 : 0);
  if (!ok) return ok.status();
  if (*ok == 1) return {};
  if (rank_ == 0) return onRank0;
  quietFailure = true;
  return {};
}

Status Calibration::failed(const Status& s, const std::string& what, int peer) const {
  return Status(s.code(), "--calibrate: rank " + std::to_string(rank_) + ", " + what +
                              (peer >= 0 ? " with rank " + std::to_string(peer) : "") + ": " +
                              s.message());
}

Result<double> Calibration::oneWayUs(std::size_t bytes, int rounds, int peer) {
  std::vector<double> trips;
  if (rank_ == 0 || rank_ == peer) {
    const int other = rank_ == 0 ? peer : 0;
    std::byte* b = buffer_.data();
    trips.reserve(static_cast<std::size_t>(rounds));
    for (int i = -rounds / 10; i < rounds; ++i) {  // a tenth more first, untimed
      const auto start = Clock::now();
      Status s = rank_ == 0 ? comm_.send(b, bytes, DataType::u8, other)
                            : comm_.recv(b, bytes, DataType::u8, other);
      if (s) {
        s = rank_ == 0 ? comm_.recv(b, bytes, DataType::u8, other)
                       : comm_.send(b, bytes, DataType::u8, other);
      }
      if (!s) return failed(s, "ping-pong of " + sizeName(bytes), other);
      if (i >= 0) trips.push_back(microseconds(Clock::now() - start));
    }
  }
  if (Status s = control_.barrier(); !s) return s;
  return median(trips) / 2;  // rank 0's round trips
}

Result<double> Calibration::perMessageUs(int messages, int peer) {
  // Rank 0's sends and the peer's receives each inside one group: each message then costs its
  // FIFO work (a slot acquired, filled and posted; received, copied out and released), not a
  // call's. The peer times the second of two groups, the first a tenth as long.
  double us = 0;
  for (int count : {messages / 10, messages}) {
    if (Status s = control_.barrier(); !s) return s;
    if (rank_ != 0 && rank_ != peer) continue;
    const int other = rank_ == 0 ? peer : 0;
    const auto start = Clock::now();
    if (Status s = checked(weftGroupStart(), "weftGroupStart"); !s) return s;
    for (int i = 0; i < count; ++i) {
      const Status s = rank_ == 0 ? comm_.send(buffer_.data(), kSmallBytes, DataType::u8, other)
                                  : comm_.recv(buffer_.data(), kSmallBytes, DataType::u8, other);
      if (!s) return failed(s, "queueing 8-byte messages", other);
    }
    if (Status s = checked(weftGroupEnd(), "weftGroupEnd"); !s)
      return failed(s, "streaming 8-byte messages", other);
    us = microseconds(Clock::now() - start) / count;
  }
  return control_.from(peer, us);
}

Result<double> Calibration::streamGBs(std::size_t bytes, int messages,
                                      const std::vector<std::pair<int, int>>& pairs) {
  // One untimed message first; each receiver times the rest, and the slowest receiver counts.
  double us = 0;
  if (Status s = control_.barrier(); !s) return s;
  for (const auto& [from, to] : pairs) {
    if (rank_ != from && rank_ != to) continue;
    const bool sender = rank_ == from;
    const int peer = sender ? to : from;
    std::byte* b = buffer_.data();
    Clock::time_point start;
    for (int i = 0; i <= messages; ++i) {
      const Status s = sender ? comm_.send(b, bytes, DataType::u8, peer)
                              : comm_.recv(b, bytes, DataType::u8, peer);
      if (!s) return failed(s, "streaming " + sizeName(bytes) + " messages", peer);
      if (i == 0) start = Clock::now();
    }
    if (!sender) us = microseconds(Clock::now() - start);
  }
  auto slowest = control_.combine(us, 3);
  if (!slowest) return slowest.status();
  return *slowest > 0 ? double(messages) * double(bytes) / (*slowest * 1e3) : 0.0;
}

Result<double> Calibration::hostCodecGBs() {
  const auto codec = fused::fp8::Codec::parse("e4m3:32");
  std::vector<std::uint16_t> values(kCodecValues);
  for (std::size_t i = 0; i < values.size(); ++i)
    values[i] = exec::floatToBf16(
        std::ldexp(1.0f + static_cast<float>(i % 97) / 97.0f, static_cast<int>(i % 23) - 11));
  std::vector<std::byte> encoded(codec->encodedBytes(kCodecValues));
  std::vector<double> rates;
  if (Status s = control_.barrier(); !s) return s;
  for (int r = 0; r < kCodecRounds; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    if (Status s =
            fused::fp8::encode(*codec, DataType::bf16, values.data(), kCodecValues, encoded.data());
        !s)
      return s;
    const std::chrono::duration<double> t = std::chrono::steady_clock::now() - t0;
    rates.push_back(double(kCodecValues * 2 + encoded.size()) / t.count() / 1e9);
  }
  std::nth_element(rates.begin(), rates.begin() + rates.size() / 2, rates.end());
  return control_.combine(rates[rates.size() / 2], 1);
}

Result<double> Calibration::allReduceUs(Comm& comm) {
  // Batches of calls, each batch's time per call; the median batch on each rank, then the mean
  // over ranks (weft-perf's -a 1).
  float in[2] = {1, 2}, out[2] = {};
  std::vector<double> batches;
  for (int b = -2; b < kBatches; ++b) {  // two untimed batches first
    const auto start = Clock::now();
    for (int i = 0; i < kBatchCalls; ++i) {
      if (Status s = comm.allReduce(in, out, 2, DataType::f32, RedOp::sum); !s)
        return failed(s, "8-byte all-reduce", -1);
    }
    if (b >= 0) batches.push_back(microseconds(Clock::now() - start) / kBatchCalls);
  }
  return control_.combine(median(batches), 1);
}

Result<std::string> Calibration::planOf(Comm& comm, Collective c, std::size_t bytes) {
  const Layout l = layoutFor(c, bytes, sizeOf(DataType::f32), nranks_);
  const PlanQuery q = planQuery(c, l, DataType::f32);
  char buf[128] = {};
  if (Status s = checked(weftCommPlanMemory(comm.handle(), q.coll, q.count, q.type,
                                            gpu_ ? weftGpuMemory : weftHostMemory, buf, sizeof buf),
                         "weftCommPlanMemory");
      !s)
    return s;
  return std::string(buf);
}

Status Calibration::run(bool& quietFailure) {
  const auto began = Clock::now();
  const std::string& path = ctx_.options.calibratePath;
  Status usable;
  if (rank_ == 0) {
    if (const std::string why = whyUnwritable(path); !why.empty())
      usable = invalidArgument("--calibrate " + path + ": " + why);
  }
  if (Status s = shareRank0(usable, quietFailure); !s || quietFailure) return s;
  if (Status s = gpu_ ? runGpu(quietFailure) : runHost(quietFailure); !s || quietFailure) return s;
  if (rank_ == 0)
    std::printf("# calibration took %.1f s\n#\n", microseconds(Clock::now() - began) / 1e6);
  return {};
}

Status Calibration::runHost(bool& quietFailure) {
  buffer_.assign(kLargeBytes, std::byte{1});  // touched now, not inside a timed loop

  // Where rank 0 runs: the ranks beside it, its cores, and its load before the measurements.
  Measured m;
  auto hosts = control_.gather(hostName());
  if (!hosts) return hosts.status();
  m.ranksHere = static_cast<int>(std::count(hosts->begin(), hosts->end(), hosts->front()));
  m.cores = coresHere();
  if (getloadavg(&m.load, 1) != 1) m.load = 0;
  auto claims =
      control_.gather(claimLine(CpuClaim::ofThisProcess(std::hash<std::string>{}(hostName()))));
  if (!claims) return claims.status();
  std::vector<CpuClaim> all;
  for (const std::string& line : *claims) all.push_back(claimOf(line));
  m.share = fewestCores(all);

  // Who measures what: rank 0 and the next rank on its host the shared memory (pcie keys),
  // rank 0 and the first rank of another host the network; pairs of ranks of one host stream at
  // once for the pcie bandwidth, each host's first rank to another host's for net_gbs.
  const std::vector<std::string>& on = *hosts;
  std::vector<std::string> names;  // hosts in the order of their first rank
  for (const std::string& h : on)
    if (std::find(names.begin(), names.end(), h) == names.end()) names.push_back(h);
  m.hosts = static_cast<int>(names.size());
  for (const std::string& h : on)
    m.hostOf.push_back(static_cast<int>(std::find(names.begin(), names.end(), h) - names.begin()));
  for (int q = 1; q < nranks_; ++q) {
    if (m.local < 0 && on[static_cast<std::size_t>(q)] == on[0]) m.local = q;
    if (m.remote < 0 && on[static_cast<std::size_t>(q)] != on[0]) m.remote = q;
  }
  std::vector<std::pair<int, int>> samePairs, hostPairs;
  std::vector<int> leaders;
  for (const std::string& h : names) {
    int waiting = -1;
    for (int q = 0; q < nranks_; ++q) {
      if (on[static_cast<std::size_t>(q)] != h) continue;
      if (waiting < 0) {
        waiting = q;
      } else {
        samePairs.emplace_back(waiting, q);
        waiting = -1;
      }
    }
    leaders.push_back(static_cast<int>(std::find(on.begin(), on.end(), h) - on.begin()));
  }
  for (std::size_t i = 0; i + 1 < leaders.size(); i += 2)
    hostPairs.emplace_back(leaders[i], leaders[i + 1]);
  m.pairs = static_cast<int>(samePairs.size());
  m.hostPairs = static_cast<int>(hostPairs.size());

  // The measurements, in the order the formulas need them.
  if (m.local > 0) {
    auto small = oneWayUs(kSmallBytes, kSmallRounds, m.local);
    if (!small) return small.status();
    m.smallUs = *small;
    auto message = perMessageUs(kSmallMessages, m.local);
    if (!message) return message.status();
    m.messageUs = *message;
    auto midRate = streamGBs(kMidBytes, kMidMessages, {{0, m.local}});
    if (!midRate) return midRate.status();
    m.midGBs = *midRate;
    auto mid = oneWayUs(kMidBytes, kMidRounds, m.local);
    if (!mid) return mid.status();
    m.midUs = *mid;
    auto pair = streamGBs(kLargeBytes, kLargeMessages, {{0, m.local}});
    if (!pair) return pair.status();
    m.pairGBs = *pair;
    auto every = streamGBs(kLargeBytes, kLargeMessages, samePairs);
    if (!every) return every.status();
    m.everyPairGBs = *every;
  }
  if (m.remote > 0) {
    auto small = oneWayUs(kSmallBytes, kNetRounds, m.remote);
    if (!small) return small.status();
    m.net.smallUs = *small;
    auto midRate = streamGBs(kMidBytes, kNetMessages, {{0, m.remote}});
    if (!midRate) return midRate.status();
    m.net.midGBs = *midRate;
    auto mid = oneWayUs(kMidBytes, kNetRounds / 4, m.remote);
    if (!mid) return mid.status();
    m.net.midUs = *mid;
    auto message = perMessageUs(kNetSmallMessages, m.remote);
    if (!message) return message.status();
    m.net.messageUs = *message;
    auto every = streamGBs(kNetLargeBytes, kLargeMessages, hostPairs);
    if (!every) return every.status();
    m.net.everyHostGBs = *every;
  }
  for (std::size_t p : {kLl, kSimple}) {
    // The schedules' base latency: small calls would otherwise go through the slots, which
    // the cost model does not price.
    auto comm = joinWithEnvironment(ctx_, thread_, rank_, nranks_, control_,
                                    {{"WEFT_PROTO", protoName(p)}, {"WEFT_HOST_SMALL_BYTES", "0"}});
    if (!comm) return failed(comm.status(), "a communicator with WEFT_PROTO=" + protoName(p), -1);
    made_.push_back(std::move(*comm));
    auto us = allReduceUs(made_.back());
    if (!us) return us.status();
    m.allReduceUs[p] = *us;
    auto plan = planOf(made_.back(), Collective::allReduce, kSmallBytes);
    if (!plan) return plan.status();
    m.allReducePlan[p] = *plan;
  }

  auto codec = hostCodecGBs();
  if (!codec) return codec.status();
  m.codecGBs = *codec;

  // Rank 0 works the constants out and says what it did.
  return publish(quietFailure, [&]() -> Result<std::string> {
    std::string summary = comm_.summary();  // "rank 0 of 8, host memory, ..."
    if (auto comma = summary.find(", "); comma != std::string::npos) summary.erase(0, comma + 2);
    auto d = derive(m, nranks_);
    if (!d) return d.status();
    printCalibration(m, *d, nranks_, summary);
    return tuningFile(m, *d, nranks_, summary);
  });
}

Status Calibration::publish(bool& quietFailure,
                            const std::function<Result<std::string>()>& rank0Text) {
  const std::string& path = ctx_.options.calibratePath;
  Status written;
  std::string absolute;
  if (rank_ == 0) {
    auto text = rank0Text();
    written = text ? writeTuningFile(path, *text) : text.status();
    char real[PATH_MAX] = {};
    if (written && realpath(path.c_str(), real) != nullptr) absolute = real;
    if (written)
      std::printf("# wrote %s: use it with WEFT_TUNING_FILE=%s\n", path.c_str(),
                  absolute.empty() ? path.c_str() : absolute.c_str());
  }
  if (Status s = shareRank0(written, quietFailure); !s || quietFailure) return s;
  return comparePicks(absolute.empty() ? path : absolute);
}

Status Calibration::comparePicks(const std::string& path) {
  // Before and after: this run's communicator, and one made with the new file. Every rank reads
  // the file by rank 0's absolute path; where a rank (on another host) cannot, no comparison.
  char shared[PATH_MAX] = {};
  std::snprintf(shared, sizeof shared, "%s", path.c_str());
  if (Status s = control_.broadcast(shared, sizeof shared); !s) return s;
  auto readable = control_.combine(std::ifstream(shared).good() ? 1 : 0, 2);
  if (!readable) return readable.status();
  if (*readable < 1) {
    if (rank_ == 0)
      std::printf("# not every rank can read %s: copy it to every host to compare the picks\n",
                  shared);
  } else {
    auto after = joinWithEnvironment(ctx_, thread_, rank_, nranks_, control_,
                                     {{"WEFT_TUNING_FILE", std::string(shared)}});
    if (!after)
      return failed(after.status(), "a communicator with WEFT_TUNING_FILE=" + std::string(shared),
                    -1);
    made_.push_back(std::move(*after));
    if (rank_ == 0) {
      std::printf("#\n#   %-32s %9s  %-18s %s\n",
                  gpu_ ? "weftCommPlanMemory (float, GPU)" : "weftCommPlan (float)", "size (B)",
                  environment("WEFT_TUNING_FILE") ? "before (its file)" : "before (defaults)",
                  "after (this file)");
      const std::vector<Collective> colls =
          gpu_ ? std::vector<Collective>{Collective::allReduce, Collective::allGather,
                                         Collective::reduceScatter, Collective::allToAll}
               : std::vector<Collective>{Collective::allReduce, Collective::allGather};
      std::vector<std::size_t> sizes(std::begin(kPickSizes), std::end(kPickSizes));
      if (gpu_) sizes.push_back(kGpuLargeBytes);
      for (Collective coll : colls) {
        for (std::size_t bytes : sizes) {
          auto was = planOf(comm_, coll, bytes);
          if (!was) return was.status();
          auto now = planOf(made_.back(), coll, bytes);
          if (!now) return now.status();
          std::printf("#   %-32s %9zu  %-18s %s\n", std::string(name(coll)).c_str(), bytes,
                      was->c_str(), now->c_str());
        }
      }
    }
  }
  return {};
}

}  // namespace weft::perf
