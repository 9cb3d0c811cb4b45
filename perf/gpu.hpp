// weft-perf on GPU memory: a rank's device, its own stream, its device buffers, the events that
// time its calls and the CUDA graph -G launches. Several ranks may share one GPU, and their
// kernels spin-wait on each other: so everything here is ordered on the rank's own non-blocking
// stream (cudaMallocAsync, cudaMemcpyAsync) and waits for that stream alone, never for the whole
// device, which would wait for a kernel of another rank that waits for this one.
// Built without CUDA, probeGpus finds none and GpuRank::create fails with a clear message.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "weft/status.hpp"

namespace weft::perf {

// GPUs a forked child of this process sees (0 when none, or when built without CUDA; `why` then
// says why). This process itself never initialises CUDA here, so the ranks weft-perf -np forks
// later do not inherit a CUDA context (a forked child cannot use its parent's).
int probeGpus(std::string& why);

// Whether this weft-perf was built with CUDA.
bool gpuBuilt();

class GpuRank {
 public:
  // Makes device rank % (GPUs seen) current on the calling thread (the communicator's GPU
  // transport takes the thread's device at its first GPU call) and creates the rank's stream.
  static Result<std::unique_ptr<GpuRank>> create(int rank);
  ~GpuRank();
  GpuRank(const GpuRank&) = delete;
  GpuRank& operator=(const GpuRank&) = delete;

  int device() const { return device_; }
  const std::string& busId() const { return busId_; }  // "0000:1B:00.0"
  const std::string& name() const { return name_; }    // "NVIDIA H200"
  void* stream() const { return stream_; }             // a cudaStream_t

  // `bytes` of device memory, ordered on the stream; freed when the GpuRank goes. `shareable`:
  // a plain cudaMalloc allocation instead, which CUDA IPC can export (registered buffers).
  Result<std::byte*> allocate(std::size_t bytes, bool shareable = false);
  // Copies between host and device memory on the stream, and waits for them.
  Status copyIn(void* device, const void* host, std::size_t bytes);
  Status copyOut(void* host, const void* device, std::size_t bytes);
  // Waits for everything enqueued on the stream.
  Status synchronize();

  // Events around the timed calls; elapsedSeconds after synchronize.
  Status recordStart();
  Status recordStop();
  Result<double> elapsedSeconds() const;

  // -G: the calls enqueued between beginCapture and endCapture become a graph (capture mode
  // thread-local: other ranks' threads keep enqueueing their own calls meanwhile).
  Status beginCapture();
  Status endCapture();
  Status launchGraph();
  // Frees the graph. Call it only after synchronize: freeing may wait for the device.
  void dropGraph();

 private:
  GpuRank() = default;
  Status cuda(int error, const char* what) const;

  int rank_ = 0;
  int device_ = -1;
  std::string busId_, name_;
  void* stream_ = nullptr;
  void* start_ = nullptr;
  void* stop_ = nullptr;
  void* graph_ = nullptr;
  void* graphExec_ = nullptr;
  std::vector<void*> allocations_;  // stream-ordered
  std::vector<void*> shareable_;    // cudaMalloc'd
};

}  // namespace weft::perf
