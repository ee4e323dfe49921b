// fuzz_store_server: the bootstrap root's side of the TCP store protocol
// (src/bootstrap/store_protocol.h), i.e. every byte a client, a scanner or
// another job sends to the root: the 32-byte ClientHello, the 32-byte proof,
// then request frames {u32 length, u64 id, u8 command, body} for SET, GET,
// ERASE and CHECK.
//
// The parser lives in RootServer::State (root_server.cc), whose definition is
// private to that file; this harness compiles root_server.cc into its own
// translation unit (the #include below) so that it can drive one State
// directly, without its thread or listener: each connection is one end of a
// socketpair whose other end the harness writes the input into, and the
// harness calls the same service()/expire()/reapClosed() the event loop
// calls. Everything after the hello is processed exactly as for a real
// client; the harness can answer the root's challenge with a correct proof
// (it knows the tenant's secret), so the frames of an authenticated client
// are reached too.
//
// Input: u8 flags, then steps until the input ends:
//   flags bit0/bit1: connection 0/1 starts in the hello phase (else already
//                    authenticated); bit2: the harness answers challenges with
//                    the correct proof.
//   step u8 op; connection c = (op >> 2) & 1:
//     op % 4 == 0: u16 n, then n bytes sent by c's client, then the root reads
//     op % 4 == 1: c's client closes its sending side, then the root reads
//     op % 4 == 2: u16 ms: the root's timers run at now + ms milliseconds
//     op % 4 == 3: the root reaps closed connections; replies are discarded
#include "bootstrap/root_server.cc"  // NOLINT: see above

#include "fuzz_common.h"

namespace {

using namespace shoal;
using namespace shoal::bootstrap_wire;
using shoal_fuzz::Input;

constexpr uint64_t kTenantMagic = shoal_fuzz::kStoreTenantMagic;  // as the seeds' hellos name
constexpr const uint8_t* kTenantSecret = shoal_fuzz::kStoreTenantSecret;
constexpr int kConns = 2;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  uint8_t flags = in.u8();

  RootServer::State state;
  state.handshakeTimeoutNs = 5'000'000'000;
  {
    auto tenant = std::make_unique<Tenant>();
    tenant->magic = kTenantMagic;
    tenant->key = deriveKey(kTenantSecret, kTenantMagic);
    // Emptied, not dropped, when its last client leaves: `tenant` below
    // stays valid while the release path still runs.
    tenant->permanent = true;
    state.tenants.emplace(kTenantMagic, std::move(tenant));
  }
  Tenant* tenant = state.tenants.at(kTenantMagic).get();

  // Each connection's input buffer keeps its capacity from one input to the
  // next, as a long-lived connection's does (a fresh one per input would
  // spend the run in allocation).
  static std::vector<uint8_t> spareIn[kConns];
  int clientEnd[kConns];
  int64_t start = nowNs();
  for (int c = 0; c < kConns; ++c) {
    shoal_fuzz::SocketPair pair = shoal_fuzz::SocketPair::make();
    Conn conn;
    conn.id = static_cast<uint64_t>(c + 1);
    conn.fd = net::Fd(pair.a);
    conn.handshakeDeadlineNs = start + state.handshakeTimeoutNs;
    if (flags & (1u << c)) {
      conn.phase = Phase::kHello;
      ++state.pendingHandshakes;
    } else {
      conn.phase = Phase::kReady;
      conn.tenant = tenant;
      ++tenant->connections;  // as onHello and onProof count it
      tenant->used = true;
    }
    conn.in.swap(spareIn[c]);
    conn.in.clear();
    clientEnd[c] = pair.b;
    state.conns.emplace(conn.id, std::move(conn));
  }
  const bool proveCorrectly = flags & 4;

  auto serviceConn = [&](int c, short revents) {
    auto it = state.conns.find(static_cast<uint64_t>(c + 1));
    if (it == state.conns.end() || it->second.phase == Phase::kClosed) return;
    Phase before = it->second.phase;
    state.service(it->second, revents);
    // The challenge went out: answer it as a client holding the secret would.
    if (proveCorrectly && before == Phase::kHello && it->second.phase == Phase::kProof) {
      net::Digest proof = clientMac(tenant->key, it->second.nonceS, it->second.nonceC);
      shoal_fuzz::drain(clientEnd[c]);
      shoal_fuzz::writeSome(clientEnd[c], proof.data(), proof.size());
      state.service(it->second, POLLIN);
    }
  };

  while (!in.empty()) {
    uint8_t op = in.u8();
    int c = (op >> 2) & 1;
    switch (op % 4) {
      case 0: {
        std::string_view bytes = in.bytes(in.u16());
        if (clientEnd[c] >= 0) shoal_fuzz::writeSome(clientEnd[c], bytes.data(), bytes.size());
        serviceConn(c, POLLIN);
        break;
      }
      case 1:
        if (clientEnd[c] >= 0) ::shutdown(clientEnd[c], SHUT_WR);
        serviceConn(c, POLLIN | POLLHUP);
        break;
      case 2:
        state.expire(nowNs() + int64_t{in.u16()} * 1'000'000);
        break;
      case 3:
        state.reapClosed();
        break;
    }
    for (int k = 0; k < kConns; ++k) shoal_fuzz::drain(clientEnd[k]);
  }
  // Waiters still pending time out, then everything closes.
  state.expire(nowNs() + (int64_t{1} << 50));
  for (auto& [id, conn] : state.conns) {
    state.close(conn, "fuzz input ended", /*quiet=*/true);
    spareIn[id - 1].swap(conn.in);
  }
  state.reapClosed();
  for (int k = 0; k < kConns; ++k) shoal_fuzz::closeFd(clientEnd[k]);
  FUZZ_CHECK(state.conns.empty(), "connections left after reapClosed");
  FUZZ_CHECK(state.pendingHandshakes == 0, "pendingHandshakes is %d with no connection", state.pendingHandshakes);
  FUZZ_CHECK(tenant->waiters.empty(), "%zu waiters left after their connections closed", tenant->waiters.size());
  FUZZ_CHECK(state.waiterDeadlines.empty(), "%zu waiter deadlines left with no waiter", state.waiterDeadlines.size());
  FUZZ_CHECK(tenant->connections == 0, "the tenant counts %zu connections with none left", tenant->connections);
  FUZZ_CHECK(tenant->values.empty() && !tenant->used, "the tenant was not emptied when its last client left");
  FUZZ_CHECK(state.storedValues == 0, "storedValues is %zu with the tenant empty", state.storedValues.load());
  return 0;
}
