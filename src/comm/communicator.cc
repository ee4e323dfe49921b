#include "comm/communicator.h"

#include "comm/hang_report.h"
#include "comm/stream_bridge.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <iterator>
#include <cstring>
#include <utility>

#include "collectives/layout.h"
#include "collectives/registry.h"
#include "core/clock.h"
#include "core/log.h"
#include "core/params.h"
#include "core/process.h"
#include "core/tag.h"
#include "transports/registry.h"

namespace shoal {
namespace {

uint64_t hash64(std::string_view s) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

constexpr size_t kPlanCacheLimit = 512;

// NCCL drops zero-count collectives; zero-byte Send/Recv still match.
bool droppedByNccl(const OpRequest& op) {
  return op.shape.count == 0 && op.shape.kind != CollKind::kSend && op.shape.kind != CollKind::kRecv;
}

bool sameButPlacement(const CollShape& a, const CollShape& b) {
  return a.kind == b.kind && a.dtype == b.dtype && a.op == b.op && a.count == b.count && a.root == b.root &&
         a.peer == b.peer && a.divisor == b.divisor;
}

}  // namespace

Communicator::Communicator(InitRequest request)
    : rank_(request.rank),
      nranks_(request.nranks),
      options_(request.options),
      request_(std::move(request)) {
  commId_ = hash64(request_.scope);
}

Communicator::~Communicator() {
  if (idleWatched_) Engine::instance().unwatchIdle(this);  // first: a check may be running
  hang::untrack(this);
  Engine::instance().retire(reinterpret_cast<uintptr_t>(this),
                            error(Code::kAborted, "communicator destroyed"));
}

std::string Communicator::idHex() const {
  char id[20];
  std::snprintf(id, sizeof(id), "%016llx", static_cast<unsigned long long>(commId_));
  return id;
}

std::string Communicator::describe() const {
  const std::string id = idHex();
  std::string host = rank_ < static_cast<int>(peers_.size()) ? peers_[rank_].hostname : "";
  return str("comm ", id, " rank ", rank_, "/", nranks_, host.empty() ? "" : " (host " + host + ")");
}

Status Communicator::initialize() {
  setLogRank(rank_);
  // The flag is the caller's: it is not kept past this call.
  const std::atomic<bool>* cancel = std::exchange(request_.cancel, nullptr);
  Deadline deadline = Deadline::afterMs(params().initTimeoutMs).cancelledBy(cancel);
  bootstrap_ = std::make_unique<Bootstrap>(request_.store, request_.scope, rank_, nranks_);

  PeerInfo self;
  self.rank = rank_;
  self.hostname = localHostname();
  self.hostId = localHostId();
  self.processId = localProcessId();
  self.kernelId = localKernelId();
  SHOAL_TRY(findCudaDevice(self));
  SHOAL_TRY(publishAddresses(self)) << describe();

  std::string mine = str(nranks_, '\n', self.serialize());
  SHOAL_ASSIGN_OR_RETURN(auto all, bootstrap_->allGather(mine, deadline),
      describe(), ": bootstrap through ", request_.store->describe());
  peers_.resize(nranks_);
  for (int r = 0; r < nranks_; ++r) {
    std::string_view blob = all[r];
    size_t nl = blob.find('\n');
    if (nl == std::string_view::npos) return internalError(describe(), ": malformed peer info");
    int theirSize = std::atoi(std::string(blob.substr(0, nl)).c_str());
    if (theirSize != nranks_)
      return invalidUsage(describe(), ": rank ", r, " was initialized with nranks=", theirSize,
                          " but this rank with nranks=", nranks_);
    SHOAL_ASSIGN_OR_RETURN(peers_[r], PeerInfo::deserialize(blob.substr(nl + 1)),
      describe(), ": peer info of rank ", r);
    if (peers_[r].rank != r)
      return invalidUsage(describe(), ": two processes claim rank ", peers_[r].rank);
  }
  topology_ = buildTopology(peers_);
  logSharedGpus();
  chooseWaitSpin(self);
  rankView_.rank = rank_;
  rankView_.nranks = nranks_;
  rankView_.ring = topology_.ring;
  rankView_.nodeOf = topology_.nodeOfRank;
  // Ranks choose plans independently, so what the tuner and the plans see must
  // be the same on every rank, yet part of it is only known locally: whether
  // this rank reads every peer's memory (peer-reading algorithms need all to),
  // the transport between the first two node leaders and whether its bytes
  // pass through the CPU (as the first leader chose it; each process knows
  // only which of its own transports work), and
  // the machine facts (combined as agreedMachine()). One exchange pools them.
  bool readsAll = true;
  for (int r = 0; r < nranks_ && readsAll; ++r) {
    if (r == rank_ || (peers_[r].processId == self.processId && peers_[r].hostId == self.hostId)) continue;
    auto chosen = selectTransport(self, peers_[r]);
    readsAll = chosen.isOk() && chosen.value()->readsPeerMemory(peers_[r]);
  }
  std::string netTransport = "- 0 0";  // only node 0's leader names one
  if (topology_.leaders.size() > 1 && rank_ == topology_.leaders[0]) {
    if (Result<Transport*> t = selectTransport(self, peers_[topology_.leaders[1]]); t.isOk())
      netTransport = str(t.value()->name(), ' ', t.value()->cpuCopiesBytes() ? 1 : 0, ' ',
                         t.value()->emulatesMessagesOverSockets() ? 1 : 0);
  }
  SHOAL_ASSIGN_OR_RETURN(auto answers,
      bootstrap_->allGather(str(readsAll ? 1 : 0, ' ', netTransport, ' ', encodeMachineFacts(localMachine())),
                            deadline),
      describe(), ": agreeing on peer reads, transports and machine facts");
  bool everyoneReads = true;
  std::string agreedNetTransport;
  bool agreedNetCpuCopies = false, agreedNetEmulated = false;
  std::vector<MachineTopology> machines;
  for (int r = 0; r < nranks_; ++r) {
    // "<reads 0|1> <net transport|-> <its CPU copies 0|1> <emulated messaging 0|1> <machine facts>"
    std::string_view answer = answers[r];
    std::string_view words[4];
    for (std::string_view& word : words) {
      size_t end = answer.find(' ');
      if (end == std::string_view::npos)
        return internalError(describe(), ": malformed agreement from rank ", r, ": '", answers[r], "'");
      word = answer.substr(0, end);
      answer.remove_prefix(end + 1);
    }
    everyoneReads = everyoneReads && words[0] == "1";
    if (words[1] != "-") {
      agreedNetTransport = std::string(words[1]);
      agreedNetCpuCopies = words[2] == "1";
      agreedNetEmulated = words[3] == "1";
    }
    SHOAL_ASSIGN_OR_RETURN(MachineTopology machine, decodeMachineFacts(answer), describe(), ": rank ", r);
    machines.push_back(std::move(machine));
  }
  rankView_.peerReads = everyoneReads;
  groupView_ = rankView_;
  groupView_.peerReads = false;  // peer-reading plans are single-op

  const bool singleProcess = std::all_of(peers_.begin(), peers_.end(), [&](const PeerInfo& p) {
    return p.processId == self.processId && p.hostId == self.hostId;
  });
  // Fixed pairs with everyone's PeerInfo: every rank gets the same summary.
  auto classify = [&](int a, int b) {
    Result<Transport*> t = selectTransport(peers_[a], peers_[b]);
    return t.isOk() ? t.value()->linkClass() : LinkClass::kNet;
  };
  MachineTopology machine = agreedMachine(machines);
  machine.nics = localMachine().nics;  // described in the log, not modelled
  machine.source = localMachine().source;
  TopologySummary summary = summarizeTopology(topology_, classify, singleProcess, std::move(machine));
  summary.netTransport = std::move(agreedNetTransport);
  summary.netCpuCopies = agreedNetCpuCopies;
  summary.netEmulatedOverSockets = agreedNetEmulated;
  SHOAL_ASSIGN_OR_RETURN(tuner_, Tuner::create(summary, options_.minChannels, options_.maxChannels),
      describe());
  rankView_.ranksTakeTurns = groupView_.ranksTakeTurns = tuner_->ranksTakeTurns();
  // The root may live in rank 0's process: do not let rank 0 return (and
  // perhaps exit) before every rank is done with it.
  SHOAL_TRY(bootstrap_->finish(deadline)) << describe() << ": finishing bootstrap";
  SHOAL_INFO(subsys::kInit, describe(), " nodes ", topology_.nodes.size(), " - Init COMPLETE");
  initState_.store(Code::kOk);
  // Peers in other processes can be lost between operations: the progress
  // thread looks at our idle connections (checkIdle). Ranks that are threads
  // of this process cannot.
  if (!singleProcess) {
    idleWatched_ = true;
    Engine::instance().watchIdle(this);
  }
  hang::track(this);
  return Status::ok();
}

size_t Communicator::ShapeHash::operator()(const CollShape& s) const {
  uint64_t h = s.count * 0x9e3779b97f4a7c15ull;
  h ^= (static_cast<uint64_t>(s.kind) << 8 | static_cast<uint64_t>(s.dtype) << 16 |
        static_cast<uint64_t>(s.op) << 24) + (h << 6) + (h >> 2);
  h ^= (static_cast<uint64_t>(static_cast<uint32_t>(s.root)) << 32 | static_cast<uint32_t>(s.peer)) + (h << 6);
  h ^= s.divisor + (static_cast<uint64_t>(s.disjointBuffers) << 40) + (h << 6) + (h >> 2);
  return static_cast<size_t>(h);
}

bool Communicator::ShapeEqual::operator()(const CollShape& a, const CollShape& b) const {
  return sameButPlacement(a, b) && a.disjointBuffers == b.disjointBuffers;
}

CollShape Communicator::placedShape(const OpRequest& op) const {
  CollShape shape = op.shape;
  shape.disjointBuffers = disjointBuffers(op);
  return shape;
}

// The tuner is a pure function of the shape for a communicator's lifetime, so
// a cached plan also stands for the tuner's decision: a repeated operation
// costs one hash lookup.
Result<std::shared_ptr<const PreparedPlan>> Communicator::planFor(const CollShape& shape, bool grouped) {
  auto& cache = grouped ? groupPlanCache_ : planCache_;
  const RankView& view = grouped ? groupView_ : rankView_;
  auto it = cache.find(shape);
  if (it != cache.end()) return it->second;
  SHOAL_ASSIGN_OR_RETURN(TunerChoice choice, tuner_->choose(shape, view));
  auto plan = std::make_shared<Plan>(choice.algorithm->build(shape, view, choice.params));
  if (cache.size() >= kPlanCacheLimit) cache.clear();
  auto prepared = preparePlan(plan);
  cache.emplace(shape, prepared);
  return prepared;
}

std::shared_ptr<const PreparedPlan> Communicator::mergedPlanFor(std::vector<std::shared_ptr<const PreparedPlan>> parts) {
  std::vector<const PreparedPlan*> key;
  key.reserve(parts.size());
  for (const auto& part : parts) key.push_back(part.get());
  auto it = mergedPlanCache_.find(key);
  if (it != mergedPlanCache_.end()) return it->second.merged;
  std::vector<PlanPtr> plans;
  plans.reserve(parts.size());
  for (const auto& part : parts) plans.push_back(part->plan);
  auto merged = preparePlan(std::make_shared<Plan>(mergePlans(plans)));
  if (mergedPlanCache_.size() >= kPlanCacheLimit) mergedPlanCache_.clear();
  mergedPlanCache_.emplace(std::move(key), MergedPlan{std::move(parts), merged});
  return merged;
}

// How long waiting ranks spin before yielding (Backoff::setSpinPasses): once
// any communicator of the process has more ranks on this machine (one kernel:
// emulated nodes share it) than the machine has cores, yield at once, for the
// rest of the process (a spinning rank would hold the core its peer needs;
// the cost the other way is ~1.5 us a wait).
void Communicator::chooseWaitSpin(const PeerInfo& self) const {
  if (params().waitSpin >= 0) {
    Backoff::setSpinPasses(static_cast<uint32_t>(std::min<int64_t>(params().waitSpin, 1 << 20)));
    return;
  }
  int ranksHere = static_cast<int>(
      std::count_if(peers_.begin(), peers_.end(), [&](const PeerInfo& p) { return p.sharesCpusWith(self); }));
  if (ranksHere > localMachine().cores && Backoff::spinPasses() != 0) {
    Backoff::setSpinPasses(0);
    SHOAL_INFO(subsys::kInit, describe(), ": ", ranksHere, " ranks on this machine, ", localMachine().cores,
               " cores: waiting ranks yield the core at once");
  }
}

Result<Connection*> Communicator::connectionTo(int peer, uint16_t channel, bool unlessWaiting) {
  auto key = std::make_pair(peer, channel);
  auto it = connections_.find(key);
  if (it != connections_.end()) return it->second.get();
  if (peer < 0 || peer >= nranks_) return internalError("plan names peer ", peer);
  Transport* transport = nullptr;
  if (peer == rank_) {
    transport = transportToSelf();
  } else {
    SHOAL_ASSIGN_OR_RETURN(transport, selectTransport(peers_[rank_], peers_[peer]),
      describe());
  }
  ConnectionKey ckey{commId_, rank_, peer, channel};
  if (unlessWaiting && transport->connectWaitsForPeer(ckey)) return nullptr;
  ConnectOptions opts;
  opts.self = &peers_[rank_];
  opts.peer = &peers_[peer];
  opts.secret = request_.secret;
  // abort() from another thread ends a connect that waits for a peer.
  opts.deadline = Deadline::afterMs(params().initTimeoutMs).cancelledBy(&abortFlag_);
  SHOAL_ASSIGN_OR_RETURN(auto conn, transport->connect(ckey, opts),
      describe(), ": connecting to rank ", peer, " (host ", peers_[peer].hostname, ") over ", transport->name());
  SHOAL_INFO(subsys::kInit | subsys::kNet, "Channel ",
             channel == kP2pChannel ? std::string("p2p") : std::to_string(channel), " : ", rank_,
             " -> ", peer, " via ", transport->name());
  Connection* raw = conn.get();
  connections_.emplace(key, std::move(conn));
  return raw;
}

Status Communicator::ensureConnections(const Plan& plan,
                                       std::vector<Connection*>& laneConnections) {
  laneConnections.resize(plan.lanes.size());
  for (size_t i = 0; i < plan.lanes.size(); ++i) {
    SHOAL_ASSIGN_OR_RETURN(laneConnections[i],
                           connectionTo(plan.lanes[i].peer, plan.lanes[i].channel));
  }
  return Status::ok();
}

Status Communicator::findCudaDevice(PeerInfo& self) {
  cuda_ = cuda::Driver::inUse();
  if (cuda_ == nullptr) {
    SHOAL_INFO(subsys::kInit, describe(), ": host memory (",
               cuda::Driver::built() ? "this process does not use CUDA" : "built without CUDA", ")");
    return Status::ok();
  }
  SHOAL_ASSIGN_OR_RETURN(std::optional<cuda::DeviceIdentity> device, cuda_->currentDevice(),
                         describe(), ": the current CUDA device");
  if (device) {
    cudaDevice_ = device->ordinal;
    self.gpu = device->uuidText();
    SHOAL_INFO(subsys::kInit, describe(), ": CUDA device ", cudaDevice_, " (", self.gpu,
               "); device buffers are staged through pinned host memory");
  } else {
    SHOAL_INFO(subsys::kInit, describe(), ": CUDA is in use but no context is current; "
               "device buffers use the context current at each call");
  }
  return Status::ok();
}

void Communicator::logSharedGpus() const {
  // Several ranks on one GPU are allowed (docs/cuda.md); say so once.
  for (int r = 0; r < nranks_; ++r)
    if (r != rank_ && !peers_[r].gpu.empty() && peers_[r].gpu == peers_[rank_].gpu) {
      SHOAL_INFO(subsys::kInit, describe(), ": rank ", r, " uses the same GPU (", peers_[r].gpu, ")");
      return;
    }
}

Result<bool> Communicator::streamOrdered(const OpRequest& op) {
  if (cuda_ == nullptr) return false;
  if (!bridge_) {
    SHOAL_ASSIGN_OR_RETURN(std::optional<cuda::DeviceIdentity> device, cuda_->currentDevice(),
                           describe(), ": the current CUDA device");
    cuda::DeviceIdentity identity = device ? *device : cuda::DeviceIdentity{};
    if (!device) {
      // No context: the buffers cannot be device memory of this thread's;
      // classify them anyway (a CUDA error never means "host pointer").
      SHOAL_ASSIGN_OR_RETURN(cuda::MemoryKind kind, cuda_->memoryKind(op.sendbuff ? op.sendbuff : op.recvbuff));
      if (!cuda::knownToCuda(kind)) return false;
      return invalidUsage(describe(), ": ", cuda::memoryKindName(kind),
                          " buffers need a current CUDA context on the calling thread");
    }
    bridge_ = std::make_unique<StreamBridge>(*cuda_, identity);
  }
  return bridge_->streamOrdered(op, rank_, nranks_);
}

Result<Communicator::StreamSubmission> Communicator::beginStreamOrdered(std::span<const OpRequest> ops) {
  UseGuard use(*this);
  if (!bridge_) return internalError(describe(), ": stream-ordered operation without a bridge");
  if (aborted()) return error(Code::kAborted, describe(), " was aborted");
  StreamSubmission submission;
  std::vector<OpRequest> kept;
  std::remove_copy_if(ops.begin(), ops.end(), std::back_inserter(kept), droppedByNccl);
  if (kept.empty()) return submission;  // nothing reaches the stream
  for (const OpRequest& op : kept) {
    SHOAL_ASSIGN_OR_RETURN(bool capturing, cuda_->isCapturing(op.stream), describe());
    if (capturing)
      return invalidUsage(describe(), ": ", collKindName(op.shape.kind),
                          " on a stream that is being captured into a CUDA graph: Shoal does not "
                          "replay collectives in graphs yet (call it outside the capture)");
  }
  SHOAL_ASSIGN_OR_RETURN(StreamBridge::Staged staged, bridge_->stage(kept, rank_, nranks_), describe());
  auto held = std::make_shared<StreamBridge::Staged>(std::move(staged));
  StreamBridge::Staged& st = *held;
  submission.synchronous = bridge_->waitMode() == cuda::WaitMode::kSynchronous;
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
      // The device refused stream memory operations: synchronous from now on.
      return beginStreamOrdered(ops);
    }
    auto job = std::make_shared<Job>();
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
    {
      std::lock_guard<std::mutex> lock(jobsMutex_);
      inFlight_.push_back(job);
      anyInFlight_.store(true, std::memory_order_release);
    }
    submission.job = job;
  }
  submission.ops = std::move(kept);
  submission.staged = std::move(held);
  return submission;
}

Status Communicator::finishStreamOrdered(StreamSubmission& submission) {
  if (!submission.synchronous || !submission.job) return Status::ok();
  auto& staged = *static_cast<StreamBridge::Staged*>(submission.staged.get());
  Status st = waitFor(*submission.job);
  if (st.isOk()) st = bridge_->copyOut(staged, submission.ops);
  bridge_->release(staged);
  return st;
}

Status Communicator::submitStreamOrdered(std::span<const OpRequest> ops) {
  SHOAL_ASSIGN_OR_RETURN(StreamSubmission submission, beginStreamOrdered(ops));
  return finishStreamOrdered(submission);
}

Status Communicator::connectAhead(const std::vector<OpRequest>& ops) {
  UseGuard use(*this);
  for (const OpRequest& op : ops) {
    if (droppedByNccl(op)) continue;
    SHOAL_ASSIGN_OR_RETURN(std::shared_ptr<const PreparedPlan> prepared, planFor(placedShape(op), ops.size() > 1),
      describe(), ": ", collKindName(op.shape.kind));
    for (const auto& lane : prepared->plan->lanes)
      SHOAL_TRY(connectionTo(lane.peer, lane.channel, /*unlessWaiting=*/true).status());
  }
  return Status::ok();
}

Status Communicator::submit(std::span<const OpRequest> ops, bool wait) {
  UseGuard use(*this);
  if (wait && nothingInFlight()) {
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
  for (const auto& job : inFlight_)
    if (job->isDone() && !job->status().isOk()) setAsyncError(job->status());
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
  std::lock_guard<std::mutex> lock(failureMutex_);
  if (st.code() == Code::kAborted || failurePublished_) {
    setAsyncError(st);
    return st;
  }
  failurePublished_ = true;
  // Our own view first, so that ranks timing out at the same moment as we do
  // can read it: in every connection that has a side channel (same-host peers
  // read it even when the store is out of reach), then in the store; then
  // what the peers we depended on reported, if anything.
  // An abort (a watchdog on another thread) ends these waits at once: the
  // peers that abort too never publish a report.
  const Deadline reportDeadline = Deadline::afterMs(kFailureReportMs).cancelledBy(&abortFlag_);
  for (auto& [key, connection] : connections_) connection->publishFailure(st.message());
  (void)request_.store->set(failureKey(rank_), st.message(), reportDeadline);
  std::vector<int> upstreamPeers = job.waitingOn();
  if (job.failedPeer() >= 0 && st.code() == Code::kRemoteError) upstreamPeers = {job.failedPeer()};
  Deadline deadline = reportDeadline;
  std::string upstreamText;
  for (int peer : upstreamPeers) {
    if (peer == rank_) continue;
    std::string report = peerReportThroughConnections(peer, deadline);
    if (report.empty()) {
      auto upstream = request_.store->get({failureKey(peer)}, deadline);
      if (upstream.isOk()) report = upstream.value()[0];
    }
    if (!report.empty())
      upstreamText += str("; rank ", peer, " (host ", peers_[peer].hostname, ") had failed first: ", report);
  }
  if (!upstreamText.empty()) {
    st = Status(st.code(), st.message() + upstreamText);
    (void)request_.store->set(failureKey(rank_), st.message(), reportDeadline);
  }
  Engine::instance().retire(reinterpret_cast<uintptr_t>(this), st);
  connections_.clear();
  setAsyncError(st);
  return st;
}

// A same-host peer's failure report from a connection's side channel. The
// peer may fail a moment after us (both waiting on a third rank): wait for it
// until the deadline, but only on peers with a side channel.
std::string Communicator::peerReportThroughConnections(int peer, Deadline deadline) const {
  std::vector<Connection*> mine;
  for (const auto& [key, connection] : connections_)
    if (key.first == peer && connection->carriesFailureReports()) mine.push_back(connection.get());
  if (mine.empty()) return {};
  Backoff backoff;
  while (true) {
    for (Connection* c : mine)
      if (std::string report = c->peerFailure(); !report.empty()) return report;
    if (deadline.expired()) return {};
    backoff.pause();
  }
}

std::string Communicator::failureKey(int rank) const { return bootstrap_->failureKey(rank); }

Result<JobPtr> Communicator::enqueue(std::span<const OpRequest> ops, bool detached) {
  UseGuard use(*this);
  auto job = std::make_shared<Job>();
  SHOAL_ASSIGN_OR_RETURN(bool any, prepareJob(*job, ops, detached));
  if (!any) return JobPtr();
  Engine::instance().submit(job);
  if (detached) {
    std::lock_guard<std::mutex> lock(jobsMutex_);
    inFlight_.push_back(job);
    anyInFlight_.store(true, std::memory_order_release);
  }
  return job;
}

Result<bool> Communicator::prepareJob(Job& job, std::span<const OpRequest> ops, bool detached) {
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
    return prepareJob(job, kept, detached);
  }

  // A reused job (a blocking call's) that repeats its last single operation
  // keeps its plan and its lanes' connections (connections are only ever
  // added while the communicator is usable): no cache lookup, no
  // reference-count traffic, no connection lookups.
  const bool samePlan = ops.size() == 1 && job.prepared && job.prepared->plan->shapes.size() == 1 &&
                        sameButPlacement(job.prepared->plan->shapes[0], ops[0].shape) &&
                        job.prepared->plan->shapes[0].disjointBuffers == disjointBuffers(ops[0]);
  job.opTags.resize(ops.size());
  job.opScalars.resize(ops.size());
  if (samePlan) {
    job.opTags[0] = withSeq(job.opTags[0], nextSeq(ops[0].shape));  // same shape, same other bits
    job.opScalars[0] = ops[0].scalar;
  } else {
    std::vector<std::shared_ptr<const PreparedPlan>> parts;
    std::shared_ptr<const PreparedPlan> prepared;
    for (size_t k = 0; k < ops.size(); ++k) {
      const OpRequest& op = ops[k];
      SHOAL_ASSIGN_OR_RETURN(prepared, planFor(placedShape(op), ops.size() > 1),
        describe(), ": ", collKindName(op.shape.kind));
      if (ops.size() > 1) parts.push_back(prepared);
      job.opTags[k] = tagFor(op.shape);
      job.opScalars[k] = op.scalar;
    }
    if (parts.size() > 1) prepared = mergedPlanFor(std::move(parts));
    job.prepared = std::move(prepared);
  }
  const Plan& plan = *job.prepared->plan;
  job.sameConnections = samePlan && job.laneConnections.size() == plan.lanes.size();
  if (!job.sameConnections) {
    if (Status st = ensureConnections(plan, job.laneConnections); !st.isOk()) {
      job.laneConnections.clear();  // so that the next call of this shape connects again
      return st;
    }
  }

  uint8_t* scratch = nullptr;
  if (plan.scratchBytes > 0) {
    if (wait) {
      if (scratch_.size() < plan.scratchBytes) scratch_.resize(plan.scratchBytes);
      scratch = scratch_.data();
    } else {
      job.ownedScratch.resize(plan.scratchBytes);  // lives as long as the job
      scratch = job.ownedScratch.data();
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
  job.detached = !wait;
  if (!label_) label_ = std::make_shared<const std::string>(describe());
  if (job.commLabel != label_) job.commLabel = label_;
  job.kind = ops[0].shape.kind;
  job.groupedOps = ops.size();
  job.sequence = job.opTags[0] & 0xffffffffffffull;
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

Code Communicator::asyncState() {
  Code init = initState_.load();
  if (init != Code::kOk) return init;
  if (Status e = asyncError(); !e.isOk()) return e.code();
  std::lock_guard<std::mutex> lock(jobsMutex_);
  if (inFlight_.empty()) return Code::kOk;
  Engine::instance().poll();  // polling drives completion, as in NCCL
  dropFinishedDetachedLocked();
  if (Status e = asyncError(); !e.isOk()) return e.code();
  // Work in a CUDA stream's order is the stream's to finish, as in NCCL:
  // only the rest is still in progress.
  bool inProgress = std::any_of(inFlight_.begin(), inFlight_.end(),
                                [](const JobPtr& j) { return j->streamDone == nullptr; });
  return inProgress ? Code::kInProgress : Code::kOk;
}

Status Communicator::asyncError() const {
  std::lock_guard<std::mutex> lock(asyncMutex_);
  return asyncError_;
}

void Communicator::setAsyncError(const Status& status) {
  std::lock_guard<std::mutex> lock(asyncMutex_);
  if (!asyncError_.isOk() || status.isOk()) return;
  asyncError_ = status;
  failed_.store(true, std::memory_order_release);
}

void Communicator::abort() {
  abortFlag_.store(true);
  Engine::instance().retire(reinterpret_cast<uintptr_t>(this),
                            error(Code::kAborted, describe(), " was aborted"));
}

// The idle liveness check (Engine::watchIdle, SHOAL_IDLE_CHECK_MS), on the
// progress thread: only with no call of the user's inside (UseGuard) and no
// job of ours in the engine, so that the connections are nobody else's
// meanwhile (no new job can start while checking_ is up).
void Communicator::checkIdle() {
  if (aborted() || failed_.load(std::memory_order_acquire)) return;
  checking_.store(true);
  struct Lower {
    std::atomic<bool>& flag;
    ~Lower() { flag.store(false, std::memory_order_release); }
  } lower{checking_};
  if (users_.load() != 0) return;  // a call is using them: next round
  if (!Engine::instance().queueAtRest(reinterpret_cast<uintptr_t>(this))) return;  // the engine's
  for (const auto& [key, connection] : connections_) {
    if (key.first == rank_ || connection->pending() != 0) continue;
    Status lost = connection->checkAlive();
    if (lost.isOk()) continue;
    Status st(Code::kRemoteError, str(describe(), ": a peer was lost while no operation was in flight "
                                      "(idle check, SHOAL_IDLE_CHECK_MS): ", lost.message()));
    SHOAL_WARN(st.message());
    // Same-host peers read it through their connections' side channel (and
    // fail too, at their own next check), as after a failed operation.
    for (const auto& [k, c] : connections_) c->publishFailure(st.message());
    setAsyncError(st);
    return;
  }
}

Status Communicator::finalize() {
  Deadline deadline = Deadline::never();  // each job has its own no-progress deadline
  return waitIdle(deadline);
}

Result<std::shared_ptr<Communicator>> Communicator::split(int color, int key, const CommOptions& options,
                                                          const std::atomic<bool>* cancel) {
  Deadline deadline = Deadline::afterMs(params().initTimeoutMs).cancelledBy(cancel);
  static_assert(sizeof(int) == 4);
  SHOAL_ASSIGN_OR_RETURN(auto all, bootstrap_->allGather(str(color, ' ', key), deadline),
      describe(), ": split");
  uint64_t splitIndex = nextSeq(CollShape{});  // every parent rank splits in the same order
  if (color < 0) return std::shared_ptr<Communicator>();
  std::vector<std::pair<int, int>> members;  // (key, parent rank)
  for (int r = 0; r < nranks_; ++r) {
    int c = 0, k = 0;
    if (std::sscanf(all[r].c_str(), "%d %d", &c, &k) != 2)
      return internalError("malformed split record from rank ", r);
    if (c == color) members.emplace_back(k, r);
  }
  std::sort(members.begin(), members.end());
  int newRank = static_cast<int>(
      std::find(members.begin(), members.end(), std::make_pair(key, rank_)) - members.begin());
  InitRequest req;
  req.store = request_.store;
  req.scope = str(request_.scope, "/split", splitIndex, "/color", color);
  req.secret = request_.secret;
  req.rank = newRank;
  req.nranks = static_cast<int>(members.size());
  req.options = options;
  req.cancel = cancel;
  auto child = std::make_shared<Communicator>(std::move(req));
  SHOAL_TRY(child->initialize()) << describe() << ": split color " << color;
  return child;
}

int Communicator::createRedOp(const CustomRedOp& op) {
  std::lock_guard<std::mutex> lock(redOpMutex_);
  for (size_t i = 0; i < redOps_.size(); ++i)
    if (!redOpLive_[i]) {
      redOps_[i] = op;
      redOpLive_[i] = true;
      return 5 + static_cast<int>(i);
    }
  redOps_.push_back(op);
  redOpLive_.push_back(true);
  return 5 + static_cast<int>(redOps_.size() - 1);
}

Result<CustomRedOp> Communicator::findRedOp(int id) const {
  std::lock_guard<std::mutex> lock(redOpMutex_);
  size_t i = static_cast<size_t>(id - 5);
  if (id < 5 || i >= redOps_.size() || !redOpLive_[i])
    return invalidArgument("reduction operator ", id, " was not created on this communicator");
  return redOps_[i];
}

Status Communicator::destroyRedOp(int id) {
  std::lock_guard<std::mutex> lock(redOpMutex_);
  size_t i = static_cast<size_t>(id - 5);
  if (id < 5 || i >= redOps_.size() || !redOpLive_[i])
    return invalidArgument("ncclRedOpDestroy: operator ", id,
                           " is not a live user-created operator of this communicator");
  redOpLive_[i] = false;
  return Status::ok();
}

Result<double> Communicator::estimateUs(const CollShape& shape) const {
  return tuner_->estimateUs(shape, rankView_);
}

std::string Communicator::dumpState() {
  std::string out = describe() + "\n";
  out += str("  collectives issued: ", collSeq_.load(std::memory_order_relaxed), "\n  connections: ",
             connections_.size(), "\n");
  for (const auto& [key, conn] : connections_)
    out += str("    ", conn->peerDescription(), " channel ", key.second, ": ", conn->pending(),
               " pending\n");
  Status e = asyncError();
  out += str("  async error: ", e.isOk() ? std::string("none") : e.toString(), "\n");
  std::string report = hangReport("request", nullptr);
  if (!params().reportDir.empty()) hang::publish(report, reportStem());
  return out + "  report: " + report + "\n";
}

namespace {
int64_t wallClockMs() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}
}  // namespace

std::string Communicator::reportStem() const {
  const std::string id = idHex();
  return str(id, "-r", rank_, "-", ::getpid());
}

std::string Communicator::hangReport(std::string_view reason, const JobReport* known) {
  const uint64_t queue = reinterpret_cast<uintptr_t>(this);
  std::optional<JobReport> asked;
  size_t queued = 0;
  if (!known) {
    // The engine's list lock is not taken on the deadline's path (the job's
    // thread may hold its job's lock there).
    queued = Engine::instance().queuedJobs(queue);
    if (queued > 0 || runningInline_.load(std::memory_order_acquire)) {
      uint64_t epoch = Engine::instance().requestReports();
      asked = Engine::instance().takeReport(queue, epoch, Deadline::afterMs(1000));
      if (asked) known = &*asked;
    }
  }
  const std::string id = idHex();
  Status e = asyncError();
  std::string out = str("{\"shoal_report\": 1, \"reason\": ", hang::jsonString(reason), ", \"comm\": \"", id,
                        "\", \"rank\": ", rank_, ", \"nranks\": ", nranks_, ", \"host\": ",
                        hang::jsonString(rank_ < static_cast<int>(peers_.size()) ? peers_[rank_].hostname : ""),
                        ", \"pid\": ", ::getpid(), ", \"unix_ms\": ", wallClockMs(),
                        ", \"collectives_issued\": ", collSeq_.load(std::memory_order_relaxed),
                        ", \"jobs_queued\": ", queued, ", \"error\": ",
                        e.isOk() ? std::string("null") : hang::jsonString(e.toString()), ", \"in_flight\": ");
  if (!known) return out + "null}";
  out += str("{\"what\": ", hang::jsonString(known->what), ", \"sequence\": ", known->sequence,
             ", \"steps_done\": ", known->stepsDone, ", \"steps_total\": ", known->stepsTotal,
             ", \"idle_ms\": ", known->idleMs, ", \"waiting_on\": [");
  for (size_t i = 0; i < known->waitingOn.size(); ++i) out += str(i ? ", " : "", known->waitingOn[i]);
  out += "], \"peers\": [";
  for (size_t i = 0; i < known->peers.size(); ++i) {
    const JobReport::Peer& p = known->peers[i];
    out += str(i ? ", " : "", "{\"rank\": ", p.rank, ", \"send_posted\": ", p.sendPosted, ", \"send_done\": ",
               p.sendDone, ", \"recv_posted\": ", p.recvPosted, ", \"recv_done\": ", p.recvDone, "}");
  }
  return out + "]}}";
}

void Communicator::publishReport(std::string_view reason, const JobReport* known) {
  hang::publish(hangReport(reason, known), reportStem());
}

}  // namespace shoal
