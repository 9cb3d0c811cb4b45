// NCCL's device API through libweft_nccl.so: what weft answers (the teams) and what it refuses
// (device communicators and their requirements, with an error naming the function). C++, as
// nccl_device.h is; two ranks as threads on host memory, so no GPU is needed. Exit 0 when every
// check holds.
#include <cuda_runtime.h>
#include <nccl.h>
#include <nccl_device/core.h>
#include <nccl_device/ll_a2a.h>
#if defined(WEFT_NCCL_HEADER_lsa_barrier)
#include <nccl_device/lsa_barrier.h>
#else
#include <nccl_device/mem_barrier.h>  // 2.28.3's name for it
#endif

#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

namespace {

constexpr int kRanks = 2;
std::atomic<int> failures{0};

void expect(bool ok, int rank, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "rank %d: FAIL %s\n", rank, what);
    failures.fetch_add(1);
  }
}

bool named(ncclComm_t comm, const char* function) {
  return std::strstr(ncclGetLastError(comm), function) != nullptr;
}

void rankMain(int rank, const ncclUniqueId& id) {
  ncclComm_t comm = nullptr;
  if (ncclCommInitRank(&comm, kRanks, id, rank) != ncclSuccess) {
    expect(false, rank, "ncclCommInitRank");
    return;
  }
  const ncclTeam_t world = ncclTeamWorld(comm);
  expect(world.nRanks == kRanks && world.rank == rank && world.stride == 1, rank, "ncclTeamWorld");
  const ncclTeam_t lsa = ncclTeamLsa(comm);
  expect(lsa.nRanks == 1 && lsa.rank == 0 && lsa.stride == 1, rank, "ncclTeamLsa: the rank alone");
  const ncclTeam_t rail = ncclTeamRail(comm);
  expect(rail.nRanks == kRanks && rail.rank == rank && rail.stride == 1, rank,
         "ncclTeamRail: the world");
  for (int r = 0; r < kRanks; ++r) expect(ncclTeamRankToWorld(comm, world, r) == r, rank, "world");
  expect(ncclTeamRankToLsa(comm, lsa, 0) == 0, rank, "ncclTeamRankToLsa");

  // (The device communicator and handle types are complete only in CUDA code: null outputs.)
  // ncclGetLastError is the process's, as NCCL's: the ranks take turns failing and reading it,
  // or one rank's failure could overwrite the other's before it is read.
  static std::mutex turns;
  {
    const std::lock_guard<std::mutex> turn(turns);
    ncclDevCommRequirements_t reqs{};
    expect(ncclDevCommCreate(comm, &reqs, nullptr) == ncclInvalidUsage, rank, "ncclDevCommCreate");
    expect(named(comm, "ncclDevCommCreate"), rank, "ncclDevCommCreate's error names it");
    expect(ncclDevCommDestroy(comm, nullptr) == ncclInvalidUsage, rank, "ncclDevCommDestroy");
    ncclDevResourceRequirements_t res{};
    expect(ncclLsaBarrierCreateRequirement(lsa, 1, nullptr, &res) == ncclInvalidUsage, rank,
           "ncclLsaBarrierCreateRequirement");
    expect(named(comm, "ncclLsaBarrierCreateRequirement"), rank, "its error names it");
    expect(ncclLLA2ACalcSlots(1024, 4) == 0, rank, "ncclLLA2ACalcSlots");
  }

  // The collectives still run after the refusals (host buffers).
  int value = rank + 1;
  int sum = 0;
  expect(
      ncclAllReduce(&value, &sum, 1, ncclInt32, ncclSum, comm, nullptr) == ncclSuccess && sum == 3,
      rank, "ncclAllReduce after the refusals");
  expect(ncclCommDestroy(comm) == ncclSuccess, rank, "ncclCommDestroy");
}

}  // namespace

int main() {
  // A null communicator: an empty team, and the error says so.
  const ncclTeam_t none = ncclTeamWorld(nullptr);
  expect(none.nRanks == 0, -1, "ncclTeamWorld(NULL) has no ranks");
  expect(named(nullptr, "ncclTeamWorld"), -1, "ncclTeamWorld(NULL)'s error names it");
  ncclUniqueId id;
  if (ncclGetUniqueId(&id) != ncclSuccess) return 1;
  std::vector<std::thread> ranks;
  for (int r = 0; r < kRanks; ++r) ranks.emplace_back(rankMain, r, std::cref(id));
  for (std::thread& t : ranks) t.join();
  if (failures.load() != 0) return 1;
  std::printf("NCCL device API: teams answered, device communicators refused\n");
  return 0;
}
