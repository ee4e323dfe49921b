// Socket helpers shared by the bootstrap and the tcp transport.
//
// Role: every TCP socket Shoal opens is made here, non-blocking and
// close-on-exec from birth, wrapped in an Fd, with Shoal's liveness options.
// Blocking-style helpers (connectWithRetry, readExact, writeExact) poll with a
// Deadline, so no call here can wait for ever. The partial helpers (readSome,
// writevSome) never block and report EOF and errors as values; they are the
// data path of the tcp transport.
// Thread: any; the helpers keep no state.
//
// Liveness (docs/design.md, "Errors"). A crashed peer is seen at once (EOF,
// ECONNRESET); a dead host or cut link only through keepalive, a user timeout
// or a deadline (Linux's keepalive defaults take ~2 h 11 min); a stopped
// process only through the engine's no-progress deadline, since its kernel
// still answers keepalives:
//   - SO_KEEPALIVE with TCP_KEEPIDLE 10 s, TCP_KEEPINTVL 5 s, TCP_KEEPCNT 3
//     (a dead host on an idle connection is noticed after ~25 s);
//   - TCP_USER_TIMEOUT = SHOAL_PROGRESS_TIMEOUT_MS + 10 s, so that a peer that
//     is merely slow (a stopped process still ACKs with a zero window) is left
//     to the engine's no-progress deadline; 0 there means "not set".
//     Note: Linux lets TCP_USER_TIMEOUT replace TCP_KEEPCNT when both are set
//     (tcp_keepalive_timer), so the kernel itself would fail an idle
//     connection to a dead host only after the user timeout. Shoal does not
//     wait for it: the idle check (SHOAL_IDLE_CHECK_MS, every 5 s on
//     connections with nothing posted) calls a socket dead on EOF or a
//     pending error (a killed peer process: within one check) and once
//     TCP_INFO says the peer's host has answered nothing, not even a
//     keepalive probe, for keepIdle + keepCount x keepInterval = 25 s
//     (checkIdleSocket): a dead or cut-off host is reported within ~30 s.
//     A connection with an operation in flight is the engine's: its errors,
//     the same look once a job has moved nothing for an idle check interval
//     (Engine::checkStalledPeers: a host cut off mid-operation is found after
//     ~25 s), and the no-progress deadline cover it.
//   - MSG_NOSIGNAL on every send: a closed peer is an EPIPE value, never SIGPIPE.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/clock.h"
#include "core/status.h"
#include "net/fd.h"
#include "net/socket_address.h"

namespace shoal::net {

// --- options

struct LivenessOptions {
  int keepIdleS = 10;
  int keepIntervalS = 5;
  int keepCount = 3;
  int64_t userTimeoutMs = 0;  // 0: leave TCP_USER_TIMEOUT unset
  // From params(): userTimeoutMs = progressTimeoutMs + 10 s (0 when that is 0).
  static LivenessOptions fromParams();
};

Status setNoDelay(int fd);
Status setLiveness(int fd, const LivenessOptions& options);
// SO_SNDBUF and SO_RCVBUF; bytes <= 0 leaves kernel autotuning on.
Status setBufferSizes(int fd, int64_t bytes);
// SO_SNDBUF alone (the kernel keeps twice `bytes`); bytes <= 0 leaves autotuning on.
Status setSendBuffer(int fd, int64_t bytes);
// The send buffer for data sockets towards a peer on this kernel
// (SHOAL_SOCKET_SAME_KERNEL_SNDBUF, docs/decisions/0012); 0 where
// SHOAL_SOCKET_BUFFER_BYTES sizes the sockets itself.
int64_t sameKernelSendBufferFromParams();
// TCP_NOTSENT_LOWAT: at most about `bytes` queued and not yet sent; <= 0 leaves the system's default.
Status setNotsentLowat(int fd, int64_t bytes);

// --- listen / accept / connect

struct ListenOptions {
  int backlog = 4096;
  bool reuseAddress = false;  // SO_REUSEADDR: only for a fixed, requested port
  int64_t bufferBytes = 0;    // inherited by accepted sockets (see setBufferSizes)
};
// Binds `address` (port 0: ephemeral) and listens; never SO_REUSEPORT.
Result<Fd> listenOn(const SocketAddress& address, const ListenOptions& options = {});
Result<SocketAddress> localAddressOf(int fd);
Result<SocketAddress> peerAddressOf(int fd);

// Accepts one pending connection (non-blocking, close-on-exec); an invalid Fd
// when none is pending. `peer` (optional) receives the remote address.
Result<Fd> acceptOne(int listenFd, SocketAddress* peer = nullptr);

struct RetryPolicy {
  int retries = 34;            // NCCL_SOCKET_RETRY_CNT
  int64_t sleepMs = 100;       // NCCL_SOCKET_RETRY_SLEEP_MSEC; attempt k sleeps k x sleepMs
  int64_t bufferBytes = 0;     // set before connecting (window scaling)
  static RetryPolicy fromParams();
};
// Connects a non-blocking socket; refusals, resets and unreachable networks
// are retried with linear backoff while retries and the deadline allow. The
// error names the address, the cause and the attempts made.
Result<Fd> connectWithRetry(const SocketAddress& address, Deadline deadline,
                            const RetryPolicy& policy = RetryPolicy::fromParams());

// What a listener at `address` answers a connection now (one attempt, no
// retry, closed at once, sending nothing): kRefuses, a listener that was
// there has closed (with its process, where the address is its for the
// process's life); kAccepts, something listens there; kUnknown, still
// pending at the deadline or any other failure, which proves nothing.
enum class ListenerAnswer { kUnknown, kAccepts, kRefuses };
ListenerAnswer probeListener(const SocketAddress& address, Deadline deadline);

// --- blocking-style I/O on non-blocking sockets, bounded by a deadline

// Reads exactly `bytes`; EOF before that is kRemoteError "<what>: connection
// closed by peer", the deadline kTimeout "<what>: timed out ...".
Status readExact(int fd, void* data, size_t bytes, Deadline deadline, std::string_view what);
Status writeExact(int fd, const void* data, size_t bytes, Deadline deadline, std::string_view what);
// Waits until fd is readable (or has EOF/error) or the deadline passes; true if ready.
Result<bool> waitReadable(int fd, Deadline deadline);

// --- partial, never-blocking I/O (the data path)

struct IoResult {
  size_t bytes = 0;     // bytes moved; 0 with ok() means "would block"
  int error = 0;        // errno of a failure
  bool closed = false;  // orderly EOF from the peer (reads only)
  bool ok() const { return error == 0 && !closed; }
};

IoResult readSome(int fd, void* data, size_t bytes);
IoResult readvSome(int fd, const iovec* iov, int count);
IoResult writeSome(int fd, const void* data, size_t bytes);
IoResult writevSome(int fd, const iovec* iov, int count);

// The Status of a failed IoResult: "<what>: connection closed by peer" or the
// errno text; kRemoteError for resets and closes.
Status ioStatus(const IoResult& io, std::string_view what);

// --- liveness of an idle socket (the idle check, SHOAL_IDLE_CHECK_MS)

// How long a socket may hear nothing from its peer's host (no byte, no ACK)
// before checkIdleSocket calls it silent: keepIdle + keepCount x keepInterval
// (25 s), the time keepalive alone would take without TCP_USER_TIMEOUT. On an
// idle connection to a live host, keepalive probes are answered every
// keepIdle (10 s), so only a host that is down or cut off stays silent.
int64_t silentAfterMs(const LivenessOptions& options);
// Looks at a socket that has nothing posted, without blocking or consuming:
// kRemoteError "<what>: connection closed by peer" (EOF), the pending error
// (reset, unreachable), or "<what>: no answer from the peer's host for N s"
// once TCP_INFO says it heard nothing for silentMs; ok otherwise (bytes
// waiting to be read count as alive).
Status checkIdleSocket(int fd, int64_t silentMs, std::string_view what);

}  // namespace shoal::net
