#include "src/core/config.hpp"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "src/transport/cuda_ipc.hpp"
#include "src/transport/ucx.hpp"

namespace weft {
namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

// weft's variable, else NCCL's name for the same setting (a drop-in for NCCL reads the
// environment its users already have; NCCL_ALGO / NCCL_PROTO: TunerOptions::fromNccl).
const char* envOrNccl(const char* weftName, const char* ncclName) {
  const char* v = env(weftName);
  return v != nullptr ? v : env(ncclName);
}

Result<double> number(const char* name, double lo, double hi) {
  const char* v = env(name);
  char* end = nullptr;
  const double x = std::strtod(v, &end);
  if (end == v || *end != '\0' || !(x >= lo && x <= hi)) {
    // Bounds as people write them: 2 to 16, 0.5 to 1048576 (not 2.000000).
    auto shown = [](double b) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.15g", b);
      return std::string(buf);
    };
    return invalidArgument(std::string(name) + "=" + v + ": expected a number from " + shown(lo) +
                           " to " + shown(hi));
  }
  return x;
}

}  // namespace

Result<Config> Config::fromEnvironment() {
  Config c;
  if (env("WEFT_TIMEOUT_S") != nullptr) {
    auto s = number("WEFT_TIMEOUT_S", 0.001, 1e6);
    if (!s) return s.status();
    c.timeout = std::chrono::milliseconds(static_cast<long long>(*s * 1000));
  }
  if (const char* v = envOrNccl("WEFT_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")) c.socketIfname = v;
  if (const char* v = envOrNccl("WEFT_COMM_ID", "NCCL_COMM_ID")) c.commId = v;
  if (const char* v = env("WEFT_COMM_SECRET")) c.commSecret = v;
  if (env("WEFT_CHECK_CALLS") != nullptr) {
    auto x = number("WEFT_CHECK_CALLS", 0, 1);
    if (!x) return x.status();
    c.checkCalls = *x != 0;
  }
  if (const char* path = env("WEFT_COMM_SECRET_FILE"); path != nullptr && c.commSecret.empty()) {
    std::ifstream in(path);
    if (!in || !std::getline(in, c.commSecret) || c.commSecret.empty())
      return invalidArgument(std::string("WEFT_COMM_SECRET_FILE=") + path +
                             ": cannot read a secret from it (its first line, not empty)");
  }
  if (const char* v = env("WEFT_TRANSPORT")) {
    c.transport = v;
    if (c.transport != "auto" && c.transport != "shm" && c.transport != "ucx") {
      return invalidArgument("WEFT_TRANSPORT=" + c.transport +
                             ": expected auto (shm within a host, ucx between hosts), shm or ucx");
    }
    if (c.transport == "ucx" && !transport::ucxAvailable()) {
      return invalidArgument(
          "WEFT_TRANSPORT=ucx: this build has no UCX transport (build with "
          "libucx-dev installed)");
    }
  }
  if (env("WEFT_MAX_CHANNELS") != nullptr) {
    auto x = number("WEFT_MAX_CHANNELS", 2, 16);
    if (!x) return x.status();
    c.maxChannels = static_cast<int>(*x);
  }
  // weft's name, else NCCL's (number() names the variable in its error).
  const char* mixing = env("WEFT_GRAPH_MIXING") != nullptr           ? "WEFT_GRAPH_MIXING"
                       : env("NCCL_GRAPH_MIXING_SUPPORT") != nullptr ? "NCCL_GRAPH_MIXING_SUPPORT"
                                                                     : nullptr;
  if (mixing != nullptr) {
    auto x = number(mixing, 0, 1);
    if (!x) return x.status();
    c.graphMixing = *x != 0;
  }
  if (env("WEFT_CHECK_PLANS") != nullptr) {
    auto x = number("WEFT_CHECK_PLANS", 0, 1);
    if (!x) return x.status();
    c.checkPlans = *x != 0;
  }
  if (env("WEFT_GPU_DIRECT") != nullptr) {
    auto x = number("WEFT_GPU_DIRECT", 0, 64);
    if (!x) return x.status();
    c.gpuDirect = static_cast<int>(*x);
  }
  if (const char* v = env("WEFT_GPU_REGISTERED"); v != nullptr && std::string(v) != "auto") {
    auto x = number("WEFT_GPU_REGISTERED", 0, 1);
    if (!x) return x.status();
    c.gpuRegistered = static_cast<int>(*x);
  }
  if (env("WEFT_GPU_CHANNELS") != nullptr) {
    auto x = number("WEFT_GPU_CHANNELS", 1, 64);
    if (!x) return x.status();
    c.gpuChannels = static_cast<int>(*x);
  }
  if (env("WEFT_GPU_SLOT_BYTES") != nullptr) {
    auto x = number("WEFT_GPU_SLOT_BYTES", 16 * 1024, 4.0 * 1024 * 1024);
    if (!x) return x.status();
    c.gpuSlotBytes = static_cast<std::size_t>(*x) / 4096 * 4096;
  }
  if (env("WEFT_GPU_LL_DIRECT_BYTES") != nullptr) {
    auto x = number("WEFT_GPU_LL_DIRECT_BYTES", 0, 256 * 1024);
    if (!x) return x.status();
    c.gpuLlDirectBytes = static_cast<std::size_t>(*x);
  }
  if (env("WEFT_GPU_LL_BLOCK_BYTES") != nullptr) {
    auto x = number("WEFT_GPU_LL_BLOCK_BYTES", 512, 256 * 1024);
    if (!x) return x.status();
    c.gpuLlBlockBytes = static_cast<std::size_t>(*x);
  }
  if (env("WEFT_GPU_LL_BLOCKS") != nullptr) {
    auto x = number("WEFT_GPU_LL_BLOCKS", 1, transport::CudaIpcGeometry::kDirectLlBlocks);
    if (!x) return x.status();
    c.gpuLlBlocks = static_cast<int>(*x);
  }
  if (env("WEFT_GPU_PDL") != nullptr) {
    auto x = number("WEFT_GPU_PDL", 0, 1);
    if (!x) return x.status();
    c.gpuDependentLaunch = *x != 0;
  }
  if (env("WEFT_GPU_DIRECT_BLOCK_BYTES") != nullptr) {
    auto x = number("WEFT_GPU_DIRECT_BLOCK_BYTES", 512, 128 * 1024);
    if (!x) return x.status();
    c.gpuDirectBlockBytes = static_cast<std::size_t>(*x);
  }
  if (env("WEFT_SLOT_BYTES") != nullptr) {
    auto x = number("WEFT_SLOT_BYTES", 4096, 64.0 * 1024 * 1024);
    if (!x) return x.status();
    c.fifoSlotBytes = static_cast<std::size_t>(*x) / 64 * 64;
  }
  if (env("WEFT_SINGLE_COPY_BYTES") != nullptr) {
    auto x = number("WEFT_SINGLE_COPY_BYTES", 0, 1e18);
    if (!x) return x.status();
    c.singleCopyBytes = static_cast<std::size_t>(*x);
  }
  if (env("WEFT_SINGLE_COPY_MIN_GBPS") != nullptr) {
    auto x = number("WEFT_SINGLE_COPY_MIN_GBPS", 0, 1000);
    if (!x) return x.status();
    c.singleCopyMinGBps = *x;
  }
  if (const char* v = env("WEFT_HOST_DIRECT")) {
    const std::string x = v;
    if (x == "auto") {
      c.hostDirect = -1;
    } else if (x == "0" || x == "1") {
      c.hostDirect = x == "1" ? 1 : 0;
    } else {
      return invalidArgument("WEFT_HOST_DIRECT=" + x + ": expected auto, 0 or 1");
    }
  }
  if (env("WEFT_HOST_SMALL_BYTES") != nullptr) {
    auto x = number("WEFT_HOST_SMALL_BYTES", 0, 8192);
    if (!x) return x.status();
    c.hostSmallBytes = static_cast<std::size_t>(*x);
  }
  if (env("WEFT_HOST_DIRECT_BYTES") != nullptr) {
    auto x = number("WEFT_HOST_DIRECT_BYTES", 0, 1e18);
    if (!x) return x.status();
    c.hostDirectBytes = static_cast<std::size_t>(*x);
  }
  if (env("WEFT_HOST_DIRECT_THREADS") != nullptr) {
    auto x = number("WEFT_HOST_DIRECT_THREADS", 1, 16);
    if (!x) return x.status();
    c.hostDirectThreads = static_cast<int>(*x);
  }
  if (const char* v = env("WEFT_HOST_CHANNEL_THREADS"); v != nullptr && std::string(v) != "auto") {
    auto x = number("WEFT_HOST_CHANNEL_THREADS", 0, 1);
    if (!x) return x.status();
    c.hostChannelThreads = static_cast<int>(*x);
  }
  if (env("WEFT_HOST_STAGE_BYTES") != nullptr) {
    auto x = number("WEFT_HOST_STAGE_BYTES", 8192, 1 << 30);
    if (!x) return x.status();
    c.hostStageBytes = static_cast<std::size_t>(*x) / 8192 * 8192;
  }
  if (const char* v = envOrNccl("WEFT_DEBUG", "NCCL_DEBUG")) c.debug = v;
  if (const char* v = env("WEFT_GPU_TRACE")) c.gpuTrace = v;
  if (const char* v = env("CUDA_DEVICE_MAX_CONNECTIONS")) c.cudaMaxConnections = std::atoi(v);
  if (const char* v = env("WEFT_TEST_HOST_ID")) c.testHostId = v;
  if (const char* v = envOrNccl("WEFT_TOPO_FILE", "NCCL_TOPO_FILE")) c.topoFile = v;
  auto tuner = algo::TunerOptions::fromEnvironment();
  if (!tuner) return tuner.status();
  c.tuner = std::move(*tuner);
  return c;
}

}  // namespace weft
