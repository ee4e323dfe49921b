// NCCL functions Shoal does not implement yet. They exist so that programs
// built against a newer nccl.h still load (PyTorch resolves every symbol at
// import); each returns ncclInvalidUsage and says so in ncclGetLastError.
#include "api/api_guard.h"

using namespace shoal;
using shoal::api::groupGuard;

namespace {
// Through groupGuard: the one-sided calls go into a group in NCCL, and one
// refused there must not leave the rest of its group running.
ncclResult_t notImplemented(const char* function, const char* what) {
  return groupGuard(function, [&] {
    return Status(Code::kUnsupported, str("not implemented in Shoal ", SHOAL_VERSION_STRING, ": ",
                                          what));
  });
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
