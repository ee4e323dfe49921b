// PeerImports: device memory of other processes of this host, mapped here
// once per (process, allocation) however many windows name it.
//
// Role: a window (comm/window.h) on another process's cuMem allocation maps
// it through acquire(); a second window on the same allocation (another
// range, another communicator) gets the same mapping. The last release()
// unmaps it, so the owner's memory is freed once the owner has freed it and
// every window on it here is gone.
// Thread-safety: every method may be called from any thread; imports and
// unmaps run with the caller's CUDA context current.
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "core/status.h"
#include "cuda/driver.h"

namespace shoal::cuda {

class PeerImports {
 public:
  // An allocation of another process, as mapped for one GPU of this one:
  // the process's id (PeerInfo::processId, random per process, so a reused
  // pid is another process), the serial its Driver gave the allocation
  // (Driver::deviceAllocationOf), and the GPU ("GPU-<uuid>") given access.
  struct Key {
    uint64_t process = 0;
    uint64_t serial = 0;
    std::string gpu;
    auto operator<=>(const Key&) const = default;
  };

  static PeerImports& instance();

  // The allocation's mapping here; the first acquire imports it from
  // descriptor `fd` as `bytes` bytes. `fd` is closed here either way.
  // Every successful acquire pairs with one release.
  Result<uint8_t*> acquire(Driver& driver, const Key& key, size_t bytes, int fd);
  void release(Driver& driver, uint8_t* base);
  // Allocations mapped now (tests).
  size_t mapped() const;

 private:
  struct Import {
    uint8_t* base = nullptr;
    size_t bytes = 0;
    int users = 0;
  };
  mutable std::mutex mutex_;
  std::map<Key, Import> imports_;
};

}  // namespace shoal::cuda
