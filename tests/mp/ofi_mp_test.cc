// Forked-process tests over the ofi transport (CTest label "mp"): each rank
// is its own process, SHOAL_TRANSPORT=ofi forces libfabric for every peer,
// FI_PROVIDER picks the provider ("tcp;ofi_rxm" on lo, or shm), and only the
// public C API is used. Covers the data of every collective at 2 and 3
// processes (over tcp;ofi_rxm also with several channels striped over several
// endpoints), grouped send/recv, and a SIGKILLed rank making the survivors
// fail naming it within the no-progress deadline; and ncclConfig_t.netName
// asking for ofi between emulated hosts with nothing else asking for it.
//
// Needs the transport registry to know "ofi" (transports/registry.cc). Every
// run is bounded by the harness watchdog; buffers stay at or under 1 MiB.
#include <nccl.h>

#include <signal.h>
#include <time.h>

#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "mp/mp_checks.h"
#include "mp/report_chain.h"
#include "support/mp_harness.h"

using namespace shoal::testing;  // mp_harness.h, mp_checks.h

namespace {

float sumOver(int n, size_t i) {
  float s = 0;
  for (int q = 0; q < n; ++q) s += value(q, i);
  return s;
}

int everyCollective(MpChild& c) {
  const int n = c.nranks(), r = c.rank();
  ncclComm_t comm = nullptr;
  CHILD_NCCL(c, initComm(c, &comm));
  {  // AllReduce sum, 1 MiB of float
    const size_t N = 262144;
    std::vector<float> send(N), recv(N, -1.f);
    for (size_t i = 0; i < N; ++i) send[i] = value(r, i);
    CHILD_NCCL(c, ncclAllReduce(send.data(), recv.data(), N, ncclFloat, ncclSum, comm, nullptr));
    CHILD_CHECK(c, expectFloats(c, "AllReduce", recv, [&](size_t i) { return sumOver(n, i); }), "AllReduce");
  }
  {  // AllReduce max in place, small
    std::vector<int32_t> buf(1000);
    for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<int32_t>((r * 7 + i) % 11) - 5;
    CHILD_NCCL(c, ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclInt32, ncclMax, comm, nullptr));
    for (size_t i = 0; i < buf.size(); ++i) {
      int32_t want = -1000;
      for (int q = 0; q < n; ++q) want = std::max(want, static_cast<int32_t>((q * 7 + i) % 11) - 5);
      CHILD_CHECK(c, buf[i] == want, "AllReduce max element " + std::to_string(i));
    }
  }
  {  // Broadcast from the last rank
    const size_t N = 100000;
    const int root = n - 1;
    std::vector<float> send(N), recv(N, -1.f);
    for (size_t i = 0; i < N; ++i) send[i] = value(r, i);
    CHILD_NCCL(c, ncclBroadcast(r == root ? send.data() : nullptr, recv.data(), N, ncclFloat, root, comm, nullptr));
    CHILD_CHECK(c, expectFloats(c, "Broadcast", recv, [&](size_t i) { return value(root, i); }), "Broadcast");
  }
  {  // Reduce to rank 1 % n
    const size_t N = 50000;
    const int root = 1 % n;
    std::vector<float> send(N), recv(N, -1.f);
    for (size_t i = 0; i < N; ++i) send[i] = value(r, i);
    CHILD_NCCL(c, ncclReduce(send.data(), r == root ? recv.data() : nullptr, N, ncclFloat, ncclSum, root, comm,
                             nullptr));
    if (r == root) CHILD_CHECK(c, expectFloats(c, "Reduce", recv, [&](size_t i) { return sumOver(n, i); }), "Reduce");
  }
  {  // AllGather
    const size_t N = 32768;
    std::vector<float> send(N), recv(N * n, -1.f);
    for (size_t i = 0; i < N; ++i) send[i] = value(r, i);
    CHILD_NCCL(c, ncclAllGather(send.data(), recv.data(), N, ncclFloat, comm, nullptr));
    CHILD_CHECK(c, expectFloats(c, "AllGather", recv, [&](size_t j) { return value(static_cast<int>(j / N), j % N); }),
                "AllGather");
  }
  {  // ReduceScatter
    const size_t N = 32768;
    std::vector<float> send(N * n), recv(N, -1.f);
    for (size_t j = 0; j < N * n; ++j) send[j] = value(r, j);
    CHILD_NCCL(c, ncclReduceScatter(send.data(), recv.data(), N, ncclFloat, ncclSum, comm, nullptr));
    CHILD_CHECK(c, expectFloats(c, "ReduceScatter", recv,
                                [&](size_t i) { return sumOver(n, static_cast<size_t>(r) * N + i); }),
                "ReduceScatter");
  }
  {  // AlltoAll
    const size_t N = 16384;
    std::vector<float> send(N * n), recv(N * n, -1.f);
    for (size_t j = 0; j < N * n; ++j) send[j] = value(r, j);
    CHILD_NCCL(c, ncclAlltoAll(send.data(), recv.data(), N, ncclFloat, comm, nullptr));
    CHILD_CHECK(c, expectFloats(c, "AlltoAll", recv, [&](size_t j) {
                  return value(static_cast<int>(j / N), static_cast<size_t>(r) * N + j % N);
                }),
                "AlltoAll");
  }
  {  // Gather to rank 0, Scatter from the last rank
    const size_t N = 16384;
    std::vector<float> send(N), recv(r == 0 ? N * n : 0, -1.f);
    for (size_t i = 0; i < N; ++i) send[i] = value(r, i);
    CHILD_NCCL(c, ncclGather(send.data(), r == 0 ? recv.data() : nullptr, N, ncclFloat, 0, comm, nullptr));
    if (r == 0)
      CHILD_CHECK(c, expectFloats(c, "Gather", recv, [&](size_t j) { return value(static_cast<int>(j / N), j % N); }),
                  "Gather");
    const int root = n - 1;
    std::vector<float> all(r == root ? N * n : 0), mine(N, -1.f);
    for (size_t j = 0; j < all.size(); ++j) all[j] = value(r, j);
    CHILD_NCCL(c, ncclScatter(r == root ? all.data() : nullptr, mine.data(), N, ncclFloat, root, comm, nullptr));
    CHILD_CHECK(c, expectFloats(c, "Scatter", mine, [&](size_t i) { return value(root, static_cast<size_t>(r) * N + i); }),
                "Scatter");
  }
  {  // grouped send/recv: a ring shift of 1 MiB
    const size_t N = 262144;
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    std::vector<float> send(N), recv(N, -1.f);
    for (size_t i = 0; i < N; ++i) send[i] = value(r, i);
    CHILD_NCCL(c, ncclGroupStart());
    CHILD_NCCL(c, ncclSend(send.data(), N, ncclFloat, next, comm, nullptr));
    CHILD_NCCL(c, ncclRecv(recv.data(), N, ncclFloat, prev, comm, nullptr));
    CHILD_NCCL(c, ncclGroupEnd());
    CHILD_CHECK(c, expectFloats(c, "ring send/recv", recv, [&](size_t i) { return value(prev, i); }), "send/recv");
  }
  ncclResult_t async = ncclInternalError;
  CHILD_NCCL(c, ncclCommGetAsyncError(comm, &async));
  CHILD_CHECK(c, async == ncclSuccess, "async error after healthy collectives");
  CHILD_NCCL(c, ncclCommFinalize(comm));
  CHILD_NCCL(c, ncclCommDestroy(comm));
  return 0;
}

// A loop of AllReduces; `victim` SIGKILLs itself at iteration `killAt`. The
// survivors' call must fail (remote error) naming the victim, within
// `failWithinMs` where given. (The victim dies a moment after its last
// collective: by then the probes that vouch for its tcp listener, made as its
// connections were, are done.)
int killOneRank(MpChild& c, int victim, int killAt, double failWithinMs = 0) {
  const int r = c.rank();
  ncclComm_t comm = nullptr;
  CHILD_NCCL(c, initComm(c, &comm));
  std::vector<float> send(65536), recv(65536);
  for (size_t i = 0; i < send.size(); ++i) send[i] = value(r, i);
  for (int it = 0; it < 1000; ++it) {
    if (r == victim && it == killAt) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      ::raise(SIGKILL);
    }
    double t0 = monoMs();
    ncclResult_t rc = ncclAllReduce(send.data(), recv.data(), send.size(), ncclFloat, ncclSum, comm, nullptr);
    double ms = monoMs() - t0;
    if (rc == ncclSuccess) continue;
    std::string last = ncclGetLastError(nullptr);
    c.log("iteration " + std::to_string(it) + " failed after " + std::to_string(static_cast<int>(ms)) +
          " ms: " + describe(rc));
    CHILD_CHECK(c, it >= killAt, "a collective failed before the victim died");
    CHILD_CHECK(c, rc == ncclRemoteError, "expected ncclRemoteError, got " + describe(rc));
    CHILD_CHECK(c, failWithinMs <= 0 || ms < failWithinMs, "the survivor took too long to fail: " + last);
    CHILD_CHECK(c, last.find("rank " + std::to_string(victim)) != std::string::npos,
                "the error does not name rank " + std::to_string(victim) + ": " + last);
    bool released = c.barrier();
    CHILD_NCCL(c, ncclCommAbort(comm));
    CHILD_CHECK(c, released, "the other ranks did not finish");
    return 0;
  }
  c.log("every AllReduce succeeded although a rank died");
  return 1;
}

// Two emulated hosts (NCCL_HOSTID) whose communicator asks for ofi by
// ncclConfig_t.netName only (no SHOAL_TRANSPORT, NCCL_NET or FI_PROVIDER):
// ofi must start for it, carry the data, and be the network link the tuner
// models (the log's "(ofi"). (Where libfabric's default provider is a
// hardware one, ofi would be modelled without netName too.)
int netNameOfi(MpChild& c, const std::string& logPrefix) {
  const std::string logPath = logPrefix + std::to_string(c.rank());
  ::unlink(logPath.c_str());  // the log is appended to
  ::unsetenv("FI_PROVIDER");  // it would start ofi by itself
  ::setenv("NCCL_HOSTID", ("netname-host" + std::to_string(c.rank())).c_str(), 1);
  ::setenv("NCCL_DEBUG_FILE", logPath.c_str(), 1);
  ncclUniqueId id;
  CHILD_CHECK(c, c.uniqueId(&id), "no unique id");
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.netName = "OFI";
  ncclComm_t comm = nullptr;
  CHILD_NCCL(c, ncclCommInitRankConfig(&comm, c.nranks(), id, c.rank(), &config));
  std::vector<float> buf(4096);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = value(c.rank(), i);
  CHILD_NCCL(c, ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat, ncclSum, comm, nullptr));
  CHILD_CHECK(c, expectFloats(c, "AllReduce", buf, [&](size_t i) { return sumOver(c.nranks(), i); }), "AllReduce");
  CHILD_CHECK(c, c.barrier(), "the other rank did not finish");
  CHILD_NCCL(c, ncclCommDestroy(comm));
  std::ifstream in(logPath);
  std::stringstream text;
  text << in.rdbuf();
  ::unlink(logPath.c_str());
  CHILD_CHECK(c, text.str().find("ofi: connected to") != std::string::npos, "no ofi connection in the log");
  std::string tunerLine;
  for (std::string line; std::getline(text, line);)
    if (line.find("tuner:") != std::string::npos) tunerLine = line;
  CHILD_CHECK(c, tunerLine.find(", across net (ofi") != std::string::npos,
              "the tuner does not model an ofi network link: " + tunerLine);
  return 0;
}

MpConfig ofiConfig(int nranks, const std::string& provider) {
  MpConfig cfg;
  cfg.nranks = nranks;
  cfg.hardLimitMs = 60000;
  cfg.env = {{"SHOAL_TRANSPORT", "ofi"}, {"FI_PROVIDER", provider}, {"FI_TCP_IFACE", "lo"},
             {"NCCL_SOCKET_IFNAME", "lo"}};
  return cfg;
}

void requirePassed(const MpResult& res) {
  INFO(res.report());
  REQUIRE_FALSE(res.timedOut);
  REQUIRE(res.allPassed());
}

}  // namespace

TEST_CASE("mp ofi: every collective over tcp and ofi_rxm at 2 and 3 processes", "[mp][ofi]") {
  for (int n : {2, 3}) {
    INFO("nranks " << n);
    requirePassed(runForked(ofiConfig(n, "tcp;ofi_rxm"), everyCollective));
  }
}

// (No ';' in test names: CTest's test discovery splits a name there.)
TEST_CASE("mp ofi: every collective over tcp and ofi_rxm, several channels over several endpoints each",
          "[mp][ofi]") {
  // Each process opens 3 endpoints per rail; 2 channels per peer, each
  // striping its large messages over the 3 endpoints (3 TCP streams per
  // channel); the data of every collective is checked.
  for (int n : {2, 3}) {
    INFO("nranks " << n);
    MpConfig cfg = ofiConfig(n, "tcp;ofi_rxm");
    cfg.env.emplace_back("NCCL_NSOCKS_PERTHREAD", "3");
    cfg.env.emplace_back("NCCL_MIN_NCHANNELS", "2");
    requirePassed(runForked(cfg, everyCollective));
  }
}

TEST_CASE("mp ofi: every collective over shm at 2 and 3 processes", "[mp][ofi]") {
  for (int n : {2, 3}) {
    INFO("nranks " << n);
    requirePassed(runForked(ofiConfig(n, "shm"), everyCollective));
  }
}

TEST_CASE("mp ofi: a forced ofi whose provider is absent fails init with a clear error", "[mp][ofi]") {
  MpResult res = runForked(ofiConfig(2, "nosuchprovider"), [](MpChild& c) {
    ncclComm_t comm = nullptr;
    ncclResult_t rc = initComm(c, &comm);
    if (rc == ncclSuccess) {  // connections may be made at the first collective
      std::vector<float> buf(16, 1.f);
      rc = ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat, ncclSum, comm, nullptr);
    }
    std::string last = ncclGetLastError(nullptr);
    c.log("returned " + describe(rc));
    CHILD_CHECK(c, rc != ncclSuccess, "a collective succeeded without a provider");
    CHILD_CHECK(c, last.find("ofi") != std::string::npos, "the error does not mention ofi: " + last);
    c.barrier();
    if (comm != nullptr) (void)ncclCommAbort(comm);
    return 0;
  });
  requirePassed(res);
}

TEST_CASE("mp ofi: a SIGKILLed rank makes the survivors fail naming it", "[mp][ofi][failure]") {
  for (const char* provider : {"tcp;ofi_rxm", "shm"}) {
    INFO(provider);
    MpConfig cfg = ofiConfig(3, provider);
    cfg.hardLimitMs = 45000;
    // The provider reports nothing for a peer that is gone: a survivor's
    // stalled operation finds the exit by a probe of the victim's tcp
    // listener, within a few idle-check intervals, not at the no-progress
    // deadline (beyond the test's limit).
    cfg.env.emplace_back("SHOAL_PROGRESS_TIMEOUT_MS", "600000");
    cfg.env.emplace_back("SHOAL_IDLE_CHECK_MS", "500");
    const int victim = 2;
    MpResult res = runForked(cfg, [&](MpChild& c) { return killOneRank(c, victim, 5); });
    INFO(res.report());
    REQUIRE_FALSE(res.timedOut);
    for (const auto& rr : res.ranks) {
      if (rr.rank == victim) CHECK(rr.termSignal == SIGKILL);
      else CHECK((rr.exited && rr.exitCode == 0));
    }
  }
}

TEST_CASE("mp ofi: ncclConfig_t.netName=OFI alone starts ofi for other hosts, and the tuner models it",
          "[mp][ofi]") {
  MpConfig cfg;
  cfg.nranks = 2;
  cfg.env = {{"SHOAL_TRANSPORT", ""}, {"NCCL_NET", ""}, {"FI_TCP_IFACE", "lo"}, {"NCCL_SOCKET_IFNAME", "lo"},
             {"NCCL_DEBUG", "INFO"}, {"NCCL_DEBUG_SUBSYS", "INIT,NET,TUNING"}};
  const std::string logPrefix = "/tmp/shoal-netname-" + std::to_string(::getpid()) + "-rank";
  MpResult res = runForked(cfg, [&](MpChild& c) { return netNameOfi(c, logPrefix); });
  for (int r = 0; r < cfg.nranks; ++r) ::unlink((logPrefix + std::to_string(r)).c_str());
  requirePassed(res);
}

// One AllReduce of 4096 floats, timed and logged: what it returned, after
// how long, and ncclGetLastError.
struct TimedCall {
  ncclResult_t rc;
  double ms;
  std::string last;
};
TimedCall timedAllReduce(MpChild& c, ncclComm_t comm) {
  std::vector<float> buf(4096, 1.f);
  const double t0 = monoMs();
  const ncclResult_t rc = ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat, ncclSum, comm, nullptr);
  const double ms = monoMs() - t0;
  std::string last = ncclGetLastError(nullptr);
  c.log("AllReduce returned " + describe(rc) + " after " + std::to_string(static_cast<int>(ms)) + " ms: " + last);
  return {rc, ms, std::move(last)};
}

// Ranks given different networks (ncclConfig_t.netName): rank 0 is forced to
// ofi, which rank 1 never starts, so rank 0 cannot connect and fails at once;
// rank 1, forced to tcp, waits to be connected to by rank 0 and must learn
// why within seconds (rank 0's failure report), not at the set-up deadline.
int netNamesDiffer(MpChild& c) {
  ::unsetenv("FI_PROVIDER");  // it would start ofi by itself
  ::setenv("NCCL_HOSTID", ("netnames-host" + std::to_string(c.rank())).c_str(), 1);
  ncclUniqueId id;
  CHILD_CHECK(c, c.uniqueId(&id), "no unique id");
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.netName = c.rank() == 0 ? "OFI" : "Socket";
  ncclComm_t comm = nullptr;
  CHILD_NCCL(c, ncclCommInitRankConfig(&comm, c.nranks(), id, c.rank(), &config));
  const auto [rc, ms, last] = timedAllReduce(c, comm);
  CHILD_CHECK(c, c.barrier(), "the other rank did not finish");  // rank 0 keeps the root alive till then
  CHILD_CHECK(c, rc != ncclSuccess && rc != ncclInProgress, "the AllReduce succeeded");
  CHILD_CHECK(c, ms < 15000, "the AllReduce took more than 15 s to fail");
  CHILD_CHECK(c, last.find("forced transport ofi (ncclConfig_t.netName=OFI) cannot reach rank 1") != std::string::npos,
              "the error does not say why rank 0 cannot connect: " + last);
  if (c.rank() == 1)
    CHILD_CHECK(c, last.find("rank 0 will not connect: it failed") != std::string::npos,
                "rank 1's error does not say that rank 0 failed: " + last);
  (void)ncclCommAbort(comm);
  return 0;
}

TEST_CASE("mp ofi: ranks given different networks fail within seconds, both naming the cause", "[mp][ofi]") {
  MpConfig cfg;
  cfg.nranks = 2;
  cfg.hardLimitMs = 60000;
  cfg.env = {{"SHOAL_TRANSPORT", ""}, {"NCCL_NET", ""}, {"FI_TCP_IFACE", "lo"}, {"NCCL_SOCKET_IFNAME", "lo"}};
  requirePassed(runForked(cfg, netNamesDiffer));
}

// A rank killed between init and its first collective: over ofi nothing
// tells its peers (the provider reports nothing, no connection was made, and
// ofi has no probe of its own). Its connection to the bootstrap root ends
// with its process, the root writes the failure report the rank left there
// at init (its will), and the survivors' connects fail within seconds naming
// it, not at the no-progress deadline.
TEST_CASE("mp ofi: a rank killed before its first collective is named within seconds", "[mp][ofi][failure]") {
  MpConfig cfg = ofiConfig(3, "tcp;ofi_rxm");
  cfg.hardLimitMs = 60000;
  cfg.env.emplace_back("SHOAL_PROGRESS_TIMEOUT_MS", "600000");
  const int victim = 2;  // rank 0 serves the bootstrap root
  MpResult res = runForked(cfg, [&](MpChild& c) { return killOneRank(c, victim, 0, 20000); });
  INFO(res.report());
  REQUIRE_FALSE(res.timedOut);
  CHECK(res.onlyVictimKilled(victim));
}

// A connect that times out waiting for a peer reads that peer's report as
// a stalled operation does: rank 1's connect to rank 2 (alive, not calling)
// fails at the no-progress deadline, rank 2 is SIGKILLed 300 ms later, and
// rank 1's final report, then rank 0's error, say that its process ended
// (tests/mp/report_chain.h).
TEST_CASE("mp ofi: a connect that timed out names the peer's death that came after it", "[mp][ofi][failure]") {
  constexpr int kTimeoutMs = 2000;
  MpConfig cfg = ofiConfig(3, "tcp;ofi_rxm");
  cfg.env.push_back({"SHOAL_PROGRESS_TIMEOUT_MS", std::to_string(kTimeoutMs)});
  MpResult res = runForked(cfg, [&](MpChild& c) { return firstCauseAfterItsEffects(c, kTimeoutMs, false); });
  INFO(res.report());
  REQUIRE_FALSE(res.timedOut);
  CHECK(res.onlyVictimKilled(2));
}

// The process that served the bootstrap root (rank 0's) killed between a
// split and the split's first collective: the survivors' connects to it
// find no will (the store went with it) and ofi has no probe of its own;
// they borrow the tcp listener probe that found rank 0's process alive for
// the parent's connections, and fail within seconds naming it, not at the
// no-progress deadline.
TEST_CASE("mp ofi: the root's process killed before a split's first collective is named within seconds",
          "[mp][ofi][failure]") {
  MpConfig cfg = ofiConfig(3, "tcp;ofi_rxm");
  cfg.env.emplace_back("SHOAL_PROGRESS_TIMEOUT_MS", "30000");
  MpResult res = runForked(cfg, [](MpChild& c) -> int {
    ncclComm_t parent = nullptr, child = nullptr;
    CHILD_NCCL(c, initComm(c, &parent));
    std::vector<float> buf(4096, 1.f);
    CHILD_NCCL(c, ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat, ncclSum, parent, nullptr));
    CHILD_NCCL(c, ncclCommSplit(parent, 0, c.rank(), &child, nullptr));
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the probes of the parent's peers are made
    CHILD_CHECK(c, c.barrier(), "barrier before the kill");
    if (c.rank() == 0) ::raise(SIGKILL);
    const auto [rc, ms, last] = timedAllReduce(c, child);
    CHILD_CHECK(c, rc == ncclRemoteError, "the split's AllReduce did not fail as remote: " + describe(rc));
    CHILD_CHECK(c, ms < 10000, "the split's AllReduce took more than 10 s to fail");
    CHILD_CHECK(c, last.find("rank 0") != std::string::npos && last.find("its process has exited") != std::string::npos,
                "the error does not say that rank 0's process exited: " + last);
    (void)ncclCommAbort(child);
    (void)ncclCommAbort(parent);
    CHILD_CHECK(c, c.barrier(), "the other survivor did not finish");
    return 0;
  });
  INFO(res.report());
  REQUIRE_FALSE(res.timedOut);
  CHECK(res.onlyVictimKilled(0));
}

// Over ofi nothing tells a rank that a peer destroyed its communicator: a
// connect to it would wait for the deadline. Its leave record in the store
// says so, and the connect fails within seconds naming it. The leaver stays
// alive (it keeps the bootstrap root) until the others are done.
TEST_CASE("mp ofi: a rank that destroyed its communicator before the first collective is named within seconds",
          "[mp][ofi][failure]") {
  MpConfig cfg = ofiConfig(2, "tcp;ofi_rxm");
  cfg.env.emplace_back("SHOAL_PROGRESS_TIMEOUT_MS", "600000");
  cfg.env.emplace_back("SHOAL_INIT_TIMEOUT_MS", "600000");
  MpResult res = runForked(cfg, [](MpChild& c) -> int {
    ncclUniqueId id;
    CHILD_CHECK(c, c.uniqueId(&id), "no unique id");
    ncclComm_t comm = nullptr;
    CHILD_NCCL(c, ncclCommInitRank(&comm, c.nranks(), id, c.rank()));
    if (c.rank() == 0) {
      CHILD_NCCL(c, ncclCommDestroy(comm));
      CHILD_CHECK(c, c.barrier(), "rank 1 did not finish");
      return 0;
    }
    const auto [rc, ms, last] = timedAllReduce(c, comm);
    CHILD_CHECK(c, rc == ncclRemoteError, "the AllReduce did not fail as remote");
    CHILD_CHECK(c, ms < 20000, "the AllReduce took more than 20 s to fail");
    CHILD_CHECK(c, last.find("rank 0 will not connect: it destroyed or aborted its communicator") != std::string::npos,
                "the error does not say that rank 0 left: " + last);
    (void)ncclCommDestroy(comm);
    CHILD_CHECK(c, c.barrier(), "rank 0 did not finish");
    return 0;
  });
  requirePassed(res);
}
