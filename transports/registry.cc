#include "transports/registry.h"

#include <memory>
#include <mutex>
#include <strings.h>

#include "core/log.h"
#include "core/params.h"
#include "transports/loopback/loopback_transport.h"
#include "transports/shm/shm_transport.h"
#include "transports/tcp/tcp_transport.h"

namespace shoal {
namespace {

struct Registry {
  std::vector<std::unique_ptr<Transport>> owned;
  std::vector<Transport*> ordered;
  Registry() {
    owned.push_back(makeLoopbackTransport());
    owned.push_back(makeShmTransport());
    owned.push_back(makeTcpTransport());
    for (auto& t : owned) ordered.push_back(t.get());
  }
};

Registry& registry() {
  static Registry* r = new Registry();  // lives for the process (transports own listeners)
  return *r;
}

}  // namespace

const std::vector<Transport*>& allTransports() { return registry().ordered; }

Transport* findTransport(std::string_view name) {
  for (Transport* t : allTransports())
    if (t->name() == name) return t;
  return nullptr;
}

Status publishAddresses(PeerInfo& self) {
  self.addresses.clear();
  for (Transport* t : allTransports()) {
    auto addr = t->localAddress();
    if (!addr.isOk()) {
      SHOAL_INFO(subsys::kInit | subsys::kNet, "transport ", t->name(),
                 " unavailable: ", addr.status().message());
      continue;
    }
    self.addresses.emplace_back(std::string(t->name()), addr.value());
  }
  return Status::ok();
}

Result<Transport*> selectTransport(const PeerInfo& self, const PeerInfo& peer) {
  const Params& p = params();
  std::string forced = p.transport;
  bool otherHost = self.hostId != peer.hostId;
  if (forced.empty() && otherHost && !p.net.empty()) {
    if (strcasecmp(p.net.c_str(), "Socket") == 0) forced = "tcp";
    else
      return invalidArgument("NCCL_NET=", p.net, " is not a network Shoal has (known: Socket)");
  }
  if (!forced.empty()) {
    Transport* t = findTransport(forced);
    if (!t) return invalidArgument("SHOAL_TRANSPORT=", forced, " names no transport (known: loopback, shm, tcp)");
    if (!t->canConnect(self, peer))
      return invalidUsage("forced transport ", forced, " cannot reach rank ", peer.rank, " (host ",
                          peer.hostname, ")");
    return t;
  }
  for (Transport* t : allTransports())
    if (t->canConnect(self, peer)) return t;
  return remoteError("no transport can reach rank ", peer.rank, " (host ", peer.hostname,
                     "): it publishes ", peer.addresses.size(), " addresses");
}

}  // namespace shoal
