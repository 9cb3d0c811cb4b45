// The threads that run a host call's channels beside its caller.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace weft {

// The threads that run channels 1.. of every call, started with the communicator and kept for
// its life, so a call does not pay for creating threads.
class ChannelWorkers {
 public:
  // Workers that finished a job spin up to `spin` for the next before they sleep, and the caller
  // spins as long for them to finish (zero: both sleep at once).
  ChannelWorkers(int workers, std::chrono::microseconds spin);
  ~ChannelWorkers();
  ChannelWorkers(const ChannelWorkers&) = delete;
  ChannelWorkers& operator=(const ChannelWorkers&) = delete;
  // Runs fn(0) on the caller and fn(1) .. fn(channels - 1) on the workers; returns when all have.
  void run(std::size_t channels, const std::function<void(std::size_t)>& fn);

 private:
  void loop(std::size_t channel);
  void stop();  // stops and joins the workers
  std::mutex mutex_;
  std::condition_variable start_, finished_;
  const std::function<void(std::size_t)>* job_ = nullptr;
  std::size_t channels_ = 0;
  std::atomic<std::size_t> pending_{0};
  std::atomic<std::uint64_t> round_{0};
  std::atomic<bool> stop_{false};
  const std::chrono::microseconds spin_;
  std::vector<std::thread> threads_;
};

}  // namespace weft
