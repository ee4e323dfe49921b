// Mismatched calls without SHOAL_CHECK_MODE (label "mp"): forked ranks over
// tcp and over shm that call different collectives, counts, data types or
// operators find out from the tags their messages carry. Every rank that
// receives from a disagreeing peer must return ncclInvalidUsage from the
// public API, naming both operations, long before the no-progress deadline —
// never success with garbage, never a hang. A rank whose call only sends
// cannot know at once (docs/nccl-compat.md, "Errors"); its next call fails.
#include <nccl.h>

#include <catch2/catch.hpp>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "support/mp_harness.h"

using namespace shoal::testing;

namespace {

using Call = std::function<ncclResult_t(int rank, ncclComm_t, float* send, float* recv)>;

// Two forked ranks over `transport` each make their call once; both must get
// ncclInvalidUsage within 5 s (the no-progress deadline is set to 60 s, so a
// rank that noticed nothing and waited would exceed it) with a last error
// that contains every text in `named`. After the failure the communicator is
// broken: ncclCommGetAsyncError reports the error and the ranks abort it.
// `onlySends`, if set, is a rank whose call receives nothing: its call
// succeeds and its next call (an AllReduce) must fail within 5 s instead.
void expectBothFail(const char* transport, const Call& call, const std::vector<std::string>& named,
                    int onlySends = -1) {
  MpConfig cfg;
  cfg.nranks = 2;
  cfg.env = {{"SHOAL_TRANSPORT", transport}, {"SHOAL_PROGRESS_TIMEOUT_MS", "60000"}};
  MpResult res = runForked(cfg, [&](MpChild& child) -> int {
    ncclUniqueId id;
    if (!child.uniqueId(&id)) return 10;
    ncclComm_t comm = nullptr;
    if (ncclCommInitRank(&comm, 2, id, child.rank()) != ncclSuccess) return 11;
    // Large enough that every algorithm moves data between the two ranks.
    std::vector<float> send(4096, static_cast<float>(child.rank() + 1)), recv(8192, 0.0f);
    auto t0 = std::chrono::steady_clock::now();
    ncclResult_t rc = call(child.rank(), comm, send.data(), recv.data());
    if (child.rank() == onlySends) {
      if (rc != ncclSuccess) return 6;
      rc = ncclAllReduce(send.data(), recv.data(), 4096, ncclFloat, ncclSum, comm, nullptr);
      double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      child.log(std::string("next call: ") + ncclGetErrorString(rc) + " after " + std::to_string(ms) +
                " ms: " + ncclGetLastError(comm));
      if (rc == ncclSuccess || rc == ncclInProgress) return 7;
      if (ms > 5000) return 8;
      (void)ncclCommAbort(comm);
      child.barrier();
      return 0;
    }
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::string why = ncclGetLastError(comm);
    child.log(std::string(ncclGetErrorString(rc)) + " after " + std::to_string(ms) + " ms: " + why);
    if (rc != ncclInvalidUsage) return 1;
    if (ms > 5000) return 2;
    for (const std::string& text : named)
      if (why.find(text) == std::string::npos) return 3;
    ncclResult_t async = ncclSuccess;
    if (ncclCommGetAsyncError(comm, &async) != ncclSuccess || async == ncclSuccess) return 4;
    if (ncclCommAbort(comm) != ncclSuccess) return 5;
    child.barrier();
    return 0;
  });
  INFO(transport << ": " << res.report());
  REQUIRE_FALSE(res.timedOut);
  CHECK(res.allPassed());
}

void expectBothFailOverEachTransport(const Call& call, const std::vector<std::string>& named,
                                     int onlySends = -1) {
  for (const char* transport : {"tcp", "shm"}) expectBothFail(transport, call, named, onlySends);
}

}  // namespace

TEST_CASE("without check mode: an AllReduce against an AllGather fails both ranks", "[mp]") {
  expectBothFailOverEachTransport([](int r, ncclComm_t c, float* s, float* d) {
    return r == 0 ? ncclAllReduce(s, d, 4096, ncclFloat, ncclSum, c, nullptr)
                  : ncclAllGather(s, d, 4096, ncclFloat, c, nullptr);
  }, {"AllReduce", "AllGather"});
}

TEST_CASE("without check mode: AllReduce counts that differ fail both ranks", "[mp]") {
  expectBothFailOverEachTransport([](int r, ncclComm_t c, float* s, float* d) {
    return ncclAllReduce(s, d, r == 0 ? 4096 : 1024, ncclFloat, ncclSum, c, nullptr);
  }, {"AllReduce"});
}

TEST_CASE("without check mode: AllReduce data types that differ fail both ranks", "[mp]") {
  expectBothFailOverEachTransport([](int r, ncclComm_t c, float* s, float* d) {
    return ncclAllReduce(s, d, 4096, r == 0 ? ncclFloat : ncclInt32, ncclSum, c, nullptr);
  }, {"float", "int32"});
}

TEST_CASE("without check mode: a ReduceScatter against a Broadcast root fails it, the root's next call fails",
          "[mp]") {
  expectBothFailOverEachTransport([](int r, ncclComm_t c, float* s, float* d) {
    return r == 0 ? ncclReduceScatter(s, d, 2048, ncclFloat, ncclSum, c, nullptr)
                  : ncclBroadcast(s, d, 4096, ncclFloat, 1, c, nullptr);
  }, {"ReduceScatter", "Broadcast"}, /*onlySends=*/1);
}
