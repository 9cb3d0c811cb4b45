// weft-membw: the host's memory-copy bandwidth, the ceiling host collectives are measured
// against (docs/perf.md reports busbw as a fraction of it). Like STREAM's Copy kernel: T
// threads, each copying its own buffer of B bytes with memcpy, repeated; the best of the
// repetitions is printed. "copy GB/s" counts the bytes copied; STREAM's convention (bytes read
// plus bytes written) is twice that and is printed beside it.
//   weft-membw [threads=1,2,4,8,16] [bytes per thread=256M] [repetitions=10]
// `weft-membw handoff [A,B=0,1] [bytes=1M] [rounds=300]` instead times CPU B copying out a buffer
// that CPU A has just written, beside B copying one it wrote itself: how fast data moves between
// two cores' caches. On a VM the host may place two vCPUs near or far apart, and change that
// while it runs (docs/perf-hosts.md, "The all-reduce's slow periods").
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

std::size_t parseBytes(const char* s) {
  char* end = nullptr;
  double v = std::strtod(s, &end);
  switch (*end) {
    case 'K':
    case 'k':
      v *= 1024;
      break;
    case 'M':
    case 'm':
      v *= 1024.0 * 1024;
      break;
    case 'G':
    case 'g':
      v *= 1024.0 * 1024 * 1024;
      break;
    default:
      break;
  }
  return static_cast<std::size_t>(v);
}

// Best seconds per repetition with `threads` threads copying `bytes` each.
double bestSeconds(int threads, std::size_t bytes, int reps) {
  std::vector<double> best(static_cast<std::size_t>(threads), 1e30);
  std::barrier sync(threads);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      // Each thread touches its own buffers first, so the pages sit on its NUMA node.
      std::vector<char> src(bytes, static_cast<char>(t)), dst(bytes, 0);
      for (int r = 0; r <= reps; ++r) {
        sync.arrive_and_wait();
        const auto start = std::chrono::steady_clock::now();
        std::memcpy(dst.data(), src.data(), bytes);
        sync.arrive_and_wait();
        const double secs =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (r > 0)
          best[static_cast<std::size_t>(t)] = std::min(best[static_cast<std::size_t>(t)], secs);
      }
      if (dst[bytes / 2] != static_cast<char>(t)) std::abort();
    });
  }
  for (std::thread& th : pool) th.join();
  return *std::max_element(best.begin(), best.end());
}

bool pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
}

// CPU `from` writes the buffer, then CPU `to` copies it out, `rounds` times; the GB/s of the
// copies, and of `to` copying what it wrote itself. Zero where a CPU cannot be had.
std::pair<double, double> handoff(int from, int to, std::size_t bytes, int rounds) {
  std::vector<char> buf(bytes, 0), out(bytes, 0);
  std::atomic<int> turn{0};  // 0: the writer's, 1: the reader's
  std::atomic<bool> pinned{true};
  double across = 0, own = 0;
  std::thread writer([&] {
    if (!pin(from)) pinned = false;
    for (int r = 0; r < rounds; ++r) {
      while (turn.load(std::memory_order_acquire) != 0) std::this_thread::yield();
      std::memset(buf.data(), r, bytes);
      turn.store(1, std::memory_order_release);
    }
  });
  std::thread reader([&] {
    if (!pin(to)) pinned = false;
    for (int r = 0; r < rounds; ++r) {
      while (turn.load(std::memory_order_acquire) != 1) std::this_thread::yield();
      const auto start = std::chrono::steady_clock::now();
      std::memcpy(out.data(), buf.data(), bytes);
      across += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      turn.store(0, std::memory_order_release);
    }
    for (int r = 0; r < rounds; ++r) {
      std::memset(buf.data(), r, bytes);
      const auto start = std::chrono::steady_clock::now();
      std::memcpy(out.data(), buf.data(), bytes);
      own += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
  });
  writer.join();
  reader.join();
  if (!pinned) return {0, 0};
  const double total = static_cast<double>(bytes) * rounds / 1e9;
  return {total / across, total / own};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "handoff") {
    int from = 0, to = 1;
    if (argc > 2 && std::sscanf(argv[2], "%d,%d", &from, &to) != 2) {
      std::fprintf(stderr, "weft-membw handoff: CPUs as A,B (e.g. 0,1), not %s\n", argv[2]);
      return 2;
    }
    const std::size_t bytes = argc > 3 ? parseBytes(argv[3]) : std::size_t{1} << 20;
    const int rounds = argc > 4 ? std::atoi(argv[4]) : 300;
    if (bytes == 0 || rounds < 1) {
      std::fprintf(stderr, "weft-membw handoff: bytes and rounds must be positive\n");
      return 2;
    }
    const auto [across, own] = handoff(from, to, bytes, rounds);
    if (across == 0) {
      std::fprintf(stderr, "weft-membw handoff: cannot run on CPUs %d and %d\n", from, to);
      return 1;
    }
    std::printf("handoff %d->%d %zu KiB: %.1f GB/s written by %d, %.1f GB/s by %d itself\n", from,
                to, bytes >> 10, across, from, own, to);
    return 0;
  }
  std::vector<int> threads = {1, 2, 4, 8, 16};
  if (argc > 1) {
    threads.clear();
    std::string list = argv[1];
    for (std::size_t at = 0; at <= list.size();) {
      const std::size_t comma = std::min(list.find(',', at), list.size());
      threads.push_back(std::atoi(list.substr(at, comma - at).c_str()));
      at = comma + 1;
    }
  }
  const std::size_t bytes = argc > 2 ? parseBytes(argv[2]) : std::size_t{256} << 20;
  const int reps = argc > 3 ? std::atoi(argv[3]) : 10;
  std::printf("# weft-membw: memcpy of %zu MiB per thread, best of %d\n", bytes >> 20, reps);
  std::printf("# %7s %12s %16s\n", "threads", "copy GB/s", "STREAM GB/s");
  for (int t : threads) {
    if (t < 1) continue;
    const double secs = bestSeconds(t, bytes, reps);
    const double gbs = static_cast<double>(bytes) * t / secs / 1e9;
    std::printf("  %7d %12.2f %16.2f\n", t, gbs, 2 * gbs);
  }
  return 0;
}
