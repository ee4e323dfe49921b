#include "comm/scratch_pool.h"

#include <algorithm>

#include "transports/registry.h"

namespace shoal {

ScratchPool::~ScratchPool() {
  for (Buffer& b : kept_) free(b);
}

ScratchPool::Buffer ScratchPool::allocate(uint64_t bytes) {
  Buffer b{new uint8_t[bytes], bytes};
  rememberMemory(b.data, b.bytes);  // free() says when it ends
  return b;
}

void ScratchPool::free(Buffer buffer) {
  forgetMemory(buffer.data, buffer.bytes);  // a transport may hold a registration of it
  delete[] buffer.data;
}

std::shared_ptr<uint8_t> ScratchPool::take(uint64_t bytes) {
  Buffer buffer;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // The smallest kept buffer that is large enough.
    auto best = kept_.end();
    for (auto it = kept_.begin(); it != kept_.end(); ++it)
      if (it->bytes >= bytes && (best == kept_.end() || it->bytes < best->bytes)) best = it;
    if (best != kept_.end()) {
      buffer = *best;
      kept_.erase(best);
    }
  }
  if (buffer.data == nullptr) buffer = allocate(std::max<uint64_t>(bytes, 1));
  std::shared_ptr<ScratchPool> self = shared_from_this();
  return std::shared_ptr<uint8_t>(buffer.data, [self, buffer](uint8_t*) { self->giveBack(buffer); });
}

void ScratchPool::giveBack(Buffer buffer) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (kept_.size() < kKept) {
      kept_.push_back(buffer);
      return;
    }
    // Full: keep the larger ones (the next job of that size reuses them).
    auto smallest = std::min_element(kept_.begin(), kept_.end(),
                                     [](const Buffer& a, const Buffer& b) { return a.bytes < b.bytes; });
    if (smallest->bytes < buffer.bytes) std::swap(*smallest, buffer);
  }
  free(buffer);
}

size_t ScratchPool::keptForTest() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return kept_.size();
}

}  // namespace shoal
