// Environment settings through the public API, each rank a forked process
// (label "mp"): NCCL_COMM_BLOCKING=0 makes every communicator nonblocking,
// and a device-residence PreMulSum scalar is read when each operation
// starts, so changing it after the operator was created takes effect.
#include <nccl.h>

#include <catch2/catch.hpp>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "support/mp_harness.h"

using namespace shoal::testing;

namespace {

// Polls ncclCommGetAsyncError until it leaves ncclInProgress (30 s at most).
ncclResult_t settle(ncclComm_t comm) {
  auto t0 = std::chrono::steady_clock::now();
  ncclResult_t state = ncclInProgress;
  while (state == ncclInProgress && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30)) {
    if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) return ncclInternalError;
    if (state == ncclInProgress) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return state;
}

}  // namespace

TEST_CASE("NCCL_COMM_BLOCKING=0 makes init and collectives nonblocking", "[mp]") {
  MpConfig cfg;
  cfg.nranks = 2;
  cfg.env = {{"NCCL_COMM_BLOCKING", "0"}};
  MpResult res = runForked(cfg, [&](MpChild& child) -> int {
    ncclUniqueId id;
    if (!child.uniqueId(&id)) return 10;
    ncclComm_t comm = nullptr;
    if (child.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    // Blocking config (the default), overridden by the environment.
    ncclResult_t rc = ncclCommInitRank(&comm, 2, id, child.rank());
    child.log(std::string("init returned ") + ncclGetErrorString(rc));
    // Rank 1 initializes 300 ms after rank 0: rank 0's init cannot be
    // complete when its call returns, so it must say ncclInProgress.
    if (child.rank() == 0 && rc != ncclInProgress) return 1;
    if (rc != ncclInProgress && rc != ncclSuccess) return 2;
    if (settle(comm) != ncclSuccess) return 3;
    std::vector<float> send(1 << 16, static_cast<float>(child.rank() + 1)), recv(1 << 16, 0.0f);
    if (child.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    rc = ncclAllReduce(send.data(), recv.data(), send.size(), ncclFloat, ncclSum, comm, nullptr);
    child.log(std::string("AllReduce returned ") + ncclGetErrorString(rc));
    if (child.rank() == 0 && rc != ncclInProgress) return 4;  // its peer has not called yet
    if (settle(comm) != ncclSuccess) return 5;
    if (recv.back() != 3.0f) return 6;
    ncclCommDestroy(comm);
    child.barrier();
    return 0;
  });
  INFO(res.report());
  REQUIRE_FALSE(res.timedOut);
  CHECK(res.allPassed());
}

TEST_CASE("a device-residence PreMulSum scalar changed after the operator was made is the one used", "[mp]") {
  MpConfig cfg;
  cfg.nranks = 2;
  MpResult res = runForked(cfg, [&](MpChild& child) -> int {
    ncclUniqueId id;
    if (!child.uniqueId(&id)) return 10;
    ncclComm_t comm = nullptr;
    if (ncclCommInitRank(&comm, 2, id, child.rank()) != ncclSuccess) return 11;
    // Host memory here (no GPU): "device residence" means read at each
    // operation's start, as NCCL reads a device scalar in stream order.
    float scalar = 2.0f;
    ncclRedOp_t op;
    if (ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat, ncclScalarDevice, comm) != ncclSuccess) return 1;
    std::vector<float> send(1000, static_cast<float>(child.rank() + 1)), recv(1000, 0.0f);
    if (ncclAllReduce(send.data(), recv.data(), 1000, ncclFloat, op, comm, nullptr) != ncclSuccess) return 2;
    if (recv[999] != 2.0f * 3.0f) return 3;
    scalar = 5.0f;  // changed after creation: the next call uses it
    if (ncclAllReduce(send.data(), recv.data(), 1000, ncclFloat, op, comm, nullptr) != ncclSuccess) return 4;
    if (recv[0] != 5.0f * 3.0f) {
      child.log("second call used " + std::to_string(recv[0] / 3.0f));
      return 5;
    }
    ncclRedOpDestroy(op, comm);
    ncclCommDestroy(comm);
    child.barrier();
    return 0;
  });
  INFO(res.report());
  REQUIRE_FALSE(res.timedOut);
  CHECK(res.allPassed());
}
