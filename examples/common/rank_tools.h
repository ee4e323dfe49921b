// Small helpers the examples share: job-wide numbers and checks computed with
// NCCL itself, and a monotonic clock.
//
// Threads: each function is a collective over `comm`: every rank calls it, in
// the same order as its other calls on that communicator. Host memory, NULL
// stream, so each has completed when it returns.
#pragma once

#include <nccl.h>

#include <chrono>
#include <cstddef>

namespace shoal::examples {

double sumOverRanks(ncclComm_t comm, double value);
double maxOverRanks(ncclComm_t comm, double value);

// True when `data` holds the same bits on every rank: the element-wise
// minimum and maximum of the bit patterns (as uint32) agree. Every rank gets
// the same answer.
bool identicalOnAllRanks(ncclComm_t comm, const float* data, size_t count);

inline double secondsNow() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace shoal::examples
