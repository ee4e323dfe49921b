// Shared memory: allocations other processes of this host can map, and reads
// of other processes' memory (docs/design.md, Transports).
//
// Role: ncclMemAlloc allocates through allocateShared(): a POSIX shared-memory
// object "/shoal-<pid>-mem-<seq>" mapped here, so a peer that is told
// (pid, seq, offset) maps the same pages (mapPeerAllocation) and reads the
// buffer directly, with no copy through a channel. Memory that was not
// allocated here (malloc, stack, a framework's allocator) is read with
// process_vm_readv instead (readPeerMemory). Names carry the pid, so objects
// of killed processes are removed with the shm transport's stale segments.
// Thread-safety: every function may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "core/status.h"

namespace shoal::memory {

Result<void*> allocateShared(size_t bytes);
// False when `p` is not the start of a live allocateShared() allocation.
bool freeShared(void* p);

struct SharedLocation {
  uint64_t sequence = 0;  // names the object together with the pid
  uint64_t offset = 0;    // of the range within the allocation
};
// Bytes of the live allocation that starts at `p` (0 if none does).
size_t allocationBytes(const void* p);
// Where [p, p + bytes) lives when it lies inside one live shared allocation.
std::optional<SharedLocation> findShared(const void* p, size_t bytes);

// The start of peer `pid`'s allocation `sequence`, mapped read-only here
// (cached); nullptr when it cannot be mapped (freed, other namespace).
const uint8_t* mapPeerAllocation(int pid, uint64_t sequence);

// Makes this process's first access of every page of [p, p + bytes) happen
// now, for the kind of access it will make later, without changing any byte.
// On virtual machines a mapping's first read of a page can cost microseconds
// and its first write ten or more even after MAP_POPULATE (measured on the
// development VM: ~1.5-4 us and 5-15 us per 4 KiB page), which a collective
// should not pay in its timed calls; callers pay it once at set-up instead.
enum class PageAccess { kRead, kWrite };
void prefaultPages(void* p, size_t bytes, PageAccess access);

// Whether reading another process's memory (process_vm_readv, "CMA") runs
// at least at 60 % of memcpy's speed here, so that a single copy by the
// receiver can beat two copies through shared memory made at once by sender
// and receiver. Measured once per process (in-process reads of 1 MiB, best of
// 5, ~1 ms) and logged; false where such reads are impossible.
bool remoteReadsPay();

// Copies `bytes` from `address` in process `pid` into `out`.
Status readPeerMemory(int pid, uint64_t address, void* out, size_t bytes);

}  // namespace shoal::memory
