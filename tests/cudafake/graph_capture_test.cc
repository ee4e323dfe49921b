// Collectives captured into CUDA graphs, on the driver stand-in (which
// records a capture and replays it at each launch, user objects included):
// nothing runs at capture; each launch runs the operation on the inputs of
// that moment, as processes over shm, tcp and cuda_ipc and with the wait
// kernel; on a device-direct communicator as a device plan (reductions in
// the kernels, nothing staged); a call made after a launch on the same stream waits for the
// replay instead of blocking it; a replay whose peer was killed lets its
// stream go with the error; a replay of a destroyed communicator's
// operation lets its stream pass; a group over two streams being captured
// is refused; the staging a graph holds is freed once the graph is gone.
#include <catch2/catch.hpp>

#include <cuda.h>
#include <nccl.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <atomic>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "cudafake/device_ranks.h"
#include "cudafake/fake_cuda.h"
#include "support/mp_harness.h"
#include "support/nccl_ok.h"

namespace {

const bool kDriverNamed = setenv("SHOAL_CUDA_DRIVER", SHOAL_CUDAFAKE_LIB, 0) == 0;

#define CU_OK(call) REQUIRE((call) == CUDA_SUCCESS)

void useDevice0() {
  CU_OK(cuInit(0));
  CUcontext ctx = nullptr;
  CU_OK(cuDevicePrimaryCtxRetain(&ctx, 0));
  CU_OK(cuCtxSetCurrent(ctx));
}

// n floats of device memory; usable from forked children (no Catch2 there).
struct DeviceFloats {
  CUdeviceptr ptr = 0;
  size_t n = 0;
  explicit DeviceFloats(size_t count) : n(count) { (void)cuMemAlloc(&ptr, n * sizeof(float)); }
  ~DeviceFloats() { cuMemFree(ptr); }
  DeviceFloats(const DeviceFloats&) = delete;
  float* at() const { return reinterpret_cast<float*>(ptr); }
  bool fill(const std::function<float(size_t)>& f) const {
    std::vector<float> host(n);
    for (size_t i = 0; i < n; ++i) host[i] = f(i);
    return cuMemcpyHtoD(ptr, host.data(), n * sizeof(float)) == CUDA_SUCCESS;
  }
  std::vector<float> read() const {
    std::vector<float> host(n, -7.0f);
    (void)cuMemcpyDtoH(host.data(), ptr, n * sizeof(float));
    return host;
  }
};

float val(int rank, size_t i, int round) { return static_cast<float>((rank + 1) * 100 + i % 100 + round * 1000); }

// The first i where got differs from want(i), or -1.
long firstWrong(const std::vector<float>& got, const std::function<float(size_t)>& want) {
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want(i)) return static_cast<long>(i);
  return -1;
}

}  // namespace

// Every rank captures an AllReduce, a ring of Send/Recv in a group and an
// AllGather into one graph, then launches it three times with new inputs
// each time; after each launch, on the same stream, an eager AllReduce that
// the stream reaches only after the replay (its job is queued before the
// replay's). Each result is checked.
TEST_CASE("collectives captured into a CUDA graph run at each launch with that launch's inputs", "[cudafake][mp]") {
  using Env = std::vector<std::pair<std::string, std::string>>;
  struct Variant {
    const char* name;
    Env env;
  };
  const Variant variants[] = {
      {"shm", {{"SHOAL_TRANSPORT", "shm"}}},
      {"tcp", {{"SHOAL_TRANSPORT", "tcp"}}},
      {"cuda_ipc (device-direct by default)", {{"SHOAL_TRANSPORT", ""}}},
      {"shm with the wait kernel", {{"SHOAL_TRANSPORT", "shm"}, {"SHOAL_CUDA_WAIT", "kernel"}}},
  };
  for (const Variant& variant : variants) {
    for (int n : {2, 3}) {
      shoal::testing::MpConfig cfg;
      cfg.nranks = n;
      cfg.env = variant.env;
      auto result = shoal::testing::forkedDeviceRanks(cfg, [&](shoal::testing::MpChild& child, ncclComm_t comm,
                                                             CUstream s) -> int {
        const int r = child.rank();
        constexpr size_t N = 3000;
        DeviceFloats send(N), sum(N), gathered(N * n), ringIn(N), eager(N);
        if (!send.fill([&](size_t i) { return val(r, i, 0); }) || !sum.fill([](size_t) { return -1.0f; }))
          return 20;
        // Warm-up, as PyTorch requires before a capture.
        if (ncclAllReduce(send.at(), sum.at(), N, ncclFloat, ncclSum, comm, s) != ncclSuccess) return 21;
        if (cuStreamSynchronize(s) != CUDA_SUCCESS) return 22;
        if (!sum.fill([](size_t) { return -1.0f; })) return 23;

        if (cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL) != CUDA_SUCCESS) return 24;
        bool captured = ncclAllReduce(send.at(), sum.at(), N, ncclFloat, ncclSum, comm, s) == ncclSuccess;
        captured = captured && ncclGroupStart() == ncclSuccess;
        captured = captured && ncclSend(send.at(), N, ncclFloat, (r + 1) % n, comm, s) == ncclSuccess;
        captured = captured && ncclRecv(ringIn.at(), N, ncclFloat, (r + n - 1) % n, comm, s) == ncclSuccess;
        captured = captured && ncclGroupEnd() == ncclSuccess;
        captured = captured && ncclAllGather(send.at(), gathered.at(), N, ncclFloat, comm, s) == ncclSuccess;
        if (!captured) child.log(std::string("capture: ") + ncclGetLastError(comm));
        CUgraph graph = nullptr;
        if (cuStreamEndCapture(s, &graph) != CUDA_SUCCESS || !captured) return 25;
        CUgraphExec exec = nullptr;
        if (cuGraphInstantiate(&exec, graph, 0) != CUDA_SUCCESS) return 26;
        // Nothing ran at capture.
        if (cuStreamSynchronize(s) != CUDA_SUCCESS) return 27;
        if (firstWrong(sum.read(), [](size_t) { return -1.0f; }) != -1) return 28;

        for (int round = 1; round <= 3; ++round) {
          if (!send.fill([&](size_t i) { return val(r, i, round); })) return 30;
          if (cuGraphLaunch(exec, s) != CUDA_SUCCESS) return 31;
          // Called after the launch, on the same stream: runs after the replay.
          if (ncclAllReduce(sum.at(), eager.at(), N, ncclFloat, ncclMax, comm, s) != ncclSuccess) return 32;
          if (cuStreamSynchronize(s) != CUDA_SUCCESS) return 33;
          auto sumOf = [&](size_t i) {
            float t = 0;
            for (int q = 0; q < n; ++q) t += val(q, i, round);
            return t;
          };
          const long wrongSum = firstWrong(sum.read(), sumOf);
          const long wrongEager = firstWrong(eager.read(), sumOf);
          const long wrongRing = firstWrong(ringIn.read(), [&](size_t i) { return val((r + n - 1) % n, i, round); });
          const long wrongGather =
              firstWrong(gathered.read(), [&](size_t i) { return val(static_cast<int>(i / N), i % N, round); });
          if (wrongSum >= 0 || wrongEager >= 0 || wrongRing >= 0 || wrongGather >= 0) {
            child.log("round " + std::to_string(round) + ": first wrong element: AllReduce " + std::to_string(wrongSum) +
                      ", eager AllReduce " + std::to_string(wrongEager) + ", Recv " + std::to_string(wrongRing) +
                      ", AllGather " + std::to_string(wrongGather));
            return 34;
          }
        }
        ncclResult_t async = ncclSuccess;
        ncclCommGetAsyncError(comm, &async);
        if (async != ncclSuccess) return 35;
        if (cuGraphExecDestroy(exec) != CUDA_SUCCESS || cuGraphDestroy(graph) != CUDA_SUCCESS) return 36;
        if (shoalFakeCudaHostFnViolations() != 0) return 37;  // the host node made no CUDA call
        if (ncclCommDestroy(comm) != ncclSuccess) return 38;
        return 0;
      });
      INFO(variant.name << ", " << n << " ranks\n" << result.report());
      CHECK(result.allPassed());
    }
  }
}

// Rank r of 2 captures an AllReduce of 40,000 floats (in place or not) and
// launches the graph three times with new inputs; each replay must have
// reduced on the GPU (the stand-in's reduction launches grew across it: a
// staged replay reduces on the CPU) with the right sums. `ownProcess` (no
// other rank in this process to move the counters): the capture recorded
// no copy (nothing staged), and an eager AllReduce on the replay's output
// follows each launch. "" or what went wrong.
std::string replayAsDevicePlan(int r, ncclComm_t comm, CUstream s, bool inPlace, bool ownProcess) {
  constexpr size_t N = 40000;
  DeviceFloats send(N), sum(N), eager(N);
  float* out = inPlace ? send.at() : sum.at();
  if (!send.fill([&](size_t i) { return val(r, i, 0); })) return "fill";
  if (ncclAllReduce(send.at(), out, N, ncclFloat, ncclSum, comm, s) != ncclSuccess) return "warm-up";
  if (cuStreamSynchronize(s) != CUDA_SUCCESS) return "warm-up synchronize";
  // Ranks that are threads capture each in thread-local mode: in global mode
  // one's capture refuses the other's synchronous copies (fill), as CUDA does.
  const CUstreamCaptureMode mode = ownProcess ? CU_STREAM_CAPTURE_MODE_GLOBAL : CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
  if (cuStreamBeginCapture(s, mode) != CUDA_SUCCESS) return "cuStreamBeginCapture";
  const unsigned long long copiesBefore = shoalFakeCudaCallCount("cuMemcpyAsync");
  const bool captured = ncclAllReduce(send.at(), out, N, ncclFloat, ncclSum, comm, s) == ncclSuccess;
  const std::string why = captured ? "" : ncclGetLastError(comm);
  const unsigned long long copiesRecorded = shoalFakeCudaCallCount("cuMemcpyAsync") - copiesBefore;
  CUgraph graph = nullptr;
  if (cuStreamEndCapture(s, &graph) != CUDA_SUCCESS || !captured) return "capture: " + why;
  if (ownProcess && copiesRecorded != 0)
    return "the capture recorded " + std::to_string(copiesRecorded) + " copies (staged)";
  CUgraphExec exec = nullptr;
  if (cuGraphInstantiate(&exec, graph, 0) != CUDA_SUCCESS) return "cuGraphInstantiate";
  for (int round = 1; round <= 3; ++round) {
    const std::string at = "round " + std::to_string(round) + ": ";
    if (!send.fill([&](size_t i) { return val(r, i, round); })) return at + "fill";
    const unsigned long long kernelsBefore = shoalFakeCudaReduceLaunchesOn(0);
    if (cuGraphLaunch(exec, s) != CUDA_SUCCESS) return at + "cuGraphLaunch";
    if (cuStreamSynchronize(s) != CUDA_SUCCESS) return at + "synchronize";
    if (shoalFakeCudaReduceLaunchesOn(0) == kernelsBefore) return at + "the replay reduced no element on the GPU";
    auto sumOf = [&](size_t i) { return val(0, i, round) + val(1, i, round); };
    if (long wrong = firstWrong(inPlace ? send.read() : sum.read(), sumOf); wrong >= 0)
      return at + "first wrong element " + std::to_string(wrong);
    if (!ownProcess) continue;
    if (ncclAllReduce(out, eager.at(), N, ncclFloat, ncclMax, comm, s) != ncclSuccess) return at + "eager call";
    if (cuStreamSynchronize(s) != CUDA_SUCCESS) return at + "eager synchronize";
    if (long wrong = firstWrong(eager.read(), sumOf); wrong >= 0)
      return at + "eager AllReduce, first wrong element " + std::to_string(wrong);
  }
  ncclResult_t async = ncclSuccess;
  ncclCommGetAsyncError(comm, &async);
  if (async != ncclSuccess) return std::string("async error: ") + ncclGetLastError(comm);
  if (cuGraphExecDestroy(exec) != CUDA_SUCCESS || cuGraphDestroy(graph) != CUDA_SUCCESS) return "graph destroy";
  if (shoalFakeCudaHostFnViolations() != 0) return "a host node made a CUDA call";
  return "";
}

// On a device-direct communicator a captured AllReduce replays as a device
// plan: GPU copies (cuda_ipc between processes, loopback between threads)
// and reductions in the kernels at each launch, on the user's buffers.
// Between processes with stream plans on or off (eager calls between the
// launches take either path), then between threads on device plans.
TEST_CASE("a captured AllReduce on a device-direct communicator replays as a device plan", "[cudafake][mp]") {
  for (bool inPlace : {false, true}) {
    for (const char* streamPlans : {"auto", "0"}) {
      shoal::testing::MpConfig cfg;
      cfg.nranks = 2;
      cfg.env = {{"SHOAL_TRANSPORT", ""}, {"SHOAL_CUDA_STREAM_PLANS", streamPlans}};
      auto result = shoal::testing::forkedDeviceRanks(cfg, [&](shoal::testing::MpChild& child, ncclComm_t comm,
                                                             CUstream s) -> int {
        const std::string failure = replayAsDevicePlan(child.rank(), comm, s, inPlace, /*ownProcess=*/true);
        if (!failure.empty()) child.log(failure);
        if (!failure.empty()) return 20;
        return ncclCommDestroy(comm) == ncclSuccess ? 0 : 21;
      });
      INFO("processes, stream plans " << streamPlans << (inPlace ? ", in place\n" : "\n") << result.report());
      CHECK(result.allPassed());
    }
  }
  // Threads last: no fork after this process has threads of its own.
  useDevice0();
  for (bool inPlace : {false, true}) {
    const std::vector<std::string> failures = shoal::testing::deviceThreads(
        2, [&](int r, ncclComm_t comm, CUstream s) { return replayAsDevicePlan(r, comm, s, inPlace, false); });
    for (size_t r = 0; r < failures.size(); ++r) {
      INFO("threads, rank " << r << (inPlace ? ", in place: " : ": ") << failures[r]);
      CHECK(failures[r].empty());
    }
  }
}

// A replay whose peer died fails like an eager call: the stream is let go
// (no hang) and the error is the communicator's.
TEST_CASE("a replay whose peer was killed releases its stream with the error in ncclCommGetAsyncError",
          "[cudafake][mp]") {
  for (const char* transport : {"shm", "tcp"}) {
    shoal::testing::MpConfig cfg;
    cfg.nranks = 2;
    cfg.env = {{"SHOAL_TRANSPORT", transport}};
    auto result = shoal::testing::forkedDeviceRanks(cfg, [&](shoal::testing::MpChild& child, ncclComm_t comm,
                                                           CUstream s) -> int {
      constexpr size_t N = 1024;
      DeviceFloats buf(N);
      if (!buf.fill([](size_t i) { return static_cast<float>(i); })) return 20;
      if (ncclAllReduce(buf.at(), buf.at(), N, ncclFloat, ncclSum, comm, s) != ncclSuccess) return 21;
      if (cuStreamSynchronize(s) != CUDA_SUCCESS) return 22;
      if (cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL) != CUDA_SUCCESS) return 23;
      const bool captured = ncclAllReduce(buf.at(), buf.at(), N, ncclFloat, ncclSum, comm, s) == ncclSuccess;
      CUgraph graph = nullptr;
      if (cuStreamEndCapture(s, &graph) != CUDA_SUCCESS || !captured) return 24;
      CUgraphExec exec = nullptr;
      if (cuGraphInstantiate(&exec, graph, 0) != CUDA_SUCCESS) return 25;
      if (child.rank() == 1) {
        child.barrier();
        ::kill(::getpid(), SIGKILL);
      }
      child.barrier();
      const auto t0 = std::chrono::steady_clock::now();
      if (cuGraphLaunch(exec, s) != CUDA_SUCCESS) return 26;
      if (cuStreamSynchronize(s) != CUDA_SUCCESS) return 27;
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      ncclResult_t async = ncclSuccess;
      for (int i = 0; i < 200 && async == ncclSuccess; ++i) {
        ncclCommGetAsyncError(comm, &async);
        if (async == ncclSuccess) ::usleep(10000);
      }
      child.log("stream released after " + std::to_string(static_cast<long>(ms)) + " ms; async " +
                std::to_string(async) + ": " + ncclGetLastError(comm));
      if (async == ncclSuccess || async == ncclInProgress) return 28;
      if (ms > 20000) return 29;
      ncclCommAbort(comm);
      cuGraphExecDestroy(exec);
      cuGraphDestroy(graph);
      return 0;
    });
    INFO(transport << "\n" << result.report());
    CHECK(result.onlyVictimKilled(1));
  }
}

// Live device and pinned allocations once the asynchronous work of
// teardown (user-object destructors, deferred frees) has settled at or
// below `baseline`, waiting up to 5 s; the count last seen.
int allocationsSettle(int baseline, const std::function<void()>& poke) {
  int live = shoalFakeCudaLiveAllocations();
  for (int i = 0; i < 500 && live > baseline; ++i) {
    ::usleep(10000);
    poke();
    live = shoalFakeCudaLiveAllocations();
  }
  return live;
}

TEST_CASE("a captured collective runs nothing at capture and copies at each launch, on one rank", "[cudafake]") {
  useDevice0();
  CUstream s = nullptr;
  CU_OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  ncclUniqueId id;
  NCCL_OK(ncclGetUniqueId(&id));
  ncclComm_t comm = nullptr;
  NCCL_OK(ncclCommInitRank(&comm, 1, id, 0));
  constexpr size_t N = 64;
  DeviceFloats in(N), out(N);
  REQUIRE(in.fill([](size_t i) { return static_cast<float>(i); }));
  REQUIRE(out.fill([](size_t) { return -1.0f; }));
  const int allocationsBefore = shoalFakeCudaLiveAllocations();

  // The communicator's first call in stream order is inside a global-mode
  // capture: what it allocates and loads must not be refused (relaxed mode).
  CU_OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  NCCL_OK(ncclAllReduce(in.at(), out.at(), N, ncclFloat, ncclSum, comm, s));
  CUgraph graph = nullptr;
  CU_OK(cuStreamEndCapture(s, &graph));
  CUgraphExec exec = nullptr;
  CU_OK(cuGraphInstantiate(&exec, graph, 0));
  CU_OK(cuStreamSynchronize(s));
  CHECK(out.read()[5] == -1.0f);  // not at capture

  for (int round = 1; round <= 2; ++round) {
    REQUIRE(in.fill([&](size_t i) { return static_cast<float>(i + 100 * round); }));
    CU_OK(cuGraphLaunch(exec, s));
    CU_OK(cuStreamSynchronize(s));
    CHECK(out.read()[5] == static_cast<float>(5 + 100 * round));
  }
  // The graph holds the staging until it is gone; then the next call's
  // reclaim frees it, and the communicator's end frees the rest.
  CU_OK(cuGraphExecDestroy(exec));
  CU_OK(cuGraphDestroy(graph));
  auto call = [&] {
    (void)ncclAllReduce(in.at(), out.at(), N, ncclFloat, ncclSum, comm, s);
    (void)cuStreamSynchronize(s);
  };
  call();
  // The graph's user object goes later, on a driver thread: a later call
  // frees the staging once it has (the communicator keeps its words' page
  // and the eager call's slot).
  const int live = allocationsSettle(allocationsBefore + 2, call);
  NCCL_OK(ncclCommDestroy(comm));
  CHECK(live <= allocationsBefore + 2);
  CHECK(allocationsSettle(allocationsBefore, [] {}) <= allocationsBefore);
  CU_OK(cuStreamDestroy(s));
}

// Destroying the communicator does not wait for its graphs; their staging
// outlives it, and a launch then runs nothing but lets the stream pass. Once
// the graph is gone, the next communicator's work frees that staging.
TEST_CASE("a graph launched after its communicator was destroyed lets its stream pass", "[cudafake]") {
  useDevice0();
  CUstream s = nullptr;
  CU_OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  DeviceFloats in(16), out(16);
  REQUIRE(in.fill([](size_t i) { return static_cast<float>(i); }));
  REQUIRE(out.fill([](size_t) { return -1.0f; }));
  const int allocationsBefore = shoalFakeCudaLiveAllocations();
  ncclUniqueId id;
  NCCL_OK(ncclGetUniqueId(&id));
  ncclComm_t comm = nullptr;
  NCCL_OK(ncclCommInitRank(&comm, 1, id, 0));
  CU_OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  NCCL_OK(ncclAllReduce(in.at(), out.at(), 16, ncclFloat, ncclSum, comm, s));
  CUgraph graph = nullptr;
  CU_OK(cuStreamEndCapture(s, &graph));
  CUgraphExec exec = nullptr;
  CU_OK(cuGraphInstantiate(&exec, graph, 0));
  NCCL_OK(ncclCommDestroy(comm));
  const auto t0 = std::chrono::steady_clock::now();
  CU_OK(cuGraphLaunch(exec, s));
  CU_OK(cuStreamSynchronize(s));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  CHECK(out.read()[3] != 3.0f);  // the AllReduce did not run (its output holds the staging's bytes)
  CU_OK(cuGraphExecDestroy(exec));
  CU_OK(cuGraphDestroy(graph));
  // Another communicator's stream-ordered work frees what the graph held.
  NCCL_OK(ncclGetUniqueId(&id));
  NCCL_OK(ncclCommInitRank(&comm, 1, id, 0));
  auto call = [&] {
    (void)ncclAllReduce(in.at(), out.at(), 16, ncclFloat, ncclSum, comm, s);
    (void)cuStreamSynchronize(s);
  };
  call();
  const int live = allocationsSettle(allocationsBefore + 2, call);  // the new communicator's words and staging
  NCCL_OK(ncclCommDestroy(comm));
  CHECK(live <= allocationsBefore + 2);
  CHECK(allocationsSettle(allocationsBefore, [] {}) <= allocationsBefore);
  CU_OK(cuStreamDestroy(s));
}

TEST_CASE("a group over two streams with one being captured is refused with ncclInvalidUsage", "[cudafake]") {
  useDevice0();
  CUstream s = nullptr, other = nullptr;
  CU_OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CU_OK(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
  ncclUniqueId id;
  NCCL_OK(ncclGetUniqueId(&id));
  ncclComm_t comm = nullptr;
  NCCL_OK(ncclCommInitRank(&comm, 1, id, 0));
  DeviceFloats a(16), b(16);
  REQUIRE(a.fill([](size_t i) { return static_cast<float>(i); }));
  CU_OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclAllReduce(a.at(), a.at(), 16, ncclFloat, ncclSum, comm, s));
  NCCL_OK(ncclAllReduce(b.at(), b.at(), 16, ncclFloat, ncclSum, comm, other));
  CHECK(ncclGroupEnd() == ncclInvalidUsage);
  const std::string why = ncclGetLastError(comm);
  INFO(why);
  CHECK(why.find("being captured into a CUDA graph") != std::string::npos);
  CUgraph graph = nullptr;
  CU_OK(cuStreamEndCapture(s, &graph));
  if (graph) CU_OK(cuGraphDestroy(graph));
  NCCL_OK(ncclCommDestroy(comm));
  CU_OK(cuStreamDestroy(s));
  CU_OK(cuStreamDestroy(other));
}

// While a thread of the process captures in global mode (torch.cuda.graph's
// default), CUDA refuses potentially unsafe calls (synchronizing, querying
// events, allocating) on every other thread still in global mode. Shoal's
// own threads make such calls at any moment (here the engine's, stepping
// device plans between threads: GPU copies and kernels it waits for), so
// they run in relaxed mode: the collectives go on and the capture is left
// alone. The ranks' threads relax their own mode, as a user whose thread
// synchronizes during another's capture must.
TEST_CASE("collectives between threads go on while another thread captures in global mode", "[cudafake]") {
  useDevice0();
  constexpr size_t N = 40000;
  constexpr int kRanks = 2;
  // Every wait of the capturer and the ranks on each other is bounded: a
  // rank whose set-up failed never arrives.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  auto waitUntil = [&](const std::function<bool()>& done) {
    while (!done()) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::yield();
    }
    return true;
  };
  std::atomic<int> ready{0}, ran{0};
  std::atomic<bool> capturing{false}, finished{false};
  CUresult began = CUDA_ERROR_UNKNOWN, ended = CUDA_ERROR_UNKNOWN;
  CUgraph graph = nullptr;
  CUstream captured = nullptr;
  CUcontext ctx = nullptr;
  CU_OK(cuCtxGetCurrent(&ctx));
  CU_OK(cuStreamCreate(&captured, CU_STREAM_NON_BLOCKING));
  // Begins once every rank has allocated its buffers; ends once every rank
  // has run its collectives (or at the deadline).
  std::thread capturer([&] {
    if (cuCtxSetCurrent(ctx) == CUDA_SUCCESS && waitUntil([&] { return ready.load() == kRanks; })) {
      began = cuStreamBeginCapture(captured, CU_STREAM_CAPTURE_MODE_GLOBAL);
      capturing = began == CUDA_SUCCESS;
      if (capturing) {
        (void)waitUntil([&] { return ran.load() == kRanks; });
        ended = cuStreamEndCapture(captured, &graph);
      }
    }
    finished = true;
  });
  const std::vector<std::string> failures =
      shoal::testing::deviceThreads(kRanks, [&](int r, ncclComm_t comm, CUstream s) -> std::string {
        std::string failure;
        CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
        if (cuThreadExchangeStreamCaptureMode(&mode) != CUDA_SUCCESS) failure = "relaxing this thread's capture mode";
        {
          DeviceFloats send(N), sum(N);
          ++ready;
          if (failure.empty() && (!waitUntil([&] { return capturing.load() || finished.load(); }) || !capturing))
            failure = "the other thread's capture did not begin";
          for (int round = 1; failure.empty() && round <= 3; ++round) {
            const std::string at = "round " + std::to_string(round) + ": ";
            const unsigned long long kernelsBefore = shoalFakeCudaReduceLaunchesOn(0);
            if (!send.fill([&](size_t i) { return val(r, i, round); }))
              failure = at + "fill";
            else if (ncclAllReduce(send.at(), sum.at(), N, ncclFloat, ncclSum, comm, s) != ncclSuccess)
              failure = at + "ncclAllReduce: " + ncclGetLastError(comm);
            else if (cuStreamSynchronize(s) != CUDA_SUCCESS)
              failure = at + "synchronize";
            else if (shoalFakeCudaReduceLaunchesOn(0) == kernelsBefore)
              failure = at + "no reduction ran on the GPU (not a device plan)";
            else if (long wrong = firstWrong(sum.read(), [&](size_t i) { return val(0, i, round) + val(1, i, round); });
                     wrong >= 0)
              failure = at + "first wrong element " + std::to_string(wrong);
          }
          ncclResult_t async = ncclSuccess;
          if (failure.empty() && (ncclCommGetAsyncError(comm, &async) != ncclSuccess || async != ncclSuccess))
            failure = std::string("async error: ") + ncclGetLastError(comm);
        }
        ++ran;
        (void)waitUntil([&] { return finished.load(); });  // the communicator is destroyed once the capture is over
        return failure;
      });
  capturer.join();
  CHECK(began == CUDA_SUCCESS);
  CHECK(ended == CUDA_SUCCESS);
  if (graph) CU_OK(cuGraphDestroy(graph));
  CU_OK(cuStreamDestroy(captured));
  for (int r = 0; r < kRanks; ++r) {
    INFO("rank " << r << ": " << failures[static_cast<size_t>(r)]);
    CHECK(failures[static_cast<size_t>(r)].empty());
  }
}
