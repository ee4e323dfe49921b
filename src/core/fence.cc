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

void heavyFence() {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (detail::gHeavyFenceInterrupts.load(std::memory_order_seq_cst) &&
      membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0)
    return;
  // Not registered (or refused now): light fences are full fences as well,
  // except those that read the flag as set, which cannot happen without a
  // successful registration; if the expedited call itself fails after that,
  // fall back to the global (slow, synchronize_rcu-based) command.
  if (detail::gHeavyFenceInterrupts.load(std::memory_order_relaxed)) (void)membarrier(MEMBARRIER_CMD_GLOBAL);
}

}  // namespace shoal
