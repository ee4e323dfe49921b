// Forked ranks of device communicators on the driver stand-in, for the
// cudafake tests: each child starts as an application does (cuInit, device
// 0's primary context current, a stream of its own), then makes its rank of
// one communicator and runs the body; it waits for the others before it
// exits (rank 0 may host the bootstrap root).
#pragma once

#include <cuda.h>
#include <nccl.h>

#include <stdlib.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "support/mp_harness.h"

namespace shoal::testing {

// Child exit codes 10-14: the set-up failed (logged for init).
// `rankEnv[r]`, where given, is set in rank r's child on top of cfg.env
// (before cuInit, so the stand-in's knobs apply too).
inline MpResult forkedDeviceRanks(const MpConfig& cfg,
                                  const std::function<int(MpChild&, ncclComm_t, CUstream)>& body,
                                  const std::vector<std::vector<std::pair<std::string, std::string>>>& rankEnv = {}) {
  return runForked(cfg, [&](MpChild& child) -> int {
    if (static_cast<size_t>(child.rank()) < rankEnv.size())
      for (const auto& [name, value] : rankEnv[child.rank()]) ::setenv(name.c_str(), value.c_str(), 1);
    if (cuInit(0) != CUDA_SUCCESS) return 10;
    CUcontext ctx = nullptr;
    if (cuDevicePrimaryCtxRetain(&ctx, 0) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS) return 11;
    CUstream s = nullptr;
    if (cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) return 12;
    ncclUniqueId id;
    if (!child.uniqueId(&id)) return 13;
    ncclComm_t comm = nullptr;
    if (ncclCommInitRank(&comm, child.nranks(), id, child.rank()) != ncclSuccess) {
      child.log(std::string("init: ") + ncclGetLastError(nullptr));
      return 14;
    }
    int rc = body(child, comm, s);
    child.barrier();
    return rc;
  });
}

}  // namespace shoal::testing
