#include "perf/launch.hpp"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <barrier>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "perf/bench.hpp"
#include "perf/collective.hpp"
#include "perf/gpu.hpp"
#include "perf/peer.hpp"
#include "weft/weft.h"

#ifdef WEFT_HAVE_MPI
#include <mpi.h>
#endif

namespace weft::perf {
namespace {

int usage(const std::string& message) {
  std::fprintf(stderr, "weft-perf: %s\n", message.c_str());
  return kExitUsage;
}

int failed(const std::string& message) {
  std::fprintf(stderr, "weft-perf: %s\n", message.c_str());
  return kExitFailed;
}

// Set by mpirun and the other MPI launchers (Open MPI, PMIx, MPICH's Hydra, MVAPICH).
bool launchedByMpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE",
                        "MPI_LOCALNRANKS", "MV2_COMM_WORLD_SIZE"}) {
    if (std::getenv(v) != nullptr) return true;
  }
  return false;
}

// What the ranks' count allows, checked before any process starts.
Status checkRanks(const Options& o, int nranks) {
  if (!o.calibratePath.empty() && nranks < 2)
    return invalidArgument(
        "--calibrate measures between ranks and needs 2 or more: use -np, -t or mpirun -np");
  if (o.collective == Collective::sendRecv && nranks < 2)
    return invalidArgument("sendrecv needs 2 or more ranks: use -np, -t or mpirun -np");
  if (hasRoot(o.collective) && o.root >= nranks)
    return invalidArgument("root " + std::to_string(o.root) + " is not one of the " +
                           std::to_string(nranks) + " ranks");
  return {};
}

// Decides where the buffers live before any rank starts (and before -np forks: the GPU probe runs
// in a child of its own). GPU memory when --gpu asks, or by default where the build has CUDA, a
// GPU is present and the run can use GPU buffers; host memory otherwise.
Status resolveMemory(Options& o) {
  const char* hostOnly = nullptr;
  if (o.collective == Collective::sendRecv)
    hostOnly = "sendrecv runs on host memory (weft's point-to-point takes no GPU buffers yet)";
  // --calibrate measures the host's constants unless --gpu asks for the GPU tuner's.
  if (!o.calibratePath.empty() && o.memory != Memory::gpu)
    hostOnly = "--calibrate measures the host constants on host memory (--gpu: the GPU tuner's)";
  if (o.compare == "mpi") hostOnly = "--compare mpi times MPI on host memory";
  const bool tp = o.tp != TpMode::none || o.attention;
  const bool needsGpu = o.memory == Memory::gpu || o.graphLaunches > 0 || o.compare == "nccl" || tp;
  const char* asked = o.memory == Memory::gpu ? "--gpu"
                      : o.attention           ? "attention"
                      : tp                    ? "ag-gemm and gemm-rs"
                      : o.graphLaunches > 0   ? "-G"
                      : o.compare == "nccl"   ? "--compare nccl"
                                              : "";
  if (o.memory == Memory::host) return {};
  if (hostOnly != nullptr) {
    if (needsGpu) return invalidArgument(std::string(asked) + ": " + hostOnly);
    o.memory = Memory::host;
    return {};
  }
  std::string why;
  if (probeGpus(why) > 0) {
    o.memory = Memory::gpu;
  } else if (needsGpu) {
    return {Code::unsupported, std::string(asked) + (o.tp != TpMode::none ? " need" : " needs") +
                                   " a GPU, but " + why +
                                   (tp ? "" : ": run on host memory (--host)")};
  } else {
    o.memory = Memory::host;
  }
  // Ranks as threads spin-wait on each other's kernels; with CUDA's lazy module loading, loading
  // a kernel can wait for another thread's spinning one (/work/shared/DEVICE.md). Set before any
  // rank touches CUDA; a value the user set stays.
  if (o.gpu() && o.threads > 1) setenv("CUDA_MODULE_LOADING", "EAGER", 0);
  return {};
}

// One process: options.threads ranks, thread 0 on this thread (MPI calls stay on it).
// `callFailed`, where given, says whether a rank stopped early.
int runProcess(const Options& o, int proc, int nprocs, const weftUniqueId& id,
               const std::string& launch, Peer* peer, bool* callFailed = nullptr) {
  std::barrier<> threads(o.threads);
  ProcessContext context{o, proc, nprocs, id, launch, peer, &threads};
  std::vector<int> codes(static_cast<std::size_t>(o.threads), kExitOk);
  std::vector<std::thread> workers;
  for (int t = 1; t < o.threads; ++t) {
    workers.emplace_back([&, t] { codes[static_cast<std::size_t>(t)] = runRank(context, t); });
  }
  codes[0] = runRank(context, 0);
  for (std::thread& w : workers) w.join();
  if (callFailed != nullptr) *callFailed = context.callFailed;
  return *std::max_element(codes.begin(), codes.end());
}

// Reads the id the parent writes into `fd`; false when the parent closed it instead.
bool readId(int fd, weftUniqueId& id) {
  auto* p = reinterpret_cast<char*>(&id);
  std::size_t got = 0;
  while (got < sizeof id) {
    const ssize_t n = read(fd, p + got, sizeof id - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    got += static_cast<std::size_t>(n);
  }
  return true;
}

int runForked(const Options& o) {
  const int nprocs = o.processes;
  // The children are forked before this process has any thread: fork() copies only the calling
  // thread, so a lock another thread held at that moment (the rendezvous listener's allocator
  // lock, say) would stay locked in the child forever. Only then does this process make the id,
  // whose listener thread lives here, and hand it to each child through a pipe.
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t parent = getpid();
  std::map<pid_t, int> children;  // pid -> process index
  std::vector<int> pipes;         // write ends, by process index
  auto stopChildren = [&] {
    for (int fd : pipes) close(fd);
    for (const auto& [child, index] : children) kill(child, SIGTERM);
  };
  for (int p = 0; p < nprocs; ++p) {
    int fds[2];
    if (pipe(fds) != 0) {
      std::perror("weft-perf: pipe");
      stopChildren();
      return kExitFailed;
    }
    const pid_t pid = fork();
    if (pid < 0) {
      std::perror("weft-perf: fork");
      close(fds[0]);
      close(fds[1]);
      stopChildren();
      return kExitFailed;
    }
    if (pid == 0) {
      // A rank whose parent is gone (killed by a timeout) has nobody to report to.
      prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (getppid() != parent) _exit(kExitFailed);
      for (int fd : pipes) close(fd);  // the earlier children's
      close(fds[1]);
      weftUniqueId id{};
      if (!readId(fds[0], id)) _exit(kExitFailed);  // the parent could not make one
      close(fds[0]);
      const int code = runProcess(o, p, nprocs, id,
                                  "forked by weft-perf -np " + std::to_string(nprocs), nullptr);
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(code);
    }
    close(fds[0]);
    pipes.push_back(fds[1]);
    children[pid] = p;
  }
  signal(SIGPIPE, SIG_IGN);  // a child that died early must not take this process with it
  weftUniqueId id{};
  if (weftGetUniqueId(&id) != weftSuccess) {
    failed(std::string("weftGetUniqueId: ") + weftGetLastError());
    stopChildren();
    while (waitpid(-1, nullptr, 0) > 0) {
    }
    return kExitFailed;
  }
  for (int fd : pipes) {
    // A child that is already gone shows up below as a failed child.
    if (write(fd, &id, sizeof id) != static_cast<ssize_t>(sizeof id))
      std::perror("weft-perf: handing a child the unique id");
    close(fd);
  }
  pipes.clear();
  int worst = kExitOk;
  while (!children.empty()) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, 0);
    if (pid < 0) break;
    auto it = children.find(pid);
    if (it == children.end()) continue;
    const int index = it->second;
    children.erase(it);
    if (WIFEXITED(status)) {
      worst = std::max(worst, WEXITSTATUS(status));
    } else {
      // A crashed rank never answers again: end the others now rather than at their timeout.
      std::fprintf(stderr, "weft-perf: process %d (pid %d) died of signal %d; stopping the rest\n",
                   index, static_cast<int>(pid), WIFSIGNALED(status) ? WTERMSIG(status) : 0);
      worst = kExitFailed;
      for (const auto& [child, other] : children) kill(child, SIGTERM);
    }
  }
  return worst;
}

int runFromEnvironment(const Options& o) {
  const char* rank = std::getenv("WEFT_RANK");
  const char* size = std::getenv("WEFT_NRANKS");
  if (rank == nullptr || size == nullptr)
    return usage("set both WEFT_RANK and WEFT_NRANKS (this process's index and the count)");
  if (std::getenv("WEFT_COMM_ID") == nullptr && std::getenv("NCCL_COMM_ID") == nullptr)
    return usage("WEFT_RANK/WEFT_NRANKS need WEFT_COMM_ID=host:port, where process 0 listens");
  char* end = nullptr;
  const long proc = std::strtol(rank, &end, 10);
  const bool rankOk = *end == '\0';
  const long nprocs = std::strtol(size, &end, 10);
  if (!rankOk || *end != '\0' || nprocs < 1 || proc < 0 || proc >= nprocs)
    return usage(std::string("WEFT_RANK=") + rank + " WEFT_NRANKS=" + size +
                 ": need 0 <= WEFT_RANK < WEFT_NRANKS");
  weftUniqueId id{};
  if (weftGetUniqueId(&id) != weftSuccess)
    return failed(std::string("weftGetUniqueId: ") + weftGetLastError());
  return runProcess(o, static_cast<int>(proc), static_cast<int>(nprocs), id,
                    "launched with WEFT_COMM_ID", nullptr);
}

#ifdef WEFT_HAVE_MPI
int runUnderMpi(const Options& o) {
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
  int proc = 0, nprocs = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &proc);
  MPI_Comm_size(MPI_COMM_WORLD, &nprocs);
  if (Status s = checkRanks(o, nprocs * o.threads); !s) {
    if (proc == 0) usage(s.message());
    MPI_Finalize();
    return kExitUsage;
  }
  // Rank 0's id, and whether it could make one, to every process.
  struct {
    int ok;
    weftUniqueId id;
  } shared{};
  if (proc == 0) {
    shared.ok = weftGetUniqueId(&shared.id) == weftSuccess;
    if (!shared.ok) failed(std::string("weftGetUniqueId: ") + weftGetLastError());
  }
  MPI_Bcast(&shared, sizeof shared, MPI_BYTE, 0, MPI_COMM_WORLD);
  if (!shared.ok) {
    MPI_Finalize();
    return kExitFailed;
  }
  std::unique_ptr<Peer> peer = o.compare == "mpi" ? makeMpiPeer() : nullptr;
  bool callFailed = false;
  const int code = runProcess(o, proc, nprocs, shared.id,
                              "launched by mpirun (" + std::to_string(nprocs) + " processes)",
                              peer.get(), &callFailed);
  // A rank that stopped early may leave others inside an MPI call that will never complete.
  if (callFailed) MPI_Abort(MPI_COMM_WORLD, code);
  MPI_Finalize();
  return code;
}
#endif

}  // namespace

int launchAndRun(const Options& options) {
  Options o = options;
  if (Status s = resolveMemory(o); !s) return usage(s.message());
  const bool underMpi = launchedByMpi();
  const bool fromEnvironment = std::getenv("WEFT_RANK") != nullptr;
  if (o.compare == "nccl" && !ncclBuilt())
    return usage(
        "--compare nccl: this weft-perf was built without NCCL (CMake looks for nccl.h and "
        "libnccl.so; install NCCL and reconfigure)");
  if (o.compare == "mpi") {
#ifndef WEFT_HAVE_MPI
    return usage(
        "--compare mpi: this weft-perf was built without MPI (install an MPI, e.g. "
        "libopenmpi-dev, and reconfigure)");
#else
    if (!underMpi || o.processes > 0 || fromEnvironment)
      return usage(
          "--compare mpi runs MPI's collectives next to weft's: launch with mpirun -np N "
          "weft-perf ... --compare mpi");
    if (o.threads != 1)
      return usage("--compare mpi needs one rank per process (-t 1): MPI ranks are processes");
#endif
  }
  if (o.processes > 0) {
    if (underMpi || fromEnvironment)
      return usage("-np forks the ranks itself: drop it under mpirun or with WEFT_RANK set");
    if (Status s = checkRanks(o, o.processes * o.threads); !s) return usage(s.message());
    return runForked(o);
  }
  if (fromEnvironment) {
    const char* size = std::getenv("WEFT_NRANKS");
    if (Status s = checkRanks(o, (size ? std::atoi(size) : 1) * o.threads); !s)
      return usage(s.message());
    return runFromEnvironment(o);
  }
  if (underMpi) {
#ifdef WEFT_HAVE_MPI
    return runUnderMpi(o);
#else
    return usage(
        "launched by an MPI launcher, but this weft-perf was built without MPI: every "
        "process would run alone. Rebuild with MPI, or run weft-perf ... -np N");
#endif
  }
  if (Status s = checkRanks(o, o.threads); !s) return usage(s.message());
  weftUniqueId id{};
  if (weftGetUniqueId(&id) != weftSuccess)
    return failed(std::string("weftGetUniqueId: ") + weftGetLastError());
  return runProcess(o, 0, 1, id, "one process", nullptr);
}

}  // namespace weft::perf
