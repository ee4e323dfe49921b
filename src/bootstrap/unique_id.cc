// ncclUniqueId contents, and the process-wide registry of bootstrap roots.
//
// Layout of the 128 bytes (version 1, integers little-endian):
//   [0, 8)     magic
//   [8, 12)    layout tag "SHID"
//   [12]       layout version (1)
//   [13]       address family: 4 or 6
//   [14, 16)   root port
//   [16, 20)   IPv6 scope id (0 for IPv4)
//   [20, 36)   root address (IPv4 in the first 4 bytes, the rest zero)
//   [36, 68)   secret
//   [68, 128)  zero
// decodeUniqueId() checks every field and every padding byte.
//
// Roots: all random ids of a process share one RootServer on the chosen
// interface (one thread, one listener); an NCCL_COMM_ID id gets a RootServer
// at its exact address, started by startRootIfNeeded(). The registry is a
// leaked heap object, as the servers are (root_server.h). A forked child
// starts roots of its own: the ones it inherited have no thread in it.
#include <pthread.h>

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>

#include "bootstrap/bootstrap.h"
#include "bootstrap/root_server.h"
#include "core/byte_order.h"
#include "core/log.h"
#include "core/params.h"
#include "net/crypto.h"
#include "net/interfaces.h"
#include "net/socket_address.h"

namespace shoal {
namespace {

constexpr uint64_t kCommIdMagic = 0x0280028002800280ull;  // NCCL_MAGIC
constexpr uint32_t kLayoutTag = 0x44494853;               // "SHID"
constexpr uint8_t kLayoutVersion = 1;


// The secret of an NCCL_COMM_ID id: anyone who knows the address can derive
// it, exactly as NCCL's constant magic (NCCL_COMM_ID is a trusted-network mode).
void commIdSecret(const std::string& canonicalAddress, uint8_t out[32]) {
  net::Sha256 h;
  h.update("shoal NCCL_COMM_ID v1");
  h.update(canonicalAddress);
  net::Digest d = h.finish();
  std::memcpy(out, d.data(), 32);
}

struct Registry {
  std::mutex mutex;
  RootServer* defaultServer = nullptr;                // random ids
  std::map<std::string, RootServer*> commIdServers;   // address -> root
};

// Never destroyed: the roots outlive static destructors.
std::atomic<Registry*> gRegistry{nullptr};

// Fork: the child gets a registry of its own, since an id it made from an
// inherited root would name a root nobody serves there. Where the registry
// was free at the fork (taken, not waited for, before it: a wait there
// could deadlock with a thread that holds it and registers a fork handler),
// the child keeps the NCCL_COMM_ID roots, which the parent still serves at
// their fixed address, and closes its copies of every inherited listener
// (so that once the parent is gone, a connect to them is refused, not left
// unanswered); otherwise it starts from nothing.
bool gHeldForFork = false;
void holdRegistryForFork() { gHeldForFork = gRegistry.load()->mutex.try_lock(); }
void releaseRegistryInParent() {
  if (gHeldForFork) gRegistry.load()->mutex.unlock();
}
void renewRegistryInChild() {
  Registry* inherited = gRegistry.load();
  auto* fresh = new Registry();
  if (gHeldForFork) {
    inherited->mutex.unlock();  // held by this thread's copy (the prepare handler)
    if (inherited->defaultServer != nullptr) inherited->defaultServer->closeListenerInForkedChild();
    for (auto& entry : inherited->commIdServers) entry.second->closeListenerInForkedChild();
    fresh->commIdServers = inherited->commIdServers;
  }
  gRegistry.store(fresh);
}

Registry& registry() {
  static const bool once = [] {
    gRegistry.store(new Registry());
    return pthread_atfork(holdRegistryForFork, releaseRegistryInParent, renewRegistryInChild) == 0;
  }();
  (void)once;
  return *gRegistry.load();
}

}  // namespace

void encodeUniqueId(const UniqueIdContents& id, char out[UniqueIdContents::kBytes]) {
  uint8_t* p = reinterpret_cast<uint8_t*>(out);
  std::memset(p, 0, UniqueIdContents::kBytes);
  Result<net::SocketAddress> parsed = net::SocketAddress::parse(id.address);
  SHOAL_CHECK(parsed.isOk(), "unique id address '", id.address, "' is not numeric");
  const net::SocketAddress& address = parsed.value();
  putLe(p, id.magic, 8);
  putLe(p + 8, kLayoutTag, 4);
  p[12] = kLayoutVersion;
  putLe(p + 14, address.port(), 2);
  if (address.family() == AF_INET) {
    p[13] = 4;
    std::memcpy(p + 20, &reinterpret_cast<const sockaddr_in*>(address.raw())->sin_addr, 4);
  } else {
    p[13] = 6;
    const auto* sin6 = reinterpret_cast<const sockaddr_in6*>(address.raw());
    putLe(p + 16, sin6->sin6_scope_id, 4);
    std::memcpy(p + 20, sin6->sin6_addr.s6_addr, 16);
  }
  std::memcpy(p + 36, id.secret, 32);
}

Result<UniqueIdContents> decodeUniqueId(const char in[UniqueIdContents::kBytes]) {
  const uint8_t* p = reinterpret_cast<const uint8_t*>(in);
  auto bad = [](std::string_view why) { return invalidArgument("ncclUniqueId is not valid: ", why); };
  if (getLe(p + 8, 4) != kLayoutTag) return bad("not a Shoal id (unknown layout tag)");
  if (p[12] != kLayoutVersion) return bad(str("unsupported layout version ", int(p[12])));
  uint16_t port = static_cast<uint16_t>(getLe(p + 14, 2));
  if (port == 0) return bad("root port is 0");
  for (size_t i = 68; i < UniqueIdContents::kBytes; ++i)
    if (p[i] != 0) return bad("trailing bytes are not zero");
  net::SocketAddress address;
  if (p[13] == 4) {
    if (getLe(p + 16, 4) != 0) return bad("IPv4 id with a scope id");
    for (int i = 24; i < 36; ++i)
      if (p[i] != 0) return bad("IPv4 address padding is not zero");
    address = net::SocketAddress::fromIpv4(p + 20, port);
  } else if (p[13] == 6) {
    address = net::SocketAddress::fromIpv6(p + 20, port, static_cast<uint32_t>(getLe(p + 16, 4)));
  } else {
    return bad(str("unknown address family ", int(p[13])));
  }
  UniqueIdContents id;
  id.magic = getLe(p, 8);
  std::memcpy(id.secret, p + 36, 32);
  id.address = address.toString();
  return id;
}

Result<UniqueIdContents> createUniqueId() {
  const Params& p = params();
  UniqueIdContents id;
  if (!p.commId.empty()) {
    Result<net::SocketAddress> address = net::SocketAddress::resolve(p.commId);
    if (!address.isOk()) return address.takeStatus().withContext("NCCL_COMM_ID");
    // Every rank must reach the root at this address: a port chosen by the
    // kernel (0) could not be known to them, and the id would be refused.
    if (address.value().port() == 0)
      return invalidArgument("NCCL_COMM_ID=", p.commId, ": the root's port is 0 (give a fixed port)");
    id.magic = kCommIdMagic;
    id.address = address.value().toString();
    commIdSecret(id.address, id.secret);
    return id;  // the root starts in rank 0's init (startRootIfNeeded)
  }
  Registry& reg = registry();
  RootServer* server;
  {
    std::lock_guard<std::mutex> lock(reg.mutex);
    if (reg.defaultServer == nullptr) {
      SHOAL_ASSIGN_OR_RETURN(net::NetInterface itf, net::chooseInterface());
      Result<RootServer*> started = RootServer::start(itf.address, /*fixedPort=*/false);
      if (!started.isOk()) return started.takeStatus().withContext("starting the bootstrap root");
      reg.defaultServer = started.value();
    }
    server = reg.defaultServer;
  }
  do {
    SHOAL_TRY(net::randomBytes(&id.magic, sizeof(id.magic)));
  } while (id.magic == kCommIdMagic || id.magic == 0);
  SHOAL_TRY(net::randomBytes(id.secret, sizeof(id.secret)));
  id.address = server->address().toString();
  server->addTenant(id.magic, id.secret);
  return id;
}

RootServer* processRootServer() {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  return reg.defaultServer;
}

bool isSharedId(const UniqueIdContents& id) { return id.magic == kCommIdMagic; }

Status startRootIfNeeded(const UniqueIdContents& id) {
  if (id.magic != kCommIdMagic) return Status::ok();
  Result<net::SocketAddress> address = net::SocketAddress::resolve(id.address);
  if (!address.isOk()) return address.takeStatus().withContext("NCCL_COMM_ID root");
  std::string canonical = address.value().toString();
  uint8_t expected[32];
  commIdSecret(canonical, expected);
  if (!net::constantTimeEqual(expected, id.secret, 32))
    return invalidArgument("ncclUniqueId has NCCL_COMM_ID's magic but not its secret");
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  if (reg.commIdServers.count(canonical)) return Status::ok();
  Result<RootServer*> started =
      RootServer::start(address.value(), /*fixedPort=*/true, id.magic, id.secret);
  if (!started.isOk())
    return started.takeStatus().withContext(str("NCCL_COMM_ID=", canonical, ": cannot start the bootstrap root"));
  reg.commIdServers[canonical] = started.value();
  return Status::ok();
}

}  // namespace shoal
