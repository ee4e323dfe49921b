// Elastic communicators through forked ranks (label "mp"): ncclCommShrink
// around a rank SIGKILLed mid-AllReduce (over tcp and shm), ncclCommGrow with
// new processes, ncclCommRevoke on blocking and nonblocking communicators,
// argument errors and mismatched exclude lists, and shrink/grow cycles that
// must not leak threads, file descriptors or /dev/shm entries.
// docs/nccl-compat.md, "Elastic communicators".
//
// The grow id reaches the new processes through a file in a directory the
// test makes before forking (the harness hands out only the first id).
#include <nccl.h>

#include <dirent.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "mp/mp_checks.h"
#include "support/mp_harness.h"

using namespace shoal::testing;

namespace {

// A rank's death to the first correct AllReduce of the shrunk communicator,
// with default settings.
constexpr double kRecoveryBoundMs = 10000;

std::string testDir() {
  const char* d = ::getenv("SHOAL_ELASTIC_DIR");
  return d ? d : "";
}

std::string makeTestDir() {
  char tmpl[] = "/tmp/shoal-elastic-XXXXXX";
  const char* d = ::mkdtemp(tmpl);
  return d ? d : "";
}

void removeTestDir(const std::string& dir) {
  if (dir.empty()) return;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      std::string name = e->d_name;
      if (name != "." && name != "..") ::unlink((dir + "/" + name).c_str());
    }
    ::closedir(d);
  }
  ::rmdir(dir.c_str());
}

// Publishes bytes under a name, atomically (write, then rename).
bool publish(const std::string& name, const void* data, size_t n) {
  const std::string path = testDir() + "/" + name, tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) return false;
  bool ok = std::fwrite(data, 1, n, f) == n;
  ok = (std::fclose(f) == 0) && ok;
  return ok && std::rename(tmp.c_str(), path.c_str()) == 0;
}

bool waitFor(const std::string& name, void* data, size_t n, int timeoutMs = 30000) {
  const std::string path = testDir() + "/" + name;
  const double t0 = monoMs();
  while (monoMs() - t0 < timeoutMs) {
    if (FILE* f = std::fopen(path.c_str(), "rb")) {
      bool ok = std::fread(data, 1, n, f) == n;
      std::fclose(f);
      if (ok) return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

ncclConfig_t nonblockingConfig() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return config;
}

// Polls a nonblocking communicator until it leaves ncclInProgress.
ncclResult_t settle(ncclComm_t comm, int timeoutMs = 60000) {
  ncclResult_t state = ncclInProgress;
  const double t0 = monoMs();
  while (monoMs() - t0 < timeoutMs) {
    ncclResult_t rc = ncclCommGetAsyncError(comm, &state);
    if (rc != ncclSuccess) return rc;
    if (state != ncclInProgress) return state;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return ncclInProgress;
}

// One AllReduce of value(rank, i) over `comm`, checked: every element is the
// sum over the communicator's ranks.
int checkedAllReduce(MpChild& c, ncclComm_t comm, size_t count, const char* what) {
  int rank = -1, n = 0;
  CHILD_NCCL(c, ncclCommUserRank(comm, &rank));
  CHILD_NCCL(c, ncclCommCount(comm, &n));
  std::vector<float> send(count), recv(count, -1.0f);
  for (size_t i = 0; i < count; ++i) send[i] = value(rank, i);
  ncclResult_t rc = ncclAllReduce(send.data(), recv.data(), count, ncclFloat, ncclSum, comm, nullptr);
  if (rc == ncclInProgress) rc = settle(comm);
  CHILD_NCCL(c, rc);
  ncclResult_t state = ncclSuccess;
  CHILD_NCCL(c, ncclCommGetAsyncError(comm, &state));
  if (state == ncclInProgress) state = settle(comm);
  CHILD_NCCL(c, state);
  CHILD_CHECK(c, expectFloats(c, what, recv, [&](size_t i) {
                float sum = 0;
                for (int r = 0; r < n; ++r) sum += value(r, i);
                return sum;
              }),
              what);
  return 0;
}

#define CHILD_OK(child, expr)            \
  do {                                   \
    if (int rc_ = (expr); rc_ != 0) return rc_; \
  } while (0)

// ---- shrink around a SIGKILLed rank -----------------------------------------

constexpr int kVictim = 2;

int shrinkAfterKill(MpChild& c) {
  const int r = c.rank(), n = c.nranks();
  ncclComm_t comm = nullptr;
  CHILD_NCCL(c, initComm(c, &comm));
  CHILD_OK(c, checkedAllReduce(c, comm, 1 << 16, "AllReduce before the kill"));
  CHILD_CHECK(c, c.barrier(), "barrier before the kill");
  std::vector<float> send(1 << 18, 1.0f), recv(1 << 18);
  if (r == kVictim) {
    // A few operations in, so that the others are mid-AllReduce.
    for (int i = 0; i < 3; ++i)
      CHILD_NCCL(c, ncclAllReduce(send.data(), recv.data(), send.size(), ncclFloat, ncclSum, comm, nullptr));
    const double at = monoMs();
    publish("killed-at", &at, sizeof(at));
    ::raise(SIGKILL);
  }
  ncclResult_t rc = ncclSuccess;
  int done = 0;
  while (rc == ncclSuccess && done < 100000) {
    rc = ncclAllReduce(send.data(), recv.data(), send.size(), ncclFloat, ncclSum, comm, nullptr);
    ++done;
  }
  const double failedAt = monoMs();
  c.log("AllReduce " + std::to_string(done) + " failed: " + describe(rc));
  CHILD_CHECK(c, rc != ncclSuccess, "the survivors' AllReduce never failed");
  double killedAt = 0;
  CHILD_CHECK(c, waitFor("killed-at", &killedAt, sizeof(killedAt)), "the victim's time of death");

  int excluded[] = {kVictim};
  ncclComm_t small = nullptr;
  CHILD_NCCL(c, ncclCommShrink(comm, excluded, 1, &small, nullptr, NCCL_SHRINK_ABORT));
  const double shrunkAt = monoMs();
  int newRank = -1, newSize = 0;
  CHILD_NCCL(c, ncclCommUserRank(small, &newRank));
  CHILD_NCCL(c, ncclCommCount(small, &newSize));
  CHILD_CHECK(c, newSize == n - 1, "shrunk size " + std::to_string(newSize));
  CHILD_CHECK(c, newRank == (r < kVictim ? r : r - 1), "ranks renumbered in order: got " + std::to_string(newRank));
  CHILD_OK(c, checkedAllReduce(c, small, 1 << 16, "first AllReduce of the shrunk communicator"));
  const double recoveredAt = monoMs();
  const double recoveryMs = recoveredAt - killedAt;
  c.log("recovery: death -> failed call " + std::to_string(static_cast<int>(failedAt - killedAt)) +
        " ms, -> shrunk " + std::to_string(static_cast<int>(shrunkAt - killedAt)) +
        " ms, -> first correct AllReduce " + std::to_string(static_cast<int>(recoveryMs)) + " ms");
  CHILD_CHECK(c, recoveryMs < kRecoveryBoundMs, "recovery took too long");
  for (int i = 0; i < 5; ++i) CHILD_OK(c, checkedAllReduce(c, small, 1000 + i, "AllReduce after the shrink"));
  // The shrink revoked the parent: collectives are refused, destroy works.
  rc = ncclAllReduce(send.data(), recv.data(), 16, ncclFloat, ncclSum, comm, nullptr);
  CHILD_CHECK(c, rc == ncclInvalidUsage, "the parent after NCCL_SHRINK_ABORT: " + describe(rc));
  CHILD_NCCL(c, ncclCommDestroy(comm));
  CHILD_NCCL(c, ncclCommDestroy(small));
  CHILD_CHECK(c, c.barrier(), "the other survivors did not finish");  // rank 0 hosts the root
  return 0;
}

void runShrinkAfterKill(const char* transport) {
  const std::string dir = makeTestDir();
  REQUIRE_FALSE(dir.empty());
  MpConfig cfg;
  cfg.nranks = 4;
  cfg.hardLimitMs = 90000;
  cfg.env = {{"SHOAL_TRANSPORT", transport}, {"SHOAL_ELASTIC_DIR", dir}};
  MpResult res = runForked(cfg, shrinkAfterKill);
  removeTestDir(dir);
  INFO(transport << "\n" << res.report());
  REQUIRE_FALSE(res.timedOut);
  CHECK(res.onlyVictimKilled(kVictim));
}

// Init, one checked AllReduce and a barrier; then the ranks `dies` names
// SIGKILL themselves and the others run AllReduces until one fails.
int initThenLose(MpChild& c, ncclComm_t* comm, const std::function<bool(int)>& dies) {
  CHILD_NCCL(c, initComm(c, comm));
  CHILD_OK(c, checkedAllReduce(c, *comm, 4096, "AllReduce before the kill"));
  CHILD_CHECK(c, c.barrier(), "barrier before the kill");
  if (dies(c.rank())) ::raise(SIGKILL);
  std::vector<float> send(1 << 16, 1.0f), recv(1 << 16);
  ncclResult_t rc = ncclSuccess;
  for (int i = 0; i < 100000 && rc == ncclSuccess; ++i)
    rc = ncclAllReduce(send.data(), recv.data(), send.size(), ncclFloat, ncclSum, *comm, nullptr);
  CHILD_CHECK(c, rc != ncclSuccess, "the AllReduce never failed");
  return 0;
}

// Two ranks die, and the survivors at first exclude only one of them: the
// other will never call ncclCommShrink. Its will (written by the bootstrap
// root when its process ended) names it within seconds instead of the wait
// lasting until the set-up deadline (10 minutes), and a second shrink that
// excludes both works.
int shrinkMissingADeadRank(MpChild& c) {
  ncclComm_t comm = nullptr;
  CHILD_OK(c, initThenLose(c, &comm, [](int rank) { return rank >= 2; }));
  int onlyThree[] = {3};
  ncclComm_t small = nullptr;
  double t0 = monoMs();
  ncclResult_t rc = ncclCommShrink(comm, onlyThree, 1, &small, nullptr, NCCL_SHRINK_ABORT);
  const std::string why = ncclGetLastError(comm);
  c.log("shrink excluding {3}: " + std::string(ncclGetErrorString(rc)) + " after " +
        std::to_string(static_cast<int>(monoMs() - t0)) + " ms: " + why);
  CHILD_CHECK(c, rc == ncclRemoteError, "shrink waiting for a dead rank: " + describe(rc));
  CHILD_CHECK(c, why.find("rank 2 is not excluded but will never call ncclCommShrink") != std::string::npos,
              "the error does not name rank 2: " + why);
  CHILD_CHECK(c, why.find("its process ended") != std::string::npos, "the error does not say why: " + why);
  CHILD_CHECK(c, monoMs() - t0 < 10000, "the failure took more than 10 s");
  CHILD_CHECK(c, small == nullptr, "a failed shrink left a communicator");
  int both[] = {2, 3};
  CHILD_NCCL(c, ncclCommShrink(comm, both, 2, &small, nullptr, NCCL_SHRINK_ABORT));
  CHILD_OK(c, checkedAllReduce(c, small, 4096, "AllReduce of the shrunk communicator"));
  CHILD_NCCL(c, ncclCommDestroy(small));
  CHILD_NCCL(c, ncclCommDestroy(comm));
  CHILD_CHECK(c, c.barrier(), "the other survivor did not finish");  // rank 0 hosts the root
  return 0;
}

// The documented limit: the survivors meet in the bootstrap root, which lives
// in the process that made the unique id (rank 0 here). With rank 0 dead,
// shrink must fail promptly with a clear error, not hang.
int shrinkWithoutRoot(MpChild& c) {
  ncclComm_t comm = nullptr;
  CHILD_OK(c, initThenLose(c, &comm, [](int rank) { return rank == 0; }));
  int excluded[] = {0};
  ncclComm_t small = nullptr;
  const double t0 = monoMs();
  const ncclResult_t rc = ncclCommShrink(comm, excluded, 1, &small, nullptr, NCCL_SHRINK_ABORT);
  const std::string why = ncclGetLastError(comm);
  c.log("shrink without the root: " + std::string(ncclGetErrorString(rc)) + " after " +
        std::to_string(static_cast<int>(monoMs() - t0)) + " ms: " + why);
  CHILD_CHECK(c, rc == ncclRemoteError, "shrink with the root's process dead: " + describe(rc));
  CHILD_CHECK(c, why.find("bootstrap root") != std::string::npos, "the error does not name the root: " + why);
  CHILD_CHECK(c, monoMs() - t0 < 5000, "the failure took too long");
  CHILD_CHECK(c, small == nullptr, "a failed shrink left a communicator");
  CHILD_NCCL(c, ncclCommDestroy(comm));
  return 0;
}

// ---- grow with new processes --------------------------------------------------

// Ranks 0 and 1 make a 2-rank communicator; the others are new processes
// that join it with ncclCommGrow. Existing ranks keep their numbers.
int growFromTwo(MpChild& c, bool nonblocking) {
  const int r = c.rank(), n = c.nranks();
  ncclConfig_t nb = nonblockingConfig();
  ncclConfig_t* config = nonblocking ? &nb : nullptr;
  ncclComm_t grown = nullptr;
  ncclResult_t rc;
  if (r < 2) {
    ncclUniqueId id;
    CHILD_CHECK(c, c.uniqueId(&id), "unique id");
    ncclComm_t comm = nullptr;
    rc = ncclCommInitRankConfig(&comm, 2, id, r, config);
    if (rc == ncclInProgress) rc = settle(comm);
    CHILD_NCCL(c, rc);
    CHILD_OK(c, checkedAllReduce(c, comm, 4096, "AllReduce of the 2-rank communicator"));
    ncclUniqueId growId;
    if (r == 0) {
      CHILD_NCCL(c, ncclCommGetUniqueId(comm, &growId));
      CHILD_CHECK(c, publish("grow-id", growId.internal, sizeof(growId.internal)), "publishing the grow id");
    }
    rc = ncclCommGrow(comm, n, r == 0 ? &growId : nullptr, -1, &grown, nullptr);  // config inherited
    if (nonblocking) {
      CHILD_CHECK(c, rc == ncclInProgress || rc == ncclSuccess, "nonblocking grow: " + describe(rc));
      rc = settle(grown);
    }
    CHILD_NCCL(c, rc);
    // The old communicator still works until destroyed.
    CHILD_OK(c, checkedAllReduce(c, comm, 512, "AllReduce of the old communicator after the grow"));
    CHILD_NCCL(c, ncclCommDestroy(comm));
  } else {
    ncclUniqueId growId;
    CHILD_CHECK(c, waitFor("grow-id", growId.internal, sizeof(growId.internal)), "the grow id");
    rc = ncclCommGrow(nullptr, n, &growId, r, &grown, config);
    if (nonblocking) {
      CHILD_CHECK(c, rc == ncclInProgress || rc == ncclSuccess, "nonblocking grow: " + describe(rc));
      rc = settle(grown);
    }
    CHILD_NCCL(c, rc);
  }
  int rank = -1, size = 0;
  CHILD_NCCL(c, ncclCommUserRank(grown, &rank));
  CHILD_NCCL(c, ncclCommCount(grown, &size));
  CHILD_CHECK(c, rank == r && size == n, "grown rank " + std::to_string(rank) + " of " + std::to_string(size));
  CHILD_OK(c, checkedAllReduce(c, grown, 1 << 15, "AllReduce of the grown communicator"));
  CHILD_OK(c, checkedAllReduce(c, grown, 7, "small AllReduce of the grown communicator"));
  CHILD_NCCL(c, ncclCommDestroy(grown));
  CHILD_CHECK(c, c.barrier(), "the others did not finish");
  return 0;
}

void runGrow(int total, bool nonblocking, const char* transport = "tcp") {
  const std::string dir = makeTestDir();
  REQUIRE_FALSE(dir.empty());
  MpConfig cfg;
  cfg.nranks = total;
  cfg.hardLimitMs = 60000;
  cfg.env = {{"SHOAL_TRANSPORT", transport}, {"SHOAL_ELASTIC_DIR", dir}};
  MpResult res = runForked(cfg, [&](MpChild& c) { return growFromTwo(c, nonblocking); });
  removeTestDir(dir);
  INFO(res.report());
  REQUIRE_FALSE(res.timedOut);
  CHECK(res.allPassed());
}

// ---- revoke ---------------------------------------------------------------------

// Rank 0 starts an AllReduce that rank 1 never joins; rank 0 revokes its
// communicator, which stops the AllReduce. Both ranks then split and shrink
// (excluding nobody, NCCL_SHRINK_DEFAULT) and the new communicators work.
int revokeBlocking(MpChild& c) {
  const int r = c.rank();
  ncclComm_t comm = nullptr;
  CHILD_NCCL(c, initComm(c, &comm));
  CHILD_OK(c, checkedAllReduce(c, comm, 4096, "AllReduce before the revoke"));
  CHILD_CHECK(c, c.barrier(), "barrier before the revoke");
  if (r == 0) {
    std::vector<float> send(1 << 16, 1.0f), recv(1 << 16);
    std::atomic<int> result{-1};
    std::atomic<double> returnedAt{0};
    std::thread stuck([&] {
      result = ncclAllReduce(send.data(), recv.data(), send.size(), ncclFloat, ncclSum, comm, nullptr);
      returnedAt = monoMs();
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    CHILD_CHECK(c, result.load() == -1, "the AllReduce rank 1 never joined returned early");
    const double t0 = monoMs();
    ncclResult_t rc = ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT);
    const double revokeMs = monoMs() - t0;
    stuck.join();
    c.log("revoke took " + std::to_string(static_cast<int>(revokeMs)) + " ms; the stopped AllReduce returned " +
          ncclGetErrorString(static_cast<ncclResult_t>(result.load())));
    CHILD_NCCL(c, rc);
    CHILD_CHECK(c, result.load() != ncclSuccess, "the revoked AllReduce succeeded");
    CHILD_CHECK(c, returnedAt.load() - t0 < 2000, "the revoked AllReduce did not stop promptly");
  } else {
    CHILD_NCCL(c, ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT));
  }
  ncclResult_t state = ncclInternalError;
  CHILD_NCCL(c, ncclCommGetAsyncError(comm, &state));
  CHILD_CHECK(c, state == ncclSuccess, std::string("async state after the revoke: ") + ncclGetErrorString(state));
  float x = 1, y = 0;
  ncclResult_t rc = ncclAllReduce(&x, &y, 1, ncclFloat, ncclSum, comm, nullptr);
  const std::string why = ncclGetLastError(comm);
  CHILD_CHECK(c, rc == ncclInvalidUsage, "a collective after the revoke: " + describe(rc));
  CHILD_CHECK(c, why.find("revoked") != std::string::npos, "the error does not say revoked: " + why);
  rc = ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT);
  CHILD_CHECK(c, rc == ncclInvalidArgument, "a second revoke: " + describe(rc));
  rc = ncclCommFinalize(comm);
  CHILD_CHECK(c, rc == ncclInvalidUsage, "finalize after the revoke: " + describe(rc));
  // Split works after a revoke, though the revoke stopped a collective on
  // rank 0 only (the ranks issued different numbers of collectives).
  ncclComm_t half = nullptr;
  CHILD_NCCL(c, ncclCommSplit(comm, 0, r, &half, nullptr));
  CHILD_OK(c, checkedAllReduce(c, half, 4096, "AllReduce of the communicator split from the revoked one"));
  ncclComm_t fresh = nullptr;
  CHILD_NCCL(c, ncclCommShrink(comm, nullptr, 0, &fresh, nullptr, NCCL_SHRINK_DEFAULT));
  CHILD_OK(c, checkedAllReduce(c, fresh, 4096, "AllReduce of the communicator shrunk from the revoked one"));
  CHILD_NCCL(c, ncclCommDestroy(comm));
  CHILD_NCCL(c, ncclCommDestroy(half));
  CHILD_NCCL(c, ncclCommDestroy(fresh));
  CHILD_CHECK(c, c.barrier(), "the other rank did not finish");
  return 0;
}

// Nonblocking: rank 0's AllReduce is queued and in progress (rank 1 never
// joins); revoke stops it, the async state settles to ncclSuccess, and a
// nonblocking shrink (config inherited) makes a working communicator.
int revokeNonblocking(MpChild& c) {
  const int r = c.rank();
  ncclUniqueId id;
  CHILD_CHECK(c, c.uniqueId(&id), "unique id");
  ncclConfig_t config = nonblockingConfig();
  ncclComm_t comm = nullptr;
  ncclResult_t rc = ncclCommInitRankConfig(&comm, c.nranks(), id, r, &config);
  if (rc == ncclInProgress) rc = settle(comm);
  CHILD_NCCL(c, rc);
  CHILD_OK(c, checkedAllReduce(c, comm, 4096, "AllReduce before the revoke"));
  CHILD_CHECK(c, c.barrier(), "barrier before the revoke");
  std::vector<float> send(1 << 16, 1.0f), recv(1 << 16);
  if (r == 0) {
    rc = ncclAllReduce(send.data(), recv.data(), send.size(), ncclFloat, ncclSum, comm, nullptr);
    CHILD_CHECK(c, rc == ncclSuccess || rc == ncclInProgress, "enqueue: " + describe(rc));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    ncclResult_t state = ncclSuccess;
    CHILD_NCCL(c, ncclCommGetAsyncError(comm, &state));
    CHILD_CHECK(c, state == ncclInProgress, std::string("the lone AllReduce is ") + ncclGetErrorString(state));
  }
  rc = ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT);
  CHILD_CHECK(c, rc == ncclSuccess || rc == ncclInProgress, "revoke: " + describe(rc));
  CHILD_NCCL(c, settle(comm, 10000));
  rc = ncclAllReduce(send.data(), recv.data(), 16, ncclFloat, ncclSum, comm, nullptr);
  CHILD_CHECK(c, rc == ncclInvalidUsage, "a collective after the revoke: " + describe(rc));
  ncclComm_t fresh = nullptr;
  rc = ncclCommShrink(comm, nullptr, 0, &fresh, nullptr, NCCL_SHRINK_DEFAULT);
  CHILD_CHECK(c, rc == ncclInProgress || rc == ncclSuccess, "nonblocking shrink: " + describe(rc));
  CHILD_NCCL(c, settle(fresh));
  CHILD_OK(c, checkedAllReduce(c, fresh, 4096, "AllReduce of the nonblocking shrunk communicator"));
  CHILD_NCCL(c, ncclCommDestroy(comm));
  CHILD_NCCL(c, ncclCommDestroy(fresh));
  CHILD_CHECK(c, c.barrier(), "the other rank did not finish");
  return 0;
}

void runTwoRanks(int (*body)(MpChild&)) {
  MpConfig cfg;
  cfg.nranks = 2;
  cfg.hardLimitMs = 60000;
  MpResult res = runForked(cfg, body);
  INFO(res.report());
  REQUIRE_FALSE(res.timedOut);
  CHECK(res.allPassed());
}

// ---- argument errors and disagreement -------------------------------------------

int argumentErrors(MpChild& c) {
  const int r = c.rank(), n = c.nranks();
  ncclComm_t comm = nullptr;
  CHILD_NCCL(c, initComm(c, &comm));
  ncclComm_t out = nullptr;
  int one[] = {1}, twice[] = {1, 1}, outside[] = {n}, self[] = {r};
  auto expect = [&](ncclResult_t got, ncclResult_t want, const char* what) {
    if (got == want) return true;
    c.log(std::string(what) + ": got " + describe(got) + ", want " + ncclGetErrorString(want));
    return false;
  };
  bool ok = true;
  ok &= expect(ncclCommShrink(nullptr, one, 1, &out, nullptr, 0), ncclInvalidArgument, "shrink NULL comm");
  ok &= expect(ncclCommShrink(comm, one, 1, nullptr, nullptr, 0), ncclInvalidArgument, "shrink NULL newcomm");
  ok &= expect(ncclCommShrink(comm, one, 1, &out, nullptr, 7), ncclInvalidArgument, "shrink flags 7");
  ok &= expect(ncclCommShrink(comm, one, -1, &out, nullptr, 0), ncclInvalidArgument, "shrink count -1");
  ok &= expect(ncclCommShrink(comm, nullptr, 1, &out, nullptr, 0), ncclInvalidArgument, "shrink NULL list");
  ok &= expect(ncclCommShrink(comm, twice, 2, &out, nullptr, 0), ncclInvalidArgument, "shrink rank twice");
  ok &= expect(ncclCommShrink(comm, outside, 1, &out, nullptr, 0), ncclInvalidArgument, "shrink out of range");
  ok &= expect(ncclCommShrink(comm, self, 1, &out, nullptr, 0), ncclInvalidUsage, "shrink excluding itself");
  ok &= expect(ncclCommRevoke(nullptr, 0), ncclSuccess, "revoke NULL");
  ok &= expect(ncclCommRevoke(comm, 1), ncclInvalidArgument, "revoke flags 1");
  ncclUniqueId id;
  ok &= expect(ncclCommGetUniqueId(nullptr, &id), ncclInvalidArgument, "GetUniqueId NULL comm");
  ok &= expect(ncclCommGetUniqueId(comm, nullptr), ncclInvalidArgument, "GetUniqueId NULL id");
  ok &= expect(ncclCommGrow(comm, n + 1, nullptr, -1, nullptr, nullptr), ncclInvalidArgument, "grow NULL newcomm");
  ok &= expect(ncclCommGrow(comm, 0, nullptr, -1, &out, nullptr), ncclInvalidArgument, "grow nRanks 0");
  ok &= expect(ncclCommGrow(comm, n + 1, nullptr, r, &out, nullptr), ncclInvalidArgument, "grow existing rank != -1");
  ok &= expect(ncclCommGrow(comm, n, nullptr, -1, &out, nullptr), ncclInvalidArgument, "grow to the same size");
  ok &= expect(ncclCommGrow(nullptr, n + 1, nullptr, n, &out, nullptr), ncclInvalidArgument, "new rank without id");
  CHILD_CHECK(c, ok, "argument errors");
  // Every survivor but one excludes nobody; rank 0 excludes the last rank: a
  // clear error on every rank, not a wait until the init deadline.
  const double t0 = monoMs();
  int last[] = {n - 1};
  ncclResult_t rc = r == 0 ? ncclCommShrink(comm, last, 1, &out, nullptr, NCCL_SHRINK_DEFAULT)
                           : ncclCommShrink(comm, nullptr, 0, &out, nullptr, NCCL_SHRINK_DEFAULT);
  const std::string why = ncclGetLastError(comm);
  c.log("mismatched shrink: " + std::string(ncclGetErrorString(rc)) + " after " +
        std::to_string(static_cast<int>(monoMs() - t0)) + " ms: " + why);
  CHILD_CHECK(c, rc == ncclInvalidUsage, "mismatched exclude lists: " + describe(rc));
  CHILD_CHECK(c, why.find("disagree") != std::string::npos, "the error does not say the lists disagree: " + why);
  CHILD_CHECK(c, monoMs() - t0 < 10000, "the disagreement took too long to find");
  CHILD_CHECK(c, out == nullptr, "a failed shrink left a communicator");
  // The parent is untouched by a failed NCCL_SHRINK_DEFAULT.
  CHILD_OK(c, checkedAllReduce(c, comm, 4096, "AllReduce after the failed shrink"));
  CHILD_NCCL(c, ncclCommDestroy(comm));
  CHILD_CHECK(c, c.barrier(), "the others did not finish");
  return 0;
}

// ---- shrink/grow cycles -----------------------------------------------------------

struct Resources {
  int threads = 0, fds = 0, shm = 0;
};

int countDir(const std::string& path, const std::string& prefix = "") {
  int n = 0;
  if (DIR* d = ::opendir(path.c_str())) {
    while (dirent* e = ::readdir(d)) {
      std::string name = e->d_name;
      if (name == "." || name == "..") continue;
      if (prefix.empty() || name.rfind(prefix, 0) == 0) ++n;
    }
    ::closedir(d);
  }
  return n;
}

Resources sample() {
  return {countDir("/proc/self/task"), countDir("/proc/self/fd"),
          countDir("/dev/shm", "shoal-" + std::to_string(::getpid()) + "-")};
}

constexpr int kCycles = 50;

// Three ranks: rank 2 leaves (ranks 0 and 1 shrink without it, NCCL_SHRINK_DEFAULT)
// and comes back as a new rank (ncclCommGrow), kCycles times, with an AllReduce
// checked on every communicator.
int cycles(MpChild& c) {
  const int r = c.rank();
  ncclComm_t comm = nullptr;
  CHILD_NCCL(c, initComm(c, &comm));
  CHILD_OK(c, checkedAllReduce(c, comm, 4096, "AllReduce of the first communicator"));
  Resources warm{}, end{};
  for (int cycle = 0; cycle < kCycles; ++cycle) {
    if (cycle == 5) warm = sample();
    ncclComm_t pair = nullptr;
    if (r < 2) {
      int leaving[] = {2};
      CHILD_NCCL(c, ncclCommShrink(comm, leaving, 1, &pair, nullptr, NCCL_SHRINK_DEFAULT));
      CHILD_NCCL(c, ncclCommDestroy(comm));
      CHILD_OK(c, checkedAllReduce(c, pair, 1024 + cycle, "AllReduce of the shrunk pair"));
    } else {
      CHILD_NCCL(c, ncclCommDestroy(comm));
    }
    ncclUniqueId growId;
    const std::string name = "grow-" + std::to_string(cycle);
    if (r == 0) {
      CHILD_NCCL(c, ncclCommGetUniqueId(pair, &growId));
      CHILD_CHECK(c, publish(name, growId.internal, sizeof(growId.internal)), "publishing the grow id");
    }
    if (r < 2) {
      CHILD_NCCL(c, ncclCommGrow(pair, 3, r == 0 ? &growId : nullptr, -1, &comm, nullptr));
      CHILD_NCCL(c, ncclCommDestroy(pair));
    } else {
      CHILD_CHECK(c, waitFor(name, growId.internal, sizeof(growId.internal)), "the grow id");
      CHILD_NCCL(c, ncclCommGrow(nullptr, 3, &growId, 2, &comm, nullptr));
    }
    CHILD_OK(c, checkedAllReduce(c, comm, 2048 + cycle, "AllReduce of the regrown communicator"));
  }
  end = sample();  // as at cycle 5: one 3-rank communicator alive
  CHILD_NCCL(c, ncclCommDestroy(comm));
  c.log("threads " + std::to_string(warm.threads) + " -> " + std::to_string(end.threads) + ", fds " +
        std::to_string(warm.fds) + " -> " + std::to_string(end.fds) + ", /dev/shm " + std::to_string(warm.shm) +
        " -> " + std::to_string(end.shm));
  // After cycle 5 every per-process service has started; a leak of one per
  // cycle would add 45.
  CHILD_CHECK(c, end.threads <= warm.threads, "threads grew");
  CHILD_CHECK(c, end.fds <= warm.fds + 2, "file descriptors grew");
  CHILD_CHECK(c, end.shm <= warm.shm, "/dev/shm entries grew");
  CHILD_CHECK(c, c.barrier(), "the others did not finish");
  return 0;
}

void runCycles(const char* transport) {
  const std::string dir = makeTestDir();
  REQUIRE_FALSE(dir.empty());
  MpConfig cfg;
  cfg.nranks = 3;
  cfg.hardLimitMs = 120000;
  cfg.env = {{"SHOAL_TRANSPORT", transport}, {"SHOAL_ELASTIC_DIR", dir}};
  MpResult res = runForked(cfg, cycles);
  removeTestDir(dir);
  INFO(transport << "\n" << res.report());
  REQUIRE_FALSE(res.timedOut);
  CHECK(res.allPassed());
}

}  // namespace

TEST_CASE("elastic: survivors of a rank SIGKILLed mid-AllReduce shrink and compute over tcp",
          "[mp][elastic][failure]") {
  runShrinkAfterKill("tcp");
}

TEST_CASE("elastic: survivors of a rank SIGKILLed mid-AllReduce shrink and compute over shm",
          "[mp][elastic][failure]") {
  runShrinkAfterKill("shm");
}

TEST_CASE("elastic: shrink with the bootstrap root's process dead fails promptly", "[mp][elastic][failure]") {
  MpConfig cfg;
  cfg.nranks = 3;
  cfg.hardLimitMs = 60000;
  MpResult res = runForked(cfg, shrinkWithoutRoot);
  INFO(res.report());
  REQUIRE_FALSE(res.timedOut);
  CHECK(res.onlyVictimKilled(0));
}

TEST_CASE("elastic: a shrink that keeps a dead rank fails within seconds naming it, then one without it works",
          "[mp][elastic][failure]") {
  MpConfig cfg;
  cfg.nranks = 4;
  cfg.hardLimitMs = 60000;
  MpResult res = runForked(cfg, shrinkMissingADeadRank);
  INFO(res.report());
  REQUIRE_FALSE(res.timedOut);
  for (const auto& rr : res.ranks) {
    if (rr.rank >= 2) CHECK(rr.termSignal == SIGKILL);
    else CHECK((rr.exited && rr.exitCode == 0));
  }
}

TEST_CASE("elastic: grow from 2 to 3 ranks", "[mp][elastic]") { runGrow(3, false); }

TEST_CASE("elastic: grow from 2 to 4 ranks nonblocking", "[mp][elastic]") { runGrow(4, true); }

TEST_CASE("elastic: grow from 2 to 4 ranks over shm", "[mp][elastic]") { runGrow(4, false, "shm"); }

TEST_CASE("elastic: revoke stops a blocking AllReduce and shrink works after it", "[mp][elastic]") {
  runTwoRanks(revokeBlocking);
}

TEST_CASE("elastic: revoke of a nonblocking communicator then a nonblocking shrink", "[mp][elastic]") {
  runTwoRanks(revokeNonblocking);
}

TEST_CASE("elastic: argument errors and mismatched exclude lists", "[mp][elastic]") {
  MpConfig cfg;
  cfg.nranks = 3;
  cfg.hardLimitMs = 60000;
  MpResult res = runForked(cfg, argumentErrors);
  INFO(res.report());
  REQUIRE_FALSE(res.timedOut);
  CHECK(res.allPassed());
}

TEST_CASE("elastic: 50 shrink/grow cycles leak no threads or fds or /dev/shm entries over tcp",
          "[mp][elastic][soak]") {
  runCycles("tcp");
}

TEST_CASE("elastic: 50 shrink/grow cycles leak no threads or fds or /dev/shm entries over shm",
          "[mp][elastic][soak]") {
  runCycles("shm");
}
