// NCCL's device API (nccl_device.h, from NCCL 2.28: device communicators, symmetric windows, the
// barriers and all-to-all its kernels use) has no counterpart in weft, so its entry points
// refuse; they are here because a program linked to libnccl.so.2 (PyTorch) binds them at load.
// The teams are answered: the world's, and an LSA domain of the rank alone (no peer's memory is
// reachable through this interface's device API), so the rail is the world. Only the functions
// the nccl.h found declares are defined (nccl/shim.hpp), with the headers of its folder
// (WEFT_NCCL_HEADER_<stem>): 2.28.3 names its barrier header mem_barrier.h, later ones
// lsa_barrier.h and gin_barrier.h.
#include "nccl/shim.hpp"

#if defined(WEFT_NCCL_HEADER_core)
#include <nccl_device/core.h>
#endif
#if defined(WEFT_NCCL_HEADER_ll_a2a)
#include <nccl_device/ll_a2a.h>
#endif
#if defined(WEFT_NCCL_HEADER_lsa_barrier)
#include <nccl_device/lsa_barrier.h>
#elif defined(WEFT_NCCL_HEADER_mem_barrier)
#include <nccl_device/mem_barrier.h>
#endif
#if defined(WEFT_NCCL_HEADER_gin_barrier)
#include <nccl_device/gin_barrier.h>
#endif

using namespace weft::nccl;  // NOLINT(google-build-using-namespace): this library's own helpers

extern "C" {

#if defined(WEFT_NCCL_HAS_DevCommCreate)
ncclResult_t pncclDevCommCreate(ncclComm_t, ncclDevCommRequirements_t const*, ncclDevComm_t*) {
  return unsupported("ncclDevCommCreate", "NCCL's device API (use the host collectives)");
}
ncclResult_t ncclDevCommCreate(ncclComm_t, ncclDevCommRequirements_t const*, ncclDevComm_t*)
    WEFT_NCCL_ALIAS(ncclDevCommCreate);
#endif

#if defined(WEFT_NCCL_HAS_DevCommDestroy)
ncclResult_t pncclDevCommDestroy(ncclComm_t, ncclDevComm_t const*) {
  return unsupported("ncclDevCommDestroy", "NCCL's device API (no device communicator exists)");
}
ncclResult_t ncclDevCommDestroy(ncclComm_t, ncclDevComm_t const*)
    WEFT_NCCL_ALIAS(ncclDevCommDestroy);
#endif

#if defined(WEFT_NCCL_HAS_LsaBarrierCreateRequirement)
ncclResult_t pncclLsaBarrierCreateRequirement(ncclTeam_t, int, ncclLsaBarrierHandle_t*,
                                              ncclDevResourceRequirements_t*) {
  return unsupported("ncclLsaBarrierCreateRequirement", "NCCL's device API");
}
ncclResult_t ncclLsaBarrierCreateRequirement(ncclTeam_t, int, ncclLsaBarrierHandle_t*,
                                             ncclDevResourceRequirements_t*)
    WEFT_NCCL_ALIAS(ncclLsaBarrierCreateRequirement);
#endif

#if defined(WEFT_NCCL_HAS_GinBarrierCreateRequirement)
ncclResult_t pncclGinBarrierCreateRequirement(ncclComm_t, ncclTeam_t, int, ncclGinBarrierHandle_t*,
                                              ncclDevResourceRequirements_t*) {
  return unsupported("ncclGinBarrierCreateRequirement", "NCCL's device API");
}
ncclResult_t ncclGinBarrierCreateRequirement(ncclComm_t, ncclTeam_t, int, ncclGinBarrierHandle_t*,
                                             ncclDevResourceRequirements_t*)
    WEFT_NCCL_ALIAS(ncclGinBarrierCreateRequirement);
#endif

#if defined(WEFT_NCCL_HAS_LLA2ACreateRequirement)
ncclResult_t pncclLLA2ACreateRequirement(int, int, ncclLLA2AHandle_t*,
                                         ncclDevResourceRequirements_t*) {
  return unsupported("ncclLLA2ACreateRequirement", "NCCL's device API");
}
ncclResult_t ncclLLA2ACreateRequirement(int, int, ncclLLA2AHandle_t*,
                                        ncclDevResourceRequirements_t*)
    WEFT_NCCL_ALIAS(ncclLLA2ACreateRequirement);
#endif

#if defined(WEFT_NCCL_HAS_LLA2ACalcSlots)
// Slots of the device API's all-to-all: none (ncclGetLastError says why).
int pncclLLA2ACalcSlots(int, int) {
  (void)unsupported("ncclLLA2ACalcSlots", "NCCL's device API");
  return 0;
}
int ncclLLA2ACalcSlots(int, int) WEFT_NCCL_ALIAS(ncclLLA2ACalcSlots);
#endif

#if defined(WEFT_NCCL_HAS_TeamWorld)
ncclTeam_t pncclTeamWorld(ncclComm_t comm) {
  const Flight flight(comm);
  ncclResult_t err = ncclSuccess;
  ncclTeam_t team{0, 0, 1};  // no ranks: a null or unready communicator (the error is set)
  weftComm_t w = ready(comm, "ncclTeamWorld", &err);
  if (w != nullptr && (check(weftCommCount(w, &team.nRanks), "ncclTeamWorld") != ncclSuccess ||
                       check(weftCommUserRank(w, &team.rank), "ncclTeamWorld") != ncclSuccess)) {
    team = ncclTeam_t{0, 0, 1};
  }
  return team;
}
ncclTeam_t ncclTeamWorld(ncclComm_t) WEFT_NCCL_ALIAS(ncclTeamWorld);
#endif

#if defined(WEFT_NCCL_HAS_TeamLsa)
ncclTeam_t pncclTeamLsa(ncclComm_t comm) {
  const ncclTeam_t world = pncclTeamWorld(comm);
  return world.nRanks == 0 ? world : ncclTeam_t{1, 0, 1};
}
ncclTeam_t ncclTeamLsa(ncclComm_t) WEFT_NCCL_ALIAS(ncclTeamLsa);
#endif

#if defined(WEFT_NCCL_HAS_TeamRail)
ncclTeam_t pncclTeamRail(ncclComm_t comm) {
  return pncclTeamWorld(comm);  // ranks with this one's LSA rank: all, an LSA domain being one
}
ncclTeam_t ncclTeamRail(ncclComm_t) WEFT_NCCL_ALIAS(ncclTeamRail);
#endif

#if defined(WEFT_NCCL_HAS_TeamRankToWorld)
// Rank `rank` of `team` (which holds this rank) as a rank of the world, or of this rank's LSA
// domain: NCCL's formula, the caller's place plus the team's stride times the distance.
int pncclTeamRankToWorld(ncclComm_t comm, ncclTeam_t team, int rank) {
  const ncclTeam_t world = pncclTeamWorld(comm);
  return world.rank + (rank - team.rank) * team.stride;
}
int ncclTeamRankToWorld(ncclComm_t, ncclTeam_t, int) WEFT_NCCL_ALIAS(ncclTeamRankToWorld);
#endif

#if defined(WEFT_NCCL_HAS_TeamRankToLsa)
int pncclTeamRankToLsa(ncclComm_t, ncclTeam_t team, int rank) {
  return 0 + (rank - team.rank) * team.stride;  // this rank's LSA rank is 0
}
int ncclTeamRankToLsa(ncclComm_t, ncclTeam_t, int) WEFT_NCCL_ALIAS(ncclTeamRankToLsa);
#endif

}  // extern "C"
