// weft-host-bound: what the simplest collectives between processes of one host take, the bound
// weft's host path is held against (docs/perf.md). R processes of T threads, each thread pinned
// to its own core, float32; no FIFO, no tuner, no channel: spinning barriers in shared memory
// between phases and nothing else.
//   weft-host-bound R T BYTES ITERS MODE [SPAN]    (sizes as weft-perf takes them: 1M, 128M)
// MODE:
//   allreduce-cma    two-shot: each owner reads its chunk of every peer's input with
//                    process_vm_readv and sums; then every rank reads each owner's sums the same
//                    way
//   allreduce-stage  two-shot through a shared stage (weft's direct path): every rank copies its
//                    input in, owners sum from it and copy the sums back, every rank gathers
//   allreduce-mixed  owners read by process_vm_readv, the sums go out through the stage
//   allgather-cma    each rank reads every peer's block into its output with process_vm_readv
//   allgather-stage  each rank copies its block into the stage, every rank gathers from it
// SPAN (default BYTES): buffers of SPAN bytes, call i at slice i of them, as weft-perf -e SPAN
// moves its calls (cold buffers). Prints microseconds a call, as rank 0's first thread saw it.
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "perf/options.hpp"

namespace {

enum class Mode { allReduceCma, allReduceStage, allReduceMixed, allGatherCma, allGatherStage };
constexpr int kMaxRanks = 64;
constexpr std::size_t kPieceFloats = 16384;  // 64 KiB: a peer's piece is summed from L2

struct alignas(64) Barrier {
  std::atomic<int> arrived{0};
  std::atomic<int> sense{0};
  std::atomic<int> failed{0};  // a rank that failed: the others leave instead of spinning on
  int parties = 0;
  void wait(int& local) {
    local ^= 1;
    if (arrived.fetch_add(1) == parties - 1) {
      arrived.store(0);
      sense.store(local, std::memory_order_release);
    } else {
      while (sense.load(std::memory_order_acquire) != local) {
        if (failed.load(std::memory_order_relaxed) != 0) _exit(3);
      }
    }
  }
};

// In memory every process maps (made before the fork).
struct Shared {
  Barrier barrier;
  pid_t pid[kMaxRanks];
  float* in[kMaxRanks];
  float* out[kMaxRanks];
  double usPerCall = 0;
};

struct Run {
  int ranks, threads, iters;
  std::size_t floats;  // per call
  std::size_t slices;  // SPAN / BYTES
  Mode mode;
  Shared* shared;
  float* stage;  // ranks * floats, shared
};

void readPeer(Shared& sh, int peer, float* to, const float* from, std::size_t floats) {
  iovec local{to, floats * sizeof(float)};
  iovec remote{const_cast<float*>(from), floats * sizeof(float)};
  if (process_vm_readv(sh.pid[peer], &local, 1, &remote, 1, 0) !=
      static_cast<ssize_t>(floats * sizeof(float))) {
    std::perror("weft-host-bound: process_vm_readv");
    sh.barrier.failed.store(1);
    _exit(2);
  }
}

// Thread t's part of [lo, hi), cut at 16-float lines.
std::pair<std::size_t, std::size_t> share(std::size_t lo, std::size_t hi, int t, int threads) {
  const std::size_t len = hi - lo;
  const auto tt = static_cast<std::size_t>(t), nt = static_cast<std::size_t>(threads);
  const std::size_t a = lo + (len * tt / nt) / 16 * 16;
  const std::size_t e = t == threads - 1 ? hi : lo + (len * (tt + 1) / nt) / 16 * 16;
  return {a, e};
}

void allReduce(const Run& run, int r, int t, float* in, float* out, std::size_t slice, float* piece,
               int& local) {
  Shared& sh = *run.shared;
  const std::size_t n = run.floats, chunk = (n / run.ranks + 15) / 16 * 16;
  auto chunkOf = [&](int q) {
    return std::pair{std::min(n, q * chunk), std::min(n, (q + 1) * chunk)};
  };
  float* stage = run.stage;
  if (run.mode == Mode::allReduceStage) {
    const auto [a, e] = share(0, n, t, run.threads);
    std::memcpy(stage + r * n + a, in + a, (e - a) * sizeof(float));
    sh.barrier.wait(local);
  }
  const auto [lo, hi] = chunkOf(r);
  const auto [a, e] = share(lo, hi, t, run.threads);
  for (std::size_t p = a; p < e; p += kPieceFloats) {
    const std::size_t m = std::min(kPieceFloats, e - p);
    std::memcpy(out + p, in + p, m * sizeof(float));
    for (int k = 1; k < run.ranks; ++k) {
      const int q = (r + k) % run.ranks;
      const float* x = stage + q * n + p;
      if (run.mode != Mode::allReduceStage) {
        readPeer(sh, q, piece, sh.in[q] + slice + p, m);
        x = piece;
      }
      for (std::size_t i = 0; i < m; ++i) out[p + i] += x[i];
    }
    if (run.mode != Mode::allReduceCma) std::memcpy(stage + r * n + p, out + p, m * sizeof(float));
  }
  sh.barrier.wait(local);
  for (int k = 1; k < run.ranks; ++k) {
    const int q = (r + k) % run.ranks;
    const auto [ql, qh] = chunkOf(q);
    const auto [qa, qe] = share(ql, qh, t, run.threads);
    if (run.mode == Mode::allReduceCma)
      readPeer(sh, q, out + qa, sh.out[q] + slice + qa, qe - qa);
    else
      std::memcpy(out + qa, stage + q * n + qa, (qe - qa) * sizeof(float));
  }
  sh.barrier.wait(local);
}

void allGather(const Run& run, int r, int t, float* in, float* out, std::size_t slice, int& local) {
  Shared& sh = *run.shared;
  const std::size_t block = run.floats / run.ranks;
  const auto [a, e] = share(0, block, t, run.threads);
  float* stage = run.stage;
  if (run.mode == Mode::allGatherStage) {
    std::memcpy(stage + r * block + a, in + a, (e - a) * sizeof(float));
    sh.barrier.wait(local);
  }
  std::memcpy(out + r * block + a, in + a, (e - a) * sizeof(float));
  for (int k = 1; k < run.ranks; ++k) {
    const int q = (r + k) % run.ranks;
    if (run.mode == Mode::allGatherCma)
      readPeer(sh, q, out + q * block + a, sh.in[q] + slice + a, e - a);
    else
      std::memcpy(out + q * block + a, stage + q * block + a, (e - a) * sizeof(float));
  }
  sh.barrier.wait(local);
}

// One rank: its buffers, its threads, the timed calls, then a check of slice 0.
int rank(const Run& run, int r) {
  Shared& sh = *run.shared;
  const std::size_t span = run.floats * run.slices;
  auto* in = static_cast<float*>(std::aligned_alloc(4096, span * sizeof(float)));
  auto* out = static_cast<float*>(std::aligned_alloc(4096, span * sizeof(float)));
  if (in == nullptr || out == nullptr) return 1;
  for (std::size_t i = 0; i < span; ++i) in[i] = static_cast<float>(r + (i % run.floats) % 7);
  std::memset(out, 0, span * sizeof(float));
  // Under Yama's ptrace scope 1 a process may read only its descendants: let the siblings in.
  prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
  sh.pid[r] = getpid();
  sh.in[r] = in;
  sh.out[r] = out;
  std::vector<std::thread> threads;
  for (int t = 0; t < run.threads; ++t) {
    threads.emplace_back([&, t] {
      cpu_set_t cpus;
      CPU_ZERO(&cpus);
      CPU_SET(r * run.threads + t, &cpus);
      pthread_setaffinity_np(pthread_self(), sizeof cpus, &cpus);
      auto* piece = static_cast<float*>(std::aligned_alloc(4096, kPieceFloats * sizeof(float)));
      int local = 0;
      sh.barrier.wait(local);
      constexpr int kWarmup = 5;
      auto start = std::chrono::steady_clock::now();
      for (int it = -kWarmup; it < run.iters; ++it) {
        if (it == 0) start = std::chrono::steady_clock::now();
        const std::size_t slice = static_cast<std::size_t>(it + kWarmup) % run.slices * run.floats;
        if (run.mode == Mode::allGatherCma || run.mode == Mode::allGatherStage)
          allGather(run, r, t, in + slice, out + slice, slice, local);
        else
          allReduce(run, r, t, in + slice, out + slice, slice, piece, local);
      }
      if (r == 0 && t == 0) {
        const std::chrono::duration<double, std::micro> us =
            std::chrono::steady_clock::now() - start;
        sh.usPerCall = us.count() / run.iters;
      }
      std::free(piece);
    });
  }
  for (auto& th : threads) th.join();
  // Slice 0 was written by a call and left alone since.
  std::size_t wrong = 0;
  const std::size_t n = run.floats, block = n / run.ranks;
  const bool gather = run.mode == Mode::allGatherCma || run.mode == Mode::allGatherStage;
  for (std::size_t i = 0; i < (gather ? block * run.ranks : n); ++i) {
    float want = 0;
    if (gather) {
      want = static_cast<float>(i / block + (i % block) % 7);
    } else {
      for (int q = 0; q < run.ranks; ++q) want += static_cast<float>(q + i % 7);
    }
    wrong += out[i] != want;
  }
  if (wrong > 0) std::fprintf(stderr, "weft-host-bound: rank %d: %zu wrong\n", r, wrong);
  std::free(in);
  std::free(out);
  return wrong > 0 ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::pair<std::string, Mode>> modes = {
      {"allreduce-cma", Mode::allReduceCma},
      {"allreduce-stage", Mode::allReduceStage},
      {"allreduce-mixed", Mode::allReduceMixed},
      {"allgather-cma", Mode::allGatherCma},
      {"allgather-stage", Mode::allGatherStage}};
  auto mode = modes.end();
  if (argc >= 6) {
    mode = std::find_if(modes.begin(), modes.end(), [&](auto& m) { return m.first == argv[5]; });
  }
  const int ranks = argc >= 6 ? std::atoi(argv[1]) : 0;
  const int threads = argc >= 6 ? std::atoi(argv[2]) : 0;
  // Sizes as weft-perf reads them (1M, 128M, ...).
  const std::size_t bytes = argc >= 6 ? weft::perf::parseSize(argv[3]).value_or(0) : 0;
  const int iters = argc >= 6 ? std::atoi(argv[4]) : 0;
  const std::size_t span = argc >= 7 ? weft::perf::parseSize(argv[6]).value_or(0) : bytes;
  const auto cores = static_cast<int>(std::thread::hardware_concurrency());
  if (mode == modes.end() || ranks < 2 || ranks > kMaxRanks || threads < 1 ||
      ranks * threads > cores || bytes < 64u * ranks || iters < 1 || span < bytes) {
    std::fprintf(stderr,
                 "usage: weft-host-bound RANKS THREADS BYTES ITERS MODE [SPAN]\n"
                 "  MODE: allreduce-cma, allreduce-stage, allreduce-mixed, allgather-cma, "
                 "allgather-stage\n"
                 "  RANKS x THREADS <= %d cores, BYTES >= 64 x RANKS, SPAN >= BYTES\n",
                 cores);
    return 2;
  }
  const std::size_t floats = bytes / sizeof(float);
  void* sharedMem =
      mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  void* stageMem = mmap(nullptr, floats * ranks * sizeof(float), PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (sharedMem == MAP_FAILED || stageMem == MAP_FAILED) {
    std::perror("weft-host-bound: mmap");
    return 1;
  }
  auto* shared = new (sharedMem) Shared;
  shared->barrier.parties = ranks * threads;
  const Run run{ranks,        threads,      iters,  floats,
                span / bytes, mode->second, shared, static_cast<float*>(stageMem)};
  std::vector<pid_t> children;
  for (int r = 0; r < ranks; ++r) {
    const pid_t pid = fork();
    if (pid == 0) _exit(rank(run, r));
    children.push_back(pid);
  }
  int failures = 0;
  for (pid_t pid : children) {
    int status = 0;
    waitpid(pid, &status, 0);
    failures += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  if (failures > 0) return 1;
  std::printf("%s: %d ranks x %d threads, %zu bytes, span %zu: %.1f us a call\n",
              mode->first.c_str(), ranks, threads, bytes, span, shared->usPerCall);
  return 0;
}
