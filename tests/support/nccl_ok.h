// NCCL_OK(call): the test requires an NCCL call to succeed, and says which
// call failed, its result and the library's last error text when it does not.
// For the test's own thread (Catch's assertions are not thread-safe).
#pragma once

#include <catch2/catch.hpp>
#include <nccl.h>

#define NCCL_OK(call)                                                                                \
  do {                                                                                               \
    ncclResult_t nccl_ok_rc_ = (call);                                                               \
    if (nccl_ok_rc_ != ncclSuccess)                                                                  \
      FAIL(#call << " returned " << ncclGetErrorString(nccl_ok_rc_) << " (" << int(nccl_ok_rc_)       \
                 << "): " << ncclGetLastError(nullptr));                                             \
  } while (0)
