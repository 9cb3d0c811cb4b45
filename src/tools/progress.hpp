// A progress line on stderr for work that takes a while ("weft-plan tune: 3/12, 14 s"), redrawn
// in place at most five times a second and cleared at the end; silent when stderr is not a
// terminal, so logs and pipes see only the results. Thread-safe.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <mutex>
#include <string>

namespace weft::tools {

class Progress {
 public:
  Progress(std::string what, std::size_t total)
      : what_(std::move(what)), total_(total), shown_(isatty(STDERR_FILENO) == 1) {}
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  ~Progress() {
    if (drawn_) std::fputs("\r\033[K", stderr);
  }

  void step(std::size_t n = 1) {
    const std::lock_guard<std::mutex> lock(mutex_);
    done_ += n;
    const auto now = Clock::now();
    if (!shown_ || now - last_ < std::chrono::milliseconds(200)) return;
    last_ = now;
    drawn_ = true;
    const double seconds = std::chrono::duration<double>(now - start_).count();
    std::fprintf(stderr, "\r\033[K%s: %zu/%zu, %.0f s", what_.c_str(), done_, total_, seconds);
    std::fflush(stderr);
  }

 private:
  using Clock = std::chrono::steady_clock;
  std::string what_;
  std::size_t total_, done_ = 0;
  bool shown_, drawn_ = false;
  Clock::time_point start_ = Clock::now(), last_ = {};
  std::mutex mutex_;
};

}  // namespace weft::tools
