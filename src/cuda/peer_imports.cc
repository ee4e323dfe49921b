#include "cuda/peer_imports.h"

#include <unistd.h>

namespace shoal::cuda {

PeerImports& PeerImports::instance() {
  static PeerImports* imports = new PeerImports();  // outlives every window, even at exit
  return *imports;
}

Result<uint8_t*> PeerImports::acquire(Driver& driver, const Key& key, size_t bytes, int fd) {
  struct Closer {
    int fd;
    ~Closer() { close(fd); }
  } closer{fd};
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = imports_.find(key);
  if (it != imports_.end()) {
    if (it->second.bytes != bytes)
      return internalError("allocation ", key.serial, " of process ", std::hex, key.process, std::dec,
                           " was mapped as ", it->second.bytes,
                           " bytes and is now announced as ", bytes);
    ++it->second.users;
    return it->second.base;
  }
  Result<void*> mapped = driver.importDeviceMemory(fd, bytes);
  SHOAL_TRY(mapped.status()) << "mapping allocation " << key.serial << " of another process";
  auto* base = static_cast<uint8_t*>(mapped.value());
  imports_.emplace(key, Import{base, bytes, 1});
  return base;
}

void PeerImports::release(Driver& driver, uint8_t* base) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = imports_.begin(); it != imports_.end(); ++it) {
    if (it->second.base != base) continue;
    if (--it->second.users == 0) {
      driver.deviceFree(base);
      imports_.erase(it);
    }
    return;
  }
}

size_t PeerImports::mapped() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return imports_.size();
}

}  // namespace shoal::cuda
