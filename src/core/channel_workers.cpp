#include "src/core/channel_workers.hpp"

#include "src/transport/connection.hpp"

namespace weft {

ChannelWorkers::ChannelWorkers(int workers, std::chrono::microseconds spin) : spin_(spin) {
  try {
    for (int i = 0; i < workers; ++i) threads_.emplace_back(&ChannelWorkers::loop, this, i + 1);
  } catch (...) {
    stop();  // the ones started, before the exception (std::system_error) leaves
    throw;
  }
}

ChannelWorkers::~ChannelWorkers() {
  stop();
}

void ChannelWorkers::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_.store(true, std::memory_order_relaxed);
  }
  start_.notify_all();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

namespace {

// Spins until done() holds or `limit` has passed; returns done().
template <typename Done>
bool spinFor(std::chrono::microseconds limit, Done&& done) {
  if (limit.count() <= 0) return done();
  const auto until = std::chrono::steady_clock::now() + limit;
  for (int i = 0;; ++i) {
    if (done()) return true;
    if (i % 64 == 63 && std::chrono::steady_clock::now() > until) return done();
    transport::Waiter::relax();
  }
}

}  // namespace

void ChannelWorkers::run(std::size_t channels, const std::function<void(std::size_t)>& fn) {
  if (channels <= 1) {
    // One channel runs on the caller alone: waking the workers would cost more than a small
    // call's whole exchange.
    fn(0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = &fn;
    channels_ = channels;
    pending_.store(channels - 1, std::memory_order_relaxed);
    round_.fetch_add(1, std::memory_order_release);
  }
  start_.notify_all();
  fn(0);
  if (spinFor(spin_, [&] { return pending_.load(std::memory_order_acquire) == 0; })) return;
  std::unique_lock<std::mutex> lock(mutex_);
  finished_.wait(lock, [&] { return pending_.load(std::memory_order_acquire) == 0; });
}

void ChannelWorkers::loop(std::size_t channel) {
  std::uint64_t seen = 0;
  for (;;) {
    spinFor(spin_, [&] {
      return round_.load(std::memory_order_acquire) != seen ||
             stop_.load(std::memory_order_relaxed);
    });
    std::unique_lock<std::mutex> lock(mutex_);
    start_.wait(lock, [&] {
      return stop_.load(std::memory_order_relaxed) ||
             round_.load(std::memory_order_relaxed) != seen;
    });
    if (stop_.load(std::memory_order_relaxed)) return;
    seen = round_.load(std::memory_order_relaxed);
    if (channel >= channels_) continue;
    const std::function<void(std::size_t)>* job = job_;
    lock.unlock();
    (*job)(channel);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> done(mutex_);
      finished_.notify_one();
    }
  }
}

}  // namespace weft
