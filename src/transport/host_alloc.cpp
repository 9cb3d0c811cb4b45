#include "src/transport/host_alloc.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

namespace weft::transport {
namespace {

struct Allocation {
  std::size_t bytes;
  int fd;
  std::uint64_t id;
};

struct Registry {
  std::mutex mutex;
  std::map<std::uintptr_t, Allocation> byBase;
  std::uint64_t lastId = 0;
};

Registry& registry() {
  static Registry r;
  return r;
}

// The memfd's name, which its peers check through /proc before they map it.
std::string nameOf(std::uint64_t id) {
  return "weft-host-" + std::to_string(id);
}

std::size_t pageBytes() {
  return static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
}

std::size_t pageRounded(std::size_t bytes) {
  const std::size_t page = pageBytes();
  return (bytes + page - 1) / page * page;
}

Status systemError(const std::string& what) {
  return {Code::systemError, what + ": " + std::strerror(errno)};
}

}  // namespace

Result<void*> hostAlloc(std::size_t bytes) {
  if (bytes == 0) return Status(Code::invalidArgument, "weftHostAlloc: 0 bytes");
  // Rounded up to pages, the size must stay a valid object size (and not wrap to 0).
  const std::size_t limit = (static_cast<std::size_t>(PTRDIFF_MAX) / pageBytes()) * pageBytes();
  if (bytes > limit)
    return Status(Code::invalidArgument, "weftHostAlloc: size " + std::to_string(bytes) +
                                             " exceeds the largest allocation (" +
                                             std::to_string(limit) + " bytes)");
  Registry& r = registry();
  std::uint64_t id = 0;
  {
    std::lock_guard lock(r.mutex);
    id = ++r.lastId;
  }
  const std::size_t size = pageRounded(bytes);
  const int fd = memfd_create(nameOf(id).c_str(), MFD_CLOEXEC);
  if (fd < 0) return systemError("weftHostAlloc: memfd_create");
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    Status s = systemError("weftHostAlloc: sizing " + std::to_string(size) + " bytes");
    close(fd);
    return s;
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    Status s = systemError("weftHostAlloc: mapping " + std::to_string(size) + " bytes");
    close(fd);
    return s;
  }
  try {
    std::lock_guard lock(r.mutex);
    r.byBase.emplace(reinterpret_cast<std::uintptr_t>(p), Allocation{size, fd, id});
  } catch (...) {  // out of memory for the registry's node: nothing kept
    munmap(p, size);
    close(fd);
    throw;
  }
  return p;
}

Status hostFree(void* p) {
  if (p == nullptr) return {};  // as free(NULL)
  Registry& r = registry();
  Allocation a{};
  {
    std::lock_guard lock(r.mutex);
    auto it = r.byBase.find(reinterpret_cast<std::uintptr_t>(p));
    if (it == r.byBase.end()) {
      return {Code::invalidArgument,
              "weftHostFree: not a pointer weftHostAlloc returned (or already freed)"};
    }
    a = it->second;
    r.byBase.erase(it);
  }
  munmap(p, a.bytes);
  close(a.fd);
  return {};
}

HostRef hostRefOf(const void* p, std::size_t bytes) {
  Registry& r = registry();
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  std::lock_guard lock(r.mutex);
  auto it = r.byBase.upper_bound(at);
  if (it == r.byBase.begin()) return {};
  --it;
  const Allocation& a = it->second;
  const std::uintptr_t offset = at - it->first;
  if (offset > a.bytes || bytes > a.bytes - offset) return {};
  return {a.id, offset, a.bytes, a.fd};
}

std::size_t hostAllocations() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  return r.byBase.size();
}

PeerAllocations::~PeerAllocations() {
  for (const Mapping& m : maps_) munmap(m.base, m.bytes);
}

const std::byte* PeerAllocations::view(int pid, const HostRef& ref, std::size_t bytes) {
  if (ref.id == 0 || ref.fd < 0 || ref.offset > ref.allocBytes ||
      bytes > ref.allocBytes - ref.offset)
    return nullptr;
  ++tick_;
  for (Mapping& m : maps_) {
    if (m.pid == pid && m.id == ref.id) {
      if (ref.offset + bytes > m.bytes) return nullptr;
      m.used = tick_;
      return m.base + ref.offset;
    }
  }
  // The descriptor must still be this allocation's: its memfd carries the id in its name.
  const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(ref.fd);
  char target[128] = {};
  const ssize_t n = readlink(path.c_str(), target, sizeof target - 1);
  const std::string expect = "/memfd:" + nameOf(ref.id) + " ";
  if (n <= 0 || std::string(target, static_cast<std::size_t>(n)).rfind(expect, 0) != 0)
    return nullptr;
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return nullptr;
  struct stat st {};
  void* p = MAP_FAILED;
  // Populated now: the calls that read it should not each fault its pages in.
  if (fstat(fd, &st) == 0 && static_cast<std::uint64_t>(st.st_size) >= ref.allocBytes)
    p = mmap(nullptr, ref.allocBytes, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return nullptr;
  // A peer keeps a few of its allocations mapped here: the least recently viewed goes first.
  const auto own = [&](const Mapping& m) { return m.pid == pid; };
  if (static_cast<std::size_t>(std::count_if(maps_.begin(), maps_.end(), own)) >= kKeptPerPeer) {
    auto oldest = maps_.end();
    for (auto it = maps_.begin(); it != maps_.end(); ++it) {
      if (own(*it) && (oldest == maps_.end() || it->used < oldest->used)) oldest = it;
    }
    munmap(oldest->base, oldest->bytes);
    maps_.erase(oldest);
  }
  maps_.push_back({pid, ref.id, static_cast<std::byte*>(p), ref.allocBytes, tick_});
  return static_cast<const std::byte*>(p) + ref.offset;
}

}  // namespace weft::transport
