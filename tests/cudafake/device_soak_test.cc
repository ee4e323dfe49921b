// Long-running behaviour of the device path, on the driver stand-in: a
// process that runs collectives on device buffers call after call keeps its
// threads, file descriptors, memory, CUDA streams and device allocations
// where they were after warm-up, whichever path the calls take (stream plans
// over cuda_ipc, device plans, staging over shm) and with windows registered
// and deregistered around the calls. The host path's soak is tests/soak.
#include <catch2/catch.hpp>

#include <cuda.h>
#include <nccl.h>

#include <string>
#include <utility>
#include <vector>

#include "cudafake/device_ranks.h"
#include "cudafake/fake_cuda.h"
#include "soak/soak.h"

namespace {

const bool kDriverNamed = setenv("SHOAL_CUDA_DRIVER", SHOAL_CUDAFAKE_LIB, 0) == 0;

// What a process holds, the library's resources and the stand-in's.
struct Held {
  shoal::soak::Resources process;
  int streams = -1;
  int allocations = -1;
};

Held sampleHeld() { return {shoal::soak::sampleResources(), shoalFakeCudaLiveStreams(), shoalFakeCudaLiveAllocations()}; }

std::string describe(const Held& h) {
  return shoal::soak::formatResources(h.process) + ", CUDA streams " + std::to_string(h.streams) +
         ", device allocations " + std::to_string(h.allocations);
}

// One round on every rank: AllReduce (large and 8 B), AllGather,
// ReduceScatter, Broadcast and a ring of Send/Recv on ncclMemAlloc buffers,
// then, with `windows`, an AllReduce on symmetric windows registered for it
// and deregistered after. Checks one element of each result. Returns what
// went wrong ("" when nothing).
std::string round(ncclComm_t comm, CUstream s, int rank, int n, float* send, float* recv, size_t count,
                  bool windows) {
  auto called = [&](ncclResult_t r, const char* what) {
    return r == ncclSuccess ? std::string() : std::string(what) + ": " + ncclGetLastError(comm);
  };
  std::string bad;
  auto check = [&](const std::string& why) {
    if (bad.empty()) bad = why;
  };
  check(called(ncclAllReduce(send, recv, count, ncclFloat, ncclSum, comm, s), "AllReduce"));
  check(called(ncclAllReduce(send, recv + count, 2, ncclFloat, ncclSum, comm, s), "AllReduce 8 B"));
  check(called(ncclAllGather(send, recv, count / n, ncclFloat, comm, s), "AllGather"));
  check(called(ncclReduceScatter(send, recv, count / n, ncclFloat, ncclSum, comm, s), "ReduceScatter"));
  check(called(ncclBroadcast(send, recv + count / n, count / n, ncclFloat, 0, comm, s), "Broadcast"));
  check(called(ncclGroupStart(), "group"));
  check(called(ncclSend(send, count / n, ncclFloat, (rank + 1) % n, comm, s), "Send"));
  check(called(ncclRecv(recv + 2 * count, count / n, ncclFloat, (rank + n - 1) % n, comm, s), "Recv"));
  check(called(ncclGroupEnd(), "group end"));
  if (windows) {
    ncclWindow_t win = nullptr;
    check(called(ncclCommWindowRegister(comm, send, 2 * count * sizeof(float), &win, NCCL_WIN_COLL_SYMMETRIC),
                 "window"));
    check(called(ncclAllReduce(send, send + count, count, ncclFloat, ncclSum, comm, s), "AllReduce on windows"));
    if (win != nullptr) check(called(ncclCommWindowDeregister(comm, win), "deregister"));
  }
  if (cuStreamSynchronize(s) != CUDA_SUCCESS) check("stream");
  float got[3] = {};
  cuMemcpyDtoH(&got[0], reinterpret_cast<CUdeviceptr>(recv + count + 1), sizeof(float));  // 8 B AllReduce
  cuMemcpyDtoH(&got[1], reinterpret_cast<CUdeviceptr>(recv + 2 * count), sizeof(float));  // from the ring
  cuMemcpyDtoH(&got[2], reinterpret_cast<CUdeviceptr>(send + count), sizeof(float));      // windows
  if (got[0] != static_cast<float>(n)) check("AllReduce gave " + std::to_string(got[0]));
  if (got[1] != 1.0f) check("Recv gave " + std::to_string(got[1]));
  if (windows && got[2] != static_cast<float>(n)) check("AllReduce on windows gave " + std::to_string(got[2]));
  return bad;
}

}  // namespace

TEST_CASE("device collectives keep threads, descriptors, memory, streams and device allocations flat", "[cudafake][mp]") {
  REQUIRE(kDriverNamed);
  struct Variant {
    const char* what;
    std::vector<std::pair<std::string, std::string>> env;
    bool windows;
  };
  for (const Variant& v : {Variant{"stream plans over cuda_ipc, symmetric windows", {}, true},
                           Variant{"device plans over cuda_ipc", {{"SHOAL_CUDA_STREAM_PLANS", "0"}}, false},
                           Variant{"staged over shm", {{"NCCL_P2P_DISABLE", "1"}}, false}}) {
    shoal::testing::MpConfig cfg;
    cfg.nranks = 2;
    cfg.hardLimitMs = 150000;
    cfg.env = v.env;
    cfg.env.emplace_back("SHOAL_TRANSPORT", "");  // the library chooses
    auto result = shoal::testing::forkedDeviceRanks(cfg, [&](shoal::testing::MpChild& child, ncclComm_t comm, CUstream s) {
      const int n = child.nranks();
      const size_t count = 1 << 16;  // 256 KiB of floats, a multiple of n
      void* pool = nullptr;
      if (ncclMemAlloc(&pool, 4 * count * sizeof(float)) != ncclSuccess) return 2;
      auto* send = static_cast<float*>(pool);
      float* recv = send + 2 * count;  // windows take the first half
      const std::vector<float> ones(count, 1.0f);
      if (cuMemcpyHtoD(reinterpret_cast<CUdeviceptr>(send), ones.data(), count * sizeof(float)) != CUDA_SUCCESS)
        return 3;
      auto rounds = [&](int times) -> bool {
        for (int i = 0; i < times; ++i)
          if (std::string bad = round(comm, s, child.rank(), n, send, recv, count, v.windows); !bad.empty()) {
            child.log("round " + std::to_string(i) + ": " + bad);
            return false;
          }
        return true;
      };
      if (!rounds(30)) return 4;  // warm-up: connections, streams, staging, imports
      child.barrier();
      const Held baseline = sampleHeld();
      if (!rounds(300)) return 5;
      child.barrier();
      shoal::soak::Resources settled = shoal::soak::settleTo(baseline.process);
      const Held after{settled, shoalFakeCudaLiveStreams(), shoalFakeCudaLiveAllocations()};
      child.log("after warm-up: " + describe(baseline) + "; after 300 more rounds: " + describe(after));
      const std::string grew = shoal::soak::compareResources(baseline.process, after.process, shoal::soak::Slack{});
      if (!grew.empty()) child.log("grew: " + grew);
      ncclMemFree(pool);
      if (ncclCommDestroy(comm) != ncclSuccess) return 6;
      if (!grew.empty()) return 7;
      if (after.streams != baseline.streams) return 8;
      if (after.allocations != baseline.allocations) return 9;
      return 0;
    });
    INFO(v.what << "\n" << result.report());
    CHECK(result.allPassed());
  }
}
