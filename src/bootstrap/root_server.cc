#include "bootstrap/root_server.h"

#include <poll.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "bootstrap/store_protocol.h"
#include "core/log.h"
#include "core/params.h"
#include "net/crypto.h"
#include "net/fd.h"
#include "net/reject_log.h"
#include "net/socket.h"

namespace shoal {

using namespace bootstrap_wire;

namespace {

constexpr size_t kReadChunkBytes = 256 << 10;
// A connection lives as long as its communicator: buffers beyond this are
// released once empty rather than kept for that long.
constexpr size_t kIdleBufferBytes = 64 << 10;
constexpr int kMaxAcceptsPerWakeup = 64;

// A GET waiting for keys.
struct Waiter {
  uint64_t connId = 0;
  uint64_t requestId = 0;
  std::vector<std::string> keys;
  size_t missing = 0;       // keys not present when last counted
  int64_t deadlineNs = 0;   // INT64_MAX: none
};

// One id served by the root: its key space and its waiting GETs.
struct Tenant {
  uint64_t magic = 0;
  std::string key;  // HMAC key derived from the secret
  bool permanent = false;   // emptied, not dropped, when its clients leave (NCCL_COMM_ID)
  bool used = false;        // a client proved the secret since the tenant was last emptied
  size_t connections = 0;   // conns whose `tenant` is this one, in any phase
  int64_t releaseAtNs = 0;  // kept for late ranks until then (State::keepForLateRanks); 0: not kept
  std::unordered_map<std::string, std::string> values;
  std::unordered_map<uint64_t, Waiter> waiters;
  // key -> waiters that counted it missing (may name waiters already gone).
  std::unordered_map<std::string, std::vector<uint64_t>> waitingOn;
  uint64_t nextWaiterId = 1;
};

enum class Phase { kHello, kProof, kReady, kClosed };

struct Conn {
  uint64_t id = 0;
  net::Fd fd;
  net::SocketAddress peer;
  Phase phase = Phase::kHello;
  int64_t handshakeDeadlineNs = 0;
  Tenant* tenant = nullptr;
  uint8_t nonceC[kNonceBytes] = {};
  uint8_t nonceS[kNonceBytes] = {};
  uint8_t handshake[kClientHelloBytes] = {};  // hello or proof being read
  size_t handshakeHave = 0;
  std::vector<uint8_t> in;
  size_t inStart = 0;
  std::vector<uint8_t> out;
  size_t outStart = 0;
  // key -> value the root sets when this connection ends (kWill), if its
  // client's side closed it (endedByClient).
  std::unordered_map<std::string, std::string> wills;
  bool endedByClient = false;
};

// Whether a read or write that ended a connection means its client's side
// closed it (its process exited: its kernel closed the socket), rather than
// that the network failed it (a keepalive timeout: the client may be alive).
bool closedByClient(const net::IoResult& io) {
  return io.closed || io.error == ECONNRESET || io.error == EPIPE;
}

}  // namespace

struct RootServer::State {
  net::Fd listener;
  net::SocketAddress address;
  int64_t handshakeTimeoutNs = 0;
  net::LivenessOptions liveness;

  // Guards the `tenants` map (added to by any thread, erased from by the
  // server thread); Tenant contents are the server thread's.
  mutable std::mutex tenantsMutex;
  std::unordered_map<uint64_t, std::unique_ptr<Tenant>> tenants;

  // Written by the server thread, read by usage().
  std::atomic<size_t> storedValues{0};
  std::atomic<size_t> connectionCount{0};

  // Everything below is touched only by the server thread.
  std::map<uint64_t, Conn> conns;
  std::vector<uint8_t> readChunk;  // every connection reads into this
  // Waiters that have a deadline, soonest first: timers cost the same however
  // many tenants exist.
  std::set<std::tuple<int64_t, Tenant*, uint64_t>> waiterDeadlines;
  // Tenants kept after their last client for ranks not connected yet, by
  // when each goes (releaseAtNs, magic).
  std::set<std::pair<int64_t, uint64_t>> keptTenants;
  int64_t keepForLateRanksNs = 0;
  uint64_t nextConnId = 1;
  int64_t lastAcceptWarningNs = -1000000000000;  // accept failures said once a second
  int pendingHandshakes = 0;
  net::RejectLog rejects{"bootstrap root"};

  void run();
  void acceptNew();
  void service(Conn& conn, short revents);
  void readHandshake(Conn& conn);
  void onHello(Conn& conn);
  void onProof(Conn& conn);
  void readFrames(Conn& conn);
  bool handleFrame(Conn& conn, const uint8_t* data, size_t size);
  void handleSet(Conn& conn, uint64_t requestId, Reader& r);
  void handleGet(Conn& conn, uint64_t requestId, Reader& r);
  void handleErase(Conn& conn, uint64_t requestId, Reader& r);
  void handleCheck(Conn& conn, uint64_t requestId, Reader& r);
  void handleWill(Conn& conn, uint64_t requestId, Reader& r);
  void handleCancelWill(Conn& conn, uint64_t requestId, Reader& r);
  void fulfilWills(Conn& conn);
  void onKeySet(Tenant& tenant, const std::string& key);
  bool answerIfComplete(Tenant& tenant, uint64_t waiterId);
  void expire(int64_t now);
  void flush(Conn& conn);
  void close(Conn& conn, std::string_view why, bool quiet);
  void reapClosed();
  int pollTimeoutMs(int64_t now);
  void dropWaiter(Tenant& tenant, uint64_t waiterId);
  void releaseTenant(Tenant& tenant);
  void lastClientLeft(Tenant& tenant, int64_t now);
  void addTenant(uint64_t magic, const uint8_t secret[32], bool permanent);
  Tenant* findTenant(uint64_t magic);
  void reply(uint64_t connId, uint64_t requestId, uint8_t status,
             const std::vector<std::string>& strings, bool withCount);
};

RootServer::RootServer(std::unique_ptr<State> state) : state_(std::move(state)) {}

Result<RootServer*> RootServer::start(const net::SocketAddress& address, bool fixedPort,
                                      uint64_t firstMagic, const uint8_t* firstSecret) {
  auto state = std::make_unique<State>();
  net::ListenOptions options;
  options.reuseAddress = fixedPort;
  SHOAL_ASSIGN_OR_RETURN(state->listener, net::listenOn(address, options));
  SHOAL_ASSIGN_OR_RETURN(state->address, net::localAddressOf(state->listener.get()));
  // Everything the thread needs from params() and the logger is read here, in
  // the caller's thread: the server thread never touches either's reload path.
  const int64_t handshakeMs = handshakeTimeoutMs();
  state->handshakeTimeoutNs = handshakeMs * 1000000;
  state->liveness = net::LivenessOptions::fromParams();
  state->keepForLateRanksNs = std::max<int64_t>(params().initTimeoutMs, 0) * 1000000;
  (void)logEnabled(LogLevel::kWarn, subsys::kBootstrap);
  // Lives until process exit (see header); kept in a list that is never freed
  // either, so that leak checkers see it as reachable.
  auto* server = new RootServer(std::move(state));
  {
    static std::mutex listMutex;
    static auto* everyServer = new std::vector<RootServer*>();
    std::lock_guard<std::mutex> lock(listMutex);
    everyServer->push_back(server);
  }
  if (firstSecret) server->state_->addTenant(firstMagic, firstSecret, /*permanent=*/true);
  State* s = server->state_.get();
  std::thread([s] { s->run(); }).detach();
  SHOAL_INFO(subsys::kBootstrap, "bootstrap root listening on ", s->address.toString());
  return server;
}

void RootServer::addTenant(uint64_t magic, const uint8_t secret[32]) {
  state_->addTenant(magic, secret, /*permanent=*/false);
}

void RootServer::State::addTenant(uint64_t magic, const uint8_t secret[32], bool permanent) {
  std::lock_guard<std::mutex> lock(tenantsMutex);
  auto& slot = tenants[magic];
  if (!slot) {
    slot = std::make_unique<Tenant>();
    slot->magic = magic;
    slot->key = deriveKey(secret, magic);
  }
  slot->permanent = slot->permanent || permanent;
}

const net::SocketAddress& RootServer::address() const { return state_->address; }

void RootServer::closeListenerInForkedChild() { state_->listener.reset(); }

RootServer::Usage RootServer::usage() const {
  Usage u;
  {
    std::lock_guard<std::mutex> lock(state_->tenantsMutex);
    u.tenants = state_->tenants.size();
  }
  u.storedValues = state_->storedValues.load(std::memory_order_relaxed);
  u.connections = state_->connectionCount.load(std::memory_order_relaxed);
  return u;
}

Tenant* RootServer::State::findTenant(uint64_t magic) {
  std::lock_guard<std::mutex> lock(tenantsMutex);
  auto it = tenants.find(magic);
  return it == tenants.end() ? nullptr : it->second.get();
}

// --- event loop

void RootServer::State::run() {
  std::vector<pollfd> fds;
  std::vector<uint64_t> ids;
  for (;;) {
    fds.clear();
    ids.clear();
    // At the cap of unfinished handshakes the listener is left alone: new
    // clients wait in the kernel's backlog until some handshakes end.
    bool acceptMore = pendingHandshakes < RootServer::kMaxPendingHandshakes;
    fds.push_back({listener.get(), static_cast<short>(acceptMore ? POLLIN : 0), 0});
    for (auto& [id, conn] : conns) {
      short events = POLLIN;
      if (conn.out.size() > conn.outStart) events |= POLLOUT;
      fds.push_back({conn.fd.get(), events, 0});
      ids.push_back(id);
    }
    int rc = ::poll(fds.data(), fds.size(), pollTimeoutMs(nowNs()));
    if (rc < 0 && errno != EINTR) {
      SHOAL_WARN("bootstrap root: poll failed: ", std::strerror(errno));
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    if (rc > 0) {
      if (fds[0].revents != 0) acceptNew();
      for (size_t i = 0; i < ids.size(); ++i) {
        if (fds[i + 1].revents == 0) continue;
        auto it = conns.find(ids[i]);
        if (it != conns.end() && it->second.phase != Phase::kClosed) service(it->second, fds[i + 1].revents);
      }
    }
    expire(nowNs());
    reapClosed();
  }
}

int RootServer::State::pollTimeoutMs(int64_t now) {
  int64_t next = now + 1000000000;  // wake at least once a second
  for (const auto& [id, conn] : conns)
    if (conn.phase == Phase::kHello || conn.phase == Phase::kProof)
      next = std::min(next, conn.handshakeDeadlineNs);
  if (!waiterDeadlines.empty()) next = std::min(next, std::get<0>(*waiterDeadlines.begin()));
  if (!keptTenants.empty()) next = std::min(next, keptTenants.begin()->first);
  int64_t ms = (next - now + 999999) / 1000000;
  return static_cast<int>(std::clamp<int64_t>(ms, 0, 1000));
}

void RootServer::State::acceptNew() {
  for (int i = 0; i < kMaxAcceptsPerWakeup && pendingHandshakes < RootServer::kMaxPendingHandshakes; ++i) {
    net::SocketAddress peer;
    Result<net::Fd> accepted = net::acceptOne(listener.get(), &peer);
    if (!accepted.isOk()) {
      // EMFILE and friends: back off a little rather than spin, and say so
      // once a second at most (the next tries fail alike).
      const int64_t now = nowNs();
      if (now - lastAcceptWarningNs >= 1000000000) {
        lastAcceptWarningNs = now;
        SHOAL_WARN("bootstrap root: ", accepted.status().message(), " (retried every 10 ms)");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      return;
    }
    net::Fd fd = std::move(accepted.value());
    if (!fd) return;
    (void)net::setNoDelay(fd.get());
    (void)net::setLiveness(fd.get(), liveness);
    Conn conn;
    conn.id = nextConnId++;
    conn.fd = std::move(fd);
    conn.peer = peer;
    conn.handshakeDeadlineNs = nowNs() + handshakeTimeoutNs;
    ++pendingHandshakes;
    connectionCount.fetch_add(1, std::memory_order_relaxed);
    uint64_t id = conn.id;
    conns.emplace(id, std::move(conn));
  }
}

void RootServer::State::service(Conn& conn, short revents) {
  if (revents & (POLLIN | POLLHUP | POLLERR)) {
    if (conn.phase == Phase::kReady) readFrames(conn);
    else readHandshake(conn);
  }
  if (conn.phase != Phase::kClosed && (revents & POLLOUT)) flush(conn);
}

// --- handshake

void RootServer::State::readHandshake(Conn& conn) {
  size_t want = conn.phase == Phase::kHello ? kClientHelloBytes : kProofBytes;
  net::IoResult io = net::readSome(conn.fd.get(), conn.handshake + conn.handshakeHave, want - conn.handshakeHave);
  if (io.closed) return close(conn, "closed during the handshake", /*quiet=*/true);
  if (!io.ok()) return close(conn, std::strerror(io.error), /*quiet=*/true);
  conn.handshakeHave += io.bytes;
  if (conn.handshakeHave < want) return;
  conn.handshakeHave = 0;
  if (conn.phase == Phase::kHello) onHello(conn);
  else onProof(conn);
}

void RootServer::State::onHello(Conn& conn) {
  Reader r(conn.handshake, kClientHelloBytes);
  uint32_t tag = r.u32();
  uint16_t version = r.u16();
  r.u16();
  uint64_t magic = r.u64();
  r.bytes(conn.nonceC, kNonceBytes);
  if (tag != kHandshakeTag) return close(conn, "not a Shoal bootstrap hello", false);
  if (version != kVersion) return close(conn, str("unsupported protocol version ", version), false);
  conn.tenant = findTenant(magic);
  if (conn.tenant == nullptr)
    return close(conn, "unknown ncclUniqueId (stale, its communicators all destroyed, or a foreign job)", false);
  ++conn.tenant->connections;  // until reapClosed: the tenant outlives its connections
  if (Status s = net::randomBytes(conn.nonceS, kNonceBytes); !s.isOk())
    return close(conn, s.message(), false);
  net::Digest mac = serverMac(conn.tenant->key, conn.nonceC, conn.nonceS);
  Writer w(conn.out);
  w.u32(kHandshakeTag);
  w.u16(kVersion);
  w.u16(0);
  w.bytes(conn.nonceS, kNonceBytes);
  w.bytes(mac.data(), mac.size());
  conn.phase = Phase::kProof;
  flush(conn);
}

void RootServer::State::onProof(Conn& conn) {
  net::Digest expected = clientMac(conn.tenant->key, conn.nonceS, conn.nonceC);
  if (!net::constantTimeEqual(expected.data(), conn.handshake, kProofBytes))
    return close(conn, "wrong proof of the id's secret", false);
  Writer w(conn.out);
  w.u32(kAcceptTag);
  conn.tenant->used = true;
  conn.phase = Phase::kReady;
  --pendingHandshakes;
  flush(conn);
}

// --- frames

void RootServer::State::readFrames(Conn& conn) {
  for (;;) {
    // Read into the server's one chunk and keep only what arrived: an idle
    // connection holds no read buffer (one root serves every rank of a job).
    if (readChunk.empty()) readChunk.resize(kReadChunkBytes);
    net::IoResult io = net::readSome(conn.fd.get(), readChunk.data(), readChunk.size());
    conn.in.insert(conn.in.end(), readChunk.data(), readChunk.data() + io.bytes);
    if (!io.ok()) {  // closed too
      conn.endedByClient = closedByClient(io);
      return close(conn, io.closed ? "client closed" : std::strerror(io.error), /*quiet=*/true);
    }
    if (io.bytes == 0) break;
    // Parse every complete frame.
    for (;;) {
      size_t avail = conn.in.size() - conn.inStart;
      if (avail < 4) break;
      Reader lenReader(conn.in.data() + conn.inStart, 4);
      uint32_t len = lenReader.u32();
      if (len > kMaxFrameBytes || len < 9)
        return close(conn, str("bad frame length ", len), false);
      if (avail < 4 + static_cast<size_t>(len)) break;
      if (!handleFrame(conn, conn.in.data() + conn.inStart + 4, len)) return;
      conn.inStart += 4 + len;
    }
    if (conn.inStart == conn.in.size()) {
      conn.in.clear();
      conn.inStart = 0;
    } else if (conn.inStart > (1u << 20)) {
      conn.in.erase(conn.in.begin(), conn.in.begin() + static_cast<ptrdiff_t>(conn.inStart));
      conn.inStart = 0;
    }
    if (io.bytes < kReadChunkBytes) break;
  }
  if (conn.in.empty() && conn.in.capacity() > kIdleBufferBytes) conn.in.shrink_to_fit();
  flush(conn);
}

bool RootServer::State::handleFrame(Conn& conn, const uint8_t* data, size_t size) {
  Reader r(data, size);
  uint64_t requestId = r.u64();
  uint8_t command = r.u8();
  switch (command) {
    case kSet: handleSet(conn, requestId, r); break;
    case kGet: handleGet(conn, requestId, r); break;
    case kErase: handleErase(conn, requestId, r); break;
    case kCheck: handleCheck(conn, requestId, r); break;
    case kWill: handleWill(conn, requestId, r); break;
    case kCancelWill: handleCancelWill(conn, requestId, r); break;
    default:
      close(conn, str("unknown command ", static_cast<int>(command)), false);
      return false;
  }
  return conn.phase != Phase::kClosed;
}

namespace {
// Reads {u32 n, n x str} (keys); false on a malformed list.
bool readKeys(Reader& r, std::vector<std::string>& keys) {
  uint32_t n = r.count(4);
  keys.reserve(n);
  for (uint32_t i = 0; i < n && r.ok(); ++i) keys.push_back(r.str(kMaxKeyBytes));
  return r.ok() && r.atEnd();
}
}  // namespace

void RootServer::State::reply(uint64_t connId, uint64_t requestId, uint8_t status,
                              const std::vector<std::string>& strings, bool withCount) {
  auto it = conns.find(connId);
  if (it == conns.end() || it->second.phase != Phase::kReady) return;
  Conn& conn = it->second;
  Writer w(conn.out);
  size_t at = beginFrame(w, requestId, status);
  if (withCount) w.u32(static_cast<uint32_t>(strings.size()));
  for (const auto& s : strings) w.str(s);
  finishFrame(w, at);
}

void RootServer::State::handleSet(Conn& conn, uint64_t requestId, Reader& r) {
  std::string key = r.str(kMaxKeyBytes);
  std::string value = r.str();
  if (!r.ok() || !r.atEnd()) return reply(conn.id, requestId, kBadRequest, {"malformed SET"}, false);
  Tenant& tenant = *conn.tenant;
  bool isNew = tenant.values.insert_or_assign(key, std::move(value)).second;
  if (isNew) storedValues.fetch_add(1, std::memory_order_relaxed);
  // The setter's reply goes out before any waiter is answered: a waiter may be
  // the process that hosts this root and exit as soon as it is answered.
  reply(conn.id, requestId, kOk, {}, false);
  flush(conn);
  if (isNew) onKeySet(tenant, key);
}

void RootServer::State::handleGet(Conn& conn, uint64_t requestId, Reader& r) {
  uint32_t timeoutMs = r.u32();
  Waiter waiter;
  if (!readKeys(r, waiter.keys)) return reply(conn.id, requestId, kBadRequest, {"malformed GET"}, false);
  Tenant& tenant = *conn.tenant;
  waiter.connId = conn.id;
  waiter.requestId = requestId;
  waiter.deadlineNs = timeoutMs == kNoTimeout ? INT64_MAX : nowNs() + int64_t(timeoutMs) * 1000000;
  uint64_t waiterId = tenant.nextWaiterId++;
  if (waiter.deadlineNs != INT64_MAX) waiterDeadlines.emplace(waiter.deadlineNs, &tenant, waiterId);
  tenant.waiters.emplace(waiterId, std::move(waiter));
  answerIfComplete(tenant, waiterId);
}

// Answers the waiter if every key exists; otherwise (re)counts the missing
// keys and registers the waiter on them. True when answered.
bool RootServer::State::answerIfComplete(Tenant& tenant, uint64_t waiterId) {
  auto it = tenant.waiters.find(waiterId);
  if (it == tenant.waiters.end()) return false;
  Waiter& w = it->second;
  size_t missing = 0;
  for (const auto& key : w.keys)
    if (tenant.values.find(key) == tenant.values.end()) {
      ++missing;
      tenant.waitingOn[key].push_back(waiterId);
    }
  if (missing > 0) {
    w.missing = missing;
    return false;
  }
  std::vector<std::string> values;
  values.reserve(w.keys.size());
  uint64_t replyBytes = 64;  // the frame's header and count, generously
  for (const auto& key : w.keys) {
    values.push_back(tenant.values[key]);
    replyBytes += 4 + values.back().size();
  }
  // A reply past the frame limit would break the client's connection (and
  // every communicator sharing it): the request is refused, saying why.
  if (replyBytes > kMaxFrameBytes)
    reply(w.connId, w.requestId, kBadRequest,
          {str("the ", w.keys.size(), " values asked for are ", replyBytes, " bytes together, more than a reply holds (",
               kMaxFrameBytes, ")")},
          false);
  else
    reply(w.connId, w.requestId, kOk, values, true);
  if (auto c = conns.find(w.connId); c != conns.end()) flush(c->second);
  waiterDeadlines.erase({w.deadlineNs, &tenant, waiterId});
  tenant.waiters.erase(it);
  return true;
}

void RootServer::State::onKeySet(Tenant& tenant, const std::string& key) {
  auto it = tenant.waitingOn.find(key);
  if (it == tenant.waitingOn.end()) return;
  std::vector<uint64_t> ids = std::move(it->second);
  tenant.waitingOn.erase(it);
  for (uint64_t id : ids) {
    auto w = tenant.waiters.find(id);
    if (w == tenant.waiters.end()) continue;  // answered or expired already
    if (w->second.missing > 0 && --w->second.missing == 0) answerIfComplete(tenant, id);
  }
}

void RootServer::State::handleErase(Conn& conn, uint64_t requestId, Reader& r) {
  std::vector<std::string> keys;
  if (!readKeys(r, keys)) return reply(conn.id, requestId, kBadRequest, {"malformed ERASE"}, false);
  size_t erased = 0;
  for (const auto& key : keys) erased += conn.tenant->values.erase(key);
  storedValues.fetch_sub(erased, std::memory_order_relaxed);
  reply(conn.id, requestId, kOk, {}, false);
}

void RootServer::State::handleCheck(Conn& conn, uint64_t requestId, Reader& r) {
  std::vector<std::string> keys;
  if (!readKeys(r, keys)) return reply(conn.id, requestId, kBadRequest, {"malformed CHECK"}, false);
  Writer w(conn.out);
  size_t at = beginFrame(w, requestId, kOk);
  w.u32(static_cast<uint32_t>(keys.size()));
  for (const auto& key : keys) w.u8(conn.tenant->values.count(key) ? 1 : 0);
  finishFrame(w, at);
}

void RootServer::State::handleWill(Conn& conn, uint64_t requestId, Reader& r) {
  std::string key = r.str(kMaxKeyBytes);
  std::string value = r.str();
  if (!r.ok() || !r.atEnd()) return reply(conn.id, requestId, kBadRequest, {"malformed WILL"}, false);
  if (conn.wills.size() >= kMaxWillsPerConnection && !conn.wills.contains(key))
    return reply(conn.id, requestId, kBadRequest,
                 {str("a connection holds at most ", kMaxWillsPerConnection, " wills")}, false);
  conn.wills.insert_or_assign(std::move(key), std::move(value));
  reply(conn.id, requestId, kOk, {}, false);
}

void RootServer::State::handleCancelWill(Conn& conn, uint64_t requestId, Reader& r) {
  std::string key = r.str(kMaxKeyBytes);
  if (!r.ok() || !r.atEnd()) return reply(conn.id, requestId, kBadRequest, {"malformed CANCEL WILL"}, false);
  conn.wills.erase(key);
  reply(conn.id, requestId, kOk, {}, false);
}

// The connection ended with wills left: its client neither cancelled them
// nor will. Written only where the client's side closed it (its process
// exited): a connection the network failed (a keepalive timeout) may have
// a live client, which must not be declared gone, and one the root closed
// (a malformed frame) says nothing of its process. Each key that exists
// keeps its value (a report the client wrote itself says more).
void RootServer::State::fulfilWills(Conn& conn) {
  if (conn.wills.empty()) return;
  if (!conn.endedByClient) {
    SHOAL_INFO(subsys::kBootstrap, "bootstrap root: connection from ", conn.peer.toString(),
               " ended without its client closing it; its ", conn.wills.size(),
               conn.wills.size() == 1 ? " will is" : " wills are", " not written");
    conn.wills = {};
    return;
  }
  Tenant& tenant = *conn.tenant;
  size_t written = 0;
  for (auto& [key, value] : conn.wills) {
    if (!tenant.values.try_emplace(key, std::move(value)).second) continue;
    storedValues.fetch_add(1, std::memory_order_relaxed);
    ++written;
    onKeySet(tenant, key);
  }
  SHOAL_INFO(subsys::kBootstrap, "bootstrap root: connection from ", conn.peer.toString(), " ended holding ",
             conn.wills.size(), conn.wills.size() == 1 ? " will" : " wills", "; ", written, " written");
  conn.wills = {};
}

// --- timers, output, closing

void RootServer::State::expire(int64_t now) {
  for (auto& [id, conn] : conns)
    if ((conn.phase == Phase::kHello || conn.phase == Phase::kProof) && now >= conn.handshakeDeadlineNs)
      close(conn, "no handshake within SHOAL_HANDSHAKE_TIMEOUT_MS", false);
  while (!waiterDeadlines.empty() && std::get<0>(*waiterDeadlines.begin()) <= now) {
    auto [deadlineNs, tenant, wid] = *waiterDeadlines.begin();
    waiterDeadlines.erase(waiterDeadlines.begin());
    auto it = tenant->waiters.find(wid);
    if (it == tenant->waiters.end()) continue;
    std::vector<std::string> missing;
    for (const auto& key : it->second.keys)
      if (tenant->values.find(key) == tenant->values.end()) missing.push_back(key);
    reply(it->second.connId, it->second.requestId, kTimeout, missing, true);
    if (auto c = conns.find(it->second.connId); c != conns.end()) flush(c->second);
    dropWaiter(*tenant, wid);
  }
  while (!keptTenants.empty() && keptTenants.begin()->first <= now) {
    auto [releaseAtNs, magic] = *keptTenants.begin();
    keptTenants.erase(keptTenants.begin());
    Tenant* tenant = findTenant(magic);
    // A late rank connected since keeps it until it leaves in turn.
    if (tenant && tenant->releaseAtNs == releaseAtNs && tenant->connections == 0) {
      SHOAL_INFO(subsys::kBootstrap, "bootstrap root: id ", hex64(magic), " released: no rank came for what ",
                 "its last clients left within SHOAL_INIT_TIMEOUT_MS");
      releaseTenant(*tenant);
    }
  }
}

// Forgets a waiter and its entries in waitingOn.
void RootServer::State::dropWaiter(Tenant& tenant, uint64_t waiterId) {
  auto it = tenant.waiters.find(waiterId);
  if (it == tenant.waiters.end()) return;
  waiterDeadlines.erase({it->second.deadlineNs, &tenant, waiterId});
  for (const auto& key : it->second.keys) {
    auto list = tenant.waitingOn.find(key);
    if (list == tenant.waitingOn.end()) continue;
    auto& v = list->second;
    v.erase(std::remove(v.begin(), v.end(), waiterId), v.end());
    if (v.empty()) tenant.waitingOn.erase(list);
  }
  tenant.waiters.erase(it);
}

void RootServer::State::flush(Conn& conn) {
  while (conn.phase != Phase::kClosed && conn.out.size() > conn.outStart) {
    net::IoResult io = net::writeSome(conn.fd.get(), conn.out.data() + conn.outStart,
                                      conn.out.size() - conn.outStart);
    if (!io.ok()) {
      conn.endedByClient = closedByClient(io);
      return close(conn, std::strerror(io.error), /*quiet=*/true);
    }
    if (io.bytes == 0) return;  // kernel buffer full: POLLOUT will call again
    conn.outStart += io.bytes;
  }
  conn.out.clear();
  conn.outStart = 0;
  if (conn.out.capacity() > kIdleBufferBytes) conn.out.shrink_to_fit();
}

void RootServer::State::close(Conn& conn, std::string_view why, bool quiet) {
  if (conn.phase == Phase::kClosed) return;
  if (conn.phase == Phase::kHello || conn.phase == Phase::kProof) {
    --pendingHandshakes;
    if (!quiet) rejects.note(conn.peer, why);
  } else {
    SHOAL_INFO(subsys::kBootstrap, "bootstrap root: connection from ", conn.peer.toString(), " ended: ", why);
  }
  conn.phase = Phase::kClosed;
  conn.fd.reset();
}

void RootServer::State::reapClosed() {
  for (auto it = conns.begin(); it != conns.end();) {
    if (it->second.phase != Phase::kClosed) {
      ++it;
      continue;
    }
    if (Tenant* tenant = it->second.tenant) {
      std::vector<uint64_t> gone;
      for (const auto& [wid, w] : tenant->waiters)
        if (w.connId == it->first) gone.push_back(wid);
      for (uint64_t wid : gone) dropWaiter(*tenant, wid);
      fulfilWills(it->second);
      if (--tenant->connections == 0 && tenant->used) lastClientLeft(*tenant, nowNs());
    }
    it = conns.erase(it);
    connectionCount.fetch_sub(1, std::memory_order_relaxed);
  }
}

// The last client of a used tenant left. A communicator that ended well
// erased every key of its scopes before its ranks closed their
// connections: nobody can use the id any more (root_server.h). Keys left
// over mean that its set-up failed (wills, the failure reports of ranks
// that gave up), and ranks not connected yet would read them: the tenant
// stays, for as long as their set-up may wait, unless it is the
// NCCL_COMM_ID tenant, whose next communicator must start empty.
void RootServer::State::lastClientLeft(Tenant& tenant, int64_t now) {
  if (tenant.permanent || tenant.values.empty() || keepForLateRanksNs == 0) return releaseTenant(tenant);
  if (tenant.releaseAtNs != 0) keptTenants.erase({tenant.releaseAtNs, tenant.magic});
  tenant.releaseAtNs = now + keepForLateRanksNs;
  keptTenants.emplace(tenant.releaseAtNs, tenant.magic);
  SHOAL_INFO(subsys::kBootstrap, "bootstrap root: id ", hex64(tenant.magic), " kept for ranks not connected yet: its ",
             "last client left ", tenant.values.size(), tenant.values.size() == 1 ? " key" : " keys");
}

// Nothing the tenant holds is needed any more.
void RootServer::State::releaseTenant(Tenant& tenant) {
  if (tenant.releaseAtNs != 0) keptTenants.erase({tenant.releaseAtNs, tenant.magic});
  tenant.releaseAtNs = 0;
  storedValues.fetch_sub(tenant.values.size(), std::memory_order_relaxed);
  if (tenant.permanent) {
    // The next communicator from NCCL_COMM_ID reuses the id and its scope:
    // it must not read this one's leftovers.
    tenant.values = {};
    tenant.waitingOn = {};
    tenant.used = false;
    return;
  }
  SHOAL_INFO(subsys::kBootstrap, "bootstrap root: id ", hex64(tenant.magic), " released (its last client left)");
  std::lock_guard<std::mutex> lock(tenantsMutex);
  tenants.erase(tenant.magic);
}

}  // namespace shoal
