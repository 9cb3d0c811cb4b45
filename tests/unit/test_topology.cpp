#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>

#include "topology/cuda_loader.hpp"
#include "topology/discovery.hpp"
#include "topology/nvml_loader.hpp"
#include "topology/system.hpp"
#include "topology/topology.hpp"

namespace weft::topo {
namespace {

std::string fixture(const std::string& name) {
  return std::string(WEFT_SOURCE_DIR) + "/topology/fixtures/" + name;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Topology loadFixture(const std::string& name) {
  auto t = Topology::load(fixture(name));
  EXPECT_TRUE(t.isOk()) << t.status().toString();
  return std::move(*t);
}

const char* kFixtures[] = {"hgx_h100.xml", "hgx_h200.xml", "pcie_8gpu_2socket.xml",
                           "gb200_nvl72.xml"};

TEST(Topology, FixturesRoundTripByteForByte) {
  for (const char* f : kFixtures) {
    const Topology t = loadFixture(f);
    EXPECT_EQ(writeXml(t.xml()), slurp(fixture(f))) << f;
    auto again = parseXml(writeXml(t.xml()), "dump");
    ASSERT_TRUE(again.isOk());
    EXPECT_EQ(*again, t.xml()) << f;
  }
}

TEST(Topology, HgxH100) {
  const Topology t = loadFixture("hgx_h100.xml");
  ASSERT_EQ(t.gpus().size(), 8u);
  ASSERT_EQ(t.nics().size(), 8u);
  ASSERT_EQ(t.cpus().size(), 2u);
  for (int a : t.gpus()) {
    for (int b : t.gpus()) {
      if (a == b) continue;
      EXPECT_EQ(t.path(a, b).cls, PathClass::nvl);
      EXPECT_NEAR(t.path(a, b).bandwidth, 18 * 20.6, 1e-9);  // all 18 NVLink4 links, via NVSwitch
      EXPECT_EQ(t.path(a, b).hops, 2);
    }
  }
  const int gpu0 = t.gpus()[0];
  EXPECT_EQ(t.path(gpu0, t.nics()[0]).cls, PathClass::pix);
  EXPECT_DOUBLE_EQ(t.path(gpu0, t.nics()[0]).bandwidth, 48.0);  // PCIe Gen5 x16
  EXPECT_EQ(t.path(gpu0, t.nics()[2]).cls, PathClass::phb);
  EXPECT_EQ(t.path(gpu0, t.nics()[4]).cls, PathClass::sys);
  EXPECT_DOUBLE_EQ(t.path(gpu0, t.nics()[4]).bandwidth, 22.0);  // Sapphire Rapids UPI
  EXPECT_EQ(t.nearestNic(gpu0), t.nics()[0]);
  EXPECT_EQ(t.nearestNic(t.gpus()[5]), t.nics()[5]);
}

TEST(Topology, PcieServerWithoutNvlink) {
  const Topology t = loadFixture("pcie_8gpu_2socket.xml");
  ASSERT_EQ(t.gpus().size(), 8u);
  const auto& g = t.gpus();
  EXPECT_EQ(t.path(g[0], g[1]).cls, PathClass::pix);
  EXPECT_DOUBLE_EQ(t.path(g[0], g[1]).bandwidth, 24.0);
  EXPECT_EQ(t.path(g[0], g[2]).cls, PathClass::phb);
  EXPECT_EQ(t.path(g[0], g[4]).cls, PathClass::sys);
  EXPECT_DOUBLE_EQ(t.path(g[0], g[4]).bandwidth, 24.0);  // Zen4 xGMI
  EXPECT_EQ(t.summary().find("NVSwitch"), std::string::npos);
}

TEST(Topology, Gb200Nvl72IsOneNvlinkDomain) {
  const Topology t = loadFixture("gb200_nvl72.xml");
  ASSERT_EQ(t.gpus().size(), 72u);
  EXPECT_EQ(t.cpus().size(), 36u);
  for (int b : t.gpus()) {
    if (b == t.gpus()[0]) continue;
    EXPECT_EQ(t.path(t.gpus()[0], b).cls, PathClass::nvl);
    EXPECT_NEAR(t.path(t.gpus()[0], b).bandwidth, 18 * 40.1, 1e-9);
  }
  const int gpu0 = t.gpus()[0];
  const int cpu = t.nodes()[static_cast<std::size_t>(gpu0)].numa;
  EXPECT_EQ(t.path(gpu0, cpu).cls, PathClass::c2c);
}

TEST(System, RailOptimizedFabric) {
  const System s(loadFixture("hgx_h100.xml"), 4);
  EXPECT_EQ(s.ranks(), 32);
  EXPECT_EQ(s.path(0, 1).cls, PathClass::nvl);
  const Path sameRail = s.path(0, 8);
  const Path otherRail = s.path(0, 9);
  EXPECT_EQ(sameRail.cls, PathClass::net);
  EXPECT_DOUBLE_EQ(sameRail.bandwidth, 48.0);  // min(PCIe Gen5 x16 to the NIC, 400G = 50 GB/s)
  EXPECT_GT(otherRail.latency, sameRail.latency);
  EXPECT_NE(s.summary().find("4 host(s) x 8 GPU(s) = 32 ranks"), std::string::npos);
}

TEST(Topology, MatrixAndSummaryName16Devices) {
  const Topology t = loadFixture("hgx_h200.xml");
  EXPECT_NE(t.summary().find("8 GPU(s) sm90, 8 NIC(s) (400 Gb/s), 2 CPU(s), NVSwitch"),
            std::string::npos)
      << t.summary();
  EXPECT_NE(t.matrix().find("NVL 371"), std::string::npos);
}

TEST(Discovery, FindsAtLeastTheCpus) {
  auto t = discover();
  ASSERT_TRUE(t.isOk()) << t.status().toString();
  EXPECT_GE(t->cpus().size(), 1u);
  // What discovery wrote loads back into the same graph.
  auto again = Topology::fromXml(t->xml());
  ASSERT_TRUE(again.isOk());
  EXPECT_EQ(again->nodes().size(), t->nodes().size());
}

TEST(Discovery, MissingNvmlDegradesGracefully) {
  DiscoveryOptions opt;
  opt.nvmlLibrary = "/nonexistent/libnvidia-ml.so.1";
  EXPECT_EQ(queryNvml(opt.nvmlLibrary).status().code(), Code::unsupported);
  EXPECT_TRUE(discover(opt).isOk());
}

TEST(Discovery, FakeNvmlDescribesAnNvswitchMachine) {
  DiscoveryOptions opt;
  opt.nvmlLibrary = WEFT_FAKE_NVML;
  opt.useCuda = false;
  opt.useHwlocPci = false;  // on a machine with real GPUs, hwloc would add them
  auto gpus = queryNvml(opt.nvmlLibrary);
  ASSERT_TRUE(gpus.isOk()) << gpus.status().toString();
  ASSERT_EQ(gpus->size(), 8u);
  EXPECT_EQ((*gpus)[0].busId, "0000:18:00.0");
  EXPECT_EQ((*gpus)[0].sm, 90);
  EXPECT_EQ((*gpus)[0].nvlinks.size(), 18u);
  auto t = discover(opt);
  ASSERT_TRUE(t.isOk()) << t.status().toString();
  ASSERT_EQ(t->gpus().size(), 8u);
  for (int b : t->gpus()) {
    if (b == t->gpus()[0]) continue;
    EXPECT_EQ(t->path(t->gpus()[0], b).cls, PathClass::nvl);
    EXPECT_NEAR(t->path(t->gpus()[0], b).bandwidth, 18 * 20.6, 1e-9);
  }
  EXPECT_NE(writeXml(t->xml()).find("tclass=\"0x068000\""), std::string::npos);
}

TEST(Discovery, NvmlIsAuthoritativeAboutGpus) {
  // hwloc's PCI tree (whatever this machine has) plus the fake's eight GPUs: only NVML's remain.
  DiscoveryOptions opt;
  opt.nvmlLibrary = WEFT_FAKE_NVML;
  opt.useCuda = false;
  auto t = discover(opt);
  ASSERT_TRUE(t.isOk()) << t.status().toString();
  EXPECT_EQ(t->gpus().size(), 8u);
}

TEST(Discovery, MissingCudaDriverDegradesGracefully) {
  EXPECT_EQ(queryCudaP2p("/nonexistent/libcuda.so.1").status().code(), Code::unsupported);
  DiscoveryOptions opt;
  opt.nvmlLibrary = WEFT_FAKE_NVML;
  opt.cudaLibrary = "/nonexistent/libcuda.so.1";
  opt.useHwlocPci = false;
  auto t = discover(opt);
  ASSERT_TRUE(t.isOk()) << t.status().toString();
  EXPECT_FALSE(t->peerAccess(t->gpus()[0], t->gpus()[1]).known);
  EXPECT_EQ(writeXml(t->xml()).find("p2p_peers"), std::string::npos);
}

TEST(Discovery, FakeCudaDriverGivesPeerAccess) {
  // The fake numbers its devices in reverse of NVML: matching is by bus id.
  auto cuda = queryCudaP2p(WEFT_FAKE_CUDA);
  ASSERT_TRUE(cuda.isOk()) << cuda.status().toString();
  ASSERT_EQ(cuda->busIds.size(), 8u);
  EXPECT_EQ(cuda->busIds[0], "0000:dc:00.0");
  DiscoveryOptions opt;
  opt.nvmlLibrary = WEFT_FAKE_NVML;
  opt.cudaLibrary = WEFT_FAKE_CUDA;
  opt.useHwlocPci = false;
  auto t = discover(opt);
  ASSERT_TRUE(t.isOk()) << t.status().toString();
  const std::string xml = writeXml(t->xml());
  EXPECT_NE(xml.find("p2p_peers=\"1,2,3\""), std::string::npos) << xml;
  EXPECT_NE(xml.find("p2p_atomics=\"1\""), std::string::npos) << xml;
  const auto& g = t->gpus();
  for (int b = 1; b < 8; ++b) {
    const PeerAccess& pa = t->peerAccess(g[0], g[static_cast<std::size_t>(b)]);
    EXPECT_TRUE(pa.known);
    EXPECT_EQ(pa.access, b < 4) << b;
    EXPECT_EQ(pa.atomics, b == 1) << b;
    // NVSwitch joins every pair, but a pair without peer access goes through host memory.
    EXPECT_EQ(t->path(g[0], g[static_cast<std::size_t>(b)]).cls,
              b < 4 ? PathClass::nvl : PathClass::phb)
        << b;
  }
  EXPECT_NE(t->matrix().find("PHB*"), std::string::npos);
  // What discovery wrote loads back the same.
  auto again = Topology::fromXml(t->xml());
  ASSERT_TRUE(again.isOk());
  EXPECT_EQ(writeXml(again->xml()), xml);
  EXPECT_FALSE(again->peerAccess(g[0], g[5]).access);
}

TEST(Topology, MalformedPeerListNamesTheLine) {
  auto sys = loadXmlFile(fixture("hgx_h100.xml"));
  ASSERT_TRUE(sys.isOk());
  std::string text = writeXml(*sys);
  const std::size_t at = text.find("<gpu ");
  ASSERT_NE(at, std::string::npos);
  text.insert(at + 5, "p2p_peers=\"1,9\" ");
  auto t = Topology::fromXml(*parseXml(text, "bad.xml"), "bad.xml");
  ASSERT_FALSE(t.isOk());
  EXPECT_NE(t.status().message().find("bad.xml:"), std::string::npos) << t.status().message();
  EXPECT_NE(t.status().message().find("'9'"), std::string::npos) << t.status().message();
}

TEST(Discovery, TopoFileFromTheEnvironment) {
  setenv("WEFT_TOPO_FILE", fixture("pcie_8gpu_2socket.xml").c_str(), 1);
  auto t = topologyFromEnvironmentOrDiscovery();
  unsetenv("WEFT_TOPO_FILE");
  ASSERT_TRUE(t.isOk());
  EXPECT_EQ(t->gpus().size(), 8u);
}

TEST(Nvml, NormalizesBusIds) {
  EXPECT_EQ(normalizeBusId("00000000:18:00.0"), "0000:18:00.0");
  EXPECT_EQ(normalizeBusId("0000:AB:1F.3"), "0000:ab:1f.3");
  EXPECT_EQ(normalizeBusId("18:00.0"), "0000:18:00.0");
}

struct Broken {
  const char* text;
  int line;
  const char* says;
};

TEST(TopologyFile, MalformedInputNamesTheLine) {
  const Broken cases[] = {
      {"<system version=\"1\">\n  <cpu numaid=\"0\">\n</system>\n", 3, "mismatched tag"},
      {"<sytem version=\"1\">\n</sytem>\n", 1, "expected <system>"},
      {"<system>\n</system>\n", 1, "no <cpu>"},
      {"<system>\n <cpu numaid=\"0\">\n  <pci class=\"0x060400\"/>\n </cpu>\n</system>\n", 3,
       "without a busid"},
      {"<system>\n <cpu numaid=\"0\">\n  <gpu dev=\"0\"/>\n </cpu>\n</system>\n", 3,
       "inside the <pci>"},
      {"<system>\n <cpu>\n  <pci busid=\"0000:01:00.0\">\n   <gpu dev=\"0\" sm=\"90\">\n"
       "    <nvlink target=\"0000:99:00.0\" count=\"2\" tclass=\"0x030200\"/>\n   </gpu>\n  "
       "</pci>\n"
       " </cpu>\n</system>\n",
       5, "neither a GPU"},
      {"<system>\n <cpu>\n  <nic>\n   <net name=\"x\" dev=\"0\" speed=\"0\"/>\n  </nic>\n "
       "</cpu>\n</system>\n",
       4, "no positive speed"},
      {"<system>\n <cpu>\n  <pci busid=\"a\"><gpu dev=\"0\"/></pci>\n  <pci busid=\"b\"><gpu "
       "dev=\"0\"/></pci>\n"
       " </cpu>\n</system>\n",
       4, "appears twice"},
      {"", 1, "no element"},
  };
  for (const Broken& b : cases) {
    auto xml = parseXml(b.text, "bad.xml");
    Status st = xml.isOk() ? Topology::fromXml(std::move(*xml), "bad.xml").status() : xml.status();
    EXPECT_EQ(st.code(), Code::invalidArgument) << b.text;
    EXPECT_NE(st.message().find("bad.xml:" + std::to_string(b.line) + ":"), std::string::npos)
        << st.message() << "\n---\n"
        << b.text;
    EXPECT_NE(st.message().find(b.says), std::string::npos) << st.message();
  }
}

TEST(TopologyFile, MissingFileIsAClearError) {
  auto t = Topology::load("/nonexistent/topo.xml");
  EXPECT_EQ(t.status().code(), Code::invalidArgument);
  EXPECT_NE(t.status().message().find("cannot open"), std::string::npos);
}

// Random mutations of real files: every one either loads or fails with "file:line:".
TEST(TopologyFile, SurvivesRandomMutation) {
  std::mt19937 rng(7);
  const std::string base = slurp(fixture("hgx_h100.xml"));
  const std::string alphabet = "<>/=\" x0123456789abcdefpcigunvlk.:\n";
  int loaded = 0, rejected = 0;
  for (int i = 0; i < 1500; ++i) {
    std::string text = base;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const std::size_t at = rng() % text.size();
      switch (rng() % 3) {
        case 0:
          text[at] = alphabet[rng() % alphabet.size()];
          break;
        case 1:
          text.erase(at, 1 + rng() % 8);
          break;
        default:
          text.insert(at, 1, alphabet[rng() % alphabet.size()]);
          break;
      }
    }
    auto xml = parseXml(text, "fuzz.xml");
    Status st = xml.isOk() ? Topology::fromXml(std::move(*xml), "fuzz.xml").status() : xml.status();
    if (st.isOk()) {
      ++loaded;
    } else {
      ++rejected;
      EXPECT_EQ(st.message().rfind("fuzz.xml:", 0), 0u) << st.message();
    }
  }
  EXPECT_GT(rejected, 100);
  EXPECT_GT(loaded, 10);
}

}  // namespace
}  // namespace weft::topo
