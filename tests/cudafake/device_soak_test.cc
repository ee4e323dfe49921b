// Long-running behaviour of the device path, on the driver stand-in: a
// process that runs collectives on device buffers call after call, never
// waiting on the communicator (as a trainer does: only its streams),
// keeps its threads, file descriptors, CUDA streams, events and device
// allocations exactly where they were after warm-up, its heap within 256 KiB
// and its resident memory within the soak's slack, whichever path the calls
// take (stream plans over cuda_ipc, device plans, staging over shm) and with
// windows registered and deregistered around the calls, and with the calls
// captured into CUDA graphs and launched. The host path's
// soak is tests/soak.
#include <catch2/catch.hpp>

#include <cuda.h>
#include <nccl.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "cudafake/device_ranks.h"
#include "cudafake/fake_cuda.h"
#include "soak/soak.h"
#include "support/scoped_env.h"

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

namespace {

// How a churn round ends its communicator.
enum class Churn { kInitDestroy, kSplit, kAbort };

// Rank 0's fresh ncclUniqueId, to every rank through `base` (a device
// Broadcast, as an application would pass it).
bool shareFreshId(ncclComm_t base, CUstream s, int rank, ncclUniqueId* id, CUdeviceptr scratch) {
  if (rank == 0 && ncclGetUniqueId(id) != ncclSuccess) return false;
  if (rank == 0 && cuMemcpyHtoD(scratch, id->internal, sizeof(id->internal)) != CUDA_SUCCESS) return false;
  if (ncclBroadcast(reinterpret_cast<void*>(scratch), reinterpret_cast<void*>(scratch), sizeof(id->internal),
                    ncclUint8, 0, base, s) != ncclSuccess)
    return false;
  return cuStreamSynchronize(s) == CUDA_SUCCESS && cuMemcpyDtoH(id->internal, scratch, sizeof(id->internal)) ==
                                                       CUDA_SUCCESS;
}

// One churn round on this rank: a communicator made (from a fresh id, or
// split from `base`), a buffer of its own from ncclMemAlloc, the calls of
// round() on it (connections, imports, a window), then the communicator
// destroyed, or aborted with rank 0's unmatched AllReduce on the stream,
// and the buffer freed. Returns what went wrong ("" when nothing).
std::string churnOnce(Churn how, ncclComm_t base, CUstream s, int rank, int n, CUdeviceptr idScratch) {
  ncclComm_t comm = nullptr;
  if (how == Churn::kSplit) {
    if (ncclCommSplit(base, 0, n - 1 - rank, &comm, nullptr) != ncclSuccess)
      return std::string("split: ") + ncclGetLastError(base);
  } else {
    ncclUniqueId id;
    if (!shareFreshId(base, s, rank, &id, idScratch)) return std::string("sharing an id: ") + ncclGetLastError(base);
    if (ncclCommInitRank(&comm, n, id, rank) != ncclSuccess) return std::string("init: ") + ncclGetLastError(nullptr);
  }
  const size_t count = 1 << 14;  // 64 KiB of floats, a multiple of n
  void* pool = nullptr;
  if (ncclMemAlloc(&pool, 5 * count * sizeof(float)) != ncclSuccess) return "ncclMemAlloc";
  auto* send = static_cast<float*>(pool);
  const std::vector<float> ones(count, 1.0f);
  std::string bad;
  if (cuMemcpyHtoD(reinterpret_cast<CUdeviceptr>(send), ones.data(), count * sizeof(float)) != CUDA_SUCCESS)
    bad = "filling the buffer";
  if (bad.empty()) bad = round(comm, s, rank, n, send, send + 2 * count, count, /*windows=*/true);
  if (how == Churn::kAbort) {
    // Rank 0's call waits for a peer that never makes it; the abort must
    // release its stream and everything the call holds. (It may also fail
    // at once: the peer's abort can break their stream ring first.)
    if (rank == 0) (void)ncclAllReduce(send, send + count, count, ncclFloat, ncclSum, comm, s);
    if (ncclCommAbort(comm) != ncclSuccess && bad.empty()) bad = "abort";
    cuStreamSynchronize(s);  // released, whatever the error
  } else if (ncclCommDestroy(comm) != ncclSuccess && bad.empty()) {
    bad = "destroy";
  }
  if (ncclMemFree(pool) != ncclSuccess && bad.empty()) bad = "ncclMemFree";
  return bad;
}

const char* churnName(Churn how) {
  switch (how) {
    case Churn::kInitDestroy: return "made and destroyed";
    case Churn::kSplit: return "split and destroyed";
    case Churn::kAbort: return "made and aborted mid-call";
  }
  return "?";
}

}  // namespace

// Communicators come and go for the life of a job (a trainer's subgroups, a
// recovery after an abort): every one made, used on device buffers over
// cuda_ipc (connections, stream rings, imported buffers, windows) and
// destroyed or aborted must give back all of it.
TEST_CASE("device communicators made, split, aborted and destroyed over and over keep resources flat",
          "[cudafake][mp]") {
  REQUIRE(kDriverNamed);
  for (Churn how : {Churn::kInitDestroy, Churn::kSplit, Churn::kAbort}) {
    shoal::testing::MpConfig cfg;
    cfg.nranks = 2;
    cfg.hardLimitMs = 150000;
    cfg.env = {{"SHOAL_TRANSPORT", ""}, {"SHOAL_PROGRESS_TIMEOUT_MS", "30000"}};
    auto result = shoal::testing::forkedDeviceRanks(cfg, [&](shoal::testing::MpChild& child, ncclComm_t base,
                                                             CUstream s) {
      const int rank = child.rank(), n = child.nranks();
      CUdeviceptr idScratch = 0;
      if (cuMemAlloc(&idScratch, sizeof(ncclUniqueId)) != CUDA_SUCCESS) return 2;
      auto rounds = [&](int times) -> bool {
        for (int i = 0; i < times; ++i)
          if (std::string bad = churnOnce(how, base, s, rank, n, idScratch); !bad.empty()) {
            child.log(std::string(churnName(how)) + ", round " + std::to_string(i) + ": " + bad);
            return false;
          }
        return true;
      };
      if (!rounds(4)) return 3;  // warm-up: the base communicator's connections, kernels, the caches
      child.barrier();
      const Held baseline = standIn(shoal::soak::sampleResources());
      if (!rounds(40)) return 4;
      child.barrier();
      const Held after = standIn(shoal::soak::settleTo(baseline.process));
      child.log(std::string(churnName(how)) + ": after warm-up " + describe(baseline) + "; after 40 more: " +
                describe(after));
      cuMemFree(idScratch);
      // The heap holds each destroyed handle (about 130 B with the
      // allocator's share) until 4096 more are (api/api_guard.h): 40 rounds
      // keep well within this.
      shoal::soak::Slack slack;
      slack.heapKiB = 96;
      if (std::string grew = shoal::soak::compareResources(baseline.process, after.process, slack, true);
          !grew.empty()) {
        child.log("grew: " + grew);
        return 5;
      }
      if (after.streams != baseline.streams || after.events != baseline.events) return 6;
      if (after.allocations != baseline.allocations) return 7;
      return ncclCommDestroy(base) == ncclSuccess ? 0 : 8;
    });
    INFO(churnName(how) << "\n" << result.report());
    CHECK(result.allPassed());
  }
}

// Ranks of one process, made and driven by one thread in groups: on one
// GPU (device plans by default, stream plans over loopback's stream ring
// when told) and on two GPUs (the ring by default).
TEST_CASE("device communicators of threads made and destroyed over and over keep resources flat", "[cudafake]") {
  REQUIRE(shoalFakeCudaSetDevices(2) == 0);
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  struct Variant {
    const char* what;
    std::vector<int> devices;
    const char* streamPlans;
  };
  for (const Variant& v : {Variant{"one GPU, device plans", {0, 0}, "0"},
                           Variant{"one GPU, stream plans", {0, 0}, "1"},
                           Variant{"two GPUs, stream plans", {0, 1}, "auto"}}) {
    shoal::testing::ScopedEnv env{{"SHOAL_CUDA_STREAM_PLANS", v.streamPlans}};
    const int n = static_cast<int>(v.devices.size());
    std::vector<CUcontext> ctx(n);
    std::vector<CUstream> streams(n);
    for (int r = 0; r < n; ++r) {
      REQUIRE(cuDevicePrimaryCtxRetain(&ctx[r], v.devices[r]) == CUDA_SUCCESS);
      REQUIRE(cuCtxSetCurrent(ctx[r]) == CUDA_SUCCESS);
      REQUIRE(cuStreamCreate(&streams[r], CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    }
    const size_t count = 1 << 14;
    std::string bad;
    auto once = [&]() {
      std::vector<ncclComm_t> comms(n);
      // In a group from one thread, each rank on the device current at its
      // call (the path of callers that make their ranks with ncclCommInitRank).
      ncclUniqueId id;
      bool made = ncclGetUniqueId(&id) == ncclSuccess && ncclGroupStart() == ncclSuccess;
      for (int r = 0; r < n && made; ++r)
        made = cuCtxSetCurrent(ctx[r]) == CUDA_SUCCESS && ncclCommInitRank(&comms[r], n, id, r) == ncclSuccess;
      if (ncclGroupEnd() != ncclSuccess || !made) {
        bad = std::string("init: ") + ncclGetLastError(nullptr);
        return;
      }
      std::vector<void*> pools(n);
      const std::vector<float> ones(count, 1.0f);
      for (int r = 0; r < n; ++r) {
        cuCtxSetCurrent(ctx[r]);
        if (ncclMemAlloc(&pools[r], 3 * count * sizeof(float)) != ncclSuccess ||
            cuMemcpyHtoD(reinterpret_cast<CUdeviceptr>(pools[r]), ones.data(), count * sizeof(float)) !=
                CUDA_SUCCESS)
          bad = "buffers";
      }
      auto grouped = [&](const char* what, const std::function<ncclResult_t(int, float*, float*)>& call) {
        ncclGroupStart();
        for (int r = 0; r < n; ++r) {
          auto* send = static_cast<float*>(pools[r]);
          if (call(r, send, send + count) != ncclSuccess && bad.empty())
            bad = std::string(what) + ": " + ncclGetLastError(comms[r]);
        }
        if (ncclGroupEnd() != ncclSuccess && bad.empty()) bad = std::string(what) + " group end";
      };
      if (bad.empty()) {
        grouped("AllReduce", [&](int r, float* send, float* recv) {
          return ncclAllReduce(send, recv, count, ncclFloat, ncclSum, comms[r], streams[r]);
        });
        grouped("AllGather", [&](int r, float* send, float* recv) {
          return ncclAllGather(send, recv + count, count / n, ncclFloat, comms[r], streams[r]);
        });
        grouped("Send/Recv", [&](int r, float* send, float* recv) {
          ncclResult_t a = ncclSend(send, count / n, ncclFloat, (r + 1) % n, comms[r], streams[r]);
          ncclResult_t b = ncclRecv(recv + count / 2, count / n, ncclFloat, (r + n - 1) % n, comms[r], streams[r]);
          return a != ncclSuccess ? a : b;
        });
        grouped("AllReduce", [&](int r, float* send, float* recv) {
          return ncclAllReduce(send, recv, count, ncclFloat, ncclSum, comms[r], streams[r]);
        });
      }
      for (int r = 0; r < n; ++r) {
        cuCtxSetCurrent(ctx[r]);
        cuStreamSynchronize(streams[r]);
        float got = 0;
        cuMemcpyDtoH(&got, reinterpret_cast<CUdeviceptr>(static_cast<float*>(pools[r]) + count + 7), sizeof got);
        if (got != static_cast<float>(n) && bad.empty()) bad = "AllReduce gave " + std::to_string(got);
      }
      for (int r = 0; r < n; ++r)
        if (ncclCommDestroy(comms[r]) != ncclSuccess && bad.empty()) bad = "destroy";
      for (int r = 0; r < n; ++r) {
        cuCtxSetCurrent(ctx[r]);
        ncclMemFree(pools[r]);
      }
    };
    for (int i = 0; i < 4 && bad.empty(); ++i) once();
    INFO(v.what << ": " << bad);
    REQUIRE(bad.empty());
    const Held baseline = standIn(shoal::soak::sampleResources());
    for (int i = 0; i < 60 && bad.empty(); ++i) once();
    const Held after = standIn(shoal::soak::settleTo(baseline.process));
    INFO(v.what << ": after warm-up " << describe(baseline) << "; after 60 more: " << describe(after));
    REQUIRE(bad.empty());
    shoal::soak::Slack slack;
    slack.heapKiB = 96;
    CHECK(shoal::soak::compareResources(baseline.process, after.process, slack, true) == "");
    CHECK(after.streams == baseline.streams);
    CHECK(after.events == baseline.events);
    CHECK(after.allocations == baseline.allocations);
    for (int r = 0; r < n; ++r) {
      cuCtxSetCurrent(ctx[r]);
      cuStreamDestroy(streams[r]);
      cuDevicePrimaryCtxRelease(v.devices[r]);
    }
  }
}

// A program that captures its collectives into a CUDA graph once and then
// only launches it (a decode loop) never calls the communicator again: the
// replays themselves must hold no more than what is in flight. And graphs
// captured and destroyed over and over give back their staging.
TEST_CASE("graph replays and graphs made and destroyed over and over keep resources flat", "[cudafake][mp]") {
  REQUIRE(kDriverNamed);
  for (const char* transport : {"", "shm"}) {
    shoal::testing::MpConfig cfg;
    cfg.nranks = 2;
    cfg.hardLimitMs = 150000;
    cfg.env = {{"SHOAL_TRANSPORT", transport}};
    auto result = shoal::testing::forkedDeviceRanks(cfg, [&](shoal::testing::MpChild& child, ncclComm_t comm,
                                                             CUstream s) {
      const int rank = child.rank(), n = child.nranks();
      const size_t count = 1 << 12;
      void* pool = nullptr;
      if (ncclMemAlloc(&pool, 3 * count * sizeof(float)) != ncclSuccess) return 2;
      auto* send = static_cast<float*>(pool);
      float* recv = send + count;
      const std::vector<float> ones(count, 1.0f);
      if (cuMemcpyHtoD(reinterpret_cast<CUdeviceptr>(send), ones.data(), count * sizeof(float)) != CUDA_SUCCESS)
        return 3;
      // One graph: an AllReduce and a ring of Send/Recv.
      auto capture = [&](CUgraph* graph, CUgraphExec* exec) -> bool {
        if (cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL) != CUDA_SUCCESS) return false;
        bool ok = ncclAllReduce(send, recv, count, ncclFloat, ncclSum, comm, s) == ncclSuccess;
        ok = ok && ncclGroupStart() == ncclSuccess;
        ok = ok && ncclSend(send, count, ncclFloat, (rank + 1) % n, comm, s) == ncclSuccess;
        ok = ok && ncclRecv(recv + count, count, ncclFloat, (rank + n - 1) % n, comm, s) == ncclSuccess;
        ok = ok && ncclGroupEnd() == ncclSuccess;
        if (cuStreamEndCapture(s, graph) != CUDA_SUCCESS || !ok) {
          child.log(std::string("capture: ") + ncclGetLastError(comm));
          return false;
        }
        return cuGraphInstantiate(exec, *graph, 0) == CUDA_SUCCESS;
      };
      auto launches = [&](CUgraphExec exec, int times) -> bool {
        for (int i = 0; i < times; ++i)
          if (cuGraphLaunch(exec, s) != CUDA_SUCCESS) return false;
        if (cuStreamSynchronize(s) != CUDA_SUCCESS) return false;
        float got = 0;
        cuMemcpyDtoH(&got, reinterpret_cast<CUdeviceptr>(recv + 5), sizeof got);
        if (got == static_cast<float>(n)) return true;
        ncclResult_t async = ncclSuccess;
        ncclCommGetAsyncError(comm, &async);
        child.log("AllReduce gave " + std::to_string(got) + "; async " + std::to_string(async) + ": " +
                  ncclGetLastError(comm));
        return false;
      };
      auto churn = [&](int times) -> bool {
        for (int i = 0; i < times; ++i) {
          CUgraph graph = nullptr;
          CUgraphExec exec = nullptr;
          if (!capture(&graph, &exec) || !launches(exec, 3)) return false;
          if (cuGraphExecDestroy(exec) != CUDA_SUCCESS || cuGraphDestroy(graph) != CUDA_SUCCESS) return false;
        }
        return true;
      };
      // Destroyed graphs' staging goes at a later call, once the driver's
      // thread has destroyed their user objects: calls over 300 ms (as many
      // on every rank: they are collectives).
      auto allocationsSettled = [&] {
        for (int i = 0; i < 30; ++i) {
          (void)ncclAllReduce(send, recv, count, ncclFloat, ncclSum, comm, s);
          (void)cuStreamSynchronize(s);
          ::usleep(10000);
        }
      };
      // Warm-up: connections, staging, the first captures.
      if (ncclAllReduce(send, recv, count, ncclFloat, ncclSum, comm, s) != ncclSuccess) return 4;
      if (cuStreamSynchronize(s) != CUDA_SUCCESS) return 4;
      CUgraph graph = nullptr;
      CUgraphExec exec = nullptr;
      if (!capture(&graph, &exec) || !launches(exec, 30) || !churn(4)) return 5;
      allocationsSettled();
      child.barrier();
      const Held baseline = standIn(shoal::soak::sampleResources());
      for (int round = 0; round < 10; ++round)
        if (!launches(exec, 200)) {
          child.log("launch round " + std::to_string(round) + ": wrong result");
          return 6;
        }
      // Sampled before any other call of the communicator's, which would
      // let go of what replays left behind.
      const Held launched = standIn(shoal::soak::settleTo(baseline.process));
      child.barrier();
      if (!churn(30)) return 7;
      allocationsSettled();
      const Held after = standIn(shoal::soak::settleTo(baseline.process));
      child.barrier();
      child.log("after warm-up: " + describe(baseline) + "; after 2000 launches: " + describe(launched) +
                "; after 30 graphs more: " + describe(after));
      shoal::soak::Slack slack;
      slack.heapKiB = 256;
      std::string grew = shoal::soak::compareResources(baseline.process, launched.process, slack, true);
      if (grew.empty()) grew = shoal::soak::compareResources(baseline.process, after.process, slack, true);
      if (!grew.empty()) child.log("grew: " + grew);
      cuGraphExecDestroy(exec);
      cuGraphDestroy(graph);
      ncclMemFree(pool);
      if (ncclCommDestroy(comm) != ncclSuccess) return 8;
      if (!grew.empty()) return 9;
      if (after.streams != baseline.streams || after.events != baseline.events) return 10;
      if (after.allocations != baseline.allocations) return 11;
      return 0;
    });
    INFO((*transport ? transport : "default (cuda_ipc)") << "\n" << result.report());
    CHECK(result.allPassed());
  }
}
