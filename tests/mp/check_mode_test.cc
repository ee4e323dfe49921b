// SHOAL_CHECK_MODE=1 (label "mp"): forked ranks over tcp that call different
// things fail together with ncclInvalidUsage naming both calls, within 5 s,
// for each field of a signature; calls that agree run as before, and the
// communicator keeps working after a refused call.
#include <nccl.h>

#include <catch2/catch.hpp>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "support/mp_harness.h"

using namespace shoal::testing;

namespace {

// Runs `call` on 2 ranks with the check on; rank r's call is call(r, comm,
// send, recv). Expects every rank to get ncclInvalidUsage naming both
// `mine` and `theirs` texts (rank 0 sees want[0] and want[1], rank 1 the
// same), then an agreeing AllReduce to succeed.
void expectMismatch(const std::function<ncclResult_t(int, ncclComm_t, float*, float*)>& call,
                    const std::vector<std::string>& both) {
  MpConfig cfg;
  cfg.nranks = 2;
  cfg.env = {{"SHOAL_CHECK_MODE", "1"}};
  MpResult res = runForked(cfg, [&](MpChild& child) -> int {
    ncclUniqueId id;
    if (!child.uniqueId(&id)) return 10;
    ncclComm_t comm = nullptr;
    if (ncclCommInitRank(&comm, 2, id, child.rank()) != ncclSuccess) return 11;
    std::vector<float> send(64, static_cast<float>(child.rank() + 1)), recv(128, 0.0f);
    auto t0 = std::chrono::steady_clock::now();
    ncclResult_t rc = call(child.rank(), comm, send.data(), recv.data());
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::string why = ncclGetLastError(comm);
    child.log(std::string(ncclGetErrorString(rc)) + " after " + std::to_string(ms) + " ms: " + why);
    if (rc != ncclInvalidUsage) return 1;
    if (ms > 5000) return 2;
    for (const std::string& text : both)
      if (why.find(text) == std::string::npos) return 3;
    // The communicator still works.
    if (ncclAllReduce(send.data(), recv.data(), 64, ncclFloat, ncclSum, comm, nullptr) != ncclSuccess) return 4;
    if (recv[63] != 3.0f) return 5;
    ncclCommDestroy(comm);
    child.barrier();
    return 0;
  });
  INFO(res.report());
  REQUIRE_FALSE(res.timedOut);
  CHECK(res.allPassed());
}

}  // namespace

TEST_CASE("check mode: two ranks that each pass themselves as the Broadcast root both fail", "[mp]") {
  expectMismatch([](int r, ncclComm_t c, float* s, float* d) { return ncclBroadcast(s, d, 64, ncclFloat, r, c, nullptr); },
                 {"Broadcast(count 64, float, root 0)", "Broadcast(count 64, float, root 1)"});
}

TEST_CASE("check mode: a count mismatch fails both ranks", "[mp]") {
  expectMismatch([](int r, ncclComm_t c, float* s, float* d) {
    return ncclAllReduce(s, d, r == 0 ? 64 : 32, ncclFloat, ncclSum, c, nullptr);
  }, {"AllReduce(count 64, float, sum)", "AllReduce(count 32, float, sum)"});
}

TEST_CASE("check mode: a data type mismatch fails both ranks", "[mp]") {
  expectMismatch([](int r, ncclComm_t c, float* s, float* d) {
    return ncclAllReduce(s, d, 64, r == 0 ? ncclFloat : ncclInt32, ncclSum, c, nullptr);
  }, {"AllReduce(count 64, float, sum)", "AllReduce(count 64, int32, sum)"});
}

TEST_CASE("check mode: an operator mismatch fails both ranks", "[mp]") {
  expectMismatch([](int r, ncclComm_t c, float* s, float* d) {
    return ncclAllReduce(s, d, 64, ncclFloat, r == 0 ? ncclSum : ncclMax, c, nullptr);
  }, {"AllReduce(count 64, float, sum)", "AllReduce(count 64, float, max)"});
}

TEST_CASE("check mode: different collectives fail both ranks", "[mp]") {
  expectMismatch([](int r, ncclComm_t c, float* s, float* d) {
    return r == 0 ? ncclAllReduce(s, d, 64, ncclFloat, ncclSum, c, nullptr)
                  : ncclAllGather(s, d, 64, ncclFloat, c, nullptr);
  }, {"AllReduce(count 64, float, sum)", "AllGather(count 64, float)"});
}

TEST_CASE("check mode: a Send and a Recv of different counts fail both ranks", "[mp]") {
  expectMismatch([](int r, ncclComm_t c, float* s, float* d) {
    return r == 0 ? ncclSend(s, 64, ncclFloat, 1, c, nullptr) : ncclRecv(d, 48, ncclFloat, 0, c, nullptr);
  }, {"Send(count 64, float, to rank 1)", "Recv(count 48, float, from rank 0)"});
}

TEST_CASE("check mode: calls that agree run as without it", "[mp]") {
  MpConfig cfg;
  cfg.nranks = 3;
  cfg.env = {{"SHOAL_CHECK_MODE", "1"}};
  MpResult res = runForked(cfg, [&](MpChild& child) -> int {
    ncclUniqueId id;
    if (!child.uniqueId(&id)) return 10;
    ncclComm_t comm = nullptr;
    const int n = child.nranks(), r = child.rank();
    if (ncclCommInitRank(&comm, n, id, r) != ncclSuccess) return 11;
    std::vector<float> send(64, static_cast<float>(r + 1)), recv(64 * n, 0.0f), fromPrev(64), fromNext(64);
    for (int i = 0; i < 20; ++i) {
      if (ncclAllReduce(send.data(), recv.data(), 64, ncclFloat, ncclSum, comm, nullptr) != ncclSuccess) return 1;
      if (recv[0] != 6.0f) return 2;
      if (ncclBroadcast(send.data(), recv.data(), 64, ncclFloat, 2, comm, nullptr) != ncclSuccess) return 3;
      if (recv[0] != 3.0f) return 4;
      // Both directions in one group, with a collective: the records of each
      // round pair up in call order.
      ncclGroupStart();
      ncclSend(send.data(), 64, ncclFloat, (r + 1) % n, comm, nullptr);
      ncclRecv(fromPrev.data(), 64, ncclFloat, (r + n - 1) % n, comm, nullptr);
      ncclSend(send.data(), 32, ncclFloat, (r + n - 1) % n, comm, nullptr);
      ncclRecv(fromNext.data(), 32, ncclFloat, (r + 1) % n, comm, nullptr);
      ncclAllGather(send.data(), recv.data(), 64, ncclFloat, comm, nullptr);
      if (ncclGroupEnd() != ncclSuccess) {
        child.log(ncclGetLastError(comm));
        return 5;
      }
      if (fromPrev[0] != static_cast<float>((r + n - 1) % n + 1) || fromNext[31] != static_cast<float>((r + 1) % n + 1)) return 6;
      if (recv[64 * 2] != 3.0f) return 7;
    }
    ncclCommDestroy(comm);
    child.barrier();
    return 0;
  });
  INFO(res.report());
  REQUIRE_FALSE(res.timedOut);
  CHECK(res.allPassed());
}
