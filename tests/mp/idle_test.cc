// A peer lost while the communicator is idle (label "mp", forked ranks):
// nothing is in flight and nobody calls, yet ncclCommGetAsyncError must turn
// to ncclRemoteError naming the lost rank and its host, through the progress
// thread's idle check (SHOAL_IDLE_CHECK_MS, Engine::watchIdle), and the next
// call must fail at once with the same error. Over tcp (the killed process's
// kernel closes its sockets: end of stream), over shm (its pidfd turns
// readable) and over ofi (its will in the bootstrap store: the provider
// says nothing). docs/nccl-compat.md, "Errors".
//
// The check interval is left at its default (5 s; ofi 1 s) unless the environment sets
// SHOAL_IDLE_CHECK_MS: SHOAL_IDLE_CHECK_MS=0 (no idle check, the behaviour
// before it existed) makes these cases fail.
#include <nccl.h>

#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <chrono>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "mp/mp_checks.h"
#include "support/mp_harness.h"

using namespace shoal::testing;

namespace {

// The rank that dies or leaves; rank 0's process also serves the bootstrap
// root (it made the id), whose store goes with it.
constexpr int kVictim = 1;
constexpr int kRootsRank = 0;
// The survivors must report within this much of the kill: one check interval
// (5 s) and slack for a loaded 2-core machine.
constexpr double kBoundMs = 10000;

std::string hostName() {
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  return name;
}

int idleDeath(MpChild& c, int victim) {
  const int r = c.rank(), n = c.nranks();
  ncclComm_t comm = nullptr;
  CHILD_NCCL(c, initComm(c, &comm));
  // Connections to every peer (the algorithms for 3 ranks and these sizes
  // connect each rank to both others), then nothing in flight.
  std::vector<float> send(4096, static_cast<float>(r + 1)), recv(4096);
  for (int i = 0; i < 5; ++i) {
    CHILD_NCCL(c, ncclAllReduce(send.data(), recv.data(), send.size(), ncclFloat, ncclSum, comm, nullptr));
    CHILD_NCCL(c, ncclAllReduce(send.data(), recv.data(), 16, ncclFloat, ncclSum, comm, nullptr));
  }
  CHILD_CHECK(c, recv[0] == static_cast<float>(n * (n + 1) / 2), "AllReduce result");

  // Healthy and idle for more than one check interval: no error.
  std::this_thread::sleep_for(std::chrono::milliseconds(6000));
  ncclResult_t state = ncclInternalError;
  CHILD_NCCL(c, ncclCommGetAsyncError(comm, &state));
  CHILD_CHECK(c, state == ncclSuccess, std::string("an idle healthy communicator reports ") +
                                           ncclGetErrorString(state) + ": " + ncclGetLastError(comm));

  CHILD_CHECK(c, c.barrier(), "barrier before the kill");
  if (r == victim) {
    c.log("killing myself (SIGKILL) while every communicator is idle");
    ::raise(SIGKILL);
  }
  const double t0 = monoMs();
  while (monoMs() - t0 < 3 * kBoundMs) {
    CHILD_NCCL(c, ncclCommGetAsyncError(comm, &state));
    if (state != ncclSuccess) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const double ms = monoMs() - t0;
  const std::string last = ncclGetLastError(comm);
  c.log("ncclCommGetAsyncError after " + std::to_string(static_cast<int>(ms)) + " ms: " +
        ncclGetErrorString(state) + ": " + last);
  CHILD_CHECK(c, state == ncclRemoteError, std::string("async error ") + ncclGetErrorString(state));
  CHILD_CHECK(c, ms < kBoundMs, "the idle communicator learnt of the death too late");
  CHILD_CHECK(c, last.find("rank " + std::to_string(victim) + " (host " + hostName()) != std::string::npos,
              "ncclGetLastError does not name the victim and its host: " + last);

  // Later calls fail at once with the same error.
  const double t1 = monoMs();
  ncclResult_t rc = ncclAllReduce(send.data(), recv.data(), send.size(), ncclFloat, ncclSum, comm, nullptr);
  const double callMs = monoMs() - t1;
  const std::string again = ncclGetLastError(comm);
  c.log("the next AllReduce: " + std::string(ncclGetErrorString(rc)) + " after " +
        std::to_string(static_cast<int>(callMs)) + " ms: " + again);
  CHILD_CHECK(c, rc == ncclRemoteError, "the next call does not fail with the async error");
  CHILD_CHECK(c, callMs < 1000, "the next call did not fail at once");
  CHILD_CHECK(c, again.find("rank " + std::to_string(victim) + " (host ") != std::string::npos,
              "the next call's error does not name the victim: " + again);
  CHILD_NCCL(c, ncclCommGetAsyncError(comm, &state));
  CHILD_CHECK(c, state == ncclRemoteError, "the async error changed");
  CHILD_NCCL(c, ncclCommAbort(comm));
  CHILD_CHECK(c, c.barrier(), "the other survivor did not finish");  // rank 0 hosts the root
  return 0;
}

// A peer that destroys its communicator and exits has left, not died: the
// survivors' idle checks stay quiet (a watchdog polling
// ncclCommGetAsyncError at the end of a job must not see an error), and an
// operation that needs the peer fails naming it.
int idleLeave(MpChild& c, int victim) {
  const int r = c.rank(), n = c.nranks();
  ncclComm_t comm = nullptr;
  CHILD_NCCL(c, initComm(c, &comm));
  std::vector<float> send(4096, static_cast<float>(r + 1)), recv(4096);
  for (int i = 0; i < 5; ++i)
    CHILD_NCCL(c, ncclAllReduce(send.data(), recv.data(), send.size(), ncclFloat, ncclSum, comm, nullptr));
  CHILD_CHECK(c, recv[0] == static_cast<float>(n * (n + 1) / 2), "AllReduce result");
  CHILD_CHECK(c, c.barrier(), "barrier before the leave");
  if (r == victim) {
    CHILD_NCCL(c, ncclCommDestroy(comm));
    c.log("destroyed my communicator; exiting");
    return 0;
  }
  // Two check intervals and slack, polling as a watchdog does.
  ncclResult_t state = ncclInternalError;
  const double t0 = monoMs();
  while (monoMs() - t0 < 12000) {
    CHILD_NCCL(c, ncclCommGetAsyncError(comm, &state));
    CHILD_CHECK(c, state == ncclSuccess, std::string("a peer that left became the async error: ") +
                                             ncclGetErrorString(state) + ": " + ncclGetLastError(comm));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ncclResult_t rc = ncclAllReduce(send.data(), recv.data(), send.size(), ncclFloat, ncclSum, comm, nullptr);
  const std::string why = ncclGetLastError(comm);
  c.log("an AllReduce after the leave: " + std::string(ncclGetErrorString(rc)) + ": " + why);
  CHILD_CHECK(c, rc == ncclRemoteError, "an operation needing the peer that left did not fail");
  CHILD_CHECK(c, why.find("rank " + std::to_string(victim) + " (host ") != std::string::npos,
              "the error does not name the rank that left: " + why);
  CHILD_NCCL(c, ncclCommAbort(comm));
  CHILD_CHECK(c, c.barrier(), "the other survivor did not finish");
  return 0;
}

// `transport`'s environment: ofi over "tcp;ofi_rxm" on lo, with a 1 s
// check interval (its look for a will is read back at the next check).
std::vector<std::pair<std::string, std::string>> transportEnv(const std::string& transport) {
  if (transport != "ofi") return {{"SHOAL_TRANSPORT", transport}};
  return {{"SHOAL_TRANSPORT", "ofi"}, {"FI_PROVIDER", "tcp;ofi_rxm"}, {"FI_TCP_IFACE", "lo"},
          {"NCCL_SOCKET_IFNAME", "lo"}, {"SHOAL_IDLE_CHECK_MS", "1000"}};
}

void runIdleLeave(const char* transport, int victim = kVictim) {
  MpConfig cfg;
  cfg.nranks = 3;
  cfg.hardLimitMs = 60000;
  cfg.env = transportEnv(transport);
  MpResult res = runForked(cfg, [victim](MpChild& c) { return idleLeave(c, victim); });
  INFO(transport << "\n" << res.report());
  REQUIRE_FALSE(res.timedOut);
  CHECK(res.allPassed());
}

void runIdleDeath(const char* transport, int victim = kVictim) {
  MpConfig cfg;
  cfg.nranks = 3;
  cfg.hardLimitMs = 60000;
  cfg.env = transportEnv(transport);
  MpResult res = runForked(cfg, [victim](MpChild& c) { return idleDeath(c, victim); });
  INFO(transport << "\n" << res.report());
  REQUIRE_FALSE(res.timedOut);
  CHECK(res.onlyVictimKilled(victim));
}

}  // namespace

TEST_CASE("idle: a SIGKILLed peer becomes the async error of idle communicators, over tcp", "[mp][failure][idle]") {
  runIdleDeath("tcp");
}

TEST_CASE("idle: a SIGKILLed peer becomes the async error of idle communicators, over shm", "[mp][failure][idle]") {
  runIdleDeath("shm");
}

TEST_CASE("idle: a peer that destroys its communicator and exits is no error, over tcp", "[mp][idle]") {
  runIdleLeave("tcp");
}

TEST_CASE("idle: a peer that destroys its communicator and exits is no error, over shm", "[mp][idle]") {
  runIdleLeave("shm");
}

#if SHOAL_TEST_OFI
// ofi's provider says nothing of a peer that is gone: the idle check looks
// for its will in the bootstrap store (the mark, one key, while nobody is
// gone), and a peer that left cancelled its will.
TEST_CASE("idle: a SIGKILLed peer becomes the async error of idle communicators, over ofi", "[mp][failure][idle]") {
  runIdleDeath("ofi");
}

TEST_CASE("idle: a peer that destroys its communicator and exits is no error, over ofi", "[mp][idle]") {
  runIdleLeave("ofi");
}

// The process that served the bootstrap root took the store, and the wills
// in it, with it: the idle check probes the processes of the peers it is
// connected to instead, and a peer whose bye came has left.
TEST_CASE("idle: the SIGKILLed process that served the bootstrap root becomes the async error, over ofi",
          "[mp][failure][idle]") {
  runIdleDeath("ofi", kRootsRank);
}

TEST_CASE(
    "idle: the process that served the bootstrap root destroying its communicator and exiting is no error, "
    "over ofi",
    "[mp][idle]") {
  runIdleLeave("ofi", kRootsRank);
}
#endif
