// Communicator: the glue behind ncclComm_t (docs/design.md, Nouns).
//
// Role: knows its rank, size, peers and topology; turns user operations into
// Jobs for the Engine. The API layer (src/api) validates arguments, then
// calls one method here. Its parts, each its own noun:
//   - set-up and agreement: initialize() and split() exchange the typed
//     messages of comm/init_agreement.h over the Bootstrap;
//   - PlanCache (comm/plan_cache.h): the tuner and its plans by shape;
//   - ConnectionTable (comm/connection_table.h): connections per (peer,
//     channel), made the first time a plan needs them;
//   - job preparation (communicator_jobs.cc): plans, tags, buffers, scratch
//     and connections of a job, and its submission, waiting and failure;
//   - StreamBridge (comm/stream_bridge.h): operations in a CUDA stream's order;
//   - RedOpTable: user-created reduction operators.
//
// Threading: NCCL's rule holds: one thread uses a communicator at a time
// (submit, split, finalize, destroy). asyncState() and asyncError() may be read
// from any thread at any time (PyTorch's watchdog does). abort() may be called
// from any thread. Connections are touched by the engine only while a job of
// this communicator runs; connection set-up happens in the using thread before
// the job is submitted, when no job of ours can be running on them. The idle
// liveness check (checkIdle, on the progress thread every SHOAL_IDLE_CHECK_MS)
// looks at them too, but only between the user's calls (UseGuard) and while
// no job of ours is in the engine (Engine::queueAtRest).
//
// Lifetime: shared_ptr; the API handle holds one reference, jobs in flight hold
// none (the destructor retires them before the connections die).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "collectives/layout.h"
#include "collectives/plan.h"
#include "comm/connection_table.h"
#include "comm/init_agreement.h"
#include "comm/plan_cache.h"
#include "comm/scratch_pool.h"
#include "core/status.h"
#include "core/tag.h"
#include "core/turns.h"
#include "core/types.h"
#include "cuda/driver.h"
#include "engine/engine.h"
#include "topology/topology.h"

namespace shoal {

// The parsed ncclConfig_t fields Shoal uses (src/api converts, honouring
// NCCL's version rules), kept whole so that split can inherit them.
struct CommOptions {
  bool blocking = true;
  int minChannels = 0;  // 0: tuner's choice
  int maxChannels = 0;
  int splitShare = 0;
  std::string netName;
  std::string commName;
};

struct InitRequest {
  std::shared_ptr<Store> store;
  std::string scope;      // namespace of this communicator's keys in the store
  // Other communicators use the same scope (NCCL_COMM_ID): the set-up then
  // names this one by its generation (Bootstrap::setSharedScope).
  bool sharedScope = false;
  std::string secret;     // authenticates connections between its ranks
  int rank = 0;
  int nranks = 1;
  CommOptions options;
  // Once set, initialize() fails within about Deadline::kCancelCheckMs
  // (ncclCommAbort of a communicator still initializing). Read and cleared
  // by initialize(); the flag must outlive that call.
  const std::atomic<bool>* cancel = nullptr;
};

// One user operation, validated, as the API layer hands it over.
struct OpRequest {
  CollShape shape;
  const void* sendbuff = nullptr;
  void* recvbuff = nullptr;
  OpScalar scalar;        // PreMulSum / float ncclAvg
  // The caller's CUDA stream (cudaStream_t), and whether the operation runs
  // in its order (its buffers are memory CUDA knows; StreamBridge).
  void* stream = nullptr;
  bool streamOrdered = false;
  // It moves no bytes on this rank (a zero count): no buffer says whether
  // it runs in stream order, so in a group it takes the kind of the group's
  // other operations, or of its communicator's last call with buffers where
  // the group has none (group::end), and alone that last call's
  // (Communicator::streamOrdered). NCCL drops a zero-count collective and still matches a
  // zero-byte Send/Recv (PyTorch's all_to_all with empty splits).
  bool noBuffers = false;
};

// A user-created reduction operator (ncclRedOpCreatePreMulSum).
struct CustomRedOp {
  DataType dtype;
  OpScalar scalar;
};

// A communicator's user-created reduction operators. Their ids follow NCCL's
// built-in ones (sum, prod, max, min, avg are 0..4; ncclNumOps is 5, and the
// API layer checks the two agree), from a base that differs between
// communicators and between ranks of one (derived from both): an id passed
// to another communicator is refused there, as NCCL refuses it (its ids are
// mangled by a hash of the communicator), instead of naming an operator of
// that one. As in NCCL, two communicators share a base with a small chance
// (1 in 16,384).
class RedOpTable {
 public:
  static constexpr int kFirstId = 5;
  static constexpr int kMaxLive = 1 << 16;  // operators alive at once
  explicit RedOpTable(uint64_t seed);
  Result<int> create(const CustomRedOp& op);
  Result<CustomRedOp> find(int id) const;
  Status destroy(int id);

 private:
  // The slot of a live operator of this table, or -1.
  int slotOf(int id) const;

  const int base_;  // kFirstId + a multiple of kMaxLive, below 2^30
  mutable std::mutex mutex_;
  std::vector<CustomRedOp> ops_;  // by id - base_
  std::vector<uint8_t> live_;     // 1: the op of that id exists
};

class StreamBridge;
class DevicePlanSteps;
class Window;
class Windows;
class StreamPlans;
class WindowBoards;

class Communicator : public std::enable_shared_from_this<Communicator>, private IdleWatch {
 public:
  explicit Communicator(InitRequest request);
  ~Communicator();

  // Bootstrap: every rank checks in, peers and topology are known, the ranks
  // agree on what their plans depend on, the tuner is ready. Blocking; for
  // nonblocking communicators the API layer runs it on a thread while
  // asyncState() reads kInProgress.
  Status initialize();

  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  // Where the store writes rank `rank`'s will once its process ended
  // (Bootstrap::setWill, at init): ncclCommShrink's agreement looks there.
  std::string goneKey(int rank) const;
  const CommOptions& options() const { return options_; }
  const Topology& topology() const { return topology_; }
  const std::vector<PeerInfo>& peers() const { return peers_; }
  uint64_t commId() const { return commId_.load(std::memory_order_relaxed); }
  std::string describe() const;  // "comm 3f2a.. rank 1/4 (host a)"
  std::string idHex() const;     // the communicator id, 16 hex digits

  // CUDA (docs/cuda.md). A communicator created in a process that uses CUDA
  // runs operations on memory CUDA knows in their stream's order; its device
  // is the current context's at init (-1: none was current).
  bool usesCuda() const { return cuda_ != nullptr; }
  int cudaDevice() const { return cudaDevice_; }
  // The CUDA context current at init (null: none), which its device work
  // runs in; communicators made from it (split, shrink, grow) take it too.
  cuda::ContextHandle cudaContext() const { return ownContext_; }
  // Whether op runs in its stream's order; an invalid argument when it mixes
  // memory CUDA knows with pageable host memory. One with noBuffers does
  // where this rank has a CUDA context (the caller passes no Shoal host
  // stream for it): in a group always (group::end settles it), alone where
  // its last call with buffers did, or none has yet.
  Result<bool> streamOrdered(const OpRequest& op);
  // Whether op moves no bytes on this rank (OpRequest::noBuffers).
  bool movesNoBytes(const OpRequest& op) const;
  // The kind of its last call with buffers: -1 none yet, 0 pageable host
  // memory, 1 stream order.
  int lastBufferKind() const { return lastBufferKind_.load(std::memory_order_relaxed); }
  // Whether a stream-ordered op may go on its stream, asked when it is
  // called (in a group too, as NCCL checks arguments): a stream of another
  // context than the communicator's is an invalid argument, one being
  // captured into a CUDA graph invalid usage where the driver cannot
  // capture (submitCaptured).
  Status admitStream(const OpRequest& op);
  // A stream-ordered submission (every op streamOrdered). With stream memory
  // operations the job waits in the engine for its stream and the call
  // returns at once; synchronously, finishStreamOrdered waits for it and
  // copies the outputs back.
  struct StreamSubmission {
    JobPtr job;
    bool synchronous = false;
    std::vector<OpRequest> ops;  // as the caller passed them
    std::shared_ptr<void> staged;  // the StreamBridge::Staged it uses
    // Streams of the call that carried only pairs to itself: they wait for
    // the plan once it is on the lead stream (ops[0].stream).
    std::vector<cuda::StreamHandle> joinAfter;
  };
  Result<StreamSubmission> beginStreamOrdered(std::span<const OpRequest> ops);
  Status finishStreamOrdered(StreamSubmission& submission);
  Status submitStreamOrdered(std::span<const OpRequest> ops);
  // The distinct streams of ops, first use first (a group's first leads).
  static std::vector<cuda::StreamHandle> streamsOf(std::span<const OpRequest> ops);

  // Submits the operations as one job (a group) and, if `wait`, runs it to
  // completion. A failure becomes the async error too.
  Status submit(std::span<const OpRequest> ops, bool wait);
  // Submits without waiting. A non-detached job must then be waited for with
  // waitFor() by the caller (a group waits for all its communicators' jobs);
  // a detached one is pumped by the progress thread and tracked in asyncState().
  // Returns null when there is nothing to do (zero-count collectives).
  Result<JobPtr> enqueue(std::span<const OpRequest> ops, bool detached);
  // Makes the connections `ops` will need whose set-up does not wait for the
  // peer (Transport::connectWaitsForPeer). A thread that drives several
  // ranks' communicators in one group calls it for all of them before it
  // enqueues any: then a side that waits finds its peer's side already made.
  Status connectAhead(const std::vector<OpRequest>& ops);
  Status waitFor(const Job& job);

  // Set-up work over this communicator's bootstrap (splits, window
  // registrations) meets its peers' in call order, whichever thread runs it
  // (a nonblocking split runs on one of its own): the call takes a turn on
  // the calling thread and passes it to the work, which waits for it.
  using SetupTurn = std::shared_ptr<Turns::Turn>;
  SetupTurn takeSetupTurn() { return setupTurns_->take(); }

  // ncclCommSplit: collective over this communicator. `color` < 0 means no
  // communicator for this rank (returns null). Blocking; `cancel` as in
  // InitRequest; `turn` taken at the call (null: now).
  Result<std::shared_ptr<Communicator>> split(int color, int key, const CommOptions& options,
                                              const std::atomic<bool>* cancel = nullptr, SetupTurn turn = nullptr);

  // ncclCommWindowRegister: collective over this communicator (comm/window.h).
  // Blocking; the window lives until deregisterWindow or the communicator.
  Result<Window*> registerWindow(void* buff, size_t bytes, int flags, SetupTurn turn = nullptr);
  // ncclCommWindowDeregister (local); ncclInvalidUsage for a window that is
  // not one of this communicator's live windows.
  Status deregisterWindow(const void* window);
  // One of this communicator's live windows, or null.
  Window* findWindow(const void* window);

  // Asynchronous state as ncclCommGetAsyncError reports it: kInProgress while
  // init or submitted nonblocking work runs, kOk, or the first error.
  Code asyncState();
  Status asyncError() const;
  void setAsyncError(const Status& status);
  void setInitState(Code code) { initState_.store(code); }

  // Stops everything now: pending and later operations fail. Safe at any point,
  // from any thread.
  void abort();
  bool aborted() const { return abortFlag_.load(); }
  // Flushes outstanding work (ncclCommFinalize).
  Status finalize();

  // ncclRedOpCreatePreMulSum / ncclRedOpDestroy (RedOpTable).
  Result<int> createRedOp(const CustomRedOp& op) { return redOps_.create(op); }
  Result<CustomRedOp> findRedOp(int id) const { return redOps_.find(id); }
  Status destroyRedOp(int id) { return redOps_.destroy(id); }

  // The tuner's estimate for one operation, in microseconds.
  Result<double> estimateUs(const CollShape& shape) const;

  // Diagnostics (shoalCommDumpState): a description, and this rank's hang
  // report (docs/diagnostics.md) as its last line.
  std::string dumpState();
  // This rank's hang report, one JSON object. `known`: the report of the job
  // in flight when the caller has it (the deadline, on the job's thread);
  // otherwise a running job is asked for its own (up to 1 s).
  std::string hangReport(std::string_view reason, const JobReport* known);
  // A hang report's operation in flight for an operation waiting for a connect.
  JobReport reportOfConnect(const ConnectionTable::PendingConnect& pending) const;
  // hangReport written to SHOAL_REPORT_DIR or the log (hang::publish).
  void publishReport(std::string_view reason, const JobReport* known);

 private:
  // Set-up (communicator.cc): initialize()'s steps.
  Status setUp();
  // "comm <id> rank r/n (host h, pid p)": who a will or an abandoned set-up
  // names to the others.
  std::string processLabel() const;
  Result<std::vector<PeerInfo>> exchangePeers(const PeerInfo& self, uint64_t nonce, Deadline deadline);
  Result<InitProposal> proposal(const PeerInfo& self) const;
  std::string whyNotDeviceDirect(const PeerInfo& self) const;
  // How this communicator's transports are chosen: every selection, the
  // proposal's included, sees its ncclConfig_t.netName.
  TransportChoice transportChoice(bool deviceDirect) const {
    return {.deviceDirect = deviceDirect, .net = options_.netName};
  }
  std::string whyNoStreamLinks(const PeerInfo& self) const;
  // A rank that is a thread of this process on this rank's GPU (-1: none,
  // or SHOAL_CUDA_STREAM_PLANS=1, which lets their streams wait on each
  // other's words through the context's shared hardware queues).
  int threadOnOwnGpu(const PeerInfo& self) const;
  void chooseWaitSpin(const PeerInfo& self) const;
  // Init: whether the process uses CUDA and the current device (self.gpu).
  Status findCudaDevice(PeerInfo& self);
  // Ranks sharing a GPU: allowed unless NCCL_MULTI_RANK_GPU_ENABLE=0.
  Status checkSharedGpus() const;

  // Job preparation and submission (communicator_jobs.cc).
  // Fills `job` for the operations (zero-count collectives dropped); false
  // when nothing is left to do.
  // `windowOneShot`: a windowed operation's one-phase plan (PlanCache::windowPlanFor).
  Result<bool> prepareJob(Job& job, std::span<const OpRequest> ops, bool detached, bool windowOneShot = false);
  // Whether a stream-ordered operation runs as a device plan (docs/cuda.md,
  // Device plans): an operation or a group on device buffers whose (merged)
  // plan's compute steps the GPU runs and whose every connection moves
  // device memory, or, `windowed`, one operation whose peer-reading plan
  // reads the peers' windows (then the
  // connections carry only descriptors and barriers). The first time, makes
  // deviceSteps_ (false where it cannot, said at INFO).
  bool runsAsDevicePlan(std::span<const OpRequest> ops, bool windowed);
  // Makes this rank's window board where its streams run stream plans (at
  // a registration; said at INFO where it cannot).
  void ensureWindowBoard();
  // Whether one operation's send and recv buffers lie in windows every rank
  // maps on every rank (comm/window.h), for a collective that reads peers'
  // buffers then (AllReduce, AllGather, ReduceScatter; not PreMulSum, no
  // integer average). Every rank must pass such buffers, as NCCL asks of
  // registered buffers.
  bool inWindows(std::span<const OpRequest> ops);
  // Whether a stream-ordered operation can go on its stream: `refused` says
  // why not (with `context`, a stream of another context than this rank's:
  // an invalid argument; one being captured: invalid usage). The error
  // returned: the driver could not tell.
  Status streamRefusal(const OpRequest& op, bool context, Status& refused);
  // The first refusal of the operations' streams (breaking this rank's
  // window board where peers may be reading its windows for them).
  Status checkStreams(std::span<const OpRequest> ops, bool contexts);
  // Takes a group's Send/Recv pairs to this rank itself out of `ops` and
  // enqueues each as a copy in its streams' order (the k-th Send to itself
  // into the k-th Recv from itself): their lane is no connection's, so a
  // stream plan, which the peers run for the rest of the group, has no link
  // for it. A pair whose sizes differ is an invalid usage, before any copy,
  // and fails the communicator (as the loopback pipe does on host memory).
  Status copySelfPairs(std::vector<OpRequest>& ops);
  // Runs stream-ordered operations (one, or a group) as a stream plan
  // (comm/stream_plan.h) where it can: their plan's every lane has a stream
  // link and its compute steps the GPU runs. False: they go the other ways.
  Result<bool> submitStreamPlan(std::span<const OpRequest> ops, StreamSubmission& submission);
  // Operations on a stream being captured into a CUDA graph (comm/graph_capture.cc,
  // docs/cuda.md "Graph capture"): staged, recorded with a host node that
  // hands a replay job to the engine at each launch of the graph.
  struct CapturedOperation;
  // Whether the operations' stream is being captured; invalid usage for a
  // group on several streams with one of them captured.
  Result<bool> capturedCall(std::span<const OpRequest> ops);
  Status submitCaptured(std::span<const OpRequest> ops);
  // From the graph's host node, on a CUDA driver thread: submits one replay
  // of the captured operation (or, on a failed communicator, releases its
  // stream), without waiting.
  void replayCaptured(CapturedOperation& op);
  // Teardown: replays from now on release their streams and run nothing.
  void detachCaptures();
  // Whether a graph holding operations of this communicator may still be
  // launched: a replay may then be submitted at any moment, so blocking
  // calls queue behind it instead of running inline.
  bool capturesLive();
  // Runs one windowed operation (inWindows) as a stream plan where its
  // windows run on the streams (Window::onStreams, the same on every rank):
  // its plan's messages are window-board operations (comm/window_board.h).
  // False: the host steps through it.
  Result<bool> submitWindowStreamPlan(std::span<const OpRequest> ops, StreamSubmission& submission);
  // Stages, prepares `job` and enqueues its plan on the streams, with the
  // lanes' links `linksOf` gives and the peers' buffers of a peer-reading
  // plan; submits the job's watch. On failure after enqueueing began the
  // communicator has failed.
  Status launchStreamPlan(std::span<const OpRequest> ops, const JobPtr& job,
                          const std::function<void(const Plan&, std::vector<StreamLink*>&)>& linksOf,
                          std::span<const std::array<uint8_t*, 2>> peerBuffers, StreamSubmission& submission,
                          bool windowOneShot = false);
  // Makes deviceSteps_ the first time (false where it cannot, said at INFO).
  bool ensureDeviceSteps();
  // Grows scratch_ to `bytes`, telling the transports that the old arena
  // ends and the new one lasts (transports/registry.h: registrations of it
  // may be kept).
  void growScratch(uint64_t bytes);
  // Before the connections go (destroy, failure): waits (bounded) for the
  // streams to pass every stream plan, whose jobs were retired first.
  // Waits up to waitMs for the streams to pass the stream plans (false: a
  // stream still holds a plan; the connections are then abandoned).
  bool settleStreamPlans(int64_t waitMs);
  // How long a failed call waits so (its streams are past the rings before
  // the connections go).
  static constexpr int64_t kFailureSettleMs = 10000;
  // Whether the streams have passed everything of ours (teardown).
  bool streamsPassed();
  // Teardown with a stream not past our work yet: what it may still use is
  // freed once it has (comm/deferred_release.h).
  void leaveToStreams();
  // Whether op's send and recv buffers share no byte, and op.shape with
  // disjointBuffers so set: calls whose buffers may overlap (in place) and
  // calls whose buffers cannot get plans of their own (collectives/plan.h).
  bool disjointBuffers(const OpRequest& op) const {  // inline: every call asks
    return !buffersMayOverlap(op.shape, op.sendbuff, op.recvbuff, rank_, nranks_);
  }
  CollShape placedShape(const OpRequest& op) const;
  // The plan a stream-ordered call's operations run: one operation's, or a
  // group's merged plan (as prepareJob makes it). Cached.
  Result<std::shared_ptr<const PreparedPlan>> planOf(std::span<const OpRequest> ops);
  // The send and receive buffers an operation touches on this rank, null
  // where it moves no bytes (a zero-count Send's pointer may lie past an
  // allocation's end; a non-root's receive buffer is not touched).
  std::array<const void*, 2> usedBuffers(const OpRequest& op) const;
  uint64_t tagFor(const CollShape& shape) {
    return encodeTag(shape.kind, shape.dtype, shape.count, static_cast<int>(shape.op), shape.root,
                     nextSeq(shape));
  }
  // The next sequence number of the shape's stream (collectives, or sends /
  // receives per peer); every operation takes one, in call order.
  uint64_t nextSeq(const CollShape& shape) {
    if (shape.kind == CollKind::kSend) return sendSeq_[shape.peer]++;
    if (shape.kind == CollKind::kRecv) return recvSeq_[shape.peer]++;
    // One writer (the calling thread); reports read it from another thread.
    const uint64_t seq = collSeq_.load(std::memory_order_relaxed);
    collSeq_.store(seq + 1, std::memory_order_relaxed);
    return seq;
  }
  // A submitted detached job, tracked until it finishes; finished ones are
  // let go first (their errors kept).
  void trackDetached(const JobPtr& job);
  // From a CUDA host function: tracks a graph replay's job; and lets go of
  // the finished replays, their errors kept (only those: an eager job's
  // last reference may free device memory, a CUDA call), so that a program
  // that only launches graphs holds no more than the replays in flight.
  void trackReplay(const JobPtr& job);
  void harvestReplays();
  // No submitted job of ours is unfinished (blocking calls may then run inline).
  bool nothingInFlight();
  void releaseFinishedDetached();
  void dropFinishedDetachedLocked();  // caller holds jobsMutex_
  void eraseFinishedLocked();         // caller holds jobsMutex_
  // Waits for every submitted job of ours.
  Status waitIdle(Deadline deadline);
  Status handleFailure(const Job& job, Status st);
  // A call this rank cannot run as its peers do, found before any of it was
  // submitted: the communicator fails as after a failed operation; peers on
  // stream links fail now, and any peer can read why.
  Status failBeforeRunning(Status st);
  // Waits for a set-up call's turn (communicator.cc says how it gives up).
  Status waitForTurn(Turns::Turn& turn, const std::atomic<bool>* cancel, const char* what);
  // A connection to `peer` this rank could not make (not for an abort): the
  // same, and its connections close, as after a failed operation.
  Status connectFailed(Status st, int peer);
  // The first failure only: publishes this rank's report, extended by what
  // the peers it depended on (`upstreamPeers`) reported, then closes
  // (closeAfterFailure); a later one only sets the error.
  Status publishAndClose(Status st, const std::vector<int>& upstreamPeers);
  // What each peer this rank waited on says of its failure, looked at
  // together within the deadline (a peer that just failed may publish a
  // moment after us): its final report, from its connections or the store,
  // or its will there (its process ended: after its draft, if it had
  // published one), whichever comes first; at the deadline its draft (it
  // may be waiting on this rank). "" for a peer that said nothing.
  std::vector<std::string> upstreamReports(const std::vector<int>& peers, Deadline deadline);
  // After a published failure: no job of ours runs on, its streams are past
  // the FIFOs, every connection closes (peers waiting on us see it now) and
  // the communicator keeps the error (failureMutex_ held).
  void closeAfterFailure(const Status& st);
  // Says `text` of this rank's failure on its connections and in the store
  // (failureMutex_ held). Each report extends the last (shm's side channel
  // only appends): one that does not is added after "; then: ". A draft
  // (not `final`) is this rank's view while it reads its upstream peers'
  // reports (Connection::publishFailure).
  void publishReport(const std::string& text, bool final, Deadline deadline);
  std::string failureKey(int rank) const;
  std::string reportStem() const;  // names this rank's report files

  // How long a failing rank spends reading its peer's report and publishing its own.
  static constexpr int64_t kFailureReportMs = 1500;
  // The least time a look in the store gets for its answer (the last look
  // may begin just before kFailureReportMs ends).
  static constexpr int64_t kStoreLookMs = 200;

  const int rank_;
  const int nranks_;
  CommOptions options_;
  InitRequest request_;
  // The scope's hash; for a shared scope (NCCL_COMM_ID), the scope and
  // generation's from the check-in on (before any connection).
  std::atomic<uint64_t> commId_;
  std::atomic<bool> abortFlag_{false};
  std::unique_ptr<Bootstrap> bootstrap_;
  std::vector<PeerInfo> peers_;
  Topology topology_;
  std::unique_ptr<PlanCache> plans_;  // made at init, once the ranks agreed
  ConnectionTable connections_;       // after peers_ and abortFlag_, which it reads
  // The peers' reports in the store, for stalled jobs (Job::failureReports).
  struct PublishedFailures final : FailureReports {
    ConnectionTable* table;
    explicit PublishedFailures(ConnectionTable* t) : table(t) {}
    std::string knownFailure(int peer) override { return table->knownFailure(peer); }
    void lookUp(int peer) override { table->lookUpFailure(peer); }
  } publishedFailures_{&connections_};
  const std::shared_ptr<Turns> setupTurns_ = Turns::make();
  std::shared_ptr<const std::string> label_;  // describe(), once peers are known
  std::vector<uint8_t> scratch_;        // waited jobs run one at a time: one arena (growScratch)
  std::shared_ptr<ScratchPool> detachedScratch_ = ScratchPool::make();  // jobs nobody waits for

  std::atomic<uint64_t> collSeq_{0};
  // Splits of this communicator so far: names each child's scope. Counted
  // apart from the collectives, which a revoke (or a failure) may have
  // stopped on some ranks and not others.
  uint64_t splits_ = 0;
  std::atomic<bool> runningInline_{false};  // a blocking call runs its job on the caller's thread
  std::unordered_map<int, uint64_t> sendSeq_, recvSeq_;
  std::vector<JobPtr> inFlight_;        // submitted, maybe not done
  std::atomic<bool> anyInFlight_{false};  // !inFlight_.empty(), readable without jobsMutex_
  std::unique_ptr<Job> blockingJob_;    // reused by blocking calls that run inline
  std::mutex capturesMutex_;
  std::vector<std::shared_ptr<CapturedOperation>> captures_;  // guarded by capturesMutex_; pruned when their graphs go
  std::atomic<bool> anyCaptures_{false};  // !captures_.empty()

  void releaseWindows(std::vector<std::unique_ptr<Window>>& windows);
  // Releases deregistered windows once no submitted job may read them.
  void releaseRetiredWindows();

  RedOpTable redOps_;
  std::shared_ptr<Windows> windows_;  // registered, not yet deregistered
  // This rank's window board and its peers' (made by the first registration
  // where its streams run stream memory operations); shared with the
  // stream plans, which keep it while a stream may use it.
  std::shared_ptr<WindowBoards> boards_;
  bool boardsHeld_ = false;  // given to streamPlans_ (held while its streams may use them)
  // Submitted operations that may read windows, numbered by
  // Windows::noteSubmitted (guarded by jobsMutex_), and the number up to
  // which every one is through (popping those that are).
  std::deque<std::pair<uint64_t, JobPtr>> windowJobs_;
  void trackWindowOperation(const JobPtr& job);
  // Breaks this rank's window board for good (every wait of this rank's
  // streams on it passes; peers' plans on it fail): the communicator has failed.
  void breakWindowBoards();
  uint64_t windowOperationsThrough();
  bool streamsUnsettled_ = false;  // a stream held a plan past settleStreamPlans()
  uint64_t windowRegistrations_ = 0;  // names each registration's descriptor tickets
  // Why operations on windows are staged on every rank ("" when they are
  // not): a rank whose GPU has too few hardware queues or synchronous
  // streams (InitAgreement).
  std::string windowsStaged_;

  cuda::Driver* cuda_ = nullptr;         // set at init when the process uses CUDA
  int cudaDevice_ = -1;
  // The context current at init (null: no GPU then), which this rank's
  // device work runs in, made current with a cuda::ContextScope: NCCL's
  // calls may come with another device current (one thread driving the
  // communicators of several GPUs in a group) or none.
  cuda::ContextHandle ownContext_ = nullptr;
  std::unique_ptr<StreamBridge> bridge_;  // made by the first stream-ordered operation
  // The kind of the last call with buffers (streamOrdered): -1 none yet,
  // 0 host memory, 1 stream order; a call of no bytes takes it.
  std::atomic<int> lastBufferKind_{-1};
  // Device plans' compute steps and scratch, made by the first one (its
  // jobs share it, comm/device_steps.h); deviceStepsTried_ once that was tried.
  std::shared_ptr<DevicePlanSteps> deviceSteps_;
  bool deviceStepsTried_ = false;
  std::unique_ptr<StreamPlans> streamPlans_;  // made by the first stream plan
  // Stream plans' scratch, apart from device plans': those run in the
  // engine's order, stream plans in their streams', and nothing orders one
  // against the other across two streams. Made and let go with streamPlans_.
  std::shared_ptr<DevicePlanSteps> streamPlanScratch_;

  std::atomic<Code> initState_{Code::kInProgress};
  mutable std::mutex asyncMutex_;
  Status asyncError_;
  std::atomic<bool> failed_{false};  // asyncError_ is set: the calls' fast check
  std::mutex jobsMutex_;
  std::mutex failureMutex_;
  bool failurePublished_ = false;  // handleFailure ran: reports out, connections closed
  bool refusalPublished_ = false;  // failBeforeRunning wrote its report (no teardown)
  std::string publishedReport_;    // what publishReport said last

  // The idle liveness check. A method that touches connections_ or a
  // connection outside the engine (making them, running a job inline,
  // handling a failure, handing jobs to the engine) holds a UseGuard for the
  // call; checkIdle raises checking_. Each side sets its own flag, then reads
  // the other's (both sequentially consistent), so they never both go on: a
  // check that sees a user skips this round; a call that sees a check waits
  // for it (microseconds, no system call that can block).
  class UseGuard {
   public:
    explicit UseGuard(Communicator& c) : c_(c) {
      c_.users_.fetch_add(1);
      while (c_.checking_.load()) std::this_thread::yield();
    }
    ~UseGuard() { c_.users_.fetch_sub(1, std::memory_order_release); }
    UseGuard(const UseGuard&) = delete;
    UseGuard& operator=(const UseGuard&) = delete;

   private:
    Communicator& c_;
  };
  // IdleWatch: on the progress thread. A connection that finds its peer gone
  // fails the communicator (async error, as a failed operation would), as
  // does a peer that a look for wills found gone (askWhetherAnyGone),
  // whose answer readIdleAnswer reads.
  bool checkIdle() override;
  bool readIdleAnswer() override;
  // Raises checking_ and runs `look` on the connections while nobody else
  // uses them (false: they are busy, or the communicator has failed).
  bool whileIdle(const std::function<void()>& look);
  // A peer a look found gone (ConnectionTable::judgedPeer) fails the
  // communicator; true when one did.
  bool failForJudgedPeer();
  // Fails the communicator for a peer lost while idle.
  void failIdle(const Status& lost);
  std::atomic<int> users_{0};        // UseGuards alive (nested ones count)
  std::atomic<bool> checking_{false};
  uint64_t anyGoneTicket_ = 0;       // progress thread: the last look asked (askWhetherAnyGone)
  bool idleWatched_ = false;         // registered with Engine::watchIdle at init
};

}  // namespace shoal
