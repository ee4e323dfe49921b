// Device buffers and CUDA streams through the public API, on the driver
// stand-in (tests/cudafake): every collective and point-to-point operation in
// stream order, as threads and as processes over shm and tcp; the mixed-buffer
// error; a call that returns before its stream reaches it; stream delays
// longer than the no-progress deadline; abort and a killed peer releasing
// the stream; multi-stream groups; the synchronous fallback (graph
// capture: graph_capture_test.cc). What the stand-in cannot prove: tests/cudafake/README.md.
#include <catch2/catch.hpp>

#include <cuda.h>
#include <nccl.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <barrier>
#include <cmath>
#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "comm/deferred_release.h"
#include "comm/window.h"
#include "core/params.h"
#include "cuda/device_reducer.h"
#include "cuda/peer_imports.h"
#include "cudafake/device_ranks.h"
#include "cudafake/fake_cuda.h"
#include "support/mp_harness.h"
#include "support/scoped_env.h"
#include "support/nccl_ok.h"

namespace {

// The library loads the stand-in this binary links (before anything reads
// the parameters).
const bool kDriverNamed = setenv("SHOAL_CUDA_DRIVER", SHOAL_CUDAFAKE_LIB, 0) == 0;

using Clock = std::chrono::steady_clock;
double msSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

#define CU_OK(call) REQUIRE((call) == CUDA_SUCCESS)

// Makes device 0's primary context current on the calling thread.
void useDevice0() {
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  CUdevice dev = 0;
  REQUIRE(cuDeviceGet(&dev, 0) == CUDA_SUCCESS);
  CUcontext ctx = nullptr;
  REQUIRE(cuDevicePrimaryCtxRetain(&ctx, dev) == CUDA_SUCCESS);
  REQUIRE(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
}

// Two ranks of one process, initialized together in a group.
std::array<ncclComm_t, 2> groupInitTwoRanks() {
  ncclUniqueId id;
  NCCL_OK(ncclGetUniqueId(&id));
  std::array<ncclComm_t, 2> comms{nullptr, nullptr};
  NCCL_OK(ncclGroupStart());
  for (int r = 0; r < 2; ++r) NCCL_OK(ncclCommInitRank(&comms[r], 2, id, r));
  NCCL_OK(ncclGroupEnd());
  return comms;
}

CUstream newStream() {
  CUstream s = nullptr;
  REQUIRE(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  return s;
}

// A device buffer of n floats holding f(i).
struct DeviceFloats {
  CUdeviceptr ptr = 0;
  size_t n = 0;
  explicit DeviceFloats(size_t count, const std::function<float(size_t)>& f = nullptr) : n(count) {
    REQUIRE(cuMemAlloc(&ptr, std::max<size_t>(n, 1) * sizeof(float)) == CUDA_SUCCESS);
    std::vector<float> host(n, -1.0f);
    if (f)
      for (size_t i = 0; i < n; ++i) host[i] = f(i);
    if (n) REQUIRE(cuMemcpyHtoD(ptr, host.data(), n * sizeof(float)) == CUDA_SUCCESS);
  }
  ~DeviceFloats() { cuMemFree(ptr); }
  DeviceFloats(const DeviceFloats&) = delete;
  float* at(size_t i = 0) const { return reinterpret_cast<float*>(ptr) + i; }
  std::vector<float> read() const {
    std::vector<float> host(n);
    if (n) REQUIRE(cuMemcpyDtoH(host.data(), ptr, n * sizeof(float)) == CUDA_SUCCESS);
    return host;
  }
};

float val(int rank, size_t i) { return static_cast<float>((rank + 1) * 1000 + i % 1000); }
// Element i of a sum over n ranks of val, added in rank order.
float sumOfVals(int n, size_t i) {
  float t = 0;
  for (int q = 0; q < n; ++q) t += val(q, i);
  return t;
}

// Runs body(rank, comm, stream) on n threads, each with its own communicator
// of one clique, device 0 current and a stream of its own.
void onThreads(int n, const std::function<void(int, ncclComm_t, CUstream)>& body) {
  const std::vector<std::string> failures =
      shoal::testing::deviceThreads(n, [&](int r, ncclComm_t comm, CUstream s) {
        body(r, comm, s);
        return std::string();
      });
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r << ": " << failures[r]);
    CHECK(failures[r].empty());
  }
}

// The body runs on a thread without Catch2's assertions (not thread-safe):
// it records mismatches, checked afterwards.
struct Mismatches {
  std::atomic<int> count{0};
  std::string first;
  std::mutex mutex;
  void expect(bool ok, const std::string& what) {
    if (ok) return;
    if (count.fetch_add(1) == 0) {
      std::lock_guard<std::mutex> lock(mutex);
      first = what;
    }
  }
};

// Every collective and Send/Recv on device buffers at rank r of n; returns
// through `bad` any wrong element.
void everyCollective(int r, int n, ncclComm_t comm, CUstream s, Mismatches& bad) {
  const size_t N = 1000;
  auto check = [&](const DeviceFloats& buf, const std::function<float(size_t)>& want, const char* what) {
    cuStreamSynchronize(s);
    std::vector<float> got = buf.read();
    for (size_t i = 0; i < got.size(); ++i)
      if (got[i] != want(i)) {
        std::ostringstream m;
        m << what << " rank " << r << " element " << i << ": " << got[i] << " want " << want(i);
        bad.expect(false, m.str());
        return;
      }
  };
  auto sum = [&](size_t i) { return sumOfVals(n, i); };
  DeviceFloats send(N, [&](size_t i) { return val(r, i); });
  {
    DeviceFloats recv(N);
    bad.expect(ncclAllReduce(send.at(), recv.at(), N, ncclFloat, ncclSum, comm, s) == ncclSuccess, "AllReduce call");
    check(recv, sum, "AllReduce");
  }
  {
    DeviceFloats inplace(N, [&](size_t i) { return val(r, i); });
    bad.expect(ncclAllReduce(inplace.at(), inplace.at(), N, ncclFloat, ncclMax, comm, s) == ncclSuccess, "AllReduce in place");
    check(inplace, [&](size_t i) { return val(n - 1, i); }, "AllReduce max in place");
  }
  {
    DeviceFloats recv(N * n);
    bad.expect(ncclAllGather(send.at(), recv.at(), N, ncclFloat, comm, s) == ncclSuccess, "AllGather call");
    check(recv, [&](size_t i) { return val(static_cast<int>(i / N), i % N); }, "AllGather");
  }
  {
    DeviceFloats big(N * n, [&](size_t i) { return val(r, i); });
    DeviceFloats recv(N);
    bad.expect(ncclReduceScatter(big.at(), recv.at(), N, ncclFloat, ncclSum, comm, s) == ncclSuccess, "ReduceScatter call");
    check(recv, [&](size_t i) { return sum(r * N + i); }, "ReduceScatter");
  }
  {
    const int root = n - 1;
    DeviceFloats recv(N);
    bad.expect(ncclBroadcast(send.at(), recv.at(), N, ncclFloat, root, comm, s) == ncclSuccess, "Broadcast call");
    check(recv, [&](size_t i) { return val(root, i); }, "Broadcast");
    DeviceFloats red(N);
    bad.expect(ncclReduce(send.at(), red.at(), N, ncclFloat, ncclSum, 0, comm, s) == ncclSuccess, "Reduce call");
    if (r == 0) check(red, sum, "Reduce");
  }
  {
    const size_t per = 100;
    DeviceFloats a2a(per * n, [&](size_t i) { return val(r, i); });
    DeviceFloats recv(per * n);
    bad.expect(ncclAlltoAll(a2a.at(), recv.at(), per, ncclFloat, comm, s) == ncclSuccess, "AlltoAll call");
    check(recv, [&](size_t i) { return val(static_cast<int>(i / per), r * per + i % per); }, "AlltoAll");
    DeviceFloats gathered(per * n);
    bad.expect(ncclGather(a2a.at(), gathered.at(), per, ncclFloat, 0, comm, s) == ncclSuccess, "Gather call");
    if (r == 0) check(gathered, [&](size_t i) { return val(static_cast<int>(i / per), i % per); }, "Gather");
    DeviceFloats part(per);
    bad.expect(ncclScatter(a2a.at(), part.at(), per, ncclFloat, 0, comm, s) == ncclSuccess, "Scatter call");
    check(part, [&](size_t i) { return val(0, r * per + i); }, "Scatter");
  }
  {
    // A ring of Send/Recv in one group.
    DeviceFloats recv(N);
    const int to = (r + 1) % n, from = (r + n - 1) % n;
    ncclGroupStart();
    ncclSend(send.at(), N, ncclFloat, to, comm, s);
    ncclRecv(recv.at(), N, ncclFloat, from, comm, s);
    bad.expect(ncclGroupEnd() == ncclSuccess, "Send/Recv group");
    check(recv, [&](size_t i) { return val(from, i); }, "Send/Recv");
  }
}

// A one-rank communicator made with device 0 current (a device communicator).
ncclComm_t soloComm() {
  ncclUniqueId id;
  NCCL_OK(ncclGetUniqueId(&id));
  ncclComm_t comm = nullptr;
  NCCL_OK(ncclCommInitRank(&comm, 1, id, 0));
  return comm;
}

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Forked ranks' INFO logs of the INIT subsystem, a file per process.
class RankLogs {
 public:
  RankLogs() {
    int fd = mkstemp(path_);
    REQUIRE(fd >= 0);
    close(fd);
  }
  ~RankLogs() { ::unlink(path_); }
  RankLogs(const RankLogs&) = delete;
  RankLogs& operator=(const RankLogs&) = delete;
  // The variables that send them there.
  std::vector<std::pair<std::string, std::string>> env() const {
    return {{"NCCL_DEBUG", "INFO"}, {"NCCL_DEBUG_SUBSYS", "INIT"}, {"NCCL_DEBUG_FILE", std::string(path_) + ".%p"}};
  }
  // Every rank's log, read and removed.
  std::string collect(const shoal::testing::MpResult& result) const {
    std::string log;
    for (const auto& r : result.ranks) {
      std::string path = std::string(path_) + "." + std::to_string(r.pid);
      log += readFile(path);
      ::unlink(path.c_str());
    }
    return log;
  }

 private:
  char path_[32] = "/tmp/shoal-cudafake-log-XXXXXX";
};

}  // namespace

TEST_CASE("device pointers go to the stream path - host pointers stay on the host path - mixing them is an invalid argument", "[cudafake]") {
  useDevice0();
  CUstream s = newStream();
  ncclComm_t comm = soloComm();
  int dev = -1;
  NCCL_OK(ncclCommCuDevice(comm, &dev));
  CHECK(dev == 0);

  DeviceFloats send(256, [](size_t i) { return static_cast<float>(i); });
  DeviceFloats recv(256);
  const auto copiesBefore = shoalFakeCudaCallCount("cuMemcpyAsync");
  NCCL_OK(ncclAllReduce(send.at(), recv.at(), 256, ncclFloat, ncclSum, comm, s));
  CHECK(shoalFakeCudaCallCount("cuMemcpyAsync") > copiesBefore);  // staged on the stream
  CU_OK(cuStreamSynchronize(s));
  std::vector<float> got = recv.read();
  for (size_t i = 0; i < got.size(); ++i) REQUIRE(got[i] == static_cast<float>(i));

  // Host buffers: the host path, complete on return, no stream work.
  std::vector<float> hsend(64, 3.0f), hrecv(64, 0.0f);
  const auto memcpysBefore = shoalFakeCudaCallCount("cuMemcpyAsync");
  NCCL_OK(ncclAllReduce(hsend.data(), hrecv.data(), 64, ncclFloat, ncclSum, comm, s));
  CHECK(hrecv[63] == 3.0f);
  CHECK(shoalFakeCudaCallCount("cuMemcpyAsync") == memcpysBefore);

  // Pinned host memory is memory CUDA knows: stream order.
  void* pinned = nullptr;
  CU_OK(cuMemHostAlloc(&pinned, 64 * sizeof(float), 0));
  std::fill_n(static_cast<float*>(pinned), 64, 5.0f);
  NCCL_OK(ncclAllReduce(pinned, recv.at(), 64, ncclFloat, ncclSum, comm, s));
  CU_OK(cuStreamSynchronize(s));
  CHECK(recv.read()[10] == 5.0f);

  // Device send, pageable recv (and the other way round): refused with the reason.
  CHECK(ncclAllReduce(send.at(), hrecv.data(), 64, ncclFloat, ncclSum, comm, s) == ncclInvalidArgument);
  std::string why = ncclGetLastError(comm);
  INFO(why);
  CHECK(why.find("cannot mix") != std::string::npos);
  CHECK(why.find("sendbuff is device memory") != std::string::npos);
  CHECK(ncclBroadcast(hsend.data(), recv.at(), 64, ncclFloat, 0, comm, s) == ncclInvalidArgument);
  // The communicator is still usable after refusals.
  NCCL_OK(ncclAllReduce(send.at(), recv.at(), 256, ncclFloat, ncclSum, comm, s));
  CU_OK(cuStreamSynchronize(s));
  CHECK(recv.read()[255] == 255.0f);
  CU_OK(cuMemFreeHost(pinned));
  NCCL_OK(ncclCommDestroy(comm));
  CU_OK(cuStreamDestroy(s));
}

TEST_CASE("a device collective returns before its stream reaches it and a later consumer sees the result", "[cudafake]") {
  useDevice0();
  Mismatches bad;
  std::atomic<double> slowestCallMs{0};
  onThreads(2, [&](int r, ncclComm_t comm, CUstream s) {
    DeviceFloats send(4096, [&](size_t i) { return val(r, i); });
    DeviceFloats recv(4096);
    shoalFakeCudaStreamDelay(s, 500);  // like a long kernel before the collective
    auto t0 = Clock::now();
    bad.expect(ncclAllReduce(send.at(), recv.at(), 4096, ncclFloat, ncclSum, comm, s) == ncclSuccess, "call");
    double ms = msSince(t0);
    double prev = slowestCallMs.load();
    while (ms > prev && !slowestCallMs.compare_exchange_weak(prev, ms)) {}
    // The consumer, enqueued after the collective: a copy out to host memory.
    std::vector<float> host(4096, -1.0f);
    cuMemcpyDtoHAsync(host.data(), recv.ptr, 4096 * sizeof(float), s);
    cuStreamSynchronize(s);
    for (size_t i = 0; i < host.size(); ++i)
      if (host[i] != val(0, i) + val(1, i)) {
        bad.expect(false, "consumer saw element " + std::to_string(i) + " = " + std::to_string(host[i]));
        break;
      }
  });
  INFO(bad.first);
  CHECK(bad.count == 0);
  INFO("slowest ncclAllReduce call " << slowestCallMs.load() << " ms");
  CHECK(slowestCallMs.load() < 400);  // it did not wait for the 500 ms delay
}

// Between ranks the loopback connections copy device buffers by the GPU,
// so the collectives run as device plans, reducing with the kernels; the
// stand-in makes device memory unreadable to host code, so a host copy of
// it would crash the test.
TEST_CASE("every collective on device buffers with 1 to 4 ranks as threads", "[cudafake]") {
  useDevice0();
  for (int n : {1, 2, 3, 4}) {
    Mismatches bad;
    const uint64_t launchesBefore = shoalFakeCudaCallCount("cuLaunchKernel");
    const uint64_t copiesBefore = shoalFakeCudaCallCount("cuMemcpyAsync");
    onThreads(n, [&](int r, ncclComm_t comm, CUstream s) { everyCollective(r, n, comm, s, bad); });
    INFO(n << " ranks: " << bad.first);
    CHECK(bad.count == 0);
    const uint64_t launches = shoalFakeCudaCallCount("cuLaunchKernel") - launchesBefore;
    const uint64_t copies = shoalFakeCudaCallCount("cuMemcpyAsync") - copiesBefore;
    INFO("kernel launches " << launches << ", async copies " << copies);
    // Each rank reduces at least once in each of the two AllReduces and the
    // ReduceScatter (staged, the CPU would reduce: no kernel at all).
    if (n > 1) CHECK(launches >= 3u * static_cast<uint64_t>(n));
  }
}

// Large calls between threads: the sizes where the host path would read the
// peers' buffers in place (peer_read), which device buffers outside windows
// cannot offer, must still run on the GPU (reduced by the kernels), not be
// staged through host memory and reduced by the CPU.
TEST_CASE("large collectives on device buffers between threads reduce on the GPU", "[cudafake]") {
  useDevice0();
  const size_t N = size_t{1} << 20;  // 4 MiB of floats
  for (int n : {2, 3}) {
    Mismatches bad;
    const uint64_t launchesBefore = shoalFakeCudaReduceLaunchesOn(0);
    onThreads(n, [&](int r, ncclComm_t comm, CUstream s) {
      auto expectAll = [&](const DeviceFloats& buf, const std::function<float(size_t)>& want, const char* what) {
        cuStreamSynchronize(s);
        std::vector<float> got = buf.read();
        for (size_t i = 0; i < got.size(); ++i)
          if (got[i] != want(i)) {
            bad.expect(false, std::string(what) + " rank " + std::to_string(r) + " element " + std::to_string(i));
            return;
          }
      };
      DeviceFloats send(N * n, [&](size_t i) { return val(r, i); });
      DeviceFloats recv(N * n);
      bad.expect(ncclAllReduce(send.at(), recv.at(), N, ncclFloat, ncclSum, comm, s) == ncclSuccess, "AllReduce");
      expectAll(recv, [&](size_t i) { return i < N ? sumOfVals(n, i) : -1.0f; }, "AllReduce");
      DeviceFloats part(N);
      bad.expect(ncclReduceScatter(send.at(), part.at(), N, ncclFloat, ncclSum, comm, s) == ncclSuccess,
                 "ReduceScatter");
      expectAll(part, [&](size_t i) { return sumOfVals(n, r * N + i); }, "ReduceScatter");
      bad.expect(ncclAllGather(send.at(), recv.at(), N, ncclFloat, comm, s) == ncclSuccess, "AllGather");
      expectAll(recv, [&](size_t i) { return val(static_cast<int>(i / N), i % N); }, "AllGather");
    });
    INFO(n << " ranks: " << bad.first);
    CHECK(bad.count == 0);
    // Every rank reduces in the AllReduce and in the ReduceScatter.
    CHECK(shoalFakeCudaReduceLaunchesOn(0) - launchesBefore >= 2u * static_cast<uint64_t>(n));
  }
}

// Ranks that are threads of one process run stream plans over loopback's
// stream ring, as processes do over cuda_ipc's: the host takes no step
// while the streams run an operation (no stream synchronization, no event
// query), a stream wait per chunk, the reductions by the kernels. Threads
// on one GPU do so only when told (SHOAL_CUDA_STREAM_PLANS=1: their streams
// share its hardware queues); by default they run device plans.
TEST_CASE("stream plans between threads run with no host step and give the right bytes", "[cudafake]") {
  useDevice0();
  // 8 KiB slots: every message in many chunks, the ring wrapping many times.
  shoal::testing::ScopedEnv env{{"SHOAL_LOOPBACK_RING_BYTES", "65536"}, {"SHOAL_CUDA_STREAM_PLANS", "1"}};
  const int n = 3;
  const size_t N = 30000;  // 120 KB per rank
  const char* watched[] = {"cuStreamSynchronize", "cuEventQuery", "cuEventSynchronize", "cuCtxSynchronize",
                           "cuStreamWaitValue64", "cuLaunchKernel"};
  uint64_t before[6] = {}, delta[6] = {};
  std::barrier phase(n);
  Mismatches bad;
  onThreads(n, [&](int r, ncclComm_t comm, CUstream s) {
    DeviceFloats send(N * n, [&](size_t i) { return val(r, i); });
    DeviceFloats ar(N), ag(N * n), rs(N);
    // Connections, kernels and scratch first.
    bad.expect(ncclAllReduce(send.at(), ar.at(), N, ncclFloat, ncclSum, comm, s) == ncclSuccess, "warm-up");
    cuStreamSynchronize(s);
    phase.arrive_and_wait();
    if (r == 0)
      for (int k = 0; k < 6; ++k) before[k] = shoalFakeCudaCallCount(watched[k]);
    phase.arrive_and_wait();
    shoalFakeCudaStreamDelay(s, 100);  // the calls return before any of their work runs
    bad.expect(ncclAllReduce(send.at(), ar.at(), N, ncclFloat, ncclSum, comm, s) == ncclSuccess, "AllReduce");
    bad.expect(ncclAllGather(send.at(), ag.at(), N, ncclFloat, comm, s) == ncclSuccess, "AllGather");
    bad.expect(ncclReduceScatter(send.at(), rs.at(), N, ncclFloat, ncclSum, comm, s) == ncclSuccess,
               "ReduceScatter");
    // Waited for without a synchronizing call.
    auto t0 = Clock::now();
    while (cuStreamQuery(s) == CUDA_ERROR_NOT_READY && msSince(t0) < 30000) ::usleep(1000);
    bad.expect(cuStreamQuery(s) == CUDA_SUCCESS, "the stream finished");
    phase.arrive_and_wait();
    if (r == 0)
      for (int k = 0; k < 6; ++k) delta[k] = shoalFakeCudaCallCount(watched[k]) - before[k];
    phase.arrive_and_wait();
    ncclResult_t async = ncclInProgress;
    ncclCommGetAsyncError(comm, &async);
    bad.expect(async == ncclSuccess, "no asynchronous error");
    std::vector<float> got = ar.read();
    for (size_t i = 0; i < N; ++i) bad.expect(got[i] == sumOfVals(n, i), "AllReduce element " + std::to_string(i));
    got = ag.read();
    for (size_t i = 0; i < N * n; ++i)
      bad.expect(got[i] == val(static_cast<int>(i / N), i % N), "AllGather element " + std::to_string(i));
    got = rs.read();
    for (size_t i = 0; i < N; ++i)
      bad.expect(got[i] == sumOfVals(n, r * N + i), "ReduceScatter element " + std::to_string(i));
  });
  INFO(bad.first);
  CHECK(bad.count == 0);
  INFO("synchronize " << delta[0] << ", event queries " << delta[1] << ", stream waits " << delta[4]
                      << ", kernel launches " << delta[5]);
  CHECK(delta[0] == 0);
  CHECK(delta[1] == 0);
  CHECK(delta[2] == 0);
  CHECK(delta[3] == 0);
  CHECK(delta[4] >= 3u * 15u);  // a wait per chunk: 120 KB in 8 KiB chunks, three operations
  CHECK(delta[5] > 0);          // the reductions by the kernels
}

// NCCL's Gather by Send/Recv: the root receives from every rank, itself
// included, in one group, and every rank sends to it. The root's Send/Recv
// to itself is a copy on its stream, so the rest of its group runs on the
// streams as its peers' single Sends do (a group with a lane to itself ran
// host-stepped on the root alone, and met nobody until the deadline).
TEST_CASE("a Gather by Send/Recv with the root sending to itself runs on the streams of every rank", "[cudafake]") {
  useDevice0();
  shoal::testing::ScopedEnv env{{"SHOAL_CUDA_STREAM_PLANS", "1"}, {"SHOAL_PROGRESS_TIMEOUT_MS", "10000"}};
  const int n = 3, root = 1;
  const size_t N = 5000;
  Mismatches bad;
  onThreads(n, [&](int r, ncclComm_t comm, CUstream s) {
    DeviceFloats send(N, [&](size_t i) { return val(r, i); });
    DeviceFloats gathered(N * n);
    CUstream other = nullptr;  // the root's receives on a second stream
    cuStreamCreate(&other, CU_STREAM_NON_BLOCKING);
    bad.expect(ncclGroupStart() == ncclSuccess, "group start");
    bad.expect(ncclSend(send.at(), N, ncclFloat, root, comm, s) == ncclSuccess, "Send");
    if (r == root)
      for (int q = 0; q < n; ++q)
        bad.expect(ncclRecv(gathered.at(q * N), N, ncclFloat, q, comm, q % 2 ? other : s) == ncclSuccess, "Recv");
    {
      ncclResult_t rc = ncclGroupEnd();
      bad.expect(rc == ncclSuccess, std::string("group end: ") + std::to_string(rc) + " " + ncclGetLastError(comm));
    }
    bad.expect(cuStreamSynchronize(s) == CUDA_SUCCESS && cuStreamSynchronize(other) == CUDA_SUCCESS, "streams");
    ncclResult_t async = ncclInProgress;
    ncclCommGetAsyncError(comm, &async);
    bad.expect(async == ncclSuccess, std::string("no asynchronous error: ") + ncclGetLastError(comm));
    if (r == root) {
      std::vector<float> got = gathered.read();
      for (size_t i = 0; i < N * n; ++i)
        bad.expect(got[i] == val(static_cast<int>(i / N), i % N), "element " + std::to_string(i));
    }
    cuStreamDestroy(other);
  });
  INFO(bad.first);
  CHECK(bad.count == 0);
}

// The stream that carries only the root's Recv from itself is still one of
// the group's: a consumer on it after ncclGroupEnd sees every rank's block,
// even when a peer's stream reaches the call late.
TEST_CASE("a stream with only a pair to itself waits for the rest of its group", "[cudafake]") {
  useDevice0();
  for (const char* plans : {"0", "1"}) {
    shoal::testing::ScopedEnv env{{"SHOAL_CUDA_STREAM_PLANS", plans}, {"SHOAL_PROGRESS_TIMEOUT_MS", "10000"}};
    const int n = 3, root = 1;
    const size_t N = 5000;
    Mismatches bad;
    onThreads(n, [&](int r, ncclComm_t comm, CUstream s) {
      DeviceFloats send(N, [&](size_t i) { return val(r, i); });
      DeviceFloats gathered(N * n, [](size_t) { return -1.0f; });
      CUstream other = nullptr;  // the root's Recv from itself alone
      cuStreamCreate(&other, CU_STREAM_NON_BLOCKING);
      if (r == 0) shoalFakeCudaStreamDelay(s, 500);
      bad.expect(ncclGroupStart() == ncclSuccess, "group start");
      bad.expect(ncclSend(send.at(), N, ncclFloat, root, comm, s) == ncclSuccess, "Send");
      if (r == root)
        for (int q = 0; q < n; ++q)
          bad.expect(ncclRecv(gathered.at(q * N), N, ncclFloat, q, comm, q == root ? other : s) == ncclSuccess,
                     "Recv");
      bad.expect(ncclGroupEnd() == ncclSuccess, "group end");
      if (r == root) {
        std::vector<float> got(N * n);
        cuMemcpyDtoHAsync(got.data(), reinterpret_cast<CUdeviceptr>(gathered.at()), N * n * sizeof(float), other);
        bad.expect(cuStreamSynchronize(other) == CUDA_SUCCESS, "the consumer's stream");
        for (size_t i = 0; i < N * n; ++i)
          bad.expect(got[i] == val(static_cast<int>(i / N), i % N), "element " + std::to_string(i));
      }
      bad.expect(cuStreamSynchronize(s) == CUDA_SUCCESS && cuStreamSynchronize(other) == CUDA_SUCCESS, "streams");
      cuStreamDestroy(other);
    });
    INFO("SHOAL_CUDA_STREAM_PLANS=" << plans << ": " << bad.first);
    CHECK(bad.count == 0);
  }
}

// A Send to oneself and its Recv on two streams are one copy on the Recv's
// stream, ordered both ways: it reads the send buffer only after the Send's
// stream has written it, and that stream overwrites it only after the copy.
TEST_CASE("a Send and a Recv to oneself on two streams wait for each other's work", "[cudafake]") {
  useDevice0();
  // Either the Send's stream is late (the copy must wait to read), or the
  // Recv's (the Send's stream must wait to overwrite).
  for (const bool sendLate : {true, false})
    for (const char* plans : {"0", "1"}) {
      shoal::testing::ScopedEnv env{{"SHOAL_CUDA_STREAM_PLANS", plans}, {"SHOAL_PROGRESS_TIMEOUT_MS", "10000"}};
      const size_t N = 5000;
      Mismatches bad;
      onThreads(2, [&](int r, ncclComm_t comm, CUstream s) {
        DeviceFloats send(N), recv(N);  // both -1
        std::vector<float> values(N), garbage(N, -7.0f);
        for (size_t i = 0; i < N; ++i) values[i] = val(r, i);
        CUstream other = nullptr;
        cuStreamCreate(&other, CU_STREAM_NON_BLOCKING);
        shoalFakeCudaStreamDelay(sendLate ? s : other, 400);
        cuMemcpyHtoDAsync(send.ptr, values.data(), N * sizeof(float), s);
        bad.expect(ncclGroupStart() == ncclSuccess, "group start");
        bad.expect(ncclSend(send.at(), N, ncclFloat, r, comm, s) == ncclSuccess, "Send");
        bad.expect(ncclRecv(recv.at(), N, ncclFloat, r, comm, other) == ncclSuccess, "Recv");
        bad.expect(ncclGroupEnd() == ncclSuccess, "group end");
        cuMemcpyHtoDAsync(send.ptr, garbage.data(), N * sizeof(float), s);  // reuses the send buffer
        bad.expect(cuStreamSynchronize(s) == CUDA_SUCCESS && cuStreamSynchronize(other) == CUDA_SUCCESS, "streams");
        std::vector<float> got = recv.read();
        for (size_t i = 0; i < N; ++i) bad.expect(got[i] == values[i], "element " + std::to_string(i));
        cuStreamDestroy(other);
      });
      INFO((sendLate ? "the Send's stream late" : "the Recv's stream late")
           << ", SHOAL_CUDA_STREAM_PLANS=" << plans << ": " << bad.first);
      CHECK(bad.count == 0);
    }
}

// An operation of no bytes has no buffer to tell its kind by: it goes with
// the device operations of its group (NCCL drops a zero-count collective
// and matches zero-byte Send/Recv; PyTorch's all_to_all sends empty splits),
// whichever communicator of the group comes first.
TEST_CASE("zero-count operations join a group of device operations", "[cudafake]") {
  useDevice0();
  CUstream s = newStream();
  const size_t N = 1000;
  DeviceFloats a(N, [](size_t i) { return static_cast<float>(i); });
  SECTION("a collective and a self Send/Recv of no bytes beside ones with bytes") {
    ncclComm_t comm = soloComm();
    DeviceFloats b(N), c(N);
    NCCL_OK(ncclGroupStart());
    NCCL_OK(ncclAllReduce(a.at(), b.at(), 0, ncclFloat, ncclSum, comm, s));
    NCCL_OK(ncclAllReduce(a.at(), b.at(), N, ncclFloat, ncclSum, comm, s));
    NCCL_OK(ncclSend(a.at(), 0, ncclFloat, 0, comm, s));
    NCCL_OK(ncclRecv(c.at(), 0, ncclFloat, 0, comm, s));
    NCCL_OK(ncclSend(a.at(), N, ncclFloat, 0, comm, s));
    NCCL_OK(ncclRecv(c.at(), N, ncclFloat, 0, comm, s));
    NCCL_OK(ncclGroupEnd());
    CU_OK(cuStreamSynchronize(s));
    CHECK(b.read() == a.read());
    CHECK(c.read() == a.read());
    // Alone, as NCCL: returns at once, on the stream.
    NCCL_OK(ncclAllReduce(a.at(), b.at(), 0, ncclFloat, ncclSum, comm, s));
    NCCL_OK(ncclGroupStart());
    NCCL_OK(ncclSend(a.at(), 0, ncclFloat, 0, comm, s));
    NCCL_OK(ncclRecv(c.at(), 0, ncclFloat, 0, comm, s));
    NCCL_OK(ncclGroupEnd());
    CU_OK(cuStreamSynchronize(s));
    ncclCommDestroy(comm);
  }
  SECTION("after a call on host memory, a group of device calls whose first moves no bytes") {
    ncclComm_t comm = soloComm();
    std::vector<float> h(N, 1.0f);
    NCCL_OK(ncclAllReduce(h.data(), h.data(), N, ncclFloat, ncclSum, comm, nullptr));
    DeviceFloats b(N);
    NCCL_OK(ncclGroupStart());
    NCCL_OK(ncclSend(a.at(), 0, ncclFloat, 0, comm, s));
    NCCL_OK(ncclRecv(b.at(), 0, ncclFloat, 0, comm, s));
    NCCL_OK(ncclAllReduce(a.at(), b.at(), N, ncclFloat, ncclSum, comm, s));
    CHECK(ncclGroupEnd() == ncclSuccess);
    INFO(ncclGetLastError(comm));
    CU_OK(cuStreamSynchronize(s));
    CHECK(b.read() == a.read());
    ncclCommDestroy(comm);
  }
  SECTION("a communicator of zero counts first, one with bytes next") {
    ncclComm_t first = soloComm(), second = soloComm();
    DeviceFloats b(N);
    NCCL_OK(ncclGroupStart());
    NCCL_OK(ncclAllReduce(a.at(), b.at(), 0, ncclFloat, ncclSum, first, s));
    NCCL_OK(ncclAllReduce(a.at(), b.at(), N, ncclFloat, ncclSum, second, s));
    NCCL_OK(ncclGroupEnd());
    CU_OK(cuStreamSynchronize(s));
    CHECK(b.read() == a.read());
    ncclCommDestroy(first);
    ncclCommDestroy(second);
  }
  SECTION("a communicator on host memory and one on device memory mix, in either order") {
    ncclComm_t host = soloComm(), device = soloComm();
    std::vector<float> h(N, 1.0f), hout(N);
    DeviceFloats b(N);
    for (bool hostFirst : {true, false}) {
      NCCL_OK(ncclGroupStart());
      if (hostFirst) NCCL_OK(ncclAllReduce(h.data(), hout.data(), N, ncclFloat, ncclSum, host, nullptr));
      NCCL_OK(ncclAllReduce(a.at(), b.at(), N, ncclFloat, ncclSum, device, s));
      if (!hostFirst) NCCL_OK(ncclAllReduce(h.data(), hout.data(), N, ncclFloat, ncclSum, host, nullptr));
      CHECK(ncclGroupEnd() == ncclInvalidArgument);
      CHECK(std::string(ncclGetLastError(nullptr)).find("a group mixes communicators") != std::string::npos);
    }
    CU_OK(cuStreamSynchronize(s));
    ncclCommDestroy(host);
    ncclCommDestroy(device);
  }
  cuStreamDestroy(s);
}

// An all-to-all with empty splits, as PyTorch issues it: zero-byte Send/Recv
// between ranks in the group beside ones with bytes, every path.
TEST_CASE("an all-to-all with empty splits between threads", "[cudafake]") {
  useDevice0();
  for (const char* plans : {"0", "1"}) {
    shoal::testing::ScopedEnv env{{"SHOAL_CUDA_STREAM_PLANS", plans}};
    const int n = 3;
    const size_t N = 5000;
    Mismatches bad;
    onThreads(n, [&](int r, ncclComm_t comm, CUstream s) {
      // Rank r sends N * r elements to each peer (rank 0 sends nothing).
      DeviceFloats send(N * r + 1, [&](size_t i) { return val(r, i); });
      std::vector<std::unique_ptr<DeviceFloats>> recv;
      for (int p = 0; p < n; ++p)
        recv.push_back(std::make_unique<DeviceFloats>(N * p + 1, [](size_t) { return -1.0f; }));
      bad.expect(ncclGroupStart() == ncclSuccess, "group");
      for (int p = 0; p < n; ++p) {
        bad.expect(ncclSend(send.at(), N * r, ncclFloat, p, comm, s) == ncclSuccess, "Send");
        bad.expect(ncclRecv(recv[p]->at(), N * p, ncclFloat, p, comm, s) == ncclSuccess, "Recv");
      }
      {
      ncclResult_t rc = ncclGroupEnd();
      bad.expect(rc == ncclSuccess, std::string("group end: ") + std::to_string(rc) + " " + ncclGetLastError(comm));
    }
      bad.expect(cuStreamSynchronize(s) == CUDA_SUCCESS, "stream");
      for (int p = 0; p < n; ++p) {
        std::vector<float> got = recv[p]->read();
        for (size_t i = 0; i < N * p; ++i) bad.expect(got[i] == val(p, i), "from rank " + std::to_string(p));
        bad.expect(got[N * p] == -1.0f, "past the end from rank " + std::to_string(p));
      }
    });
    INFO("SHOAL_CUDA_STREAM_PLANS=" << plans << ": " << bad.first);
    CHECK(bad.count == 0);
  }
}

// On pageable host memory the same: a rank whose part is all empty goes as
// its communicator's calls with buffers went (the host path), so it meets
// its peers' host-path Recv of no bytes instead of a stream plan nobody runs.
TEST_CASE("an all-to-all with empty splits on host memory between threads", "[cudafake]") {
  useDevice0();
  shoal::testing::ScopedEnv env{{"SHOAL_CUDA_STREAM_PLANS", "1"}, {"SHOAL_PROGRESS_TIMEOUT_MS", "10000"}};
  const int n = 3;
  const size_t N = 5000;
  Mismatches bad;
  onThreads(n, [&](int r, ncclComm_t comm, CUstream s) {
    std::vector<float> warm(16, 1.0f);
    bad.expect(ncclAllReduce(warm.data(), warm.data(), 16, ncclFloat, ncclSum, comm, s) == ncclSuccess, "warm-up");
    // Rank 0 sends and receives nothing; the others N elements each way.
    const size_t mine = r == 0 ? 0 : N;
    std::vector<float> send(N, static_cast<float>(r + 1));
    std::vector<std::vector<float>> recv(n, std::vector<float>(N, -1.0f));
    bad.expect(ncclGroupStart() == ncclSuccess, "group");
    for (int p = 0; p < n; ++p) {
      const size_t theirs = p == 0 ? 0 : N;
      bad.expect(ncclSend(send.data(), std::min(mine, theirs), ncclFloat, p, comm, s) == ncclSuccess, "Send");
      bad.expect(ncclRecv(recv[p].data(), std::min(mine, theirs), ncclFloat, p, comm, s) == ncclSuccess, "Recv");
    }
    {
      ncclResult_t rc = ncclGroupEnd();
      bad.expect(rc == ncclSuccess, std::string("group end: ") + std::to_string(rc) + " " + ncclGetLastError(comm));
    }
    for (int p = 1; p < n && r != 0; ++p)
      bad.expect(recv[p][N - 1] == static_cast<float>(p + 1), "from rank " + std::to_string(p));
  });
  INFO(bad.first);
  CHECK(bad.count == 0);
}

// Send/Recv pairs to oneself must match in size, as any Send and Recv; the
// communicator fails, as on host memory.
TEST_CASE("a Send to oneself and a Recv from oneself of other sizes are an invalid usage", "[cudafake]") {
  useDevice0();
  ncclComm_t comm = soloComm();
  CUstream s = newStream();
  DeviceFloats a(100), b(100);
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclSend(a.at(), 100, ncclFloat, 0, comm, s));
  NCCL_OK(ncclRecv(b.at(), 50, ncclFloat, 0, comm, s));
  CHECK(ncclGroupEnd() == ncclInvalidUsage);
  const std::string cause = "Send to itself #0 of 400 bytes meets Recv from itself #0 of 200 bytes";
  CHECK(std::string(ncclGetLastError(comm)).find(cause) != std::string::npos);
  ncclResult_t async = ncclSuccess;
  NCCL_OK(ncclCommGetAsyncError(comm, &async));
  CHECK(async == ncclInvalidUsage);
  CHECK(ncclAllReduce(a.at(), a.at(), 100, ncclFloat, ncclSum, comm, s) == ncclInvalidUsage);
  CHECK(std::string(ncclGetLastError(comm)).find(cause) != std::string::npos);
  cuStreamSynchronize(s);
  cuStreamDestroy(s);
  ncclCommDestroy(comm);
}

// A thread whose peer destroys its communicator while this one's stream
// plan waits on their stream ring learns of it at the liveness check
// (SHOAL_IDLE_CHECK_MS), not at the no-progress deadline; its stream goes on.
TEST_CASE("a thread's stream plan whose peer destroyed its communicator fails at the liveness check", "[cudafake]") {
  useDevice0();
  shoal::testing::ScopedEnv env{{"SHOAL_CUDA_STREAM_PLANS", "1"}, {"SHOAL_IDLE_CHECK_MS", "200"}};
  std::barrier warm(2);
  Mismatches bad;
  std::string error;
  double failedAfterMs = -1;
  onThreads(2, [&](int r, ncclComm_t comm, CUstream s) {
    const size_t N = 1000;
    DeviceFloats send(N, [&](size_t i) { return val(r, i); });
    DeviceFloats recv(N);
    bad.expect(ncclAllReduce(send.at(), recv.at(), N, ncclFloat, ncclSum, comm, s) == ncclSuccess, "warm-up");
    cuStreamSynchronize(s);
    warm.arrive_and_wait();
    if (r == 0) return;  // its communicator is destroyed now; it never calls again
    auto t0 = Clock::now();
    bad.expect(ncclAllReduce(send.at(), recv.at(), N, ncclFloat, ncclSum, comm, s) == ncclSuccess, "the call");
    ncclResult_t async = ncclSuccess;
    while (msSince(t0) < 60000) {
      ncclCommGetAsyncError(comm, &async);
      if (async != ncclSuccess && async != ncclInProgress) break;
      ::usleep(10000);
    }
    failedAfterMs = msSince(t0);
    error = ncclGetLastError(comm);
    bad.expect(async == ncclRemoteError, "the call failed with ncclRemoteError");
    bad.expect(cuStreamSynchronize(s) == CUDA_SUCCESS, "its stream went on");
  });
  INFO(bad.first << "; " << error << " after " << failedAfterMs << " ms");
  CHECK(bad.count == 0);
  CHECK(error.find("closed its end of the loopback connection") != std::string::npos);
  CHECK(failedAfterMs < 30000);  // the no-progress deadline is 300 s
}

// Threads on one GPU share its context's hardware queues, where a stream
// waiting on a word another rank's stream writes could hold that stream
// back: by default they run device plans (the host steps, waiting for each
// GPU step), right bytes.
TEST_CASE("threads on one GPU run device plans by default", "[cudafake]") {
  useDevice0();
  Mismatches bad;
  const uint64_t syncsBefore = shoalFakeCudaCallCount("cuStreamSynchronize");
  const uint64_t waitsBefore = shoalFakeCudaCallCount("cuStreamWaitValue64");
  onThreads(2, [&](int r, ncclComm_t comm, CUstream s) {
    const size_t N = size_t{3} << 20;  // 12 MiB: three 4 MiB segments, each a few steps
    DeviceFloats send(N, [&](size_t i) { return val(r, i); });
    DeviceFloats recv(N);
    bad.expect(ncclAllReduce(send.at(), recv.at(), N, ncclFloat, ncclSum, comm, s) == ncclSuccess, "AllReduce");
    cuStreamSynchronize(s);
    std::vector<float> got = recv.read();
    for (size_t i = 0; i < N; ++i) bad.expect(got[i] == sumOfVals(2, i), "AllReduce element " + std::to_string(i));
  });
  INFO(bad.first);
  CHECK(bad.count == 0);
  // The device plan's steps are waited for: more than the test's own
  // synchronizations and the teardown's (6 in all with stream plans); the
  // stream waits only for "ready" handed over by the engine.
  const uint64_t syncs = shoalFakeCudaCallCount("cuStreamSynchronize") - syncsBefore;
  const uint64_t waits = shoalFakeCudaCallCount("cuStreamWaitValue64") - waitsBefore;
  INFO("synchronizations " << syncs << ", stream waits " << waits);
  CHECK(syncs > 12u);
  CHECK(waits <= 4u);
}

// A group of collectives between threads on one GPU runs as one device
// plan: its reductions in the kernels (staged, the CPU would reduce and no
// reduction kernel would run), with the right bytes.
TEST_CASE("a group on device buffers between threads runs as a device plan", "[cudafake]") {
  useDevice0();
  Mismatches bad;
  const unsigned long long kernelsBefore = shoalFakeCudaReduceLaunchesOn(0);
  constexpr int n = 2;
  onThreads(n, [&](int r, ncclComm_t comm, CUstream s) {
    const size_t N = 6000;
    DeviceFloats send(N, [&](size_t i) { return val(r, i); });
    DeviceFloats sum(N), part(N / n);
    bad.expect(ncclGroupStart() == ncclSuccess, "group start");
    bad.expect(ncclAllReduce(send.at(), sum.at(), N, ncclFloat, ncclSum, comm, s) == ncclSuccess, "AllReduce");
    bad.expect(ncclReduceScatter(send.at(), part.at(), N / n, ncclFloat, ncclSum, comm, s) == ncclSuccess,
               "ReduceScatter");
    bad.expect(ncclGroupEnd() == ncclSuccess, "group end");
    cuStreamSynchronize(s);
    std::vector<float> gotSum = sum.read(), gotPart = part.read();
    for (size_t i = 0; i < N; ++i) bad.expect(gotSum[i] == sumOfVals(n, i), "AllReduce element " + std::to_string(i));
    for (size_t i = 0; i < N / n; ++i)
      bad.expect(gotPart[i] == sumOfVals(n, r * (N / n) + i), "ReduceScatter element " + std::to_string(i));
  });
  INFO(bad.first);
  CHECK(bad.count == 0);
  CHECK(shoalFakeCudaReduceLaunchesOn(0) > kernelsBefore);
}

// With CUDA_DEVICE_MAX_CONNECTIONS below 4 streams share so few hardware
// queues that the user's stream, waiting for the host, would hold back a
// device plan's kernels and copies: such calls are staged (reduced by the
// CPU, no kernel), with the right bytes.
TEST_CASE("with few hardware queues device buffers between threads are staged, not device plans", "[cudafake]") {
  useDevice0();
  shoal::testing::ScopedEnv env{{"CUDA_DEVICE_MAX_CONNECTIONS", "1"}};
  Mismatches bad;
  const uint64_t launchesBefore = shoalFakeCudaCallCount("cuLaunchKernel");
  onThreads(3, [&](int r, ncclComm_t comm, CUstream s) { everyCollective(r, 3, comm, s, bad); });
  INFO(bad.first);
  CHECK(bad.count == 0);
  CHECK(shoalFakeCudaCallCount("cuLaunchKernel") == launchesBefore);
}

// NCCL makes a communicator for the device current when the init is called;
// a group's inits run at ncclGroupEnd on threads of their own, and a
// nonblocking one on its own thread, so each must carry the caller's context
// there (without it the communicators would have no device at all).
TEST_CASE("inits in a group and nonblocking inits take the device current at the call", "[cudafake]") {
  useDevice0();
  auto expectDevice0 = [](ncclComm_t comm) {
    int device = -2;
    NCCL_OK(ncclCommCuDevice(comm, &device));
    CHECK(device == 0);
  };
  for (ncclComm_t comm : groupInitTwoRanks()) {
    expectDevice0(comm);
    NCCL_OK(ncclCommDestroy(comm));
  }

  ncclUniqueId id;
  NCCL_OK(ncclGetUniqueId(&id));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comms[2] = {nullptr, nullptr};
  for (int r = 0; r < 2; ++r) {
    ncclResult_t rc = ncclCommInitRankConfig(&comms[r], 2, id, r, &config);
    CHECK((rc == ncclInProgress || rc == ncclSuccess));
  }
  for (ncclComm_t comm : comms) {
    ncclResult_t state = ncclInProgress;
    auto t0 = Clock::now();
    while (state == ncclInProgress && msSince(t0) < 20000) {
      ncclCommGetAsyncError(comm, &state);
      ::usleep(1000);
    }
    REQUIRE(state == ncclSuccess);
    expectDevice0(comm);
  }
  for (ncclComm_t comm : comms) NCCL_OK(ncclCommDestroy(comm));
}

TEST_CASE("several ranks on one GPU are allowed by default and refused with NCCL_MULTI_RANK_GPU_ENABLE=0", "[cudafake]") {
  useDevice0();
  // Allowed (the other tests run 2-4 ranks on device 0 this way); refused
  // only when asked, on every rank alike, naming the ranks and the variable.
  shoal::testing::ScopedEnv env{{"NCCL_MULTI_RANK_GPU_ENABLE", "0"}};
  ncclUniqueId id;
  NCCL_OK(ncclGetUniqueId(&id));
  std::vector<ncclResult_t> rc(2, ncclSuccess);
  std::vector<std::string> why(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      cuInit(0);
      CUcontext ctx = nullptr;
      cuDevicePrimaryCtxRetain(&ctx, 0);
      cuCtxSetCurrent(ctx);
      ncclComm_t comm = nullptr;
      rc[r] = ncclCommInitRank(&comm, 2, id, r);
      why[r] = ncclGetLastError(nullptr);
      if (rc[r] == ncclSuccess) ncclCommDestroy(comm);
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << why[r]);
    CHECK(rc[r] == ncclInvalidUsage);
    CHECK(why[r].find("ranks 0 and 1 use the same GPU") != std::string::npos);
    CHECK(why[r].find("NCCL_MULTI_RANK_GPU_ENABLE=0") != std::string::npos);
  }
}

TEST_CASE("several data types and operators on device buffers", "[cudafake]") {
  useDevice0();
  Mismatches bad;
  onThreads(3, [&](int r, ncclComm_t comm, CUstream s) {
    const size_t N = 777;
    // int32 sum and max, double avg, bf16 sum (exact small integers).
    std::vector<int32_t> ints(N);
    for (size_t i = 0; i < N; ++i) ints[i] = static_cast<int32_t>(i) * (r + 1) - 5;
    CUdeviceptr di = 0, dout = 0;
    cuMemAlloc(&di, N * 8);
    cuMemAlloc(&dout, N * 8);
    cuMemcpyHtoD(di, ints.data(), N * 4);
    bad.expect(ncclAllReduce(reinterpret_cast<void*>(di), reinterpret_cast<void*>(dout), N, ncclInt32, ncclSum, comm, s) == ncclSuccess, "int sum");
    std::vector<int32_t> got(N);
    cuStreamSynchronize(s);
    cuMemcpyDtoH(got.data(), dout, N * 4);
    for (size_t i = 0; i < N; ++i)
      bad.expect(got[i] == static_cast<int32_t>(i) * 6 - 15, "int32 sum element " + std::to_string(i));
    bad.expect(ncclAllReduce(reinterpret_cast<void*>(di), reinterpret_cast<void*>(dout), N, ncclInt32, ncclMax, comm, s) == ncclSuccess, "int max");
    cuStreamSynchronize(s);
    cuMemcpyDtoH(got.data(), dout, N * 4);
    for (size_t i = 1; i < N; ++i)
      bad.expect(got[i] == static_cast<int32_t>(i) * 3 - 5, "int32 max element " + std::to_string(i));
    std::vector<double> dbl(N, static_cast<double>(r + 1) * 1.5);
    cuMemcpyHtoD(di, dbl.data(), N * 8);
    bad.expect(ncclAllReduce(reinterpret_cast<void*>(di), reinterpret_cast<void*>(dout), N, ncclFloat64, ncclAvg, comm, s) == ncclSuccess, "double avg");
    std::vector<double> gotd(N);
    cuStreamSynchronize(s);
    cuMemcpyDtoH(gotd.data(), dout, N * 8);
    for (size_t i = 0; i < N; ++i)
      bad.expect(std::abs(gotd[i] - 3.0) < 1e-12, "double avg element " + std::to_string(i));
    // PreMulSum with a device scalar: read in stream order.
    double two = 2.0;
    CUdeviceptr scalar = 0;
    cuMemAlloc(&scalar, 8);
    cuMemcpyHtoD(scalar, &two, 8);
    ncclRedOp_t premul;
    bad.expect(ncclRedOpCreatePreMulSum(&premul, reinterpret_cast<void*>(scalar), ncclFloat64, ncclScalarDevice, comm) == ncclSuccess, "premul create");
    bad.expect(ncclAllReduce(reinterpret_cast<void*>(di), reinterpret_cast<void*>(dout), N, ncclFloat64, premul, comm, s) == ncclSuccess, "premul");
    cuStreamSynchronize(s);
    cuMemcpyDtoH(gotd.data(), dout, N * 8);
    for (size_t i = 0; i < N; ++i)
      bad.expect(gotd[i] == 2.0 * (1.5 + 3.0 + 4.5), "premulsum element " + std::to_string(i));
    ncclRedOpDestroy(premul, comm);
    cuMemFree(scalar);
    cuMemFree(di);
    cuMemFree(dout);
  });
  INFO(bad.first);
  CHECK(bad.count == 0);
}

TEST_CASE("a group with operations on two streams is ordered after both and before their later work", "[cudafake]") {
  useDevice0();
  Mismatches bad;
  onThreads(2, [&](int r, ncclComm_t comm, CUstream s) {
    CUstream other = nullptr;
    cuStreamCreate(&other, CU_STREAM_NON_BLOCKING);
    DeviceFloats a(500, [&](size_t i) { return val(r, i); });
    DeviceFloats b(500);
    DeviceFloats ra(500), rb(500);
    // b is written on the other stream after a delay: the group must wait for it.
    shoalFakeCudaStreamDelay(other, 300);
    std::vector<float> hb(500);
    for (size_t i = 0; i < 500; ++i) hb[i] = val(r, i) * 2;
    cuMemcpyHtoDAsync(b.ptr, hb.data(), 500 * sizeof(float), other);
    ncclGroupStart();
    ncclAllReduce(a.at(), ra.at(), 500, ncclFloat, ncclSum, comm, s);
    ncclAllReduce(b.at(), rb.at(), 500, ncclFloat, ncclSum, comm, other);
    bad.expect(ncclGroupEnd() == ncclSuccess, "group end");
    // A consumer on the other stream sees the group's result.
    std::vector<float> host(500, -1.0f);
    cuMemcpyDtoHAsync(host.data(), rb.ptr, 500 * sizeof(float), other);
    cuStreamSynchronize(other);
    cuStreamSynchronize(s);
    for (size_t i = 0; i < 500; ++i)
      bad.expect(host[i] == 2 * (val(0, i) + val(1, i)), "second stream's result element " + std::to_string(i));
    std::vector<float> got = ra.read();
    for (size_t i = 0; i < 500; ++i)
      bad.expect(got[i] == val(0, i) + val(1, i), "first stream's result element " + std::to_string(i));
    cuStreamDestroy(other);
  });
  INFO(bad.first);
  CHECK(bad.count == 0);
}

// Processes: each rank a forked child with its own stand-in state.
namespace {

shoal::testing::MpResult forkedRanks(int n, const std::string& transport,
                                     std::vector<std::pair<std::string, std::string>> env,
                                     const std::function<int(shoal::testing::MpChild&, ncclComm_t, CUstream)>& body,
                                     int hardLimitMs = 60000) {
  shoal::testing::MpConfig cfg;
  cfg.nranks = n;
  cfg.hardLimitMs = hardLimitMs;
  cfg.env = std::move(env);
  cfg.env.emplace_back("SHOAL_TRANSPORT", transport);
  return shoal::testing::forkedDeviceRanks(cfg, body);
}

// The communicator's asynchronous error once set (the job may still be
// failing on the engine's thread), looked at until 20 s after `since`.
ncclResult_t awaitAsyncError(ncclComm_t comm, Clock::time_point since) {
  ncclResult_t async = ncclInProgress;
  while ((async == ncclInProgress || async == ncclSuccess) && msSince(since) < 20000) {
    ncclCommGetAsyncError(comm, &async);
    ::usleep(10000);
  }
  return async;
}

// Rank 1 dies here, between collectives every rank has finished; the
// others go on 100 ms later.
void rankOneDiesHere(shoal::testing::MpChild& child) {
  if (child.rank() == 1) {
    child.barrier();
    ::kill(::getpid(), SIGKILL);
  }
  child.barrier();
  ::usleep(100000);
}

}  // namespace

TEST_CASE("every collective on device buffers as processes over shm, tcp and cuda_ipc", "[cudafake][mp]") {
  for (const char* transport : {"shm", "tcp", "cuda_ipc"})
    for (int n : {2, 3, 4}) {
      const bool devicePlans = std::string(transport) == "cuda_ipc";
      auto result = forkedRanks(n, transport, {}, [&](shoal::testing::MpChild& child, ncclComm_t comm, CUstream s) {
        Mismatches bad;
        const uint64_t launchesBefore = shoalFakeCudaCallCount("cuLaunchKernel");
        const uint64_t hostAllocsBefore = shoalFakeCudaCallCount("cuMemHostAlloc");
        everyCollective(child.rank(), child.nranks(), comm, s, bad);
        if (bad.count) child.log(bad.first);
        cuStreamSynchronize(s);
        // Over cuda_ipc, device plans: reductions by the kernels, no staging
        // beyond the first slot's words. Staged (shm, tcp) with stream memory
        // operations: no kernel at all.
        const uint64_t launches = shoalFakeCudaCallCount("cuLaunchKernel") - launchesBefore;
        const uint64_t hostAllocs = shoalFakeCudaCallCount("cuMemHostAlloc") - hostAllocsBefore;
        child.log("kernel launches " + std::to_string(launches) + ", pinned allocations " + std::to_string(hostAllocs));
        ncclCommDestroy(comm);
        if (bad.count) return 1;
        if (devicePlans && launches == 0) return 2;
        if (!devicePlans && launches != 0) return 3;
        return 0;
      });
      INFO(transport << " " << n << " ranks\n" << result.report());
      CHECK(result.allPassed());
    }
}

// Device-direct by default: processes of one host whose GPUs share memory
// choose cuda_ipc themselves (no SHOAL_TRANSPORT), so device buffers go GPU
// to GPU and reductions run in the kernels; the ranks agree at init, so one
// rank that cannot (its kernels did not load, its streams are synchronous,
// or NCCL_P2P_DISABLE=1) keeps every rank on staging over shm, with the
// reason logged, instead of failing calls or splitting the pairs; one rank
// whose streams run no stream plans keeps every rank on device plans.
TEST_CASE("ranks of one host go GPU to GPU over cuda_ipc by default, and all stage when one cannot", "[cudafake][mp]") {
  using Env = std::vector<std::pair<std::string, std::string>>;
  struct Variant {
    const char* what;
    Env env;
    std::vector<Env> rankEnv;
    bool deviceDirect;
    bool streamPlans;
    std::vector<std::string> logged;  // in the ranks' INFO logs
  };
  const std::string hidden = shoal::cuda::DeviceReducer::kernelName(shoal::DataType::kInt8, shoal::reduce::ElementOp::kSum);
  const std::vector<Variant> variants = {
      {"default", {}, {}, true, true, {"device-direct: device buffers move GPU to GPU", "via cuda_ipc", ": stream plans:"}},
      {"stream plans off everywhere", {{"SHOAL_CUDA_STREAM_PLANS", "0"}}, {}, true, false,
       {"device-direct: device buffers move GPU to GPU", "via cuda_ipc", ": device plans:"}},
      {"NCCL_P2P_DISABLE=1", {{"NCCL_P2P_DISABLE", "1"}}, {}, false, false,
       {"device buffers are staged through pinned host memory", "via shm"}},
      {"rank 1's kernels do not load", {}, {{}, {{"SHOAL_FAKECUDA_HIDE_KERNEL", hidden}}}, false, false,
       {"staged through pinned host memory (rank 1 cannot move device memory to every peer)",
        "the reduction kernels did not load", "via shm"}},
      // Its peers' connections carry no stream ring either: device plans on
      // every rank (the ring's sides would differ, and cuda_ipc refuses that).
      {"rank 2's streams run no stream plans", {}, {{}, {}, {{"SHOAL_CUDA_STREAM_PLANS", "0"}}}, true, false,
       {"device-direct: device buffers move GPU to GPU; no stream links, so device plans (rank 2 does not run "
        "stream plans", "via cuda_ipc", ": device plans:"}},
      // It stages every call, which goes better over shm than through cuda_ipc.
      {"rank 1's streams are synchronous", {}, {{}, {{"SHOAL_CUDA_WAIT", "sync"}}}, false, false,
       {"staged through pinned host memory (rank 1 cannot move device memory to every peer)",
        "device buffers cannot go GPU to GPU: its streams are synchronous", "via shm"}},
      // cuda_ipc's copies run on streams of its own, which so few hardware
      // queues would put behind the user's stream waiting for them.
      {"CUDA_DEVICE_MAX_CONNECTIONS=1", {{"CUDA_DEVICE_MAX_CONNECTIONS", "1"}}, {}, false, false,
       {"device buffers cannot go GPU to GPU: CUDA_DEVICE_MAX_CONNECTIONS is below 4", "via shm"}},
  };
  for (const Variant& v : variants) {
    RankLogs logs;
    shoal::testing::MpConfig cfg;
    cfg.nranks = 3;
    cfg.env = logs.env();
    cfg.env.insert(cfg.env.end(), v.env.begin(), v.env.end());
    cfg.env.emplace_back("SHOAL_TRANSPORT", "");  // not forced: the registry chooses
    auto result = shoal::testing::forkedDeviceRanks(cfg, [&](shoal::testing::MpChild& child, ncclComm_t comm, CUstream s) {
      Mismatches bad;
      const uint64_t launchesBefore = shoalFakeCudaCallCount("cuLaunchKernel");
      everyCollective(child.rank(), child.nranks(), comm, s, bad);
      cuStreamSynchronize(s);
      if (bad.count) child.log(bad.first);
      const uint64_t launches = shoalFakeCudaCallCount("cuLaunchKernel") - launchesBefore;
      child.log("kernel launches " + std::to_string(launches));
      ncclCommDestroy(comm);
      if (bad.count) return 1;
      if (v.deviceDirect && launches == 0) return 2;  // staged after all
      if (!v.deviceDirect && launches != 0) return 3;  // some pair went GPU to GPU
      return 0;
    }, v.rankEnv);
    const std::string log = logs.collect(result);
    INFO(v.what << "\n" << result.report() << "\n" << log);
    CHECK(result.allPassed());
    for (const std::string& line : v.logged) CHECK(log.find(line) != std::string::npos);
    CHECK((log.find("via shm") != std::string::npos) != v.deviceDirect);
    // Stream plans only where every rank's streams run them (else device
    // plans on every rank: the kernels' launches above).
    CHECK((log.find(": stream plans:") != std::string::npos) == v.streamPlans);
  }
}

// A communicator of threads and processes: ranks 0 and 1 are threads of one
// process, rank 2 another process. It is device-direct (loopback between the
// threads, cuda_ipc between the processes) without stream links: lanes
// between the processes would have stream rings and lanes between the
// threads none, so ranks could choose stream plans and device plans for one
// call, and wait on messages that never come. Every rank runs device plans:
// the kernels reduce, every collective with the right bytes.
TEST_CASE("a communicator of threads and processes runs device plans on every rank", "[cudafake][mp]") {
  RankLogs logs;
  shoal::testing::MpConfig cfg;
  cfg.nranks = 2;  // processes: the first holds ranks 0 and 1
  cfg.hardLimitMs = 90000;
  cfg.env = logs.env();
  cfg.env.emplace_back("SHOAL_TRANSPORT", "");
  auto result = shoal::testing::runForked(cfg, [&](shoal::testing::MpChild& child) -> int {
    if (cuInit(0) != CUDA_SUCCESS) return 10;
    ncclUniqueId id;
    if (!child.uniqueId(&id)) return 11;
    const std::vector<int> ranks = child.rank() == 0 ? std::vector<int>{0, 1} : std::vector<int>{2};
    Mismatches bad;
    const uint64_t launchesBefore = shoalFakeCudaReduceLaunchesOn(0);
    std::vector<std::thread> threads;
    for (int r : ranks)
      threads.emplace_back([&, r] {
        CUcontext ctx = nullptr;
        if (cuDevicePrimaryCtxRetain(&ctx, 0) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
          bad.expect(false, "context");
          return;
        }
        CUstream s = nullptr;
        cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
        ncclComm_t comm = nullptr;
        if (ncclCommInitRank(&comm, 3, id, r) != ncclSuccess) {
          bad.expect(false, std::string("init: ") + ncclGetLastError(nullptr));
          return;
        }
        everyCollective(r, 3, comm, s, bad);
        cuStreamSynchronize(s);
        ncclCommDestroy(comm);
        cuStreamDestroy(s);
      });
    for (auto& t : threads) t.join();
    if (bad.count) child.log(bad.first);
    if (shoalFakeCudaReduceLaunchesOn(0) == launchesBefore) child.log("no reduction kernel ran: staged");
    return bad.count == 0 && shoalFakeCudaReduceLaunchesOn(0) > launchesBefore ? 0 : 1;
  });
  const std::string log = logs.collect(result);
  INFO(result.report() << "\n" << log);
  CHECK(result.allPassed());
  CHECK(log.find("device-direct: device buffers move GPU to GPU; no stream links, so device plans (rank 0 does not "
                 "run stream plans") != std::string::npos);
  CHECK(log.find("via cuda_ipc") != std::string::npos);
  CHECK(log.find("via loopback") != std::string::npos);
  CHECK(log.find(": stream plans:") == std::string::npos);
  CHECK(log.find("via shm") == std::string::npos);
}

// Device plans (over cuda_ipc) reduce with the device kernels; the host path
// reduces with the CPU reducer, which the kernels equal bit for bit. The same
// AllReduce on device buffers and on host buffers (the same plan) must give
// the same bytes, for every type with sum, and for the other operators on a
// few types; integer avg and a device-memory PreMulSum scalar stay staged.
TEST_CASE("device plans over cuda_ipc give the host path's bytes for every type and operator", "[cudafake][mp]") {
  // Stream plans (stream memory operations), and plans the host steps
  // through (no stream ring: the wait kernel, stream plans switched off),
  // told apart by the event queries the host makes, the same bytes.
  struct Variant {
    std::pair<std::string, std::string> env;
    bool streamPlans;
  };
  for (const Variant& variant : {Variant{{"SHOAL_CUDA_WAIT", "memops"}, true},
                                 Variant{{"SHOAL_CUDA_WAIT", "kernel"}, false},
                                 Variant{{"SHOAL_CUDA_STREAM_PLANS", "0"}, false}}) {
  const std::string wait = variant.env.first + "=" + variant.env.second;
  auto result = forkedRanks(3, "cuda_ipc", {variant.env}, [&](shoal::testing::MpChild& child, ncclComm_t comm, CUstream s) {
    struct Case {
      ncclDataType_t type;
      size_t size;
      ncclRedOp_t op;
    };
    std::vector<Case> cases;
    const std::pair<ncclDataType_t, size_t> types[] = {
        {ncclInt8, 1}, {ncclUint8, 1}, {ncclInt32, 4}, {ncclUint32, 4}, {ncclInt64, 8}, {ncclUint64, 8},
        {ncclFloat16, 2}, {ncclFloat32, 4}, {ncclFloat64, 8}, {ncclBfloat16, 2}, {ncclFloat8e4m3, 1},
        {ncclFloat8e5m2, 1}};
    for (auto [type, size] : types) cases.push_back({type, size, ncclSum});
    for (ncclRedOp_t op : {ncclProd, ncclMax, ncclMin, ncclAvg}) {
      cases.push_back({ncclFloat32, 4, op});
      cases.push_back({ncclBfloat16, 2, op});
      cases.push_back({ncclInt32, 4, op});  // avg: sum, then a division the host runs (staged)
    }
    double host = 0.75;
    ncclRedOp_t premulHost, premulDevice;
    if (ncclRedOpCreatePreMulSum(&premulHost, &host, ncclFloat64, ncclScalarHostImmediate, comm) != ncclSuccess) return 20;
    cases.push_back({ncclFloat64, 8, premulHost});
    CUdeviceptr scalar = 0;
    cuMemAlloc(&scalar, 8);
    cuMemcpyHtoD(scalar, &host, 8);
    if (ncclRedOpCreatePreMulSum(&premulDevice, reinterpret_cast<void*>(scalar), ncclFloat64, ncclScalarDevice, comm) != ncclSuccess) return 21;
    cases.push_back({ncclFloat64, 8, premulDevice});
    // Which path: a float sum, polled by the host only when it steps.
    uint64_t queries = shoalFakeCudaCallCount("cuEventQuery");
    {
      CUdeviceptr probe = 0;
      cuMemAlloc(&probe, 70001 * 4);
      cuMemsetD8(probe, 0, 70001 * 4);
      if (ncclAllReduce(reinterpret_cast<void*>(probe), reinterpret_cast<void*>(probe), 70001, ncclFloat, ncclSum,
                        comm, s) != ncclSuccess)
        return 7;
      cuStreamSynchronize(s);
      cuMemFree(probe);
    }
    queries = shoalFakeCudaCallCount("cuEventQuery") - queries;
    const uint64_t launchesBefore = shoalFakeCudaCallCount("cuLaunchKernel");
    for (size_t count : {size_t{1}, size_t{777}, size_t{70001}}) {
      for (const Case& c : cases) {
        const size_t bytes = count * c.size;
        std::vector<uint8_t> in(bytes), viaHost(bytes), viaDevice(bytes);
        uint64_t x = 0x9e3779b97f4a7c15ull * (child.rank() + 1) + count + c.type * 131 + c.op;
        for (auto& b : in) {
          x ^= x << 13; x ^= x >> 7; x ^= x << 17;
          b = static_cast<uint8_t>(x);
        }
        // The device scalar's host twin (the same 0.75): host buffers cannot use it.
        const ncclRedOp_t hostOp = c.op == premulDevice ? premulHost : c.op;
        if (ncclAllReduce(in.data(), viaHost.data(), count, c.type, hostOp, comm, nullptr) != ncclSuccess) {
          child.log(std::string("host AllReduce: ") + ncclGetLastError(comm));
          return 2;
        }
        CUdeviceptr din = 0, dout = 0;
        cuMemAlloc(&din, bytes);
        cuMemAlloc(&dout, bytes);
        cuMemcpyHtoD(din, in.data(), bytes);
        if (ncclAllReduce(reinterpret_cast<void*>(din), reinterpret_cast<void*>(dout), count, c.type, c.op, comm, s) != ncclSuccess) {
          child.log(std::string("device AllReduce: ") + ncclGetLastError(comm));
          return 3;
        }
        cuStreamSynchronize(s);
        cuMemcpyDtoH(viaDevice.data(), dout, bytes);
        cuMemFree(din);
        cuMemFree(dout);
        if (viaHost != viaDevice) {
          child.log("type " + std::to_string(c.type) + " op " + std::to_string(c.op) + " count " + std::to_string(count) + ": device bytes differ from the host path's");
          return 4;
        }
      }
    }
    const uint64_t launches = shoalFakeCudaCallCount("cuLaunchKernel") - launchesBefore;
    child.log("kernel launches " + std::to_string(launches) + ", event queries " + std::to_string(queries));
    if (launches == 0) return 5;
    // The host polls copies only when it steps.
    if (variant.streamPlans != (queries == 0)) return 6;
    ncclRedOpDestroy(premulHost, comm);
    ncclRedOpDestroy(premulDevice, comm);
    cuMemFree(scalar);
    ncclCommDestroy(comm);
    return 0;
  });
  INFO(wait << "\n" << result.report());
  CHECK(result.allPassed());
  }
}

// cuda_ipc copies even staged messages on streams of its own, which with too
// few hardware queues would sit behind the user's stream waiting for them:
// it is not offered then, and forcing it fails the first call with the
// reason (connections are made at first use).
TEST_CASE("cuda_ipc is refused with too few hardware queues whether forced or not", "[cudafake][mp]") {
  auto forced = forkedRanks(2, "cuda_ipc", {{"CUDA_DEVICE_MAX_CONNECTIONS", "2"}},
                            [&](shoal::testing::MpChild& child, ncclComm_t comm, CUstream s) {
    DeviceFloats buf(1000);
    if (ncclAllReduce(buf.at(), buf.at(), 1000, ncclFloat, ncclSum, comm, s) == ncclSuccess) return 2;
    child.log(std::string("refused: ") + ncclGetLastError(comm));
    ncclCommAbort(comm);
    return 0;
  });
  INFO(forced.report());
  CHECK(forced.allPassed());
  CHECK(forced.report().find("forced transport cuda_ipc (SHOAL_TRANSPORT=cuda_ipc) cannot run in this process: "
                             "CUDA_DEVICE_MAX_CONNECTIONS=2 "
                             "leaves too few hardware queues") != std::string::npos);
  // One rank with few queues: its peers do not reach it over cuda_ipc either.
  RankLogs logs;
  shoal::testing::MpConfig cfg;
  cfg.nranks = 2;
  cfg.env = logs.env();
  cfg.env.emplace_back("SHOAL_TRANSPORT", "");
  auto chosen = shoal::testing::forkedDeviceRanks(cfg, [&](shoal::testing::MpChild& child, ncclComm_t comm, CUstream s) {
    DeviceFloats buf(1000, [&](size_t i) { return val(child.rank(), i); });
    if (ncclAllReduce(buf.at(), buf.at(), 1000, ncclFloat, ncclSum, comm, s) != ncclSuccess) return 2;
    if (cuStreamSynchronize(s) != CUDA_SUCCESS) return 3;
    std::vector<float> got = buf.read();
    for (size_t i = 0; i < got.size(); ++i)
      if (got[i] != val(0, i) + val(1, i)) return 4;
    ncclCommDestroy(comm);
    return 0;
  }, {{{"CUDA_DEVICE_MAX_CONNECTIONS", "1"}}, {}});
  const std::string log = logs.collect(chosen);
  INFO(chosen.report() << "\n" << log);
  CHECK(chosen.allPassed());
  CHECK(log.find("transport cuda_ipc unavailable: CUDA_DEVICE_MAX_CONNECTIONS=1 leaves too few hardware queues") !=
        std::string::npos);
  CHECK(log.find("via cuda_ipc") == std::string::npos);
  CHECK(log.find("via shm") != std::string::npos);
}

// Stream plans: over cuda_ipc with stream memory operations, an operation
// is enqueued whole when called (waits, copies, kernels, events on the
// user's stream and a stream per lane); the host takes no step while the
// streams run it: no stream synchronization, no event query.
TEST_CASE("stream plans over cuda_ipc run with no host step and give the right bytes", "[cudafake][mp]") {
  // 8 KiB slots: every message in many chunks, the ring wrapping many times.
  auto result = forkedRanks(4, "cuda_ipc", {{"SHOAL_CUDA_IPC_FIFO_BYTES", "65536"}},
                            [&](shoal::testing::MpChild& child, ncclComm_t comm, CUstream s) {
    const int r = child.rank(), n = child.nranks();
    const size_t N = 50000;  // 200 KB per rank
    DeviceFloats send(N, [&](size_t i) { return val(r, i); });
    DeviceFloats ar(N), ag(N * n), rs(N / n), bc(N);
    DeviceFloats big(N, [&](size_t i) { return val(r, i); });
    // Connections, kernels and scratch first.
    if (ncclAllReduce(send.at(), ar.at(), N, ncclFloat, ncclSum, comm, s) != ncclSuccess) return 2;
    cuStreamSynchronize(s);
    const char* watched[] = {"cuStreamSynchronize", "cuEventQuery", "cuEventSynchronize", "cuCtxSynchronize",
                             "cuStreamWaitValue64", "cuLaunchKernel"};
    uint64_t before[6];
    for (int k = 0; k < 6; ++k) before[k] = shoalFakeCudaCallCount(watched[k]);
    shoalFakeCudaStreamDelay(s, 100);  // the calls return before any of their work runs
    if (ncclAllReduce(send.at(), ar.at(), N, ncclFloat, ncclSum, comm, s) != ncclSuccess) return 3;
    if (ncclAllGather(send.at(), ag.at(), N, ncclFloat, comm, s) != ncclSuccess) return 4;
    if (ncclReduceScatter(big.at(), rs.at(), N / n, ncclFloat, ncclSum, comm, s) != ncclSuccess) return 5;
    if (ncclBroadcast(send.at(), bc.at(), N, ncclFloat, n - 1, comm, s) != ncclSuccess) return 6;
    // Waited for without a synchronizing call.
    auto t0 = Clock::now();
    while (cuStreamQuery(s) == CUDA_ERROR_NOT_READY) {
      if (msSince(t0) > 30000) return 7;
      ::usleep(1000);
    }
    uint64_t delta[6];
    for (int k = 0; k < 6; ++k) delta[k] = shoalFakeCudaCallCount(watched[k]) - before[k];
    child.log("synchronize " + std::to_string(delta[0]) + ", event queries " + std::to_string(delta[1]) +
              ", stream waits " + std::to_string(delta[4]) + ", kernel launches " + std::to_string(delta[5]));
    if (delta[0] != 0 || delta[1] != 0 || delta[2] != 0 || delta[3] != 0) return 8;
    if (delta[4] < 4 * 25) return 9;  // a wait per chunk: 200 KB in 8 KiB chunks, four operations
    if (delta[5] == 0) return 10;     // the reductions by the kernels
    ncclResult_t async = ncclInProgress;
    ncclCommGetAsyncError(comm, &async);
    if (async != ncclSuccess) return 11;
    Mismatches bad;
    auto sum = [&](size_t i) { return sumOfVals(n, i); };
    std::vector<float> got = ar.read();
    for (size_t i = 0; i < N; ++i) bad.expect(got[i] == sum(i), "AllReduce element " + std::to_string(i));
    got = ag.read();
    for (size_t i = 0; i < N * n; ++i)
      bad.expect(got[i] == val(static_cast<int>(i / N), i % N), "AllGather element " + std::to_string(i));
    got = rs.read();
    for (size_t i = 0; i < N / n; ++i) bad.expect(got[i] == sum(r * (N / n) + i), "ReduceScatter element " + std::to_string(i));
    got = bc.read();
    for (size_t i = 0; i < N; ++i) bad.expect(got[i] == val(n - 1, i), "Broadcast element " + std::to_string(i));
    if (bad.count) {
      child.log(bad.first);
      return 12;
    }
    ncclCommDestroy(comm);
    return 0;
  });
  INFO(result.report());
  CHECK(result.allPassed());
}

// A group is one stream plan (its merged plan): on two streams, the first
// leads, starting after the other's earlier work, and the other's later
// work comes after the group.
TEST_CASE("stream plans run groups, on one stream or two", "[cudafake][mp]") {
  auto result = forkedRanks(3, "cuda_ipc", {}, [&](shoal::testing::MpChild& child, ncclComm_t comm, CUstream s) {
    const int r = child.rank(), n = child.nranks();
    const size_t N = 3000;
    CUstream other = nullptr;
    if (cuStreamCreate(&other, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) return 2;
    DeviceFloats a(N, [&](size_t i) { return val(r, i); });
    DeviceFloats b(N), ra(N), gb(N * n);
    // b is written on the other stream after a delay: the group must wait for it.
    std::vector<float> hb(N);
    for (size_t i = 0; i < N; ++i) hb[i] = val(r, i) * 2;
    shoalFakeCudaStreamDelay(other, 200);
    cuMemcpyHtoDAsync(b.ptr, hb.data(), N * sizeof(float), other);
    const uint64_t syncsBefore = shoalFakeCudaCallCount("cuStreamSynchronize");
    const uint64_t queriesBefore = shoalFakeCudaCallCount("cuEventQuery");
    ncclGroupStart();
    ncclAllReduce(a.at(), ra.at(), N, ncclFloat, ncclSum, comm, s);
    ncclAllGather(b.at(), gb.at(), N, ncclFloat, comm, other);
    if (ncclGroupEnd() != ncclSuccess) return 3;
    // A ring of Send/Recv in one group, on one stream.
    DeviceFloats recv(N);
    const int to = (r + 1) % n, from = (r + n - 1) % n;
    ncclGroupStart();
    ncclSend(a.at(), N, ncclFloat, to, comm, s);
    ncclRecv(recv.at(), N, ncclFloat, from, comm, s);
    if (ncclGroupEnd() != ncclSuccess) return 4;
    // A consumer on the other stream sees the first group's result.
    std::vector<float> host(N * n, -1.0f);
    cuMemcpyDtoHAsync(host.data(), gb.ptr, N * n * sizeof(float), other);
    auto t0 = Clock::now();
    while (cuStreamQuery(s) == CUDA_ERROR_NOT_READY || cuStreamQuery(other) == CUDA_ERROR_NOT_READY) {
      if (msSince(t0) > 30000) return 5;
      ::usleep(1000);
    }
    const uint64_t syncs = shoalFakeCudaCallCount("cuStreamSynchronize") - syncsBefore;
    const uint64_t queries = shoalFakeCudaCallCount("cuEventQuery") - queriesBefore;
    child.log("synchronize " + std::to_string(syncs) + ", event queries " + std::to_string(queries));
    if (syncs != 0 || queries != 0) return 6;  // stream plans, not host steps
    Mismatches bad;
    for (size_t i = 0; i < N * n; ++i)
      bad.expect(host[i] == 2 * val(static_cast<int>(i / N), i % N), "AllGather element " + std::to_string(i));
    std::vector<float> got = ra.read();
    for (size_t i = 0; i < N; ++i) bad.expect(got[i] == sumOfVals(n, i), "AllReduce element " + std::to_string(i));
    got = recv.read();
    for (size_t i = 0; i < N; ++i) bad.expect(got[i] == val(from, i), "Recv element " + std::to_string(i));
    if (bad.count) {
      child.log(bad.first);
      return 7;
    }
    cuStreamDestroy(other);
    ncclCommDestroy(comm);
    return 0;
  });
  INFO(result.report());
  CHECK(result.allPassed());
}

// Plans of one operation may differ between ranks (a chain's root divides,
// its start scales): whether an operation runs on the streams must not
// ride on one rank's plan, or the ranks' messages take different rings.
TEST_CASE("stream plans: operations whose ranks' plans differ run alike on every rank", "[cudafake][mp]") {
  auto result = forkedRanks(3, "cuda_ipc", {{"SHOAL_PROGRESS_TIMEOUT_MS", "5000"}},
                            [&](shoal::testing::MpChild& child, ncclComm_t comm, CUstream s) {
    const int r = child.rank(), n = child.nranks();
    const size_t N = 2000;
    DeviceFloats in(N, [&](size_t i) { return val(r, i); });
    Mismatches bad;
    for (int root : {0, n - 1}) {
      DeviceFloats out(N);
      if (ncclReduce(in.at(), out.at(), N, ncclFloat, ncclAvg, root, comm, s) != ncclSuccess) return 2;
      if (cuStreamSynchronize(s) != CUDA_SUCCESS) return 3;
      if (r == root) {
        std::vector<float> got = out.read();
        for (size_t i = 0; i < N; ++i) {
          const float sum = sumOfVals(n, i);
          bad.expect(std::fabs(got[i] - sum / n) <= 1e-3f * std::fabs(sum), "Reduce avg root " + std::to_string(root) +
                                                                        " element " + std::to_string(i));
        }
      }
    }
    {
      std::vector<int32_t> host(N);
      for (size_t i = 0; i < N; ++i) host[i] = static_cast<int32_t>((r + 1) * 10 + i % 7);
      CUdeviceptr din = 0, dout = 0;
      cuMemAlloc(&din, N * 4);
      cuMemAlloc(&dout, N * 4);
      cuMemcpyHtoD(din, host.data(), N * 4);
      if (ncclReduce(reinterpret_cast<void*>(din), reinterpret_cast<void*>(dout), N, ncclInt32, ncclAvg, 0, comm, s) !=
          ncclSuccess)
        return 4;
      cuStreamSynchronize(s);
      if (r == 0) {
        std::vector<int32_t> got(N);
        cuMemcpyDtoH(got.data(), dout, N * 4);
        for (size_t i = 0; i < N; ++i) {
          int32_t sum = 0;
          for (int q = 0; q < n; ++q) sum += static_cast<int32_t>((q + 1) * 10 + i % 7);
          bad.expect(got[i] == sum / n, "Reduce int avg element " + std::to_string(i));
        }
      }
      cuMemFree(din);
      cuMemFree(dout);
    }
    ncclResult_t async = ncclInProgress;
    ncclCommGetAsyncError(comm, &async);
    if (async != ncclSuccess) {
      child.log(std::string("async: ") + ncclGetLastError(comm));
      return 5;
    }
    if (bad.count) {
      child.log(bad.first);
      return 6;
    }
    ncclCommDestroy(comm);
    return 0;
  });
  INFO(result.report());
  CHECK(result.allPassed());
}

// Ranks that call different operations over stream plans: the receiving
// side compares each message's tag and size with what it expected, and the
// operation fails with ncclInvalidUsage naming both; a rank whose stream
// waits for chunks that never come is released by the no-progress
// deadline. Either way the stream goes on.
TEST_CASE("stream plans report ranks that called different operations and release the stream", "[cudafake][mp]") {
  auto result = forkedRanks(2, "cuda_ipc", {{"SHOAL_PROGRESS_TIMEOUT_MS", "1000"}},
                            [&](shoal::testing::MpChild& child, ncclComm_t comm, CUstream s) {
    DeviceFloats buf(4000, [](size_t i) { return static_cast<float>(i); });
    // Rank 0 reduces 1000 elements, rank 1 4000.
    const size_t count = child.rank() == 0 ? 1000 : 4000;
    auto t0 = Clock::now();
    // The peer may name the mismatch and break the ring while this rank is
    // still enqueueing the call: then the call itself fails, and what it had
    // enqueued is released by the abort.
    const ncclResult_t called = ncclAllReduce(buf.at(), buf.at(), count, ncclFloat, ncclSum, comm, s);
    ncclResult_t async = called;
    double ms = 0;
    if (called == ncclSuccess) {
      if (cuStreamSynchronize(s) != CUDA_SUCCESS) return 3;
      ms = msSince(t0);
      async = awaitAsyncError(comm, t0);
    }
    std::string why = ncclGetLastError(comm);
    child.log(std::string(called == ncclSuccess ? "stream released after " + std::to_string(ms) + " ms, async "
                                                : "call failed, ") +
              ncclGetErrorString(async) + ": " + why);
    if (async != ncclInvalidUsage && async != ncclRemoteError && async != ncclSystemError) return 4;
    if (async == ncclInvalidUsage && why.find("message mismatch") == std::string::npos) return 5;
    // The communicator has failed: a matching call now is refused, not run
    // on a released ring.
    if (ncclAllReduce(buf.at(), buf.at(), 1000, ncclFloat, ncclSum, comm, s) == ncclSuccess) return 6;
    ncclCommAbort(comm);
    if (cuStreamSynchronize(s) != CUDA_SUCCESS) return 7;  // released, at the latest by the abort
    return 0;
  });
  INFO(result.report());
  CHECK(result.allPassed());
  // At least one side names the mismatch.
  CHECK(result.report().find("message mismatch") != std::string::npos);
}

TEST_CASE("a stream delay longer than the no-progress deadline does not fail the job", "[cudafake][mp]") {
  auto result = forkedRanks(2, "shm", {{"SHOAL_PROGRESS_TIMEOUT_MS", "300"}},
                            [&](shoal::testing::MpChild& child, ncclComm_t comm, CUstream s) {
    DeviceFloats send(1000, [&](size_t i) { return val(child.rank(), i); });
    DeviceFloats recv(1000);
    shoalFakeCudaStreamDelay(s, 1200);  // four deadlines
    if (ncclAllReduce(send.at(), recv.at(), 1000, ncclFloat, ncclSum, comm, s) != ncclSuccess) return 2;
    if (cuStreamSynchronize(s) != CUDA_SUCCESS) return 3;
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm, &async);
    if (async != ncclSuccess) {
      child.log(std::string("async error: ") + ncclGetLastError(comm));
      return 4;
    }
    std::vector<float> got = recv.read();
    for (size_t i = 0; i < got.size(); ++i)
      if (got[i] != val(0, i) + val(1, i)) return 5;
    ncclCommDestroy(comm);
    return 0;
  });
  INFO(result.report());
  CHECK(result.allPassed());
}

TEST_CASE("a killed peer releases the stream within the deadline with the error in ncclCommGetAsyncError", "[cudafake][mp]") {
  for (const char* transport : {"tcp", "cuda_ipc"}) {
  auto result = forkedRanks(2, transport, {{"SHOAL_PROGRESS_TIMEOUT_MS", "2000"}},
                            [&](shoal::testing::MpChild& child, ncclComm_t comm, CUstream s) {
    DeviceFloats buf(1000, [&](size_t i) { return val(child.rank(), i); });
    if (ncclAllReduce(buf.at(), buf.at(), 1000, ncclFloat, ncclSum, comm, s) != ncclSuccess) return 2;
    cuStreamSynchronize(s);
    rankOneDiesHere(child);
    auto t0 = Clock::now();
    if (ncclAllReduce(buf.at(), buf.at(), 1000, ncclFloat, ncclSum, comm, s) != ncclSuccess) return 3;
    if (cuStreamSynchronize(s) != CUDA_SUCCESS) return 4;  // released, not stuck
    double ms = msSince(t0);
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm, &async);
    std::string why = ncclGetLastError(comm);
    child.log("stream released after " + std::to_string(ms) + " ms, async " + ncclGetErrorString(async) + ": " + why);
    if (async == ncclSuccess || async == ncclInProgress) return 5;
    if (ms > 15000) return 6;
    if (why.find("rank 1") == std::string::npos) return 7;  // the error names the dead peer
    ncclCommAbort(comm);
    return 0;
  });
  INFO(transport << "\n" << result.report());
  REQUIRE(result.ranks.size() == 2);
  CHECK(result.ranks[0].exited);
  CHECK(result.ranks[0].exitCode == 0);
  CHECK(result.ranks[1].termSignal == SIGKILL);
  }
}

// A process whose peer destroyed its communicator while this
// one's stream plan waits on their cuda_ipc stream ring learns of it at the
// liveness check, not at the no-progress deadline, and its stream goes on:
// the plan posts nothing on the connection, so only the ring says that
// something here still waits for the peer.
TEST_CASE("a process's stream plan whose peer destroyed its communicator fails at the liveness check",
          "[cudafake][mp]") {
  auto result = forkedRanks(2, "cuda_ipc", {{"SHOAL_IDLE_CHECK_MS", "200"}},
                            [&](shoal::testing::MpChild& child, ncclComm_t comm, CUstream s) {
    DeviceFloats buf(1000, [&](size_t i) { return val(child.rank(), i); });
    if (ncclAllReduce(buf.at(), buf.at(), 1000, ncclFloat, ncclSum, comm, s) != ncclSuccess) return 2;
    cuStreamSynchronize(s);
    if (child.rank() == 1) return ncclCommDestroy(comm) == ncclSuccess ? 0 : 3;  // then exits
    ::usleep(300000);
    auto t0 = Clock::now();
    if (ncclAllReduce(buf.at(), buf.at(), 1000, ncclFloat, ncclSum, comm, s) != ncclSuccess) return 4;
    if (cuStreamSynchronize(s) != CUDA_SUCCESS) return 5;  // released, not stuck
    double ms = msSince(t0);
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm, &async);
    std::string why = ncclGetLastError(comm);
    child.log("stream released after " + std::to_string(ms) + " ms, async " + ncclGetErrorString(async) + ": " + why);
    if (async != ncclRemoteError) return 6;
    if (why.find("closed its end of the cuda_ipc connection") == std::string::npos) return 7;
    if (ms > 30000) return 8;  // the no-progress deadline is 300 s
    ncclCommAbort(comm);
    return 0;
  });
  INFO(result.report());
  CHECK(result.allPassed());
}

// A thread's Recv that failed (its deadline passed) leaves nothing behind on
// the loopback pipe: its peer's Send, made late, fails too instead of
// copying into the buffer its caller was told is free again.
TEST_CASE("a late Send between threads does not write into a failed Recv's buffer", "[cudafake]") {
  useDevice0();
  shoal::testing::ScopedEnv env{{"SHOAL_PROGRESS_TIMEOUT_MS", "500"}};
  std::barrier phase(2);
  Mismatches bad;
  std::string error;
  onThreads(2, [&](int r, ncclComm_t comm, CUstream s) {
    const size_t N = 1000;
    DeviceFloats buf(N, [&](size_t i) { return val(r, i); });
    bad.expect(ncclAllReduce(buf.at(), buf.at(), N, ncclFloat, ncclSum, comm, s) == ncclSuccess, "warm-up");
    cuStreamSynchronize(s);
    phase.arrive_and_wait();
    if (r == 0) {
      auto t0 = Clock::now();
      bad.expect(ncclRecv(buf.at(), N, ncclFloat, 1, comm, s) == ncclSuccess, "the Recv");
      const ncclResult_t failed = awaitAsyncError(comm, t0);
      bad.expect(failed != ncclSuccess && failed != ncclInProgress, "the Recv failed at its deadline");
      bad.expect(cuStreamSynchronize(s) == CUDA_SUCCESS, "its stream went on");
      const std::vector<float> canary(N, -7.0f);
      cuMemcpyHtoD(reinterpret_cast<CUdeviceptr>(buf.at()), canary.data(), N * sizeof(float));
    }
    phase.arrive_and_wait();
    if (r == 1) {
      ncclResult_t called = ncclSend(buf.at(), N, ncclFloat, 0, comm, s);
      cuStreamSynchronize(s);
      ncclResult_t async = called;
      if (called == ncclSuccess) async = awaitAsyncError(comm, Clock::now());
      error = ncclGetLastError(comm);
      bad.expect(async != ncclSuccess && async != ncclInProgress, "the late Send failed");
    }
    phase.arrive_and_wait();
    if (r == 0) {
      std::vector<float> got = buf.read();
      for (size_t i = 0; i < N; ++i) bad.expect(got[i] == -7.0f, "element " + std::to_string(i) + " kept");
    }
  });
  INFO(bad.first << "; the late Send: " << error);
  CHECK(bad.count == 0);
}

namespace {

void abortReleasesStream() {
  useDevice0();
  std::array<ncclComm_t, 2> comms = groupInitTwoRanks();
  CUstream s = newStream();
  DeviceFloats buf(1000, [](size_t i) { return static_cast<float>(i); });
  // Rank 0 calls, rank 1 never does: rank 0's stream waits in the collective.
  NCCL_OK(ncclAllReduce(buf.at(), buf.at(), 1000, ncclFloat, ncclSum, comms[0], s));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  CHECK(cuStreamQuery(s) == CUDA_ERROR_NOT_READY);
  auto t0 = Clock::now();
  NCCL_OK(ncclCommAbort(comms[0]));
  CU_OK(cuStreamSynchronize(s));
  double ms = msSince(t0);
  INFO("stream released " << ms << " ms after the abort");
  CHECK(ms < 2000);
  NCCL_OK(ncclCommDestroy(comms[1]));
  CU_OK(cuStreamDestroy(s));
}

}  // namespace

TEST_CASE("ncclCommAbort releases a stream whose collective waits for a peer that never calls", "[cudafake]") {
  abortReleasesStream();
}

// A watchdog aborts communicators one after the other; a stream held back
// by the user's own work ahead of a collective must not hold up the abort:
// what that stream may still use (staging; stream plans' lanes, rings and
// scratch) is freed once it has passed.
TEST_CASE("ncclCommAbort returns while the user's stream is held back, and its memory goes later", "[cudafake]") {
  useDevice0();
  // Two ranks as threads: a warm-up, then a call whose stream 0 is held
  // back by `delayMs` of the user's work, and both aborted. Returns how
  // long the aborts took.
  auto cycle = [](int delayMs) -> double {
    std::array<ncclComm_t, 2> comms = groupInitTwoRanks();
    std::array<CUstream, 2> s{newStream(), newStream()};
    double ms = 0;
    {
      DeviceFloats a(1000, [](size_t) { return 1.0f; }), b(1000, [](size_t) { return 1.0f; });
      for (int call = 0; call < 2; ++call) {
        if (call == 1 && delayMs > 0) shoalFakeCudaStreamDelay(s[0], delayMs);
        NCCL_OK(ncclGroupStart());
        NCCL_OK(ncclAllReduce(a.at(), a.at(), 1000, ncclFloat, ncclSum, comms[0], s[0]));
        NCCL_OK(ncclAllReduce(b.at(), b.at(), 1000, ncclFloat, ncclSum, comms[1], s[1]));
        NCCL_OK(ncclGroupEnd());
        if (call == 0) {
          CU_OK(cuStreamSynchronize(s[0]));
          CU_OK(cuStreamSynchronize(s[1]));
        }
      }
      auto t0 = Clock::now();
      NCCL_OK(ncclCommAbort(comms[0]));
      NCCL_OK(ncclCommAbort(comms[1]));
      ms = msSince(t0);
      if (delayMs > 0) CHECK(shoal::deferred::waiting() > 0);  // stream 0 has not reached the call yet
      CU_OK(cuStreamSynchronize(s[0]));
      CU_OK(cuStreamSynchronize(s[1]));
    }
    for (CUstream x : s) cuStreamDestroy(x);
    return ms;
  };
  for (const char* plans : {"0", "1"}) {
    shoal::testing::ScopedEnv env{{"SHOAL_CUDA_STREAM_PLANS", plans}};
    (void)cycle(0);  // what the process keeps for good (kernels, copy streams)
  }
  for (const char* plans : {"0", "1"}) {
    INFO("SHOAL_CUDA_STREAM_PLANS=" << plans);
    shoal::testing::ScopedEnv env{{"SHOAL_CUDA_STREAM_PLANS", plans}};
    const int allocations = shoalFakeCudaLiveAllocations(), streams = shoalFakeCudaLiveStreams();
    const double ms = cycle(3000);
    INFO("the two aborts took " << ms << " ms");
    CHECK(ms < 1500);
    auto t0 = Clock::now();
    while (shoal::deferred::waiting() > 0 && msSince(t0) < 10000) ::usleep(5000);
    CHECK(shoal::deferred::waiting() == 0);
    CHECK(shoalFakeCudaLiveAllocations() == allocations);
    CHECK(shoalFakeCudaLiveStreams() == streams);
  }
}

// What waits for a held-back stream is the staging only: the connections
// close at the abort, so a peer waiting on this rank learns of it at its
// next liveness look, not once the stream has passed (or at its deadline).
TEST_CASE("ncclCommAbort with its stream held back closes its connections at once", "[cudafake][mp]") {
  auto result = forkedRanks(2, "cuda_ipc", {{"SHOAL_CUDA_STREAM_PLANS", "0"}, {"SHOAL_IDLE_CHECK_MS", "200"}},
                            [&](shoal::testing::MpChild& child, ncclComm_t comm, CUstream s) {
    DeviceFloats buf(1000, [&](size_t i) { return val(child.rank(), i); });
    if (ncclAllReduce(buf.at(), buf.at(), 1000, ncclFloat, ncclSum, comm, s) != ncclSuccess) return 2;
    cuStreamSynchronize(s);
    if (child.rank() == 0) shoalFakeCudaStreamDelay(s, 6000);  // the user's work ahead of the call
    if (ncclAllReduce(buf.at(), buf.at(), 1000, ncclFloat, ncclSum, comm, s) != ncclSuccess) return 3;
    child.barrier();
    if (child.rank() == 0) {
      ::usleep(200000);
      auto t0 = Clock::now();
      if (ncclCommAbort(comm) != ncclSuccess) return 4;
      child.log("abort took " + std::to_string(msSince(t0)) + " ms");
      cuStreamSynchronize(s);
      return 0;
    }
    auto t0 = Clock::now();
    const ncclResult_t async = awaitAsyncError(comm, t0);
    const double ms = msSince(t0);
    child.log("failed after " + std::to_string(ms) + " ms: " + ncclGetLastError(comm));
    if (async == ncclSuccess || async == ncclInProgress) return 5;
    if (ms > 4000) return 6;  // rank 0's stream reaches the call after 6 s
    cuStreamSynchronize(s);
    ncclCommAbort(comm);
    return 0;
  });
  INFO(result.report());
  CHECK(result.allPassed());
}

TEST_CASE("ncclCommAbort releases a stream waiting in the wait kernel", "[cudafake]") {
  // This process's first device operation decides the mode (ctest runs each
  // case in a process of its own).
  setenv("SHOAL_CUDA_WAIT", "kernel", 1);
  shoal::reloadParams();
  const auto launchesBefore = shoalFakeCudaCallCount("cuLaunchKernel");
  abortReleasesStream();
  CHECK(shoalFakeCudaCallCount("cuLaunchKernel") > launchesBefore);
}

namespace {

// Every collective at 2 processes over shm with the stand-in's knobs `env`,
// a stream delay too; returns the ranks' INFO logs.
std::string fallbackRun(std::vector<std::pair<std::string, std::string>> env, int64_t& kernelLaunches) {
  RankLogs logs;
  for (auto& variable : logs.env()) env.push_back(std::move(variable));
  auto result = forkedRanks(2, "shm", env, [&](shoal::testing::MpChild& child, ncclComm_t comm, CUstream s) {
    Mismatches bad;
    everyCollective(child.rank(), child.nranks(), comm, s, bad);
    DeviceFloats late(100, [&](size_t i) { return val(child.rank(), i); });
    shoalFakeCudaStreamDelay(s, 200);
    bad.expect(ncclAllReduce(late.at(), late.at(), 100, ncclFloat, ncclSum, comm, s) == ncclSuccess, "delayed call");
    cuStreamSynchronize(s);
    std::vector<float> got = late.read();
    for (size_t i = 0; i < got.size(); ++i)
      bad.expect(got[i] == val(0, i) + val(1, i), "delayed AllReduce element " + std::to_string(i));
    if (bad.count) child.log(bad.first);
    child.log("kernel launches " + std::to_string(shoalFakeCudaCallCount("cuLaunchKernel")));
    ncclCommDestroy(comm);
    return bad.count == 0 ? 0 : 1;
  });
  INFO(result.report());
  CHECK(result.allPassed());
  kernelLaunches = 0;
  for (const auto& r : result.ranks) {
    size_t at = r.log.find("kernel launches ");
    if (at != std::string::npos) kernelLaunches += std::atoll(r.log.c_str() + at + 16);
  }
  return logs.collect(result);
}

}  // namespace

TEST_CASE("without stream memory operations the wait kernel is chosen - logged - and correct", "[cudafake][mp]") {
  int64_t launches = 0;
  std::string log = fallbackRun({{"SHOAL_FAKECUDA_NO_MEMOPS", "1"}}, launches);
  INFO(log);
  CHECK(log.find("by a wait kernel (the device has no 64-bit stream memory operations, the wait kernel loaded)") != std::string::npos);
  CHECK(launches > 0);
}

TEST_CASE("without stream memory operations or kernels the synchronous fallback is chosen - logged - and correct", "[cudafake][mp]") {
  int64_t launches = 0;
  std::string log = fallbackRun({{"SHOAL_FAKECUDA_NO_MEMOPS", "1"}, {"SHOAL_FAKECUDA_NO_KERNELS", "1"}}, launches);
  INFO(log);
  CHECK(log.find("by synchronous (the device has no 64-bit stream memory operations; no wait kernel") != std::string::npos);
  CHECK(launches == 0);
}

TEST_CASE("with stream memory operations they are chosen and logged", "[cudafake][mp]") {
  char logPath[] = "/tmp/shoal-cudafake-log-XXXXXX";
  int fd = mkstemp(logPath);
  REQUIRE(fd >= 0);
  close(fd);
  auto result = forkedRanks(1, "shm",
                            {{"NCCL_DEBUG", "INFO"}, {"NCCL_DEBUG_SUBSYS", "INIT"}, {"NCCL_DEBUG_FILE", logPath}},
                            [&](shoal::testing::MpChild& child, ncclComm_t comm, CUstream s) {
    DeviceFloats buf(10, [](size_t i) { return static_cast<float>(i); });
    if (ncclAllReduce(buf.at(), buf.at(), 10, ncclFloat, ncclSum, comm, s) != ncclSuccess) return 1;
    cuStreamSynchronize(s);
    ncclCommDestroy(comm);
    (void)child;
    return 0;
  });
  INFO(result.report());
  CHECK(result.allPassed());
  std::string log = readFile(logPath);
  INFO(log);
  CHECK(log.find("by stream memory operations") != std::string::npos);
  CHECK(log.find("CUDA device 0 (GPU-") != std::string::npos);
  ::unlink(logPath);
}

TEST_CASE("the no-progress deadline releases a stream whose peer never calls", "[cudafake][mp]") {
  for (const char* transport : {"shm", "cuda_ipc"}) {
  auto result = forkedRanks(2, transport, {{"SHOAL_PROGRESS_TIMEOUT_MS", "500"}},
                            [&](shoal::testing::MpChild& child, ncclComm_t comm, CUstream s) {
    if (child.rank() == 1) return 0;  // never calls; stays until rank 0 is done (barrier)
    DeviceFloats buf(1000, [](size_t i) { return static_cast<float>(i); });
    auto t0 = Clock::now();
    if (ncclAllReduce(buf.at(), buf.at(), 1000, ncclFloat, ncclSum, comm, s) != ncclSuccess) return 2;
    if (cuStreamSynchronize(s) != CUDA_SUCCESS) return 3;
    double ms = msSince(t0);
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm, &async);
    child.log("stream released after " + std::to_string(ms) + " ms, async " + ncclGetErrorString(async));
    if (async == ncclSuccess || async == ncclInProgress) return 4;
    if (ms > 10000) return 5;
    ncclCommAbort(comm);
    return 0;
  });
  INFO(transport << "\n" << result.report());
  CHECK(result.allPassed());
  }
}

TEST_CASE("staging stays within SHOAL_CUDA_STAGING_BYTES between operations and is freed with the communicator", "[cudafake]") {
  setenv("SHOAL_CUDA_STAGING_BYTES", "1048576", 1);
  shoal::reloadParams();
  useDevice0();
  CUstream s = newStream();
  DeviceFloats big(4u << 20, [](size_t i) { return static_cast<float>(i % 100); });  // 16 MiB
  DeviceFloats small(16, [](size_t i) { return static_cast<float>(i); });
  const int allocationsBefore = shoalFakeCudaLiveAllocations();
  ncclComm_t comm = soloComm();
  // Registration of device memory is accepted (and only recorded).
  void* handle = nullptr;
  NCCL_OK(ncclCommRegister(comm, big.at(), big.n * sizeof(float), &handle));
  // Twenty 16 MiB calls queued behind a slow stream: each needs 16 MiB of
  // staging, more than the bound, so each waits until the one before has
  // left its slot rather than pinning 320 MiB.
  shoalFakeCudaStreamDelay(s, 200);
  int mostAllocations = 0;
  for (int round = 0; round < 20; ++round) {
    NCCL_OK(ncclAllReduce(big.at(), big.at(), big.n, ncclFloat, ncclSum, comm, s));
    mostAllocations = std::max(mostAllocations, shoalFakeCudaLiveAllocations());
  }
  CU_OK(cuStreamSynchronize(s));
  CHECK(big.read()[99] == 99.0f);
  INFO("most live allocations while queued: " << mostAllocations);
  CHECK(mostAllocations <= allocationsBefore + 3);
  // One more call reclaims: the 16 MiB slot is over the 1 MiB bound and goes.
  NCCL_OK(ncclAllReduce(small.at(), small.at(), 16, ncclFloat, ncclSum, comm, s));
  CU_OK(cuStreamSynchronize(s));
  const int allocationsDuring = shoalFakeCudaLiveAllocations();
  INFO("live stand-in allocations: before " << allocationsBefore << ", between operations "
                                             << allocationsDuring);
  CHECK(allocationsDuring <= allocationsBefore + 3);  // doorbell page + at most two small slots
  NCCL_OK(ncclCommDeregister(comm, handle));
  NCCL_OK(ncclCommDestroy(comm));
  CHECK(shoalFakeCudaLiveAllocations() == allocationsBefore);
  CU_OK(cuStreamDestroy(s));
}

// Windows (comm/window.h): every rank maps every other process's window on
// ncclMemAlloc memory, importing each allocation once however many windows
// name it, and the mapping is the owner's memory, both ways. Memory that is
// not a Shoal allocation is registered but not mapped by other processes.
TEST_CASE("windows on ncclMemAlloc memory map every peer's buffer, imported once per allocation", "[cudafake][mp]") {
  constexpr size_t kMiB = 1u << 20;
  auto result = forkedRanks(3, "shm", {}, [&](shoal::testing::MpChild& child, ncclComm_t comm, CUstream) {
    const int rank = child.rank(), n = child.nranks();
    void* mem = nullptr;
    if (ncclMemAlloc(&mem, 4 * kMiB) != ncclSuccess) return 1;
    auto at = [](void* p, size_t offset) { return reinterpret_cast<CUdeviceptr>(static_cast<uint8_t*>(p) + offset); };
    std::vector<uint32_t> pattern(kMiB / 4);
    for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<uint32_t>(rank * 1000003u + i);
    if (cuMemcpyHtoD(at(mem, kMiB), pattern.data(), kMiB) != CUDA_SUCCESS) return 2;
    CUdeviceptr legacy = 0;  // not a Shoal allocation: no peer maps it
    if (cuMemAlloc(&legacy, 4096) != CUDA_SUCCESS) return 3;

    const uint64_t importsBefore = shoalFakeCudaCallCount("cuMemImportFromShareableHandle");
    ncclWindow_t winA = nullptr, winB = nullptr, winC = nullptr;
    ncclGroupStart();
    ncclCommWindowRegister(comm, mem, kMiB, &winA, NCCL_WIN_COLL_SYMMETRIC);
    ncclCommWindowRegister(comm, static_cast<uint8_t*>(mem) + kMiB, kMiB, &winB, NCCL_WIN_COLL_SYMMETRIC);
    ncclCommWindowRegister(comm, reinterpret_cast<void*>(legacy), 4096, &winC, NCCL_WIN_DEFAULT);
    if (ncclGroupEnd() != ncclSuccess) {
      child.log(std::string("register: ") + ncclGetLastError(comm));
      return 4;
    }
    if (!winA || !winB || !winC) return 5;
    const uint64_t imports = shoalFakeCudaCallCount("cuMemImportFromShareableHandle") - importsBefore;
    if (imports != static_cast<uint64_t>(n - 1)) {
      child.log("imports: " + std::to_string(imports));
      return 6;
    }
    auto* a = reinterpret_cast<shoal::Window*>(winA);
    auto* b = reinterpret_cast<shoal::Window*>(winB);
    auto* c = reinterpret_cast<shoal::Window*>(winC);
    if (!a->mappedEverywhere() || !b->mappedEverywhere()) return 7;
    for (int p = 0; p < n; ++p)
      for (int q = 0; q < n; ++q)
        if ((p != q && c->maps(p, q)) || (p == q && !c->maps(p, q))) return 8;
    if (shoal::cuda::PeerImports::instance().mapped() != static_cast<size_t>(n - 1)) return 9;

    // Each peer's window B, read through this process's mapping.
    std::vector<uint32_t> seen(kMiB / 4);
    for (int q = 0; q < n; ++q) {
      if (q != rank && c->buffer(q) != nullptr) return 10;
      if (b->bytesOf(q) != kMiB || b->buffer(q) == nullptr) return 11;
      if (cuMemcpyDtoH(seen.data(), reinterpret_cast<CUdeviceptr>(b->buffer(q)), kMiB) != CUDA_SUCCESS) return 12;
      for (size_t i = 0; i < seen.size(); i += 4099)
        if (seen[i] != static_cast<uint32_t>(q * 1000003u + i)) {
          child.log("rank " + std::to_string(q) + "'s window B word " + std::to_string(i) + " reads " +
                    std::to_string(seen[i]));
          return 13;
        }
    }
    // Writes through the mapping land in the owner's memory: each rank
    // writes its number into the next rank's window A.
    const int next = (rank + 1) % n;
    const uint32_t mark = 0xabc00000u + static_cast<uint32_t>(rank);
    if (cuMemcpyHtoD(reinterpret_cast<CUdeviceptr>(a->buffer(next)) + 64, &mark, 4) != CUDA_SUCCESS) return 14;
    child.barrier();
    uint32_t got = 0;
    if (cuMemcpyDtoH(&got, at(mem, 64), 4) != CUDA_SUCCESS) return 15;
    if (got != 0xabc00000u + static_cast<uint32_t>((rank + n - 1) % n)) return 16;

    // The imports go with the last window on each allocation.
    const uint64_t unmapsBefore = shoalFakeCudaCallCount("cuMemUnmap");
    if (ncclCommWindowDeregister(comm, winA) != ncclSuccess) return 17;
    if (shoal::cuda::PeerImports::instance().mapped() != static_cast<size_t>(n - 1)) return 18;
    if (shoalFakeCudaCallCount("cuMemUnmap") != unmapsBefore) return 19;
    if (ncclCommWindowDeregister(comm, winB) != ncclSuccess) return 20;
    if (shoal::cuda::PeerImports::instance().mapped() != 0) return 21;
    if (shoalFakeCudaCallCount("cuMemUnmap") - unmapsBefore != static_cast<uint64_t>(n - 1)) return 22;
    if (ncclCommWindowDeregister(comm, winA) != ncclInvalidUsage) return 23;
    child.barrier();  // no peer frees while another still reads
    if (ncclMemFree(mem) != ncclSuccess) return 24;
    cuMemFree(legacy);
    // winC goes with the communicator.
    return ncclCommDestroy(comm) == ncclSuccess ? 0 : 25;
  });
  INFO(result.report());
  CHECK(result.allPassed());
}

namespace {
// Copies between the host and device memory at `p` (float-typed helpers of
// the windowed-collectives test).
bool toDevice(void* p, const std::vector<float>& host) {
  return cuMemcpyHtoD(reinterpret_cast<CUdeviceptr>(p), host.data(), host.size() * sizeof(float)) == CUDA_SUCCESS;
}
std::vector<float> fromDevice(const void* p, size_t n) {
  std::vector<float> host(n, -7.0f);
  (void)cuMemcpyDtoH(host.data(), reinterpret_cast<CUdeviceptr>(p), n * sizeof(float));
  return host;
}
std::vector<float> valsOf(int rank, size_t n, size_t from = 0) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = val(rank, from + i);
  return v;
}
// A send and a receive buffer of n floats, back to back in one ncclMemAlloc
// allocation registered as a window with `flags`, send holding this rank's
// values (for forked ranks: false when a step fails; freed by the caller).
struct WindowedPair {
  void* pool = nullptr;
  ncclWindow_t win = nullptr;
  float* send = nullptr;
  float* recv = nullptr;
  bool make(ncclComm_t comm, int rank, size_t n, int flags) {
    if (ncclMemAlloc(&pool, 2 * n * sizeof(float)) != ncclSuccess) return false;
    send = static_cast<float*>(pool);
    recv = send + n;
    return ncclCommWindowRegister(comm, pool, 2 * n * sizeof(float), &win, flags) == ncclSuccess &&
           toDevice(send, valsOf(rank, n));
  }
};
}  // namespace

// Collectives on buffers inside windows every rank registered run as
// peer-reading device plans: each rank's kernels and copies read the peers'
// buffers in place through the window mappings, over any transport (the
// connections carry only descriptors and barriers). Over shm, where every
// other device operation is staged and reduced by the CPU, kernel launches
// and the absence of staging show that path ran. On symmetric windows the
// plans run whole on the streams (the descriptors and barriers are window
// board operations): no host step, no event polled; on others the host
// steps through them.
TEST_CASE("collectives on window buffers read peers' device memory in place, over shm and cuda_ipc", "[cudafake][mp]") {
  char logPath[] = "/tmp/shoal-cudafake-log-XXXXXX";
  int fd = mkstemp(logPath);
  REQUIRE(fd >= 0);
  close(fd);
  struct Run {
    const char* transport;
    int n;
    bool windows;  // NCCL_WIN_ENABLE unset (1) or 0: nothing of a peer mapped, the calls take the other paths
    int flags;     // NCCL_WIN_COLL_SYMMETRIC: on the streams
    bool batches = true;  // false: the driver refuses cuStreamBatchMemOp (board writes one at a time)
  };
  const int kSym = NCCL_WIN_COLL_SYMMETRIC, kDefault = NCCL_WIN_DEFAULT;
  for (const Run& run : {Run{"shm", 2, true, kSym}, Run{"shm", 3, true, kSym}, Run{"shm", 4, true, kSym},
                         Run{"cuda_ipc", 2, true, kSym}, Run{"cuda_ipc", 3, true, kSym}, Run{"shm", 3, true, kDefault},
                         Run{"cuda_ipc", 4, true, kDefault}, Run{"shm", 3, false, kSym},
                         Run{"shm", 3, true, kSym, false}}) {
      const bool onStreams = run.windows && run.flags == kSym;
      const char* transport = run.transport;
      const int n = run.n;
      std::vector<std::pair<std::string, std::string>> env = {
          {"NCCL_DEBUG", "TRACE"}, {"NCCL_DEBUG_SUBSYS", "COLL"}, {"NCCL_DEBUG_FILE", std::string(logPath) + ".%p"}};
      if (!run.windows) env.emplace_back("NCCL_WIN_ENABLE", "0");
      if (!run.batches) env.emplace_back("SHOAL_FAKECUDA_NO_BATCH_MEMOPS", "1");
      auto result = forkedRanks(n, transport, env, [&](shoal::testing::MpChild& child, ncclComm_t comm, CUstream s) {
        const int r = child.rank();
        const size_t N = 3000;  // floats per rank's block (not a multiple of every rank count's granule)
        void* pool = nullptr;
        if (ncclMemAlloc(&pool, 4 * N * n * sizeof(float)) != ncclSuccess) return 1;
        auto* send = static_cast<float*>(pool);
        float* recv = send + N * n;
        float* big = recv + N * n;
        ncclWindow_t win = nullptr;
        if (ncclCommWindowRegister(comm, pool, 4 * N * n * sizeof(float), &win, run.flags) != ncclSuccess) return 2;
        const uint64_t launchesBefore = shoalFakeCudaCallCount("cuLaunchKernel");
        const uint64_t syncsBefore = shoalFakeCudaCallCount("cuStreamSynchronize");
        const uint64_t waitsBefore = shoalFakeCudaCallCount("cuStreamWaitValue64");
        const uint64_t batchesBefore = shoalFakeCudaCallCount("cuStreamBatchMemOp");
        uint64_t ownSyncs = 0;  // this test's own
        std::string wrong;
        auto expect = [&](const float* p, size_t count, const std::function<float(size_t)>& want, const char* what) {
          cuStreamSynchronize(s);
          ++ownSyncs;
          std::vector<float> got = fromDevice(p, count);
          for (size_t i = 0; i < count && wrong.empty(); ++i)
            if (got[i] != want(i))
              wrong = std::string(what) + " element " + std::to_string(i) + ": " + std::to_string(got[i]) +
                      " want " + std::to_string(want(i));
        };
        auto call = [&](ncclResult_t rc, const char* what) {
          if (rc != ncclSuccess && wrong.empty()) wrong = std::string(what) + ": " + ncclGetLastError(comm);
        };
        toDevice(send, valsOf(r, N));
        call(ncclAllReduce(send, recv, N, ncclFloat, ncclSum, comm, s), "AllReduce");
        expect(recv, N, [&](size_t i) { return sumOfVals(n, i); }, "AllReduce");
        toDevice(recv, valsOf(r, N));
        call(ncclAllReduce(recv, recv, N, ncclFloat, ncclMax, comm, s), "AllReduce max in place");
        expect(recv, N, [&](size_t i) { return val(n - 1, i); }, "AllReduce max in place");

        toDevice(send, valsOf(r, N));
        call(ncclAllGather(send, recv, N, ncclFloat, comm, s), "AllGather");
        expect(recv, N * n, [&](size_t i) { return val(static_cast<int>(i / N), i % N); }, "AllGather");
        toDevice(recv + r * N, valsOf(r, N, 7));
        call(ncclAllGather(recv + r * N, recv, N, ncclFloat, comm, s), "AllGather in place");
        expect(recv, N * n, [&](size_t i) { return val(static_cast<int>(i / N), 7 + i % N); }, "AllGather in place");

        toDevice(big, valsOf(r, N * n));
        call(ncclReduceScatter(big, recv, N, ncclFloat, ncclSum, comm, s), "ReduceScatter");
        expect(recv, N, [&](size_t i) { return sumOfVals(n, r * N + i); }, "ReduceScatter");
        toDevice(big, valsOf(r, N * n));
        call(ncclReduceScatter(big, big + r * N, N, ncclFloat, ncclSum, comm, s), "ReduceScatter in place");
        expect(big + r * N, N, [&](size_t i) { return sumOfVals(n, r * N + i); }, "ReduceScatter in place");
        cuStreamSynchronize(s);
        ++ownSyncs;
        const uint64_t launches = shoalFakeCudaCallCount("cuLaunchKernel") - launchesBefore;
        const uint64_t hostSyncs = shoalFakeCudaCallCount("cuStreamSynchronize") - syncsBefore - ownSyncs;
        const uint64_t waits = shoalFakeCudaCallCount("cuStreamWaitValue64") - waitsBefore;
        const uint64_t batches = shoalFakeCudaCallCount("cuStreamBatchMemOp") - batchesBefore;

        // Outside the window the same calls take the other paths, and work.
        if (wrong.empty()) {
          DeviceFloats plain(N, [&](size_t i) { return val(r, i); });
          DeviceFloats out(N);
          call(ncclAllReduce(plain.at(), out.at(), N, ncclFloat, ncclSum, comm, s), "AllReduce outside the window");
          expect(out.at(), N, [&](size_t i) { return sumOfVals(n, i); }, "AllReduce outside the window");
        }
        child.log("kernel launches " + std::to_string(launches) + ", library synchronizations " +
                  std::to_string(hostSyncs) + ", stream waits " + std::to_string(waits) + ", batched board writes " +
                  std::to_string(batches));
        if (!wrong.empty()) {
          child.log(wrong);
          return 3;
        }
        // Reductions by the kernels: 4 reducing calls, n - 1 launches each
        // (a whole block per launch); staged over shm, by the CPU.
        const uint64_t wantLaunches = run.windows ? 4u * static_cast<uint64_t>(n - 1) : 0;
        if (launches != wantLaunches) return 4;
        // On the streams the host waits for nothing; stepping through a
        // device plan, it waits for each kernel and copy.
        if (onStreams ? hostSyncs != 0 || waits < 6u * static_cast<uint64_t>(n - 1) : run.windows && hostSyncs == 0)
          return 5;
        // Each message to a peer's board is one batch of stream writes (a
        // descriptor and a barrier per peer and call at least); where the
        // driver refuses batches, one refusal and then writes one by one.
        if (!run.batches ? batches != 1 : onStreams ? batches < 12u * static_cast<uint64_t>(n - 1) : batches != 0)
          return 8;
        if (ncclCommWindowDeregister(comm, win) != ncclSuccess) return 6;
        child.barrier();
        ncclMemFree(pool);
        return ncclCommDestroy(comm) == ncclSuccess ? 0 : 7;
      });
      // The six calls on window buffers, and only they, ran reading the
      // peers' windows.
      std::string log;
      for (const auto& rank : result.ranks) {
        std::string path = std::string(logPath) + "." + std::to_string(rank.pid);
        log += readFile(path);
        ::unlink(path.c_str());
      }
      auto count = [&](const std::string& what) {
        size_t found = 0;
        for (size_t at = log.find(what); at != std::string::npos; at = log.find(what, at + 1)) ++found;
        return found;
      };
      INFO(transport << " " << n << " ranks, flags " << run.flags << (run.batches ? "" : ", no batches") << "\n" << result.report());
      CHECK(result.allPassed());
      CHECK(count("reading the peers' windows") == (run.windows ? 6u * static_cast<size_t>(n) : 0u));
      CHECK(count("on the streams, reading the peers' windows") == (onStreams ? 6u * static_cast<size_t>(n) : 0u));
      // The small AllReduce out of place in one phase, on the streams only.
      CHECK(count("(one_shot_read) count 3000 on the streams") == (onStreams ? static_cast<size_t>(n) : 0u));
    }
  ::unlink(logPath);
}

// A rank whose GPU has too few hardware queues (CUDA_DEVICE_MAX_CONNECTIONS
// below 4) would run a windowed plan's kernels and copies behind the user's
// stream waiting for them; one whose streams are synchronous would stage
// while its peers read the windows. The ranks agree on it at init, so every
// rank stages its calls on windows (no kernel, no peer read), default and
// symmetric windows alike, and says why at the registration. A rank whose
// device reduction kernels did not load cannot run the peer-reading plans
// (their reductions are the kernels' work): it maps no peer's device
// buffer, so every rank sees the windows not mapped everywhere and stages
// (with the fix removed, the peers read in place while that rank fails its
// call, and they wait for the no-progress deadline).
TEST_CASE("one rank with too few hardware queues or synchronous streams or no kernels stages every rank's calls on windows",
          "[cudafake][mp]") {
  struct Case {
    std::pair<std::string, std::string> rankOneEnv;
    std::string said;  // by every rank at the registration
  };
  const std::string hidden = shoal::cuda::DeviceReducer::kernelName(shoal::DataType::kInt8, shoal::reduce::ElementOp::kSum);
  for (const Case& c : {Case{{"CUDA_DEVICE_MAX_CONNECTIONS", "1"},
                             "its operations are staged (rank 1's CUDA_DEVICE_MAX_CONNECTIONS is below 4)"},
                        Case{{"SHOAL_CUDA_WAIT", "sync"}, "its operations are staged (rank 1's streams are synchronous)"},
                        Case{{"SHOAL_FAKECUDA_HIDE_KERNEL", hidden}, "some ranks' buffers are not mapped by others"}})
  for (int flags : {NCCL_WIN_DEFAULT, NCCL_WIN_COLL_SYMMETRIC}) {
    RankLogs logs;
    shoal::testing::MpConfig cfg;
    cfg.nranks = 3;
    cfg.env = logs.env();
    cfg.env.emplace_back("NCCL_DEBUG_SUBSYS", "INIT,REG,COLL");
    cfg.env.emplace_back("NCCL_DEBUG", "TRACE");
    cfg.env.emplace_back("SHOAL_TRANSPORT", "shm");
    cfg.env.emplace_back("SHOAL_PROGRESS_TIMEOUT_MS", "3000");
    auto result = shoal::testing::forkedDeviceRanks(cfg, [&](shoal::testing::MpChild& child, ncclComm_t comm, CUstream s) {
      const int n = child.nranks();
      const size_t N = 3000;
      WindowedPair w;
      if (!w.make(comm, child.rank(), N, flags)) return 2;
      const uint64_t launchesBefore = shoalFakeCudaCallCount("cuLaunchKernel");
      if (ncclAllReduce(w.send, w.recv, N, ncclFloat, ncclSum, comm, s) != ncclSuccess) {
        child.log(std::string("AllReduce: ") + ncclGetLastError(comm));
        return 3;
      }
      if (cuStreamSynchronize(s) != CUDA_SUCCESS) return 4;
      const uint64_t launches = shoalFakeCudaCallCount("cuLaunchKernel") - launchesBefore;
      std::vector<float> got = fromDevice(w.recv, N);
      for (size_t i = 0; i < N; ++i)
        if (got[i] != sumOfVals(n, i)) {
          child.log("element " + std::to_string(i) + ": " + std::to_string(got[i]));
          return 5;
        }
      child.log("kernel launches " + std::to_string(launches));
      if (launches != 0) return 6;  // a device plan ran: not staged
      if (ncclCommWindowDeregister(comm, w.win) != ncclSuccess) return 7;
      child.barrier();
      ncclMemFree(w.pool);
      return ncclCommDestroy(comm) == ncclSuccess ? 0 : 8;
    }, {{}, {c.rankOneEnv}, {}});
    const std::string log = logs.collect(result);
    INFO(c.rankOneEnv.first << "=" << c.rankOneEnv.second << ", flags " << flags << "\n" << result.report() << "\n"
                            << log);
    CHECK(result.allPassed());
    size_t said = 0;
    for (size_t at = log.find(c.said); at != std::string::npos; at = log.find(c.said, at + 1)) ++said;
    CHECK(said == 3u);  // every rank says so
    CHECK(log.find("reading the peers' windows") == std::string::npos);
  }
}

// A rank whose streams turn synchronous after init (a stream memory
// operation refused at a call, no wait kernel) cannot run the windowed plan
// its peers run: its call fails with the reason, the communicator fails,
// and the peer's call is released with an error too.
TEST_CASE("a rank whose streams turn synchronous after init fails its windowed call and the communicator",
          "[cudafake][mp]") {
  auto result = forkedRanks(2, "shm", {{"SHOAL_PROGRESS_TIMEOUT_MS", "1000"}},
                            [&](shoal::testing::MpChild& child, ncclComm_t comm, CUstream s) {
    const int r = child.rank();
    const size_t N = 3000;
    WindowedPair w;
    if (!w.make(comm, r, N, NCCL_WIN_DEFAULT)) return 2;
    if (r == 1) {
      shoalFakeCudaSetMemOps(0);
      shoalFakeCudaHideKernel("shoal_wait_u64");
    }
    auto t0 = Clock::now();
    const ncclResult_t called = ncclAllReduce(w.send, w.recv, N, ncclFloat, ncclSum, comm, s);
    ncclResult_t async = called;
    if (called == ncclSuccess) {
      cuStreamSynchronize(s);
      async = awaitAsyncError(comm, t0);
    }
    const std::string why = ncclGetLastError(comm);
    child.log(std::string(called == ncclSuccess ? "async " : "call ") + ncclGetErrorString(async) + ": " + why);
    if (r == 1) {
      if (called != ncclInvalidUsage || why.find("turned synchronous after init") == std::string::npos) return 3;
      ncclResult_t state = ncclSuccess;
      ncclCommGetAsyncError(comm, &state);
      if (state != ncclInvalidUsage) return 4;  // the communicator has failed
    } else if (async == ncclSuccess || async == ncclInProgress) {
      return 5;
    }
    ncclCommAbort(comm);
    cuStreamSynchronize(s);
    return 0;
  });
  INFO(result.report());
  CHECK(result.allPassed());
}

// Symmetric windows promise the same offsets on every rank: a rank that
// breaks it meets its peers' streams with another descriptor. Their waits
// stall (no kernel runs before), a rank names both calls at once, and the
// streams are released (running on, as after any failure, on whatever
// bytes are there).
TEST_CASE("a call on symmetric windows at other offsets on one rank is named, and the streams released",
          "[cudafake][mp]") {
  auto result = forkedRanks(2, "shm", {{"SHOAL_PROGRESS_TIMEOUT_MS", "3000"}},
                            [&](shoal::testing::MpChild& child, ncclComm_t comm, CUstream s) {
    const size_t N = 1000;
    void* pool = nullptr;
    if (ncclMemAlloc(&pool, 1 << 20) != ncclSuccess) return 1;
    ncclWindow_t win = nullptr;
    if (ncclCommWindowRegister(comm, pool, 1 << 20, &win, NCCL_WIN_COLL_SYMMETRIC) != ncclSuccess) return 2;
    // Rank 1's buffers lie 4096 bytes further into the window than rank 0's.
    auto* send = static_cast<float*>(pool) + (child.rank() == 1 ? 1024 : 0);
    float* recv = send + 2 * N;
    toDevice(send, valsOf(child.rank(), N));
    const uint64_t launchesBefore = shoalFakeCudaCallCount("cuLaunchKernel");
    auto t0 = Clock::now();
    // The peer may name the mismatch and break its board while this rank is
    // still enqueueing the call (its descriptor went first): then the call
    // itself fails, and the part already enqueued is released by the abort.
    const ncclResult_t called = ncclAllReduce(send, recv, N, ncclFloat, ncclSum, comm, s);
    ncclResult_t async = called;
    if (called == ncclSuccess) {
      if (cuStreamSynchronize(s) != CUDA_SUCCESS) return 4;
      async = awaitAsyncError(comm, t0);
    }
    const std::string why = ncclGetLastError(comm);
    child.log(std::string(called == ncclSuccess ? "async " : "call ") + ncclGetErrorString(async) + " after " +
              std::to_string(msSince(t0)) + " ms: " + why);
    if (async != ncclInvalidUsage && async != ncclRemoteError) return 5;
    if (msSince(t0) > 2500) return 6;  // named at once, not at the no-progress deadline
    // The communicator has failed: the next call is refused.
    if (ncclAllReduce(send, recv, N, ncclFloat, ncclSum, comm, s) == ncclSuccess) return 7;
    child.log("kernel launches " + std::to_string(shoalFakeCudaCallCount("cuLaunchKernel") - launchesBefore));
    ncclCommAbort(comm);
    if (cuStreamSynchronize(s) != CUDA_SUCCESS) return 8;  // released, at the latest by the abort
    ncclMemFree(pool);
    return 0;
  });
  INFO(result.report());
  CHECK(result.allPassed());
  const std::string report = result.report();
  // The first rank to see both descriptors names them; the other may learn
  // first that its peer's board broke.
  const std::string at0 = "AllReduce #0 (float, args 181) of 1000 elements on windows 0 and 0 at offsets 0 and 8000";
  const std::string at1 = "AllReduce #0 (float, args 181) of 1000 elements on windows 0 and 0 at offsets 4096 and 12096";
  CHECK((report.find("rank 0 called " + at0 + "; this rank called " + at1) != std::string::npos ||
         report.find("rank 1 called " + at1 + "; this rank called " + at0) != std::string::npos));
}

// On symmetric windows the streams wait on window boards: a peer that died
// between calls leaves them waiting until the no-progress deadline, which
// fails the call naming it and releases this rank's stream.
TEST_CASE("a killed peer releases a stream waiting on window boards", "[cudafake][mp]") {
  auto result = forkedRanks(2, "shm", {{"SHOAL_PROGRESS_TIMEOUT_MS", "2000"}},
                            [&](shoal::testing::MpChild& child, ncclComm_t comm, CUstream s) {
    const size_t N = 1000;
    void* pool = nullptr;
    if (ncclMemAlloc(&pool, 2 * N * sizeof(float)) != ncclSuccess) return 1;
    auto* send = static_cast<float*>(pool);
    float* recv = send + N;
    ncclWindow_t win = nullptr;
    if (ncclCommWindowRegister(comm, pool, 2 * N * sizeof(float), &win, NCCL_WIN_COLL_SYMMETRIC) != ncclSuccess)
      return 2;
    toDevice(send, valsOf(child.rank(), N));
    if (ncclAllReduce(send, recv, N, ncclFloat, ncclSum, comm, s) != ncclSuccess) return 3;
    cuStreamSynchronize(s);
    std::vector<float> got = fromDevice(recv, N);
    for (size_t i = 0; i < N; ++i)
      if (got[i] != sumOfVals(2, i)) return 4;
    rankOneDiesHere(child);
    auto t0 = Clock::now();
    if (ncclAllReduce(send, recv, N, ncclFloat, ncclSum, comm, s) != ncclSuccess) return 5;
    if (cuStreamSynchronize(s) != CUDA_SUCCESS) return 6;  // released, not stuck
    const double ms = msSince(t0);
    const ncclResult_t async = awaitAsyncError(comm, t0);
    const std::string why = ncclGetLastError(comm);
    child.log("stream released after " + std::to_string(ms) + " ms, async " + ncclGetErrorString(async) + ": " + why);
    if (async == ncclSuccess || async == ncclInProgress) return 7;
    if (ms > 15000) return 8;
    if (why.find("rank 1") == std::string::npos) return 9;  // the error names the peer it waited on
    ncclCommAbort(comm);
    ncclMemFree(pool);
    return 0;
  });
  INFO(result.report());
  REQUIRE(result.ranks.size() == 2);
  CHECK(result.ranks[0].exited);
  CHECK(result.ranks[0].exitCode == 0);
  CHECK(result.ranks[1].termSignal == SIGKILL);
}

// Calls on window buffers that no peer-reading plan serves (a float average
// is PreMulSum, an integer one divides) take the other paths on every rank,
// with the right bytes. A window deregistered while a call on it is still
// behind a stream delay stays mapped until that call is done, which reads it.
TEST_CASE("window calls without a peer-reading plan take the other paths, and deregistering waits for calls in flight",
          "[cudafake][mp]") {
  // Host-stepped (default windows) and on the streams (symmetric ones).
  for (const int flags : {NCCL_WIN_DEFAULT, NCCL_WIN_COLL_SYMMETRIC}) {
  auto result = forkedRanks(3, "shm", {}, [&](shoal::testing::MpChild& child, ncclComm_t comm, CUstream s) {
    const int r = child.rank(), n = child.nranks();
    const size_t N = 2048;
    WindowedPair w;
    if (!w.make(comm, r, N, flags)) return 2;
    void* pool = w.pool;
    float* send = w.send;
    float* recv = w.recv;
    ncclWindow_t win = w.win;

    if (ncclAllReduce(send, recv, N, ncclFloat, ncclAvg, comm, s) != ncclSuccess) {
      child.log(std::string("float avg: ") + ncclGetLastError(comm));
      return 3;
    }
    cuStreamSynchronize(s);
    std::vector<float> got = fromDevice(recv, N);
    for (size_t i = 0; i < N; ++i) {
      float want = 0;
      for (int q = 0; q < n; ++q) want += val(q, i) * (1.0f / static_cast<float>(n));  // PreMulSum by 1/n, summed
      if (std::fabs(got[i] - want) > 1e-3f * want) {
        child.log("float avg element " + std::to_string(i) + ": " + std::to_string(got[i]));
        return 4;
      }
    }
    std::vector<int32_t> ints(N);
    for (size_t i = 0; i < N; ++i) ints[i] = static_cast<int32_t>(r * 7 + i);
    cuMemcpyHtoD(reinterpret_cast<CUdeviceptr>(send), ints.data(), N * sizeof(int32_t));
    if (ncclAllReduce(send, recv, N, ncclInt32, ncclAvg, comm, s) != ncclSuccess) {
      child.log(std::string("int avg: ") + ncclGetLastError(comm));
      return 5;
    }
    cuStreamSynchronize(s);
    cuMemcpyDtoH(ints.data(), reinterpret_cast<CUdeviceptr>(recv), N * sizeof(int32_t));
    for (size_t i = 0; i < N; ++i)
      if (ints[i] != static_cast<int32_t>((7 * (n - 1) * n / 2 + n * static_cast<int>(i)) / n)) {
        child.log("int avg element " + std::to_string(i) + ": " + std::to_string(ints[i]));
        return 6;
      }

    // A call held 300 ms behind its stream, its window deregistered at once.
    toDevice(send, valsOf(r, N));
    shoalFakeCudaStreamDelay(s, 300);
    const uint64_t syncsBefore = shoalFakeCudaCallCount("cuStreamSynchronize");
    if (ncclAllReduce(send, recv, N, ncclFloat, ncclSum, comm, s) != ncclSuccess) return 7;
    if (ncclCommWindowDeregister(comm, win) != ncclSuccess) return 8;
    if (shoal::cuda::PeerImports::instance().mapped() != static_cast<size_t>(n - 1)) return 9;  // still mapped
    cuStreamSynchronize(s);
    // The library's own synchronizations: a host-stepped device plan waits
    // for each step; on the streams nothing is waited for.
    const uint64_t librarySyncs = shoalFakeCudaCallCount("cuStreamSynchronize") - syncsBefore - 1;
    if ((flags == NCCL_WIN_COLL_SYMMETRIC) != (librarySyncs == 0)) {
      child.log("library synchronizations " + std::to_string(librarySyncs));
      return 17;
    }
    got = fromDevice(recv, N);
    for (size_t i = 0; i < N; ++i)
      if (got[i] != sumOfVals(n, i)) {
        child.log("sum behind the delay element " + std::to_string(i) + ": " + std::to_string(got[i]));
        return 10;
      }
    // Released by the next window call once nothing may read it.
    void* other = nullptr;
    ncclWindow_t second = nullptr;
    if (ncclMemAlloc(&other, 4096) != ncclSuccess) return 11;
    if (ncclCommWindowRegister(comm, other, 4096, &second, flags) != ncclSuccess) return 12;
    if (shoal::cuda::PeerImports::instance().mapped() != static_cast<size_t>(n - 1)) return 13;  // only the new one's
    if (ncclCommWindowDeregister(comm, second) != ncclSuccess) return 14;
    if (shoal::cuda::PeerImports::instance().mapped() != 0) return 15;
    child.barrier();
    ncclMemFree(other);
    ncclMemFree(pool);
    return ncclCommDestroy(comm) == ncclSuccess ? 0 : 16;
  });
  INFO("flags " << flags << "\n" << result.report());
  CHECK(result.allPassed());
  }
}

// Ranks as threads of one process: each maps the others' window buffers by
// their addresses (nothing imported), and the calls read them in place.
// Threads on one GPU step their windowed calls by the host unless told
// (SHOAL_CUDA_STREAM_PLANS=1): on the streams, each rank's streams would
// wait on words the others' write through the context's shared queues.
TEST_CASE("collectives on window buffers with ranks as threads read each other's buffers by address", "[cudafake]") {
  constexpr int kRanks = 3;
  constexpr size_t N = 5000;
  const bool forced = GENERATE(false, true);
  shoal::testing::ScopedEnv env{{"SHOAL_CUDA_STREAM_PLANS", forced ? "1" : "auto"}};
  const uint64_t importsBefore = shoalFakeCudaCallCount("cuMemImportFromShareableHandle");
  const uint64_t launchesBefore = shoalFakeCudaCallCount("cuLaunchKernel");
  Mismatches bad;
  onThreads(kRanks, [&](int r, ncclComm_t comm, CUstream s) {
    void* pool = nullptr;
    bad.expect(ncclMemAlloc(&pool, 3 * N * kRanks * sizeof(float)) == ncclSuccess, "ncclMemAlloc");
    ncclWindow_t win = nullptr;
    bad.expect(ncclCommWindowRegister(comm, pool, 3 * N * kRanks * sizeof(float), &win, NCCL_WIN_COLL_SYMMETRIC) ==
                   ncclSuccess,
               "register");
    auto* window = reinterpret_cast<shoal::Window*>(win);
    bad.expect(window != nullptr && window->mappedEverywhere(), "every rank maps every rank's buffer");
    bad.expect(window != nullptr && window->onStreams() == forced, "on the streams only when told");
    auto* send = static_cast<float*>(pool);
    float* recv = send + N * kRanks;
    toDevice(send, valsOf(r, N));
    bad.expect(ncclAllReduce(send, recv, N, ncclFloat, ncclSum, comm, s) == ncclSuccess, "AllReduce");
    cuStreamSynchronize(s);
    std::vector<float> got = fromDevice(recv, N);
    for (size_t i = 0; i < N; ++i) bad.expect(got[i] == sumOfVals(kRanks, i), "AllReduce element " + std::to_string(i));
    bad.expect(ncclAllGather(send, recv, N, ncclFloat, comm, s) == ncclSuccess, "AllGather");
    cuStreamSynchronize(s);
    got = fromDevice(recv, N * kRanks);
    for (size_t i = 0; i < N * kRanks; ++i)
      bad.expect(got[i] == val(static_cast<int>(i / N), i % N), "AllGather element " + std::to_string(i));
    bad.expect(ncclCommWindowDeregister(comm, win) == ncclSuccess, "deregister");
    // Every rank is done reading before any frees (onThreads destroys
    // after); on host memory, which launches no kernel.
    float fence = 1.0f;
    bad.expect(ncclAllReduce(&fence, &fence, 1, ncclFloat, ncclSum, comm, s) == ncclSuccess, "fence");
    cuStreamSynchronize(s);
    ncclMemFree(pool);
  });
  INFO((forced ? "SHOAL_CUDA_STREAM_PLANS=1: " : "") << bad.first);
  CHECK(bad.count == 0);
  CHECK(shoalFakeCudaCallCount("cuMemImportFromShareableHandle") == importsBefore);
  // The AllReduce's reductions ran as kernels reading the peers' buffers,
  // n - 1 per rank (peer_read: each rank reduces its block).
  CHECK(shoalFakeCudaCallCount("cuLaunchKernel") - launchesBefore == static_cast<uint64_t>(kRanks * (kRanks - 1)));
}

// Ranks as threads that had no CUDA context at init know nothing of where
// their calls will run: their device windows are not mapped by each other
// (every rank knows it at the registration), and the calls take the other
// paths, with the right sums.
TEST_CASE("device windows of threads initialized without a context are not read across", "[cudafake]") {
  constexpr int kRanks = 2;
  constexpr size_t N = 1000;
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  ncclUniqueId id;
  NCCL_OK(ncclGetUniqueId(&id));
  std::array<std::string, kRanks> wrong;
  std::array<bool, kRanks> mapped{};
  auto rank = [&](int r) {
    auto fail = [&](const std::string& what) {
      if (wrong[r].empty()) wrong[r] = what;
    };
    cuCtxSetCurrent(nullptr);
    ncclComm_t comm = nullptr;
    if (ncclCommInitRank(&comm, kRanks, id, r) != ncclSuccess) return fail("init");
    CUcontext ctx = nullptr;
    if (cuDevicePrimaryCtxRetain(&ctx, 0) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS)
      return fail("context");
    CUstream s = nullptr;
    cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
    void* pool = nullptr;
    if (ncclMemAlloc(&pool, 2 * N * sizeof(float)) != ncclSuccess) return fail("ncclMemAlloc");
    auto* send = static_cast<float*>(pool);
    toDevice(send, valsOf(r, N));
    ncclWindow_t win = nullptr;
    if (ncclCommWindowRegister(comm, pool, 2 * N * sizeof(float), &win, NCCL_WIN_DEFAULT) != ncclSuccess)
      return fail(std::string("register: ") + ncclGetLastError(comm));
    mapped[r] = reinterpret_cast<shoal::Window*>(win)->mappedEverywhere();
    if (ncclAllReduce(send, send + N, N, ncclFloat, ncclSum, comm, s) != ncclSuccess)
      return fail(std::string("AllReduce: ") + ncclGetLastError(comm));
    cuStreamSynchronize(s);
    std::vector<float> got = fromDevice(send + N, N);
    for (size_t i = 0; i < N; ++i)
      if (got[i] != sumOfVals(kRanks, i)) return fail("element " + std::to_string(i));
    ncclCommWindowDeregister(comm, win);
    float fence = 1.0f;  // both done before either frees
    ncclAllReduce(&fence, &fence, 1, ncclFloat, ncclSum, comm, s);
    cuStreamSynchronize(s);
    ncclMemFree(pool);
    ncclCommDestroy(comm);
    cuStreamDestroy(s);
  };
  std::thread other(rank, 1);
  rank(0);
  other.join();
  INFO(wrong[0] << " / " << wrong[1]);
  CHECK(wrong[0].empty());
  CHECK(wrong[1].empty());
  CHECK_FALSE(mapped[0]);
  CHECK_FALSE(mapped[1]);
}

// NCCL_WIN_ENABLE=0: windows are registered and nothing of a peer is
// mapped, even between threads of one process; the calls take the path of
// buffers outside windows (the same kernels) with the right bytes.
TEST_CASE("NCCL_WIN_ENABLE=0 maps nothing of a peer, also between threads", "[cudafake]") {
  shoal::testing::ScopedEnv env{{"NCCL_WIN_ENABLE", "0"}};
  constexpr int kRanks = 2;
  constexpr size_t N = 1000;
  Mismatches bad;
  uint64_t launchesBefore = shoalFakeCudaCallCount("cuLaunchKernel");
  onThreads(kRanks, [&](int r, ncclComm_t comm, CUstream s) {
    DeviceFloats send(N, [&](size_t i) { return val(r, i); }), recv(N);
    bad.expect(ncclAllReduce(send.at(), recv.at(), N, ncclFloat, ncclSum, comm, s) == ncclSuccess, "AllReduce");
    cuStreamSynchronize(s);
  });
  const uint64_t outsideWindows = shoalFakeCudaCallCount("cuLaunchKernel") - launchesBefore;
  launchesBefore = shoalFakeCudaCallCount("cuLaunchKernel");
  onThreads(kRanks, [&](int r, ncclComm_t comm, CUstream s) {
    void* pool = nullptr;
    bad.expect(ncclMemAlloc(&pool, 2 * N * sizeof(float)) == ncclSuccess, "ncclMemAlloc");
    ncclWindow_t win = nullptr;
    bad.expect(ncclCommWindowRegister(comm, pool, 2 * N * sizeof(float), &win, NCCL_WIN_DEFAULT) == ncclSuccess,
               "register");
    auto* window = reinterpret_cast<shoal::Window*>(win);
    bad.expect(window != nullptr && window->buffer(1 - r) == nullptr && !window->maps(r, 1 - r) &&
                   !window->maps(1 - r, r) && window->maps(r, r),
               "only a rank's own buffer is mapped");
    auto* send = static_cast<float*>(pool);
    toDevice(send, valsOf(r, N));
    bad.expect(ncclAllReduce(send, send + N, N, ncclFloat, ncclSum, comm, s) == ncclSuccess, "AllReduce");
    cuStreamSynchronize(s);
    std::vector<float> got = fromDevice(send + N, N);
    for (size_t i = 0; i < N; ++i) bad.expect(got[i] == sumOfVals(kRanks, i), "AllReduce element " + std::to_string(i));
    bad.expect(ncclCommWindowDeregister(comm, win) == ncclSuccess, "deregister");
    ncclMemFree(pool);
  });
  INFO(bad.first);
  CHECK(bad.count == 0);
  CHECK(shoalFakeCudaCallCount("cuLaunchKernel") - launchesBefore == outsideWindows);
}

// Memory freed while its window is still registered (frameworks free
// ncclMemAlloc blocks without deregistering) and allocated again at the
// same address gets a window of its own: calls on it read the new
// allocations, never the peers' old ones through the stale window.
TEST_CASE("a window over memory freed and allocated again at its address is not read through the stale one",
          "[cudafake][mp]") {
  auto result = forkedRanks(3, "shm", {}, [&](shoal::testing::MpChild& child, ncclComm_t comm, CUstream s) {
    const int r = child.rank(), n = child.nranks();
    const size_t N = 4096;
    const size_t bytes = 2 * N * sizeof(float);
    int reused = 0;
    for (int round = 0; round < 3; ++round) {
      void* pool = nullptr;
      static void* previous = nullptr;
      if (ncclMemAlloc(&pool, bytes) != ncclSuccess) return 1;
      if (pool == previous) ++reused;
      previous = pool;
      ncclWindow_t win = nullptr;
      if (ncclCommWindowRegister(comm, pool, bytes, &win, NCCL_WIN_COLL_SYMMETRIC) != ncclSuccess) return 2;
      auto* send = static_cast<float*>(pool);
      float* recv = send + N;
      std::vector<float> mine(N);
      for (size_t i = 0; i < N; ++i) mine[i] = static_cast<float>((round + 1) * 100 + r + i % 7);
      toDevice(send, mine);
      if (ncclAllReduce(send, recv, N, ncclFloat, ncclSum, comm, s) != ncclSuccess) return 3;
      cuStreamSynchronize(s);
      std::vector<float> got = fromDevice(recv, N);
      for (size_t i = 0; i < N; ++i) {
        float want = 0;
        for (int q = 0; q < n; ++q) want += static_cast<float>((round + 1) * 100 + q + i % 7);
        if (got[i] != want) {
          child.log("round " + std::to_string(round) + " element " + std::to_string(i) + ": " +
                    std::to_string(got[i]) + " want " + std::to_string(want));
          return 4;
        }
      }
      child.barrier();  // every rank is done reading before any frees
      if (ncclMemFree(pool) != ncclSuccess) return 5;  // its window stays registered
    }
    child.log("addresses reused " + std::to_string(reused) + " times");
    return ncclCommDestroy(comm) == ncclSuccess ? 0 : 6;
  });
  INFO(result.report());
  CHECK(result.allPassed());
}
