// The C boundary (docs/design.md, C boundary): every extern "C" entry validates its
// arguments, calls one C++ method and translates the Status. Exceptions are
// caught here and nowhere else on the caller's side.
//
// SHOAL_API(name, (params)) defines the strong `pncclName` and the weak
// `ncclName` alias at the same address, unversioned, as NCCL exports them.
#pragma once

#include <nccl.h>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "comm/group.h"
#include "core/clock.h"
#include "core/status.h"

#define SHOAL_EXPORT extern "C" __attribute__((visibility("default")))
#define SHOAL_API(ret, name, params)                                                  \
  SHOAL_EXPORT __attribute__((weak, alias("p" #name))) ret name params;              \
  SHOAL_EXPORT ret p##name params

// The cancel flag of set-up work that must give up before it starts (its
// handle went away first): waits under it end at once, and a split's turn
// passes on as a cancelled one's does.
namespace shoal::api {
inline constinit const std::atomic<bool> kAlreadyCancelled{true};
}  // namespace shoal::api

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
    // Elastic communicators (src/api/api_elastic.cc). The store and secret the
    // communicator was made with, so that ncclCommShrink and ncclCommGrow can
    // meet the surviving ranks without the parent's connections; set before
    // state = ncclSuccess.
    std::shared_ptr<shoal::Store> store;
    std::string secret;
    // ncclCommRevoke: collectives are refused with ncclInvalidUsage; destroy,
    // split and shrink still work. The async error recorded before the revoke
    // (the revoke's own abort is no error).
    std::atomic<bool> revoked{false};
    shoal::Status errorBeforeRevoke;
    // ncclCommFinalize was called: a second call is ncclInvalidArgument (as
    // NCCL), and collectives and point-to-point calls are refused with
    // ncclInvalidUsage (only destroy, abort, queries and deregistrations
    // may follow).
    std::atomic<bool> finalized{false};
    // Counts of ncclCommShrink and ncclCommGrow calls on this communicator:
    // every surviving rank calls them in the same order, so the counts name
    // each agreement's keys in the store.
    uint64_t shrinks = 0;
    uint64_t grows = 0;
    // This rank's parts in nonblocking splits that make it no communicator
    // (NCCL_SPLIT_NOCOLOR) still running: ncclCommGetAsyncError reads
    // ncclInProgress meanwhile, as NCCL's does for the parent's split job;
    // and the first such part that failed (under mutex: a revoked
    // communicator reports it, whose own async error is the revoke's abort).
    std::atomic<int> partsRunning{0};
    shoal::Status partError;

    // Runs `part` (this rank's part of a collective set-up over the
    // communicator that gives it no new handle) on a thread kept here,
    // counted in partsRunning while it runs; its argument is the flag that
    // ends it (cancelInit, which ncclCommAbort sets). Threads of parts that
    // ended are joined here, so a job that splits for weeks keeps none. Once
    // the parts were closed (an abort or destroy on another thread got there
    // first) the part runs here, cancelled, so no thread outlives the handle.
    // `self`: this object's owner (the thread holds it).
    using Part = std::function<void(const std::atomic<bool>* cancel)>;
    void startPart(const std::shared_ptr<Shared>& self, Part part);
    // Refuses later parts and joins every part's thread (destroy, abort and
    // release, before the handle lets go of this).
    void closeParts();

   private:
    struct PartThread {
      std::thread thread;
      std::shared_ptr<std::atomic<bool>> ended;
    };
    std::mutex partsMutex_;  // a watchdog's abort may close while the owner starts one
    std::vector<PartThread> partThreads_;
    bool partsClosed_ = false;
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
  // Whether this handle is live and still the one `state` was made for: a
  // handle destroyed or aborted meanwhile may even serve another
  // communicator by now (work deferred to ncclGroupEnd asks).
  bool stillHolds(const std::shared_ptr<Shared>& state) const { return magic == kMagic && shared == state; }
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
// Drops the handle's shared state and its memory registrations
// (ncclCommRegister: NCCL's destroy ends them too) and marks it dead. No
// call may be inside.
void releaseHandle(ncclComm* handle);
// Ends the ncclCommRegister registrations made on `handle` (api_misc.cc).
void dropRegistrations(const ncclComm* handle);
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

// guard for the calls NCCL records in an open group (collectives,
// point-to-point, inits, splits, window registrations): one that fails there
// also fails the group, whose outermost ncclGroupEnd then runs none of it.
// failsGroup runs such a call's body inside guard, for a call that checks
// some arguments before (NCCL returns those errors before joining a group).
template <typename Body>
Status failsGroup(const char* function, Body&& body) {
  Status st;
  try {
    st = body();
  } catch (...) {
    if (group::active()) group::fail(function, internalError("an unexpected exception"));
    throw;  // guard's firewall reports it
  }
  if (!st.isOk() && st.code() != Code::kInProgress && group::active()) group::fail(function, st);
  return st;
}
template <typename Body>
ncclResult_t groupGuard(const char* function, Body&& body) noexcept {
  return guard(function, [&]() -> Status { return failsGroup(function, body); });
}

// The communicator behind a handle, ready for use, or an error that says why
// not (NULL, destroyed, still initializing, failed, aborted).
Result<std::shared_ptr<Communicator>> readyComm(ncclComm_t comm);
// readyComm, but a revoked communicator (ncclCommRevoke) is ready too: for
// the calls NCCL allows after a revoke (split, shrink, the queries of its
// size, rank and device, deregistrations).
Result<std::shared_ptr<Communicator>> readyOrRevokedComm(ncclComm_t comm);

// Lifecycle helpers shared by the init entry points (api_comm.cc) and the
// elastic ones (api_elastic.cc).
// A fresh handle for a communicator being made.
ncclComm_t newHandle();
// A handle's init work: it gives up soon after *cancel is set (ncclCommAbort).
using InitWork = std::function<Result<std::shared_ptr<Communicator>>(const std::atomic<bool>* cancel)>;
// Blocking: runs the work now. In a group: at ncclGroupEnd. Nonblocking: on
// a thread, returning kInProgress. *out is valid in every case but an
// immediate failure.
// `parent`: the communicator whose bootstrap the work uses (a split), whose
// collective set-ups in one group must run in call order (group::addOrderedInit).
// The work runs with the CUDA context current at the call, or, given
// `contextOf` (a communicator made from a parent: NCCL gives it the
// parent's device), with that context (the parent's own).
Status launchInit(ncclComm_t* out, ncclComm_t handle, bool blocking, InitWork work,
                  const void* parent = nullptr, cuda::ContextHandle contextOf = nullptr);
// The scope of a communicator made from a unique id with ncclCommInitRank.
std::string scopeForId(const UniqueIdContents& id);
// Makes rank `rank` of `nranks` from a unique id, as ncclCommInitRank does,
// recording the store and secret in `shared`. Blocking (an init work's body).
// `store`: a connection to the id's root the caller already holds (the root
// forgets an id once its last client leaves, so a caller that talked to the
// root first must not let go in between); null: connect.
Result<std::shared_ptr<Communicator>> initFromId(const UniqueIdContents& id, int nranks, int rank,
                                                 const CommOptions& options, const std::atomic<bool>* cancel,
                                                 ncclComm::Shared& shared,
                                                 std::shared_ptr<Store> store = nullptr);
void logVersionOnce();

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
