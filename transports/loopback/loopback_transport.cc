#include "transports/loopback/loopback_transport.h"

#include <unistd.h>

#include <cstdlib>
#include <algorithm>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <tuple>

#include "core/params.h"
#include "cuda/driver.h"
#include "transports/loopback/loopback_connection.h"

namespace shoal {
namespace {

std::mutex gFaultMutex;
LoopbackFaults gFaults;
bool gFaultsLoaded = false;

LoopbackFaults currentFaults() {
  std::lock_guard<std::mutex> lock(gFaultMutex);
  if (!gFaultsLoaded) {
    auto parsed = LoopbackFaults::parse(params().loopbackFaults);
    if (parsed.isOk()) gFaults = parsed.value();
    gFaultsLoaded = true;
  }
  return gFaults;
}

std::string describePeer(const PeerInfo* peer, int rank) {
  if (peer) return str("rank ", peer->rank, " (host ", peer->hostname, ", loopback)");
  return str("rank ", rank, " (loopback)");
}

class LoopbackTransport final : public Transport {
 public:
  std::string_view name() const override { return "loopback"; }
  LinkClass linkClass() const override { return LinkClass::kLoopback; }
  // In a process that uses CUDA, device buffers are copied by the GPU.
  bool movesDeviceMemory() const override { return cuda::Driver::inUse() != nullptr; }
  Result<std::string> localAddress() override { return std::string(); }
  bool canConnect(const PeerInfo& self, const PeerInfo& peer) const override {
    return self.sameProcess(peer);
  }
  Result<std::unique_ptr<Connection>> connect(const ConnectionKey& key,
                                              const ConnectOptions& options) override {
    std::string desc = describePeer(options.peer, key.peerRank);
    if (key.selfRank == key.peerRank) {
      auto pipe = std::make_shared<LoopbackPipe>(currentFaults(), cuda::Driver::inUse());
      pipe->closed[1] = false;
      return std::unique_ptr<Connection>(
          std::make_unique<LoopbackConnection>(pipe, 0, 0, 0, std::move(desc)));
    }
    int low = std::min(key.selfRank, key.peerRank);
    int high = std::max(key.selfRank, key.peerRank);
    auto mapKey = std::make_tuple(key.commId, low, high, key.channel);
    // A stream ring where every rank agreed on stream links and this GPU's
    // streams run stream plans: then so do the peer's (the agreement), and
    // both ends have it or the connection fails (every connection of a rank
    // has a ring or none, or the ranks' plans would differ).
    cuda::Driver* driver = cuda::Driver::inUse();
    const bool ring = options.streamLinks && driver != nullptr && options.self != nullptr &&
                      !options.self->gpu.empty() && driver->streamPlansWanted(options.self->gpu);
    cuda::ContextHandle context = nullptr;
    std::optional<cuda::ContextScope> scope;
    if (ring) {
      SHOAL_ASSIGN_OR_RETURN(context, driver->primaryContext(options.self->gpu), "loopback to ", desc);
      scope.emplace(*driver, context);
      SHOAL_TRY(scope->status()) << "loopback to " << desc;
    }
    // A failure on either end fails the pipe (and breaks its ring), so the
    // other end's operations fail at once rather than at their deadline.
    std::shared_ptr<LoopbackPipe> pipe;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = pending_.find(mapKey);
      if (it == pending_.end() && ended_.count({key.commId, key.peerRank}) != 0) {
        // Nobody would take a pipe made now (messages sent on its ring
        // would wait there for good): the peer is gone.
        return remoteError("loopback to ", desc, ": its communicator ended (destroyed or aborted) before it "
                           "connected to this rank");
      }
      if (it == pending_.end()) {
        pipe = std::make_shared<LoopbackPipe>(currentFaults(), driver);
        pipe->madeBy = key.selfRank;
        pipe->forget = [this, mapKey, raw = pipe.get()] {
          std::lock_guard<std::mutex> lock(mutex_);
          if (auto found = pending_.find(mapKey); found != pending_.end() && found->second.get() == raw)
            pending_.erase(found);
        };
        pipe->attached[key.selfRank == low ? 0 : 1] = true;  // not shared yet
        pending_.emplace(mapKey, pipe);
        if (ring) {
          const uint64_t bytes = std::clamp<int64_t>(params().loopbackRingBytes, 64 << 10, 1ll << 30);
          if (Status made = pipe->makeRing(context, bytes); !made.isOk()) {
            made = StatusBuilder(std::move(made)) << "loopback to " << desc;
            pipe->fail(made);
            return made;
          }
        }
      } else if (Status own = it->second->failed(); it->second->madeBy == key.selfRank && !own.isOk()) {
        // This end's own pipe, failed when it made it, kept for the peer to find.
        return StatusBuilder(std::move(own)) << "loopback to " << desc << ": an earlier connect failed";
      } else {
        pipe = it->second;
        pending_.erase(it);  // both sides have it now
        // Marked before the lock goes: the first end's close then keeps
        // the ring's memory for this one.
        std::lock_guard<std::mutex> pipeLock(pipe->mutex);
        pipe->attached[key.selfRank == low ? 0 : 1] = true;
      }
    }
    if (Status theirs = pipe->failed(); !theirs.isOk())
      return StatusBuilder(std::move(theirs)) << "loopback to " << desc << ": the peer's end failed";
    if (ring != (pipe->ring() != nullptr)) {
      Status st = invalidUsage("loopback to ", desc, ": one end has a stream ring and the other none (the ranks must "
                               "agree on stream links: SHOAL_CUDA_STREAM_PLANS, SHOAL_CUDA_WAIT alike on every rank)");
      pipe->fail(st);
      return st;
    }
    int side = key.selfRank == low ? 0 : 1;
    // Side 0 sends on direction 0 and receives on direction 1.
    auto connection = std::make_unique<LoopbackConnection>(pipe, side, side, 1 - side, std::move(desc));
    if (ring) {
      if (Status attached = connection->attachRing(*driver, context); !attached.isOk()) {
        pipe->fail(attached);
        return attached;
      }
    }
    return std::unique_ptr<Connection>(std::move(connection));
  }

  // Rank `rank` of `commId` ends: the pipes its peers made for it and it
  // never took go, closed on its side (a peer still waiting on one fails;
  // messages left there for it go with the ring's memory).
  void forgetRank(uint64_t commId, int rank) override {
    std::vector<std::shared_ptr<LoopbackPipe>> dropped;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (ended_.insert({commId, rank}).second) endedOrder_.emplace_back(commId, rank);
      if (endedOrder_.size() > kEndedKept) {
        ended_.erase(endedOrder_.front());
        endedOrder_.pop_front();
      }
      for (auto it = pending_.begin(); it != pending_.end();) {
        const auto& [id, low, high, channel] = it->first;
        const int side = rank == low ? 0 : 1;
        if (id == commId && (rank == low || rank == high) && it->second->madeBy != rank) {
          std::lock_guard<std::mutex> pipeLock(it->second->mutex);
          if (!it->second->attached[side]) {
            it->second->closed[side] = true;
            dropped.push_back(std::move(it->second));
            it = pending_.erase(it);
            continue;
          }
        }
        ++it;
      }
    }
    // Freed here, out of the transport's lock, unless the maker's end still holds one.
  }

 private:
  std::mutex mutex_;
  std::map<std::tuple<uint64_t, int, int, uint16_t>, std::shared_ptr<LoopbackPipe>> pending_;
  // Ranks whose communicator ended (forgetRank), the most recent kEndedKept:
  // a connect to one fails at once instead of making a pipe nobody takes.
  static constexpr size_t kEndedKept = 256;
  std::set<std::pair<uint64_t, int>> ended_;
  std::deque<std::pair<uint64_t, int>> endedOrder_;
};

}  // namespace

Result<LoopbackFaults> LoopbackFaults::parse(const std::string& spec) {
  LoopbackFaults f;
  size_t pos = 0;
  while (pos < spec.size()) {
    size_t comma = spec.find(',', pos);
    std::string item = spec.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    pos = comma == std::string::npos ? spec.size() : comma + 1;
    if (item.empty()) continue;
    size_t eq = item.find('=');
    if (eq == std::string::npos) return invalidArgument("loopback fault '", item, "' needs =value");
    std::string name = item.substr(0, eq);
    char* end = nullptr;
    long long v = std::strtoll(item.c_str() + eq + 1, &end, 0);
    if (!end || *end != '\0') return invalidArgument("loopback fault '", item, "': bad number");
    // The delay is added to the clock in ns: refuse what would overflow it.
    if (name == "delay_us" && v > INT64_MAX / 2000)
      return invalidArgument("loopback fault '", item, "': delay too large");
    if (name == "delay_us") f.delayUs = v;
    else if (name == "reorder_seed") f.reorderSeed = static_cast<uint64_t>(v);
    else if (name == "fail_nth") f.failNth = v;
    else if (name == "blackhole_nth") f.blackholeNth = v;
    else return invalidArgument("unknown loopback fault '", name, "'");
  }
  return f;
}

std::unique_ptr<Transport> makeLoopbackTransport() { return std::make_unique<LoopbackTransport>(); }

std::pair<std::unique_ptr<Connection>, std::unique_ptr<Connection>> makeLoopbackPair(
    const std::string& descriptionA, const std::string& descriptionB,
    const LoopbackFaults& faults) {
  auto pipe = std::make_shared<LoopbackPipe>(faults, cuda::Driver::inUse());
  pipe->attached[0] = pipe->attached[1] = true;  // both ends made here
  // a's description names its peer, b.
  return {std::make_unique<LoopbackConnection>(pipe, 0, 0, 1, descriptionB),
          std::make_unique<LoopbackConnection>(pipe, 1, 1, 0, descriptionA)};
}

void setLoopbackFaults(const LoopbackFaults& faults) {
  std::lock_guard<std::mutex> lock(gFaultMutex);
  gFaults = faults;
  gFaultsLoaded = true;
}

}  // namespace shoal
