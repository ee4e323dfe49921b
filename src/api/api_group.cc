// ncclGroupStart / ncclGroupEnd / ncclGroupSimulateEnd.
#include <cstring>

#include "api/api_guard.h"
#include "comm/group.h"

using namespace shoal;
using shoal::api::guard;

SHOAL_API(ncclResult_t, ncclGroupStart, ()) {
  return guard("ncclGroupStart", []() -> Status {
    group::start();
    return Status::ok();
  });
}

SHOAL_API(ncclResult_t, ncclGroupEnd, ()) {
  return guard("ncclGroupEnd", [] { return group::end(); });
}

SHOAL_API(ncclResult_t, ncclGroupSimulateEnd, (ncclSimInfo_t * simInfo)) {
  return guard("ncclGroupSimulateEnd", [&]() -> Status {
    if (simInfo == nullptr) return invalidArgument("simInfo is NULL");
    ncclSimInfo_t info = NCCL_SIM_INFO_INITIALIZER;
    size_t size = simInfo->size < sizeof(info) ? simInfo->size : sizeof(info);
    std::memcpy(&info, simInfo, size);
    if (info.magic != 0x74685283)
      return invalidArgument("ncclSimInfo_t argument not initialized via NCCL_SIM_INFO_INITIALIZER");
    SHOAL_ASSIGN_OR_RETURN(float estimate, group::simulateEnd());
    info.estimatedTime = estimate;
    std::memcpy(simInfo, &info, size);
    return Status::ok();
  });
}
