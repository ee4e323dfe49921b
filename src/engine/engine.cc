#include "engine/engine.h"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "collectives/layout.h"
#include "core/log.h"
#include "core/params.h"
#include "core/process.h"
#include "reduce/reduce.h"

namespace shoal {

namespace {

bool isOpBuffer(BufferId buffer) { return buffer != kWindowBuffer && !isPeerBuffer(buffer); }
bool isScratch(BufferId buffer) { return isOpBuffer(buffer) && buffer % kBuffersPerOp == kScratchBuffer; }
bool sameSlice(const Slice& a, const Slice& b) { return a.buffer == b.buffer && a.offset == b.offset; }

const void* scalarOf(const Job& job, OpIndex op) {
  return job.opScalars.empty() ? nullptr : job.opScalars[op].bytes.data();
}

// Receives whose scratch slice exactly one Reduce reads and nothing else in
// the plan touches (no other step reads or writes a byte of it): the
// transport may reduce the bytes as they arrive (decision 0015). Slots reused
// by later rounds (rings) are left alone; the small-message plans (recursive
// doubling, one-shot) keep a slot per receive.
std::vector<PreparedPlan::ReduceOnReceiveStep> findReducesOnReceive(const Plan& plan,
                                                                   const PreparedPlan& prepared) {
  struct Access {
    BufferId buffer;
    uint64_t begin, end;
    uint32_t step;
  };
  std::vector<Access> accesses;
  uint64_t longest = 0;
  auto note = [&](const Slice& slice, uint64_t bytes, uint32_t step) {
    if (!isScratch(slice.buffer) || bytes == 0) return;
    accesses.push_back({slice.buffer, slice.offset, slice.offset + bytes, step});
    longest = std::max(longest, bytes);
  };
  bool anyCandidate = false;
  for (uint32_t i = 0; i < plan.steps.size(); ++i) {
    const Step& s = plan.steps[i];
    switch (s.kind) {
      case StepKind::kSend: note(s.src, s.bytes, i); break;
      case StepKind::kRecv: note(s.dst, s.bytes, i); anyCandidate |= isScratch(s.dst.buffer); break;
      case StepKind::kReduce: note(s.src2, s.bytes, i); [[fallthrough]];
      case StepKind::kCopy:
      case StepKind::kDivide: note(s.src, s.bytes, i); note(s.dst, s.bytes, i); break;
    }
  }
  if (!anyCandidate) return {};
  auto byPlace = [](const Access& a, const Access& b) {
    return a.buffer != b.buffer ? a.buffer < b.buffer : a.begin < b.begin;
  };
  std::sort(accesses.begin(), accesses.end(), byPlace);
  bool any = false;
  std::vector<PreparedPlan::ReduceOnReceiveStep> result(plan.steps.size());
  for (uint32_t i = 0; i < plan.steps.size(); ++i) {
    const Step& r = plan.steps[i];
    if (r.kind != StepKind::kRecv || !isScratch(r.dst.buffer) || r.bytes == 0) continue;
    if (prepared.dependentsBegin[i + 1] - prepared.dependentsBegin[i] != 1) continue;
    const uint32_t di = prepared.dependents[prepared.dependentsBegin[i]];
    const Step& d = plan.steps[di];
    if (d.kind != StepKind::kReduce || d.op != r.op || d.bytes != r.bytes) continue;
    const bool first = sameSlice(d.src, r.dst);
    if (first == sameSlice(d.src2, r.dst)) continue;  // neither, or both operands
    if (!isOpBuffer(d.dst.buffer) || !isOpBuffer((first ? d.src2 : d.src).buffer)) continue;
    // Everything that touches a byte of the slot is the receive or its Reduce.
    const uint64_t begin = r.dst.offset, end = r.dst.offset + r.bytes;
    const Access earliest{r.dst.buffer, begin > longest ? begin - longest : 0, 0, 0};
    auto from = std::lower_bound(accesses.begin(), accesses.end(), earliest, byPlace);
    bool alone = true;
    for (auto it = from; it != accesses.end() && it->buffer == r.dst.buffer && it->begin < end && alone; ++it)
      alone = it->end <= begin || it->step == i || it->step == di;
    if (!alone) continue;
    result[i] = {di, first};
    any = true;
  }
  if (!any) return {};
  return result;
}

}  // namespace

std::shared_ptr<const PreparedPlan> preparePlan(PlanPtr plan) {
  auto prepared = std::make_shared<PreparedPlan>();
  const auto& steps = plan->steps;
  size_t n = steps.size();
  prepared->initialSteps.resize(n);
  std::vector<uint32_t> counts(n + 1, 0);
  for (size_t i = 0; i < n; ++i) {
    const Step& s = steps[i];
    prepared->initialSteps[i].unmet = s.depCount;
    if (s.depCount == 0) prepared->roots.push_back(static_cast<uint32_t>(i));
    for (uint32_t d = 0; d < s.depCount; ++d) counts[plan->deps[s.depBegin + d] + 1]++;
    if (s.kind == StepKind::kSend || s.kind == StepKind::kRecv) prepared->commSteps++;
  }
  for (size_t i = 0; i < n; ++i) counts[i + 1] += counts[i];
  prepared->dependentsBegin = counts;
  prepared->dependents.resize(counts[n]);
  std::vector<uint32_t> fill(counts.begin(), counts.end() - 1);
  for (size_t i = 0; i < n; ++i) {
    const Step& s = steps[i];
    for (uint32_t d = 0; d < s.depCount; ++d) {
      uint32_t dep = plan->deps[s.depBegin + d];
      prepared->dependents[fill[dep]++] = static_cast<uint32_t>(i);
    }
  }
  prepared->reduceOnReceive = findReducesOnReceive(*plan, *prepared);
  prepared->deviceStepsCanRun = deviceStepsCanRun(*plan);
  prepared->plan = std::move(plan);
  return prepared;
}

bool Job::streamReached() const { return streamWordReached(streamReady, streamSeq); }

void Job::releaseStream() {
  // The outputs in staging, including non-temporal stores, are visible
  // before the stream copies them out.
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_sfence();
#endif
  writeStreamWord(streamDone, streamSeq);
}

void Job::finish(Status status) {
  // A job that ends unfinished may leave operations posted on connections
  // whose copies run without being polled (cuda_ipc): they stop touching its
  // buffers before anyone learns the job ended (a device job's stream reads
  // them next).
  if (!status.isOk() && started_ && !streamWatch)
    for (Connection* c : laneConnections)
      if (c) c->quiesce();
  if (!status.isOk() && streamWatch) streamWatch->release();
  // A job that succeeded touches its scratch no more: back to its pool
  // before anyone learns it ended, so that the communicator's next detached
  // job takes the same buffer, not a second one, whoever still holds this
  // job. (A failed one keeps it: a network may still write into a posted
  // receive, and its communicator runs no other job.)
  if (status.isOk()) ownedScratch.reset();
  status_ = std::move(status);
  if (status_.isOk()) {
    if (streamDone) releaseStream();
    state_.store(kSucceeded, std::memory_order_release);
    return;
  }
  // A failure is known before its stream goes on: what the stream runs
  // next (a graph's next replay) finds it.
  state_.store(kFailed, std::memory_order_release);
  if (streamDone) releaseStream();
}

void Job::resetForReuse() {
  sameConnections = false;
  ownedScratch.reset();
  deviceSteps.reset();
  peerBuffers.reset();
  streamWatch.reset();
  detached = false;
  streamReady = nullptr;
  streamDone = nullptr;
  streamSeq = 0;
  runsAhead = false;
  state_.store(kRunning, std::memory_order_relaxed);
  status_ = Status::ok();
  started_ = false;
  begun_.store(false, std::memory_order_relaxed);
  blockedLanes_.clear();
  failedPeer_ = -1;
  waitingOn_.clear();
  draining_ = false;
  failing_.store(false, std::memory_order_relaxed);
  drainStatus_ = Status::ok();
  completions_.clear();
  remaining_ = 0;
  passesSinceClock_ = 0;
  progressSinceClock_ = false;
}

Engine& Engine::instance() {
  static Engine* engine = [] {
    auto* made = new Engine();  // lives for the process: jobs may outlive statics
    // A process may fork while the progress thread holds the engine's locks
    // (a round of idle checks, a pass over the job list): the child has only
    // the forking thread, so each lock is taken around the fork, in the lock
    // order, and the child's condition variables, which the parent's thread
    // waited on, start afresh.
    (void)pthread_atfork([] { instance().holdForFork(); }, [] { instance().releaseAfterFork(false); },
                         [] { instance().releaseAfterFork(true); });
    return made;
  }();
  return *engine;
}

void Engine::holdForFork() {
  watchMutex_.lock();
  listMutex_.lock();
  submitMutex_.lock();
  reportMutex_.lock();  // a leaf
}

void Engine::releaseAfterFork(bool inChild) {
  if (inChild) {
    new (&wake_) std::condition_variable();
    new (&progressStopped_) std::condition_variable();
    new (&reportPosted_) std::condition_variable();
  }
  reportMutex_.unlock();
  submitMutex_.unlock();
  listMutex_.unlock();
  watchMutex_.unlock();
}

Engine::~Engine() { stopProgressThread(); }

void Engine::stopProgressThread() {
  std::unique_lock<std::mutex> lock(submitMutex_);
  stopping_ = true;
  wake_.notify_all();
  // A thread calling exit() from inside a job (a test's failing rank) must not
  // wait for itself; otherwise the loop ends within one pass and one pause.
  if (progressThreadPid_ != ::getpid() || std::this_thread::get_id() == progressThreadId_) return;
  progressStopped_.wait_for(lock, std::chrono::seconds(2), [&] { return !progressThreadRunning_; });
}

bool Engine::claimToStart(Job& job) {
  if (runsAheadJobs_.load(std::memory_order_relaxed) == 0 || job.begun_.load(std::memory_order_acquire)) return true;
  // The caller holds the job's mutex: listMutex_ comes first in the lock
  // order, so only tried (the next pass tries again).
  std::unique_lock<std::mutex> lock(listMutex_, std::try_to_lock);
  if (!lock.owns_lock()) return false;
  for (const JobPtr& j : jobs_)
    if (j.get() != &job && j->queueId == job.queueId && !j->isDone() && j->begun_.load(std::memory_order_acquire))
      return false;
  job.begun_.store(true, std::memory_order_release);
  return true;
}

// Requires listMutex_. `first` is its queue's first unfinished job.
const JobPtr& Engine::aheadOf(const JobPtr& first) {
  if (first->begun_.load(std::memory_order_acquire) || !first->streamReady || first->streamReached()) {
    if (first->begun_.load(std::memory_order_acquire)) return first;
    // Not started: a job that ran ahead may still be running.
    for (const JobPtr& j : jobs_)
      if (j->queueId == first->queueId && !j->isDone() && j->begun_.load(std::memory_order_acquire)) return j;
    return first;
  }
  const JobPtr* ahead = nullptr;
  for (const JobPtr& j : jobs_) {
    if (j->queueId != first->queueId || j->isDone()) continue;
    if (j->begun_.load(std::memory_order_acquire)) return j;  // started ahead: it runs to its end first
    if (!ahead && j->runsAhead) ahead = &j;
  }
  if (!ahead) return first;
  // Claimed now, under the lock: a thread that picks after this one (the
  // first's stream having reached it meanwhile) finds it begun and runs it,
  // not the first, so the queue never runs two jobs at once.
  (*ahead)->begun_.store(true, std::memory_order_release);
  return *ahead;
}

void Engine::submit(JobPtr job) {
  jobCount_.fetch_add(1, std::memory_order_relaxed);
  bool detached = job->detached;
  if (job->runsAhead) runsAheadJobs_.fetch_add(1, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(submitMutex_);
    incoming_.push_back(std::move(job));
    if (detached) detachedCount_.fetch_add(1, std::memory_order_relaxed);
  }
  if (detached) {
    ensureProgressThread();
    wake_.notify_one();
  }
}

std::string Job::description() const {
  return str(commLabel ? *commLabel : std::string("communicator"), ": ", collKindName(kind),
             groupedOps > 1 ? str(" + ", groupedOps - 1, " more (group)") : "", " #", sequence,
             prepared ? str(" (", prepared->plan->algorithm, ")") : "");
}

Status Engine::wait(const Job& job, Deadline deadline) {
  Backoff backoff;
  Job& mine = const_cast<Job&>(job);  // progressed only under its own mutex
  for (uint32_t pass = 1; !job.isDone(); ++pass) {
    if (pass % 64 == 0 && deadline.expired())
      return error(Code::kTimeout, job.description(), ": still running at the caller's deadline");
    // Most passes progress only the awaited job (no list lock); every eighth
    // pumps everything, so that other work this thread owes (other
    // communicators' jobs, detached jobs) keeps moving too.
    bool progressed = pass % 8 != 0 ? progressStarted(mine) : poll();
    if (progressed) backoff.reset();
    else backoff.pause();
  }
  return job.status();
}

Status Engine::runInline(Job& job) {
  startJob(job);
  Backoff backoff;
  for (uint32_t pass = 1; !job.isDone(); ++pass) {
    bool progressed = progressJob(job);
    // Work this thread may owe elsewhere (other communicators' detached jobs).
    if (pass % 8 == 0 && jobCount_.load(std::memory_order_relaxed) > 0) progressed |= poll();
    if (progressed) {
      backoff.reset();
      continue;
    }
    // While spinning, look between passes rather than repeat them: an idle
    // pass costs ~150 instructions, a look a few, so the next pass starts
    // within a few instructions of a message landing (no pause after it).
    // Every kQuietLooks looks a pass runs anyway (abort flag, deadlines,
    // peer checks). Only a change seen by a look skips the backoff step: a
    // connection that always might progress (a send waiting for ring space)
    // still moves the backoff on to yielding.
    bool changed = false;
    for (uint32_t look = 0; look < kQuietLooks && backoff.spinning(); ++look) {
      if (!quiet(job)) {
        changed = look > 0;
        break;
      }
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
    if (!changed) backoff.pause();
  }
  return job.status();
}

bool Engine::quiet(const Job& job) {
  if (!job.ready_.empty() || !job.blockedLanes_.empty()) return false;
  for (const Connection* c : job.connections_)
    if (c->mightProgress()) return false;
  return true;
}

bool Engine::progressStarted(Job& job) {
  std::unique_lock<std::mutex> lock(job.mutex_, std::try_to_lock);
  if (!lock.owns_lock() || job.isDone()) return false;
  if (!job.started_) {
    lock.unlock();
    return pumpOnce();  // starting is pumpOnce's: it knows the queue order
  }
  return progressJob(job);
}

bool Engine::poll() { return pumpOnce(); }

void Engine::drainIncoming() {
  std::lock_guard<std::mutex> lock(submitMutex_);
  for (auto& job : incoming_) jobs_.push_back(std::move(job));
  incoming_.clear();
}

bool Engine::pumpOnce() {
  // Runnable: the first unfinished job of each queue, in submission order;
  // or a job of the queue that has started (one that ran ahead); or, while
  // the first waits for its stream, the first job that runs ahead.
  thread_local std::vector<JobPtr> runnable;
  thread_local std::vector<uint64_t> queues;
  runnable.clear();
  queues.clear();
  {
    std::lock_guard<std::mutex> lock(listMutex_);
    drainIncoming();
    for (auto& job : jobs_) {
      if (job->isDone()) continue;
      if (std::find(queues.begin(), queues.end(), job->queueId) != queues.end()) continue;
      queues.push_back(job->queueId);
      runnable.push_back(runsAheadJobs_.load(std::memory_order_relaxed) > 0 ? aheadOf(job) : job);
    }
  }
  bool progressed = false;
  bool anyDone = false;
  for (auto& jobPtr : runnable) {
    Job& job = *jobPtr;
    std::unique_lock<std::mutex> jobLock(job.mutex_, std::try_to_lock);
    if (!jobLock.owns_lock() || job.isDone()) continue;
    if (!job.started_) {
      if (job.streamReady && !job.streamReached()) {
        // Its stream has not reached it: no deadline runs, but abort ends it.
        if (job.draining_) drainStep(job);
        else if (job.abortFlag && job.abortFlag->load(std::memory_order_relaxed))
          failJob(job, error(Code::kAborted, "the communicator was aborted"));
        anyDone |= job.isDone();
        continue;
      }
      // Its stream reached it since it was picked: a job that runs ahead may
      // have been claimed meanwhile (unordered streams), and goes first.
      if (!claimToStart(job)) continue;
      startJob(job);
      progressed = true;
    }
    if (!job.isDone()) progressed |= progressJob(job);
    anyDone |= job.isDone();
  }
  runnable.clear();  // drop references outside the lock-free section
  if (anyDone) {
    std::lock_guard<std::mutex> lock(listMutex_);
    removeJobs([](Job& j) { return j.isDone(); });
    progressed = true;
  }
  return progressed;
}

namespace {

// dst = src for the few-element vectors a small call restarts from: an
// element loop, not vector::operator='s out-of-line call (a reused job's
// sizes repeat, so nothing is allocated).
template <typename T>
void copySmall(std::vector<T>& dst, const std::vector<T>& src) {
  if (dst.size() != src.size()) dst.resize(src.size());
  for (size_t i = 0; i < src.size(); ++i) dst[i] = src[i];
}

}  // namespace

void Engine::startJob(Job& job) {
  job.started_ = true;
  job.begun_.store(true, std::memory_order_release);
  if (job.streamWatch) {
    // Nothing to post: the streams run the plan. Only its connections are
    // derived (the stalled-peer checks ask them).
    distinctConnections(job);
    job.remaining_ = 1;
    job.lastProgressNs_ = 0;
    job.lastAliveCheckNs_ = 0;
    job.resetReportAsks();
    return;
  }
  const Plan& plan = *job.prepared->plan;
  size_t n = plan.steps.size();
  for (size_t k = 0; k < job.opScalars.size(); ++k) {
    OpScalar& scalar = job.opScalars[k];
    if (scalar.deviceScalar)
      std::memcpy(scalar.bytes.data(), scalar.deviceScalar, dataTypeSize(plan.shapes[k].dtype));
  }
  copySmall(job.steps_, job.prepared->initialSteps);
  if (job.laneCursor_.size() != plan.lanes.size()) job.laneCursor_.resize(plan.lanes.size());
  for (uint32_t& cursor : job.laneCursor_) cursor = 0;
  // runReady takes the last first: pushed in reverse, the roots are posted in
  // plan order (a lane's first send is written before its receive is posted).
  job.ready_.clear();  // empty after the last run: keep its capacity
  const std::vector<uint32_t>& roots = job.prepared->roots;
  for (size_t k = roots.size(); k-- > 0;) job.ready_.push_back(roots[k]);
  job.blockedLanes_.clear();
  if (!job.sameConnections || job.connections_.empty()) distinctConnections(job);
  if (plan.readsPeers) fillWindow(job);
  job.remaining_ = n;
  job.lastProgressNs_ = 0;  // the first clock read starts the no-progress clock
  job.lastAliveCheckNs_ = 0;
  job.resetReportAsks();
  if (n == 0) job.finishOk();
}

void Engine::distinctConnections(Job& job) {
  const Plan& plan = *job.prepared->plan;
  job.connections_.clear();
  job.connectionPeers_.clear();
  for (size_t lane = 0; lane < job.laneConnections.size(); ++lane) {
    Connection* c = job.laneConnections[lane];
    if (std::find(job.connections_.begin(), job.connections_.end(), c) != job.connections_.end())
      continue;
    job.connections_.push_back(c);
    job.connectionPeers_.push_back(plan.lanes[lane].peer);
  }
}

// Inlined: it runs once per step of every call, a handful of instructions.
[[gnu::always_inline]] inline void Engine::completeStep(Job& job, uint32_t index) {
  job.steps_[index].state = StepProgress::kDone;
  --job.remaining_;
  const PreparedPlan& p = *job.prepared;
  for (uint32_t k = p.dependentsBegin[index]; k < p.dependentsBegin[index + 1]; ++k) {
    uint32_t d = p.dependents[k];
    if (--job.steps_[d].unmet == 0) job.ready_.push_back(d);
  }
}

void Engine::completeReducedReceive(Job& job, uint32_t index) {
  // The receive's one dependent is its Reduce (findReducesOnReceive), which
  // waited on nothing else when the receive was posted.
  const uint32_t reduce = job.prepared->reduceOnReceive[index].reduce;
  job.steps_[index].state = StepProgress::kDone;
  --job.remaining_;
  job.steps_[reduce].unmet = 0;
  completeStep(job, reduce);
}

const PreparedPlan::ReduceOnReceiveStep* Engine::reduceOnReceiveNow(const Job& job, uint32_t recvStep,
                                                                    const Connection& conn) const {
  // A receive whose Reduce waits on it alone, to a transport that can reduce
  // the bytes as they arrive (decision 0015).
  const auto& table = job.prepared->reduceOnReceive;
  if (table.empty() || table[recvStep].reduce == PreparedPlan::kNoReduce) return nullptr;
  if (job.steps_[table[recvStep].reduce].unmet != 1) return nullptr;
  if (!conn.reducesOnReceive(job.prepared->plan->steps[recvStep].bytes)) return nullptr;
  return &table[recvStep];
}

ReduceOnReceive Engine::reduceOnReceiveFor(const Job& job, uint32_t reduceStep, bool receivedFirst) const {
  // The same reduction runComputeStep would do for this step.
  const Plan& plan = *job.prepared->plan;
  const Step& d = plan.steps[reduceStep];
  const CollShape& shape = plan.shapes[d.op];
  const Slice& other = receivedFirst ? d.src2 : d.src;
  ReduceOnReceive r;
  r.dst = job.buffers[d.dst.buffer] + d.dst.offset;
  r.other = job.buffers[other.buffer] + other.offset;
  r.receivedFirst = receivedFirst;
  r.op = combineOpOf(d, shape);
  r.dtype = shape.dtype;
  r.scalar = scalarOf(job, d.op);
  return r;
}

namespace {

// Sources read from another process go through a bounce buffer of this size,
// small enough to stay in cache between the read and the reduction.
constexpr size_t kBounceBytes = 256 << 10;

// The arithmetic of one compute step (collectives/plan.h) on resolved
// addresses, `bytes` of it.
Status computeStep(const Job& job, const Step& s, uint8_t* dst, const uint8_t* a, const uint8_t* b, uint64_t bytes) {
  const CollShape& shape = job.prepared->plan->shapes[s.op];
  const size_t count = bytes / dataTypeSize(shape.dtype);
  const void* scalar = scalarOf(job, s.op);
  if (job.deviceSteps) {
    // A device plan has only the steps devicePlanFits() allows.
    if (s.kind == StepKind::kReduce)
      return job.deviceSteps->reduce(combineOpOf(s, shape), shape.dtype, dst, a, b, count, scalar);
    if (s.kind == StepKind::kCopy && !scalesSource(s, shape)) return job.deviceSteps->copy(dst, a, bytes);
    return internalError("a device plan has a step the device cannot run");
  }
  switch (s.kind) {
    case StepKind::kReduce:
      reduce::combine(combineOpOf(s, shape), shape.dtype, dst, a, b, count, scalar);
      break;
    case StepKind::kCopy:
      if (scalesSource(s, shape)) reduce::scale(shape.dtype, dst, a, count, scalar);
      else reduce::copy(dst, a, bytes);
      break;
    case StepKind::kDivide:
      reduce::divide(shape.dtype, dst, a, count, shape.divisor);
      break;
    default:
      break;
  }
  return Status::ok();
}

}  // namespace

bool deviceStepsCanRun(const Plan& plan) { return !plan.readsPeers && computeStepsRunOnDevice(plan); }

bool computeStepsRunOnDevice(const Plan& plan) {
  for (const Step& s : plan.steps) {
    switch (s.kind) {
      case StepKind::kSend:
      case StepKind::kRecv:
      case StepKind::kReduce:
        break;
      case StepKind::kCopy:
        if (scalesSource(s, plan.shapes[s.op])) return false;
        break;
      default:
        return false;
    }
  }
  return true;
}

void Engine::fillWindow(Job& job) {
  const Plan& plan = *job.prepared->plan;
  const size_t op = plan.peerReadOp;
  OpLayout layout = opLayout(plan.shapes[op], plan.rank, plan.nranks);
  job.window_.describeOwn(plan.nranks, job.buffers[op * kBuffersPerOp + kSendBuffer], layout.sendBytes,
                          job.buffers[op * kBuffersPerOp + kRecvBuffer], layout.recvBytes, job.peerBuffers.get());
}

Result<uint8_t*> Engine::addressOf(Job& job, const Slice& slice) {
  if (slice.buffer == kWindowBuffer) return job.window_.bytes() + slice.offset;
  if (isPeerBuffer(slice.buffer)) return job.window_.mapped(slice);
  return job.buffers[slice.buffer] + slice.offset;
}

Status Engine::runRemoteComputeStep(Job& job, const Step& s, uint8_t* dst, const Slice* sources,
                                    uint8_t* const* mapped, int count) {
  const uint64_t e = dataTypeSize(job.prepared->plan->shapes[s.op].dtype);
  thread_local std::vector<uint8_t> bounce;
  bounce.resize(kBounceBytes * static_cast<size_t>(count));
  const uint64_t chunk = kBounceBytes / e * e;
  for (uint64_t at = 0; at < s.bytes; at += chunk) {
    const uint64_t len = std::min(chunk, s.bytes - at);
    const uint8_t* in[2] = {nullptr, nullptr};
    for (int k = 0; k < count; ++k) {
      if (mapped[k]) {
        in[k] = mapped[k] + at;
        continue;
      }
      uint8_t* into = bounce.data() + kBounceBytes * static_cast<size_t>(k);
      SHOAL_TRY(job.window_.read(sources[k], at, into, len));
      in[k] = into;
    }
    SHOAL_TRY(computeStep(job, s, dst + at, in[0], in[1], len));
  }
  return Status::ok();
}

Status Engine::runComputeStep(Job& job, uint32_t index) {
  const Plan& plan = *job.prepared->plan;
  const Step& s = plan.steps[index];
  if (s.kind != StepKind::kReduce && s.kind != StepKind::kCopy && s.kind != StepKind::kDivide)
    return internalError("step ", index, " is not a compute step");
  const bool twoSources = s.kind == StepKind::kReduce;
  const bool touchesPeers = plan.readsPeers && (isPeerBuffer(s.dst.buffer) || isPeerBuffer(s.src.buffer) ||
                                                (twoSources && isPeerBuffer(s.src2.buffer)));
  if (!touchesPeers) [[likely]] {
    auto local = [&](const Slice& slice) {
      return (slice.buffer == kWindowBuffer ? job.window_.bytes() : job.buffers[slice.buffer]) + slice.offset;
    };
    return computeStep(job, s, local(s.dst), local(s.src), twoSources ? local(s.src2) : nullptr, s.bytes);
  }
  SHOAL_ASSIGN_OR_RETURN(uint8_t* dst, addressOf(job, s.dst));
  if (!dst) return internalError("step ", index, " writes a peer's buffer that is not mapped here");
  uint8_t* mapped[2] = {nullptr, nullptr};
  SHOAL_ASSIGN_OR_RETURN(mapped[0], addressOf(job, s.src));
  if (twoSources) {
    SHOAL_ASSIGN_OR_RETURN(mapped[1], addressOf(job, s.src2));
  }
  if (mapped[0] && (!twoSources || mapped[1])) {
    return computeStep(job, s, dst, mapped[0], mapped[1], s.bytes);
  }
  // Device memory is reached only through a mapping (a window).
  if (job.deviceSteps)
    return internalError("step ", index, " reads a peer's device buffer that no window maps here");
  const Slice sources[2] = {s.src, s.src2};
  return runRemoteComputeStep(job, s, dst, sources, mapped, twoSources ? 2 : 1);
}

Status Engine::postLaneSteps(Job& job, int32_t lane) {
  const Plan& plan = *job.prepared->plan;
  const Lane& l = plan.lanes[lane];
  uint32_t& cursor = job.laneCursor_[lane];
  Connection* conn = job.laneConnections[lane];
  while (cursor < l.steps.size()) {
    uint32_t index = l.steps[cursor];
    if (job.steps_[index].state != StepProgress::kReady) break;
    const Step& s = plan.steps[index];
    const BufferId buffer = s.kind == StepKind::kSend ? s.src.buffer : s.dst.buffer;
    uint8_t* base = buffer == kWindowBuffer ? job.window_.bytes() : job.buffers[buffer];
    uint64_t tag = job.opTags[s.op];
    const PreparedPlan::ReduceOnReceiveStep* fused =
        s.kind == StepKind::kRecv ? reduceOnReceiveNow(job, index, *conn) : nullptr;
    bool sent = false;
    Status st = s.kind == StepKind::kSend
                    ? conn->postSendOrFinish(base + s.src.offset, s.bytes, tag, index, sent)
                : fused ? conn->postRecvReduce(reduceOnReceiveFor(job, fused->reduce, fused->receivedFirst),
                                               s.bytes, tag, index)
                        : conn->postRecv(base + s.dst.offset, s.bytes, tag, index);
    if (st.code() == Code::kAgain) {
      if (std::find(job.blockedLanes_.begin(), job.blockedLanes_.end(), lane) ==
          job.blockedLanes_.end())
        job.blockedLanes_.push_back(lane);
      break;
    }
    SHOAL_TRY(st) << stepKindName(s.kind) << " step " << index << " to "
                  << conn->peerDescription();
    job.steps_[index].state = fused ? StepProgress::kPostedReduce : StepProgress::kPosted;
    ++cursor;
    if (sent) completeStep(job, index);
  }
  return Status::ok();
}

void Engine::runReady(Job& job) {
  const Plan& plan = *job.prepared->plan;
  uint64_t computed = 0;
  while (!job.ready_.empty() && !job.isDone()) {
    uint32_t index = job.ready_.back();
    const Step& s = plan.steps[index];
    if (s.kind == StepKind::kSend || s.kind == StepKind::kRecv) {
      job.ready_.pop_back();
      job.steps_[index].state = StepProgress::kReady;
      Status st = postLaneSteps(job, s.lane);
      if (!st.isOk()) return failJob(job, std::move(st));
    } else {
      // Transports move bytes only when polled: after this much copying and
      // reducing the caller polls before the rest (an out-of-place AllGather's
      // own 32 MiB copy left both links idle for its whole length).
      if (computed >= kComputeBytesPerPass) return;
      job.ready_.pop_back();
      computed += s.bytes;
      Status st = runComputeStep(job, index);
      if (!st.isOk()) return failJob(job, std::move(st));
      completeStep(job, index);
    }
  }
}

bool Engine::progressJob(Job& job) {
  if (job.draining_) [[unlikely]] {
    drainStep(job);
    return false;
  }
  if (job.abortFlag && job.abortFlag->load(std::memory_order_relaxed)) {
    failJob(job, error(Code::kAborted, "the communicator was aborted"));
    return true;
  }
  bool progressed = false;
  if (job.streamWatch) {
    // Verified before the end is looked at, and again after: the messages
    // of a finished plan have all been checked.
    const bool finished = job.streamWatch->finished();
    if (Status st = job.streamWatch->verify(); !st.isOk()) {
      failJob(job, std::move(st));
      return true;
    }
    if (finished) {
      job.finishOk();
      return true;
    }
    progressed = job.streamWatch->moved();
    return watchDeadlines(job, progressed) || progressed;
  }
  if (!job.blockedLanes_.empty()) {
    std::vector<int32_t> blocked;
    blocked.swap(job.blockedLanes_);
    for (int32_t lane : blocked) {
      Status st = postLaneSteps(job, lane);
      if (!st.isOk()) {
        failJob(job, std::move(st));
        return true;
      }
    }
  }
  if (!job.ready_.empty()) runReady(job);
  for (size_t c = 0; c < job.connections_.size(); ++c) {
    Connection* conn = job.connections_[c];
    if (job.isDone()) return true;
    job.completions_.clear();
    bool moved = false;
    Status st = conn->poll(job.completions_, moved);
    if (!st.isOk()) {
      job.failedPeer_ = job.connectionPeers_[c];
      failJob(job, std::move(st));
      return true;
    }
    for (const Completion& c : job.completions_) {
      const auto index = static_cast<uint32_t>(c.token);
      if (job.steps_[index].state == StepProgress::kPostedReduce) completeReducedReceive(job, index);
      else completeStep(job, index);
    }
    progressed |= moved || !job.completions_.empty();
  }
  if (!job.ready_.empty()) {
    progressed = true;
    runReady(job);
  }
  if (job.isDone()) return true;
  if (job.remaining_ == 0) {
    job.finishOk();
    return true;
  }
  watchDeadlines(job, progressed);
  return progressed;
}

bool Engine::watchDeadlines(Job& job, bool progressed) {
  // The clock is read once per kPollsPerClockRead passes: a progress time is
  // then known to that precision, far below any no-progress deadline.
  job.progressSinceClock_ |= progressed;
  if (++job.passesSinceClock_ < kPollsPerClockRead) return false;
  job.passesSinceClock_ = 0;
  int64_t now = nowNs();
  if (uint64_t epoch = reportEpoch_.load(std::memory_order_relaxed); epoch != job.reportedEpoch_) [[unlikely]]
    postReport(job, epoch, now);
  if (job.progressSinceClock_ || job.lastProgressNs_ == 0) {
    job.lastProgressNs_ = now;
    job.progressSinceClock_ = false;
    job.stallWarnings_ = 0;
    return false;
  }
  if (checkStalledPeers(job, now)) return true;
  warnIfStalled(job, now);
  int64_t limitMs = params().progressTimeoutMs;
  if (limitMs > 0 && now - job.lastProgressNs_ > limitMs * 1000000) {
    if (TimeoutObserver observer = timeoutObserver_.load()) observer(reportOf(job, now));
    failJob(job, timeoutStatus(job));
    return true;
  }
  return false;
}

JobReport Engine::reportOf(const Job& job, int64_t now) {
  JobReport r;
  r.what = job.description();
  r.queueId = job.queueId;
  r.sequence = job.sequence;
  r.idleMs = job.lastProgressNs_ > 0 ? (now - job.lastProgressNs_) / 1000000 : 0;
  if (!job.started_ || job.streamWatch) return r;
  const Plan& plan = *job.prepared->plan;
  r.stepsTotal = plan.steps.size();
  auto peerEntry = [&](int rank) -> JobReport::Peer& {
    for (JobReport::Peer& p : r.peers)
      if (p.rank == rank) return p;
    r.peers.push_back(JobReport::Peer{rank});
    return r.peers.back();
  };
  for (size_t i = 0; i < plan.steps.size(); ++i) {
    const Step& s = plan.steps[i];
    const StepProgress::State state = job.steps_[i].state;
    if (state == StepProgress::kDone) ++r.stepsDone;
    if (s.kind != StepKind::kSend && s.kind != StepKind::kRecv) continue;
    JobReport::Peer& p = peerEntry(s.peer);
    const bool posted = state == StepProgress::kPosted || state == StepProgress::kPostedReduce ||
                        state == StepProgress::kDone;
    const bool done = state == StepProgress::kDone;
    (s.kind == StepKind::kSend ? p.sendPosted : p.recvPosted) += posted ? s.bytes : 0;
    (s.kind == StepKind::kSend ? p.sendDone : p.recvDone) += done ? s.bytes : 0;
  }
  for (const Lane& lane : plan.lanes) {
    for (uint32_t index : lane.steps) {
      const StepProgress::State state = job.steps_[index].state;
      if (state == StepProgress::kDone) continue;
      if ((state == StepProgress::kPosted || state == StepProgress::kPostedReduce) &&
          std::find(r.waitingOn.begin(), r.waitingOn.end(), lane.peer) == r.waitingOn.end())
        r.waitingOn.push_back(lane.peer);
      break;  // the lane's oldest unfinished step
    }
  }
  return r;
}

void Engine::postReport(Job& job, uint64_t epoch, int64_t now) {
  job.reportedEpoch_ = epoch;
  JobReport report = reportOf(job, now);
  {
    std::lock_guard<std::mutex> lock(reportMutex_);
    std::erase_if(posted_, [&](const auto& p) { return p.second.queueId == job.queueId; });
    posted_.emplace_back(epoch, std::move(report));
  }
  reportPosted_.notify_all();
}

uint64_t Engine::requestReports() { return reportEpoch_.fetch_add(1) + 1; }

std::optional<JobReport> Engine::takeReport(uint64_t queueId, uint64_t epoch, Deadline deadline) {
  std::unique_lock<std::mutex> lock(reportMutex_);
  for (;;) {
    for (auto it = posted_.begin(); it != posted_.end(); ++it) {
      if (it->second.queueId != queueId || it->first < epoch) continue;
      JobReport report = std::move(it->second);
      posted_.erase(it);
      return report;
    }
    if (deadline.expired()) return std::nullopt;
    reportPosted_.wait_for(lock, std::chrono::milliseconds(10));
  }
}

size_t Engine::queuedJobs(uint64_t queueId) {
  std::lock_guard<std::mutex> lock(listMutex_);
  drainIncoming();
  return static_cast<size_t>(std::count_if(jobs_.begin(), jobs_.end(), [&](const JobPtr& j) {
    return j->queueId == queueId && !j->isDone();
  }));
}

// A job that has moved no byte for an idle check interval (SHOAL_IDLE_CHECK_MS)
// asks its connections, once per interval, whether their peers are still
// there (Connection::checkAlive, as the idle check does between operations):
// a host that is down or cut off answers nothing, not even keepalive probes
// or retransmissions, and is found after tcp's silence limit (25 s) instead
// of at the no-progress deadline (300 s by default). A peer that is merely
// late or stopped still has a kernel that answers, and is left to that
// deadline. Runs on the thread that progresses the job, which alone uses its
// connections now. True when the job failed.
bool Engine::checkStalledPeers(Job& job, int64_t now) {
  const int64_t intervalMs = params().idleCheckMs;
  if (intervalMs <= 0 || now - job.lastProgressNs_ < intervalMs * 1000000) return false;
  // A lookup asked for (checkReportedPeers) is answered by the connect
  // watch's thread within milliseconds: read what it found soon after, not
  // an interval later.
  if (job.nextAnswerReadNs_ != 0 && now >= job.nextAnswerReadNs_) {
    job.nextAnswerReadNs_ = now < job.answerReadUntilNs_ ? now + kAnswerReadEveryNs : 0;
    if (failIfReported(job, now)) return true;
  }
  if (now - job.lastAliveCheckNs_ < intervalMs * 1000000) return false;
  job.lastAliveCheckNs_ = now;
  for (size_t i = 0; i < job.connections_.size(); ++i) {
    Status lost = job.connections_[i]->checkAlive();
    if (lost.isOk()) continue;
    job.failedPeer_ = job.connectionPeers_[i];
    // What this job waits on comes first: a same-host peer's reported
    // failure may say less about the cause than this rank's own view.
    failJob(job, Status(Code::kRemoteError, str("no progress for ", (now - job.lastProgressNs_) / 1000000,
                                                " ms waiting on: ", waitingList(job), "; and a peer is gone: ",
                                                lost.message())));
    return true;
  }
  return checkReportedPeers(job, now);
}

// A stalled job's peers may have published a failure without closing their
// connections to this rank. Once per interval it reads what is already known
// of the peers it waits on (cheap); lookups in the store (on the connect
// watch's thread) are asked for at the first interval of no progress, then
// after 1, 2, 4, ... up to 32 intervals, a few peers at a time in turn, so
// that ranks waiting a long while on a slow peer load the store little.
bool Engine::checkReportedPeers(Job& job, int64_t now) {
  if (job.failureReports == nullptr) return false;
  (void)waitingList(job);  // who it waits on now (waitingOn_), read by the answers too
  if (failIfReported(job, now)) return true;
  const int64_t intervalNs = params().idleCheckMs * 1000000;
  if ((job.nextReportAskNs_ == 0 || now >= job.nextReportAskNs_) && !job.waitingOn_.empty()) {
    const size_t n = job.waitingOn_.size();
    for (size_t i = 0; i < std::min(n, kReportAsksPerCheck); ++i)
      job.failureReports->lookUp(job.waitingOn_[(job.reportAskCursor_ + i) % n]);
    job.reportAskCursor_ += std::min(n, kReportAsksPerCheck);
    job.nextReportAskNs_ = now + job.reportAskEvery_ * intervalNs;
    job.reportAskEvery_ = std::min<int64_t>(job.reportAskEvery_ * 2, kMostIntervalsBetweenAsks);
    job.nextAnswerReadNs_ = now + kAnswerReadEveryNs;
    job.answerReadUntilNs_ = now + std::min<int64_t>(intervalNs, kAnswerReadForNs);
  }
  return false;
}

// What is already known of the peers the job waits on: one that will not
// come fails it.
bool Engine::failIfReported(Job& job, int64_t now) {
  if (job.failureReports == nullptr) return false;
  for (int peer : job.waitingOn_) {
    std::string why = job.failureReports->knownFailure(peer);
    if (why.empty()) continue;
    // A report is added by the communicator's failure handling (the failed
    // peer's, handleFailure), so it is not repeated here.
    job.failedPeer_ = peer;
    failJob(job, Status(Code::kRemoteError,
                        str("no progress for ", (now - job.lastProgressNs_) / 1000000, " ms waiting on: ",
                            waitingList(job), "; rank ", peer, " will not come: ",
                            why.starts_with(kReportedFailurePrefix) ? std::string("its communicator failed") : why)));
    return true;
  }
  return false;
}

void Engine::warnIfStalled(Job& job, int64_t now) {
  const int64_t warnMs = params().stallWarnMs;
  if (warnMs <= 0 || job.stallWarnings_ >= 30) return;
  const int64_t idleMs = (now - job.lastProgressNs_) / 1000000;
  if (idleMs < warnMs << job.stallWarnings_) return;
  ++job.stallWarnings_;
  const int64_t limitMs = params().progressTimeoutMs;
  SHOAL_WARN(job.description(), ": no progress for ", idleMs, " ms, waiting on: ", waitingList(job),
             limitMs > 0 ? str("; it fails at ", limitMs, " ms (SHOAL_PROGRESS_TIMEOUT_MS)")
                         : std::string("; no deadline (SHOAL_PROGRESS_TIMEOUT_MS=0)"),
             ". Usually a rank did not make this call, or made another: SHOAL_REPORT_SIGNAL and "
             "tools/shoal_hang_report.py show what every rank is doing (docs/diagnostics.md)");
}

Status Engine::timeoutStatus(Job& job) const {
  return error(Code::kTimeout, "no progress for ", params().progressTimeoutMs,
               " ms (SHOAL_PROGRESS_TIMEOUT_MS) waiting on: ", waitingList(job));
}

std::string Engine::waitingList(Job& job) const {
  job.waitingOn_.clear();  // who it waits on now, not who it ever waited on
  if (job.streamWatch) return job.streamWatch->waitingOn(job.waitingOn_);
  const Plan& plan = *job.prepared->plan;
  std::vector<std::string> peers;
  for (size_t lane = 0; lane < plan.lanes.size(); ++lane) {
    for (uint32_t index : plan.lanes[lane].steps) {
      if (job.steps_[index].state != StepProgress::kPosted &&
          job.steps_[index].state != StepProgress::kPostedReduce)
        continue;
      const Step& s = plan.steps[index];
      std::string what = str(s.kind == StepKind::kSend ? "send to " : "receive from ",
                             job.laneConnections[lane]->peerDescription());
      if (std::find(peers.begin(), peers.end(), what) == peers.end()) peers.push_back(what);
      if (std::find(job.waitingOn_.begin(), job.waitingOn_.end(), s.peer) == job.waitingOn_.end())
        job.waitingOn_.push_back(s.peer);
      break;
    }
  }
  std::string list;
  for (const auto& p : peers) list += (list.empty() ? "" : "; ") + p;
  return list.empty() ? std::string("nothing posted") : list;
}

void Engine::failJob(Job& job, Status status) {
  if (job.isDone() || job.draining_) return;
  status.withContext(job.description());
  SHOAL_WARN(status.message());
  if (job.streamWatch) {
    // Its streams may wait on the links (or reach the plan later): released
    // until they have passed it. The error is readable at once (failing()).
    job.draining_ = true;
    job.drainStatus_ = std::move(status);
    job.failing_.store(true, std::memory_order_release);
    job.drainEndNs_ = nowNs() + kDrainMs * 1000000;
    job.streamWatch->release();
    return;
  }
  job.finish(std::move(status));
}

void Engine::drainStep(Job& job) {
  job.streamWatch->release();
  if (job.streamWatch->finished() || nowNs() > job.drainEndNs_) job.finish(Status(job.drainStatus_));
}

void Engine::retire(uint64_t queueId, const Status& reason) {
  std::lock_guard<std::mutex> lock(listMutex_);
  drainIncoming();
  removeJobs([&](Job& j) {
    if (j.queueId != queueId) return false;
    // Waits for a thread that is progressing it right now to finish its pass.
    std::lock_guard<std::mutex> jobLock(j.mutex_);
    if (!j.isDone()) j.finish(reason);
    return true;
  });
}

template <typename Predicate>
void Engine::removeJobs(Predicate shouldRemove) {
  size_t before = jobs_.size();
  size_t detachedRemoved = 0, runsAheadRemoved = 0;
  std::erase_if(jobs_, [&](const JobPtr& j) {
    if (!shouldRemove(*j)) return false;
    if (j->detached) ++detachedRemoved;
    if (j->runsAhead) ++runsAheadRemoved;
    return true;
  });
  jobCount_.fetch_sub(before - jobs_.size(), std::memory_order_relaxed);
  detachedCount_.fetch_sub(detachedRemoved, std::memory_order_relaxed);
  runsAheadJobs_.fetch_sub(runsAheadRemoved, std::memory_order_relaxed);
}

void Engine::ensureProgressThread() {
  std::lock_guard<std::mutex> lock(submitMutex_);
  // One per process. A child forked after the parent started its thread has
  // no such thread (fork copies only the caller): it starts its own.
  const pid_t self = ::getpid();
  if (progressThreadPid_ == self || stopping_) return;
  progressThreadPid_ = self;
  progressThreadRunning_ = true;
  std::thread thread([this] { progressThreadMain(); });
  progressThreadId_ = thread.get_id();
  // Detached: the engine lives for the process. At exit the thread is stopped
  // (below) before static destructors run, since a job's pass may touch them.
  thread.detach();
  static std::once_flag atExit;
  std::call_once(atExit, [] { std::atexit([] { instance().stopProgressThread(); }); });
}

void Engine::progressThreadMain() {
  markLibraryThread();
  Backoff backoff;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(submitMutex_);
      auto busy = [&] { return stopping_ || detachedCount_.load() > 0; };
      auto watching = [&] { return params().idleCheckMs > 0 && watchCount_.load() > 0; };
      if (watching()) {
        // Asleep until detached work arrives, the next idle check is due or
        // an idle check's answer is to be read.
        int64_t dueNs = nextIdleCheckNs_;
        if (const int64_t answers = nextAnswersReadNs_.load(std::memory_order_relaxed); answers != 0)
          dueNs = std::min(dueNs, answers);
        int64_t leftNs = dueNs - nowNs();
        if (leftNs > 0) wake_.wait_for(lock, std::chrono::nanoseconds(leftNs), busy);
      } else {
        wake_.wait(lock, [&] { return busy() || watching(); });
      }
      if (stopping_) {
        progressThreadRunning_ = false;
        progressStopped_.notify_all();
        return;
      }
    }
    runIdleChecks();
    if (detachedCount_.load(std::memory_order_relaxed) == 0) continue;
    if (poll()) backoff.reset();
    else backoff.pause();
  }
}

void Engine::watchIdle(IdleWatch* w) {
  {
    std::lock_guard<std::mutex> lock(watchMutex_);
    watched_.emplace_back(w, ::getpid());
    watchCount_.store(watched_.size());
  }
  if (params().idleCheckMs <= 0) return;
  ensureProgressThread();
  wake_.notify_one();  // a thread asleep without a timeout takes one now
}

void Engine::unwatchIdle(IdleWatch* w) {
  std::lock_guard<std::mutex> lock(watchMutex_);  // waits for a round in progress
  std::erase_if(watched_, [&](const auto& entry) { return entry.first == w; });
  std::erase_if(awaitingAnswers_, [&](const auto& entry) { return entry.first == w; });
  watchCount_.store(watched_.size());
}

void Engine::runIdleChecks() {
  const int64_t intervalMs = params().idleCheckMs;
  if (intervalMs <= 0 || watchCount_.load(std::memory_order_relaxed) == 0) return;
  const int64_t now = nowNs();
  const int64_t answersDue = nextAnswersReadNs_.load(std::memory_order_relaxed);
  if (answersDue != 0 && now >= answersDue && now < nextIdleCheckNs_) {
    std::lock_guard<std::mutex> lock(watchMutex_);
    // A forked child's copy of its parent's list is not its own.
    const pid_t self = ::getpid();
    std::erase_if(awaitingAnswers_,
                  [&](const auto& entry) { return entry.second != self || entry.first->readIdleAnswer(); });
    const bool more = !awaitingAnswers_.empty() && now < answersReadUntilNs_;
    if (!more) awaitingAnswers_.clear();
    nextAnswersReadNs_.store(more ? now + kAnswerReadEveryNs : 0, std::memory_order_relaxed);
    return;
  }
  if (now < nextIdleCheckNs_) return;
  nextIdleCheckNs_ = now + intervalMs * 1000000;
  const pid_t self = ::getpid();
  std::lock_guard<std::mutex> lock(watchMutex_);
  awaitingAnswers_.clear();
  for (const auto& [w, pid] : watched_)
    if (pid == self && w->checkIdle()) awaitingAnswers_.emplace_back(w, pid);
  answersReadUntilNs_ = now + std::min<int64_t>(intervalMs * 1000000, kAnswerReadForNs);
  nextAnswersReadNs_.store(awaitingAnswers_.empty() ? 0 : now + kAnswerReadEveryNs, std::memory_order_relaxed);
}

bool Engine::queueAtRest(uint64_t queueId) {
  std::lock_guard<std::mutex> lock(listMutex_);
  drainIncoming();
  for (const JobPtr& j : jobs_) {
    if (j->queueId != queueId) continue;
    if (!j->isDone()) return false;
    // Done, but a thread may still be leaving its pass over it.
    std::unique_lock<std::mutex> jobLock(j->mutex_, std::try_to_lock);
    if (!jobLock.owns_lock()) return false;
  }
  return true;
}

}  // namespace shoal
