// RootServer: the bootstrap root, the server side of the TCP store.
//
// Role: serves SET/GET/ERASE/CHECK/WILL (store_protocol.h) to the ranks of every
// ncclUniqueId this process created. One server per listen address; each id
// it serves is a "tenant" with its own key space and its own secret (the
// client's hello names the id's magic; the handshake proves the secret).
// A connection may hold wills: keys the server sets when its client's side
// closes it, unless they exist by then (store_protocol.h; how ranks use
// them: bootstrap.h, setWill).
//
// Tenant lifetime: a tenant is dropped, with every key in it, when the last
// client connected to it leaves after at least one client proved the secret,
// if it holds no key then. Every rank of a communicator keeps its connection
// until its communicator and every split of it are destroyed, all ranks are
// connected before any can finish init, and the last to leave erases every
// key, so by then nobody can use the id again (NCCL does not allow reusing an
// id either). Keys left over mean a set-up that failed before every rank
// connected (the first ranks' wills and reports): the tenant then stays for
// SHOAL_INIT_TIMEOUT_MS (read at start()) after its last client left, so
// that ranks still to come read why the others will not come. An id that no
// client ever used stays until the process exits, as NCCL's root does. The
// NCCL_COMM_ID tenant (the first tenant given to start()) serves every
// communicator made from that variable: it is emptied instead of dropped,
// at once (its next communicator must not read this one's keys). The loop's per-pass work is bounded by the
// connections and the pending GETs, not by the number of tenants.
// Owner: the process. A server is started on first need and lives until the
// process exits: it is deliberately never destroyed, and its thread is
// detached and touches only the server's own heap state (and the logger,
// which is never destroyed either), so process exit neither waits for it nor
// races with static destructors.
// Thread: one background thread runs an event loop (poll over the listener and
// every client), so a slow, silent or malicious connection never delays
// others. addTenant() may be called from any thread.
//
// Limits: unauthenticated connections get SHOAL_HANDSHAKE_TIMEOUT_MS and at
// most kMaxPendingHandshakes exist at once (beyond that the root stops
// accepting, and new clients wait in the kernel's backlog until handshakes
// finish or expire); frames are at most 64 MiB and every length is checked before use.
// Rejections are logged at most once a second with a count.
#pragma once

#include <cstdint>
#include <memory>

#include "core/status.h"
#include "net/socket_address.h"

namespace shoal {

class RootServer {
 public:
  static constexpr int kMaxPendingHandshakes = 256;

  // Binds `address` (port 0: an ephemeral port; fixedPort: SO_REUSEADDR for a
  // requested port) and starts the thread. The server is never freed. A first
  // tenant given here is served before any connection is accepted (ranks may
  // already be retrying their connects to an NCCL_COMM_ID root).
  static Result<RootServer*> start(const net::SocketAddress& address, bool fixedPort,
                                   uint64_t firstMagic = 0, const uint8_t* firstSecret = nullptr);

  // Serves the id (magic, secret) from now on; idempotent.
  void addTenant(uint64_t magic, const uint8_t secret[32]);
  // The bound address (with the actual port).
  const net::SocketAddress& address() const;
  // In a forked child, where the server has no thread: closes the copy of
  // its listener (nothing else of it is used there).
  void closeListenerInForkedChild();

  // What the server holds now, for tests and diagnostics (any thread; the
  // figures are read without stopping the server, each one exact at its read).
  struct Usage {
    size_t tenants = 0;       // ids served, used or not
    size_t storedValues = 0;  // keys held, over every tenant
    size_t connections = 0;   // clients connected, in any phase
  };
  Usage usage() const;

  struct State;  // private; defined in root_server.cc

 private:
  explicit RootServer(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// The root of this process's random ids (nullptr before the first
// createUniqueId); for tests and diagnostics.
RootServer* processRootServer();

}  // namespace shoal
