#include "core/fence.h"

#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <mutex>

namespace shoal {

namespace detail {
std::atomic<bool> gHeavyFenceInterrupts{false};
}

namespace {
long membarrier(int cmd) { return syscall(__NR_membarrier, cmd, 0, 0); }
}  // namespace

void enableAsymmetricFences() {
  static std::once_flag once;
  std::call_once(once, [] {
    long supported = membarrier(MEMBARRIER_CMD_QUERY);
    if (supported < 0 || (supported & MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0) return;
    if (membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) != 0) return;
    // Light fences may become compiler barriers only once heavy ones interrupt.
    detail::gHeavyFenceInterrupts.store(true, std::memory_order_seq_cst);
  });
}

bool heavyFence() {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  // Not registered: light fences are full fences too, so this one suffices.
  if (!detail::gHeavyFenceInterrupts.load(std::memory_order_seq_cst)) return true;
  // Registered: light fences are compiler barriers, so every running thread
  // must be made to execute a barrier; the global command (slower) if the
  // expedited one is refused now.
  if (membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0) return true;
  return membarrier(MEMBARRIER_CMD_GLOBAL) == 0;
}

}  // namespace shoal
