#include "transports/ofi/ofi_mr_cache.h"

#include <unistd.h>

#include <sys/uio.h>


#include "memory/known_ranges.h"

namespace shoal::ofi {
namespace {

uintptr_t pageBytes() {
  static const uintptr_t bytes = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  return bytes;
}

// Cached entries whose start lies at most this many entries below a lookup's
// are examined; beyond that a miss registers anew (correct, merely redundant).
constexpr int kLookBack = 8;

// The whole pages under [data, data + bytes) (at least one).
std::pair<uintptr_t, uintptr_t> pageRange(const void* data, uint64_t bytes) {
  uintptr_t page = pageBytes();
  uintptr_t start = reinterpret_cast<uintptr_t>(data) & ~(page - 1);
  uintptr_t end = (reinterpret_cast<uintptr_t>(data) + bytes + page - 1) & ~(page - 1);
  if (end == start) end = start + page;
  return {start, end};
}

}  // namespace

MrCache::~MrCache() {
  for (auto& [range, handle] : entries_) {
    if (handle->refs == 0) close(handle);
    else handle->stale = true;  // its operations are orphans closed with the endpoint
  }
}

void MrCache::configure(fid_domain* domain, fid_ep* ep, uint64_t mrMode, bool enabled, size_t capacity,
                        const char* (*strerror)(int)) {
  domain_ = domain;
  ep_ = ep;
  mrMode_ = mrMode;
  enabled_ = enabled;
  capacity_ = capacity < 1 ? 1 : capacity;
  strerror_ = strerror;
}

Result<MrCache::Handle*> MrCache::acquire(const void* data, uint64_t bytes, MemoryPlace place) {
  auto [start, end] = pageRange(data, bytes);
  if (enabled_) {
    auto it = entries_.upper_bound({start, UINTPTR_MAX});
    for (int i = 0; i < kLookBack && it != entries_.begin(); ++i) {
      --it;
      Handle* h = it->second;
      if (h->start <= start && end <= h->end) {
        ++h->refs;
        ++stats_.hits;
        return h;
      }
    }
  }
  // Kept only for memory whose end Shoal hears of (memory/known_ranges.h),
  // and then all of it at once, so that the next part of it is a hit: any
  // other buffer may be freed and its address reused unannounced, and a kept
  // registration would still pin the old pages. Those last one operation;
  // the provider's own cache, which watches frees, makes them cheap.
  if (const auto known = enabled_ ? memory::rememberedRangeOf(data, bytes) : std::nullopt) {
    const auto whole = pageRange(reinterpret_cast<const void*>(known->first), known->second - known->first);
    // Registered already (found here even where the look back above was
    // too short): the same registration.
    if (auto found = entries_.find(whole); found != entries_.end()) {
      ++found->second->refs;
      ++stats_.hits;
      return found->second;
    }
    Result<Handle*> handle = registerRange(whole.first, whole.second, place);
    if (handle.isOk()) {
      handle.value()->refs = 1;
      entries_[whole] = handle.value();
      if (entries_.size() > capacity_) evictIdle();
      return handle;
    }
    // The whole of it could not be pinned (RLIMIT_MEMLOCK, say): this
    // operation's pages alone, as for any other buffer.
  }
  SHOAL_ASSIGN_OR_RETURN(Handle* handle, registerRange(start, end, place));
  handle->refs = 1;
  handle->stale = true;  // closed on its last release
  ++stats_.perOperation;
  return handle;
}

void MrCache::release(Handle* handle) {
  if (handle == nullptr) return;
  if (--handle->refs > 0) return;
  if (handle->stale) close(handle);
}

size_t MrCache::invalidate(const void* base, size_t bytes) {
  uintptr_t lo = reinterpret_cast<uintptr_t>(base);
  uintptr_t hi = lo + bytes;
  size_t dropped = 0;
  for (auto it = entries_.begin(); it != entries_.end();) {
    Handle* h = it->second;
    if (h->start < hi && lo < h->end) {
      it = entries_.erase(it);
      ++dropped;
      ++stats_.invalidated;
      if (h->refs == 0) close(h);
      else h->stale = true;
    } else {
      ++it;
    }
  }
  return dropped;
}

Status MrCache::tryRegistration(const void* data, uint64_t bytes, MemoryPlace place) {
  auto [start, end] = pageRange(data, bytes);
  SHOAL_ASSIGN_OR_RETURN(fid_mr* mr, openRegistration(start, end, place));
  fi_close(&mr->fid);
  return Status::ok();
}

Result<MrCache::Handle*> MrCache::registerRange(uintptr_t start, uintptr_t end, MemoryPlace place) {
  SHOAL_ASSIGN_OR_RETURN(fid_mr* mr, openRegistration(start, end, place));
  ++stats_.registrations;
  ++stats_.live;
  return new Handle{mr, start, end, 0, false};
}

Result<fid_mr*> MrCache::openRegistration(uintptr_t start, uintptr_t end, MemoryPlace place) {
  iovec iov{reinterpret_cast<void*>(start), end - start};
  fi_mr_attr attr{};
  attr.mr_iov = &iov;
  attr.iov_count = 1;
  attr.access = FI_SEND | FI_RECV;
  // Without FI_MR_PROV_KEY the application picks keys, unique per domain.
  attr.requested_key = (mrMode_ & FI_MR_PROV_KEY) ? 0 : nextKey_++;
  attr.iface = place.iface;
  if (place.iface == FI_HMEM_CUDA) attr.device.cuda = place.device;
  fid_mr* mr = nullptr;
  int rc = fi_mr_regattr(domain_, &attr, 0, &mr);
  if (rc != 0)
    return systemError("fi_mr_regattr of ", end - start, " bytes at 0x", std::hex, start, std::dec, ": ",
                       strerror_(-rc), " (", rc, ")");
  if (mrMode_ & FI_MR_ENDPOINT) {
    rc = fi_mr_bind(mr, &ep_->fid, 0);
    if (rc == 0) rc = fi_mr_enable(mr);
    if (rc != 0) {
      fi_close(&mr->fid);
      return systemError("binding a registration to the endpoint (FI_MR_ENDPOINT): ", strerror_(-rc));
    }
  }
  return mr;
}

void MrCache::close(Handle* handle) {
  fi_close(&handle->mr->fid);
  --stats_.live;
  delete handle;
}

void MrCache::evictIdle() {
  for (auto it = entries_.begin(); it != entries_.end() && entries_.size() > capacity_;) {
    if (it->second->refs == 0) {
      close(it->second);
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace shoal::ofi
