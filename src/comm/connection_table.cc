#include "comm/connection_table.h"

#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <system_error>
#include <thread>
#include <unordered_set>

#include "core/log.h"
#include "core/params.h"
#include "core/process.h"
#include "engine/engine.h"
#include "transports/registry.h"

namespace shoal {
namespace {

// The connects of this process that wait for their peer, watched by one
// thread (started at the first connect, for the life of the process; again
// in a forked child): once a connect has waited a second, and then once a
// second, it asks the connect's table why the peer will not come
// (ConnectionTable::lookAt, Look::kConnect). A reason goes into the peer's
// verdict, whose flag cancels the connect's deadline and those the
// connection keeps. A connect still waiting is said at WARN as a stalled
// operation is (SHOAL_STALL_WARN_MS, then 2, 4, 8... times that). A connect
// costs a registration, no thread. The thread also makes the one-off looks
// that stalled jobs and new connections ask for (ask()), so that no job's
// thread waits on the store or a probe.
class ConnectWatch {
 public:
  static constexpr int64_t kFirstLookMs = 1000;
  static constexpr int64_t kLookEveryMs = 1000;
  static constexpr int64_t kLookMs = 1000;  // one look's own deadline

  static ConnectWatch& instance() {
    static ConnectWatch* watch = [] {
      auto* made = new ConnectWatch();  // its thread may outlive static destructors
      (void)pthread_atfork(nullptr, nullptr, [] { instance().startAfreshInChild(); });
      return made;
    }();
    return *watch;
  }

  // A connect of `table` to `peer` over `transport` starts.
  uint64_t begin(ConnectionTable* table, Transport* transport, const ConnectionTable::PendingConnect& pending) {
    std::lock_guard<std::mutex> lock(mutex_);
    adoptList();
    ensureThread();
    const uint64_t id = nextId_++;
    waiting_.push_back(Waiting{id, table, pending.peer, ConnectionTable::Look::kConnect, transport,
                               nowNs() + kFirstLookMs * 1000000, pending});
    changed_.notify_all();
    return id;
  }
  // One look at `peer`, soon (not kConnect), begun after this call: a look
  // already asked for and not begun is not added again.
  void ask(ConnectionTable* table, int peer, ConnectionTable::Look what) {
    std::lock_guard<std::mutex> lock(mutex_);
    adoptList();
    // (The one being looked at began before this ask: another is added.)
    if (std::any_of(waiting_.begin(), waiting_.end(), [&](const Waiting& w) {
          return w.table == table && w.peer == peer && w.what == what && w.id != lookingAt_;
        }))
      return;
    ensureThread();
    waiting_.push_back(Waiting{nextId_++, table, peer, what, nullptr, nowNs(), {}, 0});
    changed_.notify_all();
  }
  // It has returned: never waits (a look in progress is cancelled).
  void end(uint64_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::erase_if(waiting_, [&](const Waiting& w) { return w.id == id; });
    if (lookingAt_ == id) cancelLook_.store(true, std::memory_order_release);
  }
  // The table is going: waits for a look of one of its connects to end.
  void forget(const ConnectionTable* table) {
    std::unique_lock<std::mutex> lock(mutex_);
    adoptList();  // a forked child waits for no look of its parent's thread
    std::erase_if(waiting_, [&](const Waiting& w) { return w.table == table; });
    if (lookingTable_ == table) cancelLook_.store(true, std::memory_order_release);
    changed_.wait(lock, [&] { return lookingTable_ != table; });
  }

 private:
  struct Waiting {
    uint64_t id;
    ConnectionTable* table;
    int peer;
    ConnectionTable::Look what;
    Transport* transport;  // kConnect's
    int64_t dueNs;
    ConnectionTable::PendingConnect pending{};  // kConnect's
    int warnings = 0;                           // kConnect's stall warnings so far
  };

  // Whether a connect has waited SHOAL_STALL_WARN_MS, then 2, 4, 8... times
  // that, since it last said so (counted; mutex_ held).
  static bool dueForWarning(Waiting& connect, int64_t waitedMs) {
    const int64_t warnMs = params().stallWarnMs;
    if (warnMs <= 0 || connect.warnings >= 20 || waitedMs < (warnMs << connect.warnings)) return false;
    ++connect.warnings;
    return true;
  }

  // A process may fork while the watch's thread holds mutex_, midway
  // through a change of the list: the child, which has neither that thread
  // nor the connects it watched, starts from a new lock, condition and list
  // (the old ones are left as they are). Nothing is held across the fork:
  // the engine's handler waits for its locks, which an idle check holds
  // while it asks for a look here.
  void startAfreshInChild() {
    new (&mutex_) std::mutex();
    new (&changed_) std::condition_variable();
    new (&waiting_) std::vector<Waiting>();
    listOwner_ = 0;  // adopted at the next use (adoptList)
  }
  // A forked child inherits its parent's list, not its connects nor its
  // thread (mutex_ held).
  void adoptList() {
    if (listOwner_ == currentPid()) return;
    listOwner_ = currentPid();
    waiting_.clear();
    lookingAt_ = 0;
    lookingTable_ = nullptr;
  }

  void ensureThread() {  // mutex_ held
    if (owner_ == currentPid()) return;
    owner_ = currentPid();
    try {
      std::thread([this] {
        markLibraryThread();
        run();
      }).detach();
    } catch (const std::system_error& e) {
      owner_ = 0;  // tried again at the next connect
      SHOAL_WARN("connect watch: no thread (", e.what(), "): a connect to a peer that will not come waits for "
                 "its deadline");
    }
  }

  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    const int mine = currentPid();
    for (;;) {
      if (owner_ != mine) return;  // a forked child's copy of the list is not ours
      auto due = std::min_element(waiting_.begin(), waiting_.end(),
                                  [](const Waiting& a, const Waiting& b) { return a.dueNs < b.dueNs; });
      if (due == waiting_.end()) {
        changed_.wait(lock);
        continue;
      }
      if (due->dueNs > nowNs()) {
        changed_.wait_until(lock, Clock::time_point(std::chrono::nanoseconds(due->dueNs)));
        continue;
      }
      const Waiting look = *due;
      lookingAt_ = look.id;
      lookingTable_ = look.table;
      cancelLook_.store(false, std::memory_order_relaxed);
      lock.unlock();
      std::string why = look.table->lookAt(look.peer, look.what, look.transport,
                                           Deadline::afterMs(kLookMs).cancelledBy(&cancelLook_));
      lock.lock();
      lookingAt_ = 0;
      lookingTable_ = nullptr;
      auto still = std::find_if(waiting_.begin(), waiting_.end(), [&](const Waiting& w) { return w.id == look.id; });
      if (still != waiting_.end()) {
        const bool found = !why.empty();
        if (found) look.table->judge(look.peer, std::move(why));
        if (!found && look.what == ConnectionTable::Look::kConnect) {
          still->dueNs = nowNs() + kLookEveryMs * 1000000;
          const int64_t waitedMs = (nowNs() - still->pending.sinceNs) / 1000000;
          if (dueForWarning(*still, waitedMs)) {
            // Said outside the lock (a connect ending meanwhile does not
            // wait for a log line), with the table held as for a look.
            const ConnectionTable::PendingConnect pending = still->pending;
            lookingTable_ = look.table;
            lock.unlock();
            look.table->warnConnectWaits(pending, *look.transport, waitedMs);
            lock.lock();
            lookingTable_ = nullptr;
            changed_.notify_all();
          }
        } else {
          waiting_.erase(still);
        }
      }
      changed_.notify_all();  // forget() may wait for this look
    }
  }

  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<Waiting> waiting_;
  uint64_t nextId_ = 1;
  int owner_ = 0;                                  // the process whose thread runs
  int listOwner_ = 0;                              // the process whose connects waiting_ holds
  uint64_t lookingAt_ = 0;                         // the connect being looked at (0: none)
  const ConnectionTable* lookingTable_ = nullptr;  // and its table
  std::atomic<bool> cancelLook_{false};
};

// How long a connect waits for its peer: as long as an operation waits for
// its peers (a connect is made by the first operation that needs it), within
// the set-up deadline.
struct ConnectLimit {
  int64_t ms;
  const char* name;
};
ConnectLimit connectLimit() {
  const Params& p = params();
  if (p.progressTimeoutMs > 0 && p.progressTimeoutMs < p.initTimeoutMs)
    return {p.progressTimeoutMs, "SHOAL_PROGRESS_TIMEOUT_MS"};
  return {p.initTimeoutMs, "SHOAL_INIT_TIMEOUT_MS"};
}

}  // namespace

ConnectionTable::ConnectionTable(uint64_t commId, int rank, const std::vector<PeerInfo>& peers, std::string secret,
                                 const std::atomic<bool>& abortFlag)
    : commId_(commId), rank_(rank), peers_(peers), secret_(std::move(secret)), abortFlag_(abortFlag) {}

Result<Connection*> ConnectionTable::to(int peer, uint16_t channel, bool unlessWaiting, const Job* forJob) {
  const auto key = std::make_pair(peer, channel);
  {
    std::lock_guard<std::mutex> lock(mapMutex_);
    if (auto it = connections_.find(key); it != connections_.end()) return it->second.get();
  }
  if (peer < 0 || peer >= static_cast<int>(peers_.size())) return internalError("plan names peer ", peer);
  Transport* transport = nullptr;
  if (peer == rank_) {
    transport = transportToSelf();
  } else {
    SHOAL_ASSIGN_OR_RETURN(transport, selectTransport(peers_[rank_], peers_[peer], choice_));
  }
  const ConnectionKey ckey{commId_, rank_, peer, channel};
  if (unlessWaiting && transport->connectWaitsForPeer(ckey)) return nullptr;
  ConnectOptions opts;
  opts.self = &peers_[rank_];
  opts.peer = &peers_[peer];
  opts.secret = secret_;
  opts.streamLinks = streamLinks_;
  const ConnectLimit limit = connectLimit();
  opts.deadline = Deadline::afterMs(limit.ms).cancelledBy(&abortFlag_);
  opts.attachDeadline = Deadline::afterMs(params().initTimeoutMs).cancelledBy(&abortFlag_);
  auto willNotConnect = [&](const std::string& why) {
    return remoteError("connecting to rank ", peer, " (host ", peers_[peer].hostname, ") over ", transport->name(),
                       ": rank ", peer, " will not connect: ", why);
  };
  PeerVerdict* verdict = nullptr;  // none for a connection to itself
  uint64_t watched = 0;
  PendingConnect pending;
  if (peer != rank_) {
    verdict = &verdictOn(peer);
    if (verdict->willNotCome.load(std::memory_order_acquire)) return willNotConnect(verdict->why);
    opts.deadline = opts.deadline.alsoCancelledBy(&verdict->willNotCome);
    opts.attachDeadline = opts.attachDeadline.alsoCancelledBy(&verdict->willNotCome);
    pending = PendingConnect{forJob ? forJob->description() : label_,
                             forJob ? forJob->sequence : 0, peer, nowNs()};
    watched = ConnectWatch::instance().begin(this, transport, pending);
    std::lock_guard<std::mutex> lock(mapMutex_);
    pending_.push_back(pending);
  }
  Result<std::unique_ptr<Connection>> made = transport->connect(ckey, opts);
  const bool timedOut = !made.isOk() && opts.deadline.expired() && !opts.deadline.cancelled();
  if (verdict != nullptr) {
    ConnectWatch::instance().end(watched);
    if (timedOut && connectTimeout_) connectTimeout_(pending);  // while it is still pending
    std::lock_guard<std::mutex> lock(mapMutex_);
    std::erase_if(pending_, [&](const PendingConnect& p) { return p.sinceNs == pending.sinceNs && p.peer == peer; });
  }
  if (!made.isOk()) {
    Status cause = made.takeStatus();
    if (verdict != nullptr && verdict->willNotCome.load(std::memory_order_acquire)) return willNotConnect(verdict->why);
    if (verdict != nullptr && timedOut)
      return error(Code::kTimeout, "connecting to rank ", peer, " (host ", peers_[peer].hostname, ") over ",
                   transport->name(), ": no connection within ", limit.ms, " ms (", limit.name, "; rank ", peer,
                   " did not make this call, made another, or waits on a rank that did not): ", cause.message());
    return StatusBuilder(std::move(cause))
           << str("connecting to rank ", peer, " (host ", peers_[peer].hostname, ") over ", transport->name());
  }
  std::unique_ptr<Connection> conn = std::move(made).value();
  // The peer is there now: whether a probe finds it so, which lets later
  // looks trust the probe's refusal (PeerVerdict::exitProbe).
  // (Only stalled operations' looks use it, and only with the idle check.)
  uint8_t untested = kProbeNotNeeded;
  if (!transport->noticesPeerExit()) unwatchedPeers_.store(true, std::memory_order_relaxed);
  if (verdict != nullptr && !transport->noticesPeerExit() && params().idleCheckMs > 0 &&
      verdict->exitProbe.compare_exchange_strong(untested, kProbeVouching))
    ConnectWatch::instance().ask(this, peer, Look::kVouch);
  SHOAL_INFO(subsys::kInit | subsys::kNet, "Channel ",
             channel == kP2pChannel ? std::string("p2p") : std::to_string(channel), " : ", rank_,
             " -> ", peer, " via ", transport->name());
  Connection* raw = conn.get();
  std::lock_guard<std::mutex> lock(mapMutex_);
  connections_.emplace(key, std::move(conn));
  return raw;
}

ConnectionTable::PeerVerdict& ConnectionTable::verdictOn(int peer) {
  std::lock_guard<std::mutex> lock(mapMutex_);
  if (!verdicts_) verdicts_ = std::make_unique<PeerVerdict[]>(peers_.size());
  return verdicts_[static_cast<size_t>(peer)];
}

ConnectionTable::~ConnectionTable() { ConnectWatch::instance().forget(this); }

namespace {
// Vouches whose probe proved nothing by its deadline (a firewall that drops
// it, a peer's backlog full) in this process: past kMostSilentVouches no
// more are made, so that they do not hold up the watch's other looks.
std::atomic<int> gSilentVouches{0};
constexpr int kMostSilentVouches = 3;

// Peer processes a vouch found alive in this process. What a vouch learns,
// that the peer's listener is reachable from here, holds for the process's
// life, so later communicators with it take it from here: each probe waits
// in the peer's listen backlog until the peer's next idle check accepts it,
// and a job making thousands of communicators in a row filled that backlog,
// after which every vouch waited out its deadline and held up the
// destruction of its communicator.
class VouchedProcesses {
 public:
  static VouchedProcesses& instance() {
    static auto* vouched = [] {
      auto* made = new VouchedProcesses();  // never destroyed: used from threads at exit
      // A child forked while the watch's thread held the lock: a new lock
      // and set (what the parent vouched for is probed again).
      (void)pthread_atfork(nullptr, nullptr, [] {
        new (&instance().mutex_) std::mutex();
        new (&instance().processes_) std::unordered_set<std::string>();
      });
      return made;
    }();
    return *vouched;
  }
  bool contains(const PeerInfo& peer) {
    if (peer.processId == 0) return false;  // not told which process it is
    std::lock_guard<std::mutex> lock(mutex_);
    return processes_.count(keyOf(peer)) != 0;
  }
  void add(const PeerInfo& peer) {
    if (peer.processId == 0) return;
    std::lock_guard<std::mutex> lock(mutex_);
    if (processes_.size() >= kMostRemembered) processes_.clear();  // bounded; forgotten ones are probed again
    processes_.insert(keyOf(peer));
  }

 private:
  static constexpr size_t kMostRemembered = 16384;
  static std::string keyOf(const PeerInfo& peer) { return str(peer.hostId, "/", peer.processId); }
  std::mutex mutex_;
  std::unordered_set<std::string> processes_;
};
}  // namespace

std::string ConnectionTable::lookAt(int peer, Look what, const Transport* connecting, Deadline deadline) {
  if (what == Look::kAnyGone) {
    struct Served {
      std::atomic<uint64_t>& served;
      const uint64_t ticket;
      ~Served() { served.store(ticket, std::memory_order_release); }
    } served{anyGoneServed_, anyGoneAsks_.load(std::memory_order_acquire)};
    if (!goneLookup_) return "";
    Result<std::optional<GoneRank>> found = goneLookup_(deadline);
    if (!found.isOk()) {
      const uint64_t n = ++storeLostLooks_;
      if (!deadline.expired() && ((n & (n - 1)) == 0 || n % 32 == 0)) probeForExitedPeer(found.status(), deadline);
      return "";
    }
    std::optional<GoneRank>& gone = found.value();
    if (gone && gone->rank >= 0 && gone->rank < static_cast<int>(peers_.size()) && gone->rank != rank_)
      judge(gone->rank, std::move(gone->will));
    return "";
  }
  PeerVerdict& verdict = verdictOn(peer);
  const PeerInfo& self = peers_[rank_];
  const PeerInfo& them = peers_[peer];
  if (what == Look::kVouch) {
    Transport::ProcessProbe::State found = Transport::ProcessProbe::kUnknown;
    if (VouchedProcesses::instance().contains(them)) {
      found = Transport::ProcessProbe::kAlive;
    } else if (gSilentVouches.load(std::memory_order_relaxed) < kMostSilentVouches) {
      found = probePeerProcess(self, them, deadline).state;
      if (found == Transport::ProcessProbe::kAlive) VouchedProcesses::instance().add(them);
      if (found == Transport::ProcessProbe::kUnknown && deadline.expired() && !deadline.cancelled() &&
          gSilentVouches.fetch_add(1) + 1 == kMostSilentVouches)
        SHOAL_INFO(subsys::kNet, kMostSilentVouches, " probes of peers' processes proved nothing: no more are "
                   "made in this process");
    }
    const bool alive = found == Transport::ProcessProbe::kAlive;
    verdict.exitProbe.store(alive ? kProbeTrusted : kProbeUntrusted, std::memory_order_release);
    SHOAL_INFO(subsys::kNet, "rank ", peer, " (host ", them.hostname, "): ",
               alive ? "a probe found its process (now or for an earlier communicator): an operation stalled on it "
                       "asks the probe whether it exited"
                     : "no probe found its process: an operation stalled on it waits for its failure report or "
                       "the no-progress deadline");
    return "";
  }
  // A stalled operation's look probes first, where the probe is trusted (one
  // connect: a slow store does not use up its deadline); the peer's report,
  // where it left one, says more than its exit.
  Transport::ProcessProbe probe;
  if (what == Look::kStalled && verdict.exitProbe.load(std::memory_order_acquire) == kProbeTrusted)
    probe = probePeerProcess(self, them, deadline);
  PeerNews news;
  if (peerReports_) {
    news = peerReports_(peer, deadline);
    if (!news.report.empty()) return str(kReportedFailurePrefix, news.report);
    if (!news.gone.empty()) return news.gone;
    if (news.left) return "it destroyed or aborted its communicator (ncclCommDestroy, ncclCommAbort)";
  }
  // A connect asks the transport that connects them: what its own address
  // says is known to reach the peer. One without a probe (ofi), where the
  // store that would hold its will cannot be asked (its process served the
  // bootstrap root, say), borrows the registry's where a probe found the
  // peer's process alive before (for an earlier communicator, a split's
  // parent say), so that its refusal means an exit. (Only then: each such
  // probe waits in the live peer's listen backlog until its idle check.)
  if (what == Look::kConnect && connecting != nullptr) {
    probe = connecting->probePeerProcess(self, them, deadline);
    if (probe.state == Transport::ProcessProbe::kUnknown && !connecting->noticesPeerExit() && news.unreadable &&
        VouchedProcesses::instance().contains(them))
      probe = probePeerProcess(self, them, deadline);
  }
  return probe.state == Transport::ProcessProbe::kGone ? probe.why : std::string();
}

void ConnectionTable::probeForExitedPeer(const Status& storeError, Deadline deadline) {
  if (firstJudged_.load(std::memory_order_acquire) >= 0) return;
  const int n = static_cast<int>(peers_.size());
  // Round-robin from where the last round stopped: a round that used up its
  // deadline on an unreachable host does not starve the peers after it.
  for (int i = 0; i < n && !deadline.expired(); ++i) {
    const int peer = (nextProbed_ + i) % n;
    if (peer == rank_) continue;
    {
      std::lock_guard<std::mutex> lock(mapMutex_);
      if (!verdicts_) return;  // no connection made yet
      if (verdicts_[static_cast<size_t>(peer)].exitProbe.load(std::memory_order_acquire) != kProbeTrusted) continue;
    }
    nextProbed_ = (peer + 1) % n;
    Transport::ProcessProbe probe = probePeerProcess(peers_[rank_], peers_[peer], deadline);
    if (probe.state != Transport::ProcessProbe::kGone) continue;
    judge(peer,
          str(probe.why, " (found by a probe of its process: its will could not be read, ", storeError.message(), ")"),
          /*exitOnly=*/true);
    return;
  }
}

bool ConnectionTable::peerClosedInOrder(int peer) {
  std::lock_guard<std::mutex> lock(mapMutex_);
  // A communicator closes all its connections together: one bye tells.
  return std::any_of(connections_.begin(), connections_.end(),
                     [&](const auto& entry) { return entry.first.first == peer && entry.second->peerClosed(); });
}

std::string ConnectionTable::knownFailure(int peer) {
  if (peer < 0 || peer >= static_cast<int>(peers_.size()) || peer == rank_) return {};
  PeerVerdict& verdict = verdictOn(peer);
  return verdict.willNotCome.load(std::memory_order_acquire) ? verdict.why : std::string();
}

void ConnectionTable::lookUpFailure(int peer) {
  if (peer < 0 || peer >= static_cast<int>(peers_.size()) || peer == rank_ || !peerReports_) return;
  ConnectWatch::instance().ask(this, peer, Look::kStalled);
}

uint64_t ConnectionTable::askWhetherAnyGone() {
  if (!goneLookup_ || !unwatchedPeers_.load(std::memory_order_relaxed)) return 0;
  const uint64_t ticket = anyGoneAsks_.fetch_add(1, std::memory_order_acq_rel) + 1;
  ConnectWatch::instance().ask(this, rank_, Look::kAnyGone);
  return ticket;
}

std::optional<ConnectionTable::GoneRank> ConnectionTable::judgedPeer() {
  if (firstJudged_.load(std::memory_order_acquire) < 0) return std::nullopt;
  // The first judged, unless it left; then any other.
  auto counts = [&](int peer) {
    if (peer == rank_ || knownFailure(peer).empty()) return false;
    return !verdictOn(peer).exitOnly || !peerClosedInOrder(peer);
  };
  const int first = firstJudged_.load(std::memory_order_acquire);
  if (counts(first)) return GoneRank{first, knownFailure(first)};
  for (int peer = 0; peer < static_cast<int>(peers_.size()); ++peer)
    if (peer != first && counts(peer)) return GoneRank{peer, knownFailure(peer)};
  return std::nullopt;
}

void ConnectionTable::judge(int peer, std::string why, bool exitOnly) {
  PeerVerdict& verdict = verdictOn(peer);
  if (verdict.willNotCome.load(std::memory_order_acquire)) return;  // said once, read by connects after the flag
  verdict.why = std::move(why);
  verdict.exitOnly = exitOnly;
  verdict.willNotCome.store(true, std::memory_order_release);
  int none = -1;
  firstJudged_.compare_exchange_strong(none, peer, std::memory_order_acq_rel);
}

void ConnectionTable::clear() {
  std::map<std::pair<int, uint16_t>, std::unique_ptr<Connection>> closing;
  {
    std::lock_guard<std::mutex> lock(mapMutex_);
    closing.swap(connections_);
  }
  // Closed outside the lock: cuda_ipc waits for its copies, a dump need not.
}

void ConnectionTable::abandon() {
  std::lock_guard<std::mutex> lock(mapMutex_);
  for (auto& entry : connections_) (void)entry.second.release();
  connections_.clear();
}

std::vector<std::unique_ptr<Connection>> ConnectionTable::take() {
  std::lock_guard<std::mutex> lock(mapMutex_);
  std::vector<std::unique_ptr<Connection>> taken;
  for (auto& entry : connections_) taken.push_back(std::move(entry.second));
  connections_.clear();
  return taken;
}

size_t ConnectionTable::size() const {
  std::lock_guard<std::mutex> lock(mapMutex_);
  return connections_.size();
}

Status ConnectionTable::forPlan(const Plan& plan, std::vector<Connection*>& laneConnections, const Job* forJob,
                                int* failedPeer) {
  laneConnections.resize(plan.lanes.size());
  for (size_t i = 0; i < plan.lanes.size(); ++i) {
    Result<Connection*> connection = to(plan.lanes[i].peer, plan.lanes[i].channel, false, forJob);
    if (!connection.isOk()) {
      if (failedPeer) *failedPeer = plan.lanes[i].peer;
      return connection.takeStatus();
    }
    laneConnections[i] = connection.value();
  }
  return Status::ok();
}

std::optional<ConnectionTable::PendingConnect> ConnectionTable::pendingConnect() const {
  std::lock_guard<std::mutex> lock(mapMutex_);
  if (pending_.empty()) return std::nullopt;
  return pending_.front();
}

void ConnectionTable::warnConnectWaits(const PendingConnect& pending, const Transport& transport,
                                       int64_t waitedMs) const {
  const ConnectLimit limit = connectLimit();
  SHOAL_WARN(pending.operation, ": connecting to rank ", pending.peer, " (host ", peers_[pending.peer].hostname,
             ") over ", transport.name(), ": no answer for ", waitedMs, " ms; it fails at ", limit.ms, " ms (",
             limit.name, "). Usually a rank did not make this call, or made another: SHOAL_REPORT_SIGNAL and "
             "tools/shoal_hang_report.py show what every rank is doing (docs/diagnostics.md)");
}

bool ConnectionTable::movesDeviceMemory(const Plan& plan) {
  if (peerMovesDeviceMemory_.size() != peers_.size()) peerMovesDeviceMemory_.assign(peers_.size(), -1);
  for (const Lane& lane : plan.lanes) {
    if (lane.peer == rank_ || lane.peer < 0 || lane.peer >= static_cast<int>(peers_.size())) return false;
    int8_t& known = peerMovesDeviceMemory_[lane.peer];
    if (known < 0) {  // the transport of a peer is chosen once, as its connections are
      Result<Transport*> transport = selectTransport(peers_[rank_], peers_[lane.peer], choice_);
      known = transport.isOk() && transport.value()->movesDeviceMemory() ? 1 : 0;
    }
    if (!known) return false;
  }
  return true;
}

void ConnectionTable::releaseStreamLinks() {
  std::lock_guard<std::mutex> lock(mapMutex_);
  for (auto& [key, connection] : connections_)
    if (StreamLink* link = connection->streamLink()) link->release();
}

void ConnectionTable::publishFailure(std::string_view report, bool final) {
  std::lock_guard<std::mutex> lock(mapMutex_);
  for (auto& [key, connection] : connections_) connection->publishFailure(report, final);
}

ConnectionTable::PeerReport ConnectionTable::peerFailure(int peer, Deadline deadline) const {
  std::vector<Connection*> carriers;
  {
    std::lock_guard<std::mutex> lock(mapMutex_);
    for (const auto& [key, connection] : connections_)
      if (key.first == peer && connection->carriesFailureReports()) carriers.push_back(connection.get());
  }
  PeerReport draft;
  Backoff backoff;
  while (!carriers.empty()) {
    for (Connection* c : carriers) {
      const bool final = c->peerFailureFinal();  // first: the text read after a final answer is final
      std::string report = c->peerFailure();
      if (report.empty()) continue;
      if (final) return PeerReport{std::move(report), true};
      if (report.size() > draft.text.size()) draft.text = std::move(report);
    }
    // Only reports that arrive by themselves are worth waiting for.
    std::erase_if(carriers, [](Connection* c) { return !c->failureReportsArriveUnread(); });
    if (carriers.empty() || deadline.expired()) return draft;
    backoff.pause();
  }
  return draft;
}

Status ConnectionTable::findLostPeer() {
  std::lock_guard<std::mutex> lock(mapMutex_);
  for (const auto& [key, connection] : connections_) {
    if (key.first == rank_ || connection->pending() != 0) continue;
    if (Status lost = connection->checkAlive(); !lost.isOk()) return lost;
  }
  return Status::ok();
}

std::string ConnectionTable::describe() const {
  std::lock_guard<std::mutex> lock(mapMutex_);
  std::string out;
  for (const auto& [key, conn] : connections_)
    out += str("    ", conn->peerDescription(), " channel ",
               key.second == kP2pChannel ? std::string("p2p") : std::to_string(key.second), "\n");
  return out;
}

}  // namespace shoal
