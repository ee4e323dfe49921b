#include "comm/connection_table.h"

#include <chrono>
#include <condition_variable>
#include <optional>
#include <thread>

#include "core/log.h"
#include "core/params.h"
#include "transports/registry.h"

namespace shoal {
namespace {

// While one connect waits, a thread looks for why the peer will not come
// (ConnectionTable::whyPeerWillNotCome) after the first second, then once a
// second; a reason it finds goes into the peer's verdict, whose flag cancels
// the connect's deadline (and that of whatever the connection keeps waiting
// for the peer). Most connects finish within the first second and cost the
// thread only.
class PeerWatch {
 public:
  static constexpr int64_t kFirstLookMs = 1000;
  static constexpr int64_t kLookEveryMs = 1000;
  static constexpr int64_t kLookMs = 1000;  // one look's own deadline

  PeerWatch(ConnectionTable::PeerVerdict& verdict, const std::atomic<bool>& abortFlag,
            std::function<std::string(Deadline)> look)
      : verdict_(verdict), abortFlag_(abortFlag), look_(std::move(look)), thread_([this] { run(); }) {}
  ~PeerWatch() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    wake_.notify_one();
    thread_.join();
  }
  PeerWatch(const PeerWatch&) = delete;
  PeerWatch& operator=(const PeerWatch&) = delete;

  // Why the peer will not come ("" if nothing was found, or not yet).
  std::string reason() {
    std::lock_guard<std::mutex> lock(mutex_);
    return reason_;
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    if (wake_.wait_for(lock, std::chrono::milliseconds(kFirstLookMs), [this] { return done_; })) return;
    for (;;) {
      lock.unlock();
      std::string found = look_(Deadline::afterMs(kLookMs).cancelledBy(&abortFlag_));
      lock.lock();
      if (done_) return;
      if (!found.empty()) {
        reason_ = found;
        verdict_.why = std::move(found);  // before the flag that publishes it
        verdict_.willNotCome.store(true, std::memory_order_release);
        return;
      }
      if (wake_.wait_for(lock, std::chrono::milliseconds(kLookEveryMs), [this] { return done_; })) return;
    }
  }

  ConnectionTable::PeerVerdict& verdict_;
  const std::atomic<bool>& abortFlag_;
  const std::function<std::string(Deadline)> look_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool done_ = false;
  std::string reason_;
  std::thread thread_;  // last: it starts once the rest is made
};

}  // namespace

ConnectionTable::ConnectionTable(uint64_t commId, int rank, const std::vector<PeerInfo>& peers, std::string secret,
                                 const std::atomic<bool>& abortFlag)
    : commId_(commId), rank_(rank), peers_(peers), secret_(std::move(secret)), abortFlag_(abortFlag) {}

Result<Connection*> ConnectionTable::to(int peer, uint16_t channel, bool unlessWaiting) {
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
  opts.deadline = Deadline::afterMs(params().initTimeoutMs).cancelledBy(&abortFlag_);
  auto willNotConnect = [&](const std::string& why) {
    return remoteError("connecting to rank ", peer, " (host ", peers_[peer].hostname, ") over ", transport->name(),
                       ": rank ", peer, " will not connect: ", why);
  };
  std::optional<PeerWatch> watch;
  if (peer != rank_) {
    PeerVerdict& verdict = verdictOn(peer);
    if (verdict.willNotCome.load(std::memory_order_acquire)) return willNotConnect(verdict.why);
    opts.deadline = opts.deadline.alsoCancelledBy(&verdict.willNotCome);
    watch.emplace(verdict, abortFlag_,
                  [this, peer](Deadline deadline) { return whyPeerWillNotCome(peer, deadline); });
  }
  Result<std::unique_ptr<Connection>> made = transport->connect(ckey, opts);
  const std::string whyNot = watch ? watch->reason() : std::string();
  watch.reset();
  if (!made.isOk() && !whyNot.empty()) return willNotConnect(whyNot);
  SHOAL_ASSIGN_OR_RETURN(auto conn, std::move(made),
      "connecting to rank ", peer, " (host ", peers_[peer].hostname, ") over ", transport->name());
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

std::string ConnectionTable::whyPeerWillNotCome(int peer, Deadline deadline) const {
  if (peerReports_)
    if (std::string report = peerReports_(peer, deadline); !report.empty()) return "it failed: " + report;
  return peerProcessGone(peers_[peer], deadline);
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

Status ConnectionTable::forPlan(const Plan& plan, std::vector<Connection*>& laneConnections) {
  laneConnections.resize(plan.lanes.size());
  for (size_t i = 0; i < plan.lanes.size(); ++i) {
    SHOAL_ASSIGN_OR_RETURN(laneConnections[i], to(plan.lanes[i].peer, plan.lanes[i].channel));
  }
  return Status::ok();
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

void ConnectionTable::publishFailure(std::string_view report) {
  std::lock_guard<std::mutex> lock(mapMutex_);
  for (auto& [key, connection] : connections_) connection->publishFailure(report);
}

std::string ConnectionTable::peerFailure(int peer, Deadline deadline) const {
  std::vector<Connection*> carriers;
  {
    std::lock_guard<std::mutex> lock(mapMutex_);
    for (const auto& [key, connection] : connections_)
      if (key.first == peer && connection->carriesFailureReports()) carriers.push_back(connection.get());
  }
  if (carriers.empty()) return {};
  Backoff backoff;
  while (true) {
    for (Connection* c : carriers)
      if (std::string report = c->peerFailure(); !report.empty()) return report;
    if (deadline.expired()) return {};
    backoff.pause();
  }
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
