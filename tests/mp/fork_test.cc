// A process that has used Shoal, then forks (launchers and test harnesses
// that touch NCCL before they start their workers): the child is another
// process to Shoal (its own process id, so shm or tcp between it and its
// parent, never the in-process loopback), starts a bootstrap root of its own
// for the ids it makes (the parent's root has no thread in the child), and
// transports of its own (its own shm address and tcp listener).
#include <nccl.h>

#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "mp/mp_checks.h"
#include "support/mp_harness.h"

using namespace shoal::testing;

namespace {

// Runs `body` in a forked child; its exit status (-1: it did not exit).
int inForkedChild(const std::function<int()>& body) {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(body());
  int status = 0;
  if (pid < 0 || ::waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

// AllReduces of (rank + 1) over `nranks`, 1 element and 4 Mi (large
// messages over shm read the peer's memory through its pid): true when
// every element is the sum.
bool sumsRanks(ncclComm_t comm, int rank, int nranks) {
  const float want = static_cast<float>(nranks * (nranks + 1) / 2);
  for (size_t count : {size_t{1}, size_t{4} << 20}) {
    std::vector<float> values(count, static_cast<float>(rank + 1)), sums(count, 0.f);
    if (ncclAllReduce(values.data(), sums.data(), count, ncclFloat, ncclSum, comm, nullptr) != ncclSuccess)
      return false;
    for (float s : sums)
      if (s != want) return false;
  }
  return true;
}

MpConfig forkConfig() {
  MpConfig cfg;
  cfg.nranks = 1;
  cfg.hardLimitMs = 60000;
  // The transport a pair of processes gets by default; a broken pair fails
  // in seconds rather than minutes.
  cfg.env = {{"SHOAL_TRANSPORT", ""}, {"SHOAL_PROGRESS_TIMEOUT_MS", "10000"}, {"SHOAL_INIT_TIMEOUT_MS", "20000"}};
  return cfg;
}

// The parent has made (and destroyed) a communicator before it forks.
int useShoalOnce(MpChild& c) {
  ncclUniqueId id;
  CHILD_NCCL(c, ncclGetUniqueId(&id));
  ncclComm_t one = nullptr;
  CHILD_NCCL(c, ncclCommInitRank(&one, 1, id, 0));
  CHILD_CHECK(c, sumsRanks(one, 0, 1), "a one-rank AllReduce failed");
  CHILD_NCCL(c, ncclCommDestroy(one));
  return 0;
}

}  // namespace

TEST_CASE("after a fork, the parent and its child are two processes to Shoal", "[mp][fork]") {
  MpResult res = runForked(forkConfig(), [](MpChild& c) -> int {
    if (int rc = useShoalOnce(c); rc != 0) return rc;
    ncclUniqueId id;
    CHILD_NCCL(c, ncclGetUniqueId(&id));
    // Rank 1 in the forked child, rank 0 here.
    const pid_t pid = ::fork();
    if (pid == 0) {
      ncclComm_t comm = nullptr;
      if (ncclCommInitRank(&comm, 2, id, 1) != ncclSuccess) ::_exit(2);
      const bool ok = sumsRanks(comm, 1, 2);
      (void)ncclCommDestroy(comm);
      ::_exit(ok ? 0 : 3);
    }
    CHILD_CHECK(c, pid > 0, "fork failed");
    ncclComm_t comm = nullptr;
    const ncclResult_t init = ncclCommInitRank(&comm, 2, id, 0);
    const bool ok = init == ncclSuccess && sumsRanks(comm, 0, 2);
    const std::string why = ncclGetLastError(comm);
    if (comm != nullptr) (void)ncclCommDestroy(comm);
    int status = 0;
    CHILD_CHECK(c, ::waitpid(pid, &status, 0) == pid, "waitpid failed");
    CHILD_CHECK(c, ok, "rank 0 in the parent: " + why);
    CHILD_CHECK(c, WIFEXITED(status) && WEXITSTATUS(status) == 0, "rank 1 in the forked child failed");
    return 0;
  });
  INFO(res.report());
  REQUIRE_FALSE(res.timedOut);
  REQUIRE(res.allPassed());
}

TEST_CASE("an id made in a forked child is served by a root of the child's", "[mp][fork]") {
  MpResult res = runForked(forkConfig(), [](MpChild& c) -> int {
    if (int rc = useShoalOnce(c); rc != 0) return rc;
    const int child = inForkedChild([] {
      ncclUniqueId id;
      if (ncclGetUniqueId(&id) != ncclSuccess) return 2;
      bool ok[2] = {false, false};
      std::vector<std::thread> ranks;
      for (int r = 0; r < 2; ++r)
        ranks.emplace_back([&, r] {
          ncclComm_t comm = nullptr;
          if (ncclCommInitRank(&comm, 2, id, r) != ncclSuccess) return;
          ok[r] = sumsRanks(comm, r, 2);
          (void)ncclCommDestroy(comm);
        });
      for (auto& t : ranks) t.join();
      return ok[0] && ok[1] ? 0 : 3;
    });
    CHILD_CHECK(c, child == 0, "the forked child's communicator failed: " + std::to_string(child));
    // The parent's own root still serves the parent.
    return useShoalOnce(c);
  });
  INFO(res.report());
  REQUIRE_FALSE(res.timedOut);
  REQUIRE(res.allPassed());
}

TEST_CASE("two children of a process that used Shoal make a communicator of their own, over shm and tcp",
          "[mp][fork]") {
  for (const char* transport : {"", "tcp"}) {
    INFO(std::string("SHOAL_TRANSPORT=") + transport);
    MpConfig cfg = forkConfig();
    cfg.env[0].second = transport;
    MpResult res = runForked(cfg, [](MpChild& c) -> int {
      if (int rc = useShoalOnce(c); rc != 0) return rc;
      ncclUniqueId id;
      CHILD_NCCL(c, ncclGetUniqueId(&id));
      pid_t kids[2];
      for (int r = 0; r < 2; ++r) {
        kids[r] = ::fork();
        if (kids[r] == 0) {
          ncclComm_t comm = nullptr;
          if (ncclCommInitRank(&comm, 2, id, r) != ncclSuccess) ::_exit(2);
          const bool ok = sumsRanks(comm, r, 2);
          (void)ncclCommDestroy(comm);
          ::_exit(ok ? 0 : 3);
        }
        CHILD_CHECK(c, kids[r] > 0, "fork failed");
      }
      for (int r = 0; r < 2; ++r) {
        int status = 0;
        CHILD_CHECK(c, ::waitpid(kids[r], &status, 0) == kids[r], "waitpid failed");
        CHILD_CHECK(c, WIFEXITED(status) && WEXITSTATUS(status) == 0,
                    "forked rank " + std::to_string(r) + " failed: " + std::to_string(WEXITSTATUS(status)));
      }
      return 0;
    });
    INFO(res.report());
    REQUIRE_FALSE(res.timedOut);
    REQUIRE(res.allPassed());
  }
}

// Python's multiprocessing workers, a subprocess whose exec failed, a
// script's own fork: a child of a process with a live communicator that
// never uses it and ends through exit(), running the atexit handlers and
// static destructors it inherited. Nothing of the parent's may go with it
// (no bye on an inherited socket, no segment unlinked, no will written):
// the parent's idle checks stay quiet and its communicator works on.
TEST_CASE("a child forked while a communicator is live leaves it working when it exits through exit()", "[mp][fork]") {
  std::vector<std::string> transports = {"shm", "tcp"};
#if SHOAL_TEST_OFI
  transports.push_back("ofi");
#endif
  for (const std::string& transport : transports) {
    INFO("SHOAL_TRANSPORT=" << transport);
    MpConfig cfg = forkConfig();
    cfg.nranks = 2;
    cfg.env = {{"SHOAL_TRANSPORT", transport},     {"SHOAL_PROGRESS_TIMEOUT_MS", "10000"},
               {"SHOAL_INIT_TIMEOUT_MS", "20000"}, {"SHOAL_IDLE_CHECK_MS", "500"},
               {"FI_PROVIDER", "tcp;ofi_rxm"},     {"FI_TCP_IFACE", "lo"}};
    MpResult res = runForked(cfg, [](MpChild& c) -> int {
      ncclUniqueId id;
      CHILD_CHECK(c, c.uniqueId(&id), "no id");
      ncclComm_t comm = nullptr;
      CHILD_NCCL(c, ncclCommInitRank(&comm, 2, id, c.rank()));
      CHILD_CHECK(c, sumsRanks(comm, c.rank(), 2), "an AllReduce before the fork failed");
      if (c.rank() == 0) {  // the process that also serves the bootstrap root
        const pid_t pid = ::fork();
        if (pid == 0) std::exit(0);
        int status = 0;
        CHILD_CHECK(c, ::waitpid(pid, &status, 0) == pid, "waitpid failed");
        CHILD_CHECK(c, WIFEXITED(status) && WEXITSTATUS(status) == 0, "the forked child did not exit cleanly");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // three idle checks
      ncclResult_t state = ncclInternalError;
      CHILD_NCCL(c, ncclCommGetAsyncError(comm, &state));
      CHILD_CHECK(c, state == ncclSuccess,
                  std::string("the communicator failed while idle: ") + ncclGetLastError(comm));
      CHILD_CHECK(c, sumsRanks(comm, c.rank(), 2),
                  std::string("an AllReduce after the child's exit failed: ") + ncclGetLastError(comm));
      CHILD_NCCL(c, ncclCommDestroy(comm));
      return 0;
    });
    INFO(res.report());
    REQUIRE_FALSE(res.timedOut);
    CHECK(res.allPassed());
  }
}
