#include "core/clock.h"

#include <atomic>

#include <sched.h>
#include <time.h>

namespace shoal {

namespace {
std::atomic<uint32_t> gSpinPasses{64};
}  // namespace

void Backoff::setSpinPasses(uint32_t passes) { gSpinPasses.store(passes, std::memory_order_relaxed); }
uint32_t Backoff::spinPasses() { return gSpinPasses.load(std::memory_order_relaxed); }

void Backoff::pause() {
  ++idle_;
  if (idle_ <= gSpinPasses.load(std::memory_order_relaxed)) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  } else if (idle_ < 2048) {
    sched_yield();
  } else {
    // Sleep grows to 200 us: long enough to give the core away, short enough
    // that a waiting rank notices completion quickly.
    uint32_t us = idle_ < 4096 ? 20 : 200;
    timespec ts{0, static_cast<long>(us) * 1000};
    nanosleep(&ts, nullptr);
  }
}

}  // namespace shoal
