// Known ranges: memory whose end Shoal is told of before its address can
// hold other memory.
//
// Role: a transport that must register the buffers it moves (ofi providers
// with FI_MR_LOCAL, such as EFA and verbs) may keep a registration only of
// memory that stays the same pages until Shoal hears of its end: buffers from
// ncclMemAlloc and ncclCommRegister (ended by ncclMemFree and
// ncclCommDeregister), and Shoal's own staging and scratch. Any other buffer
// may be freed and a new one allocated at its address unannounced; a
// registration kept of it would still pin the old pages, so the provider
// would read and write memory nobody uses any more.
// The registry's rememberMemory/forgetMemory keep this list and tell the
// transports (transports/registry.h).
// Thread-safety: every function may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>

namespace shoal::memory {

// [base, base + bytes) stays what it is until forgetRange reaches it.
void rememberRange(const void* base, size_t bytes);
// Ends every remembered range that overlaps [base, base + bytes): memory
// freed or deregistered there may come back as other memory. (One buffer
// registered on two communicators is then forgotten by either's
// deregistration: registered per operation after, slower, never stale.)
void forgetRange(const void* base, size_t bytes);
// The remembered range [first, second) that holds [base, base + bytes), if any.
std::optional<std::pair<uintptr_t, uintptr_t>> rememberedRangeOf(const void* base, size_t bytes);
inline bool isRemembered(const void* base, size_t bytes) { return rememberedRangeOf(base, bytes).has_value(); }

}  // namespace shoal::memory
