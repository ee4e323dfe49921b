// Communicator: set-up and agreement, split, state, abort, the idle check,
// reduction operators and diagnostics. Jobs: communicator_jobs.cc.
#include "comm/communicator.h"
#include "comm/stream_plan.h"

#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <optional>
#include <utility>

#include "comm/deferred_release.h"
#include "comm/device_steps.h"
#include "comm/hang_report.h"
#include "comm/init_agreement.h"
#include "comm/stream_bridge.h"
#include "comm/window.h"
#include "comm/window_board.h"
#include "cuda/device_reducer.h"
#include "core/clock.h"
#include "core/log.h"
#include "core/params.h"
#include "core/process.h"
#include "transports/registry.h"

namespace shoal {
namespace {

uint64_t hash64(std::string_view s) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

uint64_t mix64(uint64_t z) {  // splitmix64's finalizer
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

Communicator::Communicator(InitRequest request)
    : rank_(request.rank),
      nranks_(request.nranks),
      options_(request.options),
      request_(std::move(request)),
      commId_(hash64(request_.scope)),
      connections_(commId_.load(), rank_, peers_, request_.secret, abortFlag_),
      redOps_(commId_.load() ^ (static_cast<uint64_t>(rank_) << 32)),
      windows_(Windows::make()) {}

namespace {
// How long a communicator's end waits for its streams to pass the staging
// before leaving it to comm/deferred_release.h.
constexpr int64_t kTeardownGraceMs = 200;
}  // namespace

Communicator::~Communicator() {
  // Teardown may run on any thread (a watchdog's abort, the last job's
  // release), with another context current or none: what it frees is this
  // rank's context's.
  cuda::ContextScope scope(cuda_, cudaContext());
  if (idleWatched_) Engine::instance().unwatchIdle(this);  // first: a check may be running
  detachCaptures();  // a graph launched later replays nothing of this communicator's
  hang::untrack(this);
  Engine::instance().retire(reinterpret_cast<uintptr_t>(this),
                            error(Code::kAborted, "communicator destroyed"));
  forgetRank(commId_.load(std::memory_order_relaxed), rank_);  // what peers sent for connections it never made
  if (!scratch_.empty()) forgetMemory(scratch_.data(), scratch_.size());  // freed with this
  // What a stream may still use goes once the streams have passed it: the
  // stream plans' lanes (retire released their links), the connections
  // (their rings; cuda_ipc waits for its copies), then what their copies may
  // have used: scratch, windows, the staging, the boards. A stream held back
  // by the user's own work ahead of our operations leaves it all to be
  // freed off this thread once it has passed (comm/deferred_release.h): a
  // watchdog aborting communicators one after the other does not wait for
  // each.
  Deadline grace = Deadline::afterMs(kTeardownGraceMs);
  Backoff backoff;
  bool passed = streamsPassed();
  while (!passed && !grace.expired()) {
    backoff.pause();
    passed = streamsPassed();
  }
  if (!passed) {
    leaveToStreams();
    return;
  }
  const bool settled = settleStreamPlans(0);
  connections_.clear();
  deviceSteps_.reset();
  std::vector<std::unique_ptr<Window>> windows = windows_->takeAll();
  // A stream that held a plan past a failure may read the peers' windows:
  // kept mapped.
  if (settled) releaseWindows(windows);
  else new std::vector<std::unique_ptr<Window>>(std::move(windows));
  // The staging and the boards while the context is current (as the
  // members' own destruction would order them).
  bridge_.reset();
  boards_.reset();
}

bool Communicator::streamsPassed() {
  return (!streamPlans_ || streamPlans_->settle(0)) && (!bridge_ || bridge_->passed());
}

void Communicator::leaveToStreams() {
  // Everything a stream may touch, freed in the destructor's order once the
  // streams have passed it, or left allocated if they never do.
  struct Remains {
    std::unique_ptr<StreamPlans> plans;
    std::vector<std::unique_ptr<Connection>> connections;
    std::shared_ptr<DevicePlanSteps> deviceSteps, streamPlanScratch;
    std::vector<std::unique_ptr<Window>> windows;
    bool keepWindows = false;  // a stream held a plan past a failure before
    std::unique_ptr<StreamBridge> bridge;
    std::shared_ptr<WindowBoards> boards;
    bool freed = false;
    ~Remains() {
      if (freed) return;
      (void)plans.release();
      for (auto& c : connections) (void)c.release();
      for (auto& w : windows) (void)w.release();
      (void)bridge.release();
      new std::shared_ptr<DevicePlanSteps>(std::move(deviceSteps));
      new std::shared_ptr<DevicePlanSteps>(std::move(streamPlanScratch));
      new std::shared_ptr<WindowBoards>(std::move(boards));
    }
  };
  // Only stream plans' lanes use the connections (their rings): without
  // them the connections close now, so that peers waiting on this rank
  // learn of it at their next look.
  if (!streamPlans_ || streamPlans_->settle(0)) connections_.clear();
  auto remains = std::make_shared<Remains>();
  remains->plans = std::move(streamPlans_);
  remains->connections = connections_.take();
  remains->deviceSteps = std::move(deviceSteps_);
  remains->streamPlanScratch = std::move(streamPlanScratch_);
  remains->windows = windows_->takeAll();
  remains->keepWindows = streamsUnsettled_;
  remains->bridge = std::move(bridge_);
  remains->boards = std::move(boards_);
  Remains* watched = remains.get();  // freed only by `free`, after the last look
  cuda::Driver* driver = cuda_;
  const cuda::ContextHandle context = cudaContext();
  deferred::release(
      describe() + ": what its streams may still use (stream plans' lanes and rings, scratch, windows, staging)",
      [watched] {
        return (!watched->plans || watched->plans->settle(0)) && (!watched->bridge || watched->bridge->passed());
      },
      [remains, driver, context]() mutable {
        cuda::ContextScope scope(driver, context);
        remains->plans.reset();
        remains->connections.clear();
        remains->deviceSteps.reset();
        remains->streamPlanScratch.reset();
        for (auto& w : remains->windows) {
          if (remains->keepWindows) (void)w.release();  // a stream that never passed may read them
          else w->release(driver);
        }
        remains->windows.clear();
        remains->bridge.reset();
        remains->boards.reset();
        remains->freed = true;
        remains.reset();
      },
      std::max<int64_t>(params().progressTimeoutMs, 1000));
}

bool Communicator::settleStreamPlans(int64_t waitMs) {
  if (!streamPlans_) return !streamsUnsettled_;
  // A stream still holding a plan (the user's own work ahead of it) keeps
  // the rings it may touch, and the scratch and boards (which StreamPlans
  // keeps then).
  const bool settled = streamPlans_->settle(waitMs);
  if (!settled) {
    connections_.abandon();
    streamsUnsettled_ = true;  // for good: the windows they may read stay mapped
  }
  streamPlans_.reset();
  streamPlanScratch_.reset();  // kept by streamPlans_ where a stream may still use it
  boardsHeld_ = false;
  return settled;
}

std::string Communicator::idHex() const { return hex64(commId_.load(std::memory_order_relaxed)); }

std::string Communicator::describe() const {
  const std::string id = idHex();
  std::string host = rank_ < static_cast<int>(peers_.size()) ? peers_[rank_].hostname : "";
  return str("comm ", id, " rank ", rank_, "/", nranks_, host.empty() ? "" : " (host " + host + ")");
}

Status Communicator::initialize() {
  Status done = setUp();
  // A rank whose set-up failed will not take part again: the ranks waiting
  // for it in the store are told now, not at their deadline.
  if (!done.isOk() && bootstrap_) {
    std::string_view why = done.message();
    if (const std::string self = describe() + ": "; why.starts_with(self)) why.remove_prefix(self.size());
    bootstrap_->abandon(str(processLabel(), ": its init failed: ", why));
  }
  return done;
}

std::string Communicator::processLabel() const {
  return str("comm ", idHex(), " rank ", rank_, "/", nranks_, " (host ", localHostname(), ", pid ", ::getpid(), ")");
}

Status Communicator::setUp() {
  setLogRank(rank_);
  // The flag is the caller's: it is not kept past this call.
  const std::atomic<bool>* cancel = std::exchange(request_.cancel, nullptr);
  Deadline deadline = Deadline::afterMs(params().initTimeoutMs).cancelledBy(cancel);
  bootstrap_ = std::make_unique<Bootstrap>(request_.store, request_.scope, rank_, nranks_);
  if (request_.sharedScope) bootstrap_->setSharedScope();

  PeerInfo self;
  self.rank = rank_;
  self.hostname = localHostname();
  self.hostId = localHostId();
  self.processId = localProcessId();
  self.kernelId = localKernelId();
  uint64_t nonce = 0;
  if (getrandom(&nonce, sizeof(nonce), 0) != sizeof(nonce)) nonce = static_cast<uint64_t>(nowNs()) ^ self.processId;
  // If this process ends without destroying the communicator, the root says
  // so in its name to the peers that wait for it: in the check-in (the first
  // exchange, after the CUDA and transport set-up, which may take seconds),
  // the rest of the set-up, splits and operations. Only an aid to finding a
  // dead rank sooner: without it the set-up goes on.
  if (Status willed = bootstrap_->setWill(str(processLabel(),
                                              ": its process ended (its connection to the bootstrap root "
                                              "closed) before it destroyed the communicator"),
                                          nonce, deadline);
      !willed.isOk())
    SHOAL_WARN(describe(), ": ", willed.message(), "; its peers will find its death only by their connections");
  SHOAL_TRY(findCudaDevice(self));
  SHOAL_TRY(publishAddresses(self, transportChoice(false))) << describe();
  SHOAL_ASSIGN_OR_RETURN(peers_, exchangePeers(self, nonce, deadline));
  topology_ = buildTopology(peers_);
  SHOAL_TRY(checkSharedGpus());
  chooseWaitSpin(self);

  // Ranks choose plans independently, so what the tuner and the plans see
  // must be the same on every rank, yet part of it is known only locally
  // (comm/init_agreement.h): one exchange pools it.
  SHOAL_ASSIGN_OR_RETURN(InitProposal mine, proposal(self));
  SHOAL_ASSIGN_OR_RETURN(auto answers, bootstrap_->allGather(encodeInitProposal(mine), deadline),
      describe(), ": agreeing on peer reads, transports and machine facts");
  std::vector<InitProposal> proposals(static_cast<size_t>(nranks_));
  for (int r = 0; r < nranks_; ++r) {
    SHOAL_ASSIGN_OR_RETURN(proposals[r], decodeInitProposal(answers[r]), describe(), ": from rank ", r);
  }
  SHOAL_ASSIGN_OR_RETURN(InitAgreement agreement, agree(proposals), describe());
  if (agreement.rankWithFewQueues >= 0)
    windowsStaged_ = str("rank ", agreement.rankWithFewQueues, "'s CUDA_DEVICE_MAX_CONNECTIONS is below 4");
  else if (agreement.rankSynchronous >= 0)
    windowsStaged_ = str("rank ", agreement.rankSynchronous, "'s streams are synchronous");
  // ncclConfig_t.netName, unless NCCL_NET overrides it (as in NCCL). A name
  // Shoal has no network for is said now and refused where a peer on another
  // host is connected: a variable set for a whole cluster ("IB") must not
  // fail the jobs of one host.
  const TransportChoice choice = transportChoice(agreement.deviceDirect);
  if (Result<std::string> net = networkTransport(choice); !net.isOk() && rank_ == 0)
    SHOAL_WARN(describe(), ": ", net.status().message(), "; connections to other hosts will fail");
  connections_.setChoice(choice);
  connections_.setStreamLinks(agreement.streamLinks);
  connections_.setLabel(describe());
  // A peer's failure report (final or draft), else its will (its process
  // ended: the root wrote it), else its leave record: a rank that destroyed
  // or aborted its communicator will not connect, nor take part again, and
  // its connections may not say so (ofi's say nothing).
  connections_.setPeerReports([this](int peer, Deadline deadline) {
    ConnectionTable::PeerNews news;
    Result<std::optional<Store::Found>> found = request_.store->firstPresent(
        {failureKey(peer), bootstrap_->failureDraftKey(peer), bootstrap_->goneKey(peer), bootstrap_->leftKey(peer)},
        deadline);
    news.unreadable = !found.isOk();
    if (!found.isOk() || !found.value()) return news;
    const size_t index = found.value()->index;
    if (index <= 1) {
      news.report = std::move(found.value()->value);  // final or draft
    } else if (index == 2) {
      news.gone = std::move(found.value()->value);
    } else {
      news.left = true;
    }
    return news;
  });
  // A peer gone, for the idle check of connections that do not notice it:
  // the mark (one key while nobody is gone) names the first rank gone, whose
  // will is then read, unless it left (a leave whose will's cancel was lost
  // is no death). An error: the store could not be asked.
  using MaybeGone = std::optional<ConnectionTable::GoneRank>;
  connections_.setGoneLookup([this](Deadline deadline) -> Result<MaybeGone> {
    Result<std::optional<Store::Found>> mark = request_.store->firstPresent({bootstrap_->someGoneKey()}, deadline);
    if (!mark.isOk()) return mark.takeStatus();
    if (!mark.value()) return MaybeGone();
    int gone = -1;
    const std::string& named = mark.value()->value;
    if (std::from_chars(named.data(), named.data() + named.size(), gone).ec != std::errc() || gone < 0 ||
        gone >= nranks_ || gone == rank_)
      return MaybeGone();
    Result<std::optional<Store::Found>> found =
        request_.store->firstPresent({bootstrap_->leftKey(gone), bootstrap_->goneKey(gone)}, deadline);
    if (!found.isOk()) return found.takeStatus();
    if (!found.value() || found.value()->index == 0) return MaybeGone();
    return MaybeGone(ConnectionTable::GoneRank{gone, std::move(found.value()->value)});
  });
  connections_.setConnectTimeout([this](const ConnectionTable::PendingConnect& pending) {
    JobReport report = reportOfConnect(pending);
    publishReport("deadline", &report);
  });
  if (!self.gpu.empty()) {
    if (agreement.deviceDirect)
      SHOAL_INFO(subsys::kInit, describe(), ": device-direct: device buffers move GPU to GPU",
                 agreement.noStreamLinks.empty() ? std::string()
                                                 : str("; no stream links, so device plans (", agreement.noStreamLinks, ")"));
    else
      SHOAL_INFO(subsys::kInit, describe(), ": device buffers are staged through pinned host memory",
                 agreement.notDeviceDirect.empty() ? std::string() : str(" (", agreement.notDeviceDirect, ")"));
  }

  RankView view;
  view.rank = rank_;
  view.nranks = nranks_;
  view.ring = topology_.ring;
  view.nodeOf = topology_.nodeOfRank;
  view.peerReads = agreement.everyoneReadsPeers;
  const bool singleProcess = std::all_of(peers_.begin(), peers_.end(), [&](const PeerInfo& p) {
    return p.sameProcess(self);
  });
  // Fixed pairs with everyone's PeerInfo: every rank gets the same summary.
  auto classify = [&](int a, int b) {
    Result<Transport*> t = selectTransport(peers_[a], peers_[b], choice);
    return t.isOk() ? t.value()->linkClass() : LinkClass::kNet;
  };
  MachineTopology machine = agreement.machine;
  machine.nics = localMachine().nics;  // described in the log, not modelled
  machine.source = localMachine().source;
  TopologySummary summary = summarizeTopology(topology_, classify, singleProcess, std::move(machine));
  if (agreement.netLink) {
    summary.netTransport = agreement.netLink->transport;
    summary.netCpuCopies = agreement.netLink->cpuCopiesBytes;
    summary.netEmulatedOverSockets = agreement.netLink->emulatesMessagesOverSockets;
  }
  SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<Tuner> tuner,
      Tuner::create(summary, options_.minChannels, options_.maxChannels), describe());
  plans_ = std::make_unique<PlanCache>(std::move(tuner), std::move(view));
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

Result<std::vector<PeerInfo>> Communicator::exchangePeers(const PeerInfo& self, uint64_t nonce, Deadline deadline) {
  auto sameSize = [&](int r, const PeerRecord& record) -> Status {
    if (record.nranks == nranks_) return Status::ok();
    return invalidUsage("rank ", r, " was initialized with nranks=", record.nranks, " but rank ", rank_,
                        " with nranks=", nranks_);
  };
  // A rank still waiting for others learns of a wrong size from rank 0's
  // record, or from a rank that read them all (publishRoundFailure).
  auto checkFirst = [&](std::string_view rankZero) -> Status {
    Result<PeerRecord> record = decodePeerRecord(std::string(rankZero));
    return record.isOk() ? sameSize(0, record.value()) : Status::ok();
  };
  SHOAL_ASSIGN_OR_RETURN(auto all,
      bootstrap_->allGather(encodePeerRecord(PeerRecord{nranks_, self, nonce}), deadline, checkFirst),
      describe(), ": bootstrap through ", request_.store->describe());
  std::vector<PeerInfo> peers(static_cast<size_t>(nranks_));
  std::vector<uint64_t> nonces(static_cast<size_t>(nranks_));
  for (int r = 0; r < nranks_; ++r) {
    SHOAL_ASSIGN_OR_RETURN(PeerRecord record, decodePeerRecord(all[r]), describe(), ": peer info of rank ", r);
    // (Two processes claiming one rank are found by allGather: the later
    // record replaces the earlier one under the rank's key.)
    if (Status wrong = sameSize(r, record); !wrong.isOk()) {
      bootstrap_->publishRoundFailure(wrong);
      return StatusBuilder(std::move(wrong)) << describe();
    }
    peers[r] = std::move(record.info);
    nonces[r] = record.nonce;
  }
  if (Status s = bootstrap_->setGeneration(std::move(nonces), deadline); !s.isOk())
    SHOAL_WARN(describe(), ": ", s.message(), "; its peers will find its death only by their connections");
  if (request_.sharedScope) {
    // Every communicator made from NCCL_COMM_ID has this scope: its
    // generation tells this one's connections and windows from another's.
    commId_.store(hash64(str(request_.scope, "/g", hex64(bootstrap_->generation()))), std::memory_order_relaxed);
    connections_.setCommId(commId_.load(std::memory_order_relaxed));
  }
  return peers;
}

// What this rank proposes (comm/init_agreement.h): whether it reads every
// other process's memory, the first node leader's network link, and its
// machine facts.
Result<InitProposal> Communicator::proposal(const PeerInfo& self) const {
  InitProposal p;
  for (int r = 0; r < nranks_ && p.readsEveryPeer; ++r) {
    if (r == rank_ || peers_[r].sameProcess(self)) continue;
    auto chosen = selectTransport(self, peers_[r], transportChoice(false));
    p.readsEveryPeer = chosen.isOk() && chosen.value()->readsPeerMemory(peers_[r]);
  }
  p.streamPlans = cuda_ != nullptr && !self.gpu.empty() && cuda_->streamPlansWanted(self.gpu);
  if (p.streamPlans) {
    if (std::string whyNot = whyNoStreamLinks(self); !whyNot.empty()) {
      p.streamPlans = false;
      SHOAL_INFO(subsys::kInit, describe(), ": no stream plans: ", whyNot);
    }
  }
  p.fewHardwareQueues = cuda_ != nullptr && cuda::Driver::fewHardwareQueues();  // the process's setting
  p.synchronousStreams =
      cuda_ != nullptr && !self.gpu.empty() && cuda_->waitModeOf(self.gpu) == cuda::WaitMode::kSynchronous;
  std::string whyNot = whyNotDeviceDirect(self);
  p.deviceDirect = whyNot.empty();
  if (!p.deviceDirect && !self.gpu.empty())
    SHOAL_INFO(subsys::kInit, describe(), ": device buffers cannot go GPU to GPU: ", whyNot);
  if (topology_.leaders.size() > 1 && rank_ == topology_.leaders[0]) {
    // Device-direct needs every pair to move device memory, which no network
    // transport does: a communicator with a network link is never device-direct.
    if (Result<Transport*> t = selectTransport(self, peers_[topology_.leaders[1]], transportChoice(false)); t.isOk())
      p.netLink = NetLink{std::string(t.value()->name()), t.value()->cpuCopiesBytes(),
                          t.value()->emulatesMessagesOverSockets()};
  }
  p.machine = localMachine();
  return p;
}

// Why this rank's peers rule out stream links ("" when they do not); such
// a rank proposes no stream plans, and every rank then runs device plans.
// - Some peers are threads of this process and others other processes:
//   lanes to the others would have stream links (cuda_ipc) and lanes to
//   these none, so ranks whose plans differ in that would run stream plans
//   on some ranks and device plans on others, whose messages never meet.
// - A thread of this process on a GPU this one's copies cannot reach: the
//   loopback stream ring's FIFOs live on one of the two.
// - A thread of this process on this GPU (unless SHOAL_CUDA_STREAM_PLANS=1):
//   both ranks' streams, each waiting on words the other's write, share one
//   context's hardware queues (CUDA_DEVICE_MAX_CONNECTIONS), where a wait
//   holds back whatever queues behind it.
std::string Communicator::whyNoStreamLinks(const PeerInfo& self) const {
  bool threads = false, processes = false;
  for (const PeerInfo& p : peers_) {
    if (!p.sameProcess(self)) processes = true;
    else if (p.rank != rank_) threads = true;
  }
  if (threads && processes) return "its peers are both threads of its process and other processes";
  for (const PeerInfo& p : peers_) {
    if (p.rank == rank_ || !p.sameProcess(self)) continue;
    if (p.gpu != self.gpu && !cuda_->gpusShareMemory(self.gpu, p.gpu))
      return str("rank ", p.rank, ", a thread of its process, is on a GPU without peer access to its own");
  }
  if (int thread = threadOnOwnGpu(self); thread >= 0)
    return str("rank ", thread, ", a thread of its process, shares its GPU (and its hardware queues; "
               "SHOAL_CUDA_STREAM_PLANS=1 overrides)");
  return "";
}

// Why this rank cannot move device buffers GPU to GPU to every peer ("" when
// it can): it needs a GPU whose streams are not synchronous (such a rank
// stages every call, and staged host memory goes better over shm than
// through cuda_ipc's FIFOs), every peer reached by a
// transport that moves device memory (cuda_ipc, loopback), and its
// reduction kernels (loaded now: a device-direct communicator runs its
// reductions with them, and a load that fails must keep every rank on the
// staged path, not fail calls).
std::string Communicator::whyNotDeviceDirect(const PeerInfo& self) const {
  if (cuda_ == nullptr || self.gpu.empty()) return "no CUDA device";
  if (nranks_ < 2) return "a single rank";
  if (cuda_->waitModeOf(self.gpu) == cuda::WaitMode::kSynchronous)
    return "its streams are synchronous (SHOAL_CUDA_WAIT, or the device runs neither stream memory operations nor "
           "the wait kernel)";
  // cuda_ipc moves even staged messages by copies on streams of its own,
  // which would queue behind the user's stream waiting for them.
  if (cuda::Driver::fewHardwareQueues()) return "CUDA_DEVICE_MAX_CONNECTIONS is below 4";
  for (int r = 0; r < nranks_; ++r) {
    if (r == rank_) continue;
    Result<Transport*> t = selectTransport(self, peers_[r], transportChoice(true));
    if (!t.isOk()) return t.status().message();
    if (!t.value()->movesDeviceMemory())
      return str("rank ", r, " (host ", peers_[r].hostname, ") is reached over ", t.value()->name(),
                 ", which moves only host memory");
  }
  if (Result<const cuda::DeviceReducer*> kernels = cuda::DeviceReducer::forCurrentContext(*cuda_); !kernels.isOk())
    return str("the reduction kernels did not load: ", kernels.status().message());
  return "";
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
    SHOAL_ASSIGN_OR_RETURN(ownContext_, cuda_->currentContext(), describe(), ": the current CUDA context");
    cudaDevice_ = device->ordinal;
    self.gpu = device->uuidText();
    SHOAL_INFO(subsys::kInit, describe(), ": CUDA device ", cudaDevice_, " (", self.gpu, ")");
  } else {
    SHOAL_INFO(subsys::kInit, describe(), ": CUDA is in use but no context is current; "
               "device buffers use the context current at each call");
  }
  return Status::ok();
}

// Several ranks on one GPU (docs/cuda.md) are allowed by default, unlike NCCL
// 2.30 without NCCL_MULTI_RANK_GPU_ENABLE=1; an explicit 0 refuses them as
// NCCL does. Every rank looks at every pair, so all ranks fail alike and none
// waits for a peer that gave up.
Status Communicator::checkSharedGpus() const {
  bool logged = false;
  for (int a = 0; a < nranks_; ++a)
    for (int b = a + 1; b < nranks_; ++b) {
      if (peers_[a].gpu.empty() || peers_[a].gpu != peers_[b].gpu) continue;
      if (params().multiRankGpu == 0)
        return invalidUsage(describe(), ": ranks ", a, " and ", b, " use the same GPU (", peers_[a].gpu,
                            ") and NCCL_MULTI_RANK_GPU_ENABLE=0 refuses several ranks per GPU "
                            "(unset or 1 allows them)");
      if (!logged && (a == rank_ || b == rank_)) {
        SHOAL_INFO(subsys::kInit, describe(), ": ranks ", a, " and ", b, " use the same GPU (", peers_[a].gpu,
                   "); allowed (NCCL_MULTI_RANK_GPU_ENABLE=0 would refuse it)");
        logged = true;
      }
    }
  return Status::ok();
}

// Gives back what the windows imported, with the rank's GPU context current.
void Communicator::releaseWindows(std::vector<std::unique_ptr<Window>>& windows) {
  if (windows.empty()) return;
  {
    cuda::ContextScope scope(cuda_, cudaContext());
    for (auto& w : windows) w->release(cuda_);
  }
  windows.clear();
}

namespace {
// Ends a set-up turn when its work returns, whoever else holds the turn.
struct TurnDone {
  Turns::Turn& turn;
  ~TurnDone() { turn.done(); }
};
}  // namespace

// A set-up call's turn (takeSetupTurn), within the set-up deadline, ended by
// `cancel` (a split's child's abort; a window registration's, this
// communicator's abort: a split must still run after ncclCommRevoke, which
// aborts this communicator's operations). A call that gives up here never
// runs the exchange its peers run over this communicator's bootstrap, so
// this rank's later set-up calls would pair with the wrong exchanges of
// theirs: they fail instead, naming this one.
Status Communicator::waitForTurn(Turns::Turn& turn, const std::atomic<bool>* cancel, const char* what) {
  const Deadline deadline = Deadline::afterMs(params().initTimeoutMs).cancelledBy(cancel);
  Status waited = turn.wait(deadline, what);
  if (waited.isOk()) return waited;
  if (waited.code() == Code::kTimeout || waited.code() == Code::kAborted)
    turn.breakLater(str("an earlier set-up call gave up before its exchange (", waited.message(),
                        "): this rank's later splits and window registrations of the communicator would pair "
                        "with the wrong exchanges of its peers"));
  return StatusBuilder(std::move(waited)) << describe();
}

namespace {

// The ticket of a registration's board message, apart from its window's.
WindowMailbox::Ticket windowBoardTicket(WindowMailbox::Ticket ticket) {
  ticket.registration |= 1ull << 63;
  return ticket;
}
}  // namespace

Result<Window*> Communicator::registerWindow(void* buff, size_t bytes, int flags, SetupTurn turn) {
  if (!turn) turn = takeSetupTurn();
  const TurnDone turnDone{*turn};
  SHOAL_TRY(waitForTurn(*turn, &abortFlag_, "ncclCommWindowRegister"));
  const Deadline deadline = Deadline::afterMs(params().initTimeoutMs).cancelledBy(&abortFlag_);
  UseGuard use(*this);
  releaseRetiredWindows();
  const uint64_t registration = windowRegistrations_++;  // every rank registers in the same order
  const std::string what = str(describe(), ": ncclCommWindowRegister");
  auto window = std::make_unique<Window>(buff, bytes, flags, rank_, nranks_);
  // Every rank takes part in all three exchanges, whatever fails on its
  // side, so that all of them learn of it instead of waiting for it.
  net::Fd exported;  // this rank's allocation, sent to the peers' mailboxes
  Status failure;
  WindowRecord mine;
  std::optional<WindowMailbox> mailbox;
  if (Result<WindowRecord> described = Window::describe(cuda_, buff, bytes, exported); described.isOk())
    mine = described.value();
  else
    failure = described.takeStatus();
  if (cuda_ && failure.isOk() && params().winEnable != 0) {
    if (Result<WindowMailbox> opened = WindowMailbox::open(); opened.isOk()) {
      mailbox = std::move(opened).value();
      mine.mailbox = mailbox->name();
    } else {
      SHOAL_INFO(subsys::kReg, what, ": no mailbox (", opened.status().message(), "): peers map nothing of this rank's");
    }
    ensureWindowBoard();
  }
  mine.symmetric = (flags & kWindowSymmetric) != 0;
  mine.boardAddress = boards_ && params().winEnable != 0 ? boards_->address() : 0;
  SHOAL_ASSIGN_OR_RETURN(std::vector<std::string> encoded, bootstrap_->allGather(encodeWindowRecord(mine), deadline),
                         what);
  std::vector<WindowRecord> records(static_cast<size_t>(nranks_));
  for (int r = 0; r < nranks_ && failure.isOk(); ++r) {
    Result<WindowRecord> record = decodeWindowRecord(encoded[static_cast<size_t>(r)]);
    if (record.isOk()) records[static_cast<size_t>(r)] = std::move(record).value();
    else failure = StatusBuilder(record.takeStatus()) << "from rank " << r;
  }

  // This rank's allocation to each peer that maps by descriptor.
  WindowFlags sent;
  sent.flags.assign(static_cast<size_t>(nranks_), false);
  for (int q = 0; q < nranks_ && failure.isOk() && exported; ++q) {
    if (q == rank_ || !Window::sendsTo(mine, records[static_cast<size_t>(q)], peers_[rank_], peers_[q], cuda_))
      continue;
    const WindowMailbox::Ticket ticket{commId(), registration, rank_, q};
    // The peer's mailbox is open until the last exchange, which waits for
    // this rank: it answers at once unless the peer died.
    Status st = WindowMailbox::send(records[static_cast<size_t>(q)].mailbox, exported.get(), ticket, request_.secret,
                                    deadline.cappedMs(handshakeTimeoutMs()));
    // The board goes with each descriptor (a peer that maps this rank's
    // device memory meets its streams on it; it keeps the first it gets).
    if (st.isOk() && mine.boardAddress != 0)
      st = WindowMailbox::send(records[static_cast<size_t>(q)].mailbox, boards_->descriptor(), windowBoardTicket(ticket),
                               request_.secret, deadline.cappedMs(handshakeTimeoutMs()));
    if (st.isOk()) sent.flags[static_cast<size_t>(q)] = true;
    else SHOAL_INFO(subsys::kReg, what, ": rank ", q, " will not map this rank's buffer (", st.message(), ")");
  }
  if (!failure.isOk()) sent.error = failure.message();
  SHOAL_ASSIGN_OR_RETURN(std::vector<std::string> sentBy, bootstrap_->allGather(encodeWindowFlags(sent), deadline),
                         what);
  exported.reset();  // the peers' copies are in their mailboxes' queues

  // The descriptors sent to this rank (queued already), then the mappings.
  std::vector<net::Fd> descriptors(static_cast<size_t>(nranks_));
  std::vector<bool> expected(static_cast<size_t>(nranks_), false);
  for (int q = 0; q < nranks_ && failure.isOk(); ++q) {
    Result<WindowFlags> theirs = decodeWindowFlags(sentBy[static_cast<size_t>(q)]);
    if (!theirs.isOk()) failure = StatusBuilder(theirs.takeStatus()) << "from rank " << q;
    else if (!theirs->error.empty()) failure = Status(Code::kInvalidUsage, str("rank ", q, ": ", theirs->error));
    else expected[static_cast<size_t>(q)] = theirs->flags.size() == static_cast<size_t>(nranks_) &&
                                            theirs->flags[static_cast<size_t>(rank_)];
  }
  std::vector<net::Fd> boards(static_cast<size_t>(nranks_));
  if (failure.isOk() && mailbox) {
    // What the peers say they sent is queued in this mailbox already.
    const WindowMailbox::Ticket ticket{commId(), registration, 0, rank_};
    std::vector<bool> withBoard = expected;
    for (int q = 0; q < nranks_; ++q)
      withBoard[static_cast<size_t>(q)] =
          expected[static_cast<size_t>(q)] && records[static_cast<size_t>(q)].boardAddress != 0;
    Result<std::vector<std::vector<net::Fd>>> received =
        mailbox->receiveEach({{ticket, expected}, {windowBoardTicket(ticket), withBoard}}, request_.secret,
                             deadline.cappedMs(handshakeTimeoutMs()));
    if (received.isOk()) {
      descriptors = std::move(received.value()[0]);
      boards = std::move(received.value()[1]);
    } else {
      failure = received.takeStatus();
    }
  }
  cuda::ContextScope scope(cuda_, cudaContext());
  // Peers' device buffers are read by this rank's kernels: without them it
  // maps none, and every rank's calls on them take the other paths.
  const bool runsKernels = cuda_ != nullptr && cudaContext() != nullptr && scope.status().isOk() &&
                           cuda::DeviceReducer::forCurrentContext(*cuda_).isOk();
  if (!runsKernels && cuda_ != nullptr && records[static_cast<size_t>(rank_)].deviceMemory)
    SHOAL_INFO(subsys::kReg, describe(), ": window ", buff, ": no device reduction kernels here (see the INFO log), "
               "so no peer's device buffer is mapped and calls on it are not read in place");
  for (int r = 0; r < nranks_ && failure.isOk(); ++r) {
    // NCCL_WIN_ENABLE=0: registered, nothing of a peer mapped.
    if (r != rank_ && params().winEnable == 0) continue;
    window->map(r, records[static_cast<size_t>(r)], peers_[rank_], peers_[r], cuda_, runsKernels,
                std::move(descriptors[static_cast<size_t>(r)]));
  }
  // The peers' window boards, where this rank's streams meet theirs.
  const bool symmetricBoards = std::all_of(records.begin(), records.end(), [](const WindowRecord& record) {
    return record.symmetric && record.boardAddress != 0;
  });
  for (int q = 0; q < nranks_ && failure.isOk() && symmetricBoards; ++q) {
    const WindowRecord& theirs = records[static_cast<size_t>(q)];
    if (q == rank_ || window->buffer(q) == nullptr || !theirs.deviceMemory) continue;
    Status st;
    if (peers_[q].sameProcess(peers_[rank_])) st = boards_->adoptLocal(q, theirs.boardAddress);
    else if (boards[static_cast<size_t>(q)]) st = boards_->adopt(q, std::move(boards[static_cast<size_t>(q)]));
    // A device window of another process is mapped only from a descriptor,
    // and the board comes with every descriptor: one without the other is
    // this library's bug, refused here rather than met as a missing link at
    // the first call on the streams.
    else if (!boards_->has(q))
      st = internalError("rank ", q, "'s device window is mapped here without its window board");
    if (!st.isOk()) failure = std::move(st);
  }
  auto fail = [&](Status st) -> Status {
    window->release(cuda_);
    return StatusBuilder(std::move(st)) << what;
  };
  Result<std::vector<std::string>> maps =
      bootstrap_->allGather(encodeWindowFlags(window->mapsFlags(failure.isOk() ? "" : failure.message())), deadline);
  if (!maps.isOk()) return fail(maps.takeStatus());
  if (!failure.isOk()) return fail(failure);
  std::vector<WindowFlags> all;
  for (int r = 0; r < nranks_; ++r) {
    Result<WindowFlags> flagsOf = decodeWindowFlags(maps.value()[static_cast<size_t>(r)]);
    if (!flagsOf.isOk()) return fail(StatusBuilder(flagsOf.takeStatus()) << "from rank " << r);
    all.push_back(std::move(flagsOf).value());
  }
  if (Status st = window->learnMaps(all); !st.isOk()) return fail(st);
  // Every rank knows the same: whether its operations run on the streams.
  window->setRegistration(registration,
                          symmetricBoards && window->mappedEverywhere() && window->deviceEverywhere());
  SHOAL_INFO(subsys::kReg, describe(), ": window ", buff, " (", bytes, " bytes) registered; ",
             window->mappedEverywhere() ? "every rank maps every rank's buffer"
                                        : "some ranks' buffers are not mapped by others",
             window->onStreams() ? "; its operations run on the streams" : "",
             !windowsStaged_.empty() && window->deviceEverywhere()
                 ? str("; its operations are staged (", windowsStaged_, ")")
                 : std::string());
  Window* registered = window.get();
  windows_->add(std::move(window));
  return registered;
}

int Communicator::threadOnOwnGpu(const PeerInfo& self) const {
  if (params().cudaStreamPlans == "1") return -1;
  for (const PeerInfo& p : peers_)
    if (p.rank != rank_ && p.sameProcess(self) && p.gpu == self.gpu) return p.rank;
  return -1;
}

void Communicator::ensureWindowBoard() {
  if (boards_ || peers_[rank_].gpu.empty() || !cuda_->streamPlansWanted(peers_[rank_].gpu)) return;
  // Its streams would wait on words a thread's streams write through the
  // same context's hardware queues (whyNoStreamLinks): windows are then
  // stepped by the host on every rank (boards are needed everywhere).
  if (threadOnOwnGpu(peers_[rank_]) >= 0) return;
  Result<std::shared_ptr<WindowBoards>> made = [&] {
    cuda::ContextScope scope(cuda_, cudaContext());
    return WindowBoards::create(*cuda_, rank_, nranks_);
  }();
  if (made.isOk()) boards_ = std::move(made).value();
  else
    SHOAL_INFO(subsys::kReg, describe(), ": no window board (", made.status().message(),
               "): operations on its windows are stepped by the host");
}

Status Communicator::deregisterWindow(const void* handle) {
  UseGuard use(*this);
  if (!windows_->retire(handle))
    return invalidUsage(describe(), ": window ", handle,
                        " is not a live window of this communicator (deregistered already, or never registered on it)");
  releaseRetiredWindows();
  return Status::ok();
}

void Communicator::releaseRetiredWindows() {
  if (streamsUnsettled_) return;  // a stream still holding a plan may read any of them
  std::vector<std::unique_ptr<Window>> retired = windows_->takeRetired(windowOperationsThrough());
  releaseWindows(retired);
}

void Communicator::trackWindowOperation(const JobPtr& job) {
  {
    std::lock_guard<std::mutex> lock(jobsMutex_);
    windowJobs_.emplace_back(windows_->noteSubmitted(), job);
  }
  releaseRetiredWindows();  // also keeps windowJobs_ short
}

void Communicator::breakWindowBoards() {
  if (!boards_) return;
  for (int q = 0; q < nranks_; ++q)
    if (q != rank_ && boards_->link(q)) boards_->link(q)->release();
}

uint64_t Communicator::windowOperationsThrough() {
  std::lock_guard<std::mutex> lock(jobsMutex_);
  // Through: a stream plan once its streams have passed it (a failed one
  // too: released, they run on and read), which may be before or after its
  // job is done; a host-stepped one once done. They finish in order.
  while (!windowJobs_.empty()) {
    const JobPtr& job = windowJobs_.front().second;
    if (job->streamWatch ? !job->streamWatch->finished() : !job->isDone()) return windowJobs_.front().first - 1;
    windowJobs_.pop_front();
  }
  return ~0ull;
}

Window* Communicator::findWindow(const void* handle) { return windows_->find(handle); }

Result<std::shared_ptr<Communicator>> Communicator::split(int color, int key, const CommOptions& options,
                                                          const std::atomic<bool>* cancel, SetupTurn turn) {
  if (!turn) turn = takeSetupTurn();
  const TurnDone turnDone{*turn};
  SHOAL_TRY(waitForTurn(*turn, cancel, "ncclCommSplit"));
  // From its turn on: the earlier calls' time is theirs.
  Deadline deadline = Deadline::afterMs(params().initTimeoutMs).cancelledBy(cancel);
  SHOAL_ASSIGN_OR_RETURN(auto all, bootstrap_->allGather(encodeSplitRecord(SplitRecord{color, key}), deadline),
      describe(), ": split");
  const uint64_t splitIndex = splits_++;  // every parent rank splits in the same order
  // The exchange was its part of the parent's set-up: the child meets its
  // peers in a scope of its own, so the next call need not wait for it.
  turn->done();
  if (color < 0) return std::shared_ptr<Communicator>();
  std::vector<std::pair<int, int>> members;  // (key, parent rank)
  for (int r = 0; r < nranks_; ++r) {
    SHOAL_ASSIGN_OR_RETURN(SplitRecord record, decodeSplitRecord(all[r]), describe(), ": split, from rank ", r);
    if (record.color == color) members.emplace_back(record.key, r);
  }
  std::sort(members.begin(), members.end());
  int newRank = static_cast<int>(
      std::find(members.begin(), members.end(), std::make_pair(key, rank_)) - members.begin());
  InitRequest req;
  req.store = request_.store;
  // (Under the generation where the scope is shared: splits of two
  // communicators made from NCCL_COMM_ID must not meet.)
  req.scope = str(request_.scope, request_.sharedScope ? str("/g", hex64(bootstrap_->generation())) : std::string(),
                  "/split", splitIndex, "/color", color);
  req.secret = request_.secret;
  req.rank = newRank;
  req.nranks = static_cast<int>(members.size());
  req.options = options;
  req.cancel = cancel;
  auto child = std::make_shared<Communicator>(std::move(req));
  SHOAL_TRY(child->initialize()) << describe() << ": split color " << color;
  return child;
}

Code Communicator::asyncState() {
  Code init = initState_.load();
  if (init != Code::kOk) return init;
  if (Status e = asyncError(); !e.isOk()) return e.code();
  if (!anyInFlight_.load(std::memory_order_acquire)) return Code::kOk;
  // Polling drives completion, as in NCCL; outside jobsMutex_, which a graph
  // replay's host function takes.
  Engine::instance().poll();
  std::lock_guard<std::mutex> lock(jobsMutex_);
  dropFinishedDetachedLocked();
  if (Status e = asyncError(); !e.isOk()) return e.code();
  // Work in a CUDA stream's order is the stream's to finish, as in NCCL:
  // only the rest is still in progress.
  bool inProgress = std::any_of(inFlight_.begin(), inFlight_.end(),
                                [](const JobPtr& j) { return j->streamDone == nullptr && !j->streamWatch; });
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
bool Communicator::whileIdle(const std::function<void()>& look) {
  if (aborted() || failed_.load(std::memory_order_acquire)) return false;
  checking_.store(true);
  struct Lower {
    std::atomic<bool>& flag;
    ~Lower() { flag.store(false, std::memory_order_release); }
  } lower{checking_};
  if (users_.load() != 0) return false;  // a call is using them: next round
  if (!Engine::instance().queueAtRest(reinterpret_cast<uintptr_t>(this))) return false;  // the engine's
  look();
  return true;
}

bool Communicator::checkIdle() {
  tidyTransports();  // other processes' probes of this one wait on its listeners
  bool asked = false;
  whileIdle([&] {
    if (Status lost = connections_.findLostPeer(); !lost.isOk()) return failIdle(lost);
    // Connections that notice nothing (ofi): a look found a peer gone.
    if (failForJudgedPeer()) return;
    anyGoneTicket_ = connections_.askWhetherAnyGone();  // read within milliseconds of its answer (readIdleAnswer)
    asked = anyGoneTicket_ != 0;
  });
  return asked;
}

bool Communicator::readIdleAnswer() {
  if (!connections_.anyGoneAnswered(anyGoneTicket_)) return false;
  // Answered: read now, or at the next check where the connections are busy.
  whileIdle([&] { (void)failForJudgedPeer(); });
  return true;
}

bool Communicator::failForJudgedPeer() {
  std::optional<ConnectionTable::GoneRank> gone = connections_.judgedPeer();
  if (!gone) return false;
  failIdle(Status(Code::kRemoteError,
                  str("rank ", gone->rank, " (host ", peers_[gone->rank].hostname, ") will not come: ",
                      gone->will.starts_with(kReportedFailurePrefix) ? "its communicator failed" : gone->will)));
  return true;
}

void Communicator::failIdle(const Status& lost) {
  Status st(Code::kRemoteError, str(describe(), ": a peer was lost while no operation was in flight "
                                    "(idle check, SHOAL_IDLE_CHECK_MS): ", lost.message()));
  SHOAL_WARN(st.message());
  // Same-host peers read it through their connections' side channel (and
  // fail too, at their own next check), as after a failed operation.
  connections_.publishFailure(st.message(), /*final=*/true);
  setAsyncError(st);
}

Status Communicator::finalize() {
  Deadline deadline = Deadline::never();  // each job has its own no-progress deadline
  return waitIdle(deadline);
}

RedOpTable::RedOpTable(uint64_t seed)
    : base_(kFirstId + static_cast<int>((mix64(seed) % 16384) * kMaxLive)) {}

Result<int> RedOpTable::create(const CustomRedOp& op) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto freeSlot = std::find(live_.begin(), live_.end(), 0);
  const size_t i = static_cast<size_t>(freeSlot - live_.begin());
  if (freeSlot == live_.end()) {
    if (ops_.size() >= static_cast<size_t>(kMaxLive))
      return invalidUsage("ncclRedOpCreatePreMulSum: ", kMaxLive,
                          " user-created operators are alive on this communicator; destroy some first");
    ops_.push_back(op);
    live_.push_back(1);
  } else {
    ops_[i] = op;
    live_[i] = 1;
  }
  return base_ + static_cast<int>(i);
}

int RedOpTable::slotOf(int id) const {
  if (id < base_ || id - base_ >= static_cast<int>(ops_.size())) return -1;
  const int i = id - base_;
  return live_[static_cast<size_t>(i)] ? i : -1;
}

Result<CustomRedOp> RedOpTable::find(int id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const int i = slotOf(id);
  if (i < 0)
    return invalidArgument("reduction operator ", id,
                           " is unknown to this communicator (never created on it, or destroyed)");
  return ops_[static_cast<size_t>(i)];
}

Status RedOpTable::destroy(int id) {
  std::lock_guard<std::mutex> lock(mutex_);
  const int i = slotOf(id);
  if (i < 0)
    return invalidArgument("ncclRedOpDestroy: operator ", id,
                           " is not a live user-created operator of this communicator");
  live_[static_cast<size_t>(i)] = 0;
  return Status::ok();
}

Result<double> Communicator::estimateUs(const CollShape& shape) const {
  if (!plans_) return invalidUsage(describe(), " has not finished its init");
  return plans_->estimateUs(shape);
}

std::string Communicator::dumpState() {
  std::string out = describe() + "\n";
  out += str("  collectives issued: ", collSeq_.load(std::memory_order_relaxed), "\n  connections: ",
             connections_.size(), "\n", connections_.describe());
  Status e = asyncError();
  out += str("  async error: ", e.isOk() ? std::string("none") : e.toString(), "\n");
  std::string report = hangReport("request", nullptr);
  if (!params().reportDir.empty()) hang::publish(report, reportStem());
  return out + "  report: " + report + "\n";
}

std::string Communicator::reportStem() const { return str(idHex(), "-r", rank_, "-", ::getpid()); }

JobReport Communicator::reportOfConnect(const ConnectionTable::PendingConnect& pending) const {
  JobReport r;
  r.what = str(pending.operation, " (connecting)");
  r.queueId = reinterpret_cast<uintptr_t>(this);
  r.sequence = pending.sequence;
  r.idleMs = (nowNs() - pending.sinceNs) / 1000000;
  r.peers.push_back(JobReport::Peer{pending.peer});
  r.waitingOn.push_back(pending.peer);
  return r;
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
  if (!known) {
    // An operation still making its connections (before the engine has it).
    if (std::optional<ConnectionTable::PendingConnect> pending = connections_.pendingConnect()) {
      asked = reportOfConnect(*pending);
      known = &*asked;
    }
  }
  hang::ReportFacts facts;
  facts.reason = reason;
  facts.commId = idHex();
  facts.rank = rank_;
  facts.nranks = nranks_;
  facts.host = rank_ < static_cast<int>(peers_.size()) ? peers_[rank_].hostname : "";
  facts.pid = ::getpid();
  facts.unixMs = hang::unixTimeMs();
  facts.collectivesIssued = collSeq_.load(std::memory_order_relaxed);
  facts.jobsQueued = queued;
  if (Status e = asyncError(); !e.isOk()) facts.error = e.toString();
  return hang::formatReport(facts, known);
}

void Communicator::publishReport(std::string_view reason, const JobReport* known) {
  hang::publish(hangReport(reason, known), reportStem());
}

}  // namespace shoal
