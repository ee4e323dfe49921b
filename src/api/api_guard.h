// The C boundary (docs/design.md, C boundary): every extern "C" entry validates its
// arguments, calls one C++ method and translates the Status. Exceptions are
// caught here and nowhere else on the caller's side.
//
// SHOAL_API(name, (params)) defines the strong `pncclName` and the weak
// `ncclName` alias at the same address, unversioned, as NCCL exports them.
#pragma once

#include <nccl.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "comm/communicator.h"
#include "core/clock.h"
#include "core/status.h"

#define SHOAL_EXPORT extern "C" __attribute__((visibility("default")))
#define SHOAL_API(ret, name, params)                                                  \
  SHOAL_EXPORT __attribute__((weak, alias("p" #name))) ret name params;              \
  SHOAL_EXPORT ret p##name params

// The object behind ncclComm_t.
struct ncclComm {
  static constexpr uint64_t kMagic = 0x73686f616c636f6dull;  // "shoalcom"
  // State shared with the init/split work (on initThread, or run by
  // ncclGroupEnd on another thread), which may still hold it while the handle
  // goes away.
  struct Shared {
    std::atomic<int> state{ncclInProgress};  // ncclResult_t of init
    std::atomic<bool> cancelInit{false};     // set by ncclCommAbort: the init work gives up
    std::mutex mutex;
    shoal::Status initError;
    std::shared_ptr<shoal::Communicator> impl;  // set before state = ncclSuccess
    std::atomic<int> callsInside{0};            // CommCalls now using impl (api::CommCall)
  };
  // What a handle's memory holds after ncclCommDestroy/Abort: handles are
  // never freed (api::releaseHandle), so a late use reads this, not freed memory.
  static constexpr uint64_t kDeadMagic = 0x73686f616c646561ull;  // "shoaldea"
  uint64_t magic = kMagic;
  int cudaDev = -1;
  std::shared_ptr<Shared> shared = std::make_shared<Shared>();
  std::thread initThread;  // nonblocking init or split

  ~ncclComm() { magic = 0; }
  shoal::Communicator* impl() const { return shared->impl.get(); }
};

namespace shoal::api {

// Handles are allocated here and never returned to the allocator: a released
// handle keeps kDeadMagic (a use after destroy, or a second destroy, is a
// clear ncclInvalidArgument, never a read of freed memory) and is reused only
// after kHandleQuarantine later releases, so memory stays bounded by the
// live handles plus the quarantine. A handle older than that may name a newer
// communicator (docs/nccl-compat.md).
inline constexpr size_t kHandleQuarantine = 4096;
ncclComm* allocateHandle();
// Drops the handle's shared state and marks it dead. No call may be inside.
void releaseHandle(ncclComm* handle);
// Why a handle that is not live cannot be used.
Status deadHandle(const ncclComm* handle);

// Records the message for ncclGetLastError and logs it at WARN.
void setLastError(const Status& status);
ncclResult_t toResult(const Status& status);

// Runs `body` (returning Status) with the firewall: exceptions become
// ncclInternalError; the Status becomes an ncclResult_t.
template <typename Body>
ncclResult_t guard(const char* function, Body&& body) noexcept {
  try {
    Status st = body();
    if (!st.isOk() && st.code() != Code::kInProgress) st.withContext(function);
    return toResult(st);
  } catch (const std::exception& e) {
    return toResult(internalError(function, ": unexpected exception: ", e.what()));
  } catch (...) {
    return toResult(internalError(function, ": unexpected exception"));
  }
}

// The communicator behind a handle, ready for use, or an error that says why
// not (NULL, destroyed, still initializing, failed, aborted).
Result<std::shared_ptr<Communicator>> readyComm(ncclComm_t comm);

// A collective or point-to-point call's hold on its communicator, for as long
// as the call runs, without a reference count: copying the shared_ptr costs
// two locked instructions, ~9 ns of a ~100 ns 64-byte AllReduce on one rank.
// The call marks itself inside the handle's shared state with a plain store
// and a light fence (core/fence.h), then checks for abort; ncclCommAbort and
// ncclCommDestroy set the abort flag (or finish), fence heavily and wait for
// calls inside to leave before freeing (waitForCalls). NCCL lets one thread at
// a time use a communicator, so the count is a plain load and store.
class CommCall {
 public:
  explicit CommCall(ncclComm_t handle);
  ~CommCall();
  CommCall(const CommCall&) = delete;
  CommCall& operator=(const CommCall&) = delete;

  // Ok, or why the communicator cannot be used (as readyComm says).
  const Status& status() const { return status_; }
  // Valid while the call lives and status() is ok.
  const std::shared_ptr<Communicator>& comm() const { return *impl_; }

 private:
  void leave();  // undoes the mark (release: the call's accesses come first)

  ncclComm::Shared* shared_ = nullptr;  // set once marked inside
  const std::shared_ptr<Communicator>* impl_ = nullptr;
  Status status_;
};

// After the communicator was aborted or finalized: waits until no CommCall is
// inside the handle; false if one still is at the deadline (then the handle
// must not be freed).
bool waitForCalls(ncclComm& comm, Deadline deadline);

}  // namespace shoal::api
