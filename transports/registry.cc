#include "transports/registry.h"

#include <pthread.h>
#include <strings.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>

#include "core/log.h"
#include "core/params.h"
#include "memory/known_ranges.h"
#include "transports/cuda_ipc/cuda_ipc_transport.h"
#include "transports/loopback/loopback_transport.h"
#include "transports/ofi/ofi_transport.h"
#include "transports/shm/shm_transport.h"
#include "transports/tcp/tcp_transport.h"

namespace shoal {
namespace {

struct Registry {
  std::vector<std::unique_ptr<Transport>> owned;
  std::vector<Transport*> ordered;
  Transport* toSelf = nullptr;
  std::mutex mutex;
  std::map<std::string, std::string> unavailable;  // transport -> why localAddress() failed
  Registry() {
    owned.push_back(makeLoopbackTransport());
    toSelf = owned.back().get();
    owned.push_back(makeShmTransport());
    owned.push_back(makeCudaIpcTransport());
    owned.push_back(makeOfiTransport());
    owned.push_back(makeTcpTransport());
    for (auto& t : owned) ordered.push_back(t.get());
  }
};

// Lives for the process (transports own listeners). A forked child gets
// transports of its own, made in the fork's child handler (only the forking
// thread runs there): the inherited ones hold the parent's listeners, its
// shm address (its pid) and connections, and have no thread in the child.
// They are closed to traffic and left (never freed: destroying one could
// end what the parent still uses, such as its shm segments).
std::atomic<Registry*> gRegistry{nullptr};

void renewRegistryInChild() {
  Registry* inherited = gRegistry.load(std::memory_order_relaxed);
  for (auto& t : inherited->owned) t->closeInForkedChild();
  gRegistry.store(new Registry(), std::memory_order_relaxed);
}

Registry& registry() {
  static const bool once = [] {
    gRegistry.store(new Registry());
    return pthread_atfork(nullptr, nullptr, renewRegistryInChild) == 0;
  }();
  (void)once;
  return *gRegistry.load(std::memory_order_relaxed);
}

// Why a transport could not start in this process ("" if it did or was not tried).
std::string unavailable(const Transport& t) {
  std::lock_guard<std::mutex> lock(registry().mutex);
  auto it = registry().unavailable.find(std::string(t.name()));
  return it == registry().unavailable.end() ? std::string() : it->second;
}

}  // namespace

const std::vector<Transport*>& allTransports() { return registry().ordered; }

Transport* transportToSelf() { return registry().toSelf; }

void forgetRank(uint64_t commId, int rank) {
  for (Transport* t : allTransports()) t->forgetRank(commId, rank);
}

void rememberMemory(const void* base, size_t bytes) { memory::rememberRange(base, bytes); }

void forgetMemory(void* base, size_t bytes) {
  memory::forgetRange(base, bytes);
  for (Transport* t : allTransports()) t->forgetMemory(base, bytes);
}

Transport* findTransport(std::string_view name) {
  for (Transport* t : allTransports())
    if (t->name() == name) return t;
  return nullptr;
}

Transport::ProcessProbe probePeerProcess(const PeerInfo& self, const PeerInfo& peer, Deadline deadline) {
  for (const Transport* t : allTransports()) {
    if (deadline.expired()) break;
    if (peer.address(t->name()) == nullptr) continue;
    Transport::ProcessProbe probe = t->probePeerProcess(self, peer, deadline);
    if (probe.state != Transport::ProcessProbe::kUnknown) return probe;
  }
  return {};
}

void tidyTransports() {
  // Every communicator's idle check asks; once per half second is enough.
  static std::mutex mutex;
  static int64_t lastNs = 0;
  std::unique_lock<std::mutex> lock(mutex, std::try_to_lock);
  if (!lock.owns_lock() || (lastNs != 0 && nowNs() - lastNs < kTidyEveryMs * 1000000)) return;
  lastNs = nowNs();
  for (Transport* t : allTransports()) t->tidy();
}

Status publishAddresses(PeerInfo& self, const TransportChoice& choice) {
  // A name Shoal has no network for is said at init and fails connections
  // to other hosts (selectTransport), not the start of the others.
  const Result<std::string> network = networkTransport(choice);
  const std::string named = network.isOk() ? network.value() : std::string();
  self.addresses.clear();
  for (Transport* t : allTransports()) {
    if (!t->wantedInThisProcess() && t->name() != named) continue;
    auto addr = t->localAddress();
    if (!addr.isOk()) {
      std::lock_guard<std::mutex> lock(registry().mutex);
      registry().unavailable[std::string(t->name())] = addr.status().message();
      SHOAL_INFO(subsys::kInit | subsys::kNet, "transport ", t->name(),
                 " unavailable: ", addr.status().message());
      continue;
    }
    self.addresses.emplace_back(std::string(t->name()), addr.value());
  }
  return Status::ok();
}

namespace {
// The setting that names the network, as the user wrote it
// ("NCCL_NET=Socket"), or "" where none does.
std::string networkSetting(const TransportChoice& choice) {
  if (!params().net.empty()) return str("NCCL_NET=", params().net);
  return choice.net.empty() ? std::string() : str("ncclConfig_t.netName=", choice.net);
}
}  // namespace

Result<std::string> networkTransport(const TransportChoice& choice) {
  if (!params().transport.empty()) return std::string();  // SHOAL_TRANSPORT forces every peer's
  const std::string& name = params().net.empty() ? choice.net : params().net;
  if (name.empty()) return std::string();
  if (strcasecmp(name.c_str(), "Socket") == 0) return std::string("tcp");
  if (strcasecmp(name.c_str(), "Libfabric") == 0 || strcasecmp(name.c_str(), "OFI") == 0) return std::string("ofi");
  return invalidArgument(networkSetting(choice), " is not a network Shoal has (known: Socket, Libfabric, OFI)");
}

Result<Transport*> selectTransport(const PeerInfo& self, const PeerInfo& peer, TransportChoice choice) {
  std::string forced = params().transport;
  std::string forcedBy = str("SHOAL_TRANSPORT=", forced);  // said in errors
  if (forced.empty() && self.hostId != peer.hostId) {
    SHOAL_ASSIGN_OR_RETURN(forced, networkTransport(choice));
    forcedBy = networkSetting(choice);
  }
  if (!forced.empty()) {
    Transport* t = findTransport(forced);
    if (!t) {
      std::string known;
      for (Transport* each : allTransports()) known += str(known.empty() ? "" : ", ", each->name());
      return invalidArgument(forcedBy, ": this build of Shoal has no transport ", forced, " (known: ", known, ")");
    }
    if (auto why = unavailable(*t); !why.empty())
      return invalidUsage("forced transport ", forced, " (", forcedBy, ") cannot run in this process: ", why);
    if (!t->canConnect(self, peer))
      return invalidUsage("forced transport ", forced, " (", forcedBy, ") cannot reach rank ", peer.rank, " (host ",
                          peer.hostname, ")");
    return t;
  }
  if (choice.deviceDirect)
    for (Transport* t : allTransports())
      if (t->movesDeviceMemory() && t->canConnect(self, peer)) return t;
  for (Transport* t : allTransports())
    if (t->canConnect(self, peer) && t->chosenByDefault(self)) return t;
  return remoteError("no transport can reach rank ", peer.rank, " (host ", peer.hostname,
                     "): it publishes ", peer.addresses.size(), " addresses");
}

}  // namespace shoal
