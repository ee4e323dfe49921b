// ScratchPool: host scratch for the jobs nobody waits for (nonblocking
// communicators, operations in a CUDA stream's order), reused from job to job.
//
// Role: a job that runs detached cannot borrow the communicator's one arena
// (jobs of it may run at once), so it takes a buffer of its own for as long
// as it lives. Fresh memory per job would cost a memory registration per job
// on networks that need them (transports/ofi: only memory whose end Shoal
// hears of keeps its registration, memory/known_ranges.h): buffers come back
// here when their job lets go and serve the next, each remembered while it
// lives and forgotten before it is freed.
// Thread-safety: take() and the buffers' release may run on any thread; the
// pool lives while any buffer it gave out does.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace shoal {

class ScratchPool : public std::enable_shared_from_this<ScratchPool> {
 public:
  // Buffers kept for reuse when jobs let them go; more are freed.
  static constexpr size_t kKept = 2;
  static std::shared_ptr<ScratchPool> make() { return std::shared_ptr<ScratchPool>(new ScratchPool()); }
  ~ScratchPool();
  ScratchPool(const ScratchPool&) = delete;
  ScratchPool& operator=(const ScratchPool&) = delete;
  // At least `bytes`, until the last copy of the pointer goes.
  std::shared_ptr<uint8_t> take(uint64_t bytes);
  size_t keptForTest() const;

 private:
  struct Buffer {
    uint8_t* data = nullptr;
    uint64_t bytes = 0;
  };
  ScratchPool() = default;
  void giveBack(Buffer buffer);
  static Buffer allocate(uint64_t bytes);
  static void free(Buffer buffer);
  mutable std::mutex mutex_;
  std::vector<Buffer> kept_;
};

}  // namespace shoal
