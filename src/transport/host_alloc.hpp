// Host memory that the owner's peers on the same host can map (weftHostAlloc): each allocation
// is a memfd of its own, mapped shared. A peer process reaches it through /proc/<pid>/fd/<fd>
// (the same permission as process_vm_readv: same user, Yama's ptrace scope allowing), maps it
// read-only and loads from it, so a collective between processes reads its peers' buffers in
// place, as ranks that are threads of one process do, instead of copying them through a stage.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "weft/status.hpp"

namespace weft::transport {

// Where [p, p + bytes) lies, as another process names it: the allocation's id (unique for the
// process's lifetime; 0 when the range is not inside one allocation), the owner's descriptor of
// it, its size, and the range's offset in it.
struct HostRef {
  std::uint64_t id = 0;
  std::uint64_t offset = 0;
  std::uint64_t allocBytes = 0;
  std::int32_t fd = -1;
};

// `bytes` (> 0) of zeroed shared memory, page-aligned.
Result<void*> hostAlloc(std::size_t bytes);
// Frees what hostAlloc returned (null: nothing to do); any other pointer is an invalid argument
// and changes nothing.
// Peers that mapped it keep their mapping (and the memory) until they drop it.
Status hostFree(void* p);
// The allocation holding [p, p + bytes), or id 0.
HostRef hostRefOf(const void* p, std::size_t bytes);
// How many allocations this process holds (tests check that none leak).
std::size_t hostAllocations();

// This process's read-only mappings of its peers' allocations, kept between calls (a few per
// peer, the least recently used dropped first) and all unmapped on destruction.
class PeerAllocations {
 public:
  PeerAllocations() = default;
  PeerAllocations(const PeerAllocations&) = delete;
  PeerAllocations& operator=(const PeerAllocations&) = delete;
  ~PeerAllocations();

  // The range `ref` names in process `pid`'s allocation, `bytes` long, as this process sees it;
  // null when it cannot be mapped (no permission, the descriptor no longer the allocation's) or
  // the range does not fit inside it.
  const std::byte* view(int pid, const HostRef& ref, std::size_t bytes);
  std::size_t mappings() const { return maps_.size(); }

 private:
  struct Mapping {
    int pid;
    std::uint64_t id;
    std::byte* base;
    std::size_t bytes;
    std::uint64_t used;  // the last view's tick
  };
  static constexpr std::size_t kKeptPerPeer = 8;
  std::vector<Mapping> maps_;
  std::uint64_t tick_ = 0;
};

}  // namespace weft::transport
