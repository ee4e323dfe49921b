// ConnectionTable: a communicator's Connections, one per (peer, channel),
// each made the first time a plan needs that lane (docs/design.md, Nouns:
// Connection, Transport).
//
// Role: picks the transport for a peer (transports/registry.h), connects with
// the communicator's key and secret, and keeps the connections for the
// communicator's life; after a failure it spreads this rank's report to
// peers that carry one (side channels) and reads theirs, and it answers the
// idle liveness check.
// Thread: the communicator's user thread makes and drops connections; the
// engine uses them only while a job of the communicator runs, and the idle
// check only while neither does (Communicator::UseGuard, Engine::queueAtRest).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "collectives/plan.h"
#include "core/clock.h"
#include "core/peer_info.h"
#include "core/status.h"
#include "transports/registry.h"
#include "transports/transport.h"

namespace shoal {

class Job;

class ConnectionTable {
 public:
  // What a connect's watch found of a peer: set once, never cleared (a peer
  // that failed or exited does not come back to this communicator); `why`
  // is written before the flag and read after it.
  static constexpr uint8_t kProbeNotNeeded = 0, kProbeVouching = 1, kProbeTrusted = 2, kProbeUntrusted = 3;
  struct PeerVerdict {
    std::atomic<bool> willNotCome{false};
    std::string why;
    // Found only by a probe of its process (its will unreadable): a peer
    // whose connections closed in order before its process exited is
    // taken to have left (judgedPeer). Written before the flag.
    bool exitOnly = false;
    // For a peer whose connections do not notice its exit
    // (Transport::noticesPeerExit): whether a look at an operation stalled
    // on it may ask a probe (transports/registry.h, probePeerProcess). The
    // probe is trusted only once it found the peer alive right after a
    // connection to it was made, so that a refusal later means its process
    // is gone, not that the probe never reaches it (a firewall's rejection).
    std::atomic<uint8_t> exitProbe{kProbeNotNeeded};
  };

  // What one look of the connect watch (connection_table.cc) asks of a peer,
  // on the watch's thread, within the look's deadline.
  enum class Look : uint8_t {
    // A connect waits for it, once a second: its failure report, else
    // whether its process exited (the connecting transport's probe).
    kConnect,
    // An operation waits on it (lookUpFailure): its failure report, else
    // whether its process exited where the probe is trusted.
    kStalled,
    // A connection to it was just made: whether the probe finds it alive.
    kVouch,
    // The idle check, for connections that do not notice their peer's exit
    // (askWhetherAnyGone; asked with the table's own rank): whether any
    // peer's will is written (GoneLookup); one found becomes its verdict.
    // Where the store cannot be asked (the process that served the
    // bootstrap root is gone, and its will with it), whether the process of
    // a peer with a trusted probe exited instead (probeForExitedPeer).
    kAnyGone,
  };

  // `peers` (rank order, filled at init before the first connection) and
  // `abortFlag` outlive the table; an abort ends a connect waiting for its peer.
  ConnectionTable(uint64_t commId, int rank, const std::vector<PeerInfo>& peers, std::string secret,
                  const std::atomic<bool>& abortFlag);
  // Waits for a look at one of its connects in progress (the connect watch).
  ~ConnectionTable();
  ConnectionTable(const ConnectionTable&) = delete;
  ConnectionTable& operator=(const ConnectionTable&) = delete;

  // The communicator's id in connection keys, where it is known only after
  // the check-in (a shared scope); set before the first connection.
  void setCommId(uint64_t commId) { commId_ = commId; }
  // How transports are chosen, as the ranks agreed at init; set before the
  // first connection (and the first question about one).
  void setChoice(TransportChoice choice) { choice_ = choice; }
  TransportChoice choice() const { return choice_; }
  // The communicator's name, for connects no operation names; set before
  // the first connection.
  void setLabel(std::string label) { label_ = std::move(label); }
  // Whether connections may carry stream links (ConnectOptions), as the
  // ranks agreed at init; set before the first connection.
  void setStreamLinks(bool allowed) { streamLinks_ = allowed; }
  // Where a peer's failure report is looked up ("" when it published none),
  // its will (Bootstrap::setWill) and whether it left (destroyed or aborted
  // its communicator), within the deadline; set before the first
  // connection. A connect that has waited a second asks once a second why
  // its peer will not come (lookAt, Look::kConnect): a peer that failed
  // before it connected (its own connect refused, a call it could not run)
  // publishes why, the root writes the will of one whose process ended,
  // one that left says so, one whose process exited leaves the connecting
  // transport's listener closed, and the wait would otherwise last until
  // the deadline.
  struct PeerNews {
    std::string report;
    std::string gone;  // its will, written by the store when its process ended
    bool left = false;
    bool unreadable = false;  // the store could not be asked
  };
  using PeerReports = std::function<PeerNews(int peer, Deadline deadline)>;
  void setPeerReports(PeerReports lookup) { peerReports_ = std::move(lookup); }
  // For the engine's stalled jobs (FailureReports), never waiting: why the
  // peer will not come, once the connect watch found it ("it failed: <its
  // report>", or a connect's finding), else ""; and a look at it
  // (Look::kStalled: its report in the store, and for a peer whose
  // connections do not notice an exit a trusted probe), made soon by the
  // watch's thread.
  std::string knownFailure(int peer);
  void lookUpFailure(int peer);
  // A peer whose process ended, found by its will (Bootstrap::setWill):
  // `rank`, and the will.
  struct GoneRank {
    int rank = -1;
    std::string will;
  };
  // Where the idle check's look finds such a peer (nullopt: none; an error:
  // the store could not be asked), within the deadline; set before the
  // first connection.
  using GoneLookup = std::function<Result<std::optional<GoneRank>>(Deadline deadline)>;
  void setGoneLookup(GoneLookup lookup) { goneLookup_ = std::move(lookup); }
  // For the idle check, never waiting: where a connection was made over a
  // transport that does not notice its peer's exit (ofi: its provider may
  // say nothing of a peer that is gone), a look for any peer's will
  // (Look::kAnyGone), made soon by the connect watch's thread; what it
  // finds is read back by judgedPeer(). Returns a ticket that
  // anyGoneAnswered() takes once a look begun after the ask has ended (0:
  // no look asked: no connection needs one).
  uint64_t askWhetherAnyGone();
  bool anyGoneAnswered(uint64_t ticket) const { return anyGoneServed_.load(std::memory_order_acquire) >= ticket; }
  // The first peer a look found will not come, and why (knownFailure's),
  // leaving out peers found only by a probe of their process
  // (PeerVerdict::exitOnly) whose connections say they closed in order
  // before (Connection::peerClosed: they destroyed, aborted or failed their
  // communicator first, and operations that need them fail naming them).
  // For the idle check, which holds the connections.
  std::optional<GoneRank> judgedPeer();

  // The connection to `peer` on `channel`, made on first use. With
  // `unlessWaiting`, one whose set-up would wait for the peer
  // (Transport::connectWaitsForPeer) is not made: nullptr. A connect is part
  // of the operation `forJob` (null: one not named) and waits for its peer
  // as an operation does: said at WARN from SHOAL_STALL_WARN_MS on (by the
  // connect watch), a timeout at SHOAL_PROGRESS_TIMEOUT_MS, where that is
  // sooner than the set-up deadline (SHOAL_INIT_TIMEOUT_MS).
  Result<Connection*> to(int peer, uint16_t channel, bool unlessWaiting = false, const Job* forJob = nullptr);
  // Every lane's connection of the plan, in lane order; where one cannot be
  // made, `failedPeer` (if given) is set to its peer.
  Status forPlan(const Plan& plan, std::vector<Connection*>& laneConnections, const Job* forJob = nullptr,
                 int* failedPeer = nullptr);
  // A connect that waits for its peer, for hang reports: the operation it
  // is part of (Job::description(), or the table's own name), that
  // operation's sequence number (0: unknown), the peer, since when.
  struct PendingConnect {
    std::string operation;
    uint64_t sequence = 0;
    int peer = -1;
    int64_t sinceNs = 0;
  };
  // The oldest connect now waiting, if any (from any thread).
  std::optional<PendingConnect> pendingConnect() const;
  // Called on the connecting thread when a connect reaches its deadline,
  // before it fails (the communicator writes its hang report); set before
  // the first connection.
  using ConnectTimeout = std::function<void(const PendingConnect&)>;
  void setConnectTimeout(ConnectTimeout observer) { connectTimeout_ = std::move(observer); }
  // The connect watch's warning that a connect has waited `waitedMs` for
  // its peer (SHOAL_STALL_WARN_MS).
  void warnConnectWaits(const PendingConnect& pending, const Transport& transport, int64_t waitedMs) const;
  // Whether every lane of the plan goes to another rank through a transport
  // whose connections take device buffers (Transport::movesDeviceMemory).
  bool movesDeviceMemory(const Plan& plan);

  // This rank's failure, written into every connection's side channel
  // (`final`: Connection::publishFailure).
  void publishFailure(std::string_view report, bool final);
  // Breaks every connection's stream link for good (StreamLink::release):
  // the peers' stream plans on them fail now, not at their deadline.
  void releaseStreamLinks();
  // A peer's failure report from its connections (Connection::peerFailure):
  // one that arrives by itself (shm's segment) is waited for until the
  // deadline (the peer may fail a moment after us), and so is the final
  // report where a draft is there (Connection::peerFailureFinal); the draft
  // at the deadline, "" when none has one.
  struct PeerReport {
    std::string text;
    bool final = false;
  };
  PeerReport peerFailure(int peer, Deadline deadline) const;
  // The first idle connection to another rank whose peer is gone
  // (Connection::checkAlive), as its error; ok when every peer is there.
  // (No probe here: a peer over ofi that destroyed its communicator and
  // exited has left, and says so to nobody.)
  Status findLostPeer();
  // Closes every connection (peers waiting on us see the close).
  void clear();
  // Forgets every connection without closing it or freeing its memory: a
  // GPU stream may still use it (StreamPlans::settle timed out).
  void abandon();
  // Hands every connection over (closed by whoever drops them).
  std::vector<std::unique_ptr<Connection>> take();

  // "    <peer> channel <c>" lines, for state dumps: from any thread, while
  // the communicator is busy (what a connection has pending is its
  // progress thread's; the hang report says what each operation waits on).
  std::string describe() const;
  size_t size() const;

  // For the connect watch: what a look finds (Look): why the peer will not
  // come ("" when it may; always "" for kVouch, which only settles
  // exitProbe). `connecting`: the transport of a kConnect look.
  std::string lookAt(int peer, Look what, const Transport* connecting, Deadline deadline);
  // The peer will not come, for `why`: connects to it end now and later ones
  // fail at once. Said once; from the watch's thread only.
  void judge(int peer, std::string why, bool exitOnly = false);

 private:
  PeerVerdict& verdictOn(int peer);
  // Look::kAnyGone without the store: probes the processes of the peers
  // whose probe is trusted; the first found gone is judged (exitOnly),
  // `storeError` saying why its will could not be read. Once a peer is
  // judged, no more: the store usually went with that peer's process (the
  // job's end, where rank 0 exits first), and each probe waits in a live
  // peer's listen backlog until its next idle check.
  void probeForExitedPeer(const Status& storeError, Deadline deadline);
  // Whether a connection to `peer` says it closed its side in order.
  bool peerClosedInOrder(int peer);

  uint64_t commId_;  // setCommId
  const int rank_;
  const std::vector<PeerInfo>& peers_;
  const std::string secret_;
  const std::atomic<bool>& abortFlag_;
  std::map<std::pair<int, uint16_t>, std::unique_ptr<Connection>> connections_;
  // Held where the map changes, by describe()/size(), which other threads
  // call (a watchdog's state dump), and wherever the whole map is walked
  // (failure reports, the idle check, stream links): a failing call's walk
  // may meet another thread's call still connecting. Lookups of the engine's
  // lanes take turns otherwise (comm/communicator.h, UseGuard).
  mutable std::mutex mapMutex_;
  TransportChoice choice_;
  bool streamLinks_ = true;
  PeerReports peerReports_;
  GoneLookup goneLookup_;
  // A connection was made over a transport that does not notice its peer's
  // exit (askWhetherAnyGone).
  std::atomic<bool> unwatchedPeers_{false};
  std::atomic<int> firstJudged_{-1};  // the first peer judge() was given (judgedPeer)
  // Look::kAnyGone: tickets handed out, and the last one a finished look
  // had seen when it began.
  std::atomic<uint64_t> anyGoneAsks_{0};
  std::atomic<uint64_t> anyGoneServed_{0};
  // Look::kAnyGone without the store (connect watch's thread only): such
  // looks so far (probes at the 1st, 2nd, 4th, ... 32nd, then every 32nd)
  // and the peer the next round starts at.
  uint64_t storeLostLooks_ = 0;
  int nextProbed_ = 0;
  std::string label_;
  ConnectTimeout connectTimeout_;
  // Connects that wait for their peer now, oldest first (under mapMutex_).
  std::vector<PendingConnect> pending_;
  // Per peer, made at the first connect; its flag cancels the deadlines of
  // connects to the peer, which connections may keep (shm waits for its
  // peer to attach), so it lives as long as the table.
  std::unique_ptr<PeerVerdict[]> verdicts_;
  std::vector<int8_t> peerMovesDeviceMemory_;  // per peer: -1 not asked yet, else the verdict
};

}  // namespace shoal
