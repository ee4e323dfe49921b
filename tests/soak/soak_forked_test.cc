// Soak tests, ranks as forked processes (ctest label "soak").
//
// Each case runs one mode (soak.h) with one rank per process (runForked),
// over shared memory at 2 ranks or tcp on 127.0.0.1 at 3 ranks (and two
// churn cases over libfabric at 2 ranks). Every rank
// samples its own process's threads, fds, /dev/shm entries named after its
// pid, RSS and heap, prints them, and reports a leak in its exit code
// (README.md). This process never calls the library: it forks and collects
// (tests/support/mp_harness.h).
//
// The churn modes have two cases, as in soak_threads_test.cc: resources and
// "keeps the heap flat" (rank 0 hosts the bootstrap root, which must drop
// each communicator's keys and id once its ranks are gone; README.md).
#include <catch2/catch.hpp>
#include <cstdio>
#include <string>

#include "soak/soak.h"

using namespace shoal::soak;

namespace {

// The ranks exit with runModesOnce's code; which bits fail this case.
void runCase(Mode m, const std::string& transport, int nranks, int mask) {
  std::string report;
  bool ok = runForkedRanks(
      nranks, transport, 120000,
      [m, mask](RankLink& link) {
        int code = runModesOnce(link, {m}, Slack{});
        return code == 1 || code == 3 ? code : code & mask;
      },
      &report);
  std::printf("%s", report.c_str());
  std::fflush(stdout);
  INFO(report);
  INFO(
      "exit code 1: library error or wrong data; 2: threads/fds/shm/RSS did not come back; "
      "4: the heap grew in every third of the run (figures on stdout)");
  CHECK(ok);
}

constexpr int kAll = 2 | 4;
constexpr int kResources = 2;
constexpr int kHeap = 4;

}  // namespace

TEST_CASE("soak shm blocking collectives", "[soak][shm]") { runCase(Mode::kBlocking, "shm", 2, kAll); }
TEST_CASE("soak shm nonblocking communicator", "[soak][shm]") { runCase(Mode::kNonblocking, "shm", 2, kAll); }
TEST_CASE("soak shm host streams", "[soak][shm]") { runCase(Mode::kHostStream, "shm", 2, kAll); }
TEST_CASE("soak shm grouped ops", "[soak][shm]") { runCase(Mode::kGrouped, "shm", 2, kAll); }
TEST_CASE("soak shm split and destroy churn", "[soak][shm]") { runCase(Mode::kSplit, "shm", 2, kResources); }
TEST_CASE("soak shm init and destroy churn", "[soak][shm]") { runCase(Mode::kInitDestroy, "shm", 2, kResources); }
TEST_CASE("soak shm abort mid-operation churn", "[soak][shm]") { runCase(Mode::kAbort, "shm", 2, kResources); }

TEST_CASE("soak tcp blocking collectives", "[soak][tcp]") { runCase(Mode::kBlocking, "tcp", 3, kAll); }
TEST_CASE("soak tcp nonblocking communicator", "[soak][tcp]") { runCase(Mode::kNonblocking, "tcp", 3, kAll); }
TEST_CASE("soak tcp host streams", "[soak][tcp]") { runCase(Mode::kHostStream, "tcp", 3, kAll); }
TEST_CASE("soak tcp grouped ops", "[soak][tcp]") { runCase(Mode::kGrouped, "tcp", 3, kAll); }
TEST_CASE("soak tcp split and destroy churn", "[soak][tcp]") { runCase(Mode::kSplit, "tcp", 3, kResources); }
TEST_CASE("soak tcp init and destroy churn", "[soak][tcp]") { runCase(Mode::kInitDestroy, "tcp", 3, kResources); }
TEST_CASE("soak tcp abort mid-operation churn", "[soak][tcp]") { runCase(Mode::kAbort, "tcp", 3, kResources); }

TEST_CASE("soak shm split and destroy churn keeps the heap flat", "[soak][shm][heap]") {
  runCase(Mode::kSplit, "shm", 2, kHeap);
}
TEST_CASE("soak shm init and destroy churn keeps the heap flat", "[soak][shm][heap]") {
  runCase(Mode::kInitDestroy, "shm", 2, kHeap);
}
TEST_CASE("soak shm abort mid-operation churn keeps the heap flat", "[soak][shm][heap]") {
  runCase(Mode::kAbort, "shm", 2, kHeap);
}
TEST_CASE("soak tcp split and destroy churn keeps the heap flat", "[soak][tcp][heap]") {
  runCase(Mode::kSplit, "tcp", 3, kHeap);
}
TEST_CASE("soak tcp init and destroy churn keeps the heap flat", "[soak][tcp][heap]") {
  runCase(Mode::kInitDestroy, "tcp", 3, kHeap);
}
TEST_CASE("soak tcp abort mid-operation churn keeps the heap flat", "[soak][tcp][heap]") {
  runCase(Mode::kAbort, "tcp", 3, kHeap);
}
// libfabric (its default provider here, tcp;ofi_rxm): a message nobody
// receives stays in the provider for good, so each communicator's closing
// messages must all be taken.
TEST_CASE("soak ofi init and destroy churn keeps the heap flat", "[soak][ofi][heap]") {
  runCase(Mode::kInitDestroy, "ofi", 2, kHeap);
}
// An abort leaves the peer's messages on their way to connections that no
// longer receive them: the rail must drain them (transports/ofi/README.md).
TEST_CASE("soak ofi abort mid-operation churn keeps the heap flat", "[soak][ofi][heap]") {
  runCase(Mode::kAbort, "ofi", 2, kHeap);
}
