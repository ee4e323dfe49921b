// Elastic communicators: ncclCommRevoke, ncclCommShrink, ncclCommGetUniqueId
// and ncclCommGrow (docs/nccl-compat.md, "Elastic communicators").
//
// Shrink and grow make a new communicator as init does (a Communicator on a
// scope of a store), so the parent's connections are never needed: the
// survivors of a shrink meet in the parent's store under a prefix derived
// from the parent's id and a shrink count (bootstrap/survivors.h), which
// works whether the excluded ranks are alive or dead, as long as the store's
// root (the process that made the unique id) is alive. A grow meets in the
// store of a fresh unique id made by ncclCommGetUniqueId on the coordinating
// rank; the other existing ranks learn it through the parent's store.
#include <algorithm>
#include <cstring>
#include <optional>

#include "api/api_guard.h"
#include "api/config.h"
#include "bootstrap/survivors.h"
#include "core/log.h"
#include "core/params.h"

using namespace shoal;
using shoal::api::guard;
using shoal::api::groupGuard;

namespace {

// How long a blocking ncclCommRevoke waits for a call on another thread (a
// collective the revoke stops) to leave the communicator.
constexpr int64_t kRevokeWaitMs = 10000;

std::string elasticPrefix(const Communicator& parent, const char* what, uint64_t count) {
  return str("e", parent.idHex(), "/", what, count);
}

Status needStore(const ncclComm_t comm, const Communicator& impl, const char* function) {
  if (!comm->shared->store)
    return invalidUsage(function, ": ", impl.describe(), " has no bootstrap store to meet in");
  return Status::ok();
}

// Stops every operation of the communicator and leaves it revoked:
// collectives are refused; destroy, split and shrink still work (a shrink
// that failed can be tried again). The async error it had stays visible.
void revokeAndAbort(ncclComm::Shared& shared, Communicator& impl) {
  {
    std::lock_guard<std::mutex> lock(shared.mutex);
    if (!shared.revoked.load(std::memory_order_acquire)) {
      shared.errorBeforeRevoke = impl.asyncError();
      shared.revoked.store(true, std::memory_order_release);
    }
  }
  impl.abort();
}

}  // namespace

SHOAL_API(ncclResult_t, ncclCommRevoke, (ncclComm_t comm, int revokeFlags)) {
  return guard("ncclCommRevoke", [&]() -> Status {
    if (comm == nullptr) return Status::ok();  // as NCCL: nothing to revoke
    if (comm->magic != ncclComm::kMagic) return api::deadHandle(comm);
    if (revokeFlags != NCCL_REVOKE_DEFAULT)
      return invalidArgument("revokeFlags ", revokeFlags, " is not NCCL_REVOKE_DEFAULT (0), the only flag");
    if (comm->shared->revoked.load())
      return invalidArgument("communicator ", static_cast<void*>(comm), " was already revoked");
    SHOAL_ASSIGN_OR_RETURN(auto impl, api::readyComm(comm));
    if (comm->shared->finalized.load(std::memory_order_acquire))
      return invalidArgument(impl->describe(), ": ncclCommFinalize was called; it cannot be revoked");
    // The abort flag stops every operation of this communicator, in the
    // engine and on a thread that runs one inline; the connections and the
    // rest stay until destroy. Revoke is local: peers learn of it only as
    // their own operations with this rank fail.
    revokeAndAbort(*comm->shared, *impl);
    SHOAL_INFO(subsys::kInit, impl->describe(), ": revoked");
    if (!impl->options().blocking) {
      // A call on another thread may still be inside: in progress until it
      // leaves (ncclCommGetAsyncError).
      if (comm->shared->callsInside.load(std::memory_order_acquire) > 0) return Status(Code::kInProgress, "");
      return Status::ok();
    }
    if (!api::waitForCalls(*comm, Deadline::afterMs(kRevokeWaitMs)))
      return internalError(impl->describe(), ": revoked, but a call on another thread is still inside after ",
                           kRevokeWaitMs, " ms");
    return Status::ok();
  });
}

SHOAL_API(ncclResult_t, ncclCommShrink,
          (ncclComm_t comm, int* excludeRanksList, int excludeRanksCount, ncclComm_t* newcomm,
           ncclConfig_t* config, int shrinkFlags)) {
  return groupGuard("ncclCommShrink", [&]() -> Status {
    if (comm == nullptr) return invalidArgument("comm is NULL");
    if (newcomm == nullptr) return invalidArgument("newcomm is NULL");
    *newcomm = nullptr;
    SHOAL_ASSIGN_OR_RETURN(auto parent, api::readyOrRevokedComm(comm));
    if (shrinkFlags != NCCL_SHRINK_DEFAULT && shrinkFlags != NCCL_SHRINK_ABORT)
      return invalidArgument("shrinkFlags ", shrinkFlags,
                             " is neither NCCL_SHRINK_DEFAULT (0) nor NCCL_SHRINK_ABORT (1)");
    if (excludeRanksCount < 0)
      return invalidArgument("excludeRanksCount ", excludeRanksCount, " is negative");
    if (excludeRanksCount > 0 && excludeRanksList == nullptr)
      return invalidArgument("excludeRanksList is NULL with excludeRanksCount ", excludeRanksCount);
    std::vector<int> excluded(excludeRanksList, excludeRanksList + excludeRanksCount);
    std::sort(excluded.begin(), excluded.end());
    for (size_t i = 0; i < excluded.size(); ++i) {
      if (excluded[i] < 0 || excluded[i] >= parent->nranks())
        return invalidArgument("excludeRanksList names rank ", excluded[i], ", out of range for ",
                               parent->nranks(), " ranks");
      if (i > 0 && excluded[i] == excluded[i - 1])
        return invalidArgument("excludeRanksList names rank ", excluded[i], " twice");
    }
    if (std::binary_search(excluded.begin(), excluded.end(), parent->rank()))
      return invalidUsage("rank ", parent->rank(),
                          " is in its own excludeRanksList: only the surviving ranks call ncclCommShrink");
    SHOAL_TRY(needStore(comm, *parent, "ncclCommShrink"));
    CommOptions options = parent->options();
    if (config) {
      SHOAL_ASSIGN_OR_RETURN(options, api::parseConfig(config));
    }
    const bool abortFirst = shrinkFlags == NCCL_SHRINK_ABORT;
    // Outstanding operations may wait on the excluded ranks forever: stop
    // them first (the parent is then only good for destroy). At the call,
    // but in a group when it runs: a group that fails runs none of it.
    const bool abortWhenRun = abortFirst && group::active();
    // The parent is left revoked, not merely aborted: NCCL clears its abort
    // flags once the operations stopped, so a shrink that failed (a
    // survivor that never comes) can be tried again on it.
    std::shared_ptr<ncclComm::Shared> shared = comm->shared;
    if (abortFirst && !abortWhenRun) revokeAndAbort(*shared, *parent);
    if (!abortFirst && !parent->aborted() && parent->asyncState() == Code::kInProgress) {
      return invalidUsage(parent->describe(),
                          " has operations in flight: NCCL_SHRINK_DEFAULT needs none (wait for them, or "
                          "pass NCCL_SHRINK_ABORT)");
    }
    auto store = comm->shared->store;
    // Shrinks that left this rank out (alive) took counts it never did.
    uint64_t count = comm->shared->shrinks;
    while (excludedFromShrink(*store, elasticPrefix(*parent, "shrink", count), parent->rank(),
                              Deadline::afterMs(Bootstrap::kLeaveMs)))
      ++count;
    comm->shared->shrinks = count + 1;
    const std::string prefix = elasticPrefix(*parent, "shrink", count);
    std::string secret = comm->shared->secret;
    ncclComm_t handle = api::newHandle();
    handle->cudaDev = comm->cudaDev;
    handle->shared->store = store;
    handle->shared->secret = secret;
    auto work = [parent, shared, store, secret, prefix, excluded, options,
                 abortWhenRun](const std::atomic<bool>* cancel) -> Result<std::shared_ptr<Communicator>> {
      if (abortWhenRun) revokeAndAbort(*shared, *parent);
      Deadline deadline = Deadline::afterMs(params().initTimeoutMs).cancelledBy(cancel);
      std::vector<std::string> goneKeys;
      for (int r = 0; r < parent->nranks(); ++r) goneKeys.push_back(parent->goneKey(r));
      Result<SurvivorAgreement> agreement =
          agreeOnSurvivors(*store, prefix, parent->rank(), parent->nranks(), excluded, goneKeys, deadline);
      // A failed agreement keeps this rank's list: the others may not have
      // read it yet, and it is what tells them they disagree.
      if (!agreement.isOk()) return StatusBuilder(agreement.takeStatus()) << parent->describe();
      const SurvivorAgreement& agreed = agreement.value();
      InitRequest req;
      req.store = store;
      req.scope = agreed.scope;
      req.secret = secret;
      req.rank = agreed.newRank;
      req.nranks = static_cast<int>(agreed.survivors.size());
      req.options = options;
      req.cancel = cancel;
      auto child = std::make_shared<Communicator>(std::move(req));
      SHOAL_TRY(child->initialize()) << parent->describe() << ": shrink excluding " << rankListText(excluded);
      forgetSurvivorList(*store, prefix, parent->rank());
      SHOAL_INFO(subsys::kInit, parent->describe(), ": shrunk without ranks ", rankListText(excluded), " to ",
                 child->describe());
      return child;
    };
    return api::launchInit(newcomm, handle, options.blocking && parent->options().blocking, std::move(work),
                           nullptr, parent->cudaContext());
  });
}

SHOAL_API(ncclResult_t, ncclCommGetUniqueId, (ncclComm_t comm, ncclUniqueId* uniqueId)) {
  return guard("ncclCommGetUniqueId", [&]() -> Status {
    if (comm == nullptr) return invalidArgument("comm is NULL");
    if (uniqueId == nullptr) return invalidArgument("uniqueId is NULL");
    SHOAL_ASSIGN_OR_RETURN(auto impl, api::readyComm(comm));
    // A fresh id whose root lives in this process, as ncclGetUniqueId's: the
    // grown communicator meets there, so it needs none of the parent's
    // bootstrap (its root may have been on a rank since excluded).
    SHOAL_ASSIGN_OR_RETURN(UniqueIdContents id, createUniqueId(), impl->describe());
    std::memset(uniqueId->internal, 0, sizeof(uniqueId->internal));
    encodeUniqueId(id, uniqueId->internal);
    SHOAL_INFO(subsys::kBootstrap, impl->describe(), ": grow id, bootstrap root at ", id.address);
    return Status::ok();
  });
}

namespace {
// ncclCommGrow past the checks NCCL makes before joining a group.
Status grow(ncclComm_t comm, int nRanks, const ncclUniqueId* uniqueId, int rank, ncclComm_t* newcomm,
            ncclConfig_t* config) {
  if (comm == nullptr) {
    // A new rank: the id from the coordinator's ncclCommGetUniqueId and a
    // rank number after the existing ones.
    if (uniqueId == nullptr)
      return invalidArgument("a new rank (comm NULL) must pass the unique id from ncclCommGetUniqueId");
    if (rank < 0 || rank >= nRanks)
      return invalidArgument("rank ", rank, " is out of range for nRanks ", nRanks);
    SHOAL_ASSIGN_OR_RETURN(CommOptions options, api::parseConfig(config));
    SHOAL_ASSIGN_OR_RETURN(UniqueIdContents id, decodeUniqueId(uniqueId->internal),
                           "ncclUniqueId was not made by ncclCommGetUniqueId");
    ncclComm_t handle = api::newHandle();
    auto work = [id, nRanks, rank, options, shared = handle->shared](const std::atomic<bool>* cancel)
        -> Result<std::shared_ptr<Communicator>> {
      Deadline deadline = Deadline::afterMs(params().initTimeoutMs).cancelledBy(cancel);
      // The coordinator says how many ranks exist: a new rank must not
      // claim one of their numbers.
      SHOAL_ASSIGN_OR_RETURN(auto store, connectStore(id, deadline),
                             "new rank ", rank, ": connecting to the grow root ", id.address);
      SHOAL_ASSIGN_OR_RETURN(auto base, store->get({api::scopeForId(id) + "/grow-base"}, deadline),
                             "new rank ", rank, ": waiting for the coordinator's ncclCommGrow");
      const int existing = std::atoi(base[0].c_str());
      if (rank < existing)
        return invalidArgument("new rank ", rank, " is the number of an existing rank: new ranks take ",
                               existing, "..", nRanks - 1);
      return api::initFromId(id, nRanks, rank, options, cancel, *shared, std::move(store));
    };
    return api::launchInit(newcomm, handle, options.blocking, std::move(work));
  }
  SHOAL_ASSIGN_OR_RETURN(auto parent, api::readyComm(comm));
  if (rank != -1)
    return invalidArgument("rank ", rank, ": existing ranks pass -1 (they keep their numbers)");
  if (nRanks <= parent->nranks())
    return invalidArgument("nRanks ", nRanks, " must exceed the communicator's ", parent->nranks(), " ranks");
  SHOAL_TRY(needStore(comm, *parent, "ncclCommGrow"));
  CommOptions options = parent->options();
  if (config) {
    SHOAL_ASSIGN_OR_RETURN(options, api::parseConfig(config));
  }
  std::optional<UniqueIdContents> coordinatorId;
  if (uniqueId != nullptr) {
    SHOAL_ASSIGN_OR_RETURN(coordinatorId, decodeUniqueId(uniqueId->internal),
                           "ncclUniqueId was not made by ncclCommGetUniqueId");
  }
  const std::string key = elasticPrefix(*parent, "grow", comm->shared->grows++) + "/id";
  auto parentStore = comm->shared->store;
  ncclComm_t handle = api::newHandle();
  handle->cudaDev = comm->cudaDev;
  auto work = [parent, parentStore, key, coordinatorId, nRanks, options, shared = handle->shared](
                  const std::atomic<bool>* cancel) -> Result<std::shared_ptr<Communicator>> {
    Deadline deadline = Deadline::afterMs(params().initTimeoutMs).cancelledBy(cancel);
    UniqueIdContents id;
    std::shared_ptr<Store> growStore;  // held from the first contact to the init
    if (coordinatorId) {
      // The coordinator: tell the existing ranks (through the parent's
      // store) and the new ones (through the new one) what they need.
      id = *coordinatorId;
      char raw[UniqueIdContents::kBytes];
      encodeUniqueId(id, raw);
      SHOAL_TRY(parentStore->set(key, std::string_view(raw, sizeof(raw)), deadline))
          << parent->describe() << ": publishing the grow id";
      SHOAL_ASSIGN_OR_RETURN(growStore, connectStore(id, deadline), parent->describe(),
                             ": connecting to the grow root ", id.address);
      SHOAL_TRY(growStore->set(api::scopeForId(id) + "/grow-base", std::to_string(parent->nranks()), deadline))
          << parent->describe() << ": publishing the number of existing ranks";
    } else {
      SHOAL_ASSIGN_OR_RETURN(auto raw, parentStore->get({key}, deadline), parent->describe(),
                             ": waiting for the coordinator's ncclCommGrow (the rank that passes the id)");
      if (raw[0].size() != UniqueIdContents::kBytes)
        return internalError(parent->describe(), ": malformed grow id in the store");
      SHOAL_ASSIGN_OR_RETURN(id, decodeUniqueId(raw[0].data()), parent->describe(), ": grow id");
    }
    auto child = api::initFromId(id, nRanks, parent->rank(), options, cancel, *shared, std::move(growStore));
    if (child.isOk()) {
      SHOAL_INFO(subsys::kInit, parent->describe(), ": grown to ", child.value()->describe());
      if (coordinatorId) (void)parentStore->erase({key}, Deadline::afterMs(Bootstrap::kLeaveMs));
    }
    return child;
  };
  return api::launchInit(newcomm, handle, options.blocking && parent->options().blocking, std::move(work),
                         nullptr, parent->cudaContext());
}
}  // namespace

SHOAL_API(ncclResult_t, ncclCommGrow,
          (ncclComm_t comm, int nRanks, const ncclUniqueId* uniqueId, int rank,
           ncclComm_t* newcomm, ncclConfig_t* config)) {
  return guard("ncclCommGrow", [&]() -> Status {
    api::logVersionOnce();
    // As NCCL, these before the call joins a group (they do not fail it).
    if (newcomm == nullptr) return invalidArgument("newcomm is NULL");
    *newcomm = nullptr;
    if (nRanks <= 0) return invalidArgument("nRanks ", nRanks, " must be > 0");
    return api::failsGroup("ncclCommGrow", [&] { return grow(comm, nRanks, uniqueId, rank, newcomm, config); });
  });
}

