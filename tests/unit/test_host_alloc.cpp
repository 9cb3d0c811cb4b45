// weftHostAlloc's memory on its own (src/transport/host_alloc.hpp): where a range lies, and a
// peer's read-only view of it (here this process plays the peer, through /proc/self/fd): the
// same bytes, refused when the descriptor or the range does not match, a few kept per peer.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "src/transport/host_alloc.hpp"
#include "tests/runtime/fork.hpp"

namespace weft::transport {
namespace {

TEST(HostAlloc, RefsNameTheAllocationHoldingARange) {
  const std::size_t held = hostAllocations();
  auto p = hostAlloc(10000);
  ASSERT_TRUE(p.isOk()) << p.status().toString();
  EXPECT_EQ(hostAllocations(), held + 1);
  auto* b = static_cast<std::byte*>(*p);
  const HostRef whole = hostRefOf(b, 10000);
  EXPECT_NE(whole.id, 0u);
  EXPECT_EQ(whole.offset, 0u);
  EXPECT_GE(whole.allocBytes, 10000u);  // whole pages
  EXPECT_GE(whole.fd, 0);
  const HostRef inside = hostRefOf(b + 4096, 100);
  EXPECT_EQ(inside.id, whole.id);
  EXPECT_EQ(inside.offset, 4096u);
  EXPECT_EQ(hostRefOf(b + whole.allocBytes - 8, 16).id, 0u);  // runs past its end
  std::vector<std::byte> plain(64);
  EXPECT_EQ(hostRefOf(plain.data(), plain.size()).id, 0u);
  EXPECT_FALSE(hostAlloc(0).isOk());
  EXPECT_EQ(hostFree(b + 64).code(), Code::invalidArgument);
  EXPECT_TRUE(hostFree(b).isOk());
  EXPECT_EQ(hostFree(b).code(), Code::invalidArgument);
  EXPECT_EQ(hostAllocations(), held);
  EXPECT_EQ(hostRefOf(b, 8).id, 0u);
}

TEST(HostAlloc, APeersViewSeesTheBytesAndRefusesWhatDoesNotMatch) {
  auto p = hostAlloc(1 << 16);
  ASSERT_TRUE(p.isOk());
  auto* b = static_cast<std::byte*>(*p);
  const int pid = static_cast<int>(getpid());
  {
    PeerAllocations views;
    const HostRef ref = hostRefOf(b + 8192, 4096);
    const std::byte* v = views.view(pid, ref, 4096);
    ASSERT_NE(v, nullptr);
    EXPECT_NE(v, b + 8192);  // a mapping of its own
    std::memset(b + 8192, 0x5a, 4096);
    EXPECT_EQ(v[4095], std::byte{0x5a});       // the same memory
    EXPECT_EQ(views.view(pid, ref, 4096), v);  // kept
    EXPECT_EQ(views.mappings(), 1u);
    // Past the allocation; another allocation's id behind this descriptor; no descriptor.
    EXPECT_EQ(views.view(pid, ref, ref.allocBytes), nullptr);
    HostRef other = ref;
    other.id += 1000;
    EXPECT_EQ(views.view(pid, other, 16), nullptr);
    HostRef none = ref;
    none.fd = -1;
    EXPECT_EQ(views.view(pid, none, 16), nullptr);
    EXPECT_EQ(views.view(pid, HostRef{}, 16), nullptr);
    EXPECT_EQ(views.mappings(), 1u);
  }
  // The views went with their owner: only the allocation itself is mapped.
  EXPECT_EQ(test::hostAllocMaps(), 1);
  EXPECT_TRUE(hostFree(b).isOk());
  EXPECT_EQ(test::hostAllocMaps(), 0);
}

TEST(HostAlloc, APeerKeepsAFewAllocationsMappedTheLeastRecentlyUsedGoFirst) {
  std::vector<void*> allocs;
  for (int i = 0; i < 10; ++i) {
    auto p = hostAlloc(4096);
    ASSERT_TRUE(p.isOk());
    allocs.push_back(*p);
  }
  const int pid = static_cast<int>(getpid());
  PeerAllocations views;
  const std::byte* first = views.view(pid, hostRefOf(allocs[0], 4096), 4096);
  ASSERT_NE(first, nullptr);
  for (int i = 1; i < 8; ++i) ASSERT_NE(views.view(pid, hostRefOf(allocs[i], 4096), 4096), nullptr);
  EXPECT_EQ(views.mappings(), 8u);
  EXPECT_EQ(views.view(pid, hostRefOf(allocs[0], 4096), 4096), first);  // used again: newest
  // Two more: the two least recently used (1 and 2) are unmapped, 0 stays.
  ASSERT_NE(views.view(pid, hostRefOf(allocs[8], 4096), 4096), nullptr);
  ASSERT_NE(views.view(pid, hostRefOf(allocs[9], 4096), 4096), nullptr);
  EXPECT_EQ(views.mappings(), 8u);
  EXPECT_EQ(views.view(pid, hostRefOf(allocs[0], 4096), 4096), first);
  EXPECT_EQ(test::hostAllocMaps(), 10 + 8);
  for (void* p : allocs) EXPECT_TRUE(hostFree(p).isOk());
  // A peer's view outlives the owner's free (the memory stays until the view goes).
  EXPECT_EQ(test::hostAllocMaps(), 8);
}

}  // namespace
}  // namespace weft::transport
