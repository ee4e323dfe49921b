#include "transports/shm/shm_transport.h"

#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>

#include "core/log.h"
#include "core/params.h"
#include "core/process.h"
#include "memory/shared_memory.h"
#include "net/crypto.h"
#include "transports/shm/shm_connection.h"

namespace shoal {
namespace shm {

std::string formatAddress(const Address& a) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), "%d:%s:%" PRIx64 ":%" PRIx64, a.pid, a.bootId.c_str(), a.probeAddress,
                a.probeValue);
  return buf;
}

Result<Address> parseAddress(std::string_view text) {
  Address a;
  char boot[64] = {};
  std::string s(text);
  if (std::sscanf(s.c_str(), "%d:%63[^:]:%" SCNx64 ":%" SCNx64, &a.pid, boot, &a.probeAddress,
                  &a.probeValue) != 4 ||
      a.pid <= 0)
    return invalidArgument("malformed shm address '", text, "'");
  a.bootId = boot;
  return a;
}

}  // namespace shm

namespace {

std::string readBootId() {
  std::string id = localKernelId();
  return id.empty() ? std::string("unknown") : id;
}

// Whether this process can read `peer`'s memory with process_vm_readv
// (ptrace permissions, Yama, containers, seccomp all decide).
shm::CmaAbility probeSingleCopy(const shm::Address& peer) {
  if (!params().shmCma) return shm::CmaAbility::kNo;
  uint64_t value = 0;
  iovec local{&value, sizeof(value)};
  iovec remote{reinterpret_cast<void*>(peer.probeAddress), sizeof(value)};
  ssize_t got = process_vm_readv(peer.pid, &local, 1, &remote, 1, 0);
  bool ok = got == static_cast<ssize_t>(sizeof(value)) && value == peer.probeValue;
  if (!ok)
    SHOAL_INFO(subsys::kShm | subsys::kInit, "single-copy reads from pid ", peer.pid,
               " are not possible (", got < 0 ? std::strerror(errno) : "probe mismatch",
               "): large messages go through the shared-memory segment");
  return ok ? shm::CmaAbility::kYes : shm::CmaAbility::kNo;
}

// Single copy (the receiver's process_vm_readv) against the ring's two
// copies, which sender and receiver make at once on their own cores: it pays
// only where the kernel's remote read runs near memcpy speed
// (memory::remoteReadsPay). On the 2-core development VM it did not, and
// messages through the ring were 2.5-5x faster than single copy at every
// size from 64 KiB to 64 MiB (ring AllReduce and AllGather, 2 ranks; malloc
// and ncclMemAlloc buffers alike).
uint64_t autoSingleCopyMinBytes() {
  constexpr uint64_t kWhenFast = 64 * 1024;
  return memory::remoteReadsPay() ? kWhenFast : UINT64_MAX;
}

std::string describePeer(const ConnectionKey& key, const ConnectOptions& options, int pid) {
  std::string host = options.peer && !options.peer->hostname.empty() ? options.peer->hostname : "?";
  return str("rank ", key.peerRank, " (host ", host, ", shm pid ", pid, ")");
}

// Both ranks published shm addresses with one boot id (one kernel).
bool sameBootId(const PeerInfo& self, const PeerInfo& peer) {
  const std::string* mine = self.address("shm");
  const std::string* theirs = peer.address("shm");
  if (!mine || !theirs) return false;
  auto a = shm::parseAddress(*mine);
  auto b = shm::parseAddress(*theirs);
  return a.isOk() && b.isOk() && a.value().bootId == b.value().bootId;
}

class ShmTransport final : public Transport {
 public:
  std::string_view name() const override { return "shm"; }
  LinkClass linkClass() const override { return LinkClass::kShm; }
  bool readsPeerMemory(const PeerInfo& peer) const override { return canReadPeerMemory(peer); }

  Result<std::string> localAddress() override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (address_.empty()) {
      shm::removeStaleSegments();
      uint64_t value = 0;
      SHOAL_TRY(net::randomBytes(&value, sizeof(value))) << "shm probe value";
      probe_ = value | 1;
      address_ = shm::formatAddress(
          {currentPid(), readBootId(), reinterpret_cast<uint64_t>(&probe_), probe_});
    }
    return address_;
  }

  bool canConnect(const PeerInfo& self, const PeerInfo& peer) const override {
    if (params().shmDisable || self.hostId != peer.hostId || self.processId == peer.processId) return false;
    return sameBootId(self, peer);
  }

  Result<std::unique_ptr<Connection>> connect(const ConnectionKey& key, const ConnectOptions& options) override {
    const std::string* text = options.peer ? options.peer->address("shm") : nullptr;
    if (!text) return invalidUsage("rank ", key.peerRank, " published no shm address");
    SHOAL_ASSIGN_OR_RETURN(shm::Address peer, shm::parseAddress(*text), "connecting to rank ", key.peerRank);
    const Params& p = params();
    shm::ConnectionSetup setup;
    setup.side = key.selfRank < key.peerRank ? 0 : 1;
    int creatorPid = setup.side == 0 ? currentPid() : peer.pid;
    setup.segmentName = shm::segmentName(creatorPid, key.commId, std::min(key.selfRank, key.peerRank),
                                         std::max(key.selfRank, key.peerRank), key.channel);
    setup.secret = options.secret;
    setup.peerPid = peer.pid;
    setup.selfCanRead = probeSingleCopy(peer);
    setup.cmaMinBytes = p.shmCmaMinBytes >= 0 ? static_cast<uint64_t>(std::max<int64_t>(p.shmCmaMinBytes, 1))
                                              : autoSingleCopyMinBytes();
    setup.attachDeadline = options.attachDeadline;
    setup.peerDescription = describePeer(key, options, peer.pid);
    if (setup.side == 0) {
      auto created = shm::Segment::create(setup.segmentName, shm::ringBytesFor(p.shmFifoBytes), setup.secret,
                                          setup.selfCanRead);
      SHOAL_ASSIGN_OR_RETURN(setup.segment, std::move(created), "shm connection to ", setup.peerDescription);
    }
    return std::unique_ptr<Connection>(std::make_unique<shm::ShmConnection>(std::move(setup)));
  }

 private:
  std::mutex mutex_;
  std::string address_;
  uint64_t probe_ = 0;
};

}  // namespace

std::unique_ptr<Transport> makeShmTransport() { return std::make_unique<ShmTransport>(); }


bool canReadPeerMemory(const PeerInfo& peer) {
  const std::string* text = peer.address("shm");
  if (!text) return false;
  auto address = shm::parseAddress(*text);
  if (!address.isOk()) return false;
  static std::mutex mutex;
  static std::map<std::pair<int, uint64_t>, bool> verdicts;  // (pid, probe value)
  std::lock_guard<std::mutex> lock(mutex);
  auto key = std::make_pair(address.value().pid, address.value().probeValue);
  auto it = verdicts.find(key);
  if (it == verdicts.end())
    it = verdicts.emplace(key, probeSingleCopy(address.value()) == shm::CmaAbility::kYes).first;
  return it->second;
}

}  // namespace shoal
