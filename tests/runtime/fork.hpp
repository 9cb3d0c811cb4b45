// Ranks as processes for the tests: fork n children, hand them the unique id, collect their
// exit codes, and never wait forever; and the shared-memory segments and weftHostAlloc memory they
// leave.
#pragma once

#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "weft/weft.hpp"

namespace weft::test {

// The names in /dev/shm now.
inline std::set<std::string> shmNames() {
  std::set<std::string> names;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d)) names.insert(e->d_name);
    closedir(d);
  }
  return names;
}

// The /dev/shm names present when forkRanks last forked: a segment some earlier process of the
// same pid left behind (one killed before it could unlink; pids are reused, 32768 by default)
// is not these children's.
inline std::set<std::string>& shmBeforeFork() {
  static std::set<std::string> names;
  return names;
}

// Segments in /dev/shm created by these processes (weft names them /weft-<pid>-<random>); other
// tests running at the same time have other pids.
inline int segmentsOf(const std::vector<pid_t>& pids) {
  int count = 0;
  for (const std::string& name : shmNames()) {
    if (shmBeforeFork().count(name) != 0) continue;
    for (pid_t p : pids) {
      if (name.rfind("weft-" + std::to_string(p) + "-", 0) == 0) ++count;
    }
  }
  return count;
}

// Lines of /proc/self/maps, and entries of /proc/self/fd, that are weftHostAlloc memory (memfds
// named weft-host-<id>): this process's own allocations and its mappings of its peers'.
inline int hostAllocMaps() {
  int found = 0;
  if (FILE* f = std::fopen("/proc/self/maps", "r")) {
    char line[512];
    while (std::fgets(line, sizeof line, f) != nullptr)
      found += std::strstr(line, "memfd:weft-host-") != nullptr;
    std::fclose(f);
  }
  return found;
}
inline int hostAllocDescriptors() {
  int found = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (dirent* e = readdir(d)) {
      char target[256] = {};
      const std::string path = std::string("/proc/self/fd/") + e->d_name;
      if (readlink(path.c_str(), target, sizeof target - 1) > 0)
        found += std::strstr(target, "memfd:weft-host-") != nullptr;
    }
    closedir(d);
  }
  return found;
}

// Forks n ranks running body(rank, comm) -> exit code; returns each child's exit code (or -sig),
// killing any still running after `limit`.
// ThreadSanitizer cannot follow a process that forks while it has threads (the root listener)
// and then starts threads: under it these tests skip; ASan runs them.
#if defined(__SANITIZE_THREAD__)
#define WEFT_SKIP_UNDER_TSAN() GTEST_SKIP() << "fork after threads is unsupported under TSan"
#else
#define WEFT_SKIP_UNDER_TSAN() (void)0
#endif

inline std::vector<int> forkRanks(int n, const std::function<int(int, Comm&)>& body,
                                  std::vector<pid_t>* children = nullptr,
                                  std::chrono::seconds limit = std::chrono::seconds(60),
                                  const std::function<void(int)>& beforeInit = nullptr) {
  // The ranks are forked before the id exists, so no thread of this process (the id's root
  // listener) can hold a lock across the fork; the id reaches them through a pipe.
  std::vector<pid_t> pids;
  std::vector<int> pipes;
  shmBeforeFork() = shmNames();
  for (int r = 0; r < n; ++r) {
    int fds[2];
    if (pipe(fds) != 0) ADD_FAILURE() << "pipe";
    const pid_t pid = fork();
    if (pid == 0) {
      close(fds[1]);
      UniqueId id{};
      std::size_t got = 0;
      while (got < sizeof id) {
        const ssize_t k = read(fds[0], reinterpret_cast<char*>(&id) + got, sizeof id - got);
        if (k <= 0) _exit(91);
        got += static_cast<std::size_t>(k);
      }
      if (beforeInit) beforeInit(r);
      auto comm = Comm::initRank(n, id, r);
      if (!comm) {
        std::fprintf(stderr, "rank %d: init: %s\n", r, comm.status().toString().c_str());
        _exit(90);
      }
      const int code = body(r, *comm);
      _exit(code);
    }
    close(fds[0]);
    pipes.push_back(fds[1]);
    pids.push_back(pid);
  }
  auto id = UniqueId::make();
  EXPECT_TRUE(id.isOk()) << id.status().toString();
  for (int fd : pipes) {
    if (id.isOk() && write(fd, &*id, sizeof *id) != static_cast<ssize_t>(sizeof *id))
      ADD_FAILURE() << "write";
    close(fd);
  }
  if (children != nullptr) *children = pids;
  std::vector<int> codes(static_cast<std::size_t>(n), -1000);
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int left = n;
  while (left > 0) {
    for (int r = 0; r < n; ++r) {
      if (codes[static_cast<std::size_t>(r)] != -1000) continue;
      int status = 0;
      if (waitpid(pids[static_cast<std::size_t>(r)], &status, WNOHANG) > 0) {
        codes[static_cast<std::size_t>(r)] =
            WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
        --left;
      }
    }
    if (std::chrono::steady_clock::now() > deadline) {
      for (int r = 0; r < n; ++r) {
        if (codes[static_cast<std::size_t>(r)] == -1000) {
          kill(pids[static_cast<std::size_t>(r)], SIGKILL);
          waitpid(pids[static_cast<std::size_t>(r)], nullptr, 0);
          codes[static_cast<std::size_t>(r)] = -999;  // hung
        }
      }
      break;
    }
    usleep(2000);
  }
  return codes;
}

}  // namespace weft::test
