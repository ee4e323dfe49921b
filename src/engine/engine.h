// Engine: the one executor of Plans over Connections (docs/design.md, Nouns and Threading).
//
// Role: posts ready Send/Recv steps to their lane's Connection in lane order,
// runs Reduce/Copy/Divide steps on the CPU (reaching peers' buffers through
// a PeerWindow in peer-reading plans), polls Connections, releases dependent
// steps and completes Jobs.
//
// Threading: one Engine per process (instance()). Any thread may submit().
// Three ways drive jobs, each holding the job's mutex while it does: poll()
// (one pass: it takes the list of runnable jobs under listMutex_, then
// progresses each job whose own mutex it can take, so two threads pump two
// communicators' jobs in parallel and never the same job at once); wait(),
// with which a caller pumps until its job is done; and runInline(), which
// runs a never-submitted job on the caller's thread (a blocking call with
// nothing queued ahead). A job's connections are therefore touched by one
// thread at a time. The progress thread pumps only while detached jobs
// (nobody waits on them) exist, and otherwise sleeps between idle checks.
// Lock order: watchMutex_, listMutex_, then a job's mutex; submitMutex_
// after listMutex_, and reportMutex_ a leaf (holdForFork takes them all).
//
// Ordering: jobs with the same queue (one communicator) run one at a time in
// submission order, like operations on one stream; different queues run
// concurrently. A job's connections therefore see one plan at a time. One
// exception keeps a CUDA graph's replay from waiting on work behind it: a
// job that runs ahead (Job::runsAhead) starts before the jobs queued ahead
// of it while the first of them waits for its stream to reach it.
//
// Liveness: a job whose connections move no byte for params().progressTimeoutMs
// fails with kTimeout naming the peers it waits on; a job whose abort flag is
// set fails with kAborted at the next poll.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <sys/types.h>

#include "collectives/plan.h"
#include "core/clock.h"
#include "core/status.h"
#include "engine/peer_window.h"
#include "transports/transport.h"

namespace shoal {

// Where one step of a running job stands.
struct StepProgress {
  // kPostedReduce: a receive posted as postRecvReduce; its one Reduce is
  // done by the transport and completes with it.
  enum State : uint8_t { kWaiting, kReady, kPosted, kPostedReduce, kDone };
  uint32_t unmet = 0;  // dependencies not yet done
  State state = kWaiting;
};

// Per-plan data the engine derives once and caches next to the plan.
struct PreparedPlan {
  PlanPtr plan;
  std::vector<uint32_t> dependentsBegin;  // CSR: dependents of step i are
  std::vector<uint32_t> dependents;       //   dependents[dependentsBegin[i] .. [i+1])
  std::vector<StepProgress> initialSteps; // each step waiting on all its dependencies
  std::vector<uint32_t> roots;            // steps with no dependencies
  size_t commSteps = 0;                   // Send + Recv steps
  // Receives that may be posted as postRecvReduce (decision 0015): for step
  // i, the one Reduce that reads its scratch slice (kNoReduce: none), and
  // whether the received bytes are that Reduce's first operand. Empty when
  // the plan has none.
  static constexpr uint32_t kNoReduce = UINT32_MAX;
  struct ReduceOnReceiveStep {
    uint32_t reduce = kNoReduce;
    bool receivedFirst = false;
  };
  std::vector<ReduceOnReceiveStep> reduceOnReceive;
  // deviceStepsCanRun(*plan), derived once.
  bool deviceStepsCanRun = false;
};
std::shared_ptr<const PreparedPlan> preparePlan(PlanPtr plan);

// The 64-bit words a CUDA stream and the engine hand a job over with (pinned
// host memory, docs/cuda.md): a word has reached `seq` once
// (int64_t)(*word - seq) >= 0, the compare cuStreamWaitValue64 makes.
inline bool streamWordReached(const uint64_t* word, uint64_t seq) {
  return static_cast<int64_t>(__atomic_load_n(word, __ATOMIC_ACQUIRE) - seq) >= 0;
}
inline void writeStreamWord(uint64_t* word, uint64_t value) {
  __atomic_store_n(word, value, __ATOMIC_RELEASE);
}

// What an operation's Reduce steps need besides the plan: the PreMulSum scalar.
struct OpScalar {
  std::array<uint8_t, 16> bytes{};  // one element of the op's dtype (host immediate)
  const void* deviceScalar = nullptr;  // read when the job starts (ncclScalarDevice)
};

// What one running job is doing, for hang reports (docs/diagnostics.md).
struct JobReport {
  std::string what;  // Job::description()
  uint64_t queueId = 0;
  uint64_t sequence = 0;
  size_t stepsDone = 0, stepsTotal = 0;
  int64_t idleMs = 0;  // since the job last moved a byte (0: unknown yet)
  struct Peer {
    int rank = -1;
    uint64_t sendPosted = 0, sendDone = 0, recvPosted = 0, recvDone = 0;  // bytes
  };
  std::vector<Peer> peers;     // every peer the plan exchanges messages with
  std::vector<int> waitingOn;  // peers of the oldest unfinished posted step of a lane
};

// Where a job's compute steps run when its buffers are device memory (a
// device plan: every connection moves device memory, docs/cuda.md). The
// engine calls it instead of the CPU reducers, from whichever thread pumps
// the job; it returns once the step's result is in `dst`. Implemented above
// the engine (comm/device_steps.h), so the engine itself never calls CUDA.
class DeviceSteps {
 public:
  virtual ~DeviceSteps() = default;
  // dst = combine(op, a, b) over count elements (reduce::combine's meaning).
  virtual Status reduce(ReduceOp op, DataType dtype, uint8_t* dst, const uint8_t* a, const uint8_t* b,
                        uint64_t count, const void* scalar) = 0;
  virtual Status copy(uint8_t* dst, const uint8_t* src, uint64_t bytes) = 0;
};

// Where peers' buffers lie in this process for a device plan that reads
// them (Plan::readsPeers on device memory): only buffers inside windows
// every rank registered (ncclCommWindowRegister) are reachable, mapped at
// registration. Implemented above the engine (comm/window.h).
class PeerBuffers {
 public:
  virtual ~PeerBuffers() = default;
  // [address, address + bytes) of rank `peer`'s address space as mapped
  // here; nullptr when no window maps it.
  virtual uint8_t* find(int peer, uint64_t address, uint64_t bytes) const = 0;
};

// A job whose plan CUDA streams run by themselves (a stream plan, docs/cuda.md,
// "Stream plans"): every copy, reduction and wait of it was enqueued on
// streams when the user called, so the engine posts nothing. It watches the
// job instead, from whichever thread pumps it: the job ends when finished()
// says the streams have passed the plan's end; moved() feeds the no-progress
// deadline and the stalled-peer checks (Job::laneConnections are the plan's
// connections, for checkAlive); and a job that ends any other way (a peer
// lost, the deadline, an abort) calls release() so that no stream waits for
// ever. Implemented above the engine (comm/stream_plan.h).
class StreamWatch {
 public:
  virtual ~StreamWatch() = default;
  // Whether the streams have passed the end of the plan.
  virtual bool finished() = 0;
  // Whether the streams moved a chunk since the last call.
  virtual bool moved() = 0;
  // An error once the streams have received a message other than the one
  // expected (the job fails with it); checked before each look at the end.
  virtual Status verify() = 0;
  // "receive from rank 2 (...): chunk 5 of 8" for the deadline's message;
  // appends the ranks waited on to `peers`.
  virtual std::string waitingOn(std::vector<int>& peers) = 0;
  // From now on every wait of the plan's streams passes (the job failed):
  // the streams run to the plan's end on whatever bytes are there, and the
  // peers learn that the links broke. Called again while the job drains: a
  // peer's streams still running may have overwritten what it wrote.
  virtual void release() = 0;
};

// Whether a step's (first) source enters multiplied by the op's PreMulSum scalar.
inline bool scalesSource(const Step& s, const CollShape& shape) {
  return (s.flags & kScaleSrc) && shape.op == ReduceOp::kPreMulSum;
}
// The reduce::combine op of a Reduce step: PreMulSum scales only a flagged
// source; otherwise its partial results are summed.
inline ReduceOp combineOpOf(const Step& s, const CollShape& shape) {
  return shape.op == ReduceOp::kPreMulSum && !scalesSource(s, shape) ? ReduceOp::kSum : shape.op;
}

// Whether every compute step of `plan` can run as DeviceSteps (Reduce, and
// Copy without scaling; no Divide), and the plan reads no peer's memory.
bool deviceStepsCanRun(const Plan& plan);
// The same for the compute steps alone: a peer-reading plan whose peers'
// buffers a job's PeerBuffers map may run them too.
bool computeStepsRunOnDevice(const Plan& plan);

// Where a job's peers say why their communicator failed (its failure
// reports). A job that has moved nothing for an idle check interval reads
// what is known of the peers it waits on, and has their reports looked up
// (Engine::checkReportedPeers): a peer that failed without closing its
// connections (a call it refused before running any of it; a connection it
// never attached) is then named within a few intervals instead of at the
// no-progress deadline. Neither call waits: the caller may be the progress
// thread.
class FailureReports {
 public:
  // Why the peer will not come, once known; "" until then.
  virtual std::string knownFailure(int peer) = 0;
  // Starts a lookup of the peer's report, which a later knownFailure()
  // answers ("<kReportedFailurePrefix><report>").
  virtual void lookUp(int peer) = 0;

 protected:
  ~FailureReports() = default;
};

// How a known failure found in a peer's report begins.
inline constexpr std::string_view kReportedFailurePrefix = "it failed: ";

class Job {
 public:
  // Filled by the submitter.
  std::shared_ptr<const PreparedPlan> prepared;
  std::vector<uint8_t*> buffers;            // per plan buffer index (3 per op)
  std::vector<Connection*> laneConnections; // per plan lane
  // laneConnections are those of this job's last run (a reused job repeating
  // its operation): the engine keeps what it derived from them.
  bool sameConnections = false;
  std::vector<uint64_t> opTags;             // per op: tag carried by its messages
  std::vector<OpScalar> opScalars;          // per op
  uint64_t queueId = 0;                     // jobs of one queue run in order
  const std::atomic<bool>* abortFlag = nullptr;
  FailureReports* failureReports = nullptr;  // null: only the connections say a peer failed
  // What the job is, for messages; built only when one is needed (never on
  // the success path): "<comm label>: AllReduce [+ n more (group)] #seq (algorithm)".
  std::shared_ptr<const std::string> commLabel;
  CollKind kind = CollKind::kAllReduce;
  size_t groupedOps = 1;
  uint64_t sequence = 0;
  std::string description() const;
  bool detached = false;                    // nobody waits: the progress thread pumps
  // A job in a CUDA stream's order (device memory, docs/cuda.md): it starts
  // once the stream has written *streamReady >= streamSeq (its inputs are
  // staged); until then no deadline runs. However it ends (done, failed,
  // aborted, retired) it writes *streamDone = streamSeq, so that the stream,
  // which waits for that word, never waits forever. Pinned host words; null
  // for every other job.
  const uint64_t* streamReady = nullptr;
  uint64_t* streamDone = nullptr;
  uint64_t streamSeq = 0;
  bool streamReached() const;
  std::shared_ptr<uint8_t> ownedScratch;    // detached jobs' scratch (a waiter lends its own); released at success
  // A replay of an operation captured into a CUDA graph, submitted when its
  // stream reached it (docs/cuda.md, "Graph capture"): jobs queued earlier
  // whose streams have not reached them come after it in stream order (an
  // operation called after the graph's launch on the same stream), so it
  // starts before them rather than wait for them, which would wait for it.
  bool runsAhead = false;
  // Set for a device plan: its buffers (scratch included) are device memory
  // and its compute steps run here; null for every other job.
  std::shared_ptr<DeviceSteps> deviceSteps;
  // Set for a device plan that reads peers' buffers (their windows): where
  // they lie here. Null for every other job.
  std::shared_ptr<const PeerBuffers> peerBuffers;
  // Set for a stream plan (see StreamWatch): the engine runs none of its
  // steps. streamReady is the word its stream writes when it reaches the
  // plan; streamDone stays null (the stream waits for nothing of the host's).
  std::shared_ptr<StreamWatch> streamWatch;

  // Makes a finished (or never submitted) job ready to be filled again,
  // keeping its vectors (the submitter overwrites them) and its plan: a
  // communicator reuses one job for its blocking calls, so the small-message
  // path allocates nothing.
  void resetForReuse();

  // Completion, readable from any thread.
  bool isDone() const { return state_.load(std::memory_order_acquire) != kRunning; }
  // Valid once isDone().
  const Status& status() const { return status_; }
  // The peer whose connection failed the job, or -1 (deadline, abort, ...).
  int failedPeer() const { return failedPeer_; }
  // On a no-progress timeout: the peers the job was waiting on.
  const std::vector<int>& waitingOn() const { return waitingOn_; }
  // A stream plan's job that has failed and drains (not done yet): its
  // error, readable from any thread; null otherwise.
  const Status* failing() const { return failing_.load(std::memory_order_acquire) ? &drainStatus_ : nullptr; }

 private:
  friend class Engine;
  static constexpr int kRunning = 0, kSucceeded = 1, kFailed = 2;
  void finish(Status status);
  // finish(Status::ok()) without the status move: status_ is ok until a job fails.
  void finishOk() {
    if (streamDone) [[unlikely]]
      releaseStream();
    if (ownedScratch) ownedScratch.reset();  // as in finish()
    state_.store(kSucceeded, std::memory_order_release);
  }
  void releaseStream();

  std::atomic<int> state_{kRunning};
  Status status_;
  std::mutex mutex_;  // held by the thread progressing this job
  // Engine-private execution state, guarded by mutex_.
  bool started_ = false;
  // Started, or claimed to start next by a thread that picked it to run
  // ahead (Engine::aheadOf); set under the engine's listMutex_ or by startJob.
  std::atomic<bool> begun_{false};
  std::vector<StepProgress> steps_;
  std::vector<uint32_t> laneCursor_;
  std::vector<uint32_t> ready_;     // compute steps and newly ready comm steps
  std::vector<int32_t> blockedLanes_;  // a post returned kAgain: retried every poll
  std::vector<Connection*> connections_;  // distinct
  std::vector<int> connectionPeers_;      // peer rank of each of connections_
  int failedPeer_ = -1;
  std::vector<int> waitingOn_;
  // A stream plan that failed drains before it finishes with drainStatus_:
  // its links are released on every pass until its streams have passed
  // the plan (or kDrainMs went by).
  bool draining_ = false;
  Status drainStatus_;  // set once, before failing_
  std::atomic<bool> failing_{false};
  int64_t drainEndNs_ = 0;
  std::vector<Completion> completions_;
  PeerWindow window_;  // peer-reading plans: the peers' buffers
  uint64_t reportedEpoch_ = 0;  // the last report request this job answered
  size_t remaining_ = 0;
  int64_t lastProgressNs_ = 0;
  int64_t lastAliveCheckNs_ = 0;  // the stalled job's last look at its peers (checkStalledPeers)
  int stallWarnings_ = 0;         // said since its last progress (warnIfStalled)
  // checkReportedPeers: when it next has reports looked up (0: not yet
  // scheduled), how many intervals after that, and whose turn it is.
  int64_t nextReportAskNs_ = 0;
  int64_t reportAskEvery_ = 1;
  size_t reportAskCursor_ = 0;
  int64_t nextAnswerReadNs_ = 0;  // after a lookup: when its answer is next read (0: none due)
  int64_t answerReadUntilNs_ = 0;  // and until when it is read that often
  void resetReportAsks() {
    nextReportAskNs_ = 0;
    reportAskEvery_ = 1;
    reportAskCursor_ = 0;
    nextAnswerReadNs_ = 0;
    answerReadUntilNs_ = 0;
  }
  uint32_t passesSinceClock_ = 0;
  bool progressSinceClock_ = false;
};

using JobPtr = std::shared_ptr<Job>;

// Something the progress thread looks at every params().idleCheckMs, whether
// or not detached work runs: a communicator whose connections may lose their
// peer between operations (Engine::watchIdle). checkIdle() runs on the
// progress thread, never twice at once, and decides itself whether its
// connections are free to look at (Engine::queueAtRest).
class IdleWatch {
 public:
  // Returns true when the check asked a question answered on another thread
  // (a look in the bootstrap store), which readIdleAnswer() then reads every
  // few milliseconds, so that what it finds is known within milliseconds of
  // the answer rather than at the next check.
  virtual bool checkIdle() = 0;
  // True once there is nothing more to read (answered); called on the
  // progress thread as checkIdle is, for up to a second or an interval.
  virtual bool readIdleAnswer() = 0;

 protected:
  ~IdleWatch() = default;
};

class Engine {
 public:
  static Engine& instance();

  // Queues a job; it starts when earlier jobs of its queue are done.
  void submit(JobPtr job);
  // Pumps the engine until the job is done (or the deadline passes: the job
  // keeps running and kTimeout is returned).
  Status wait(const Job& job, Deadline deadline = Deadline::never());
  // Runs a job that was never submitted to completion on the calling thread,
  // pumping the other queued jobs now and then. For a blocking call whose
  // communicator has nothing else in flight: it skips the queue (no list
  // locks, no shared ownership); the job's abort flag still fails it, and its
  // no-progress deadline still applies.
  Status runInline(Job& job);
  // One pass over every runnable job not being progressed by another thread
  // right now. Returns true if anything progressed.
  bool poll();
  // Fails and removes every job of the queue (communicator abort/destroy). On
  // return the engine holds no pointer into that queue's connections.
  void retire(uint64_t queueId, const Status& reason);
  // Jobs submitted and not done.
  size_t activeJobs() const { return jobCount_.load(std::memory_order_relaxed); }
  // The idle liveness check (SHOAL_IDLE_CHECK_MS; 0: none). From watchIdle
  // on, the process's progress thread (started here) calls w->checkIdle()
  // every interval; unwatchIdle waits for a check of w in progress, so w may
  // be destroyed once it returns. Only the registering process checks (a
  // forked child does not check its parent's copies).
  void watchIdle(IdleWatch* w);
  void unwatchIdle(IdleWatch* w);
  // No job of the queue is queued or unfinished, and no thread is inside
  // one: the engine does not touch that queue's connections now, nor until
  // its owner submits again.
  bool queueAtRest(uint64_t queueId);
  // Submitted jobs of one queue not done yet (not counting runInline's).
  size_t queuedJobs(uint64_t queueId);

  // Hang reports. Only the thread progressing a job may read its state, so a
  // report of running jobs is requested (requestReports) and each running
  // job posts its own from its thread at its next clock read (every
  // kPollsPerClockRead passes, progressing or not); takeReport collects the
  // one of a queue (a queue runs one job at a time), waiting until the
  // deadline.
  uint64_t requestReports();
  std::optional<JobReport> takeReport(uint64_t queueId, uint64_t epoch, Deadline deadline);
  // Called on the job's thread just before a job fails its no-progress
  // deadline, with what it was doing. Set once (by the communicator layer).
  using TimeoutObserver = void (*)(const JobReport&);
  void setTimeoutObserver(TimeoutObserver observer) { timeoutObserver_.store(observer); }

  ~Engine();

 private:
  Engine() = default;
  // pthread_atfork: the engine's locks held across a fork (lock order:
  // watchMutex_, listMutex_, submitMutex_, then reportMutex_, a leaf),
  // released in both processes.
  void holdForFork();
  void releaseAfterFork(bool inChild);
  bool pumpOnce();
  // Progresses one job the caller waits on, if it has started (else pumpOnce).
  bool progressStarted(Job& job);
  static constexpr uint32_t kPollsPerClockRead = 32;
  // Looks (Connection::mightProgress) a spinning runInline makes between two
  // idle passes.
  static constexpr uint32_t kQuietLooks = 8;
  // No connection of the job might progress and it has nothing to post.
  static bool quiet(const Job& job);
  // How long a failed stream plan's job releases its links before it
  // finishes anyway (a stream held by the user's own work).
  static constexpr int64_t kDrainMs = 10000;
  // Copy/reduce bytes one runReady() call runs before it lets its caller poll.
  static constexpr uint64_t kComputeBytesPerPass = 1 << 20;
  bool progressJob(Job& job);
  // One pass of a failed stream plan's drain: releases its links again and
  // finishes it once its streams have passed the plan or kDrainMs went by.
  static void drainStep(Job& job);
  // The job's report, no-progress deadline and stalled-peer checks, after a
  // pass that did (or did not) progress it. True when the job failed.
  bool watchDeadlines(Job& job, bool progressed);
  void runReady(Job& job);
  void startJob(Job& job);
  // The job's distinct connections and their peers, from its lanes'.
  static void distinctConnections(Job& job);
  Status runComputeStep(Job& job, uint32_t index);
  // Peer-reading plans (Plan::readsPeers, PeerWindow).
  static void fillWindow(Job& job);
  // The address of a slice in this process; nullptr for an unmapped peer buffer.
  static Result<uint8_t*> addressOf(Job& job, const Slice& slice);
  // A compute step with a source in a peer buffer that is not mapped here
  // (mapped[k] null): read through a bounce buffer, chunk by chunk.
  Status runRemoteComputeStep(Job& job, const Step& s, uint8_t* dst, const Slice* sources,
                              uint8_t* const* mapped, int count);
  Status postLaneSteps(Job& job, int32_t lane);
  void completeStep(Job& job, uint32_t index);
  // A receive posted as postRecvReduce finished: it and its Reduce are done.
  void completeReducedReceive(Job& job, uint32_t index);
  // The receive's entry in PreparedPlan::reduceOnReceive when it can go as
  // postRecvReduce now, else null.
  const PreparedPlan::ReduceOnReceiveStep* reduceOnReceiveNow(const Job& job, uint32_t recvStep,
                                                              const Connection& conn) const;
  ReduceOnReceive reduceOnReceiveFor(const Job& job, uint32_t reduceStep, bool receivedFirst) const;
  void failJob(Job& job, Status status);
  Status timeoutStatus(Job& job) const;
  // "receive from rank 2 (host b, tcp ...); send to ..." for a stalled job
  // (and fills its waitingOn_).
  std::string waitingList(Job& job) const;
  bool checkStalledPeers(Job& job, int64_t now);
  // SHOAL_STALL_WARN_MS: a WARN naming what the stalled job waits on, at 1,
  // 2, 4, ... times the interval of no progress.
  void warnIfStalled(Job& job, int64_t now);
  bool checkReportedPeers(Job& job, int64_t now);
  bool failIfReported(Job& job, int64_t now);
  static constexpr size_t kReportAsksPerCheck = 4;          // peers whose reports one check has looked up
  static constexpr int64_t kMostIntervalsBetweenAsks = 32;  // the lookups' backoff stops there
  static constexpr int64_t kAnswerReadEveryNs = 10'000'000;  // how often a lookup's answer is read,
  static constexpr int64_t kAnswerReadForNs = 1'000'000'000;  // for this long (or an interval) after it

  // What the job is doing; on its own thread only.
  static JobReport reportOf(const Job& job, int64_t nowNs);
  void postReport(Job& job, uint64_t epoch, int64_t nowNs);
  void drainIncoming();
  // Removes the jobs the predicate selects, keeping the counts right.
  // Caller holds listMutex_.
  template <typename Predicate>
  void removeJobs(Predicate shouldRemove);
  // Which job of `first`'s queue may run now (Job::runsAhead). Requires listMutex_.
  const JobPtr& aheadOf(const JobPtr& first);
  // Whether a picked job, not started, may start now: no other job of its
  // queue has begun (one that runs ahead may have been claimed since the
  // pick). Claims it if so. The caller holds the job's mutex.
  bool claimToStart(Job& job);
  std::atomic<size_t> runsAheadJobs_{0};  // submitted jobs that run ahead, not yet removed
  void progressThreadMain();
  // One round of idle checks if one is due (progress thread).
  void runIdleChecks();
  // Starts the process's one progress thread unless it runs.
  void ensureProgressThread();
  // Ends the progress thread (process exit), waiting a bounded time for it.
  void stopProgressThread();

  std::mutex listMutex_;
  std::mutex submitMutex_;
  std::vector<JobPtr> incoming_;      // guarded by submitMutex_
  std::deque<JobPtr> jobs_;           // guarded by listMutex_: running and queued
  std::atomic<size_t> jobCount_{0};
  std::atomic<size_t> detachedCount_{0};

  // The progress thread, all guarded by submitMutex_: the process that
  // started it (0: none yet), its id, and whether its loop still runs.
  pid_t progressThreadPid_ = 0;
  std::thread::id progressThreadId_;
  bool progressThreadRunning_ = false;
  std::condition_variable wake_;             // with submitMutex_
  std::condition_variable progressStopped_;  // with submitMutex_
  bool stopping_ = false;                    // guarded by submitMutex_

  // The idle checks. Lock order: watchMutex_ (held through a round of
  // checks), then what checkIdle takes (listMutex_ through queueAtRest).
  std::mutex watchMutex_;
  std::vector<std::pair<IdleWatch*, pid_t>> watched_;  // guarded by watchMutex_
  std::atomic<size_t> watchCount_{0};
  int64_t nextIdleCheckNs_ = 0;  // progress thread only
  // Watches whose check asked a question (IdleWatch::readIdleAnswer), read
  // every kAnswerReadEveryNs until answered or answersReadUntilNs_.
  std::vector<std::pair<IdleWatch*, pid_t>> awaitingAnswers_;  // guarded by watchMutex_
  std::atomic<int64_t> nextAnswersReadNs_{0};                  // 0: none awaited
  int64_t answersReadUntilNs_ = 0;                             // progress thread only

  std::atomic<uint64_t> reportEpoch_{0};
  std::mutex reportMutex_;
  std::condition_variable reportPosted_;               // with reportMutex_
  std::vector<std::pair<uint64_t, JobReport>> posted_;  // (epoch, report), guarded by reportMutex_
  std::atomic<TimeoutObserver> timeoutObserver_{nullptr};
};

}  // namespace shoal
