#include "comm/connection_table.h"

#include "core/log.h"
#include "core/params.h"
#include "transports/registry.h"

namespace shoal {

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
  SHOAL_ASSIGN_OR_RETURN(auto conn, transport->connect(ckey, opts),
      "connecting to rank ", peer, " (host ", peers_[peer].hostname, ") over ", transport->name());
  SHOAL_INFO(subsys::kInit | subsys::kNet, "Channel ",
             channel == kP2pChannel ? std::string("p2p") : std::to_string(channel), " : ", rank_,
             " -> ", peer, " via ", transport->name());
  Connection* raw = conn.get();
  std::lock_guard<std::mutex> lock(mapMutex_);
  connections_.emplace(key, std::move(conn));
  return raw;
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
