// Memory (ncclMemAlloc/Free, ncclCommRegister/Deregister, windows) and Shoal's own
// extensions (include/shoal/shoal.h): version, host streams, state dump.
#include <shoal/shoal.h>

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "api/api_coll.h"
#include "api/api_guard.h"
#include "comm/group.h"
#include "comm/window.h"
#include "cuda/driver.h"
#include "engine/engine.h"
#include "memory/shared_memory.h"
#include "transports/registry.h"

using namespace shoal;
using shoal::api::guard;
using shoal::api::groupGuard;

namespace {

struct Registration {
  static constexpr uint64_t kMagic = 0x73686f616c726567ull;  // "shoalreg"
  uint64_t magic = kMagic;
  ncclComm_t comm;
  void* buff;
  size_t size;
  // ncclCommRegister calls this handle answers (as NCCL: a range within the
  // pages of a live registration of the communicator gets its handle
  // again); the registration ends at the deregistration of the last.
  uint64_t refs = 1;
};

// The pages [begin, end) a range lies in.
std::pair<uintptr_t, uintptr_t> pagesOf(const void* buff, size_t size) {
  static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(buff);
  return {begin & ~(page - 1), (begin + size + page - 1) & ~(page - 1)};
}

std::mutex gRegMutex;
std::unordered_set<Registration*> gRegistrations;

// A live registration of `comm` whose pages hold [buff, buff + size), or
// null (gRegMutex held).
Registration* registrationHolding(ncclComm_t comm, const void* buff, size_t size) {
  if (size == 0) return nullptr;
  const auto [begin, end] = pagesOf(buff, size);
  for (Registration* reg : gRegistrations) {
    if (reg->comm != comm || reg->size == 0) continue;
    const auto [regBegin, regEnd] = pagesOf(reg->buff, reg->size);
    if (regBegin <= begin && end <= regEnd) return reg;
  }
  return nullptr;
}

std::mutex gStreamMutex;
std::unordered_set<api::HostStream*> gStreams;

}  // namespace

namespace shoal::api {

void dropRegistrations(const ncclComm* handle) {
  std::lock_guard<std::mutex> lock(gRegMutex);
  for (auto it = gRegistrations.begin(); it != gRegistrations.end();) {
    Registration* reg = *it;
    if (reg->comm != handle) {
      ++it;
      continue;
    }
    forgetMemory(reg->buff, reg->size);  // the user may free it now
    delete reg;
    it = gRegistrations.erase(it);
  }
}

HostStream* findHostStream(cudaStream_t stream) {
  if (stream == nullptr) return nullptr;
  auto* candidate = reinterpret_cast<HostStream*>(stream);
  std::lock_guard<std::mutex> lock(gStreamMutex);
  return gStreams.count(candidate) ? candidate : nullptr;
}

void registerHostStream(HostStream* stream) {
  std::lock_guard<std::mutex> lock(gStreamMutex);
  gStreams.insert(stream);
}

void unregisterHostStream(HostStream* stream) {
  std::lock_guard<std::mutex> lock(gStreamMutex);
  gStreams.erase(stream);
}

Status HostStream::enqueue(const std::shared_ptr<Communicator>& comm, OpRequest req) {
  SHOAL_ASSIGN_OR_RETURN(JobPtr job, comm->enqueue(std::span<const OpRequest>(&req, 1), /*detached=*/true));
  if (!job) return Status::ok();
  std::lock_guard<std::mutex> lock(mutex_);
  jobs_.push_back({comm, std::move(job)});
  return Status::ok();
}

Status HostStream::synchronize() {
  std::vector<Entry> jobs;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    jobs.swap(jobs_);
  }
  Status first;
  for (auto& e : jobs) {
    Status st = e.comm->waitFor(*e.job);
    if (!st.isOk() && first.isOk()) first = st;
  }
  return first;
}

bool HostStream::idle() {
  std::lock_guard<std::mutex> lock(mutex_);
  Engine::instance().poll();
  for (auto& e : jobs_)
    if (!e.job->isDone()) return false;
  return true;
}

}  // namespace shoal::api

// Host memory that same-host peers can map: peer-reading algorithms read it
// in place instead of copying it through a channel (src/memory).
SHOAL_API(ncclResult_t, ncclMemAlloc, (void** ptr, size_t size)) {
  return guard("ncclMemAlloc", [&]() -> Status {
    if (ptr == nullptr) return invalidArgument("ptr is NULL");
    // As NCCL: in a process that uses CUDA, memory of the current device
    // (cuMem, exportable as a file descriptor), which on a thread with no
    // context current is device 0, as cudaGetDevice says there; host memory
    // that same-host peers may map otherwise (no CUDA, or no device).
    if (cuda::Driver* driver = cuda::Driver::inUse()) {
      SHOAL_ASSIGN_OR_RETURN(std::optional<cuda::DeviceIdentity> device, driver->currentDevice(),
                             "ncclMemAlloc");
      cuda::ContextHandle deviceZero = nullptr;
      if (!device)
        if (Result<cuda::ContextHandle> primary = driver->primaryContextOfDevice(0); primary.isOk())
          deviceZero = primary.value();
      if (device || deviceZero != nullptr) {
        cuda::ContextScope scope(driver, deviceZero);  // nothing when a context is current
        SHOAL_TRY(scope.status()) << "ncclMemAlloc: making device 0's primary context current";
        SHOAL_ASSIGN_OR_RETURN(*ptr, driver->deviceAlloc(size), "ncclMemAlloc of ", size,
                               " bytes on CUDA device ", device ? device->ordinal : 0);
        rememberMemory(*ptr, size);  // ncclMemFree says when it ends
        return Status::ok();
      }
    }
    SHOAL_ASSIGN_OR_RETURN(*ptr, memory::allocateShared(size), "ncclMemAlloc of ", size, " bytes");
    rememberMemory(*ptr, size);
    return Status::ok();
  });
}

SHOAL_API(ncclResult_t, ncclMemFree, (void* ptr)) {
  return guard("ncclMemFree", [&]() -> Status {
    if (ptr == nullptr) return Status::ok();
    if (cuda::Driver* driver = cuda::Driver::inUse()) {
      if (auto allocation = driver->deviceAllocationOf(ptr, 1); allocation && allocation->base == ptr) {
        Windows::retireMemory(ptr, allocation->bytes);  // its address may come back in another allocation
        forgetMemory(ptr, allocation->bytes);
        if (driver->deviceFree(ptr)) return Status::ok();
      }
    }
    if (size_t bytes = memory::allocationBytes(ptr)) {
      Windows::retireMemory(ptr, bytes);
      forgetMemory(ptr, bytes);
    }
    if (!memory::freeShared(ptr))
      return invalidArgument("ncclMemFree: ", ptr, " was not returned by ncclMemAlloc");
    return Status::ok();
  });
}

SHOAL_API(ncclResult_t, ncclCommRegister,
          (const ncclComm_t comm, void* buff, size_t size, void** handle)) {
  return guard("ncclCommRegister", [&]() -> Status {
    if (handle == nullptr) return invalidArgument("handle is NULL");
    if (buff == nullptr && size > 0) return invalidArgument("buff is NULL with size ", size);
    SHOAL_ASSIGN_OR_RETURN(auto impl, api::readyComm(comm));
    std::lock_guard<std::mutex> lock(gRegMutex);
    Registration* reg = registrationHolding(comm, buff, size);
    if (reg != nullptr) {
      ++reg->refs;
      // It covers the bytes of both now (the same pages), known until the end.
      const auto begin = std::min(reinterpret_cast<uintptr_t>(reg->buff), reinterpret_cast<uintptr_t>(buff));
      const auto end = std::max(reinterpret_cast<uintptr_t>(reg->buff) + reg->size,
                                reinterpret_cast<uintptr_t>(buff) + size);
      reg->buff = reinterpret_cast<void*>(begin);
      reg->size = end - begin;
    } else {
      reg = new Registration{Registration::kMagic, comm, buff, size};
      gRegistrations.insert(reg);
    }
    rememberMemory(buff, size);  // until ncclCommDeregister: transports may keep registrations of it
    *handle = reg;
    return Status::ok();
  });
}

SHOAL_API(ncclResult_t, ncclCommDeregister, (const ncclComm_t comm, void* handle)) {
  return guard("ncclCommDeregister", [&]() -> Status {
    // Any live handle, failed or revoked too: its registrations must end
    // before their memory can be freed (a known range left behind would
    // let a transport keep registrations of whatever comes there next).
    if (comm == nullptr || comm->magic != ncclComm::kMagic) return api::deadHandle(comm);
    // As NCCL: a NULL handle (what NCCL's ncclCommRegister returns when it
    // skips registration) is nothing to deregister.
    if (handle == nullptr) return Status::ok();
    auto* reg = static_cast<Registration*>(handle);
    std::lock_guard<std::mutex> lock(gRegMutex);
    // As NCCL ("Could not find handle"): a usage error, not an argument one.
    if (!gRegistrations.count(reg))
      return invalidUsage("ncclCommDeregister: handle ", handle,
                          " is not a live registration (deregistered already, or never registered)");
    if (reg->comm != comm)
      return invalidUsage("ncclCommDeregister: handle ", handle, " was registered on another communicator");
    if (--reg->refs > 0) return Status::ok();  // registered again: the last deregistration ends it
    gRegistrations.erase(reg);
    forgetMemory(reg->buff, reg->size);  // no transport may keep a stale registration
    delete reg;
    return Status::ok();
  });
}

// Symmetric memory windows (comm/window.h). Collective; in a group the
// registration runs at ncclGroupEnd, which fills *win (NULL until then).
SHOAL_API(ncclResult_t, ncclCommWindowRegister,
          (ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win, int winFlags)) {
  return groupGuard("ncclCommWindowRegister", [&]() -> Status {
    if (win == nullptr) return invalidArgument("win is NULL");
    *win = nullptr;
    if (buff == nullptr || size == 0) return invalidArgument("buff ", buff, " with size ", size, ": a window needs memory");
    constexpr int kKnownFlags = NCCL_WIN_COLL_SYMMETRIC | NCCL_WIN_STRICT_ORDERING;
    if ((winFlags & ~kKnownFlags) != 0)
      return invalidArgument("winFlags 0x", std::hex, winFlags, " has bits no NCCL_WIN_* flag names");
    SHOAL_ASSIGN_OR_RETURN(auto impl, api::readyComm(comm));
    // Its turn among the communicator's set-up calls is this call's place.
    auto registerNow = [impl, buff, size, win, winFlags, turn = impl->takeSetupTurn()]() -> Status {
      SHOAL_ASSIGN_OR_RETURN(Window* window, impl->registerWindow(buff, size, winFlags, turn));
      *win = reinterpret_cast<ncclWindow_t>(window);
      return Status::ok();
    };
    if (group::active()) {
      group::addOrderedInit(impl.get(), std::move(registerNow));
      return Status::ok();
    }
    return registerNow();
  });
}

SHOAL_API(ncclResult_t, ncclCommWindowDeregister, (ncclComm_t comm, ncclWindow_t win)) {
  return guard("ncclCommWindowDeregister", [&]() -> Status {
    if (win == nullptr) return Status::ok();  // as NCCL: what a skipped registration returned
    // On a revoked communicator too: its windows must go before their
    // memory is freed.
    SHOAL_ASSIGN_OR_RETURN(auto impl, api::readyOrRevokedComm(comm));
    return impl->deregisterWindow(win);
  });
}

SHOAL_API(ncclResult_t, ncclWinGetUserPtr, (ncclComm_t comm, ncclWindow_t win, void** outUserPtr)) {
  return guard("ncclWinGetUserPtr", [&]() -> Status {
    if (win == nullptr) return invalidArgument("win is NULL");
    if (outUserPtr == nullptr) return invalidArgument("outUserPtr is NULL");
    SHOAL_ASSIGN_OR_RETURN(auto impl, api::readyComm(comm));
    Window* window = impl->findWindow(win);
    if (window == nullptr)
      return invalidUsage("window ", static_cast<void*>(win), " is not a live window of this communicator");
    *outUserPtr = window->userPtr();
    return Status::ok();
  });
}

SHOAL_EXPORT const char* shoalGetVersionString(void) {
  return "shoal " SHOAL_VERSION_STRING " (NCCL 2.30.7 API)";
}

SHOAL_EXPORT ncclResult_t shoalGetVersion(int* major, int* minor, int* patch) {
  return guard("shoalGetVersion", [&]() -> Status {
    if (!major || !minor || !patch) return invalidArgument("NULL output pointer");
    *major = SHOAL_VERSION_MAJOR;
    *minor = SHOAL_VERSION_MINOR;
    *patch = SHOAL_VERSION_PATCH;
    return Status::ok();
  });
}

SHOAL_EXPORT ncclResult_t shoalHostStreamCreate(shoalHostStream_t* s) {
  return guard("shoalHostStreamCreate", [&]() -> Status {
    if (s == nullptr) return invalidArgument("stream is NULL");
    auto* stream = new api::HostStream();
    api::registerHostStream(stream);
    *s = reinterpret_cast<shoalHostStream_t>(stream);
    return Status::ok();
  });
}

namespace {
Result<api::HostStream*> hostStream(shoalHostStream_t s) {
  auto* stream = api::findHostStream(reinterpret_cast<cudaStream_t>(s));
  if (!stream) return invalidArgument("not a live Shoal host stream: ", static_cast<void*>(s));
  return stream;
}
}  // namespace

SHOAL_EXPORT ncclResult_t shoalHostStreamSynchronize(shoalHostStream_t s) {
  return guard("shoalHostStreamSynchronize", [&]() -> Status {
    SHOAL_ASSIGN_OR_RETURN(auto* stream, hostStream(s));
    return stream->synchronize();
  });
}

SHOAL_EXPORT ncclResult_t shoalHostStreamQuery(shoalHostStream_t s) {
  return guard("shoalHostStreamQuery", [&]() -> Status {
    SHOAL_ASSIGN_OR_RETURN(auto* stream, hostStream(s));
    return stream->idle() ? Status::ok() : Status(Code::kInProgress, "");
  });
}

SHOAL_EXPORT ncclResult_t shoalHostStreamDestroy(shoalHostStream_t s) {
  return guard("shoalHostStreamDestroy", [&]() -> Status {
    if (s == nullptr) return Status::ok();  // like ncclCommDestroy(NULL)
    SHOAL_ASSIGN_OR_RETURN(auto* stream, hostStream(s));
    Status st = stream->synchronize();
    api::unregisterHostStream(stream);
    delete stream;
    return st;
  });
}

SHOAL_EXPORT ncclResult_t shoalCommDumpState(ncclComm_t comm, char* buf, size_t len) {
  return guard("shoalCommDumpState", [&]() -> Status {
    if (buf == nullptr || len == 0) return invalidArgument("buf is NULL or len is 0");
    if (comm == nullptr || comm->magic != ncclComm::kMagic) return api::deadHandle(comm);
    std::string text = comm->shared->impl ? comm->shared->impl->dumpState()
                                          : std::string("communicator still initializing\n");
    std::snprintf(buf, len, "%s", text.c_str());
    return Status::ok();
  });
}
