// Shared by the GPU runtime tests: whether a GPU is usable, each rank's stream and device
// memory for the harness, environment settings scoped to a test, ranks as threads, and whether
// this process may still fork ranks that use CUDA.
#pragma once

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <barrier>
#include <cstdlib>
#include <string>
#include <vector>

#include "tests/runtime/harness.hpp"

namespace weft::test {

// Ranks as threads share one CUDA context: give each stream its own hardware queue (CUDA's
// default is 8) before CUDA starts, as weft-perf does (see Communicator::ensureGpu); a value the
// user set stays. Whether this binary set it: the process tests' ranks drop it (runForked).
inline const bool kSetHardwareQueues = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS") == nullptr &&
                                       setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 1) == 0;

// Whether a GPU is usable, asked in a child so that this process does not initialize CUDA
// before the process tests fork (a forked child cannot use its parent's CUDA).
inline bool haveGpu() {
  static const bool have = [] {
    const pid_t pid = fork();
    if (pid == 0) {
      int n = 0;
      _exit(cudaGetDeviceCount(&n) == cudaSuccess && n > 0 ? 0 : 1);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }();
  return have;
}

#define SKIP_WITHOUT_GPU()                                    \
  do {                                                        \
    if (!haveGpu()) GTEST_SKIP() << "no GPU on this machine"; \
  } while (false)

// The GPU of rank r where ranks spread over the machine's GPUs, one rank per GPU as far as
// they go (r mod the GPU count, as weft-perf places them); 0 on one GPU.
inline int spreadDevice(int r) {
  static const int count = [] {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0 ? n : 1;
  }();
  return r % count;
}

// Device buffers for the harness: stream-ordered allocation and copies on each rank's stream,
// so no rank's call waits for the whole device (where other ranks' kernels wait for it).
// One stream per rank of n; or, for a process holding only rank `only`, one stream for it.
// Spread: rank r's stream on its spreadDevice (the harness makes that device current on the
// rank's thread, see deviceMemory); otherwise every rank on the current device.
struct Streams {
  explicit Streams(int n, int onlyRank = -1, bool spread = false)
      : s(static_cast<std::size_t>(onlyRank < 0 ? n : 1)), device(s.size(), 0), only(onlyRank) {
    int current = 0;
    EXPECT_EQ(cudaGetDevice(&current), cudaSuccess);
    for (std::size_t i = 0; i < s.size(); ++i) {
      const int rank = onlyRank < 0 ? static_cast<int>(i) : onlyRank;
      device[i] = spread ? spreadDevice(rank) : current;
      EXPECT_EQ(cudaSetDevice(device[i]), cudaSuccess);
      EXPECT_EQ(cudaStreamCreateWithFlags(&s[i], cudaStreamNonBlocking), 0);
    }
    EXPECT_EQ(cudaSetDevice(current), cudaSuccess);
  }
  ~Streams() {
    for (cudaStream_t x : s) (void)cudaStreamDestroy(x);
  }
  std::size_t at(int r) const { return only < 0 ? static_cast<std::size_t>(r) : 0; }
  cudaStream_t operator[](int r) const { return s[at(r)]; }
  int deviceOf(int r) const { return device[at(r)]; }
  std::vector<cudaStream_t> s;
  std::vector<int> device;
  int only;
};

inline DeviceMemory deviceMemory(const Streams& streams) {
  DeviceMemory m;
  m.alloc = [&streams](int r, std::size_t bytes) {
    void* p = nullptr;
    EXPECT_EQ(cudaMallocAsync(&p, bytes, streams[r]), cudaSuccess);
    return static_cast<std::byte*>(p);
  };
  m.release = [&streams](int r, std::byte* p) { (void)cudaFreeAsync(p, streams[r]); };
  m.copy = [&streams](int r, void* to, const void* from, std::size_t bytes) {
    if (bytes == 0) return;
    EXPECT_EQ(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDefault, streams[r]), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(streams[r]), cudaSuccess);
  };
  m.stream = [&streams](int r) -> void* { return streams[r]; };
  m.enter = [&streams](int r) { EXPECT_EQ(cudaSetDevice(streams.deviceOf(r)), cudaSuccess); };
  m.finish = [&streams](Comm& comm, int r) -> std::string {
    if (cudaError_t e = cudaStreamSynchronize(streams[r]); e != cudaSuccess)
      return std::string("stream: ") + cudaGetErrorString(e);
    const Status s = comm.asyncError();
    return s.isOk() ? "" : s.toString();
  };
  return m;
}

// Where ranks that are threads meet once each has waited for its own stream: from then on no
// rank's kernel is in flight. Before that a rank must not cudaFree (it waits for the whole
// device, holding a lock of the context that a peer's next launch needs, while the peer's
// partner kernel spins waiting for that launch: a deadlock until the timeout). A rank's Meet
// arrives at most once, at meet() or else on leaving its scope (a failed ASSERT's return), so
// that no peer waits forever.
class RanksMeet {
 public:
  explicit RanksMeet(int n) : barrier_(n) {}
  class Meet {
   public:
    explicit Meet(RanksMeet& m) : m_(m) {}
    ~Meet() { meet(); }
    Meet(const Meet&) = delete;
    Meet& operator=(const Meet&) = delete;
    void meet() {
      if (!met_) m_.barrier_.arrive_and_wait();
      met_ = true;
    }

   private:
    RanksMeet& m_;
    bool met_ = false;
  };

 private:
  std::barrier<> barrier_;
};

// Sets an environment variable for the communicators created in its scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (had_) {
      setenv(name_, old_.c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

inline std::vector<Comm> threadRanks(int n) {
  auto comms = Comm::initAll(n);
  EXPECT_TRUE(comms.isOk()) << comms.status().toString();
  return comms.isOk() ? std::move(*comms) : std::vector<Comm>{};
}

// Whether the CUDA driver is initialized in this process (a forked child could not use it then).
// Loaded is not initialized: compute-sanitizer loads the driver into the process it starts, and
// its forked children still set CUDA up themselves (so the process tests run under it too).
inline bool cudaInitializedHere() {
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (h == nullptr) return false;
  using GetCurrent = int (*)(void**);
  auto get = reinterpret_cast<GetCurrent>(dlsym(h, "cuCtxGetCurrent"));
  void* ctx = nullptr;
  constexpr int kNotInitialized = 3;  // CUDA_ERROR_NOT_INITIALIZED
  const bool initialized = get == nullptr || get(&ctx) != kNotInitialized;
  dlclose(h);
  return initialized;
}

#define SKIP_UNLESS_FORKABLE()                                                                  \
  do {                                                                                          \
    SKIP_WITHOUT_GPU();                                                                         \
    if (cudaInitializedHere())                                                                  \
      GTEST_SKIP() << "CUDA is already initialized in this process; run this suite on its own " \
                      "(ctest runs every test in its own process)";                             \
  } while (false)

}  // namespace weft::test
