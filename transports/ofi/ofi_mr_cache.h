// MrCache: memory registrations of one rail, cached by page-aligned range.
//
// Role: gives an operation the local descriptor its provider wants for a
// buffer (FI_MR_LOCAL, FI_MR_HMEM), honouring every mr_mode bit the provider
// kept: FI_MR_ENDPOINT (bind to the endpoint, then enable), FI_MR_PROV_KEY
// (else we choose unique keys), FI_MR_ALLOCATED (only user buffers, which are
// backed), FI_MR_VIRT_ADDR (matters only to RMA, which this transport does
// not use). Registrations are widened to whole pages and reused while they
// cover a buffer; an entry is closed when invalidated (ncclMemFree,
// ncclCommDeregister -> ofiInvalidateRegistrations) and no operation holds
// it, or when the cache is over capacity. Only memory whose end Shoal hears
// of is cached (memory/known_ranges.h); other buffers are registered for one
// operation.
// Owner: its Rail. Thread: under the rail's mutex (Rail::mutex).
//
// Why a cache at all: registering pins pages and costs microseconds to
// milliseconds; collectives reuse the same buffers over and over.
// The hazard, and why only known memory is cached: a buffer freed with free()
// and a new one malloc'ed at the same address would reuse a registration that
// still pins the old pages. A provider's own cache watches frees (memory
// monitors), but cannot drop a registration an application holds; so user
// buffers not from ncclMemAlloc or ncclCommRegister are registered per
// operation and closed after it, which the provider's cache makes cheap.
// Providers that need no registration (tcp;ofi_rxm, shm for host memory)
// never reach this code unless SHOAL_OFI_ALWAYS_REGISTER is set.
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>

#include <cstdint>
#include <map>
#include <utility>

#include "core/status.h"

namespace shoal::ofi {

struct MemoryPlace {
  fi_hmem_iface iface = FI_HMEM_SYSTEM;
  int device = 0;
};

class MrCache {
 public:
  struct Handle {
    fid_mr* mr = nullptr;
    uintptr_t start = 0;
    uintptr_t end = 0;
    uint32_t refs = 0;
    bool stale = false;  // not cached, or invalidated while in use: closed on the last release
  };
  struct Stats {
    uint64_t registrations = 0;  // fi_mr_reg calls that succeeded
    uint64_t hits = 0;
    uint64_t invalidated = 0;
    uint64_t live = 0;           // registrations currently open
    uint64_t perOperation = 0;   // registrations not cached: memory Shoal is not told the end of
  };

  MrCache() = default;
  ~MrCache();
  MrCache(const MrCache&) = delete;
  MrCache& operator=(const MrCache&) = delete;

  void configure(fid_domain* domain, fid_ep* ep, uint64_t mrMode, bool enabled, size_t capacity,
                 const char* (*strerror)(int));
  // A registration covering [data, data + bytes), held until release().
  Result<Handle*> acquire(const void* data, uint64_t bytes, MemoryPlace place);
  void release(Handle* handle);
  // Registers [data, data + bytes) as acquire() would (whole pages, bound
  // under FI_MR_ENDPOINT) and closes the registration at once, caching and
  // counting nothing: whether the provider can register such memory at all
  // (the trial registration of device memory, Rail::open).
  Status tryRegistration(const void* data, uint64_t bytes, MemoryPlace place);
  // Drops every registration overlapping [base, base + bytes); returns how many.
  size_t invalidate(const void* base, size_t bytes);
  const Stats& stats() const { return stats_; }

 private:
  Result<Handle*> registerRange(uintptr_t start, uintptr_t end, MemoryPlace place);
  Result<fid_mr*> openRegistration(uintptr_t start, uintptr_t end, MemoryPlace place);
  void close(Handle* handle);
  void evictIdle();

  fid_domain* domain_ = nullptr;
  fid_ep* ep_ = nullptr;
  uint64_t mrMode_ = 0;
  bool enabled_ = true;
  size_t capacity_ = 1024;
  const char* (*strerror_)(int) = nullptr;
  uint64_t nextKey_ = 1;
  // Cached entries by (start, end); uncached ones live only in their ops.
  std::map<std::pair<uintptr_t, uintptr_t>, Handle*> entries_;
  Stats stats_;
};

}  // namespace shoal::ofi
