// NCCL functions Shoal does not implement yet. They exist so that programs
// built against a newer nccl.h still load (PyTorch resolves every symbol at
// import); each returns ncclInvalidUsage and says so in ncclGetLastError.
#include "api/api_guard.h"

using namespace shoal;
using shoal::api::groupGuard;
using shoal::api::guard;

namespace {
Status notImplementedStatus(const char* what) {
  return Status(Code::kUnsupported, str("not implemented in Shoal ", SHOAL_VERSION_STRING, ": ", what));
}
// Through groupGuard: the one-sided calls go into a group in NCCL, and one
// refused there must not leave the rest of its group running.
ncclResult_t notImplemented(const char* function, const char* what) {
  return groupGuard(function, [&] { return notImplementedStatus(what); });
}
}  // namespace

SHOAL_API(ncclResult_t, ncclCommSuspend, (ncclComm_t comm, int flags)) {
  return notImplemented("ncclCommSuspend", "suspend/resume of device memory");
}
SHOAL_API(ncclResult_t, ncclCommResume, (ncclComm_t comm)) {
  return notImplemented("ncclCommResume", "suspend/resume of device memory");
}
SHOAL_API(ncclResult_t, ncclCommMemStats,
          (ncclComm_t comm, ncclCommMemStat_t stat, uint64_t* value)) {
  return notImplemented("ncclCommMemStats", "device memory statistics");
}
SHOAL_API(ncclResult_t, ncclPutSignal,
          (const void* localbuff, size_t count, ncclDataType_t datatype, int peer,
           ncclWindow_t peerWin, size_t peerWinOffset, int sigIdx, int ctx, unsigned int flags,
           ncclComm_t comm, cudaStream_t stream)) {
  return notImplemented("ncclPutSignal", "one-sided operations on windows");
}
SHOAL_API(ncclResult_t, ncclSignal,
          (int peer, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm,
           cudaStream_t stream)) {
  return notImplemented("ncclSignal", "one-sided operations on windows");
}
SHOAL_API(ncclResult_t, ncclWaitSignal,
          (int nDesc, ncclWaitSignalDesc_t* signalDescs, ncclComm_t comm, cudaStream_t stream)) {
  return notImplemented("ncclWaitSignal", "one-sided operations on windows");
}

// The host functions of NCCL's device API (nccl_device.h, 2.28+), which
// Shoal does not offer: programs built against it, PyTorch among them,
// resolve them at load. Creating a device communicator is refused, so no
// caller gets as far as a kernel; the requirement helpers refuse too. The
// team queries answer what is true here: the world team, and a load/store
// team of the rank alone (no peer's memory is reachable through this API).
// Argument types are NCCL's where they pass by value (ncclTeam_t, the
// multimem handle); pointers to NCCL's other device-API structs stay opaque.
namespace {
struct DeviceApiTeam {  // ncclTeam_t: {nRanks, rank, stride}
  int nRanks, rank, stride;
};
struct DeviceApiMultimemHandle {  // ncclMultimemHandle_t
  void* mcBasePtr;
};

ncclResult_t deviceApiRefused(const char* function) {
  return guard(function, [&] { return notImplementedStatus("NCCL's device API (nccl_device.h)"); });
}

// This rank's place in its communicator, or nothing for a handle that is
// not a usable communicator.
bool placeOf(ncclComm_t comm, int& rank, int& nranks) {
  Result<std::shared_ptr<Communicator>> impl = api::readyOrRevokedComm(comm);
  if (!impl.isOk()) return false;
  rank = impl.value()->rank();
  nranks = impl.value()->nranks();
  return true;
}

DeviceApiTeam worldTeam(ncclComm_t comm) {
  int rank = 0, nranks = 0;
  if (!placeOf(comm, rank, nranks)) return {0, 0, 0};
  return {nranks, rank, 1};
}
}  // namespace

SHOAL_API(ncclResult_t, ncclDevCommCreate, (ncclComm_t comm, const void* reqs, void* outDevComm)) {
  return deviceApiRefused("ncclDevCommCreate");
}
SHOAL_API(ncclResult_t, ncclDevCommDestroy, (ncclComm_t comm, const void* devComm)) {
  return deviceApiRefused("ncclDevCommDestroy");
}
SHOAL_API(ncclResult_t, ncclCommQueryProperties, (ncclComm_t comm, void* props)) {
  return deviceApiRefused("ncclCommQueryProperties");
}
SHOAL_API(ncclResult_t, ncclLsaBarrierCreateRequirement,
          (DeviceApiTeam team, int nBarriers, void* outHandle, void* outReq)) {
  return deviceApiRefused("ncclLsaBarrierCreateRequirement");
}
SHOAL_API(ncclResult_t, ncclGinBarrierCreateRequirement,
          (ncclComm_t comm, DeviceApiTeam team, int nBarriers, void* outHandle, void* outReq)) {
  return deviceApiRefused("ncclGinBarrierCreateRequirement");
}
SHOAL_API(ncclResult_t, ncclLLA2ACreateRequirement, (int nBlocks, int nSlots, void* outHandle, void* outReq)) {
  return deviceApiRefused("ncclLLA2ACreateRequirement");
}
SHOAL_API(ncclResult_t, ncclGinOutboxCreateRequirement, (int nBlocks, int sizeLog2, void* outHandle, void* outReq)) {
  return deviceApiRefused("ncclGinOutboxCreateRequirement");
}
SHOAL_API(ncclResult_t, ncclGinInboxA2ACreateRequirement,
          (DeviceApiTeam peers, int nBlocks, int sizeLog2, void* outHandle, void* outReq)) {
  return deviceApiRefused("ncclGinInboxA2ACreateRequirement");
}
// No slots: nothing of the device API can be created to hold them.
SHOAL_API(int, ncclLLA2ACalcSlots, (int maxElts, int maxEltSize)) { return 0; }
SHOAL_API(ncclResult_t, ncclGetLsaMultimemDevicePointer, (ncclWindow_t window, size_t offset, void** outPtr)) {
  return deviceApiRefused("ncclGetLsaMultimemDevicePointer");
}
SHOAL_API(ncclResult_t, ncclGetMultimemDevicePointer,
          (ncclWindow_t window, size_t offset, DeviceApiMultimemHandle multimem, void** outPtr)) {
  return deviceApiRefused("ncclGetMultimemDevicePointer");
}
SHOAL_API(ncclResult_t, ncclGetLsaDevicePointer, (ncclWindow_t window, size_t offset, int lsaRank, void** outPtr)) {
  return deviceApiRefused("ncclGetLsaDevicePointer");
}
SHOAL_API(ncclResult_t, ncclGetPeerDevicePointer, (ncclWindow_t window, size_t offset, int peer, void** outPtr)) {
  return deviceApiRefused("ncclGetPeerDevicePointer");
}
SHOAL_API(DeviceApiTeam, ncclTeamWorld, (ncclComm_t comm)) { return worldTeam(comm); }
// Load/store access reaches the rank alone; the rail team (the outer factor
// of that one) is then the world.
SHOAL_API(DeviceApiTeam, ncclTeamLsa, (ncclComm_t comm)) {
  DeviceApiTeam world = worldTeam(comm);
  return world.nRanks == 0 ? world : DeviceApiTeam{1, 0, 1};
}
SHOAL_API(DeviceApiTeam, ncclTeamRail, (ncclComm_t comm)) { return worldTeam(comm); }
// A rank of `team` as a world rank; -1 outside the world.
SHOAL_API(int, ncclTeamRankToWorld, (ncclComm_t comm, DeviceApiTeam team, int rank)) {
  int me = 0, nranks = 0;
  if (!placeOf(comm, me, nranks)) return -1;
  const long world = me + static_cast<long>(rank - team.rank) * team.stride;
  return world >= 0 && world < nranks ? static_cast<int>(world) : -1;
}
// ...and as a rank of the load/store team: 0 for this rank, -1 for any other.
SHOAL_API(int, ncclTeamRankToLsa, (ncclComm_t comm, DeviceApiTeam team, int rank)) {
  int me = 0, nranks = 0;
  if (!placeOf(comm, me, nranks)) return -1;
  return team.stride * (rank - team.rank) == 0 ? 0 : -1;
}
// NCCL's internal twin of ncclResetDebugInit, exported beside it.
SHOAL_EXPORT void ncclResetDebugInitInternal(void) { ncclResetDebugInit(); }
