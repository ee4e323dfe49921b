// Child-side helpers of the forked-process tests (tests/mp): checks that log
// and fail the child, reference values whose sums are exact in float, and
// communicator set-up through the harness's unique id.
#pragma once

#include <nccl.h>

#include <time.h>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "support/mp_harness.h"

namespace shoal::testing {

inline double monoMs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

inline std::string describe(ncclResult_t rc) {
  return std::string(ncclGetErrorString(rc)) + " (" + std::to_string(static_cast<int>(rc)) +
         "): " + ncclGetLastError(nullptr);
}

// Child-side checks: log and fail the child (exit code 1).
#define CHILD_CHECK(child, cond, what)                                                   \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      (child).log(std::string("CHECK FAILED at line ") + std::to_string(__LINE__) + ": " \
                  + #cond + " -- " + (what));                                            \
      return 1;                                                                          \
    }                                                                                    \
  } while (0)

#define CHILD_NCCL(child, call)                                                           \
  do {                                                                                    \
    ncclResult_t rc_ = (call);                                                            \
    if (rc_ != ncclSuccess) {                                                             \
      (child).log(std::string("line ") + std::to_string(__LINE__) + ": " + #call + " -> " \
                  + ::shoal::testing::describe(rc_));                                     \
      return 1;                                                                           \
    }                                                                                     \
  } while (0)

// Small integers: every sum over <= 4 ranks is exact in float.
inline float value(int rank, size_t i) {
  return static_cast<float>((rank * 13 + static_cast<int>(i % 1021)) % 17);
}

// Checks a float buffer against an expectation; logs the first mismatch.
inline bool expectFloats(MpChild& child, const char* what, const std::vector<float>& got,
                         const std::function<float(size_t)>& want) {
  for (size_t i = 0; i < got.size(); ++i) {
    float w = want(i);
    if (got[i] != w) {
      char line[256];
      std::snprintf(line, sizeof(line), "%s: element %zu is %g, expected %g", what, i,
                    static_cast<double>(got[i]), static_cast<double>(w));
      child.log(line);
      return false;
    }
  }
  return true;
}

inline ncclResult_t initComm(MpChild& child, ncclComm_t* comm) {
  ncclUniqueId id;
  if (!child.uniqueId(&id)) return ncclSystemError;
  return ncclCommInitRank(comm, child.nranks(), id, child.rank());
}

}  // namespace shoal::testing
