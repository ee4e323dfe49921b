// Communicator: job preparation, submission, waiting and failure handling,
// and operations in a CUDA stream's order (StreamBridge). Set-up and the
// rest: communicator.cc.
#include <algorithm>
#include <array>
#include <chrono>
#include <functional>
#include <iterator>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include "collectives/builders.h"
#include "comm/communicator.h"
#include "comm/device_steps.h"
#include "comm/group.h"
#include "comm/stream_bridge.h"
#include "comm/stream_plan.h"
#include "comm/window.h"
#include "comm/window_board.h"
#include "core/clock.h"
#include "core/log.h"
#include "transports/registry.h"

namespace shoal {

namespace {

// NCCL's in place with blocks: AllGather's send buffer is this rank's block
// of its receive buffer, ReduceScatter's receive buffer its block of the send.
struct BlockInPlace {
  bool gather = false, scatter = false;
};
BlockInPlace blockInPlaceOf(const OpRequest& op, const OpLayout& layout, int rank) {
  const auto send = reinterpret_cast<uintptr_t>(op.sendbuff), recv = reinterpret_cast<uintptr_t>(op.recvbuff);
  const auto r = static_cast<uintptr_t>(rank);
  return BlockInPlace{op.shape.kind == CollKind::kAllGather && send == recv + r * layout.sendBytes,
                      op.shape.kind == CollKind::kReduceScatter && recv == send + r * layout.recvBytes};
}

// NCCL drops zero-count collectives; zero-byte Send/Recv still match.
bool droppedByNccl(const OpRequest& op) {
  return op.shape.count == 0 && op.shape.kind != CollKind::kSend && op.shape.kind != CollKind::kRecv;
}

// Whether one communicator's part of a group plans its collectives as parts
// of a merged plan (PlanCache::planFor `grouped`: no peer reads): only when
// it holds more than one collective. Send and Recv do not count, since ranks
// may group them differently (NCCL allows it) while a collective must be
// planned alike on every rank; a lone collective's plan, peer-reading or
// not, merges with them.
bool collectivesGrouped(std::span<const OpRequest> ops) {
  return std::count_if(ops.begin(), ops.end(), [](const OpRequest& op) {
           return op.shape.kind != CollKind::kSend && op.shape.kind != CollKind::kRecv && !droppedByNccl(op);
         }) > 1;
}

// What `report` adds to `text`: all of it, nothing where `text` holds it
// already, or its tail where `text` ends with its start. A closed shm
// connection's error ends with the peer's draft report ("it reported:
// ..."), and the final report extends the draft.
std::string_view addedBy(std::string_view report, std::string_view text) {
  if (text.find(report) != std::string_view::npos) return {};
  constexpr size_t kLeastOverlap = 32;  // shorter is no quote, only a coincidence
  for (size_t overlap = std::min(text.size(), report.size()); overlap >= kLeastOverlap; --overlap)
    if (text.ends_with(report.substr(0, overlap))) return report.substr(overlap);
  return report;
}

}  // namespace

CollShape Communicator::placedShape(const OpRequest& op) const {
  CollShape shape = op.shape;
  shape.disjointBuffers = disjointBuffers(op);
  return shape;
}

void Communicator::harvestReplays() {
  std::lock_guard<std::mutex> lock(jobsMutex_);
  std::erase_if(inFlight_, [&](const JobPtr& j) {
    if (!j->runsAhead || !j->isDone()) return false;
    if (!j->status().isOk()) setAsyncError(j->status());
    return true;
  });
  anyInFlight_.store(!inFlight_.empty(), std::memory_order_release);
}

void Communicator::trackReplay(const JobPtr& job) {
  std::lock_guard<std::mutex> lock(jobsMutex_);
  inFlight_.push_back(job);
  anyInFlight_.store(true, std::memory_order_release);
}

void Communicator::trackDetached(const JobPtr& job) {
  std::lock_guard<std::mutex> lock(jobsMutex_);
  // Calls nobody waits for (stream-ordered ones, a nonblocking
  // communicator's never polled) hold only what is still in flight.
  dropFinishedDetachedLocked();
  inFlight_.push_back(job);
  anyInFlight_.store(true, std::memory_order_release);
}

std::array<const void*, 2> Communicator::usedBuffers(const OpRequest& op) const {
  const OpLayout layout = opLayout(op.shape, rank_, nranks_);
  return {layout.sendBytes ? op.sendbuff : nullptr, layout.recvBytes ? static_cast<const void*>(op.recvbuff) : nullptr};
}

Result<std::shared_ptr<const PreparedPlan>> Communicator::planOf(std::span<const OpRequest> ops) {
  const bool grouped = collectivesGrouped(ops);
  if (ops.size() == 1) return plans_->planFor(placedShape(ops[0]), grouped);
  std::vector<std::shared_ptr<const PreparedPlan>> parts;
  for (const OpRequest& op : ops) {
    SHOAL_ASSIGN_OR_RETURN(std::shared_ptr<const PreparedPlan> part, plans_->planFor(placedShape(op), grouped));
    parts.push_back(std::move(part));
  }
  return plans_->mergedPlanFor(std::move(parts));
}

bool Communicator::movesNoBytes(const OpRequest& op) const {
  const OpLayout layout = opLayout(op.shape, rank_, nranks_);
  return layout.sendBytes == 0 && layout.recvBytes == 0 && op.scalar.deviceScalar == nullptr;
}

Result<bool> Communicator::streamOrdered(const OpRequest& op) {
  if (cuda_ == nullptr) return false;
  if (!bridge_) {
    // The bridge loads its kernels in this rank's context, whatever the
    // caller has current.
    cuda::ContextScope scope(cuda_, cudaContext());
    SHOAL_TRY(scope.status()) << describe() << ": making its CUDA context current";
    SHOAL_ASSIGN_OR_RETURN(std::optional<cuda::DeviceIdentity> device, cuda_->currentDevice(),
                           describe(), ": the current CUDA device");
    cuda::DeviceIdentity identity = device ? *device : cuda::DeviceIdentity{};
    if (!device) {
      if (op.noBuffers) return false;
      // No context: the buffers cannot be device memory of this thread's;
      // classify them anyway (a CUDA error never means "host pointer").
      SHOAL_ASSIGN_OR_RETURN(cuda::MemoryKind kind, cuda_->memoryKind(op.sendbuff ? op.sendbuff : op.recvbuff));
      if (!cuda::knownToCuda(kind)) return false;
      return invalidUsage(describe(), ": ", cuda::memoryKindName(kind),
                          " buffers need a current CUDA context on the calling thread");
    }
    // A first call inside a capture loads kernels and allocates: relaxed,
    // so that it does not invalidate the capture.
    cuda::RelaxedCaptureScope relaxed(*cuda_);
    bridge_ = std::make_unique<StreamBridge>(*cuda_, identity);
  }
  if (op.noBuffers) {
    // In a group, in stream order (its stream admitted) until the group's
    // other operations say otherwise (group::end). Alone, as the
    // communicator's calls with buffers went (its ranks make the same calls,
    // so they agree); before any, in stream order.
    if (group::active()) return true;
    return lastBufferKind() != 0;
  }
  SHOAL_ASSIGN_OR_RETURN(bool ordered, bridge_->streamOrdered(op, rank_, nranks_));
  lastBufferKind_.store(ordered ? 1 : 0, std::memory_order_relaxed);
  return ordered;
}

Status Communicator::streamRefusal(const OpRequest& op, bool context, Status& refused) {
  // Its kernels are loaded in its context and run on no other's streams
  // (a special stream is the current context's: this rank's, made current).
  if (context && cudaContext() != nullptr && !cuda::Driver::specialStream(op.stream)) {
    SHOAL_ASSIGN_OR_RETURN(cuda::ContextHandle streams, cuda_->streamContext(op.stream), describe(),
                           ": the stream's CUDA context");
    if (streams != cudaContext()) {
      refused = invalidArgument(describe(), ": ", collKindName(op.shape.kind), " on a stream of another CUDA "
                                "context than the communicator's (device ", cudaDevice_, "): pass a stream of "
                                "its device");
      return Status::ok();
    }
  }
  SHOAL_ASSIGN_OR_RETURN(bool capturing, cuda_->isCapturing(op.stream), describe());
  if (capturing && !cuda_->capturesGraphs())
    refused = invalidUsage(describe(), ": ", collKindName(op.shape.kind),
                           " on a stream that is being captured into a CUDA graph: the CUDA driver lacks what "
                           "capture needs (cuStreamGetCaptureInfo, host functions, user objects; see the INFO "
                           "log), so call it outside the capture");
  return Status::ok();
}

Result<bool> Communicator::capturedCall(std::span<const OpRequest> ops) {
  const std::vector<cuda::StreamHandle> streams = streamsOf(ops);
  size_t capturing = 0;
  for (cuda::StreamHandle s : streams) {
    SHOAL_ASSIGN_OR_RETURN(bool c, cuda_->isCapturing(s), describe());
    capturing += c ? 1 : 0;
  }
  if (capturing == 0) return false;
  if (streams.size() > 1)
    return invalidUsage(describe(), ": a group on ", streams.size(), " streams, ", capturing,
                        " of them being captured into a CUDA graph: Shoal captures a group only when all "
                        "its operations of a communicator are on one stream");
  return true;
}

Status Communicator::checkStreams(std::span<const OpRequest> ops, bool contexts) {
  for (const OpRequest& op : ops) {
    Status refused;
    SHOAL_TRY(streamRefusal(op, contexts, refused));
    if (refused.isOk()) continue;
    // Peers running a call on symmetric windows wait on this rank's board:
    // they learn of it now, and the communicator has failed. (A call
    // refused inside a group is judged alone: one that would read windows
    // alone fails the communicator even if the group would not have; after
    // an error NCCL's users abort anyway.)
    if (boards_ && inWindows(ops)) {
      breakWindowBoards();
      setAsyncError(refused);
    }
    return refused;
  }
  return Status::ok();
}

Status Communicator::admitStream(const OpRequest& op) {
  if (droppedByNccl(op)) return Status::ok();  // never reaches a stream
  cuda::ContextScope scope(cuda_, cudaContext());
  SHOAL_TRY(scope.status()) << describe() << ": making its CUDA context current";
  return checkStreams(std::span<const OpRequest>(&op, 1), /*contexts=*/true);
}

Result<Communicator::StreamSubmission> Communicator::beginStreamOrdered(std::span<const OpRequest> ops) {
  UseGuard use(*this);
  if (!bridge_) return internalError(describe(), ": stream-ordered operation without a bridge");
  // Its kernels, streams and copies are this rank's context's, as NCCL sets
  // the communicator's device for its calls.
  cuda::ContextScope scope(cuda_, cudaContext());
  SHOAL_TRY(scope.status()) << describe() << ": making its CUDA context current";
  if (aborted()) return error(Code::kAborted, describe(), " was aborted");
  StreamSubmission submission;
  std::vector<OpRequest> kept;
  std::remove_copy_if(ops.begin(), ops.end(), std::back_inserter(kept), droppedByNccl);
  if (kept.empty()) return submission;  // nothing reaches the stream
  // Each call's stream was admitted when it was made (admitStream); a group
  // may have begun capturing one since.
  SHOAL_TRY(checkStreams(kept, /*contexts=*/false));
  SHOAL_ASSIGN_OR_RETURN(bool captured, capturedCall(kept));
  if (captured) {
    SHOAL_TRY(copySelfPairs(kept));  // copies on the stream: recorded too
    if (!kept.empty()) {
      SHOAL_TRY(submitCaptured(kept));
    }
    return submission;  // nothing to finish: the graph's launches run it
  }
  std::vector<cuda::StreamHandle> streams = streamsOf(kept);
  SHOAL_TRY(copySelfPairs(kept));
  if (kept.empty()) return submission;  // copies on the streams only
  // A stream that carried only pairs to itself still joins the group, as
  // every stream of an NCCL group waits for the others: the plan starts
  // after its earlier work, and its later work comes after the plan
  // (finishStreamOrdered).
  const std::vector<cuda::StreamHandle> planStreams = streamsOf(kept);
  for (cuda::StreamHandle s : streams)
    if (std::find(planStreams.begin(), planStreams.end(), s) == planStreams.end())
      submission.joinAfter.push_back(s);
  const cuda::StreamHandle lead[1] = {static_cast<cuda::StreamHandle>(kept[0].stream)};
  SHOAL_TRY(joinStreams(*cuda_, submission.joinAfter, lead)) << describe();
  submission.synchronous = bridge_->waitMode() == cuda::WaitMode::kSynchronous;
  // An operation on windows reads its peers' buffers in place (one copy),
  // before any other way.
  // Windows that run on the streams do so on every rank, whatever this
  // rank's streams can do now (it fails the call if they cannot).
  const bool inWindow = inWindows(kept);
  const bool windowed = !submission.synchronous && inWindow;
  {
    SHOAL_ASSIGN_OR_RETURN(bool streamed,
                           inWindow ? submitWindowStreamPlan(kept, submission) : submitStreamPlan(kept, submission));
    if (streamed) return submission;
  }
  const bool direct = !submission.synchronous && runsAsDevicePlan(kept, windowed);
  // Its peers read its windows in place, and it theirs: staging is no way
  // out (this rank would run another plan than they do). Also where its
  // streams turned synchronous after init (memory operations refused at a
  // call; synchronous streams known at init stage every rank's calls): then
  // its peers are already running the call, so the communicator fails and
  // they learn of it.
  if (inWindow && !direct) {
    if (submission.synchronous) {
      Status st = invalidUsage(describe(), ": ", collKindName(kept[0].shape.kind),
                               " on buffers in windows (ncclCommWindowRegister), which every rank reads in place: "
                               "this rank's streams turned synchronous after init (a stream memory operation was "
                               "refused), so it cannot run the plan its peers run");
      if (boards_) breakWindowBoards();
      setAsyncError(st);
      return st;
    }
    return error(Code::kInvalidUsage, describe(), ": ", collKindName(kept[0].shape.kind),
                 " on buffers in windows (ncclCommWindowRegister), which every rank reads in place, cannot run "
                 "as a device plan on this rank (its buffers must be device memory of the communicator's GPU, and "
                 "its device plan steps made: see the INFO log)");
  }
  SHOAL_ASSIGN_OR_RETURN(StreamBridge::Staged staged, bridge_->stage(kept, rank_, nranks_, direct), describe());
  auto held = std::make_shared<StreamBridge::Staged>(std::move(staged));
  StreamBridge::Staged& st = *held;
  if (submission.synchronous) {
    if (Status s = bridge_->copyIn(st, kept); !s.isOk()) {
      bridge_->release(st);
      return StatusBuilder(std::move(s)) << describe();
    }
    Result<JobPtr> job = enqueue(st.ops, /*detached=*/false);
    if (!job.isOk()) {
      bridge_->release(st);
      return job.takeStatus();
    }
    submission.job = job.value();
  } else {
    // The stream's work first: a job whose stream work could not be
    // enqueued never takes a sequence number its peers would wait for.
    if (Status s = bridge_->enqueue(st, kept); !s.isOk()) {
      if (s.code() != Code::kUnsupported) return StatusBuilder(std::move(s)) << describe();
      // The device refused stream memory operations: synchronous from now on
      // (the pairs to itself are on the streams already).
      Result<StreamSubmission> again = beginStreamOrdered(kept);
      if (again.isOk()) again.value().joinAfter = std::move(submission.joinAfter);
      return again;
    }
    auto job = std::make_shared<Job>();
    if (direct) job->deviceSteps = deviceSteps_;
    if (direct && windowed) job->peerBuffers = windows_;
    Result<bool> any = prepareJob(*job, st.ops, /*detached=*/true);
    if (!any.isOk() || !any.value()) {
      StreamBridge::releaseStream(st);  // the stream goes on; its slot comes back once it has
      if (!any.isOk()) return any.takeStatus();
      return submission;
    }
    job->streamReady = st.ready;
    job->streamDone = st.done;
    job->streamSeq = st.seq;
    Engine::instance().submit(job);
    trackDetached(job);
    submission.job = job;
    if (job->peerBuffers) {
      trackWindowOperation(job);
      SHOAL_TRACE(subsys::kColl, job->description(), " count ", kept[0].shape.count,
                  " as a device plan reading the peers' windows");
    }
  }
  submission.ops = std::move(kept);
  submission.staged = std::move(held);
  return submission;
}

Status Communicator::copySelfPairs(std::vector<OpRequest>& ops) {
  std::vector<size_t> sends, recvs;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].shape.peer != rank_) continue;
    if (ops[i].shape.kind == CollKind::kSend) sends.push_back(i);
    if (ops[i].shape.kind == CollKind::kRecv) recvs.push_back(i);
  }
  const size_t pairs = std::min(sends.size(), recvs.size());
  if (pairs == 0) return Status::ok();
  auto bytesOf = [](const OpRequest& op) { return op.shape.count * dataTypeSize(op.shape.dtype); };
  for (size_t k = 0; k < pairs; ++k) {
    const OpRequest& send = ops[sends[k]];
    const OpRequest& recv = ops[recvs[k]];
    if (bytesOf(send) != bytesOf(recv))
      return failBeforeRunning(invalidUsage(describe(), ": Send to itself #", k, " of ", bytesOf(send),
                                            " bytes meets Recv from itself #", k, " of ", bytesOf(recv),
                                            " bytes (sizes must match)"));
  }
  std::vector<bool> taken(ops.size(), false);
  for (size_t k = 0; k < pairs; ++k) {
    const OpRequest& send = ops[sends[k]];
    const OpRequest& recv = ops[recvs[k]];
    taken[sends[k]] = taken[recvs[k]] = true;
    const uint64_t bytes = bytesOf(send);
    if (bytes == 0 || send.sendbuff == recv.recvbuff) continue;
    auto sendStream = static_cast<cuda::StreamHandle>(send.stream);
    auto recvStream = static_cast<cuda::StreamHandle>(recv.stream);
    Status st;
    if (sendStream == recvStream) {
      st = cuda_->copyAsync(recv.recvbuff, send.sendbuff, bytes, recvStream);
    } else {
      // On the receive's stream once the send's has reached the call; the
      // send's stream goes on once the copy is done (its buffer is read).
      const cuda::StreamHandle sender[1] = {sendStream}, receiver[1] = {recvStream};
      st = joinStreams(*cuda_, sender, receiver);
      if (st.isOk()) st = cuda_->copyAsync(recv.recvbuff, send.sendbuff, bytes, recvStream);
      if (st.isOk()) st = joinStreams(*cuda_, receiver, sender);
    }
    if (!st.isOk())
      return StatusBuilder(std::move(st)) << describe() << ": Send/Recv to itself, a copy of " << bytes << " bytes";
  }
  size_t kept = 0;
  for (size_t i = 0; i < ops.size(); ++i)
    if (!taken[i]) ops[kept++] = ops[i];
  ops.resize(kept);
  return Status::ok();
}

Result<bool> Communicator::submitStreamPlan(std::span<const OpRequest> ops, StreamSubmission& submission) {
  // Between ranks, where every connection moves device memory (known per
  // peer, no connection made), then the plan's own lanes.
  if (nranks_ < 2) return false;
  Result<std::shared_ptr<const PreparedPlan>> found = planOf(ops);
  if (!found.isOk()) return false;  // prepareJob reports it
  const std::shared_ptr<const PreparedPlan> prepared = std::move(found).value();
  if (!connections_.movesDeviceMemory(*prepared->plan)) return false;
  // Whether it runs on the streams depends on what every rank's plan holds
  // and on the connections, the same on both sides of each: every rank
  // decides alike.
  const bool grouped = collectivesGrouped(ops);
  for (const OpRequest& op : ops) {
    Result<bool> everywhere = plans_->deviceStepsRunEverywhere(placedShape(op), grouped);
    if (!everywhere.isOk() || !everywhere.value()) return false;
  }
  const Plan& plan = *prepared->plan;
  if (plan.steps.empty()) return false;
  if (anyInFlight_.load(std::memory_order_acquire)) releaseFinishedDetached();  // an earlier failure first
  if (failed_.load(std::memory_order_acquire)) {
    Status e = asyncError();
    return Status(e.code(), str(describe(), " is in an error state from an earlier operation: ", e.message()));
  }
  std::vector<Connection*> lanes;
  int failedPeer = -1;
  if (Status connected = connections_.forPlan(plan, lanes, nullptr, &failedPeer); !connected.isOk()) {
    // Its peers may be running their halves on stream links already: the
    // communicator fails, as for any call it cannot run as they do, and its
    // connections close, failing their plans on its links.
    return connectFailed(std::move(connected), failedPeer);
  }
  if (!StreamPlans::linksAll(lanes)) return false;
  // Its peers run it on their streams: so must this rank, or fail the
  // communicator (and the rings, so that the peers fail now, not at their
  // deadline).
  if (bridge_->waitMode() != cuda::WaitMode::kMemOps)
    return failBeforeRunning(error(Code::kUnsupported, describe(), ": its cuda_ipc connections run stream plans, "
                                   "and this rank's streams no longer run stream memory operations"));
  if (!ensureDeviceSteps())
    return failBeforeRunning(error(Code::kCudaError, describe(), ": its connections run stream plans, and this "
                                   "rank has no device reduction kernels or device plan stream (see the INFO log)"));
  for (const OpRequest& op : ops) {
    for (const void* buffer : usedBuffers(op)) {
      if (buffer == nullptr) continue;
      SHOAL_ASSIGN_OR_RETURN(cuda::Driver::Place place, cuda_->placeOf(buffer), describe());
      // Managed and pinned memory: reachable through unified addressing.
      if (place.kind == cuda::MemoryKind::kDevice && place.device != bridge_->device().ordinal)
        return invalidArgument(describe(), ": ", collKindName(op.shape.kind), " buffer ", buffer,
                               " is memory of CUDA device ", place.device, ", not of the communicator's device ",
                               bridge_->device().ordinal);
    }
  }
  auto job = std::make_shared<Job>();
  SHOAL_TRY(launchStreamPlan(ops, job, [&](const Plan&, std::vector<StreamLink*>& links) {
    for (Connection* c : lanes) links.push_back(c->streamLink());
  }, {}, submission));
  SHOAL_TRACE(subsys::kColl, job->description(), " count ", ops[0].shape.count, " as a stream plan");
  return true;
}

Result<bool> Communicator::submitWindowStreamPlan(std::span<const OpRequest> ops, StreamSubmission& submission) {
  const OpRequest& op = ops[0];
  const OpLayout layout = opLayout(op.shape, rank_, nranks_);
  // NCCL's in place: this rank's send block inside its receive buffer
  // (AllGather) or the reverse (ReduceScatter). Its offset differs per rank,
  // so the descriptor names the larger buffer, and each peer's block is
  // found at its rank's place in it.
  const BlockInPlace blockInPlace = blockInPlaceOf(op, layout, rank_);
  const bool gatherInPlace = blockInPlace.gather, scatterInPlace = blockInPlace.scatter;
  Result<std::optional<Windows::OnStreams>> found =
      gatherInPlace    ? windows_->onStreams(op.recvbuff, layout.recvBytes, op.recvbuff, layout.recvBytes)
      : scatterInPlace ? windows_->onStreams(op.sendbuff, layout.sendBytes, op.sendbuff, layout.sendBytes)
                       : windows_->onStreams(op.sendbuff, layout.sendBytes, op.recvbuff, layout.recvBytes);
  if (found.isOk() && !found.value()) return false;  // the host steps through it, on every rank
  // Its peers run it on their streams: so must this rank, or fail the
  // communicator and break its board, so that the peers fail now, not at
  // their deadline (and no later call of this rank meets one of theirs).
  auto cannot = [&](Status st) -> Status {
    breakWindowBoards();
    return failBeforeRunning(StatusBuilder(std::move(st)) << collKindName(op.shape.kind) << " on symmetric windows");
  };
  if (!found.isOk()) return cannot(StatusBuilder(found.takeStatus()) << describe());
  std::optional<Windows::OnStreams> where = std::move(found).value();
  for (size_t q = 0; q < where->buffers.size(); ++q) {
    if (gatherInPlace) where->buffers[q][0] = where->buffers[q][1] + q * layout.sendBytes;
    if (scatterInPlace) where->buffers[q][1] = where->buffers[q][0] + q * layout.recvBytes;
  }
  if (gatherInPlace) where->sendOffset = kInPlaceOffset;
  if (scatterInPlace) where->recvOffset = kInPlaceOffset;
  if (anyInFlight_.load(std::memory_order_acquire)) releaseFinishedDetached();  // an earlier failure first
  if (failed_.load(std::memory_order_acquire)) {
    Status e = asyncError();
    return cannot(Status(e.code(), str(describe(), " is in an error state from an earlier operation: ", e.message())));
  }
  if (bridge_->waitMode() != cuda::WaitMode::kMemOps)
    return cannot(error(Code::kUnsupported, describe(), ": operations on symmetric windows run on the streams, and "
                        "this rank's streams no longer run stream memory operations"));
  if (!ensureDeviceSteps() || !runsAsDevicePlan(ops, /*windowed=*/true))
    return cannot(error(Code::kInvalidUsage, describe(), ": it runs on every rank's streams, and cannot on this "
                        "rank (its buffers must be device memory of the communicator's GPU, and its device plan "
                        "steps made: see the INFO log)"));
  boards_->setCall(
      WindowCall{op.shape.count, where->sendRegistration, where->recvRegistration, where->sendOffset, where->recvOffset});
  // Small AllReduces out of place in one phase. In place or not is the same
  // on every rank: the symmetric promise (checked by the descriptors).
  const bool oneShot = op.shape.kind == CollKind::kAllReduce && op.sendbuff != op.recvbuff &&
                       layout.sendBytes <= kWindowOneShotMaxBytes;
  auto job = std::make_shared<Job>();
  job->peerBuffers = windows_;  // windows stay mapped while the job lives
  Status launched = launchStreamPlan(ops, job, [&](const Plan& plan, std::vector<StreamLink*>& links) {
    for (const Lane& lane : plan.lanes) links.push_back(boards_->link(lane.peer));
  }, where->buffers, submission, oneShot);
  if (!launched.isOk()) return cannot(std::move(launched));
  trackWindowOperation(job);
  SHOAL_TRACE(subsys::kColl, job->description(), " count ", op.shape.count,
              " on the streams, reading the peers' windows");
  return true;
}

Status Communicator::launchStreamPlan(std::span<const OpRequest> ops, const JobPtr& job,
                                      const std::function<void(const Plan&, std::vector<StreamLink*>&)>& linksOf,
                                      std::span<const std::array<uint8_t*, 2>> peerBuffers,
                                      StreamSubmission& submission, bool windowOneShot) {
  if (!streamPlans_) {
    SHOAL_ASSIGN_OR_RETURN(streamPlanScratch_,
                           DevicePlanSteps::make(*cuda_, *bridge_->deviceReducer(), /*computes=*/false), describe(),
                           ": stream plans");
    streamPlans_ = std::make_unique<StreamPlans>(*cuda_, *bridge_->deviceReducer(), streamPlanScratch_);
    SHOAL_INFO(subsys::kInit | subsys::kColl, describe(),
               ": stream plans: operations whose every connection has a stream link run whole on the GPU's "
               "streams (no host step while they run)");
  }
  if (boards_ && peerBuffers.size() > 0 && !boardsHeld_) {
    streamPlans_->hold(boards_);  // kept while a stream may write a board
    boardsHeld_ = true;
  }

  SHOAL_ASSIGN_OR_RETURN(StreamBridge::Staged staged, bridge_->stage(ops, rank_, nranks_, /*direct=*/true),
                         describe());
  // The job as any other's: plan, tags, connections, buffers, device
  // scratch (stream plans' own, held by the job while it lives).
  job->deviceSteps = streamPlanScratch_;
  if (Result<bool> any = prepareJob(*job, ops, /*detached=*/true, windowOneShot); !any.isOk()) {
    bridge_->release(staged);  // nothing of it reached a stream
    return any.takeStatus();
  }
  std::vector<StreamLink*> links;
  linksOf(*job->prepared->plan, links);

  // A group's streams: the first leads; it starts after the others' earlier
  // work, and their later work comes after the plan.
  const std::vector<cuda::StreamHandle> streams = streamsOf(ops);
  const std::span<const cuda::StreamHandle> others = std::span(streams).subspan(1);
  StreamPlans::Launch launch;
  launch.plan = job->prepared->plan.get();
  launch.buffers = job->buffers;
  launch.laneLinks = links;
  launch.peerBuffers = peerBuffers;
  launch.scalars = job->opScalars;
  launch.tags = job->opTags;
  launch.stream = ops[0].stream;
  launch.doneWord = staged.done;
  launch.seq = staged.seq;
  launch.label = job->description();
  std::shared_ptr<StreamWatch> watch;
  const cuda::StreamHandle lead[1] = {launch.stream};
  Status st = joinStreams(*cuda_, others, lead);
  if (st.isOk()) {
    st = bridge_->enqueueAround(staged, launch.stream, [&]() -> Status {
      SHOAL_ASSIGN_OR_RETURN(watch, streamPlans_->enqueue(launch));
      return Status::ok();
    });
  } else {
    bridge_->release(staged);
  }
  if (st.isOk()) st = joinStreams(*cuda_, lead, others);
  if (!st.isOk()) {
    // Part of the plan may be on the streams, and its peers' halves on
    // theirs: the communicator cannot go on (its links are released).
    if (watch) watch->release();
    else
      for (StreamLink* link : links) link->release();
    st = StatusBuilder(std::move(st)) << describe();
    setAsyncError(st);
    return st;
  }
  job->streamWatch = std::move(watch);
  job->streamReady = staged.ready;
  job->streamSeq = staged.seq;
  Engine::instance().submit(job);
  trackDetached(job);
  submission.job = job;
  submission.ops.assign(ops.begin(), ops.end());
  submission.staged = std::make_shared<StreamBridge::Staged>(std::move(staged));
  return Status::ok();
}

bool Communicator::ensureDeviceSteps() {
  if (bridge_->deviceReducer() == nullptr) return false;
  if (!deviceStepsTried_) {
    deviceStepsTried_ = true;
    Result<std::shared_ptr<DevicePlanSteps>> made = DevicePlanSteps::make(*cuda_, *bridge_->deviceReducer());
    if (made.isOk()) {
      deviceSteps_ = std::move(made).value();
      SHOAL_INFO(subsys::kInit | subsys::kColl, describe(),
                 ": device plans: operations on device buffers whose every connection moves device memory "
                 "run on them, reductions by the device kernels (no staging)");
    } else {
      SHOAL_INFO(subsys::kInit | subsys::kColl, describe(), ": device plans unavailable (",
                 made.status().message(), "): device buffers are staged");
    }
  }
  return deviceSteps_ != nullptr;
}

bool Communicator::inWindows(std::span<const OpRequest> ops) {
  if (windows_->empty() || ops.size() != 1 || nranks_ < 2) return false;
  // A GPU with too few hardware queues would run a windowed plan's kernels
  // and copies behind the user's stream waiting for them (windows without a
  // board on every rank are stepped by the host), and synchronous streams
  // stage: then every rank stages, as the ranks agreed at init.
  if (!windowsStaged_.empty()) return false;
  const OpRequest& op = ops[0];
  if (op.shape.kind != CollKind::kAllReduce && op.shape.kind != CollKind::kAllGather &&
      op.shape.kind != CollKind::kReduceScatter)
    return false;
  const OpLayout layout = opLayout(op.shape, rank_, nranks_);
  if (layout.sendBytes == 0 || !windows_->holdsEverywhere(op.sendbuff, layout.sendBytes) ||
      !windows_->holdsEverywhere(op.recvbuff, layout.recvBytes))
    return false;
  // Buffers that overlap other than as NCCL's in place (the same, or this
  // rank's block of the larger one) are no operation peers may read.
  const BlockInPlace blockInPlace = blockInPlaceOf(op, layout, rank_);
  const bool inPlace = op.sendbuff == op.recvbuff || blockInPlace.gather || blockInPlace.scatter;
  if (!inPlace && !disjointBuffers(op)) return false;
  // Whether a plan reads the windows depends on the shape alone (not on
  // PreMulSum, no integer average): every rank decides alike.
  Result<std::shared_ptr<const PreparedPlan>> plan = plans_->windowPlanFor(placedShape(op));
  return plan.isOk() && plan.value() != nullptr;
}

bool Communicator::runsAsDevicePlan(std::span<const OpRequest> ops, bool windowed) {
  // Between ranks, on device memory, alone or a group (its merged plan, as
  // prepareJob makes it); its kernels and copies go on streams other than
  // the user's, which waits for them: not with too few hardware queues to
  // keep them apart (staged buffers are copied on the user's stream
  // itself). A windowed operation (alone: inWindows) was decided alike on
  // every rank from what they agreed at init (no rank had too few), which
  // this rank's environment now cannot overturn. Each rank decides for
  // itself: a device plan runs the same plan as a staged one, so peers
  // that decide otherwise still meet it.
  if (ops.empty() || nranks_ < 2 || bridge_->deviceReducer() == nullptr) return false;
  if (windowed && ops.size() != 1) return false;
  if (!windowed && cuda::Driver::fewHardwareQueues()) return false;
  // A group on several streams stays staged: each of its streams waits while
  // the plan's own streams work, and the more streams wait, the likelier one
  // shares a hardware queue with a stream the plan needs.
  if (streamsOf(ops).size() > 1) return false;
  for (const OpRequest& op : ops) {
    if (op.scalar.deviceScalar != nullptr) return false;
    // GPU copies of ranges that overlap without being equal are undefined:
    // partly overlapping buffers (in-place AllGather, ReduceScatter) are
    // staged, but where peer-reading plans run (windows): they copy a block
    // onto itself at most.
    if (!windowed && op.sendbuff != op.recvbuff && !disjointBuffers(op)) return false;
  }
  // The plan (cached) and its peers' transports (known per peer) first: a
  // communicator whose connections stage, the default, asks CUDA nothing more.
  // (A windowed operation's plan inWindows() found already.)
  if (!windowed) {
    Result<std::shared_ptr<const PreparedPlan>> prepared = planOf(ops);
    if (!prepared.isOk()) return false;  // prepareJob reports it
    if (!connections_.movesDeviceMemory(*prepared.value()->plan) || !prepared.value()->deviceStepsCanRun)
      return false;
  }
  for (const OpRequest& op : ops) {
    for (const void* buffer : usedBuffers(op)) {
      if (buffer == nullptr) continue;
      Result<cuda::Driver::Place> place = cuda_->placeOf(buffer);  // the kernels run on the bridge's device
      if (!place.isOk() || place.value().kind != cuda::MemoryKind::kDevice ||
          place.value().device != bridge_->device().ordinal)
        return false;
    }
  }
  return ensureDeviceSteps();
}

Status Communicator::finishStreamOrdered(StreamSubmission& submission) {
  if (submission.joinAfter.empty() && (!submission.synchronous || !submission.job)) return Status::ok();
  cuda::ContextScope scope(cuda_, cudaContext());
  SHOAL_TRY(scope.status()) << describe() << ": making its CUDA context current";
  Status st;
  if (submission.synchronous && submission.job) {
    auto& staged = *static_cast<StreamBridge::Staged*>(submission.staged.get());
    st = waitFor(*submission.job);
    if (st.isOk()) st = bridge_->copyOut(staged, submission.ops);
    bridge_->release(staged);
  }
  // The streams of pairs to itself alone wait for the plan (the lead's work).
  if (st.isOk() && !submission.ops.empty()) {
    const cuda::StreamHandle lead[1] = {static_cast<cuda::StreamHandle>(submission.ops[0].stream)};
    st = joinStreams(*cuda_, lead, submission.joinAfter);
    if (!st.isOk()) st = StatusBuilder(std::move(st)) << describe();
  }
  return st;
}

std::vector<cuda::StreamHandle> Communicator::streamsOf(std::span<const OpRequest> ops) {
  std::vector<cuda::StreamHandle> streams;
  for (const OpRequest& op : ops) {
    auto s = static_cast<cuda::StreamHandle>(op.stream);
    if (std::find(streams.begin(), streams.end(), s) == streams.end()) streams.push_back(s);
  }
  return streams;
}


Status Communicator::submitStreamOrdered(std::span<const OpRequest> ops) {
  SHOAL_ASSIGN_OR_RETURN(StreamSubmission submission, beginStreamOrdered(ops));
  return finishStreamOrdered(submission);
}

Status Communicator::connectAhead(const std::vector<OpRequest>& ops) {
  UseGuard use(*this);
  cuda::ContextScope scope(cuda_, cudaContext());
  SHOAL_TRY(scope.status()) << describe() << ": making its CUDA context current";
  const bool grouped = collectivesGrouped(ops);
  for (const OpRequest& op : ops) {
    if (droppedByNccl(op)) continue;
    SHOAL_ASSIGN_OR_RETURN(std::shared_ptr<const PreparedPlan> prepared,
        plans_->planFor(placedShape(op), grouped), describe(), ": ", collKindName(op.shape.kind));
    for (const auto& lane : prepared->plan->lanes)
      if (Status st = connections_.to(lane.peer, lane.channel, /*unlessWaiting=*/true).status(); !st.isOk())
        return connectFailed(std::move(st), lane.peer);
  }
  return Status::ok();
}

Status Communicator::submit(std::span<const OpRequest> ops, bool wait) {
  UseGuard use(*this);
  if (wait && nothingInFlight() && !capturesLive()) {
    // The common blocking call: nothing of ours is queued ahead of it, so it
    // runs on this thread without entering the engine's queue, in a job kept
    // for the next call.
    if (!blockingJob_) blockingJob_ = std::make_unique<Job>();
    Job& job = *blockingJob_;
    job.resetForReuse();
    SHOAL_ASSIGN_OR_RETURN(bool any, prepareJob(job, ops, /*detached=*/false));
    if (!any) return Status::ok();
    runningInline_.store(true, std::memory_order_release);
    Status st = Engine::instance().runInline(job);
    runningInline_.store(false, std::memory_order_relaxed);
    if (!st.isOk()) st = handleFailure(job, std::move(st));
    return st;
  }
  SHOAL_ASSIGN_OR_RETURN(JobPtr job, enqueue(ops, /*detached=*/!wait));
  if (!job || !wait) return Status::ok();
  return waitFor(*job);
}

bool Communicator::nothingInFlight() {
  // The common case without the lock: a blocking call with no detached work.
  if (!anyInFlight_.load(std::memory_order_acquire)) return true;
  std::lock_guard<std::mutex> lock(jobsMutex_);
  dropFinishedDetachedLocked();
  return inFlight_.empty();
}

Status Communicator::waitFor(const Job& job) {
  UseGuard use(*this);
  Status st = Engine::instance().wait(job);
  if (!st.isOk()) st = handleFailure(job, std::move(st));
  if (job.detached) releaseFinishedDetached();
  return st;
}

// Detached jobs (host streams, nonblocking communicators) and their scratch
// are kept until they finish; whoever waits on one also drops every finished
// one, so a long run of host-stream work holds only what is in flight.
void Communicator::releaseFinishedDetached() {
  std::lock_guard<std::mutex> lock(jobsMutex_);
  dropFinishedDetachedLocked();
}

void Communicator::dropFinishedDetachedLocked() {
  for (const auto& job : inFlight_) {
    if (job->isDone() && !job->status().isOk()) setAsyncError(job->status());
    else if (const Status* failing = job->failing()) setAsyncError(*failing);  // a stream plan draining
  }
  eraseFinishedLocked();
}

// Every removal from inFlight_ goes through here, so anyInFlight_ stays true to it.
void Communicator::eraseFinishedLocked() {
  std::erase_if(inFlight_, [](const JobPtr& j) { return j->isDone(); });
  anyInFlight_.store(!inFlight_.empty(), std::memory_order_release);
}

// A failed operation fails the communicator for good (NCCL semantics: abort
// it). Before returning, make every other rank fail promptly and name the
// first cause: publish our error in the store, then close all our
// connections, so ranks waiting on us see the close now rather than at their
// no-progress deadline; a rank that sees a close reads the closer's published
// error, so the message chain ends at the rank that really died or stalled.
Status Communicator::handleFailure(const Job& job, Status st) {
  if (st.code() == Code::kAborted) {
    std::lock_guard<std::mutex> lock(failureMutex_);
    setAsyncError(st);
    return st;
  }
  std::vector<int> upstreamPeers = job.waitingOn();
  if (job.failedPeer() >= 0 && st.code() == Code::kRemoteError) upstreamPeers = {job.failedPeer()};
  return publishAndClose(std::move(st), upstreamPeers);
}

Status Communicator::publishAndClose(Status st, const std::vector<int>& upstreamPeers) {
  std::lock_guard<std::mutex> lock(failureMutex_);
  if (failurePublished_) {
    setAsyncError(st);
    return st;
  }
  failurePublished_ = true;
  // Our own view first, a draft where peers we depended on may say more, so
  // that ranks timing out at the same moment as we do can read it: in every
  // connection that has a side channel (same-host peers read it even when
  // the store is out of reach), then in the store; then the final report,
  // with what those peers reported, if anything.
  // An abort (a watchdog on another thread) ends these waits at once: the
  // peers that abort too never publish a report.
  const Deadline reportDeadline = Deadline::afterMs(kFailureReportMs).cancelledBy(&abortFlag_);
  std::vector<int> upstream;
  for (int peer : upstreamPeers)
    if (peer != rank_ && std::find(upstream.begin(), upstream.end(), peer) == upstream.end()) upstream.push_back(peer);
  publishReport(st.message(), /*final=*/upstream.empty(), reportDeadline);
  if (upstream.empty()) {
    closeAfterFailure(st);
    return st;
  }
  const std::vector<std::string> reports = upstreamReports(upstream, reportDeadline);
  std::string upstreamText;
  for (size_t i = 0; i < upstream.size(); ++i) {
    const std::string& report = reports[i];
    if (report.empty()) continue;
    const std::string_view added = addedBy(report, st.message() + upstreamText);
    if (added.size() < report.size()) {
      upstreamText += added;  // the error quotes it, or its start
    } else {
      upstreamText +=
          str("; rank ", upstream[i], " (host ", peers_[upstream[i]].hostname, ") had failed first: ", report);
    }
  }
  // Where the cause lies upstream, the ranks that wait on this one read it
  // on the connections too (a chain of closed connections names the rank
  // that died).
  st = Status(st.code(), st.message() + upstreamText);
  publishReport(publishedReport_ + upstreamText, /*final=*/true, reportDeadline);
  closeAfterFailure(st);
  return st;
}

std::vector<std::string> Communicator::upstreamReports(const std::vector<int>& peers, Deadline deadline) {
  const size_t n = peers.size();
  std::vector<std::string> reports(n);  // final, a will, or the longest draft so far
  std::vector<bool> settled(n, false);
  bool storeAnswers = true;
  int64_t pauseMs = 2;  // then up to 200 ms: each look is a request to the one root
  for (;;) {
    for (size_t i = 0; i < n; ++i) {
      if (settled[i]) continue;
      ConnectionTable::PeerReport carried = connections_.peerFailure(peers[i], Deadline::passed());
      if (carried.final || carried.text.size() > reports[i].size()) reports[i] = std::move(carried.text);
      settled[i] = carried.final;
      if (settled[i] || !storeAnswers) continue;
      // The final report, else the will (the root writes it whole), else
      // the leave record (a peer that destroyed or aborted its communicator
      // says no more), else the draft. A look begun in time gets its answer
      // even where the deadline is about to pass.
      const Deadline look =
          deadline.remainingMs() >= kStoreLookMs ? deadline : Deadline::afterMs(kStoreLookMs).cancelledBy(&abortFlag_);
      Result<std::optional<Store::Found>> found =
          request_.store->firstPresent({failureKey(peers[i]), goneKey(peers[i]), bootstrap_->leftKey(peers[i]),
                                        bootstrap_->failureDraftKey(peers[i])},
                                       look);
      storeAnswers = found.isOk();
      if (!storeAnswers || !found.value()) continue;
      std::string& value = found.value()->value;
      switch (found.value()->index) {
        case 0:
          reports[i] = std::move(value);
          settled[i] = true;
          break;
        case 1:  // its process ended: after what it had said, if anything
          reports[i] = reports[i].empty() ? std::move(value) : str(reports[i], "; then: ", value);
          settled[i] = true;
          break;
        case 2:  // it left: what it had said, if anything, is all it says
          settled[i] = true;
          if (reports[i].empty()) {
            Result<std::optional<Store::Found>> draft =
                request_.store->firstPresent({bootstrap_->failureDraftKey(peers[i])}, look);
            if (draft.isOk() && draft.value()) reports[i] = std::move(draft.value()->value);
          }
          break;
        default:
          if (value.size() > reports[i].size()) reports[i] = std::move(value);
      }
    }
    if (std::all_of(settled.begin(), settled.end(), [](bool s) { return s; }) || deadline.expired()) break;
    // A store out of reach (its root died with rank 0) leaves the reports
    // that arrive by themselves (same-host peers'), waited for as before.
    if (!storeAnswers) {
      for (size_t i = 0; i < n; ++i) {
        if (settled[i]) continue;
        ConnectionTable::PeerReport carried = connections_.peerFailure(peers[i], deadline);
        if (carried.final || carried.text.size() > reports[i].size()) reports[i] = std::move(carried.text);
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(pauseMs, deadline.remainingMs() + 1)));
    pauseMs = std::min<int64_t>(pauseMs * 2, 200);
  }
  return reports;
}

void Communicator::closeAfterFailure(const Status& st) {
  Engine::instance().retire(reinterpret_cast<uintptr_t>(this), st);
  settleStreamPlans(kFailureSettleMs);  // its streams are past the FIFOs before the connections go
  connections_.clear();
  setAsyncError(st);
}

Status Communicator::failBeforeRunning(Status st) {
  std::lock_guard<std::mutex> lock(failureMutex_);
  connections_.releaseStreamLinks();
  if (!failurePublished_ && !refusalPublished_) {
    refusalPublished_ = true;
    publishReport(st.message(), /*final=*/true, Deadline::afterMs(kFailureReportMs).cancelledBy(&abortFlag_));
  }
  setAsyncError(st);
  return st;
}

// A connection this rank could not make: its peers, already running the
// call or waiting to connect, would wait for it until their deadline (the
// set-up deadline, minutes, for a peer waiting to be connected to). The
// communicator fails as after a failed operation: it says why where they
// look (ConnectionTable::setPeerReports) and closes its connections, so that
// peers it had connected to see the close now. Not for an abort (a cancelled
// connect reads as a timeout to some transports). A peer that did not come,
// or failed, may say why a moment later (it died: its will), and what it
// says is the cause: its report is read as an operation's upstream peer's.
Status Communicator::connectFailed(Status st, int peer) {
  st = StatusBuilder(std::move(st)) << describe();
  if (aborted()) return st;
  const bool peersFault = st.code() == Code::kTimeout || st.code() == Code::kRemoteError;
  return publishAndClose(std::move(st), peersFault && peer >= 0 ? std::vector<int>{peer} : std::vector<int>{});
}

void Communicator::publishReport(const std::string& text, bool final, Deadline deadline) {
  if (publishedReport_.empty() || text.starts_with(publishedReport_)) publishedReport_ = text;
  else publishedReport_ += "; then: " + text;
  connections_.publishFailure(publishedReport_, final);
  (void)request_.store->set(final ? failureKey(rank_) : bootstrap_->failureDraftKey(rank_), publishedReport_, deadline);
}

std::string Communicator::failureKey(int rank) const { return bootstrap_->failureKey(rank); }

std::string Communicator::goneKey(int rank) const { return bootstrap_->goneKey(rank); }

void Communicator::growScratch(uint64_t bytes) {
  if (!scratch_.empty()) forgetMemory(scratch_.data(), scratch_.size());
  std::vector<uint8_t>().swap(scratch_);  // no copy of what it held
  scratch_.resize(bytes);
  rememberMemory(scratch_.data(), scratch_.size());
}

Result<JobPtr> Communicator::enqueue(std::span<const OpRequest> ops, bool detached) {
  UseGuard use(*this);
  auto job = std::make_shared<Job>();
  SHOAL_ASSIGN_OR_RETURN(bool any, prepareJob(*job, ops, detached));
  if (!any) return JobPtr();
  Engine::instance().submit(job);
  if (detached) trackDetached(job);
  return job;
}

Result<bool> Communicator::prepareJob(Job& job, std::span<const OpRequest> ops, bool detached, bool windowOneShot) {
  const bool wait = !detached;
  if (aborted()) return error(Code::kAborted, describe(), " was aborted");
  if (failed_.load(std::memory_order_acquire)) {
    Status e = asyncError();
    return Status(e.code(), str(describe(), " is in an error state from an earlier operation: ",
                                e.message()));
  }
  setLogRank(rank_);
  if (std::any_of(ops.begin(), ops.end(), droppedByNccl)) {
    std::vector<OpRequest> kept;
    std::remove_copy_if(ops.begin(), ops.end(), std::back_inserter(kept), droppedByNccl);
    if (kept.empty()) return false;
    return prepareJob(job, kept, detached, windowOneShot);
  }

  // A reused job (a blocking call's) that repeats its last single operation
  // keeps its plan and its lanes' connections (connections are only ever
  // added while the communicator is usable): no cache lookup, no
  // reference-count traffic, no connection lookups.
  const bool samePlan = ops.size() == 1 && job.prepared && job.prepared->plan->shapes.size() == 1 &&
                        sameShapeButPlacement(job.prepared->plan->shapes[0], ops[0].shape) &&
                        job.prepared->plan->shapes[0].disjointBuffers == disjointBuffers(ops[0]);
  job.opTags.resize(ops.size());
  job.opScalars.resize(ops.size());
  if (samePlan) {
    job.opTags[0] = withSeq(job.opTags[0], nextSeq(ops[0].shape));  // same shape, same other bits
    job.opScalars[0] = ops[0].scalar;
  } else {
    std::vector<std::shared_ptr<const PreparedPlan>> parts;
    std::shared_ptr<const PreparedPlan> prepared;
    const bool grouped = collectivesGrouped(ops);
    for (size_t k = 0; k < ops.size(); ++k) {
      const OpRequest& op = ops[k];
      if (job.peerBuffers) {  // a device plan on windows (runsAsDevicePlan found its plan)
        SHOAL_ASSIGN_OR_RETURN(prepared, plans_->windowPlanFor(placedShape(op), windowOneShot), describe(), ": ",
                               collKindName(op.shape.kind));
        if (!prepared) return internalError(describe(), ": no window plan for ", collKindName(op.shape.kind));
      } else {
        SHOAL_ASSIGN_OR_RETURN(prepared, plans_->planFor(placedShape(op), grouped),
          describe(), ": ", collKindName(op.shape.kind));
      }
      if (ops.size() > 1) parts.push_back(prepared);
      job.opTags[k] = tagFor(op.shape);
      job.opScalars[k] = op.scalar;
    }
    if (parts.size() > 1) prepared = plans_->mergedPlanFor(std::move(parts));
    job.prepared = std::move(prepared);
  }
  const Plan& plan = *job.prepared->plan;
  if (!label_) label_ = std::make_shared<const std::string>(describe());
  if (job.commLabel != label_) job.commLabel = label_;
  job.kind = ops[0].shape.kind;
  job.groupedOps = ops.size();
  job.sequence = job.opTags[0] & 0xffffffffffffull;
  job.sameConnections = samePlan && job.laneConnections.size() == plan.lanes.size();
  if (!job.sameConnections) {
    int failedPeer = -1;
    if (Status st = connections_.forPlan(plan, job.laneConnections, &job, &failedPeer); !st.isOk()) {
      job.laneConnections.clear();  // never taken for this plan's by a later call
      return connectFailed(std::move(st), failedPeer);
    }
  }

  uint8_t* scratch = nullptr;
  if (plan.scratchBytes > 0 && job.deviceSteps) {
    DevicePlanSteps& steps = job.deviceSteps == streamPlanScratch_ ? *streamPlanScratch_ : *deviceSteps_;
    SHOAL_ASSIGN_OR_RETURN(scratch, steps.scratch(plan.scratchBytes), describe());
  } else if (plan.scratchBytes > 0) {
    if (wait) {
      if (scratch_.size() < plan.scratchBytes) growScratch(plan.scratchBytes);
      scratch = scratch_.data();
    } else {
      job.ownedScratch = detachedScratch_->take(plan.scratchBytes);  // as long as the job holds it
      scratch = job.ownedScratch.get();
    }
  }
  job.buffers.resize(ops.size() * kBuffersPerOp);
  for (size_t k = 0; k < ops.size(); ++k) {
    job.buffers[k * kBuffersPerOp + kSendBuffer] =
        const_cast<uint8_t*>(static_cast<const uint8_t*>(ops[k].sendbuff));
    job.buffers[k * kBuffersPerOp + kRecvBuffer] = static_cast<uint8_t*>(ops[k].recvbuff);
    uint64_t offset = k < plan.scratchOffsets.size() ? plan.scratchOffsets[k] : 0;
    job.buffers[k * kBuffersPerOp + kScratchBuffer] = scratch ? scratch + offset : nullptr;
  }
  job.queueId = reinterpret_cast<uintptr_t>(this);
  job.abortFlag = &abortFlag_;
  job.failureReports = &publishedFailures_;
  job.detached = !wait;
  SHOAL_TRACE(subsys::kColl, job.description(), " count ", ops[0].shape.count);
  return true;
}

Status Communicator::waitIdle(Deadline deadline) {
  std::vector<JobPtr> jobs;
  {
    std::lock_guard<std::mutex> lock(jobsMutex_);
    jobs = inFlight_;
  }
  for (const auto& job : jobs) {
    Status st = Engine::instance().wait(*job, deadline);
    if (!st.isOk()) {
      setAsyncError(st);
      return st;
    }
  }
  std::lock_guard<std::mutex> lock(jobsMutex_);
  eraseFinishedLocked();
  return Status::ok();
}

}  // namespace shoal
