#include "perf/gpu.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#ifdef WEFT_PERF_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace weft::perf {

#ifdef WEFT_PERF_HAVE_CUDA

namespace {

cudaStream_t asStream(void* s) {
  return static_cast<cudaStream_t>(s);
}
cudaEvent_t asEvent(void* e) {
  return static_cast<cudaEvent_t>(e);
}

}  // namespace

bool gpuBuilt() {
  return true;
}

int probeGpus(std::string& why) {
  int fds[2];
  if (pipe(fds) != 0) {
    why = std::string("cannot probe for a GPU (pipe: ") + std::strerror(errno) + ")";
    return 0;
  }
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    why = std::string("cannot probe for a GPU (fork: ") + std::strerror(errno) + ")";
    return 0;
  }
  if (pid == 0) {
    // The child: the count, or CUDA's reason for none, back through the pipe.
    close(fds[0]);
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    std::string answer =
        e == cudaSuccess ? std::to_string(n) : std::string("-") + cudaGetErrorString(e);
    ssize_t written = write(fds[1], answer.data(), answer.size());
    _exit(written == static_cast<ssize_t>(answer.size()) ? 0 : 1);
  }
  close(fds[1]);
  std::string answer;
  char buf[256];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    answer.append(buf, static_cast<std::size_t>(n));
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (answer.empty() || answer[0] == '-') {
    why = answer.empty() ? "the CUDA probe (a forked child) died" : "CUDA: " + answer.substr(1);
    return 0;
  }
  const int count = std::atoi(answer.c_str());
  if (count == 0) why = "CUDA sees no GPU";
  return count;
}

Status GpuRank::cuda(int error, const char* what) const {
  if (error == cudaSuccess) return {};
  return {Code::systemError, "rank " + std::to_string(rank_) + " (GPU " + std::to_string(device_) +
                                 "): " + what + ": " +
                                 cudaGetErrorString(static_cast<cudaError_t>(error))};
}

Result<std::unique_ptr<GpuRank>> GpuRank::create(int rank) {
  std::unique_ptr<GpuRank> g(new GpuRank());
  g->rank_ = rank;
  int count = 0;
  if (Status s = g->cuda(cudaGetDeviceCount(&count), "cudaGetDeviceCount"); !s) return s;
  if (count == 0)
    return Status(Code::unsupported,
                  "rank " + std::to_string(rank) + ": CUDA sees no GPU; run with --host");
  g->device_ = rank % count;
  if (Status s = g->cuda(cudaSetDevice(g->device_), "cudaSetDevice"); !s) return s;
  char bus[32] = {};
  if (Status s =
          g->cuda(cudaDeviceGetPCIBusId(bus, sizeof bus, g->device_), "cudaDeviceGetPCIBusId");
      !s)
    return s;
  g->busId_ = bus;
  cudaDeviceProp prop{};
  if (Status s = g->cuda(cudaGetDeviceProperties(&prop, g->device_), "cudaGetDeviceProperties"); !s)
    return s;
  g->name_ = prop.name;
  // Never the legacy default stream: it would serialise the kernels of ranks sharing the GPU,
  // and they wait for each other.
  cudaStream_t stream = nullptr;
  if (Status s = g->cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                         "cudaStreamCreateWithFlags");
      !s)
    return s;
  g->stream_ = stream;
  cudaEvent_t start = nullptr, stop = nullptr;
  if (Status s = g->cuda(cudaEventCreate(&start), "cudaEventCreate"); !s) return s;
  g->start_ = start;
  if (Status s = g->cuda(cudaEventCreate(&stop), "cudaEventCreate"); !s) return s;
  g->stop_ = stop;
  return g;
}

GpuRank::~GpuRank() {
  if (stream_ != nullptr) {
    for (void* p : allocations_) (void)cudaFreeAsync(p, asStream(stream_));
    (void)cudaStreamSynchronize(asStream(stream_));
  }
  for (void* p : shareable_) (void)cudaFree(p);
  dropGraph();
  if (start_ != nullptr) (void)cudaEventDestroy(asEvent(start_));
  if (stop_ != nullptr) (void)cudaEventDestroy(asEvent(stop_));
  if (stream_ != nullptr) (void)cudaStreamDestroy(asStream(stream_));
}

Result<std::byte*> GpuRank::allocate(std::size_t bytes, bool shareable) {
  void* p = nullptr;
  if (shareable) {
    if (Status s = cuda(cudaMalloc(&p, bytes),
                        ("cudaMalloc of " + std::to_string(bytes) + " bytes (lower -e)").c_str());
        !s)
      return s;
    shareable_.push_back(p);
    return static_cast<std::byte*>(p);
  }
  if (Status s =
          cuda(cudaMallocAsync(&p, bytes, asStream(stream_)),
               ("cudaMallocAsync of " + std::to_string(bytes) + " bytes (lower -e)").c_str());
      !s)
    return s;
  allocations_.push_back(p);
  if (Status s = synchronize(); !s) return s;
  return static_cast<std::byte*>(p);
}

Status GpuRank::copyIn(void* device, const void* host, std::size_t bytes) {
  if (bytes == 0) return {};
  if (Status s =
          cuda(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, asStream(stream_)),
               "cudaMemcpyAsync to the device");
      !s)
    return s;
  return synchronize();
}

Status GpuRank::copyOut(void* host, const void* device, std::size_t bytes) {
  if (bytes == 0) return {};
  if (Status s =
          cuda(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, asStream(stream_)),
               "cudaMemcpyAsync from the device");
      !s)
    return s;
  return synchronize();
}

Status GpuRank::synchronize() {
  return cuda(cudaStreamSynchronize(asStream(stream_)), "cudaStreamSynchronize");
}

Status GpuRank::recordStart() {
  return cuda(cudaEventRecord(asEvent(start_), asStream(stream_)), "cudaEventRecord");
}

Status GpuRank::recordStop() {
  return cuda(cudaEventRecord(asEvent(stop_), asStream(stream_)), "cudaEventRecord");
}

Result<double> GpuRank::elapsedSeconds() const {
  float ms = 0;
  if (Status s =
          cuda(cudaEventElapsedTime(&ms, asEvent(start_), asEvent(stop_)), "cudaEventElapsedTime");
      !s)
    return s;
  return static_cast<double>(ms) * 1e-3;
}

Status GpuRank::beginCapture() {
  return cuda(cudaStreamBeginCapture(asStream(stream_), cudaStreamCaptureModeThreadLocal),
              "cudaStreamBeginCapture");
}

Status GpuRank::endCapture() {
  cudaGraph_t graph = nullptr;
  Status s = cuda(cudaStreamEndCapture(asStream(stream_), &graph), "cudaStreamEndCapture");
  graph_ = graph;
  if (!s) return s;
  cudaGraphExec_t exec = nullptr;
  s = cuda(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  graphExec_ = exec;
  return s;
}

Status GpuRank::launchGraph() {
  return cuda(cudaGraphLaunch(static_cast<cudaGraphExec_t>(graphExec_), asStream(stream_)),
              "cudaGraphLaunch");
}

void GpuRank::dropGraph() {
  if (graphExec_ != nullptr) (void)cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(graphExec_));
  if (graph_ != nullptr) (void)cudaGraphDestroy(static_cast<cudaGraph_t>(graph_));
  graphExec_ = nullptr;
  graph_ = nullptr;
}

#else  // no CUDA in this build

namespace {
constexpr const char* kNoCuda =
    "this weft-perf was built without CUDA (reconfigure where nvcc is found, WEFT_CUDA=ON)";
}

bool gpuBuilt() {
  return false;
}

int probeGpus(std::string& why) {
  why = kNoCuda;
  return 0;
}

Status GpuRank::cuda(int, const char*) const {
  return {Code::unsupported, kNoCuda};
}

Result<std::unique_ptr<GpuRank>> GpuRank::create(int) {
  return Status(Code::unsupported, kNoCuda);
}

GpuRank::~GpuRank() = default;

Result<std::byte*> GpuRank::allocate(std::size_t, bool) {
  return cuda(0, "");
}
Status GpuRank::copyIn(void*, const void*, std::size_t) {
  return cuda(0, "");
}
Status GpuRank::copyOut(void*, const void*, std::size_t) {
  return cuda(0, "");
}
Status GpuRank::synchronize() {
  return cuda(0, "");
}
Status GpuRank::recordStart() {
  return cuda(0, "");
}
Status GpuRank::recordStop() {
  return cuda(0, "");
}
Result<double> GpuRank::elapsedSeconds() const {
  return cuda(0, "");
}
Status GpuRank::beginCapture() {
  return cuda(0, "");
}
Status GpuRank::endCapture() {
  return cuda(0, "");
}
Status GpuRank::launchGraph() {
  return cuda(0, "");
}
void GpuRank::dropGraph() {}

#endif

}  // namespace weft::perf
