// weft-membw: the host's memory-copy bandwidth, the ceiling host collectives are measured
// against (docs/perf.md reports busbw as a fraction of it). Like STREAM's Copy kernel: T
// threads, each copying its own buffer of B bytes with memcpy, repeated; the best of the
// repetitions is printed. "copy GB/s" counts the bytes copied; STREAM's convention (bytes read
// plus bytes written) is twice that and is printed beside it.
//   weft-membw [threads=1,2,4,8,16] [bytes per thread=256M] [repetitions=10]
#include <algorithm>
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

}  // namespace

int main(int argc, char** argv) {
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
