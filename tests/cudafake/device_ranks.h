// Ranks of device communicators on the driver stand-in, for the cudafake
// tests, as forked processes or as threads of this one: each starts as an
// application does (cuInit, device 0's primary context current, a stream of
// its own), then makes its rank of one communicator and runs the body; a
// child waits for the others before it exits (rank 0 may host the bootstrap
// root).
#pragma once

#include <cuda.h>
#include <nccl.h>

#include <stdlib.h>

#include <functional>
#include <string>
#include <thread>
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

// Runs body(rank, comm, stream) on n threads of this process, each with its
// own rank of one communicator, device 0 current and a stream of its own;
// after the body, the stream is synchronized and the communicator
// destroyed. Returns each rank's failure ("" where none): the body's
// (anything but ""), or its set-up's. No Catch2 assertions on the threads.
inline std::vector<std::string> deviceThreads(int n,
                                              const std::function<std::string(int, ncclComm_t, CUstream)>& body) {
  std::vector<std::string> failures(static_cast<size_t>(n));
  ncclUniqueId id;
  if (ncclGetUniqueId(&id) != ncclSuccess) {
    failures[0] = std::string("ncclGetUniqueId: ") + ncclGetLastError(nullptr);
    return failures;
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      std::string& failure = failures[static_cast<size_t>(r)];
      CUcontext ctx = nullptr;
      CUstream s = nullptr;
      if (cuInit(0) != CUDA_SUCCESS || cuDevicePrimaryCtxRetain(&ctx, 0) != CUDA_SUCCESS ||
          cuCtxSetCurrent(ctx) != CUDA_SUCCESS || cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
        failure = "CUDA set-up failed";
        return;
      }
      ncclComm_t comm = nullptr;
      if (ncclCommInitRank(&comm, n, id, r) != ncclSuccess) {
        failure = std::string("init: ") + ncclGetLastError(nullptr);
        return;
      }
      failure = body(r, comm, s);
      cuStreamSynchronize(s);
      ncclCommDestroy(comm);
      cuStreamDestroy(s);
    });
  for (auto& t : threads) t.join();
  return failures;
}

}  // namespace shoal::testing
