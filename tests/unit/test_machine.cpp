// The machine at run time: rank graphs from a topology and a placement, the one selector's
// kernels, and communicators of thread ranks on the fixtures making the picks weft-plan tune
// makes (gpuSelectorFor, the code path of weft-plan tune).
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "algorithms/pricing.hpp"
#include "algorithms/rank_graph.hpp"
#include "algorithms/selector.hpp"
#include "src/bootstrap/bootstrap.hpp"
#include "src/core/communicator.hpp"
#include "src/core/machine.hpp"
#include "src/transport/ucx.hpp"
#include "topology/system.hpp"

namespace weft {
namespace {

std::string fixturePath(const std::string& name) {
  return std::string(WEFT_SOURCE_DIR) + "/topology/fixtures/" + name;
}

topo::Topology fixture(const std::string& name) {
  auto t = topo::Topology::load(fixturePath(name));
  EXPECT_TRUE(t.isOk()) << t.status().toString();
  return std::move(*t);
}

TEST(RankGraphs, RanksOnGpusOfTheirOwnArePricedOnTheTopology) {
  const topo::Topology hgx = fixture("hgx_h100.xml");
  const algo::GpuGraph all = algo::gpuRankGraph(hgx, algo::Placement::regular(8, 1, 8));
  const algo::RankGraph direct = algo::RankGraph::fromSystem(topo::System(hgx, 1));
  EXPECT_FALSE(all.sameDevice);
  EXPECT_EQ(all.graph.nranks, 8);
  EXPECT_EQ(all.graph.intraClass, topo::PathClass::nvl);
  EXPECT_EQ(all.graph.intraBandwidth, direct.intraBandwidth);
  EXPECT_EQ(all.graph.shiftBw, direct.shiftBw);
  EXPECT_EQ(all.graph.ringIntraBw, direct.ringIntraBw);

  // Two ranks on GPUs 2 and 5: a two-rank NVLink graph.
  algo::Placement two{{0, 0}, {2, 5}};
  const algo::GpuGraph pair = algo::gpuRankGraph(hgx, two);
  EXPECT_FALSE(pair.sameDevice);
  EXPECT_EQ(pair.graph.nranks, 2);
  EXPECT_EQ(pair.graph.ranksPerHost, 2);
  EXPECT_EQ(pair.graph.intraClass, topo::PathClass::nvl);

  // Across PCIe sockets the class is the slowest pair's.
  const algo::GpuGraph pcie =
      algo::gpuRankGraph(fixture("pcie_8gpu_2socket.xml"), algo::Placement::regular(8, 1, 8));
  EXPECT_GE(pcie.graph.intraClass, topo::PathClass::pix);
  EXPECT_LT(pcie.graph.intraBandwidth, all.graph.intraBandwidth);

  // Two hosts of 8: the network between them.
  const algo::GpuGraph hosts = algo::gpuRankGraph(hgx, algo::Placement::regular(16, 2, 8));
  EXPECT_EQ(hosts.graph.hosts, 2);
  EXPECT_EQ(hosts.graph.ranksPerHost, 8);
  EXPECT_GT(hosts.graph.netPerRank, 0);
}

TEST(RankGraphs, RanksSharingOrNotKnowingTheirGpuArePricedAsOneDevice) {
  const topo::Topology hgx = fixture("hgx_h100.xml");
  const algo::GpuGraph shared = algo::gpuRankGraph(hgx, {{0, 0, 0, 0}, {0, 0, 1, 1}});
  EXPECT_TRUE(shared.sameDevice);
  EXPECT_GT(shared.graph.deviceCopyGBs, 0);
  const algo::GpuGraph unknown = algo::gpuRankGraph(hgx, {{0, 0}, {-1, -1}});
  EXPECT_TRUE(unknown.sameDevice);
  // A host of CPUs only (no GPU listed): every rank's GPU unknown.
  EXPECT_EQ(algo::Placement::regular(4, 1, 0).gpuOf, std::vector<int>(4, -1));
}

TEST(RankGraphs, TheRuntimesOwnGraphsTakeTheTuningFilesFigures) {
  auto c = algo::CostConstants::fromJson(
      R"({"graphs": {"host_copy_gbs": 16, "device_copy_gbs": 3000, "device_all_peers_us": 7}})",
      "t");
  ASSERT_TRUE(c.isOk()) << c.status().toString();
  EXPECT_EQ(algo::sharedMemoryRankGraph(4, c->graphs).intraBandwidth, 16);
  EXPECT_EQ(algo::sharedMemoryRankGraph(4, c->graphs).hostReduceGBs, 48);
  const algo::RankGraph d = algo::sameDeviceRankGraph(4, {}, c->graphs);
  EXPECT_EQ(d.deviceCopyGBs, 3000);
  EXPECT_EQ(d.deviceAllPeersUs, 7);
  auto again = algo::CostConstants::fromJson(c->toJson(), "dump");
  ASSERT_TRUE(again.isOk());
  EXPECT_EQ(again->toJson(), c->toJson());
  EXPECT_FALSE(algo::CostConstants::fromJson(R"({"graphs": {"host_copy_gbs": 0}})", "t").isOk());
  EXPECT_FALSE(algo::CostConstants::fromJson(R"({"graphs": {"nic_gbs": 1}})", "t").isOk());
}

// graphs.net_gbs (weft-perf --calibrate across hosts) replaces the discovered NIC's rate, and the
// 10 GbE assumed where a host lists none.
TEST(RankGraphs, TheCalibratedNetworkRateBeatsTheNics) {
  const algo::Placement hosts = algo::Placement::regular(4, 2, 0);
  auto graph = [&](double nicGBs, const algo::TunerOptions& o) {
    return algo::hostSelectorFor(hosts, nicGBs, o, 1).tuner().graph();
  };
  EXPECT_NEAR(graph(0, {}).netAlone, 1.25, 1e-9);  // no NIC listed
  EXPECT_NEAR(graph(25, {}).netAlone, 8, 1e-9);    // the shared-memory copy caps it
  auto c = algo::CostConstants::fromJson(R"({"graphs": {"net_gbs": 0.6}})", "t");
  ASSERT_TRUE(c.isOk()) << c.status().toString();
  algo::TunerOptions calibrated;
  calibrated.constants = *c;
  EXPECT_NEAR(graph(25, calibrated).netAlone, 0.6, 1e-9);
  EXPECT_NEAR(graph(25, calibrated).netPerRank, 0.3, 1e-9);
  auto again = algo::CostConstants::fromJson(c->toJson(), "dump");
  ASSERT_TRUE(again.isOk());
  EXPECT_EQ(again->graphs.netGBs, 0.6);
  EXPECT_EQ(algo::CostConstants{}.toJson().find("net_gbs"), std::string::npos);
}

TEST(RankGraphs, HostMemoryAcrossHostsCrossesTheNetwork) {
  const algo::RankGraph one = algo::hostRankGraph(algo::Placement::regular(4, 1, 0), 12.5);
  EXPECT_EQ(one.hosts, 1);
  EXPECT_EQ(one.ranksPerHost, 4);
  const algo::RankGraph two = algo::hostRankGraph(algo::Placement::regular(8, 2, 0), 12.5);
  EXPECT_EQ(two.hosts, 2);
  EXPECT_EQ(two.ranksPerHost, 4);
  EXPECT_NEAR(two.netPerRank, 12.5 / 4, 1e-9);
  // Priced alike, a large all-reduce costs more where half of it crosses the network.
  const algo::Tuner a(one), b(two);
  EXPECT_GT(b.plan(Collective::allReduce, 64 << 20)->estimateUs,
            a.plan(Collective::allReduce, 64 << 20)->estimateUs);
}

// Four hosts of two ranks sharing a machine's two cores (network namespaces): at a quarter of a
// core a rank, its copies are slower and its phases take turns on the CPUs. The hierarchical
// all-to-all, which stages each block through scratch, lost to the fastest forced algorithm at
// every size there (docs/perf-hosts.md), so it is left to WEFT_ALGO; with a core each it is
// priced. The linear all-to-all, every block in flight at once, is the pick there from 4 MB.
TEST(Selector, RanksSharingCoresPriceTheirCopiesAtTheirShare) {
  const algo::Placement hosts = algo::Placement::regular(8, 4, 0);
  const algo::Selector quarter = algo::hostSelectorFor(hosts, 1.25, {}, 0.25);
  EXPECT_EQ(quarter.tuner().graph().coresPerRank, 0.25);
  EXPECT_EQ(quarter.options().constants.graphs.hostCopyGBs, 2);  // 8 GB/s at a quarter core
  const algo::Selector cores = algo::hostSelectorFor(hosts, 1.25, {}, 1);
  for (std::size_t bytes = 64 << 10; bytes <= std::size_t{64} << 20; bytes *= 4)
    EXPECT_NE(quarter.plan(Collective::allToAll, bytes)->algorithm, "hierarchical") << bytes;
  auto priced = [](const algo::Selector& s, std::size_t bytes, const char* algorithm) {
    for (const algo::Estimate& e : s.tuner().explain(Collective::allToAll, bytes))
      if (e.algorithm == algorithm) return true;
    return false;
  };
  for (std::size_t bytes : {std::size_t{4} << 20, std::size_t{16} << 20, std::size_t{64} << 20}) {
    EXPECT_EQ(quarter.plan(Collective::allToAll, bytes)->algorithm, "linear") << bytes;
    EXPECT_FALSE(priced(quarter, bytes, "hierarchical")) << bytes;
    EXPECT_TRUE(priced(cores, bytes, "hierarchical")) << bytes;
  }
}

// A message's overhead is CPU work of its sender and its receiver: with a core each they overlap
// (what the calibration's stream measures), at a quarter of a core each both take their turns,
// so each message costs kBothEnds / 0.25 times as much.
TEST(Pricing, MessageOverheadsAreChargedAtTheCoreShare) {
  auto c = algo::CostConstants::fromJson(
      R"({"message_overhead_us": {"simple": {"pcie": 0.5, "network": 7}}})", "t");
  ASSERT_TRUE(c.isOk()) << c.status().toString();
  const algo::CostModel model(*c);
  algo::RankGraph g = algo::hostRankGraph(algo::Placement::regular(8, 4, 0), 1.25);
  const algo::Pricing whole(model, "rhd", Collective::allReduce, 64 << 10, algo::Protocol::simple,
                            g);
  EXPECT_NEAR(whole.oIntra, 0.5, 1e-12);
  EXPECT_NEAR(whole.oNet, 7, 1e-12);
  g.coresPerRank = 0.25;
  const algo::Pricing quarter(model, "rhd", Collective::allReduce, 64 << 10, algo::Protocol::simple,
                              g);
  EXPECT_NEAR(quarter.oIntra, 0.5 * algo::kBothEnds * 4, 1e-12);
  EXPECT_NEAR(quarter.oNet, 7 * algo::kBothEnds * 4, 1e-12);
  // The many messages of two-shot cost more than halving-doubling's few, there.
  EXPECT_LT(
      model.estimate("rhd", Collective::allReduce, 64 << 10, algo::Protocol::simple, g)->timeUs,
      model.estimate("twoshot", Collective::allReduce, 64 << 10, algo::Protocol::simple, g)
          ->timeUs);
}

TEST(Selector, HostKernelsServeTheirDeclaredRanges) {
  algo::KernelSet k;
  k.slots.set(static_cast<std::size_t>(Collective::allReduce));
  k.direct.set(static_cast<std::size_t>(Collective::allReduce));
  const algo::Selector s(algo::sharedMemoryRankGraph(4), {}, k);
  EXPECT_EQ(s.plan(Collective::allReduce, 4096)->kernel, algo::Kernel::slots);
  EXPECT_EQ(s.plan(Collective::allReduce, 8192)->kernel, algo::Kernel::schedule);
  EXPECT_EQ(s.plan(Collective::allReduce, 256 << 10)->kernel, algo::Kernel::hostDirect);
  // Not declared for broadcast: its schedules.
  EXPECT_EQ(s.plan(Collective::broadcast, 64)->kernel, algo::Kernel::schedule);
  // The constants come from a tuning file's "kernels"; the variables win over them.
  auto c = algo::CostConstants::fromJson(
      R"({"kernels": {"host_slots_max_bytes": 64, "host_direct_min_bytes": 1048576}})", "t");
  ASSERT_TRUE(c.isOk()) << c.status().toString();
  algo::TunerOptions o;
  o.constants = *c;
  const algo::Selector t(algo::sharedMemoryRankGraph(4), o, k);
  EXPECT_EQ(t.plan(Collective::allReduce, 128)->kernel, algo::Kernel::schedule);
  EXPECT_EQ(t.plan(Collective::allReduce, 512 << 10)->kernel, algo::Kernel::schedule);
  k.directMinBytes = 512 << 10;
  const algo::Selector u(algo::sharedMemoryRankGraph(4), o, k);
  EXPECT_EQ(u.plan(Collective::allReduce, 512 << 10)->kernel, algo::Kernel::hostDirect);
}

TEST(Selector, GpuDirectKernelsFollowTheMeasuredRanges) {
  algo::KernelSet k;
  k.gpu = true;
  k.directRoundBytes = 2 << 20;
  const algo::Selector s(algo::sameDeviceRankGraph(8), {}, k);
  auto small = s.plan(Collective::allReduce, 64 << 10);
  EXPECT_EQ(small->kernel, algo::Kernel::gpuDirect);
  EXPECT_EQ(small->algorithm, "oneshot");
  auto mid = s.plan(Collective::allReduce, 1 << 20);
  EXPECT_EQ(mid->kernel, algo::Kernel::gpuDirect);
  EXPECT_EQ(mid->algorithm, "twoshot");
  // 64 rounds of 2 MiB at 8 ranks; past them a schedule.
  EXPECT_EQ(s.plan(Collective::allReduce, 128 << 20)->kernel, algo::Kernel::gpuDirect);
  EXPECT_EQ(s.plan(Collective::allReduce, 256 << 20)->kernel, algo::Kernel::schedule);
  // The block collectives' direct kernel to 4 MiB a rank.
  EXPECT_EQ(s.plan(Collective::reduceScatter, 4 << 20)->kernel, algo::Kernel::gpuDirect);
  EXPECT_EQ(s.plan(Collective::reduceScatter, 8 << 20)->kernel, algo::Kernel::schedule);
  // A tuning file moves the ranges.
  auto c = algo::CostConstants::fromJson(
      R"({"kernels": {"gpu_direct_rounds": {"4": 2, "64": 8}, "gpu_twoshot_min_ranks": 9}})", "t");
  ASSERT_TRUE(c.isOk()) << c.status().toString();
  EXPECT_EQ(c->kernels.gpuDirectRoundsFor(8), 8);
  auto again = algo::CostConstants::fromJson(c->toJson(), "dump");
  ASSERT_TRUE(again.isOk()) << again.status().toString();
  EXPECT_EQ(again->toJson(), c->toJson());
  algo::TunerOptions o;
  o.constants = *c;
  const algo::Selector t(algo::sameDeviceRankGraph(8), o, k);
  EXPECT_EQ(t.plan(Collective::allReduce, 1 << 20)->algorithm, "oneshot");
  EXPECT_EQ(t.plan(Collective::allReduce, 32 << 20)->kernel, algo::Kernel::schedule);
  EXPECT_FALSE(algo::CostConstants::fromJson(R"({"kernels": {"gpu_x": 1}})", "t").isOk());
  EXPECT_FALSE(
      algo::CostConstants::fromJson(R"({"kernels": {"gpu_ll_max_bytes": -1}})", "t").isOk());
}

TEST(Selector, GpusOfOneHostGetOnlyWhatWasMeasuredThere) {
  // Two H200s over NVLink, as the runtime places two ranks there.
  const algo::GpuGraph g = algo::gpuRankGraph(fixture("hgx_h200.xml"), {{0, 0}, {0, 1}});
  ASSERT_FALSE(g.sameDevice);
  algo::KernelSet k;
  k.gpu = true;
  k.directRoundBytes = 4 << 20;
  const algo::Selector s(g.graph, {}, k);
  for (Collective coll : {Collective::allReduce, Collective::allGather, Collective::reduceScatter,
                          Collective::allToAll, Collective::broadcast, Collective::reduce}) {
    for (std::size_t bytes = 8; bytes <= (std::size_t{1} << 32); bytes *= 4) {
      auto p = s.plan(coll, bytes);
      ASSERT_TRUE(p.isOk());
      if (p->kernel == algo::Kernel::gpuDirect) continue;
      for (const char* never : {"dbtree", "rhd", "hierarchical", "oneshot", "twoshot"})
        EXPECT_NE(p->algorithm, never) << name(coll) << " " << bytes << ": " << p->reason;
    }
  }
  EXPECT_EQ(s.plan(Collective::allReduce, 1 << 30)->algorithm, "ring");
  EXPECT_EQ(s.plan(Collective::allToAll, 1 << 30)->algorithm, "pairwise");
  // WEFT_ALGO still reaches them.
  algo::TunerOptions forced;
  forced.algorithms = {"twoshot"};
  EXPECT_EQ(algo::Selector(g.graph, forced, k).plan(Collective::allReduce, 1 << 30)->algorithm,
            "twoshot");
  // Across hosts there are no direct kernels (they map every rank's buffers), and the model's
  // choice stands: weft-plan tune's selector on two hosts never names a direct kernel.
  const algo::Selector two = algo::gpuSelectorFor(topo::System(fixture("hgx_h100.xml"), 2), {});
  for (std::size_t bytes = 8; bytes <= (std::size_t{1} << 30); bytes *= 8)
    EXPECT_EQ(two.plan(Collective::allReduce, bytes)->kernel, algo::Kernel::schedule) << bytes;
}

// Communicators of `ranks` thread ranks on `hosts` pretend hosts with the fixture as their
// topology (WEFT_TOPO_FILE), each asked for the GPU plan of every collective at every size;
// weft-plan tune's selector on the same system must pick the same.
void expectRuntimePicksEqualTune(const std::string& file, int hosts) {
  const topo::Topology host = fixture(file);
  const int n = hosts * static_cast<int>(host.gpus().size());
  boot::BootstrapOptions bo;
  bo.timeoutSeconds = 120;
  auto boots = boot::makeInProcess(n, bo);
  ASSERT_TRUE(boots.isOk()) << boots.status().toString();
  const algo::Selector tune = algo::gpuSelectorFor(topo::System(host, hosts), {});
  const std::vector<Collective> colls = {Collective::allReduce,     Collective::allGather,
                                         Collective::reduceScatter, Collective::broadcast,
                                         Collective::reduce,        Collective::allToAll};
  std::vector<std::string> failures(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      const auto R = static_cast<std::size_t>(r);
      Config config;
      config.topoFile = fixturePath(file);
      config.maxChannels = 2;  // small inboxes: 72 ranks in one process
      config.fifoSlots = 2;
      config.fifoSlotBytes = 4096;
      config.timeout = std::chrono::milliseconds(120'000);
      if (hosts > 1) config.testHostId = std::to_string(r / (n / hosts));
      auto comm = Communicator::create(std::move((*boots)[R]), config);
      if (!comm) {
        failures[R] = comm.status().toString();
        return;
      }
      for (Collective coll : colls) {
        for (std::size_t bytes = 64; bytes <= (std::size_t{1} << 30); bytes *= 8) {
          auto got = (*comm)->gpuPlanFor(coll, bytes);
          auto want = tune.plan(coll, bytes);
          if (!got || !want) {
            failures[R] = "no plan";
            return;
          }
          if (got->algorithm != want->algorithm || got->protocol != want->protocol ||
              got->kernel != want->kernel || got->channels != want->channels ||
              got->chunkBytes != want->chunkBytes || got->aggregation != want->aggregation) {
            failures[R] = std::string(name(coll)) + " " + std::to_string(bytes) + " B: runtime " +
                          got->algorithm + "/" + std::string(algo::name(got->protocol)) +
                          ", weft-plan " + want->algorithm + "/" +
                          std::string(algo::name(want->protocol));
            return;
          }
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(failures[static_cast<std::size_t>(r)], "") << "rank " << r;
}

// Ranks whose hosts differ (here: files) price on rank 0's host: every rank gets one graph.
TEST(RuntimePicks, RanksOfDifferentHostsPriceOnRankZerosHost) {
  boot::BootstrapOptions bo;
  bo.timeoutSeconds = 60;
  auto boots = boot::makeInProcess(4, bo);
  ASSERT_TRUE(boots.isOk());
  std::vector<std::string> described(4);
  std::vector<std::vector<double>> shifts(4);
  std::vector<std::thread> threads;
  for (int r = 0; r < 4; ++r) {
    threads.emplace_back([&, r] {
      Config config;
      config.topoFile = fixturePath(r == 0 ? "hgx_h100.xml" : "pcie_8gpu_2socket.xml");
      auto comm = Communicator::create(std::move((*boots)[static_cast<std::size_t>(r)]), config);
      if (!comm) {
        described[static_cast<std::size_t>(r)] = comm.status().toString();
        return;
      }
      const Communicator::GpuModel m = (*comm)->gpuTunerModel();
      described[static_cast<std::size_t>(r)] = m.description;
      shifts[static_cast<std::size_t>(r)] = m.graph.shiftBw;
    });
  }
  for (std::thread& t : threads) t.join();
  const algo::GpuGraph want =
      algo::gpuRankGraph(fixture("hgx_h100.xml"), algo::Placement::regular(4, 1, 8));
  for (int r = 0; r < 4; ++r) {
    EXPECT_NE(described[static_cast<std::size_t>(r)].find("NVL"), std::string::npos)
        << "rank " << r << ": " << described[static_cast<std::size_t>(r)];
    EXPECT_EQ(shifts[static_cast<std::size_t>(r)], want.graph.shiftBw) << "rank " << r;
  }
  EXPECT_NE(described[1].find("rank 0's host"), std::string::npos) << described[1];
}

TEST(RuntimePicks, EqualWeftPlanTuneOnEightH100s) {
  expectRuntimePicksEqualTune("hgx_h100.xml", 1);
}

TEST(RuntimePicks, EqualWeftPlanTuneOnAPcieServer) {
  expectRuntimePicksEqualTune("pcie_8gpu_2socket.xml", 1);
}

TEST(RuntimePicks, EqualWeftPlanTuneOnNvl72) {
  expectRuntimePicksEqualTune("gb200_nvl72.xml", 1);
}

TEST(RuntimePicks, EqualWeftPlanTuneOnEightH200s) {
  expectRuntimePicksEqualTune("hgx_h200.xml", 1);
}

TEST(RuntimePicks, EqualWeftPlanTuneOnFourOneGpuNodes) {
  if (!transport::ucxAvailable()) GTEST_SKIP() << "ranks on several hosts need UCX";
  expectRuntimePicksEqualTune("h100_1gpu_node.xml", 4);
}

TEST(RuntimePicks, EqualWeftPlanTuneOnTwoHosts) {
  if (!transport::ucxAvailable()) GTEST_SKIP() << "ranks on several hosts need UCX";
  expectRuntimePicksEqualTune("hgx_h100.xml", 2);
}

// A rank's cores: its share of the CPUs among the ranks of its machine whose CPUs overlap its own,
// whatever host they claim.
TEST(Cores, RanksOfOneMachineShareTheCpusTheyOverlap) {
  const auto claim = [](std::uint64_t machine, std::uint64_t cpus) {
    CpuClaim c;
    c.machineId = machine;
    c.cpus[0] = cpus;
    return c;
  };
  // Four ranks (say two network namespaces of two) on the same 2 CPUs: none has a core.
  std::vector<CpuClaim> netns(4, claim(7, 0b11));
  EXPECT_EQ(coresOf(netns, 0), 0);
  // Two ranks on 16 CPUs: 8 each; bound to 2 of them, no more than those.
  std::vector<CpuClaim> two(2, claim(7, 0xffff));
  EXPECT_EQ(coresOf(two, 1), 8);
  two[0] = claim(7, 0b11);
  EXPECT_EQ(coresOf(two, 0), 2);
  // Ranks bound to disjoint CPUs (containers with cpusets of their own) or on other machines do
  // not count.
  const std::vector<CpuClaim> apart = {claim(7, 0b0011), claim(7, 0b1100), claim(8, 0b0011)};
  EXPECT_EQ(coresOf(apart, 0), 2);
  EXPECT_EQ(coresOf(apart, 2), 2);
  // CPUs past the first 64.
  std::vector<CpuClaim> wide(3, claim(7, 0));
  for (auto& c : wide) c.cpus[1] = 0xff;  // CPUs 64..71
  EXPECT_EQ(coresOf(wide, 2), 2);
  // Unrounded, and the fewest of all: four ranks on 2 CPUs have half a core each; beside a
  // rank bound to 2 CPUs of its own, those four still have the fewest.
  EXPECT_DOUBLE_EQ(coreShareOf(netns, 3), 0.5);
  EXPECT_DOUBLE_EQ(fewestCores(netns), 0.5);
  netns.push_back(claim(7, 0b1100));
  EXPECT_DOUBLE_EQ(coreShareOf(netns, 4), 2);
  EXPECT_DOUBLE_EQ(fewestCores(netns), 0.5);
  EXPECT_DOUBLE_EQ(fewestCores(two), 2);
  // This process: some CPU, on some machine.
  const CpuClaim self = CpuClaim::ofThisProcess(42);
  EXPECT_NE(self.machineId, 0u);
  EXPECT_GE(coresOf({self}, 0), 1);
}

}  // namespace
}  // namespace weft
