// CHECK_NCCL: the one error check every example wraps around every NCCL call.
//
// An example has nothing sensible to do after a failed collective, so the
// macro prints where it failed, NCCL's code and ncclGetLastError's detail,
// and ends the whole job (every rank thread, every MPI process) at once.
#pragma once

#include <nccl.h>

namespace shoal::examples {

// Prints "<file>:<line> <call>: <code string>: <last error>" and ends the job
// with exit status 1. Never returns.
[[noreturn]] void failNccl(const char* file, int line, const char* call, ncclResult_t result);

// Ends the job (all ranks, all processes) with `status`. Safe to call from
// several rank threads at once: the first caller ends it.
[[noreturn]] void endJob(int status);

}  // namespace shoal::examples

#define CHECK_NCCL(call)                                                    \
  do {                                                                      \
    ncclResult_t check_nccl_result_ = (call);                               \
    if (check_nccl_result_ != ncclSuccess)                                  \
      ::shoal::examples::failNccl(__FILE__, __LINE__, #call, check_nccl_result_); \
  } while (0)
