// Hang reports (label "mp", docs/diagnostics.md): three forked ranks over
// tcp; rank 2 stalls (it does not call an AllReduce the others are in). Ranks
// 0 and 1 write reports when their AllReduce passes its no-progress deadline,
// rank 1 also on SHOAL_REPORT_SIGNAL while it still waits (its running job
// answers for itself), and rank 2 on the signal while it sleeps.
// tools/shoal_hang_report.py must name rank 2, and only rank 2. And the
// stall warnings that come before any deadline (SHOAL_STALL_WARN_MS).
#include <nccl.h>

#include <catch2/catch.hpp>

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "support/mp_harness.h"

using namespace shoal::testing;

namespace {

std::string readFile(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Runs the merge tool over `dir`; returns its output, its exit status in *rc.
std::string mergeReports(const std::string& dir, int* rc) {
  std::string command = std::string("python3 ") + SHOAL_SOURCE_DIR + "/tools/shoal_hang_report.py " + dir + " 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::string out;
  char buf[512];
  while (size_t n = std::fread(buf, 1, sizeof(buf), pipe)) out.append(buf, n);
  int status = ::pclose(pipe);
  *rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

// A fresh directory under /tmp whose name starts with `prefix`.
std::string freshDirectory(const std::string& prefix) {
  std::string pattern = "/tmp/" + prefix + "-XXXXXX";
  REQUIRE(::mkdtemp(pattern.data()) != nullptr);
  return pattern;
}

}  // namespace

TEST_CASE("a stalled rank is named by the merged hang reports", "[mp]") {
  const std::string dir = freshDirectory("shoal-reports");
  MpConfig cfg;
  cfg.nranks = 3;
  cfg.env = {{"SHOAL_PROGRESS_TIMEOUT_MS", "1500"}, {"SHOAL_REPORT_DIR", dir}, {"SHOAL_REPORT_SIGNAL", "USR1"}};
  MpResult res = runForked(cfg, [&](MpChild& child) -> int {
    ncclUniqueId id;
    if (!child.uniqueId(&id)) return 10;
    ncclComm_t comm = nullptr;
    if (ncclCommInitRank(&comm, 3, id, child.rank()) != ncclSuccess) return 11;
    std::vector<float> buf(1 << 16, 1.0f);
    for (int i = 0; i < 2; ++i)
      if (ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat, ncclSum, comm, nullptr) != ncclSuccess)
        return 12;
    if (child.rank() == 2) {
      // The stall: no third AllReduce. The signal makes it write its report.
      std::this_thread::sleep_for(std::chrono::milliseconds(2500));
      ::raise(SIGUSR1);
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    } else {
      std::thread signaller;
      if (child.rank() == 1)  // while its AllReduce still waits, before the deadline
        signaller = std::thread([] {
          std::this_thread::sleep_for(std::chrono::milliseconds(600));
          ::raise(SIGUSR1);
        });
      ncclResult_t rc = ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat, ncclSum, comm, nullptr);
      if (signaller.joinable()) signaller.join();
      child.log(std::string("third AllReduce: ") + ncclGetErrorString(rc) + ": " + ncclGetLastError(comm));
      if (rc == ncclSuccess) return 1;
    }
    child.barrier();
    (void)ncclCommAbort(comm);
    return 0;
  });
  INFO(res.report());
  REQUIRE_FALSE(res.timedOut);
  REQUIRE(res.allPassed());

  std::vector<std::string> reports;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) reports.push_back(readFile(entry.path()));
  std::string all;
  for (const auto& r : reports) all += r;
  INFO(all);
  // Ranks 0 and 1 at the deadline, rank 1 and rank 2 on the signal.
  auto count = [&](const std::string& needle) {
    size_t n = 0;
    for (const auto& r : reports) n += r.find(needle) != std::string::npos;
    return n;
  };
  CHECK(count("\"reason\": \"deadline\"") == 2);
  CHECK(count("\"reason\": \"signal\", \"comm\"") >= 2);
  // Rank 1's signal report came from its running job: in flight, waiting.
  bool rank1Running = false;
  for (const auto& r : reports)
    rank1Running |= r.find("\"reason\": \"signal\"") != std::string::npos &&
                    r.find("\"rank\": 1,") != std::string::npos &&
                    r.find("\"in_flight\": {\"what\"") != std::string::npos &&
                    r.find("\"waiting_on\": []") == std::string::npos;
  CHECK(rank1Running);

  int rc = -1;
  std::string merged = mergeReports(dir, &rc);
  INFO(merged);
  CHECK(rc == 0);
  CHECK(merged.find("STALLED: rank 2 ") != std::string::npos);
  CHECK(merged.find("has not called AllReduce") != std::string::npos);
  CHECK(merged.find("STALLED: rank 0 ") == std::string::npos);
  CHECK(merged.find("STALLED: rank 1 ") == std::string::npos);
  std::filesystem::remove_all(dir);
}

// Before any deadline, an operation that has moved nothing for
// SHOAL_STALL_WARN_MS says so at WARN, naming the rank it waits on, and
// again at twice and four times that; nothing fails, and once the late
// rank calls, the operation completes.
TEST_CASE("a stalled operation says at WARN whom it waits on, and still completes", "[mp]") {
  const std::string dir = freshDirectory("shoal-stall");
  MpConfig cfg;
  cfg.nranks = 2;
  cfg.env = {{"SHOAL_STALL_WARN_MS", "300"},
             {"SHOAL_PROGRESS_TIMEOUT_MS", "60000"},
             {"NCCL_DEBUG", "WARN"},
             {"NCCL_DEBUG_FILE", dir + "/log.%p"}};
  MpResult res = runForked(cfg, [&](MpChild& child) -> int {
    ncclUniqueId id;
    if (!child.uniqueId(&id)) return 10;
    ncclComm_t comm = nullptr;
    if (ncclCommInitRank(&comm, 2, id, child.rank()) != ncclSuccess) return 11;
    std::vector<float> buf(1024, 1.0f);
    if (ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat, ncclSum, comm, nullptr) != ncclSuccess)
      return 12;
    child.barrier();  // both at the second call together, but for rank 1's delay
    if (child.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // late, not gone
    ncclResult_t rc = ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat, ncclSum, comm, nullptr);
    if (rc != ncclSuccess) {
      child.log(std::string("second AllReduce: ") + ncclGetLastError(comm));
      return 13;
    }
    if (buf[0] != 4.0f) return 14;
    (void)ncclCommDestroy(comm);
    return 0;
  });
  INFO(res.report());
  REQUIRE_FALSE(res.timedOut);
  REQUIRE(res.allPassed());
  std::string logs;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) logs += readFile(entry.path());
  std::filesystem::remove_all(dir);
  INFO(logs);
  // Rank 0's warnings of the second AllReduce (#1): at 300, 600 and 1200 ms
  // of rank 1's 1500 ms (at least two however busy the machine; more if its
  // sleep overran).
  size_t warnings = 0;
  const std::string needle = "rank 0/2 (host ";
  for (size_t at = logs.find(needle); at != std::string::npos; at = logs.find(needle, at + 1)) {
    const std::string line = logs.substr(at, logs.find('\n', at) - at);
    if (line.find("AllReduce #1 ") == std::string::npos || line.find("no progress for ") == std::string::npos)
      continue;
    ++warnings;
    CHECK(line.find("receive from rank 1") != std::string::npos);
    CHECK(line.find("60000 ms (SHOAL_PROGRESS_TIMEOUT_MS)") != std::string::npos);
  }
  CHECK(warnings >= 2);
}

// The first operation makes its connections: a connect to a rank that never
// makes the call waits as an operation does, not for the set-up deadline
// (minutes). It says so at WARN from SHOAL_STALL_WARN_MS on, a report asked
// for meanwhile shows the operation in flight (connecting, waiting on the
// late rank), and it fails at SHOAL_PROGRESS_TIMEOUT_MS with the reason and
// a report, which the merge tool reads as a stall on the late rank.
TEST_CASE("an operation's first connect to a rank that never calls warns, reports and fails at the no-progress "
          "deadline", "[mp]") {
  const std::string dir = freshDirectory("shoal-connect-stall");
  MpConfig cfg;
  cfg.nranks = 2;
  cfg.env = {{"SHOAL_STALL_WARN_MS", "400"},      {"SHOAL_PROGRESS_TIMEOUT_MS", "3000"},
             {"SHOAL_INIT_TIMEOUT_MS", "120000"}, {"SHOAL_REPORT_DIR", dir},
             {"SHOAL_REPORT_SIGNAL", "USR1"},     {"NCCL_DEBUG", "WARN"},
             {"NCCL_DEBUG_FILE", dir + "/log.%p"}};
  MpResult res = runForked(cfg, [&](MpChild& child) -> int {
    ncclUniqueId id;
    if (!child.uniqueId(&id)) return 10;
    ncclComm_t comm = nullptr;
    if (ncclCommInitRank(&comm, 2, id, child.rank()) != ncclSuccess) return 11;
    if (child.rank() == 0) {
      child.barrier();  // rank 1 has failed; no call was made here
      (void)ncclCommDestroy(comm);
      return 0;
    }
    std::thread signaller([] {
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      ::raise(SIGUSR1);
    });
    std::vector<float> buf(1024, 1.0f);
    const auto start = std::chrono::steady_clock::now();
    ncclResult_t rc = ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat, ncclSum, comm, nullptr);
    const auto waited =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
    signaller.join();
    const std::string why = ncclGetLastError(comm);
    child.log("AllReduce after " + std::to_string(waited) + " ms: " + ncclGetErrorString(rc) + ": " + why);
    int out = 0;
    if (rc == ncclSuccess) out = 12;
    if (why.find("connecting to rank 0") == std::string::npos ||
        why.find("no connection within 3000 ms (SHOAL_PROGRESS_TIMEOUT_MS") == std::string::npos)
      out = 13;
    if (waited < 2900 || waited > 60000) out = 14;  // the no-progress deadline, not the set-up one
    child.barrier();
    (void)ncclCommDestroy(comm);
    return out;
  });
  INFO(res.report());
  REQUIRE_FALSE(res.timedOut);
  REQUIRE(res.allPassed());

  std::string logs, reports;
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    (entry.path().filename().string().starts_with("log.") ? logs : reports) += readFile(entry.path()) + "\n";
  INFO(logs);
  INFO(reports);
  // Warned at 400, 800 and 1600 ms (at least twice however busy the machine).
  size_t warnings = 0;
  for (size_t at = logs.find("connecting to rank 0"); at != std::string::npos;
       at = logs.find("connecting to rank 0", at + 1))
    warnings += logs.substr(at, logs.find('\n', at) - at).find("no answer for ") != std::string::npos;
  CHECK(warnings >= 2);
  CHECK(logs.find("AllReduce #0") != std::string::npos);
  // The signal's report and the deadline's: in flight, connecting, waiting on rank 0.
  CHECK(reports.find("\"reason\": \"signal\"") != std::string::npos);
  CHECK(reports.find("\"reason\": \"deadline\"") != std::string::npos);
  CHECK(reports.find("\"in_flight\": null") == std::string::npos);
  CHECK(reports.find("(connecting)") != std::string::npos);
  CHECK(reports.find("\"waiting_on\": [0]") != std::string::npos);
  int rc = -1;
  std::string merged = mergeReports(dir, &rc);
  INFO(merged);
  CHECK(merged.find("STALLED: rank 0 ") != std::string::npos);
  std::filesystem::remove_all(dir);
}
