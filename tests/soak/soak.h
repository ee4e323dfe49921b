// Soak driver: runs one usage pattern of the library ("mode") many times on
// every rank and checks that the process's threads, file descriptors,
// /dev/shm entries and memory come back to where they were after warm-up.
//
// Role: shared by the ctest cases (soak_threads_test.cc, soak_forked_test.cc,
// label "soak") and the hours-long benchmark (soak_bench.cc). Uses only the
// public API (nccl.h, shoal/shoal.h), plus api/api_guard.h in the abort mode
// to see that a blocking call is inside the library before a watchdog aborts
// it (aborting earlier would free the handle under the caller).
//
// Ranks: a RankLink is one rank's view of the others: a barrier, a way to
// hand rank 0's ncclUniqueId to everyone, and an agreement (any rank says
// stop: all stop). Threads of one process (ThreadGroup) or forked processes
// (runForkedRanks, one rank per process) provide it.
//
// Measuring: resources are per process. In the threads setting one rank
// (rank 0) samples for the whole process while the other ranks wait at a
// barrier; forked, every rank samples and checks its own process.
#pragma once

#include <nccl.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace shoal::soak {

// ---------------------------------------------------------------------------
// Resources of this process
// ---------------------------------------------------------------------------

struct Resources {
  int threads = -1;   // entries of /proc/self/task
  int fds = -1;       // entries of /proc/self/fd (the directory's own fd included)
  int shmOwn = -1;    // /dev/shm entries named shoal-<this pid>-*
  int shmAll = -1;    // every /dev/shm entry (printed, never compared: other tests make them)
  long rssKiB = -1;   // resident set (/proc/self/statm, field 2)
  long heapKiB = -1;  // malloc'd bytes in use (mallinfo2: uordblks + hblkhd)
};

Resources sampleResources();
std::string formatResources(const Resources& r);

// How much each resource may differ from its baseline.
struct Slack {
  long rssKiB = 8 * 1024;     // see README.md "Slack"
  long heapKiB = 4 * 1024;    // bench only: heap against the process baseline
  long heapPerThirdKiB = 32;  // per mode: growth allowed in each third of the run
};

// The comparison of `after` against `baseline`: empty when within slack,
// else one line per resource that grew. Threads, fds and own /dev/shm
// entries must be <= baseline; RSS within slack.rssKiB; heap within
// slack.heapKiB when checkHeap.
std::string compareResources(const Resources& baseline, const Resources& after, const Slack& slack,
                             bool checkHeap = false);

// Samples until threads, fds and own shm entries are <= baseline's, or
// settleMs passed (a joined thread leaves /proc a moment later; a peer's
// close reaches us asynchronously); returns the last sample.
Resources settleTo(const Resources& baseline, int settleMs = 3000);

// ---------------------------------------------------------------------------
// Modes
// ---------------------------------------------------------------------------

enum class Mode {
  kBlocking,     // blocking collectives, every kind, 8 sizes
  kNonblocking,  // config.blocking = 0, poll ncclCommGetAsyncError
  kHostStream,   // shoalHostStream: batches of 4, stream recreated every 1000 ops
  kGrouped,      // ncclGroupStart/End: AllReduce, Broadcast, AllGather, ring send/recv
  kSplit,        // ncclCommSplit (three colourings) then destroy the children
  kInitDestroy,  // ncclCommInitRank(Config) from a fresh id, then destroy
  kAbort,        // an operation in flight, then ncclCommAbort (nonblocking / watchdog)
};

inline constexpr Mode kAllModes[] = {Mode::kBlocking, Mode::kNonblocking, Mode::kHostStream, Mode::kGrouped,
                                     Mode::kSplit,    Mode::kInitDestroy, Mode::kAbort};

const char* modeName(Mode m);  // "blocking", "nonblocking", ...
bool parseMode(const std::string& name, Mode* out);

// What one operation of a mode is (for the figures).
const char* modeUnit(Mode m);  // "collectives", "groups", "splits", ...

struct ModeCounts {
  long warmup = 0;  // pattern repetitions before the baseline
  long ops = 0;     // repetitions measured
};
// The counts the ctest cases use (README.md lists them).
ModeCounts testCounts(Mode m);

// ---------------------------------------------------------------------------
// Ranks
// ---------------------------------------------------------------------------

class RankLink {
 public:
  virtual ~RankLink() = default;
  virtual int rank() const = 0;
  virtual int nranks() const = 0;
  // Every rank arrives; false if the group is broken (a rank failed) or
  // after a long timeout. May be called from any one thread of the rank.
  virtual bool barrier() = 0;
  // Rank 0 makes an ncclUniqueId; every rank gets it.
  virtual bool shareId(ncclUniqueId* id, std::string* error) = 0;
  // True on every rank if `mine` is true on any.
  virtual bool any(bool mine) = 0;
  // Whether this rank samples resources (one per process).
  virtual bool measures() const = 0;
  // One line for the log (stdout of the test or the bench).
  virtual void print(const std::string& line) = 0;
  // Tells the others that this rank failed (their barriers return false).
  virtual void fail() {}
  // "threads", "shm" or "tcp": names the figures.
  virtual std::string setting() const = 0;
};

// One mode's outcome on one rank.
struct ModeResult {
  std::string error;                                 // library error or wrong data: the run stops
  std::string leak;                                  // threads, fds, shm or RSS did not come back (measuring rank)
  std::string heapLeak;                              // the heap grew in every third of the run (measuring rank)
  long ops = 0;                                      // operations done (warm-up excluded)
  long dataChecks = 0;                               // operations whose data was checked
  Resources idleBefore, baseline, after, idleAfter;  // measuring rank only
  double seconds = 0;
};

// Runs the mode on this rank: a warm-up cycle (set up, warmup/2
// repetitions, tear down), idle-before, then set up, `warmup` repetitions,
// baseline, `ops` repetitions in three thirds (heap sampled between them),
// after, tear down, idle-after. Prints the figures (measuring rank) through
// link.print: always when verbose, else only when something leaked.
ModeResult runMode(Mode m, RankLink& link, const ModeCounts& counts, const Slack& slack, bool verbose);

// Threads of this process as ranks: runs body(link) on n threads and
// returns each rank's exit code (0 = pass).
std::vector<int> runThreadRanks(int n, const std::function<int(RankLink&)>& body);

// Forked processes as ranks over `transport` ("shm" or "tcp"); every child
// first makes a base communicator (for shareId and any). Returns true if
// every rank exited 0; `report` gets every rank's log. The caller must not
// have called the library before (tests/support/mp_harness.h).
bool runForkedRanks(int n, const std::string& transport, int hardLimitMs,
                    const std::function<int(RankLink&)>& body, std::string* report);

// The body of a ctest case: runs `modes` in order with test counts. Returns
// 1 on a library error or wrong data, else a bit mask: 2 if threads, fds,
// shm or RSS did not come back, 4 if the heap grew in every third.
int runModesOnce(RankLink& link, const std::vector<Mode>& modes, const Slack& slack);

}  // namespace shoal::soak
