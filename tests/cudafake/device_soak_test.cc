// Long-running behaviour of the device path, on the driver stand-in: a
// process that runs collectives on device buffers call after call, never
// waiting on the communicator (as a trainer does: only its streams),
// keeps its threads, file descriptors, CUDA streams, events and device
// allocations exactly where they were after warm-up, its heap within 256 KiB
// and its resident memory within the soak's slack, whichever path the calls
// take (stream plans over cuda_ipc, device plans, staging over shm) and with
// windows registered and deregistered around the calls. The host path's
// soak is tests/soak.
#include <catch2/catch.hpp>

#include <cuda.h>
#include <nccl.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
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
  int events = -1;
  int allocations = -1;
};

Held standIn(const shoal::soak::Resources& process) {
  return {process, shoalFakeCudaLiveStreams(), shoalFakeCudaLiveEvents(), shoalFakeCudaLiveAllocations()};
}

std::string describe(const Held& h) {
  return shoal::soak::formatResources(h.process) + ", CUDA streams " + std::to_string(h.streams) + ", events " +
         std::to_string(h.events) + ", device allocations " + std::to_string(h.allocations);
}

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
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
    std::string logged;  // in each rank's INFO log: the path the calls took
  };
  char logPath[] = "/tmp/shoal-cudafake-soak-XXXXXX";
  const int logFd = mkstemp(logPath);
  REQUIRE(logFd >= 0);
  close(logFd);
  for (const Variant& v : {Variant{"stream plans over cuda_ipc, symmetric windows", {}, true, ": stream plans:"},
                           Variant{"device plans over cuda_ipc", {{"SHOAL_CUDA_STREAM_PLANS", "0"}}, false,
                                   ": device plans:"},
                           Variant{"staged over shm", {{"NCCL_P2P_DISABLE", "1"}}, false,
                                   "staged through pinned host memory"}}) {
    shoal::testing::MpConfig cfg;
    cfg.nranks = 2;
    cfg.hardLimitMs = 150000;
    cfg.env = v.env;
    cfg.env.emplace_back("SHOAL_TRANSPORT", "");  // the library chooses
    cfg.env.emplace_back("NCCL_DEBUG", "INFO");
    cfg.env.emplace_back("NCCL_DEBUG_SUBSYS", "INIT,COLL");
    cfg.env.emplace_back("NCCL_DEBUG_FILE", std::string(logPath) + ".%p");
    auto result = shoal::testing::forkedDeviceRanks(cfg, [&](shoal::testing::MpChild& child, ncclComm_t comm, CUstream s) {
      const int n = child.nranks();
      const size_t count = 1 << 16;  // 256 KiB of floats, a multiple of n
      void* pool = nullptr;
      if (ncclMemAlloc(&pool, 5 * count * sizeof(float)) != ncclSuccess) return 2;
      auto* send = static_cast<float*>(pool);
      float* recv = send + 2 * count;  // windows take the first 2 counts, the ring's Recv the last
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
      // A registration with no call on it releases the windows retired
      // before it, then goes itself: nothing is left retired when sampled.
      auto settleWindows = [&]() -> bool {
        if (!v.windows) return true;
        ncclWindow_t win = nullptr;
        return ncclCommWindowRegister(comm, send, 2 * count * sizeof(float), &win, NCCL_WIN_COLL_SYMMETRIC) ==
                   ncclSuccess &&
               ncclCommWindowDeregister(comm, win) == ncclSuccess;
      };
      if (!rounds(30) || !settleWindows()) return 4;  // warm-up: connections, streams, staging, imports
      child.barrier();
      const Held baseline = standIn(shoal::soak::sampleResources());
      if (!rounds(300) || !settleWindows()) return 5;
      child.barrier();
      const Held after = standIn(shoal::soak::settleTo(baseline.process));
      child.log("after warm-up: " + describe(baseline) + "; after 300 more rounds: " + describe(after));
      shoal::soak::Slack slack;
      slack.heapKiB = 256;
      const std::string grew = shoal::soak::compareResources(baseline.process, after.process, slack,
                                                             /*checkHeap=*/true);
      if (!grew.empty()) child.log("grew: " + grew);
      ncclMemFree(pool);
      if (ncclCommDestroy(comm) != ncclSuccess) return 6;
      const std::string log = readFile(std::string(logPath) + "." + std::to_string(::getpid()));
      if (log.find(v.logged) == std::string::npos) {
        child.log("the INFO log does not say \"" + v.logged + "\"");
        return 7;
      }
      if (!grew.empty()) return 8;
      if (after.streams != baseline.streams || after.events != baseline.events) return 9;
      if (after.allocations != baseline.allocations) return 10;
      return 0;
    });
    for (const auto& rank : result.ranks) ::unlink((std::string(logPath) + "." + std::to_string(rank.pid)).c_str());
    INFO(v.what << "\n" << result.report());
    CHECK(result.allPassed());
  }
  ::unlink(logPath);
}
