// Asymmetric fences: a store-then-load handshake between a hot path and a rare
// one, where the hot side pays a compiler barrier and the rare side pays for
// both (membarrier(2) makes every running thread of the process execute a full
// barrier). Used so that a blocking API call can announce that it uses a
// communicator with a plain store, while ncclCommAbort from another thread
// still sees it before freeing the communicator (api/api_guard.h, CommCall).
//
//   hot side:  x.store(1); lightFence(); if (y.load()) ...
//   rare side: y.store(1); heavyFence(); if (x.load()) ...
// Either the hot side's store is visible to the rare side's load, or the hot
// side's load sees the rare side's store.
#pragma once

#include <atomic>

namespace shoal {

namespace detail {
extern std::atomic<bool> gHeavyFenceInterrupts;  // membarrier registered for this process
}

// Registers the process for expedited private membarrier (once; later calls
// return at once). Where the kernel or a seccomp filter refuses it, both
// fences stay full fences, which is only slower.
void enableAsymmetricFences();

inline void lightFence() {
  if (detail::gHeavyFenceInterrupts.load(std::memory_order_relaxed))
    std::atomic_signal_fence(std::memory_order_seq_cst);
  else
    std::atomic_thread_fence(std::memory_order_seq_cst);
}

// False when no barrier could be forced on the other threads (membarrier
// registered, then refused): the caller must not rely on the handshake.
[[nodiscard]] bool heavyFence();

}  // namespace shoal
