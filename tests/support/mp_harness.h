// mp_harness: run one test body in N forked processes, one rank each.
//
// Role: the harness of the "mp" tests (tests/mp/). The parent (the Catch2
// process) never calls Shoal: it forks the children first, so every child
// starts single-threaded with no Shoal state, and each child is a real rank
// of its own process (over tcp on 127.0.0.1). Rank 0 makes the ncclUniqueId
// (which starts the bootstrap root in rank 0's process) and hands the 128
// bytes to the others through pipes made before the fork.
//
// Reporting: a child's body returns its exit code (0 = pass) and may log lines
// that come back to the parent through a pipe; the parent collects exit codes,
// signals and logs. Bounding: a watchdog in the parent SIGKILLs every child
// still alive after the hard limit and marks the run as timed out, so no test
// can hang.
//
// Threads: runForked is called from the test's (single) thread; the body runs
// in the child's main thread. Children end with _exit (no static destructors,
// no return into Catch2).
#pragma once

#include <nccl.h>

#include <sys/types.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace shoal::testing {

struct MpConfig {
  int nranks = 2;
  // Hard wall-clock limit for the whole run; the watchdog kills children after it.
  int hardLimitMs = 60000;
  // Set in every child (after the fork, before the body). NCCL_SOCKET_IFNAME=lo
  // and SHOAL_TRANSPORT=tcp are set unless this list names them.
  std::vector<std::pair<std::string, std::string>> env;
};

// What a child sees.
class MpChild {
 public:
  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  // Rank 0: ncclGetUniqueId, then sends the id to every other rank. Others:
  // wait (up to 30 s) for it. Returns false (and logs why) on failure.
  bool uniqueId(ncclUniqueId* out);
  // Waits until every rank that is still alive has called barrier() (ranks
  // that exited or died count as arrived), through the parent. Returns false
  // (and logs why) after timeoutMs. Use it to keep a process - and the
  // bootstrap root that rank 0 hosts - alive until the others are done.
  bool barrier(int timeoutMs = 60000);
  // One line to the parent's report (prefixed with the rank and elapsed time).
  void log(const std::string& line);
  // Milliseconds since this child started.
  double elapsedMs() const;

 private:
  friend class MpRunner;
  int rank_ = 0;
  int nranks_ = 0;
  int reportFd_ = -1;
  std::vector<int> idWriteFds_;  // rank 0: one per other rank
  int idReadFd_ = -1;            // others
  int barrierUpFd_ = -1;         // child -> parent: "arrived"
  int barrierDownFd_ = -1;       // parent -> child: "released"
  bool haveId_ = false;
  ncclUniqueId id_{};
  double startMs_ = 0;
};

struct MpRankResult {
  int rank = 0;
  pid_t pid = 0;
  bool exited = false;       // exited normally (see exitCode)
  int exitCode = -1;
  int termSignal = 0;        // the signal that ended it, if any
  bool killedByWatchdog = false;
  std::string log;
};

struct MpResult {
  std::vector<MpRankResult> ranks;
  bool timedOut = false;     // the watchdog fired
  double wallMs = 0;
  // Every rank exited with code 0 and the watchdog did not fire.
  bool allPassed() const;
  // Rank `victim` died of SIGKILL and every other rank exited with code 0.
  bool onlyVictimKilled(int victim) const;
  // Human-readable summary of every rank: status and log.
  std::string report() const;
};

// Forks cfg.nranks children; child r runs body(child) and exits with its return
// value (an exception or crash is a failure). Waits for all children or the
// hard limit.
MpResult runForked(const MpConfig& cfg, const std::function<int(MpChild&)>& body);

// A free TCP port on 127.0.0.1 (bound then released; for NCCL_COMM_ID).
int freeLoopbackPort();

}  // namespace shoal::testing
