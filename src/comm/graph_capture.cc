// Communicator: operations captured into CUDA graphs (docs/cuda.md, "Graph
// capture").
//
// A call on a stream being captured runs nothing then. It is staged as a
// stream-ordered call is, into a slot of its own that the graph keeps (a
// CUDA user object ties the record below to the graph), and the capture
// records: the inputs copied in, "done := 0", a host node, a wait for
// "done >= seq", the outputs copied out. Each launch of the graph runs the
// host node when the stream reaches it: it submits a copy of the job made at
// capture to the engine (never waiting), which writes "done" however the job
// ends, as for every stream-ordered job. The job runs ahead of jobs queued
// earlier whose streams have not reached them (Job::runsAhead): those come
// after the graph on its stream.
//
// The replayed job carries the tags made at capture (the same on every
// rank, since every rank captures the same calls in the same order), so a
// replay's messages are checked against the peers' replays of the same call.
//
// A call that would run eagerly as a device plan (device-direct connections,
// its buffers on the communicator's GPU: runsAsDevicePlan) replays as one:
// nothing is staged or copied, the job reads and writes the user's buffers
// and reduces in the kernels. Its steps' CUDA calls run on the engine's
// thread, never in the host node; the device steps are the communicator's,
// taken at each replay (a graph outliving the communicator replays nothing,
// and its record holds nothing whose end calls CUDA, since the record may
// end in the graph's destructor callback).
#include <algorithm>
#include <iterator>

#include "comm/communicator.h"
#include "comm/device_steps.h"
#include "comm/stream_bridge.h"
#include "core/log.h"

namespace shoal {

// One captured call: what its replays submit, and whom. Lives as long as the
// graph (the user object's reference) and the communicator's list.
struct Communicator::CapturedOperation {
  std::mutex mutex;                   // held by a replay's submission and by detach
  Communicator* comm = nullptr;       // null once the communicator is torn down
  // The job made at capture (never submitted itself): its plan, staged
  // buffers, lanes, tags and scratch.
  Job made;
  uint64_t* done = nullptr;           // the slot's word the stream waits on
  uint64_t seq = 0;
  bool devicePlan = false;            // replays run as device plans on the user's buffers
  std::shared_ptr<std::atomic<bool>> graphGone = std::make_shared<std::atomic<bool>>(false);
  bool releaseLogged = false;         // guarded by mutex

  // Host node: the stream reached a replay. No CUDA call, no wait.
  static void replay(void* arg) {
    auto* op = static_cast<CapturedOperation*>(arg);
    std::lock_guard<std::mutex> lock(op->mutex);
    if (op->comm != nullptr) {
      op->comm->replayCaptured(*op);
      return;
    }
    // The communicator is gone: the stream goes on over the staging as it is.
    if (!op->releaseLogged) {
      op->releaseLogged = true;
      SHOAL_WARN("CUDA graph replay of a collective whose communicator was destroyed: it runs nothing, and "
                 "its output buffers get whatever its staging holds");
    }
    writeStreamWord(op->done, op->seq);
  }
  // The user object's destructor: the graph and its executable graphs are
  // gone. Frees nothing of CUDA's (the bridge frees the slot later).
  static void graphDestroyed(void* holder) {
    auto* held = static_cast<std::shared_ptr<CapturedOperation>*>(holder);
    (*held)->graphGone->store(true, std::memory_order_release);
    delete held;
  }
};

Status Communicator::submitCaptured(std::span<const OpRequest> ops) {
  // Allocations made now (staging, scratch) must not invalidate the capture.
  cuda::RelaxedCaptureScope relaxed(*cuda_);
  const auto stream = static_cast<cuda::StreamHandle>(ops[0].stream);
  SHOAL_ASSIGN_OR_RETURN(cuda::GraphHandle graph, cuda_->captureGraph(stream), describe());
  if (graph == nullptr) return internalError(describe(), ": the stream stopped capturing during the call");
  if (bridge_->waitMode() == cuda::WaitMode::kSynchronous)
    return invalidUsage(describe(), ": ", collKindName(ops[0].shape.kind), " on a stream that is being captured "
                        "into a CUDA graph: this device's streams are synchronous (",
                        cuda::waitModeName(cuda::WaitMode::kSynchronous), ", SHOAL_CUDA_WAIT or neither stream "
                        "memory operations nor the wait kernel work), which a graph cannot replay");
  auto op = std::make_shared<CapturedOperation>();
  // Windows are left staged: their eager plans read the peers' buffers in
  // place, which every rank must decide alike from what it captures.
  op->devicePlan = !inWindows(ops) && runsAsDevicePlan(ops, /*windowed=*/false);
  SHOAL_ASSIGN_OR_RETURN(StreamBridge::Staged staged,
                         bridge_->stageCaptured(ops, rank_, nranks_, op->graphGone, op->devicePlan), describe());
  if (op->devicePlan) op->made.deviceSteps = deviceSteps_;  // its scratch is the device steps'
  Result<bool> any = prepareJob(op->made, staged.ops, /*detached=*/true);
  op->made.deviceSteps.reset();  // taken from the communicator at each replay
  if (!any.isOk() || !any.value()) {
    op->graphGone->store(true, std::memory_order_release);  // the slot comes back: nothing was recorded
    if (!any.isOk()) return any.takeStatus();
    return Status::ok();
  }
  op->done = staged.done;
  op->seq = staged.seq;
  op->comm = this;
  // The graph owns the record from here on (if this fails, the record is
  // gone and the slot free again).
  SHOAL_TRY(cuda_->tieToGraph(graph, new std::shared_ptr<CapturedOperation>(op), &CapturedOperation::graphDestroyed))
      << describe() << ": tying a captured " << collKindName(ops[0].shape.kind) << " to its CUDA graph";
  {
    std::lock_guard<std::mutex> lock(capturesMutex_);
    std::erase_if(captures_, [](const auto& c) { return c->graphGone->load(std::memory_order_acquire); });
    captures_.push_back(op);
    anyCaptures_.store(true, std::memory_order_release);
  }
  SHOAL_TRY(bridge_->enqueueCaptured(staged, ops, &CapturedOperation::replay, op.get()))
      << describe() << ": capturing " << collKindName(ops[0].shape.kind) << " into a CUDA graph";
  SHOAL_TRACE(subsys::kColl, op->made.description(), " captured into a CUDA graph",
              op->devicePlan ? " (replayed as a device plan)" : " (staged)");
  return Status::ok();
}

void Communicator::replayCaptured(CapturedOperation& op) {
  UseGuard use(*this);  // not while the idle check looks at the connections
  // A replay that failed, of this call or another, fails the communicator
  // before this one runs, as an eager call does (its connections may be
  // broken, and a posted receive of it may still be written into the
  // staging the next replay uses). A failed job is known as such before its
  // stream goes on (Job::finish).
  harvestReplays();
  if (aborted() || failed_.load(std::memory_order_acquire)) {
    writeStreamWord(op.done, op.seq);  // the error is the communicator's already
    return;
  }
  const Job& made = op.made;
  auto job = std::make_shared<Job>();
  job->prepared = made.prepared;
  job->buffers = made.buffers;
  job->laneConnections = made.laneConnections;
  job->opTags = made.opTags;
  job->opScalars = made.opScalars;
  job->queueId = made.queueId;
  job->abortFlag = made.abortFlag;
  job->failureReports = made.failureReports;
  job->commLabel = made.commLabel;
  job->kind = made.kind;
  job->groupedOps = made.groupedOps;
  job->sequence = made.sequence;
  job->ownedScratch = made.ownedScratch;  // shared by the replays, which run one at a time
  if (op.devicePlan) job->deviceSteps = deviceSteps_;
  job->detached = true;
  job->runsAhead = true;
  job->streamDone = op.done;
  job->streamSeq = op.seq;
  Engine::instance().submit(job);
  trackReplay(job);
}

void Communicator::detachCaptures() {
  std::vector<std::shared_ptr<CapturedOperation>> captures;
  {
    std::lock_guard<std::mutex> lock(capturesMutex_);
    captures.swap(captures_);
    anyCaptures_.store(false, std::memory_order_release);
  }
  for (const auto& op : captures) {
    std::lock_guard<std::mutex> lock(op->mutex);  // waits for a replay being submitted
    op->comm = nullptr;
  }
}

bool Communicator::capturesLive() {
  if (!anyCaptures_.load(std::memory_order_acquire)) return false;
  std::lock_guard<std::mutex> lock(capturesMutex_);
  std::erase_if(captures_, [](const auto& c) { return c->graphGone->load(std::memory_order_acquire); });
  anyCaptures_.store(!captures_.empty(), std::memory_order_release);
  return !captures_.empty();
}

}  // namespace shoal
