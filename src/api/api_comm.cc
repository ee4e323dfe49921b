// Communicator lifecycle entry points: unique ids, init, split, finalize,
// destroy, abort, queries, errors and version.
#include <climits>
#include <cstring>
#include <set>

#include "api/api_guard.h"
#include "api/config.h"
#include "bootstrap/bootstrap.h"
#include "comm/group.h"
#include "core/fence.h"
#include "core/log.h"
#include "core/params.h"
#include "core/process.h"
#include "cuda/driver.h"

using namespace shoal;
using shoal::api::guard;
using shoal::api::groupGuard;

namespace shoal::api {

std::string scopeForId(const UniqueIdContents& id) { return "c" + hex64(id.magic); }

void logVersionOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    SHOAL_LOG(LogLevel::kVersion, subsys::kInit, "NCCL version 2.30.7+shoal ", SHOAL_VERSION_STRING,
              cuda::Driver::built() ? " (Shoal: host and CUDA device memory)" : " (Shoal: host memory; built without CUDA)");
  });
}

// Creates the handle and the work that initializes it; the caller decides
// whether that work runs now, at the outermost ncclGroupEnd, or on a thread.
ncclComm_t newHandle() {
  enableAsymmetricFences();  // before any CommCall can use the handle
  return api::allocateHandle();
}

}  // namespace shoal::api

namespace {

using api::InitWork;
using api::launchInit;
using api::logVersionOnce;
using api::newHandle;

// How long ncclCommAbort waits for calls still inside the communicator on
// other threads (they return within one engine pass of the abort flag, or at
// a connect deadline that the flag also cancels).
constexpr int64_t kCallsLeaveMs = 10000;
// ncclCommDestroy does not abort: a call inside on another thread (NCCL
// forbids it) is given this long to leave, as a quick query would.
constexpr int64_t kDestroyCallsLeaveMs = 1000;

// A call is still inside (or no barrier could order the check): keep the
// handle and its communicator rather than free memory that call uses.
[[gnu::cold]] void leakBusyHandle(ncclComm_t comm, const char* function, int64_t waitedMs) {
  SHOAL_WARN(function, ": a call on another thread is still inside ", static_cast<void*>(comm), " after ",
             waitedMs, " ms; its memory is kept");
}

// The handle's init failed (with its shared mutex held, or before any work ran).
void recordInitFailure(ncclComm::Shared& shared, const Status& why) {
  shared.initError = why;
  const int code = toNcclCode(why.code());
  shared.state.store(code == ncclSuccess ? ncclInternalError : code, std::memory_order_release);
}

// Runs a handle's init work and records the outcome in its shared state. An
// abort that lands while the work runs wins over its outcome: ncclCommAbort
// reads impl only after setting cancelInit, so a communicator that finished
// anyway is dropped here rather than left unaborted.
Status runInit(const std::shared_ptr<ncclComm::Shared>& shared, const InitWork& work) {
  auto result = work(&shared->cancelInit);
  std::lock_guard<std::mutex> lock(shared->mutex);
  if (shared->cancelInit.load()) {
    if (result.isOk() && result.value()) result.value()->abort();
    Status cause = result.isOk() ? Status::ok() : result.status();
    result = error(Code::kAborted, "communicator aborted during initialization (ncclCommAbort)",
                   cause.isOk() ? "" : "; init stopped at: ", cause.message());
  }
  if (!result.isOk()) {
    recordInitFailure(*shared, result.status());
    return result.status();
  }
  shared->impl = result.value();
  shared->state.store(ncclSuccess, std::memory_order_release);
  return Status::ok();
}

// NCCL makes a communicator for the CUDA device current when the init is
// called (ncclCommInitAll: devlist's). An init that runs later or on another
// thread (a group's at ncclGroupEnd, a nonblocking one) runs with the
// context that was current at the call, or with that device's primary
// context; without CUDA, or without such a context, as before.
class InitContext {
 public:
  static InitContext callers() {
    cuda::Driver* driver = cuda::Driver::inUse();
    if (driver == nullptr) return {};
    Result<cuda::ContextHandle> current = driver->currentContext();
    return current.isOk() ? InitContext(driver, current.value()) : InitContext();
  }
  static InitContext ofDevice(int device) {
    cuda::Driver* driver = cuda::Driver::inUse();
    if (driver == nullptr) return {};
    Result<cuda::ContextHandle> primary = driver->primaryContextOfDevice(device);
    return primary.isOk() ? InitContext(driver, primary.value()) : InitContext();
  }
  static InitContext of(cuda::ContextHandle context) {
    cuda::Driver* driver = cuda::Driver::inUse();
    return driver != nullptr ? InitContext(driver, context) : InitContext();
  }
  // Runs the handle's init work with the context current on this thread.
  Status run(const std::shared_ptr<ncclComm::Shared>& shared, const InitWork& work) const {
    cuda::ContextScope scope(driver_, context_);
    return runInit(shared, work);
  }

 private:
  InitContext() = default;
  InitContext(cuda::Driver* driver, cuda::ContextHandle context) : driver_(driver), context_(context) {}
  cuda::Driver* driver_ = nullptr;
  cuda::ContextHandle context_ = nullptr;
};

}  // namespace

namespace shoal::api {
// Blocking: run now. Group: defer to ncclGroupEnd. Nonblocking: run on a
// thread and return ncclInProgress. *out is valid in every case but an
// immediate failure.
Status launchInit(ncclComm_t* out, ncclComm_t handle, bool blocking, InitWork work, const void* parent,
                  cuda::ContextHandle contextOf) {
  auto shared = handle->shared;
  const InitContext context = contextOf != nullptr ? InitContext::of(contextOf) : InitContext::callers();
  if (group::active()) {
    *out = handle;
    auto run = [shared, work, context] { return context.run(shared, work); };
    // The group failed before the work ran: the handle reports why.
    auto abandon = [shared](const Status& why) {
      std::lock_guard<std::mutex> lock(shared->mutex);
      recordInitFailure(*shared, why);
    };
    if (parent && blocking) {
      group::addOrderedInit(parent, std::move(run), std::move(abandon));
    } else if (!blocking) {
      // A nonblocking init or split starts at the outermost end on its
      // handle's own thread, and the end returns ncclInProgress (a split's
      // turn keeps it in call order with its parent's other set-up calls).
      group::addDetachedInit([handle, shared, work, context, split = parent != nullptr] {
        // Not for a handle destroyed or aborted before the group ended. A
        // split gives up its turn among the parent's set-up calls as a
        // cancelled one does: the later ones fail rather than pair with the
        // wrong exchanges.
        if (!handle->stillHolds(shared)) {
          if (split) (void)work(&api::kAlreadyCancelled);
          return;
        }
        handle->initThread = std::thread([shared, work, context] {
          markLibraryThread();
          (void)context.run(shared, work);
        });
      }, std::move(abandon));
    } else {
      group::addInit(std::move(run), std::move(abandon));
    }
    return Status::ok();
  }
  if (!blocking) {
    *out = handle;
    handle->initThread = std::thread([shared, work, context] {
      markLibraryThread();
      (void)context.run(shared, work);
    });
    return Status(Code::kInProgress, "");
  }
  Status st = context.run(shared, work);
  if (!st.isOk()) {
    api::releaseHandle(handle);
    *out = nullptr;
    return st;
  }
  *out = handle;
  return st;
}


Result<std::shared_ptr<Communicator>> initFromId(const UniqueIdContents& id, int nranks, int rank,
                                                 const CommOptions& options, const std::atomic<bool>* cancel,
                                                 ncclComm::Shared& shared, std::shared_ptr<Store> store) {
  Deadline deadline = Deadline::afterMs(params().initTimeoutMs).cancelledBy(cancel);
  if (rank == 0) {
    SHOAL_TRY(startRootIfNeeded(id));
  }
  if (!store) {
    SHOAL_ASSIGN_OR_RETURN(store, connectStore(id, deadline),
      "rank ", rank, ": connecting to the bootstrap root ", id.address);
  }
  InitRequest req;
  req.store = store;
  req.scope = scopeForId(id);
  req.sharedScope = isSharedId(id);
  req.secret.assign(reinterpret_cast<const char*>(id.secret), sizeof(id.secret));
  req.rank = rank;
  req.nranks = nranks;
  req.options = options;
  req.cancel = cancel;
  shared.store = std::move(store);
  shared.secret = req.secret;
  auto comm = std::make_shared<Communicator>(std::move(req));
  SHOAL_TRY(comm->initialize());
  return comm;
}

}  // namespace shoal::api

namespace {

Status initRank(ncclComm_t* newcomm, int nranks, const ncclUniqueId& commId, int rank,
                ncclConfig_t* config) {
  logVersionOnce();
  if (newcomm == nullptr) return invalidArgument("newcomm is NULL");
  *newcomm = nullptr;
  if (nranks < 1) return invalidArgument("nranks ", nranks, " must be >= 1");
  if (rank < 0 || rank >= nranks)
    return invalidArgument("rank ", rank, " is out of range for nranks ", nranks);
  SHOAL_ASSIGN_OR_RETURN(CommOptions options, api::parseConfig(config));
  SHOAL_ASSIGN_OR_RETURN(UniqueIdContents id, decodeUniqueId(commId.internal),
      "ncclUniqueId was not made by ncclGetUniqueId");
  ncclComm_t handle = newHandle();
  auto work = [id, nranks, rank, options, shared = handle->shared](const std::atomic<bool>* cancel) {
    return api::initFromId(id, nranks, rank, options, cancel, *shared);
  };
  return launchInit(newcomm, handle, options.blocking, std::move(work));
}

}  // namespace

SHOAL_API(ncclResult_t, ncclGetVersion, (int* version)) {
  return guard("ncclGetVersion", [&]() -> Status {
    if (!version) return invalidArgument("version is NULL");
    *version = NCCL_VERSION_CODE;
    return Status::ok();
  });
}

SHOAL_API(ncclResult_t, ncclGetUniqueId, (ncclUniqueId * uniqueId)) {
  return guard("ncclGetUniqueId", [&]() -> Status {
    logVersionOnce();
    if (!uniqueId) return invalidArgument("uniqueId is NULL");
    SHOAL_ASSIGN_OR_RETURN(UniqueIdContents id, createUniqueId());
    std::memset(uniqueId->internal, 0, sizeof(uniqueId->internal));
    encodeUniqueId(id, uniqueId->internal);
    SHOAL_INFO(subsys::kBootstrap, "bootstrap root at ", id.address);
    return Status::ok();
  });
}

SHOAL_API(ncclResult_t, ncclCommInitRank,
          (ncclComm_t * comm, int nranks, ncclUniqueId commId, int rank)) {
  return groupGuard("ncclCommInitRank", [&] { return initRank(comm, nranks, commId, rank, nullptr); });
}

SHOAL_API(ncclResult_t, ncclCommInitRankConfig,
          (ncclComm_t * comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t* config)) {
  return groupGuard("ncclCommInitRankConfig",
               [&] { return initRank(comm, nranks, commId, rank, config); });
}

SHOAL_API(ncclResult_t, ncclCommInitRankScalable,
          (ncclComm_t * newcomm, int nranks, int myrank, int nId, ncclUniqueId* commIds,
           ncclConfig_t* config)) {
  return groupGuard("ncclCommInitRankScalable", [&]() -> Status {
    if (nId < 1 || commIds == nullptr)
      return invalidArgument("nId ", nId, " must be >= 1 with a non-NULL commIds array");
    if (nId > nranks)  // as NCCL: at most one root per rank
      return invalidArgument("nId ", nId, " must not exceed nranks ", nranks);
    // Every rank holds all nId ids; the first one's root serves the whole
    // communicator (one store scales to the rank counts Shoal targets).
    return initRank(newcomm, nranks, commIds[0], myrank, config);
  });
}

SHOAL_API(ncclResult_t, ncclCommInitAll, (ncclComm_t * comms, int ndev, const int* devlist)) {
  return guard("ncclCommInitAll", [&]() -> Status {
    logVersionOnce();
    if (comms == nullptr) return invalidArgument("comms is NULL");
    if (ndev < 1) return invalidArgument("ndev ", ndev, " must be >= 1");
    // Entry by entry, as NCCL: a device must exist (in a process that uses
    // CUDA; on host memory alone devices only label the communicators), and
    // may repeat (several ranks on one GPU, docs/cuda.md) unless
    // NCCL_MULTI_RANK_GPU_ENABLE=0, which refuses it as NCCL 2.30 does
    // unless that is 1.
    cuda::Driver* driver = cuda::Driver::inUse();
    std::set<int> seen;
    for (int i = 0; i < ndev; ++i) {
      const int device = devlist ? devlist[i] : i;
      if (driver != nullptr)
        if (Result<cuda::ContextHandle> context = driver->primaryContextOfDevice(device); !context.isOk())
          return invalidArgument("ncclCommInitAll: invalid device ", device, " (", context.status().message(), ")");
      if (!seen.insert(device).second && params().multiRankGpu == 0)
        return invalidUsage("ncclCommInitAll: device ", device, " appears twice in devlist, and "
                            "NCCL_MULTI_RANK_GPU_ENABLE=0 refuses several ranks per GPU (unset or 1 allows them)");
    }
    // NCCL gives each rank the default config, which the environment
    // overrides (NCCL_COMM_BLOCKING=0 makes them nonblocking); the call
    // itself returns once every rank is ready.
    SHOAL_ASSIGN_OR_RETURN(const CommOptions options, api::parseConfig(nullptr));
    auto store = makeMemoryStore();
    uint64_t nonce = localProcessId() ^ reinterpret_cast<uintptr_t>(comms) ^ nowNs();
    std::string scope = str("all", nonce);
    std::vector<ncclComm_t> handles(ndev);
    std::vector<std::thread> threads;
    std::vector<Status> results(ndev);
    for (int i = 0; i < ndev; ++i) {
      handles[i] = newHandle();
      handles[i]->cudaDev = devlist ? devlist[i] : i;
      handles[i]->shared->store = store;
      handles[i]->shared->secret = scope;
    }
    for (int i = 0; i < ndev; ++i) {
      threads.emplace_back([&, i, context = InitContext::ofDevice(handles[i]->cudaDev)] {
        markLibraryThread();
        // No handle is visible until all are done: nothing can cancel these.
        auto work = [&, i](const std::atomic<bool>*) -> Result<std::shared_ptr<Communicator>> {
          InitRequest req;
          req.store = store;
          req.scope = scope;
          req.secret = scope;
          req.rank = i;
          req.nranks = ndev;
          req.options = options;
          auto comm = std::make_shared<Communicator>(std::move(req));
          SHOAL_TRY(comm->initialize());
          return comm;
        };
        results[i] = context.run(handles[i]->shared, work);
      });
    }
    for (auto& t : threads) t.join();
    for (int i = 0; i < ndev; ++i)
      if (!results[i].isOk()) {
        for (auto* h : handles) api::releaseHandle(h);
        return results[i];
      }
    for (int i = 0; i < ndev; ++i) comms[i] = handles[i];
    return Status::ok();
  });
}

namespace {
// A split of a nonblocking parent in which this rank gets no communicator:
// as NCCL, whose split job belongs to the parent, the call (or the
// outermost ncclGroupEnd) returns ncclInProgress, and the parent's
// ncclCommGetAsyncError reads ncclInProgress until this rank's part of the
// exchange has run, on a thread the parent's handle keeps (so one thread can
// drive the splits of several ranks); a failure becomes the parent's error,
// since nothing else could report it. ncclCommAbort of the parent ends it.
Status startNocolorPart(ncclComm_t comm, const std::shared_ptr<Communicator>& parent, int key,
                        const CommOptions& options, Communicator::SetupTurn turn) {
  std::shared_ptr<ncclComm::Shared> shared = comm->shared;
  auto takePart = [parent, key, options, turn, weak = std::weak_ptr<ncclComm::Shared>(shared)](
                      const std::atomic<bool>* cancel) {
    Status st = parent->split(NCCL_SPLIT_NOCOLOR, key, options, cancel, turn).takeStatus();
    if (st.isOk() || cancel->load()) return;
    parent->setAsyncError(st);
    if (auto state = weak.lock()) {
      std::lock_guard<std::mutex> lock(state->mutex);
      if (state->partError.isOk()) state->partError = st;
    }
  };
  if (!group::active()) {
    shared->startPart(shared, std::move(takePart));
    return Status(Code::kInProgress, "");
  }
  group::addDetachedInit([comm, shared, takePart] {
    // Not for a parent destroyed or aborted before the group ended: its
    // part gives up its turn as a cancelled split's does (the later set-up
    // calls fail rather than pair with the wrong exchanges).
    if (!comm->stillHolds(shared)) {
      takePart(&api::kAlreadyCancelled);
      return;
    }
    shared->startPart(shared, takePart);
  });
  return Status::ok();
}
}  // namespace

SHOAL_API(ncclResult_t, ncclCommSplit,
          (ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config)) {
  return groupGuard("ncclCommSplit", [&]() -> Status {
    if (newcomm == nullptr) return invalidArgument("newcomm is NULL");
    *newcomm = nullptr;
    if (color < NCCL_SPLIT_NOCOLOR)
      return invalidArgument("color ", color, " must be >= 0 or NCCL_SPLIT_NOCOLOR");
    SHOAL_ASSIGN_OR_RETURN(auto parent, api::readyOrRevokedComm(comm));
    CommOptions options = parent->options();
    if (config) {
      SHOAL_ASSIGN_OR_RETURN(options, api::parseConfig(config));
    }
    // Splits meet over the parent's bootstrap in call order, whichever thread
    // runs them (a nonblocking one runs on its own): its turn is taken now.
    Communicator::SetupTurn turn = parent->takeSetupTurn();
    if (color == NCCL_SPLIT_NOCOLOR) {
      // Still a collective over the parent: take part, get no communicator.
      // NCCL reads no config here: the parent's mode decides.
      if (parent->options().blocking) {
        auto takePart = [parent, color, key, options, turn] {
          return parent->split(color, key, options, nullptr, turn).takeStatus();
        };
        if (group::active()) {
          group::addOrderedInit(parent.get(), std::move(takePart));
          return Status::ok();
        }
        return takePart();
      }
      return startNocolorPart(comm, parent, key, options, std::move(turn));
    }
    ncclComm_t handle = newHandle();
    handle->cudaDev = comm->cudaDev;
    handle->shared->store = comm->shared->store;  // the child meets in the parent's store
    handle->shared->secret = comm->shared->secret;
    auto work = [parent, color, key, options, turn](const std::atomic<bool>* cancel) {
      return parent->split(color, key, options, cancel, turn);
    };
    return launchInit(newcomm, handle, options.blocking && parent->options().blocking,
                      std::move(work), parent.get(), parent->cudaContext());
  });
}

SHOAL_API(ncclResult_t, ncclCommFinalize, (ncclComm_t comm)) {
  return groupGuard("ncclCommFinalize", [&]() -> Status {
    if (comm == nullptr) return Status::ok();  // as NCCL: nothing to finalize
    SHOAL_ASSIGN_OR_RETURN(auto impl, api::readyComm(comm));
    if (comm->shared->finalized.exchange(true, std::memory_order_acq_rel))
      return invalidArgument("ncclCommFinalize was already called on ", impl->describe());
    if (!impl->options().blocking) {
      // Nonblocking: flushing continues in the background; poll GetAsyncError.
      Code state = impl->asyncState();
      return state == Code::kInProgress ? Status(Code::kInProgress, "") : impl->asyncError();
    }
    return impl->finalize();
  });
}

SHOAL_API(ncclResult_t, ncclCommDestroy, (ncclComm_t comm)) {
  return guard("ncclCommDestroy", [&]() -> Status {
    if (comm == nullptr) return Status::ok();
    if (comm->magic != ncclComm::kMagic) return api::deadHandle(comm);
    // As NCCL (its ncclCommEnsureReady): set-up still running is not waited
    // for, which could take the set-up deadline (10 minutes) when a peer
    // never comes; the caller polls ncclCommGetAsyncError until it ends, or
    // aborts, which cancels it.
    const bool initializing = comm->shared->state.load(std::memory_order_acquire) == ncclInProgress;
    if (initializing || comm->shared->partsRunning.load(std::memory_order_acquire) > 0)
      return invalidArgument("ncclCommDestroy: ", static_cast<const void*>(comm), " is still ",
                             initializing ? "initializing" : "taking part in a nonblocking ncclCommSplit",
                             group::active() ? " (an init in an open group runs at its ncclGroupEnd)" : "",
                             ": poll ncclCommGetAsyncError until it is no longer ncclInProgress, or "
                             "use ncclCommAbort, which cancels it");
    if (comm->initThread.joinable()) comm->initThread.join();  // ended: joins at once
    comm->shared->closeParts();
    Status st;
    if (auto impl = comm->shared->impl; impl && !impl->aborted()) st = impl->finalize();
    // NCCL forbids using a communicator while destroying it, and nothing
    // tells such a call to leave; one still inside keeps the memory it uses.
    if (!api::waitForCalls(*comm, Deadline::afterMs(kDestroyCallsLeaveMs))) {
      leakBusyHandle(comm, "ncclCommDestroy", kDestroyCallsLeaveMs);
      return st;
    }
    api::releaseHandle(comm);
    return st;
  });
}

SHOAL_API(ncclResult_t, ncclCommAbort, (ncclComm_t comm)) {
  return guard("ncclCommAbort", [&]() -> Status {
    if (comm == nullptr) return Status::ok();
    if (comm->magic != ncclComm::kMagic) return api::deadHandle(comm);
    // A pending init (or a part in a nonblocking NOCOLOR split) gives up
    // within about Deadline::kCancelCheckMs; its thread is joined, never
    // left running past the handle (a thread still in the library when the
    // process exits can crash its static teardown).
    comm->shared->cancelInit.store(true);
    if (comm->initThread.joinable()) comm->initThread.join();
    comm->shared->closeParts();
    std::shared_ptr<Communicator> impl;
    {
      std::lock_guard<std::mutex> lock(comm->shared->mutex);
      impl = comm->shared->impl;
    }
    if (impl) impl->abort();
    // A call still inside on another thread (a watchdog aborting a hung
    // collective) sees the abort flag and returns; wait for it to leave.
    if (!api::waitForCalls(*comm, Deadline::afterMs(kCallsLeaveMs))) {
      leakBusyHandle(comm, "ncclCommAbort", kCallsLeaveMs);
      return Status::ok();
    }
    api::releaseHandle(comm);
    return Status::ok();
  });
}

SHOAL_API(ncclResult_t, ncclCommGetAsyncError, (ncclComm_t comm, ncclResult_t* asyncError)) {
  return guard("ncclCommGetAsyncError", [&]() -> Status {
    if (asyncError == nullptr) return invalidArgument("asyncError is NULL");
    if (comm == nullptr || comm->magic != ncclComm::kMagic) return api::deadHandle(comm);
    int state = comm->shared->state.load(std::memory_order_acquire);
    if (state != ncclSuccess) {
      *asyncError = static_cast<ncclResult_t>(state);
      if (state != ncclInProgress) {
        std::lock_guard<std::mutex> lock(comm->shared->mutex);
        api::setLastError(comm->shared->initError);
      }
      return Status::ok();
    }
    if (comm->shared->revoked.load(std::memory_order_acquire)) {
      // Revoked: in progress while a call on another thread is still inside,
      // then the error from before the revoke, if any (the revoke's own
      // abort is none).
      Status before;
      {
        std::lock_guard<std::mutex> lock(comm->shared->mutex);
        before = comm->shared->errorBeforeRevoke.isOk() ? comm->shared->partError : comm->shared->errorBeforeRevoke;
      }
      if (!before.isOk()) api::setLastError(before);
      *asyncError = comm->shared->callsInside.load(std::memory_order_acquire) > 0 ||
                            comm->shared->partsRunning.load(std::memory_order_acquire) > 0
                        ? ncclInProgress
                        : static_cast<ncclResult_t>(toNcclCode(before.code()));
      return Status::ok();
    }
    Code code = comm->shared->impl->asyncState();
    if (code == Code::kOk && comm->shared->partsRunning.load(std::memory_order_acquire) > 0)
      code = Code::kInProgress;  // a nonblocking NOCOLOR split's part (startNocolorPart)
    if (code != Code::kOk && code != Code::kInProgress)
      api::setLastError(comm->shared->impl->asyncError());
    *asyncError = static_cast<ncclResult_t>(toNcclCode(code));
    return Status::ok();
  });
}

SHOAL_API(ncclResult_t, ncclCommCount, (const ncclComm_t comm, int* count)) {
  return guard("ncclCommCount", [&]() -> Status {
    if (count == nullptr) return invalidArgument("count is NULL");
    SHOAL_ASSIGN_OR_RETURN(auto impl, api::readyOrRevokedComm(comm));
    *count = impl->nranks();
    return Status::ok();
  });
}

SHOAL_API(ncclResult_t, ncclCommUserRank, (const ncclComm_t comm, int* rank)) {
  return guard("ncclCommUserRank", [&]() -> Status {
    if (rank == nullptr) return invalidArgument("rank is NULL");
    SHOAL_ASSIGN_OR_RETURN(auto impl, api::readyOrRevokedComm(comm));
    *rank = impl->rank();
    return Status::ok();
  });
}

SHOAL_API(ncclResult_t, ncclCommCuDevice, (const ncclComm_t comm, int* device)) {
  return guard("ncclCommCuDevice", [&]() -> Status {
    if (device == nullptr) return invalidArgument("device is NULL");
    SHOAL_ASSIGN_OR_RETURN(auto impl, api::readyOrRevokedComm(comm));
    // The device current when the communicator was made, where CUDA is in
    // use; otherwise the device it was created for (ncclCommInitAll's list).
    *device = impl->cudaDevice() >= 0 ? impl->cudaDevice() : comm->cudaDev;
    return Status::ok();
  });
}

SHOAL_API(const char*, ncclGetErrorString, (ncclResult_t result)) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    case ncclTimeout: return "timeout";
    default: return "unknown result code";
  }
}

namespace shoal::api {
std::string lastError();
}

SHOAL_API(const char*, ncclGetLastError, (ncclComm_t comm)) {
  // NCCL ignores comm and returns the process's last error; each thread gets a
  // stable copy so another thread's error cannot free the string under it.
  thread_local std::string copy;
  copy = shoal::api::lastError();
  return copy.c_str();
}

SHOAL_API(void, ncclResetDebugInit, ()) {
  reloadParams();
  resetLogConfig();
}
