#include "api/api_guard.h"

#include "core/log.h"

namespace shoal::api {
namespace {
std::mutex gLastErrorMutex;
std::string gLastError;
}  // namespace

void setLastError(const Status& status) {
  {
    std::lock_guard<std::mutex> lock(gLastErrorMutex);
    gLastError = status.message();
  }
  SHOAL_WARN(status.message());
}

std::string lastError() {
  std::lock_guard<std::mutex> lock(gLastErrorMutex);
  return gLastError;
}

ncclResult_t toResult(const Status& status) {
  if (!status.isOk() && status.code() != Code::kInProgress) setLastError(status);
  return static_cast<ncclResult_t>(toNcclCode(status.code()));
}

Result<std::shared_ptr<Communicator>> readyComm(ncclComm_t comm) {
  if (comm == nullptr) return invalidArgument("comm is NULL");
  if (comm->magic != ncclComm::kMagic)
    return invalidArgument("comm ", static_cast<void*>(comm),
                           " is not a live communicator (destroyed or never created)");
  int state = comm->shared->state.load(std::memory_order_acquire);
  if (state == ncclInProgress)
    return invalidArgument(
        "Attempt to use communicator before the previous operation returned ncclSuccess "
        "(initialization still in progress; poll ncclCommGetAsyncError)");
  if (state != ncclSuccess) {
    std::lock_guard<std::mutex> lock(comm->shared->mutex);
    return Status(Code::kInvalidUsage,
                  str("communicator failed to initialize: ", comm->shared->initError.message()));
  }
  auto impl = comm->shared->impl;
  if (impl->aborted()) return invalidUsage(impl->describe(), " was aborted");
  return impl;
}

}  // namespace shoal::api
