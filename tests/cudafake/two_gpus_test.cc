// Ranks on two GPUs of one process, on the driver stand-in with two devices
// (set before anything initializes it, hence a binary of its own). The
// stand-in checks cuMem access rights as the driver does: a copy or kernel
// on one device touching another device's cuMem mapping needs
// cuMemSetAccess for it. Each case runs in a process of its own (ctest), as
// the forked ones must: a fork after another case's threads could inherit
// their locks held.
#include <catch2/catch.hpp>

#include <cuda.h>
#include <nccl.h>
#include <stdlib.h>
#include <unistd.h>

#include <array>
#include <fstream>
#include <functional>
#include <iterator>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "comm/window.h"
#include "cudafake/fake_cuda.h"
#include "support/mp_harness.h"
#include "support/nccl_ok.h"
#include "support/scoped_env.h"

namespace {

// The library loads the stand-in this binary links, which emulates two
// devices (both before anything reads the parameters or calls cuInit).
const bool kDriverNamed = setenv("SHOAL_CUDA_DRIVER", SHOAL_CUDAFAKE_LIB, 0) == 0;
const int kTwoDevices = shoalFakeCudaSetDevices(2);


float valueOf(int rank, size_t i) { return static_cast<float>((rank + 1) * 1000 + static_cast<int>(i % 997)); }

// Device `device`'s primary context (null if it cannot be had: the caller
// says so; Catch's assertions are for the test's own thread).
CUcontext contextOf(int device) {
  CUcontext ctx = nullptr;
  return cuDevicePrimaryCtxRetain(&ctx, device) == CUDA_SUCCESS ? ctx : nullptr;
}

// Makes device `device`'s primary context current (the test's thread).
void useDevice(int device) {
  CUcontext ctx = contextOf(device);
  REQUIRE(ctx != nullptr);
  REQUIRE(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
}

// The two communicators of ncclCommInitAll on devices 0 and 1, checked to
// be on them.
std::array<ncclComm_t, 2> commsOnTwoGpus() {
  REQUIRE(kDriverNamed);
  REQUIRE(kTwoDevices == 0);  // before any cuInit in this process
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  int count = 0;
  REQUIRE(cuDeviceGetCount(&count) == CUDA_SUCCESS);
  REQUIRE(count == 2);
  const std::array<int, 2> devices{0, 1};
  std::array<ncclComm_t, 2> comms{};
  NCCL_OK(ncclCommInitAll(comms.data(), 2, devices.data()));
  for (int r = 0; r < 2; ++r) {
    int device = -1;
    NCCL_OK(ncclCommCuDevice(comms[r], &device));
    CHECK(device == r);
  }
  return comms;
}

// One thread drives both ranks in a group, as with NCCL: an AllReduce of
// ncclMemAlloc buffers, each rank's on its GPU, a large message and a small
// one. `beforeCall(r)` runs before rank r's call (what the caller makes
// current then). With `nullStreams` the calls pass the NULL stream, which is
// then each communicator's own device's. Checks the sums and that the GPUs'
// kernels reduced.
void allReduceOnTwoGpus(const std::array<ncclComm_t, 2>& comms, const std::function<void(int)>& beforeCall,
                        bool nullStreams = false) {
  for (size_t N : {size_t{50000}, size_t{8}}) {
    std::array<void*, 2> send{}, recv{};
    std::array<CUstream, 2> streams{};
    for (int r = 0; r < 2; ++r) {
      useDevice(r);
      NCCL_OK(ncclMemAlloc(&send[r], N * sizeof(float)));
      NCCL_OK(ncclMemAlloc(&recv[r], N * sizeof(float)));
      std::vector<float> values(N);
      for (size_t i = 0; i < N; ++i) values[i] = valueOf(r, i);
      REQUIRE(cuMemcpyHtoD(reinterpret_cast<CUdeviceptr>(send[r]), values.data(), N * sizeof(float)) == CUDA_SUCCESS);
      if (!nullStreams) REQUIRE(cuStreamCreate(&streams[r], CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    }
    const std::array<unsigned long long, 2> launchesBefore{shoalFakeCudaReduceLaunchesOn(0),
                                                           shoalFakeCudaReduceLaunchesOn(1)};
    NCCL_OK(ncclGroupStart());
    for (int r = 0; r < 2; ++r) {
      beforeCall(r);
      NCCL_OK(ncclAllReduce(send[r], recv[r], N, ncclFloat, ncclSum, comms[r], streams[r]));
    }
    CUcontext callers = nullptr;
    REQUIRE(cuCtxGetCurrent(&callers) == CUDA_SUCCESS);
    NCCL_OK(ncclGroupEnd());
    // The library made each communicator's context current for its work,
    // and the caller's is current again.
    CUcontext after = nullptr;
    REQUIRE(cuCtxGetCurrent(&after) == CUDA_SUCCESS);
    CHECK(after == callers);
    for (int r = 0; r < 2; ++r) {
      useDevice(r);  // a NULL stream is the current context's
      REQUIRE(cuStreamSynchronize(streams[r]) == CUDA_SUCCESS);
    }
    for (int r = 0; r < 2; ++r) {
      ncclResult_t async = ncclSuccess;
      NCCL_OK(ncclCommGetAsyncError(comms[r], &async));
      INFO(N << " floats, rank " << r << ": " << ncclGetLastError(comms[r]));
      REQUIRE(async == ncclSuccess);
    }
    for (int r = 0; r < 2; ++r) {
      useDevice(r);
      std::vector<float> got(N);
      REQUIRE(cuMemcpyDtoH(got.data(), reinterpret_cast<CUdeviceptr>(recv[r]), N * sizeof(float)) == CUDA_SUCCESS);
      size_t wrong = 0;
      for (size_t i = 0; i < N; ++i)
        if (got[i] != valueOf(0, i) + valueOf(1, i)) ++wrong;
      INFO(N << " floats, rank " << r);
      CHECK(wrong == 0);
    }
    // Reduced by the kernels of each rank on its own GPU, not staged
    // through the host.
    for (int r = 0; r < 2; ++r) CHECK(shoalFakeCudaReduceLaunchesOn(r) > launchesBefore[r]);
    for (int r = 0; r < 2; ++r) {
      useDevice(r);
      NCCL_OK(ncclMemFree(send[r]));
      NCCL_OK(ncclMemFree(recv[r]));
      if (!nullStreams) REQUIRE(cuStreamDestroy(streams[r]) == CUDA_SUCCESS);
    }
  }
}

}  // namespace

// ncclMemAlloc grants every GPU with peer access to the owner, as NCCL's
// does: ranks on two GPUs of one process (ncclCommInitAll) are
// device-direct, their messages GPU copies between the two allocations, run
// on the receiving GPU. Without the grant the copies fail (illegal address).
TEST_CASE("ncclMemAlloc memory of one GPU is reachable from the other: ranks on two GPUs as threads", "[cudafake]") {
  const std::array<ncclComm_t, 2> comms = commsOnTwoGpus();
  allReduceOnTwoGpus(comms, [](int r) { useDevice(r); });
  for (int r = 0; r < 2; ++r) NCCL_OK(ncclCommDestroy(comms[r]));
}

// NCCL's single-thread example calls each GPU's communicator in a group
// without setting the device between the calls: each communicator's work
// runs on its own GPU's context (its kernels loaded there, launched on its
// streams) whatever the caller has current, or with none current, and a
// NULL stream is its own device's; the caller's context is current again
// after the calls.
// In a process that uses CUDA, ncclCommInitAll's devices must exist, as in
// NCCL: a device past the count or negative is an invalid argument naming
// it, and no communicator is made (it had made one with no device).
TEST_CASE("ncclCommInitAll refuses a device the driver does not have", "[cudafake]") {
  std::array<ncclComm_t, 2> comms = commsOnTwoGpus();  // the driver is in use
  for (ncclComm_t c : comms) NCCL_OK(ncclCommDestroy(c));
  for (int bad : {2, -1, 77}) {
    INFO("device " << bad);
    const std::array<int, 2> devices{0, bad};
    std::array<ncclComm_t, 2> more{};
    CHECK(ncclCommInitAll(more.data(), 2, devices.data()) == ncclInvalidArgument);
    CHECK(std::string(ncclGetLastError(nullptr)).find("invalid device " + std::to_string(bad)) != std::string::npos);
  }
  std::array<ncclComm_t, 3> three{};
  CHECK(ncclCommInitAll(three.data(), 3, nullptr) == ncclInvalidArgument);  // devices 0..2 of 2
}

// As NCCL, whose ncclMemAlloc allocates on cudaGetDevice's device (0 on a
// thread that never chose one): in a process that uses CUDA, a thread with
// no context current gets device 0's memory, not host memory; with device
// 1 current, device 1's.
TEST_CASE("ncclMemAlloc on a thread with no context current allocates on device 0", "[cudafake]") {
  std::array<ncclComm_t, 2> comms = commsOnTwoGpus();  // the driver is in use
  for (ncclComm_t c : comms) NCCL_OK(ncclCommDestroy(c));
  for (int current : {-1, 1}) {
    INFO("context current: " << (current < 0 ? std::string("none") : "device " + std::to_string(current)));
    std::string failure = "not run";
    void* mem = nullptr;
    std::thread([&] {
      if (current >= 0 && cuCtxSetCurrent(contextOf(current)) != CUDA_SUCCESS) {
        failure = "cuCtxSetCurrent";
        return;
      }
      failure = ncclMemAlloc(&mem, 1 << 20) == ncclSuccess ? "" : std::string("ncclMemAlloc: ") + ncclGetLastError(nullptr);
    }).join();
    INFO(failure);
    REQUIRE(failure.empty());
    useDevice(0);  // the stand-in, as the driver, answers pointer queries under a context
    int type = 0, ordinal = -1;
    const auto ptr = reinterpret_cast<CUdeviceptr>(mem);
    REQUIRE(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr) == CUDA_SUCCESS);
    REQUIRE(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr) == CUDA_SUCCESS);
    NCCL_OK(ncclMemFree(mem));
    CHECK(type == CU_MEMORYTYPE_DEVICE);
    CHECK(ordinal == (current < 0 ? 0 : current));
  }
}

// A device twice in devlist: several ranks on one GPU, allowed by default
// (docs/cuda.md) and refused at the call with NCCL_MULTI_RANK_GPU_ENABLE=0;
// as NCCL, each entry's device is checked before it is compared, so a
// missing device twice is an invalid argument, not a repeated one.
TEST_CASE("ncclCommInitAll with a device twice makes ranks that share it, unless refused", "[cudafake]") {
  std::array<ncclComm_t, 2> comms = commsOnTwoGpus();  // the driver is in use
  for (ncclComm_t c : comms) NCCL_OK(ncclCommDestroy(c));
  const std::array<int, 2> twice{1, 1}, missingTwice{7, 7};
  {
    shoal::testing::ScopedEnv refuse{{"NCCL_MULTI_RANK_GPU_ENABLE", "0"}};
    CHECK(ncclCommInitAll(comms.data(), 2, missingTwice.data()) == ncclInvalidArgument);
    CHECK(std::string(ncclGetLastError(nullptr)).find("invalid device 7") != std::string::npos);
    CHECK(ncclCommInitAll(comms.data(), 2, twice.data()) == ncclInvalidUsage);
    CHECK(std::string(ncclGetLastError(nullptr)).find("appears twice") != std::string::npos);
  }
  CHECK(ncclCommInitAll(comms.data(), 2, missingTwice.data()) == ncclInvalidArgument);
  NCCL_OK(ncclCommInitAll(comms.data(), 2, twice.data()));
  constexpr size_t N = 4096;
  useDevice(1);
  std::array<void*, 2> buf{};
  for (int r = 0; r < 2; ++r) {
    int device = -1;
    NCCL_OK(ncclCommCuDevice(comms[r], &device));
    CHECK(device == 1);
    NCCL_OK(ncclMemAlloc(&buf[r], N * sizeof(float)));
    std::vector<float> values(N);
    for (size_t i = 0; i < N; ++i) values[i] = valueOf(r, i);
    REQUIRE(cuMemcpyHtoD(reinterpret_cast<CUdeviceptr>(buf[r]), values.data(), N * sizeof(float)) == CUDA_SUCCESS);
  }
  // A stream per rank: ranks that wait for each other cannot share one.
  std::array<CUstream, 2> streams{};
  for (CUstream& s : streams) REQUIRE(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  NCCL_OK(ncclGroupStart());
  for (int r = 0; r < 2; ++r) NCCL_OK(ncclAllReduce(buf[r], buf[r], N, ncclFloat, ncclSum, comms[r], streams[r]));
  NCCL_OK(ncclGroupEnd());
  for (CUstream s : streams) {
    REQUIRE(cuStreamSynchronize(s) == CUDA_SUCCESS);
    REQUIRE(cuStreamDestroy(s) == CUDA_SUCCESS);
  }
  for (int r = 0; r < 2; ++r) {
    std::vector<float> got(N);
    REQUIRE(cuMemcpyDtoH(got.data(), reinterpret_cast<CUdeviceptr>(buf[r]), N * sizeof(float)) == CUDA_SUCCESS);
    size_t wrong = 0;
    for (size_t i = 0; i < N; ++i)
      if (got[i] != valueOf(0, i) + valueOf(1, i)) ++wrong;
    INFO("rank " << r);
    CHECK(wrong == 0);
    NCCL_OK(ncclMemFree(buf[r]));
  }
  for (ncclComm_t c : comms) NCCL_OK(ncclCommDestroy(c));
}

TEST_CASE("one thread calls the communicators of two GPUs with another device current or none", "[cudafake]") {
  const CUcontext second = contextOf(1);
  // Fresh communicators each time: their first call makes what they keep
  // (kernels, streams), on whatever is current then.
  struct Pass {
    CUcontext current;
    bool nullStreams;
  };
  for (const Pass pass : {Pass{second, false}, Pass{nullptr, false}, Pass{second, true}}) {
    const std::array<ncclComm_t, 2> comms = commsOnTwoGpus();
    allReduceOnTwoGpus(comms, [&](int) { REQUIRE(cuCtxSetCurrent(pass.current) == CUDA_SUCCESS); }, pass.nullStreams);
    for (int r = 0; r < 2; ++r) NCCL_OK(ncclCommDestroy(comms[r]));
  }
}

// A stream of another GPU than the communicator's is a bad argument, named
// (its kernels cannot run there), refused when the call is made, in a
// group too (where it fails the whole group, as every failed call does), so
// nothing is left waiting: the same calls on the right streams then run.
TEST_CASE("a stream of another GPU than the communicator's is refused with ncclInvalidArgument", "[cudafake]") {
  const std::array<ncclComm_t, 2> comms = commsOnTwoGpus();
  constexpr size_t N = 1000;
  std::array<void*, 2> buf{};
  std::array<CUstream, 2> streams{};
  for (int r = 0; r < 2; ++r) {
    useDevice(r);
    NCCL_OK(ncclMemAlloc(&buf[r], N * sizeof(float)));
    std::vector<float> values(N);
    for (size_t i = 0; i < N; ++i) values[i] = valueOf(r, i);
    REQUIRE(cuMemcpyHtoD(reinterpret_cast<CUdeviceptr>(buf[r]), values.data(), N * sizeof(float)) == CUDA_SUCCESS);
    REQUIRE(cuStreamCreate(&streams[r], CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  }
  CHECK(ncclAllReduce(buf[0], buf[0], N, ncclFloat, ncclSum, comms[0], streams[1]) == ncclInvalidArgument);
  const std::string why = ncclGetLastError(comms[0]);
  INFO(why);
  CHECK(why.find("a stream of another CUDA context than the communicator's (device 0)") != std::string::npos);
  // A call of no elements never reaches a stream, as in NCCL: not refused.
  NCCL_OK(ncclAllReduce(buf[0], buf[0], 0, ncclFloat, ncclSum, comms[0], streams[1]));
  NCCL_OK(ncclGroupStart());
  CHECK(ncclAllReduce(buf[1], buf[1], N, ncclFloat, ncclSum, comms[1], streams[0]) == ncclInvalidArgument);
  NCCL_OK(ncclAllReduce(buf[0], buf[0], N, ncclFloat, ncclSum, comms[0], streams[0]));
  CHECK(ncclGroupEnd() == ncclInvalidArgument);  // the group fails whole, rank 0's call too
  {
    useDevice(0);
    REQUIRE(cuStreamSynchronize(streams[0]) == CUDA_SUCCESS);
    std::vector<float> got(N);
    REQUIRE(cuMemcpyDtoH(got.data(), reinterpret_cast<CUdeviceptr>(buf[0]), N * sizeof(float)) == CUDA_SUCCESS);
    size_t moved = 0;
    for (size_t i = 0; i < N; ++i)
      if (got[i] != valueOf(0, i)) ++moved;
    CHECK(moved == 0);
  }
  NCCL_OK(ncclGroupStart());
  for (int r = 0; r < 2; ++r) NCCL_OK(ncclAllReduce(buf[r], buf[r], N, ncclFloat, ncclSum, comms[r], streams[r]));
  NCCL_OK(ncclGroupEnd());
  for (int r = 0; r < 2; ++r) {
    REQUIRE(cuStreamSynchronize(streams[r]) == CUDA_SUCCESS);
    std::vector<float> got(N);
    REQUIRE(cuMemcpyDtoH(got.data(), reinterpret_cast<CUdeviceptr>(buf[r]), N * sizeof(float)) == CUDA_SUCCESS);
    size_t wrong = 0;
    for (size_t i = 0; i < N; ++i)
      if (got[i] != valueOf(0, i) + valueOf(1, i)) ++wrong;
    CHECK(wrong == 0);
  }
  for (int r = 0; r < 2; ++r) {
    useDevice(r);
    NCCL_OK(ncclMemFree(buf[r]));
    REQUIRE(cuStreamDestroy(streams[r]) == CUDA_SUCCESS);
    NCCL_OK(ncclCommDestroy(comms[r]));
  }
}

// Two processes, rank r on the machine's device r, AllReduce 50,000 floats
// of device memory in place; their INFO logs (INIT) joined. With
// `eachSeesOneGpu` each sees only its own GPU, as ordinal 0, as launchers
// that give each process one GPU make it with CUDA_VISIBLE_DEVICES=r (the
// stand-in's SHOAL_FAKECUDA_VISIBLE_DEVICES=r). Device-direct ranks must
// have reduced in the kernels.
struct ProcessesRun {
  shoal::testing::MpResult result;
  std::string log;
};
ProcessesRun allReduceInTwoProcesses(bool eachSeesOneGpu, bool expectDirect,
                                     std::vector<std::pair<std::string, std::string>> env) {
  REQUIRE(kTwoDevices == 0);
  char logPath[] = "/tmp/shoal-two-gpus-log-XXXXXX";
  const int fd = mkstemp(logPath);
  REQUIRE(fd >= 0);
  close(fd);
  shoal::testing::MpConfig cfg;
  cfg.nranks = 2;
  cfg.env = {{"SHOAL_TRANSPORT", ""}, {"NCCL_DEBUG", "INFO"}, {"NCCL_DEBUG_SUBSYS", "INIT"},
             {"NCCL_DEBUG_FILE", std::string(logPath) + ".%p"}};
  cfg.env.insert(cfg.env.end(), env.begin(), env.end());
  ProcessesRun run;
  run.result = shoal::testing::runForked(cfg, [&](shoal::testing::MpChild& child) -> int {
    const int r = child.rank();
    if (eachSeesOneGpu && setenv("SHOAL_FAKECUDA_VISIBLE_DEVICES", std::to_string(r).c_str(), 1) != 0) return 9;
    if (cuInit(0) != CUDA_SUCCESS) return 10;
    const int device = eachSeesOneGpu ? 0 : r;
    int count = 0;
    if (cuDeviceGetCount(&count) != CUDA_SUCCESS || count != (eachSeesOneGpu ? 1 : 2)) return 11;
    CUcontext ctx = nullptr;
    if (cuDevicePrimaryCtxRetain(&ctx, device) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS) return 12;
    CUstream s = nullptr;
    if (cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) return 13;
    ncclUniqueId id;
    if (!child.uniqueId(&id)) return 14;
    ncclComm_t comm = nullptr;
    if (ncclCommInitRank(&comm, 2, id, r) != ncclSuccess) {
      child.log(std::string("init: ") + ncclGetLastError(nullptr));
      return 15;
    }
    int commDevice = -1;
    if (ncclCommCuDevice(comm, &commDevice) != ncclSuccess || commDevice != device) return 16;
    const size_t N = 50000;
    std::vector<float> values(N);
    for (size_t i = 0; i < N; ++i) values[i] = valueOf(r, i);
    CUdeviceptr buf = 0;
    if (cuMemAlloc(&buf, N * sizeof(float)) != CUDA_SUCCESS) return 17;
    cuMemcpyHtoD(buf, values.data(), N * sizeof(float));
    const unsigned long long launchesBefore = shoalFakeCudaCallCount("cuLaunchKernel");
    if (ncclAllReduce(reinterpret_cast<void*>(buf), reinterpret_cast<void*>(buf), N, ncclFloat, ncclSum, comm, s) !=
        ncclSuccess)
      return 18;
    if (cuStreamSynchronize(s) != CUDA_SUCCESS) return 19;
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm, &async);
    if (async != ncclSuccess) {
      child.log(std::string("async: ") + ncclGetLastError(comm));
      return 20;
    }
    std::vector<float> got(N);
    cuMemcpyDtoH(got.data(), buf, N * sizeof(float));
    for (size_t i = 0; i < N; ++i)
      if (got[i] != valueOf(0, i) + valueOf(1, i)) {
        child.log("element " + std::to_string(i) + ": " + std::to_string(got[i]));
        return 21;
      }
    if (expectDirect && shoalFakeCudaCallCount("cuLaunchKernel") == launchesBefore) return 22;  // staged after all
    cuMemFree(buf);
    child.barrier();
    return ncclCommDestroy(comm) == ncclSuccess ? 0 : 23;
  });
  for (const auto& rank : run.result.ranks) {
    const std::string path = std::string(logPath) + "." + std::to_string(rank.pid);
    std::ifstream in(path);
    run.log += std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    ::unlink(path.c_str());
  }
  ::unlink(logPath);
  return run;
}

TEST_CASE("processes on two GPUs with peer access go GPU to GPU over cuda_ipc", "[cudafake][mp]") {
  const ProcessesRun run = allReduceInTwoProcesses(/*eachSeesOneGpu=*/false, /*expectDirect=*/true, {});
  INFO(run.result.report() << "\n" << run.log);
  CHECK(run.result.allPassed());
  CHECK(run.log.find("device-direct: device buffers move GPU to GPU") != std::string::npos);
  CHECK(run.log.find("via cuda_ipc") != std::string::npos);
  CHECK(run.log.find("hidden from this process") == std::string::npos);  // CUDA answered; NVML not asked
}

// CUDA_VISIBLE_DEVICES giving each process one GPU hides the peer's GPU from
// CUDA; NVML, which sees the whole machine, judges peer access, and the
// imported memory of the hidden GPU is mapped as the driver allows.
TEST_CASE("processes that each see only their own GPU go GPU to GPU when NVML reports peer access",
          "[cudafake][mp]") {
  const ProcessesRun run = allReduceInTwoProcesses(/*eachSeesOneGpu=*/true, /*expectDirect=*/true,
                                                   {{"SHOAL_NVML_LIBRARY", SHOAL_CUDAFAKE_LIB}});
  INFO(run.result.report() << "\n" << run.log);
  CHECK(run.result.allPassed());
  CHECK(run.log.find("hidden from this process (CUDA_VISIBLE_DEVICES): NVML reports peer access both ways") !=
        std::string::npos);
  CHECK(run.log.find("device-direct: device buffers move GPU to GPU") != std::string::npos);
  CHECK(run.log.find("via cuda_ipc") != std::string::npos);
}

// Processes that each see only their own GPU, in `env`, staged (the right
// sums, over shm) and said why at INFO.
void checkStagedEachOnOneGpu(std::vector<std::pair<std::string, std::string>> env, const std::string& why) {
  const ProcessesRun run = allReduceInTwoProcesses(/*eachSeesOneGpu=*/true, /*expectDirect=*/false, std::move(env));
  INFO(run.result.report() << "\n" << run.log);
  CHECK(run.result.allPassed());
  CHECK(run.log.find(why) != std::string::npos);
  CHECK(run.log.find("device buffers are staged through pinned host memory") != std::string::npos);
  CHECK(run.log.find("via cuda_ipc") == std::string::npos);
}

TEST_CASE("processes that each see only their own GPU stage, with the right sums, when NVML reports no peer access",
          "[cudafake][mp]") {
  checkStagedEachOnOneGpu({{"SHOAL_NVML_LIBRARY", SHOAL_CUDAFAKE_LIB}, {"SHOAL_FAKECUDA_NO_PEER_ACCESS", "1"}},
                          "hidden from this process (CUDA_VISIBLE_DEVICES): NVML reports no peer access");
}

TEST_CASE("processes that each see only their own GPU stage, with the right sums, when NVML cannot be loaded",
          "[cudafake][mp]") {
  checkStagedEachOnOneGpu({{"SHOAL_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1"}},
                          "no peer access assumed: NVML (/nonexistent/libnvidia-ml.so.1) did not load");
}

// Windows of ranks on two GPUs of one process: each maps the other's
// ncclMemAlloc buffer by address (its GPU was granted access), and the
// AllReduce's kernels on each GPU read the other GPU's buffer in place.
// Other device memory of another GPU (cuMemAlloc) was granted nothing: not
// mapped, the call takes the other paths, with the right sums.
TEST_CASE("windows of ranks on two GPUs of one process are read across the GPUs", "[cudafake]") {
  const std::array<ncclComm_t, 2> comms = commsOnTwoGpus();
  constexpr size_t N = 5000;
  constexpr size_t kBytes = 2 * N * sizeof(float);
  struct Case {
    int flags;
    bool ncclMemory;  // ncclMemAlloc, else cuMemAlloc
  };
  for (const Case c : {Case{NCCL_WIN_DEFAULT, true}, Case{NCCL_WIN_COLL_SYMMETRIC, true}, Case{NCCL_WIN_DEFAULT, false}}) {
    std::array<std::string, 2> wrong;
    std::array<bool, 2> mapped{};
    const unsigned long long launchesBefore = shoalFakeCudaCallCount("cuLaunchKernel");
    auto rank = [&](int r) {
      auto fail = [&](const std::string& what) {
        if (wrong[r].empty()) wrong[r] = what + ": " + ncclGetLastError(comms[r]);
      };
      CUcontext ctx = contextOf(r);
      if (ctx == nullptr || cuCtxSetCurrent(ctx) != CUDA_SUCCESS) return fail("context");
      CUstream s = nullptr;
      if (cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) return fail("stream");
      void* pool = nullptr;
      CUdeviceptr legacy = 0;
      if (c.ncclMemory ? ncclMemAlloc(&pool, kBytes) != ncclSuccess : cuMemAlloc(&legacy, kBytes) != CUDA_SUCCESS)
        return fail("allocation");
      if (!c.ncclMemory) pool = reinterpret_cast<void*>(legacy);
      auto* send = static_cast<float*>(pool);
      float* recv = send + N;
      std::vector<float> values(N);
      for (size_t i = 0; i < N; ++i) values[i] = valueOf(r, i);
      cuMemcpyHtoD(reinterpret_cast<CUdeviceptr>(send), values.data(), N * sizeof(float));
      ncclWindow_t win = nullptr;
      if (ncclCommWindowRegister(comms[r], pool, kBytes, &win, c.flags) != ncclSuccess) return fail("register");
      mapped[r] = reinterpret_cast<shoal::Window*>(win)->mappedEverywhere();
      if (ncclAllReduce(send, recv, N, ncclFloat, ncclSum, comms[r], s) != ncclSuccess) return fail("AllReduce");
      if (cuStreamSynchronize(s) != CUDA_SUCCESS) return fail("synchronize");
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comms[r], &async);
      if (async != ncclSuccess) return fail("async");
      std::vector<float> got(N);
      cuMemcpyDtoH(got.data(), reinterpret_cast<CUdeviceptr>(recv), N * sizeof(float));
      for (size_t i = 0; i < N; ++i)
        if (got[i] != valueOf(0, i) + valueOf(1, i)) return fail("element " + std::to_string(i));
      if (ncclCommWindowDeregister(comms[r], win) != ncclSuccess) return fail("deregister");
      // Both ranks are done reading before either frees (host memory: no kernel).
      float fence = 1.0f;
      if (ncclAllReduce(&fence, &fence, 1, ncclFloat, ncclSum, comms[r], s) != ncclSuccess) return fail("fence");
      cuStreamSynchronize(s);
      if (c.ncclMemory) ncclMemFree(pool);
      else cuMemFree(legacy);
      cuStreamDestroy(s);
    };
    std::thread other(rank, 1);
    rank(0);
    other.join();
    INFO("flags " << c.flags << (c.ncclMemory ? ", ncclMemAlloc: " : ", cuMemAlloc: ") << wrong[0] << " / "
                  << wrong[1]);
    CHECK(wrong[0].empty());
    CHECK(wrong[1].empty());
    CHECK(mapped[0] == c.ncclMemory);
    CHECK(mapped[1] == c.ncclMemory);
    // One kernel per rank either way: reading the other's window, or
    // reducing what a GPU copy brought.
    CHECK(shoalFakeCudaCallCount("cuLaunchKernel") - launchesBefore == 2u);
  }
  for (ncclComm_t comm : comms) NCCL_OK(ncclCommDestroy(comm));
}

// A device plan (a Reduce with ncclAvg: its chain scales at the start, so no
// rank takes a stream plan for it) on one stream and a stream plan (an
// AllReduce) on another: nothing orders the two across the streams, so they
// must not share device scratch (they did: both results came out wrong).
TEST_CASE("a device plan and a stream plan on two streams do not share scratch", "[cudafake]") {
  REQUIRE(kDriverNamed);
  REQUIRE(kTwoDevices == 0);
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  const int n = 2;
  const size_t N = 4 << 20;
  ncclUniqueId id;
  NCCL_OK(ncclGetUniqueId(&id));
  std::vector<std::string> failures(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      std::string& bad = failures[r];
      CUcontext ctx = contextOf(r);
      CUstream a = nullptr, b = nullptr;
      ncclComm_t comm = nullptr;
      if (ctx == nullptr || cuCtxSetCurrent(ctx) != CUDA_SUCCESS ||
          cuStreamCreate(&a, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS ||
          cuStreamCreate(&b, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
        bad = "set-up";
        return;
      }
      if (ncclCommInitRank(&comm, n, id, r) != ncclSuccess) {
        bad = std::string("init: ") + ncclGetLastError(nullptr);
        return;
      }
      auto filled = [&](float v) {
        CUdeviceptr p = 0;
        std::vector<float> h(N, v);
        if (cuMemAlloc(&p, N * sizeof(float)) != CUDA_SUCCESS ||
            cuMemcpyHtoD(p, h.data(), N * sizeof(float)) != CUDA_SUCCESS)
          bad = "buffers";
        return p;
      };
      for (int it = 0; it < 3 && bad.empty(); ++it) {
        CUdeviceptr x = filled(2.0f * (r + 1)), reduced = filled(-1), y = filled(100.0f * (r + 1));
        if (ncclReduce(reinterpret_cast<void*>(x), reinterpret_cast<void*>(reduced), N, ncclFloat, ncclAvg, 0, comm,
                       a) != ncclSuccess ||
            ncclAllReduce(reinterpret_cast<void*>(y), reinterpret_cast<void*>(y), N, ncclFloat, ncclSum, comm, b) !=
                ncclSuccess)
          bad = std::string("calls: ") + ncclGetLastError(comm);
        cuStreamSynchronize(a);
        cuStreamSynchronize(b);
        std::vector<float> sum(N), avg(N);
        cuMemcpyDtoH(sum.data(), y, N * sizeof(float));
        if (r == 0) cuMemcpyDtoH(avg.data(), reduced, N * sizeof(float));
        for (size_t i = 0; i < N && bad.empty(); ++i) {
          if (sum[i] != 300.0f) bad = "AllReduce element " + std::to_string(i) + " is " + std::to_string(sum[i]);
          if (r == 0 && avg[i] != 3.0f) bad = "Reduce element " + std::to_string(i) + " is " + std::to_string(avg[i]);
        }
        cuMemFree(x);
        cuMemFree(reduced);
        cuMemFree(y);
      }
      ncclCommDestroy(comm);
      cuStreamDestroy(a);
      cuStreamDestroy(b);
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r << ": " << failures[r]);
    CHECK(failures[r].empty());
  }
}
