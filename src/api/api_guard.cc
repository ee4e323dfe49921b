#include "api/api_guard.h"

#include <algorithm>
#include <deque>
#include <iterator>
#include <mutex>

#include <time.h>

#include "core/fence.h"
#include "core/log.h"
#include "core/process.h"

void ncclComm::Shared::startPart(const std::shared_ptr<Shared>& self, Part part) {
  std::vector<PartThread> ended;
  {
    std::lock_guard<std::mutex> lock(partsMutex_);
    if (!partsClosed_) {
      auto split = std::stable_partition(partThreads_.begin(), partThreads_.end(),
                                         [](const PartThread& p) { return !p.ended->load(std::memory_order_acquire); });
      std::move(split, partThreads_.end(), std::back_inserter(ended));
      partThreads_.erase(split, partThreads_.end());
      auto endedFlag = std::make_shared<std::atomic<bool>>(false);
      partsRunning.fetch_add(1, std::memory_order_acq_rel);
      try {
        partThreads_.push_back({std::thread([state = self, endedFlag, part = std::move(part)] {
                                  shoal::markLibraryThread();
                                  part(&state->cancelInit);
                                  state->partsRunning.fetch_sub(1, std::memory_order_acq_rel);
                                  endedFlag->store(true, std::memory_order_release);
                                }),
                                endedFlag});
      } catch (...) {
        partsRunning.fetch_sub(1, std::memory_order_acq_rel);  // never ran: not in progress
        throw;
      }
      part = nullptr;
    }
  }
  for (PartThread& p : ended) p.thread.join();
  if (part) part(&shoal::api::kAlreadyCancelled);
}

void ncclComm::Shared::closeParts() {
  std::vector<PartThread> threads;
  {
    std::lock_guard<std::mutex> lock(partsMutex_);
    partsClosed_ = true;
    threads.swap(partThreads_);
  }
  for (PartThread& p : threads) p.thread.join();
}

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

namespace {

struct HandlePool {
  std::mutex mutex;
  std::deque<ncclComm*> released;  // oldest first
};
HandlePool& handlePool() {
  static auto* pool = new HandlePool();  // lives for the process, as the handles do
  return *pool;
}

}  // namespace

ncclComm* allocateHandle() {
  HandlePool& pool = handlePool();
  {
    std::lock_guard<std::mutex> lock(pool.mutex);
    if (pool.released.size() > kHandleQuarantine) {
      ncclComm* reused = pool.released.front();
      pool.released.pop_front();
      reused->cudaDev = -1;
      reused->shared = std::make_shared<ncclComm::Shared>();
      reused->magic = ncclComm::kMagic;
      return reused;
    }
  }
  return new ncclComm();
}

void releaseHandle(ncclComm* handle) {
  if (handle->initThread.joinable()) handle->initThread.join();
  handle->shared->closeParts();
  dropRegistrations(handle);
  handle->shared.reset();
  handle->magic = ncclComm::kDeadMagic;
  HandlePool& pool = handlePool();
  std::lock_guard<std::mutex> lock(pool.mutex);
  pool.released.push_back(handle);
}

Status deadHandle(const ncclComm* handle) {
  if (handle == nullptr) return invalidArgument("comm is NULL");
  if (handle->magic == ncclComm::kDeadMagic)
    return invalidArgument("comm ", static_cast<const void*>(handle),
                           " was destroyed (ncclCommDestroy or ncclCommAbort) and cannot be used");
  return invalidArgument("comm ", static_cast<const void*>(handle),
                         " is not a communicator (never created)");
}

namespace {

// Why a handle cannot be used, apart from an abort; ok when it can.
Status checkHandle(ncclComm_t comm) {
  if (comm == nullptr) return invalidArgument("comm is NULL");
  if (comm->magic != ncclComm::kMagic) [[unlikely]]
    return deadHandle(comm);
  int state = comm->shared->state.load(std::memory_order_acquire);
  if (state == ncclInProgress)
    return invalidArgument(
        "Attempt to use communicator before the previous operation returned ncclSuccess "
        "(initialization still in progress; poll ncclCommGetAsyncError)");
  if (state != ncclSuccess) {
    // The init's own code, as NCCL returns a communicator's error state.
    std::lock_guard<std::mutex> lock(comm->shared->mutex);
    const Status& init = comm->shared->initError;
    const Code code = init.isOk() || init.code() == Code::kInProgress ? Code::kInvalidUsage : init.code();
    return Status(code, str("communicator failed to initialize: ", init.message()));
  }
  return Status::ok();
}

[[gnu::cold, gnu::noinline]] Status abortedError(const ncclComm::Shared& shared, const Communicator& impl) {
  if (shared.revoked.load(std::memory_order_acquire))
    return invalidUsage(impl.describe(),
                        " was revoked (ncclCommRevoke, or ncclCommShrink with NCCL_SHRINK_ABORT): only "
                        "ncclCommDestroy, ncclCommAbort, ncclCommSplit, ncclCommShrink, its queries and "
                        "deregistrations may use it");
  return invalidUsage(impl.describe(), " was aborted");
}

// Why a collective or point-to-point call is refused: aborted, revoked or
// finalized.
[[gnu::cold, gnu::noinline]] Status refusedCallError(const ncclComm::Shared& shared, const Communicator& impl) {
  if (impl.aborted()) return abortedError(shared, impl);
  return invalidUsage(impl.describe(), " was finalized (ncclCommFinalize): only ncclCommDestroy, ncclCommAbort, "
                      "its queries and deregistrations may use it");
}

}  // namespace

Result<std::shared_ptr<Communicator>> readyComm(ncclComm_t comm) {
  SHOAL_TRY(checkHandle(comm));
  auto impl = comm->shared->impl;
  if (impl->aborted()) return abortedError(*comm->shared, *impl);
  return impl;
}

Result<std::shared_ptr<Communicator>> readyOrRevokedComm(ncclComm_t comm) {
  SHOAL_TRY(checkHandle(comm));
  if (comm->shared->revoked.load(std::memory_order_acquire)) return comm->shared->impl;
  return readyComm(comm);
}

CommCall::CommCall(ncclComm_t handle) : status_(checkHandle(handle)) {
  if (!status_.isOk()) [[unlikely]]
    return;
  shared_ = handle->shared.get();
  std::atomic<int>& inside = shared_->callsInside;
  inside.store(inside.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  lightFence();  // the mark is visible before the abort flag is read (waitForCalls)
  impl_ = &shared_->impl;
  if ((*impl_)->aborted() || shared_->finalized.load(std::memory_order_relaxed)) [[unlikely]] {
    try {
      status_ = refusedCallError(*shared_, **impl_);  // still marked: abort waits while it reads
    } catch (...) {
      leave();
      throw;  // no destructor runs for a constructor that throws
    }
  }
}

CommCall::~CommCall() {
  if (shared_ != nullptr) leave();
}

void CommCall::leave() {
  std::atomic<int>& inside = shared_->callsInside;
  inside.store(inside.load(std::memory_order_relaxed) - 1, std::memory_order_release);
}

bool waitForCalls(ncclComm& comm, Deadline deadline) {
  if (!heavyFence()) return false;  // pairs with CommCall's light fence
  while (comm.shared->callsInside.load(std::memory_order_acquire) > 0) {
    if (deadline.expired()) return false;
    timespec pause{0, 1'000'000};
    nanosleep(&pause, nullptr);
  }
  return true;
}

}  // namespace shoal::api
