// Forked-process tests (CTest label "mp"): each rank is its own process, the
// ranks talk over tcp on 127.0.0.1 (NCCL_SOCKET_IFNAME=lo, SHOAL_TRANSPORT=tcp)
// or, where a test says so, over shared memory (SHOAL_TRANSPORT=shm),
// and only the public C API (nccl.h) is used. Covers data correctness of every
// collective at 2, 3 and 4 processes, grouped send/recv, abort, and the failure
// conventions of docs/nccl-compat.md, "Errors": a SIGKILLed rank, a rank
// that stops calling (no-progress deadline), a rank that never joins init
// (init deadline), and stray connections to the bootstrap root.
//
// Every run is bounded by the harness watchdog (tests/support/mp_harness.h);
// sizes stay at or under 1 MiB per buffer (the test machine has 2 cores).
#include <nccl.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "mp/mp_checks.h"
#include "mp/report_chain.h"
#include "support/mp_harness.h"

using namespace shoal::testing;  // mp_harness.h, mp_checks.h

namespace {

// Whether an error text names `rank` as a peer: "rank 2", or a list after
// "rank"/"ranks" such as "ranks: 0-1, 2" or "1 rank: 2". A rank's description
// of itself ("rank 2/4", "rank 2 of 4") does not count.
bool namesRank(const std::string& text, int rank) {
  for (size_t at = text.find("rank"); at != std::string::npos; at = text.find("rank", at + 4)) {
    size_t i = at + 4;
    if (i < text.size() && text[i] == 's') ++i;
    if (i < text.size() && text[i] == ':') ++i;
    // A list of numbers and ranges: "2", "0-1, 3".
    while (true) {
      while (i < text.size() && text[i] == ' ') ++i;
      if (i >= text.size() || !std::isdigit(static_cast<unsigned char>(text[i]))) break;
      size_t end = i;
      long lo = std::strtol(text.c_str() + i, nullptr, 10);
      while (end < text.size() && std::isdigit(static_cast<unsigned char>(text[end]))) ++end;
      long hi = lo;
      if (end + 1 < text.size() && text[end] == '-' && std::isdigit(static_cast<unsigned char>(text[end + 1]))) {
        hi = std::strtol(text.c_str() + end + 1, nullptr, 10);
        ++end;
        while (end < text.size() && std::isdigit(static_cast<unsigned char>(text[end]))) ++end;
      }
      bool self = (end < text.size() && text[end] == '/') || text.compare(end, 4, " of ") == 0;
      if (!self && lo <= rank && rank <= hi) return true;
      i = end;
      if (i < text.size() && text[i] == ',') ++i;
      else break;
    }
  }
  return false;
}

void requirePassed(const MpResult& res) {
  INFO(res.report());
  REQUIRE_FALSE(res.timedOut);
  REQUIRE(res.allPassed());
}

// ---- every collective -------------------------------------------------------

int everyCollective(MpChild& c) {
  const int n = c.nranks(), r = c.rank();
  ncclComm_t comm = nullptr;
  CHILD_NCCL(c, initComm(c, &comm));
  int count = 0, rank = -1;
  CHILD_NCCL(c, ncclCommCount(comm, &count));
  CHILD_NCCL(c, ncclCommUserRank(comm, &rank));
  CHILD_CHECK(c, count == n && rank == r, "Count/UserRank disagree with the init arguments");

  {  // AllReduce sum, 1 MiB of float
    const size_t N = 262144;
    std::vector<float> send(N), recv(N, -1.f);
    for (size_t i = 0; i < N; ++i) send[i] = value(r, i);
    CHILD_NCCL(c, ncclAllReduce(send.data(), recv.data(), N, ncclFloat, ncclSum, comm, nullptr));
    bool ok = expectFloats(c, "AllReduce", recv, [&](size_t i) {
      float s = 0;
      for (int q = 0; q < n; ++q) s += value(q, i);
      return s;
    });
    CHILD_CHECK(c, ok, "AllReduce data");
  }
  {  // AllReduce max, in place, int32
    const size_t N = 1000;
    std::vector<int32_t> buf(N);
    for (size_t i = 0; i < N; ++i) buf[i] = static_cast<int32_t>((r * 7 + i) % 11) - 5;
    CHILD_NCCL(c, ncclAllReduce(buf.data(), buf.data(), N, ncclInt32, ncclMax, comm, nullptr));
    for (size_t i = 0; i < N; ++i) {
      int32_t want = -1000;
      for (int q = 0; q < n; ++q) want = std::max(want, static_cast<int32_t>((q * 7 + i) % 11) - 5);
      CHILD_CHECK(c, buf[i] == want, "in-place AllReduce max element " + std::to_string(i));
    }
  }
  {  // Broadcast from the last rank
    const size_t N = 100000;
    const int root = n - 1;
    std::vector<float> send(N), recv(N, -1.f);
    for (size_t i = 0; i < N; ++i) send[i] = value(r, i);
    CHILD_NCCL(c, ncclBroadcast(r == root ? send.data() : nullptr, recv.data(), N, ncclFloat, root,
                                comm, nullptr));
    CHILD_CHECK(c, expectFloats(c, "Broadcast", recv, [&](size_t i) { return value(root, i); }),
                "Broadcast data");
  }
  {  // Reduce to rank 1 % n; non-roots pass a NULL recvbuff
    const size_t N = 50000;
    const int root = 1 % n;
    std::vector<float> send(N), recv(N, -1.f);
    for (size_t i = 0; i < N; ++i) send[i] = value(r, i);
    CHILD_NCCL(c, ncclReduce(send.data(), r == root ? recv.data() : nullptr, N, ncclFloat, ncclSum,
                             root, comm, nullptr));
    if (r == root) {
      bool ok = expectFloats(c, "Reduce", recv, [&](size_t i) {
        float s = 0;
        for (int q = 0; q < n; ++q) s += value(q, i);
        return s;
      });
      CHILD_CHECK(c, ok, "Reduce data");
    }
  }
  {  // AllGather
    const size_t N = 32768;
    std::vector<float> send(N), recv(N * n, -1.f);
    for (size_t i = 0; i < N; ++i) send[i] = value(r, i);
    CHILD_NCCL(c, ncclAllGather(send.data(), recv.data(), N, ncclFloat, comm, nullptr));
    CHILD_CHECK(c, expectFloats(c, "AllGather", recv, [&](size_t j) {
                  return value(static_cast<int>(j / N), j % N);
                }),
                "AllGather data");
  }
  {  // ReduceScatter
    const size_t N = 32768;
    std::vector<float> send(N * n), recv(N, -1.f);
    for (size_t j = 0; j < N * n; ++j) send[j] = value(r, j);
    CHILD_NCCL(c, ncclReduceScatter(send.data(), recv.data(), N, ncclFloat, ncclSum, comm, nullptr));
    bool ok = expectFloats(c, "ReduceScatter", recv, [&](size_t i) {
      float s = 0;
      for (int q = 0; q < n; ++q) s += value(q, static_cast<size_t>(r) * N + i);
      return s;
    });
    CHILD_CHECK(c, ok, "ReduceScatter data");
  }
  {  // AlltoAll
    const size_t N = 16384;
    std::vector<float> send(N * n), recv(N * n, -1.f);
    for (size_t j = 0; j < N * n; ++j) send[j] = value(r, j);
    CHILD_NCCL(c, ncclAlltoAll(send.data(), recv.data(), N, ncclFloat, comm, nullptr));
    bool ok = expectFloats(c, "AlltoAll", recv, [&](size_t j) {
      int from = static_cast<int>(j / N);
      return value(from, static_cast<size_t>(r) * N + j % N);
    });
    CHILD_CHECK(c, ok, "AlltoAll data");
  }
  {  // Gather to rank 0; non-roots pass a NULL recvbuff
    const size_t N = 16384;
    std::vector<float> send(N), recv(r == 0 ? N * n : 0, -1.f);
    for (size_t i = 0; i < N; ++i) send[i] = value(r, i);
    CHILD_NCCL(c, ncclGather(send.data(), r == 0 ? recv.data() : nullptr, N, ncclFloat, 0, comm,
                             nullptr));
    if (r == 0)
      CHILD_CHECK(c, expectFloats(c, "Gather", recv, [&](size_t j) {
                    return value(static_cast<int>(j / N), j % N);
                  }),
                  "Gather data");
  }
  {  // Scatter from the last rank; non-roots pass a NULL sendbuff
    const size_t N = 16384;
    const int root = n - 1;
    std::vector<float> send(r == root ? N * n : 0), recv(N, -1.f);
    for (size_t j = 0; j < send.size(); ++j) send[j] = value(r, j);
    CHILD_NCCL(c, ncclScatter(r == root ? send.data() : nullptr, recv.data(), N, ncclFloat, root,
                              comm, nullptr));
    CHILD_CHECK(c, expectFloats(c, "Scatter", recv, [&](size_t i) {
                  return value(root, static_cast<size_t>(r) * N + i);
                }),
                "Scatter data");
  }
  ncclResult_t async = ncclInternalError;
  CHILD_NCCL(c, ncclCommGetAsyncError(comm, &async));
  CHILD_CHECK(c, async == ncclSuccess, "async error after healthy collectives");
  CHILD_NCCL(c, ncclCommFinalize(comm));
  CHILD_NCCL(c, ncclCommDestroy(comm));
  return 0;
}

// ---- send/recv --------------------------------------------------------------

int groupedSendRecv(MpChild& c) {
  const int n = c.nranks(), r = c.rank();
  ncclComm_t comm = nullptr;
  CHILD_NCCL(c, initComm(c, &comm));
  {  // ring shift of 1 MiB: send to r+1, receive from r-1, in one group
    const size_t N = 262144;
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    std::vector<float> send(N), recv(N, -1.f);
    for (size_t i = 0; i < N; ++i) send[i] = value(r, i);
    CHILD_NCCL(c, ncclGroupStart());
    CHILD_NCCL(c, ncclSend(send.data(), N, ncclFloat, next, comm, nullptr));
    CHILD_NCCL(c, ncclRecv(recv.data(), N, ncclFloat, prev, comm, nullptr));
    CHILD_NCCL(c, ncclGroupEnd());
    CHILD_CHECK(c, expectFloats(c, "ring send/recv", recv, [&](size_t i) { return value(prev, i); }),
                "ring data");
  }
  {  // all-to-all as grouped send/recv to every other peer, two messages per
     // peer (the k-th send to a peer matches its k-th recv), plus zero-byte ones
    const size_t N = 4096;
    std::vector<std::vector<float>> send(n), recvA(n), recvB(n);
    for (int p = 0; p < n; ++p) {
      send[p].resize(2 * N);
      for (size_t i = 0; i < 2 * N; ++i) send[p][i] = value(r * 4 + p, i);
      recvA[p].assign(N, -1.f);
      recvB[p].assign(N, -1.f);
    }
    CHILD_NCCL(c, ncclGroupStart());
    for (int p = 0; p < n; ++p) {
      if (p == r) continue;
      CHILD_NCCL(c, ncclSend(send[p].data(), N, ncclFloat, p, comm, nullptr));
      CHILD_NCCL(c, ncclSend(send[p].data() + N, N, ncclFloat, p, comm, nullptr));
      CHILD_NCCL(c, ncclSend(nullptr, 0, ncclFloat, p, comm, nullptr));
      CHILD_NCCL(c, ncclRecv(recvA[p].data(), N, ncclFloat, p, comm, nullptr));
      CHILD_NCCL(c, ncclRecv(recvB[p].data(), N, ncclFloat, p, comm, nullptr));
      CHILD_NCCL(c, ncclRecv(nullptr, 0, ncclFloat, p, comm, nullptr));
    }
    CHILD_NCCL(c, ncclGroupEnd());
    for (int p = 0; p < n; ++p) {
      if (p == r) continue;
      CHILD_CHECK(c, expectFloats(c, "pairwise first", recvA[p], [&](size_t i) { return value(p * 4 + r, i); }),
                  "pairwise first message from rank " + std::to_string(p));
      CHILD_CHECK(c, expectFloats(c, "pairwise second", recvB[p], [&](size_t i) { return value(p * 4 + r, N + i); }),
                  "pairwise second message from rank " + std::to_string(p));
    }
  }
  CHILD_NCCL(c, ncclCommDestroy(comm));
  return 0;
}

// ---- failures ---------------------------------------------------------------

// The survivors' side of a failure: the call failed; check how. The survivor
// waits (harness barrier) until every other survivor has failed too before it
// aborts, so that its own teardown cannot be what the others report.
int checkFailure(MpChild& c, ncclComm_t comm, ncclResult_t rc, double callMs, int culprit,
                 double maxMs, bool deadlineExpected) {
  std::string last = ncclGetLastError(nullptr);
  char line[160];
  std::snprintf(line, sizeof(line), "failing call took %.0f ms and returned ", callMs);
  c.log(std::string(line) + describe(rc));
  ncclResult_t async = ncclSuccess;
  ncclResult_t asyncRc = ncclCommGetAsyncError(comm, &async);
  bool released = c.barrier();
  CHILD_CHECK(c, released, "the other ranks did not finish");
  int failed = 0;
  auto expect = [&](bool ok, const std::string& what) {
    if (!ok) {
      c.log("CHECK FAILED: " + what);
      failed = 1;
    }
  };
  // A dead peer and a peer that stopped (the no-progress deadline) are both
  // ncclRemoteError (docs/nccl-compat.md); nothing else will do.
  expect(rc == ncclRemoteError, "expected ncclRemoteError, got " + describe(rc));
  expect(callMs < maxMs, "the survivor took too long to fail: " + std::to_string(callMs) + " ms");
  if (deadlineExpected) expect(callMs >= 1000, "failed before the no-progress deadline could expire");
  expect(namesRank(last, culprit),
         "ncclGetLastError does not name rank " + std::to_string(culprit) + ": " + last);
  expect(asyncRc == ncclSuccess && async != ncclSuccess && async != ncclInProgress,
         "ncclCommGetAsyncError does not report the failure");
  double t0 = monoMs();
  CHILD_NCCL(c, ncclCommAbort(comm));
  CHILD_CHECK(c, monoMs() - t0 < 5000, "ncclCommAbort took more than 5 s after a failure");
  return failed;
}

// A loop of AllReduces; `victim` SIGKILLs itself at iteration `killAt`; the
// survivors must fail within `failWithinMs`.
int killOneRank(MpChild& c, int victim, int killAt, double failWithinMs = 30000) {
  const int r = c.rank();
  ncclComm_t comm = nullptr;
  CHILD_NCCL(c, initComm(c, &comm));
  const size_t N = 65536;  // 256 KiB
  std::vector<float> send(N), recv(N);
  for (size_t i = 0; i < N; ++i) send[i] = value(r, i);
  for (int it = 0; it < 1000; ++it) {
    if (r == victim && it == killAt) {
      c.log("killing myself (SIGKILL) at iteration " + std::to_string(it));
      ::raise(SIGKILL);
    }
    double t0 = monoMs();
    ncclResult_t rc = ncclAllReduce(send.data(), recv.data(), N, ncclFloat, ncclSum, comm, nullptr);
    double ms = monoMs() - t0;
    if (rc != ncclSuccess) {
      c.log("iteration " + std::to_string(it) + " failed");
      CHILD_CHECK(c, it >= killAt, "a collective failed before the victim died");
      return checkFailure(c, comm, rc, ms, victim, failWithinMs, false);
    }
  }
  c.log("every AllReduce succeeded although rank " + std::to_string(victim) + " died");
  return 1;
}

// An AllReduce that rank 0 groups with a Send to rank 1 and the others call
// alone (rank 1 then receives): every rank must run the same algorithm for
// it, the peer-reading one that SHOAL_ALGO=peer_read asks for included.
int collectiveBesideSend(MpChild& c) {
  const int n = c.nranks(), r = c.rank();
  // Peer reads between sibling processes need process_vm_readv, which Yama's
  // ptrace_scope=1 allows only to a process named its tracer: any, here.
  ::prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
  ncclComm_t comm = nullptr;
  CHILD_NCCL(c, initComm(c, &comm));
  const size_t N = 20000;
  std::vector<float> send(N), reduced(N, -1.f), got(N, -1.f);
  for (size_t i = 0; i < N; ++i) send[i] = value(r, i);
  if (r == 0) {
    CHILD_NCCL(c, ncclGroupStart());
    CHILD_NCCL(c, ncclAllReduce(send.data(), reduced.data(), N, ncclFloat, ncclSum, comm, nullptr));
    CHILD_NCCL(c, ncclSend(send.data(), N, ncclFloat, 1, comm, nullptr));
    CHILD_NCCL(c, ncclGroupEnd());
  } else {
    CHILD_NCCL(c, ncclAllReduce(send.data(), reduced.data(), N, ncclFloat, ncclSum, comm, nullptr));
    if (r == 1) {
      CHILD_NCCL(c, ncclRecv(got.data(), N, ncclFloat, 0, comm, nullptr));
      CHILD_CHECK(c, expectFloats(c, "Recv", got, [&](size_t i) { return value(0, i); }), "Recv data");
    }
  }
  CHILD_CHECK(c, expectFloats(c, "AllReduce", reduced, [&](size_t i) {
    float s = 0;
    for (int q = 0; q < n; ++q) s += value(q, i);
    return s;
  }), "AllReduce data");
  CHILD_CHECK(c, c.barrier(), "the other ranks did not finish");
  CHILD_NCCL(c, ncclCommDestroy(comm));
  return 0;
}

// Rank 1's communicator fails (its peer rank 2 is SIGKILLed) and rank 1
// stays alive without calling; rank 0 then makes its first connection to
// rank 1, which never attaches. Rank 0 must learn from rank 1's published
// report within a few idle check intervals (SHOAL_IDLE_CHECK_MS), not at the
// no-progress deadline, and name rank 1 and what it reported (rank 2): its
// stalled Send has the report looked up, and the verdict ends the attach wait.
int failedPeerNeverAttaches(MpChild& c, double failWithinMs) {
  const int r = c.rank();
  ncclComm_t comm = nullptr;
  CHILD_NCCL(c, initComm(c, &comm));
  const size_t N = 1024;
  std::vector<float> data(N, float(r));
  if (r == 1) CHILD_NCCL(c, ncclSend(data.data(), N, ncclFloat, 2, comm, nullptr));
  if (r == 2) CHILD_NCCL(c, ncclRecv(data.data(), N, ncclFloat, 1, comm, nullptr));
  CHILD_CHECK(c, c.barrier(), "the ranks did not meet after the first message");
  if (r == 2) {
    c.log("killing myself (SIGKILL)");
    ::raise(SIGKILL);
  }
  if (r == 1) {
    ncclResult_t rc = ncclRecv(data.data(), N, ncclFloat, 2, comm, nullptr);
    CHILD_CHECK(c, rc == ncclRemoteError, "the Recv from the dead rank 2 returned " + describe(rc));
  }
  CHILD_CHECK(c, c.barrier(), "rank 1 did not fail");  // rank 1's report is published
  int failed = 0;
  if (r == 0) {
    double t0 = monoMs();
    ncclResult_t rc = ncclSend(data.data(), N, ncclFloat, 1, comm, nullptr);
    double ms = monoMs() - t0;
    std::string last = ncclGetLastError(nullptr);
    c.log("the Send to rank 1 took " + std::to_string(int(ms)) + " ms and returned " + describe(rc) + ": " + last);
    if (rc != ncclRemoteError || ms > failWithinMs || !namesRank(last, 1) || !namesRank(last, 2)) {
      c.log("CHECK FAILED: expected ncclRemoteError within " + std::to_string(int(failWithinMs)) +
            " ms naming ranks 1 and 2");
      failed = 1;
    }
  }
  CHILD_CHECK(c, c.barrier(), "the ranks did not finish");
  CHILD_NCCL(c, ncclCommAbort(comm));
  return failed;
}

// `sleeper` stops calling after `stopAt` AllReduces; the others must hit the
// no-progress deadline (SHOAL_PROGRESS_TIMEOUT_MS=2000) naming it.
int stuckRank(MpChild& c, int sleeper, int stopAt) {
  const int r = c.rank();
  ncclComm_t comm = nullptr;
  CHILD_NCCL(c, initComm(c, &comm));
  const size_t N = 4096;
  std::vector<float> send(N), recv(N);
  for (size_t i = 0; i < N; ++i) send[i] = value(r, i);
  for (int it = 0; it < 1000; ++it) {
    if (r == sleeper && it == stopAt) {
      // Stops calling: waits (without Shoal) until the others have failed.
      c.log("stopping before iteration " + std::to_string(it));
      CHILD_CHECK(c, c.barrier(), "the other ranks did not finish");
      CHILD_NCCL(c, ncclCommAbort(comm));
      return 0;
    }
    double t0 = monoMs();
    ncclResult_t rc = ncclAllReduce(send.data(), recv.data(), N, ncclFloat, ncclSum, comm, nullptr);
    double ms = monoMs() - t0;
    if (rc != ncclSuccess) {
      c.log("iteration " + std::to_string(it) + " failed");
      CHILD_CHECK(c, it >= stopAt, "a collective failed before the sleeper stopped");
      return checkFailure(c, comm, rc, ms, sleeper, 2000 + 6000, true);
    }
  }
  c.log("every AllReduce succeeded although rank " + std::to_string(sleeper) + " stopped");
  return 1;
}

// ---- stray connections ------------------------------------------------------

int connectLoopback(int port, int timeoutMs) {
  double deadline = monoMs() + timeoutMs;
  while (monoMs() < deadline) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) return fd;
    ::close(fd);
    ::usleep(20000);
  }
  return -1;
}

void sendBytes(int fd, const void* data, size_t len) {
  (void)::send(fd, data, len, MSG_NOSIGNAL);
}

}  // namespace

// The transports every data test runs on (both stay on this host).
const char* const kDataTransports[] = {"tcp", "shm"};

TEST_CASE("mp: every collective over tcp and shm at 2 to 4 processes", "[mp]") {
  for (const char* transport : kDataTransports) {
    for (int n : {2, 3, 4}) {
      MpConfig cfg;
      cfg.nranks = n;
      cfg.hardLimitMs = 90000;
      cfg.env = {{"SHOAL_TRANSPORT", transport}};
      MpResult res = runForked(cfg, everyCollective);
      INFO(transport << " nranks " << n);
      requirePassed(res);
    }
  }
}

TEST_CASE("mp: grouped send/recv over tcp and shm", "[mp]") {
  for (const char* transport : kDataTransports) {
    for (int n : {2, 3}) {
      MpConfig cfg;
      cfg.nranks = n;
      cfg.hardLimitMs = 60000;
      cfg.env = {{"SHOAL_TRANSPORT", transport}};
      MpResult res = runForked(cfg, groupedSendRecv);
      INFO(transport << " nranks " << n);
      requirePassed(res);
    }
  }
}

TEST_CASE("mp: a collective grouped with a Send on one rank and alone on the others, over shm", "[mp][group]") {
  for (const char* algo : {"peer_read", ""}) {
    MpConfig cfg;
    cfg.nranks = 3;
    cfg.env = {{"SHOAL_TRANSPORT", "shm"}, {"SHOAL_SHM_CMA", "1"}, {"SHOAL_ALGO", algo},
               {"SHOAL_PROGRESS_TIMEOUT_MS", "20000"}};
    MpResult res = runForked(cfg, collectiveBesideSend);
    INFO("SHOAL_ALGO=" << algo);
    requirePassed(res);
  }
}

TEST_CASE("mp: ncclCommAbort after init and after collectives", "[mp]") {
  MpConfig cfg;
  cfg.nranks = 3;
  cfg.hardLimitMs = 60000;
  MpResult res = runForked(cfg, [](MpChild& c) {
    ncclComm_t comm = nullptr;
    CHILD_NCCL(c, initComm(c, &comm));
    double t0 = monoMs();
    CHILD_NCCL(c, ncclCommAbort(comm));  // right after init, no operation yet
    CHILD_CHECK(c, monoMs() - t0 < 5000, "abort right after init took more than 5 s");
    // Rank 0 hosts the bootstrap root: stay until every rank has finished.
    CHILD_CHECK(c, c.barrier(), "the other ranks did not finish");
    return 0;
  });
  requirePassed(res);

  res = runForked(cfg, [](MpChild& c) {
    ncclComm_t comm = nullptr;
    CHILD_NCCL(c, initComm(c, &comm));
    std::vector<float> send(1024, 1.f), recv(1024);
    for (int i = 0; i < 3; ++i)
      CHILD_NCCL(c, ncclAllReduce(send.data(), recv.data(), 1024, ncclFloat, ncclSum, comm, nullptr));
    CHILD_CHECK(c, recv[0] == static_cast<float>(c.nranks()), "AllReduce before abort");
    double t0 = monoMs();
    CHILD_NCCL(c, ncclCommAbort(comm));
    CHILD_CHECK(c, monoMs() - t0 < 5000, "abort after collectives took more than 5 s");
    return 0;
  });
  requirePassed(res);
}

TEST_CASE("mp: rank 0 may exit as soon as its ncclCommInitRank returns", "[mp]") {
  // NCCL's root is only needed until every rank has checked in, which has
  // happened once any rank's init returns; the other ranks' inits must not
  // depend on rank 0's process staying alive afterwards.
  MpConfig cfg;
  cfg.nranks = 3;
  cfg.hardLimitMs = 60000;
  MpResult res = runForked(cfg, [](MpChild& c) {
    ncclComm_t comm = nullptr;
    CHILD_NCCL(c, initComm(c, &comm));
    if (c.rank() == 0) ::_exit(0);  // gone at once, without destroying anything
    int count = 0;
    CHILD_NCCL(c, ncclCommCount(comm, &count));
    CHILD_CHECK(c, count == c.nranks(), "Count after init");
    CHILD_NCCL(c, ncclCommAbort(comm));
    return 0;
  });
  requirePassed(res);
}

// Rank 0 of 4 also serves the bootstrap root, whose store dies with it: rank
// 2, not next to it, names it through its neighbours' reports.
TEST_CASE("mp: a SIGKILLed rank makes every survivor fail naming it", "[mp][failure]") {
  for (const char* transport : kDataTransports) {
    for (auto [victim, n] : {std::pair{2, 3}, std::pair{2, 4}, std::pair{0, 4}}) {
      MpConfig cfg;
      cfg.nranks = n;
      cfg.hardLimitMs = 45000;
      // Survivors must fail within 30 s; a rank that does not hear of the death
      // directly may rely on the no-progress deadline, set below that bound.
      cfg.env = {{"SHOAL_PROGRESS_TIMEOUT_MS", "20000"}, {"SHOAL_TRANSPORT", transport}};
      MpResult res = runForked(cfg, [&](MpChild& c) { return killOneRank(c, victim, 20); });
      INFO(transport << " nranks " << n << " victim " << victim << "\n" << res.report());
      REQUIRE_FALSE(res.timedOut);
      CHECK(res.onlyVictimKilled(victim));
    }
  }
}

// A failed rank first publishes a draft report, its own view, then reads
// why the peers it waited on failed and publishes the final one. Over shm
// a failed group closes its connections before that (rank 1's to rank 0,
// whose Recv in the group had finished), so rank 0 meets the draft and
// must wait for the final report (tests/mp/report_chain.h).
TEST_CASE("mp: a rank that meets a failed peer's draft report waits for the final one, which names the first cause",
          "[mp][failure]") {
  constexpr int kTimeoutMs = 2000;
  MpConfig cfg;
  cfg.nranks = 3;
  cfg.hardLimitMs = 60000;
  cfg.env = {{"SHOAL_TRANSPORT", "shm"}, {"SHOAL_PROGRESS_TIMEOUT_MS", std::to_string(kTimeoutMs)}};
  MpResult res = runForked(cfg, [&](MpChild& c) { return firstCauseAfterItsEffects(c, kTimeoutMs, true); });
  INFO(res.report());
  REQUIRE_FALSE(res.timedOut);
  CHECK(res.onlyVictimKilled(2));
}

// A rank killed between init and its first collective never connects: its
// peers, waiting to be connected to or connecting, must not wait out the
// set-up deadline (SHOAL_INIT_TIMEOUT_MS, 10 minutes) but learn within
// seconds that its process is gone, and the ranks that never connect to it
// from them (their connections close as they fail; at 4 ranks rank 0 is not
// rank 2's neighbour). Rank 0 also serves the bootstrap root, whose store
// dies with it: rank 2 of 4 learns the cause from its neighbours' reports,
// carried by their connections.
TEST_CASE("mp: a rank killed before its first collective makes every survivor fail within seconds naming it",
          "[mp][failure]") {
  for (const char* transport : kDataTransports) {
    for (auto [victim, n] : {std::pair{0, 3}, std::pair{2, 4}, std::pair{0, 4}}) {
      MpConfig cfg;
      cfg.nranks = n;
      cfg.hardLimitMs = 60000;
      cfg.env = {{"SHOAL_TRANSPORT", transport}};
      MpResult res = runForked(cfg, [&](MpChild& c) { return killOneRank(c, victim, 0, 20000); });
      INFO(transport << " victim " << victim << "\n" << res.report());
      REQUIRE_FALSE(res.timedOut);
      CHECK(res.onlyVictimKilled(victim));
    }
  }
}

// A rank killed between init and a split the others call: they wait for its
// record in the split's exchange, in the store, where no connection of
// theirs sees it go. Its connection to the bootstrap root ends with its
// process, and the root writes the failure report the rank left there at
// init (its will): the split fails within seconds naming it, not at the
// set-up deadline (SHOAL_INIT_TIMEOUT_MS, 10 minutes).
TEST_CASE("mp: a rank killed before a split makes the others' split fail within seconds naming it",
          "[mp][failure]") {
  const int victim = 2;
  MpConfig cfg;
  cfg.nranks = 3;
  cfg.hardLimitMs = 60000;
  MpResult res = runForked(cfg, [&](MpChild& c) {
    ncclComm_t comm = nullptr;
    CHILD_NCCL(c, initComm(c, &comm));
    if (c.rank() == victim) {
      c.log("killing myself (SIGKILL) before the split");
      ::raise(SIGKILL);
    }
    ncclComm_t child = nullptr;
    const double t0 = monoMs();
    const ncclResult_t rc = ncclCommSplit(comm, 0, c.rank(), &child, nullptr);
    const double ms = monoMs() - t0;
    const std::string last = ncclGetLastError(nullptr);
    c.log("split returned after " + std::to_string(static_cast<int>(ms)) + " ms: " + describe(rc) + ": " + last);
    CHILD_CHECK(c, c.barrier(), "the other ranks did not finish");
    CHILD_CHECK(c, rc == ncclRemoteError, "expected ncclRemoteError, got " + describe(rc));
    CHILD_CHECK(c, child == nullptr, "the split made a communicator");
    CHILD_CHECK(c, ms < 15000, "the split took more than 15 s to fail");
    CHILD_CHECK(c, namesRank(last, victim), "the error does not name rank 2: " + last);
    CHILD_CHECK(c, last.find("its process ended") != std::string::npos,
                "the error does not say that its process ended: " + last);
    CHILD_NCCL(c, ncclCommAbort(comm));
    return 0;
  });
  INFO(res.report());
  REQUIRE_FALSE(res.timedOut);
  CHECK(res.onlyVictimKilled(victim));
}

// Ranks whose init fails because one of them is lost: a set-up deadline far
// beyond what initFailsNaming allows, so that only a named failure passes.
MpConfig initFailureConfig(int nranks) {
  MpConfig cfg;
  cfg.nranks = nranks;
  cfg.hardLimitMs = 60000;
  cfg.env = {{"SHOAL_INIT_TIMEOUT_MS", "40000"}};
  return cfg;
}

// The init of a rank that outlives `failing`'s: it must fail within 15 s
// with ncclRemoteError naming `failing` and saying `cause`.
int initFailsNaming(MpChild& c, const ncclUniqueId& id, int failing, const std::string& cause) {
  ncclComm_t comm = nullptr;
  const double t0 = monoMs();
  const ncclResult_t rc = ncclCommInitRank(&comm, c.nranks(), id, c.rank());
  const double ms = monoMs() - t0;
  const std::string last = ncclGetLastError(nullptr);
  c.log("init returned after " + std::to_string(static_cast<int>(ms)) + " ms: " + describe(rc) + ": " + last);
  CHILD_CHECK(c, c.barrier(), "the other ranks did not finish");  // keep the root alive
  CHILD_CHECK(c, rc == ncclRemoteError, "expected ncclRemoteError, got " + describe(rc));
  CHILD_CHECK(c, ms < 15000, "init took more than 15 s to fail");
  CHILD_CHECK(c, namesRank(last, failing), "the error does not name rank " + std::to_string(failing) + ": " + last);
  CHILD_CHECK(c, last.find(cause) != std::string::npos, "the error does not say '" + cause + "': " + last);
  return 0;
}

// A rank killed during its init (here, after 1 s: waiting in the first
// exchange, the check-in, for rank 1, which comes after the death) left its
// will with the root: the others fail their init within seconds naming it,
// not at the set-up deadline. (Whether the will stood in for its check-in
// record or followed it, the message is the same; the Bootstrap tests take
// each path.)
TEST_CASE("mp: a rank killed while it waits in init's check-in is named within seconds by the others",
          "[mp][failure]") {
  const int n = 3, victim = 2;
  MpResult res = runForked(initFailureConfig(n), [&](MpChild& c) {
    ncclUniqueId id;
    CHILD_CHECK(c, c.uniqueId(&id), "unique id");
    ncclComm_t comm = nullptr;
    if (c.rank() == victim) {
      std::thread([&] { (void)ncclCommInitRank(&comm, n, id, c.rank()); }).detach();
      ::usleep(1000 * 1000);  // in the check-in, waiting for rank 1
      c.log("killing myself (SIGKILL) in init");
      ::raise(SIGKILL);
    }
    if (c.rank() == 1) ::usleep(2000 * 1000);
    return initFailsNaming(c, id, victim, "its process ended");
  });
  INFO(res.report());
  REQUIRE_FALSE(res.timedOut);
  CHECK(res.onlyVictimKilled(victim));
}

// A rank whose init fails (here: aborted while it waits in the check-in, a
// nonblocking init) tells the others why where its will would be: their
// init fails within seconds naming it and the cause, not at the set-up
// deadline. (NCCL's peers wait for such a rank forever.)
TEST_CASE("mp: a rank whose init fails is named with the cause by the others", "[mp][failure]") {
  const int n = 3, failing = 2;
  MpResult res = runForked(initFailureConfig(n), [&](MpChild& c) {
    ncclUniqueId id;
    CHILD_CHECK(c, c.uniqueId(&id), "unique id");
    ncclComm_t comm = nullptr;
    if (c.rank() == failing) {
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;
      const ncclResult_t rc = ncclCommInitRankConfig(&comm, n, id, c.rank(), &config);
      CHILD_CHECK(c, rc == ncclInProgress || rc == ncclSuccess, "nonblocking init: " + describe(rc));
      ::usleep(300 * 1000);  // in the check-in: rank 1 comes after 1 s
      CHILD_NCCL(c, ncclCommAbort(comm));
      CHILD_CHECK(c, c.barrier(), "the other ranks did not finish");
      return 0;
    }
    if (c.rank() == 1) ::usleep(1000 * 1000);
    return initFailsNaming(c, id, failing, "its init failed");
  });
  requirePassed(res);
}

TEST_CASE("mp: a peer whose communicator failed is named within seconds by a rank it never attaches to",
          "[mp][failure]") {
  MpConfig cfg;
  cfg.nranks = 3;
  cfg.hardLimitMs = 50000;
  cfg.env = {{"SHOAL_TRANSPORT", "shm"}, {"SHOAL_IDLE_CHECK_MS", "500"}, {"SHOAL_PROGRESS_TIMEOUT_MS", "30000"}};
  MpResult res = runForked(cfg, [&](MpChild& c) { return failedPeerNeverAttaches(c, 10000); });
  INFO(res.report());
  REQUIRE_FALSE(res.timedOut);
  CHECK(res.onlyVictimKilled(2));
}

TEST_CASE("mp: a rank that stops calling trips the no-progress deadline", "[mp][failure]") {
  const int n = 3, sleeper = 2;
  MpConfig cfg;
  cfg.nranks = n;
  cfg.hardLimitMs = 45000;
  cfg.env = {{"SHOAL_PROGRESS_TIMEOUT_MS", "2000"}};
  MpResult res = runForked(cfg, [&](MpChild& c) { return stuckRank(c, sleeper, 5); });
  requirePassed(res);
}

TEST_CASE("mp: init fails within SHOAL_INIT_TIMEOUT_MS when a rank never arrives", "[mp][failure]") {
  const int n = 3, missing = 2;
  MpConfig cfg;
  cfg.nranks = n;
  cfg.hardLimitMs = 45000;
  cfg.env = {{"SHOAL_INIT_TIMEOUT_MS", "3000"}};
  MpResult res = runForked(cfg, [&](MpChild& c) {
    if (c.rank() == missing) {  // never calls ncclCommInitRank
      CHILD_CHECK(c, c.barrier(), "the other ranks did not finish");
      return 0;
    }
    ncclUniqueId id;
    CHILD_CHECK(c, c.uniqueId(&id), "unique id");
    ncclComm_t comm = nullptr;
    double t0 = monoMs();
    ncclResult_t rc = ncclCommInitRank(&comm, n, id, c.rank());
    double ms = monoMs() - t0;
    std::string last = ncclGetLastError(nullptr);
    c.log("init returned after " + std::to_string(static_cast<int>(ms)) + " ms: " + describe(rc));
    CHILD_CHECK(c, c.barrier(), "the other ranks did not finish");  // keep the root alive
    CHILD_CHECK(c, rc != ncclSuccess && rc != ncclInProgress, "init succeeded without rank 2");
    CHILD_CHECK(c, ms < 3000 + 5000, "init did not fail within the init deadline (+5 s slack)");
    CHILD_CHECK(c, ms >= 2000, "init failed well before the init deadline");
    CHILD_CHECK(c, namesRank(last, missing), "the error does not list the missing rank: " + last);
    return 0;
  });
  requirePassed(res);
}

TEST_CASE("mp: stray connections to the bootstrap root do not disturb init", "[mp][security]") {
  const int port = shoal::testing::freeLoopbackPort();
  REQUIRE(port > 0);
  MpConfig cfg;
  cfg.nranks = 3;
  cfg.hardLimitMs = 60000;
  cfg.env = {{"NCCL_COMM_ID", "127.0.0.1:" + std::to_string(port)},
             {"SHOAL_HANDSHAKE_TIMEOUT_MS", "2000"},
             {"SHOAL_INIT_TIMEOUT_MS", "20000"}};
  MpResult res = runForked(cfg, [&](MpChild& c) {
    ncclUniqueId id;
    CHILD_CHECK(c, c.uniqueId(&id), "unique id");
    std::vector<int> strays;
    if (c.rank() == 1) {
      // Before joining, flood the root with junk: the root comes up when rank 0
      // starts its init (or at ncclGetUniqueId), so retry connecting.
      std::mt19937 rng(12345);
      std::vector<unsigned char> junk(1024);
      for (auto& b : junk) b = static_cast<unsigned char>(rng());
      int a = connectLoopback(port, 15000);
      CHILD_CHECK(c, a >= 0, "could not reach the bootstrap root at 127.0.0.1:" + std::to_string(port));
      sendBytes(a, junk.data(), junk.size());  // random bytes, left open
      strays.push_back(a);
      int b = connectLoopback(port, 2000);  // silent, left open (slowloris)
      if (b >= 0) strays.push_back(b);
      int big = connectLoopback(port, 2000);  // huge lengths, left open
      if (big >= 0) {
        std::vector<unsigned char> ff(64, 0xff);
        sendBytes(big, ff.data(), ff.size());
        strays.push_back(big);
      }
      int closed = connectLoopback(port, 2000);  // connect then close
      if (closed >= 0) ::close(closed);
      int reset = connectLoopback(port, 2000);   // connect then RST
      if (reset >= 0) {
        linger lg{1, 0};
        ::setsockopt(reset, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
        sendBytes(reset, junk.data(), 16);
        ::close(reset);
      }
      // A forged copy of a legitimate-looking first message: the id's bytes.
      int forged = connectLoopback(port, 2000);
      if (forged >= 0) {
        sendBytes(forged, id.internal, sizeof(id.internal));
        strays.push_back(forged);
      }
      c.log("opened " + std::to_string(strays.size()) + " stray connections");
    }
    ncclComm_t comm = nullptr;
    double t0 = monoMs();
    CHILD_NCCL(c, ncclCommInitRank(&comm, c.nranks(), id, c.rank()));
    c.log("init took " + std::to_string(static_cast<int>(monoMs() - t0)) + " ms");
    std::vector<float> send(4096), recv(4096);
    for (size_t i = 0; i < send.size(); ++i) send[i] = value(c.rank(), i);
    CHILD_NCCL(c, ncclAllReduce(send.data(), recv.data(), send.size(), ncclFloat, ncclSum, comm, nullptr));
    bool ok = expectFloats(c, "AllReduce after strays", recv, [&](size_t i) {
      float s = 0;
      for (int q = 0; q < c.nranks(); ++q) s += value(q, i);
      return s;
    });
    CHILD_CHECK(c, ok, "AllReduce data after stray connections");
    CHILD_NCCL(c, ncclCommDestroy(comm));
    for (int fd : strays) ::close(fd);
    return 0;
  });
  requirePassed(res);
}

// Every communicator made from NCCL_COMM_ID meets in the same scope of the
// root: one a rank destroyed must not count as that rank leaving the one it
// still uses. Rank 0 destroys A, then is late (2.5 s) for B's first
// AllReduce: rank 1's connect, which waits for rank 0's hello, looks for why
// it does not come after a second.
TEST_CASE("mp: NCCL_COMM_ID - a rank that destroyed one communicator is not taken to have left the next",
          "[mp]") {
  const int port = shoal::testing::freeLoopbackPort();
  REQUIRE(port > 0);
  MpConfig cfg;
  cfg.nranks = 2;
  cfg.hardLimitMs = 40000;
  cfg.env = {{"NCCL_COMM_ID", "127.0.0.1:" + std::to_string(port)}, {"SHOAL_INIT_TIMEOUT_MS", "15000"}};
  MpResult res = runForked(cfg, [&](MpChild& c) {
    ncclUniqueId id;
    CHILD_NCCL(c, ncclGetUniqueId(&id));
    ncclComm_t a = nullptr, b = nullptr;
    CHILD_NCCL(c, ncclCommInitRank(&a, 2, id, c.rank()));
    CHILD_NCCL(c, ncclCommInitRank(&b, 2, id, c.rank()));
    if (c.rank() == 0) {
      CHILD_NCCL(c, ncclCommDestroy(a));
      ::usleep(2500000u);
    }
    std::vector<float> send(256, 1.f), recv(256);
    CHILD_NCCL(c, ncclAllReduce(send.data(), recv.data(), 256, ncclFloat, ncclSum, b, nullptr));
    CHILD_CHECK(c, recv[255] == 2.f, "AllReduce on B");
    CHILD_CHECK(c, c.barrier(), "barrier");
    if (c.rank() == 1) CHILD_NCCL(c, ncclCommDestroy(a));
    CHILD_NCCL(c, ncclCommDestroy(b));
    return 0;
  });
  requirePassed(res);
}

TEST_CASE("mp: NCCL_COMM_ID - ranks that start before rank 0 join its root", "[mp]") {
  // With NCCL_COMM_ID the root starts in rank 0's init; the others connect
  // (retrying) before or while it comes up, and must be served.
  for (int round = 0; round < 4; ++round) {
    const int port = shoal::testing::freeLoopbackPort();
    REQUIRE(port > 0);
    MpConfig cfg;
    cfg.nranks = 4;
    cfg.hardLimitMs = 40000;
    cfg.env = {{"NCCL_COMM_ID", "127.0.0.1:" + std::to_string(port)},
               {"SHOAL_INIT_TIMEOUT_MS", "15000"}};
    MpResult res = runForked(cfg, [&](MpChild& c) {
      ncclUniqueId id;
      CHILD_CHECK(c, c.uniqueId(&id), "unique id");
      if (c.rank() == 0) ::usleep(150000u + 50000u * static_cast<unsigned>(round));
      ncclComm_t comm = nullptr;
      CHILD_NCCL(c, ncclCommInitRank(&comm, c.nranks(), id, c.rank()));
      std::vector<float> send(256, 1.f), recv(256);
      CHILD_NCCL(c, ncclAllReduce(send.data(), recv.data(), 256, ncclFloat, ncclSum, comm, nullptr));
      CHILD_CHECK(c, recv[255] == static_cast<float>(c.nranks()), "AllReduce");
      CHILD_NCCL(c, ncclCommDestroy(comm));
      return 0;
    });
    INFO("round " << round);
    requirePassed(res);
  }
}
