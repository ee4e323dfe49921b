#include "net/socket.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <limits>
#include <thread>

#include "core/log.h"
#include "core/params.h"

namespace shoal::net {
namespace {

// poll(2) timeout for a deadline, rounded up so that we never spin on 0 ms
// while the deadline is still in the future; a cancellable deadline wakes
// every Deadline::kCancelCheckMs to look at its flag.
int pollTimeoutMs(Deadline deadline) {
  int64_t wakeNs = deadline.wakeAtNs();
  if (wakeNs == Deadline::never().atNs()) return -1;
  int64_t leftNs = wakeNs - nowNs();
  if (leftNs <= 0) return 0;
  int64_t ms = (leftNs + 999999) / 1000000;
  return static_cast<int>(std::min<int64_t>(ms, std::numeric_limits<int>::max()));
}

Status setIntOption(int fd, int level, int name, int value, const char* what) {
  if (setsockopt(fd, level, name, &value, sizeof(value)) != 0) return errnoStatus(errno, what);
  return Status::ok();
}

// Waits for `events` on fd; true if ready, false on deadline.
Result<bool> waitFor(int fd, short events, Deadline deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, pollTimeoutMs(deadline));
    if (rc > 0) return true;
    if (rc == 0) {
      if (deadline.expired()) return false;
      continue;
    }
    if (errno != EINTR) return errnoStatus(errno, "poll");
  }
}

// Why readExact/writeExact stopped waiting with `done` of `bytes` moved.
Status waitEnded(Deadline deadline, std::string_view what, size_t done, size_t bytes, const char* moved) {
  if (deadline.cancelled())
    return error(Code::kAborted, what, ": cancelled (", done, " of ", bytes, " bytes ", moved, ")");
  return error(Code::kTimeout, what, ": timed out (", done, " of ", bytes, " bytes ", moved, ")");
}

bool retryableConnectError(int err) {
  switch (err) {
    case ECONNREFUSED:
    case ECONNRESET:
    case ECONNABORTED:
    case ETIMEDOUT:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case EADDRNOTAVAIL:
    case EAGAIN:
    case EINTR:
      return true;
    default:
      return false;
  }
}

struct Attempt {
  Fd fd;
  int error = 0;         // errno of the failure
  bool timedOut = false;  // the deadline passed while the SYN was in flight
};

Attempt connectOnce(const SocketAddress& address, Deadline deadline, int64_t bufferBytes) {
  Attempt attempt;
  Fd fd(::socket(address.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) {
    attempt.error = errno;
    return attempt;
  }
  if (bufferBytes > 0) (void)setBufferSizes(fd.get(), bufferBytes);
  if (::connect(fd.get(), address.raw(), address.length()) != 0) {
    if (errno != EINPROGRESS) {
      attempt.error = errno;
      return attempt;
    }
    Result<bool> ready = waitFor(fd.get(), POLLOUT, deadline);
    if (!ready.isOk()) {
      attempt.error = EIO;
      return attempt;
    }
    if (!ready.value()) {
      attempt.timedOut = true;
      return attempt;
    }
    int soError = 0;
    socklen_t len = sizeof(soError);
    if (getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &soError, &len) != 0) soError = errno;
    if (soError != 0) {
      attempt.error = soError;
      return attempt;
    }
  }
  // A connect to a free local port inside the ephemeral range can "succeed" by
  // TCP simultaneous open with itself; that is a refusal.
  Result<SocketAddress> local = localAddressOf(fd.get());
  if (local.isOk() && local.value() == address) {
    attempt.error = ECONNREFUSED;
    return attempt;
  }
  attempt.fd = std::move(fd);
  return attempt;
}

}  // namespace

// --- options

LivenessOptions LivenessOptions::fromParams() {
  LivenessOptions options;
  int64_t progress = params().progressTimeoutMs;
  options.userTimeoutMs = progress > 0 ? progress + 10000 : 0;
  return options;
}

Status setNoDelay(int fd) { return setIntOption(fd, IPPROTO_TCP, TCP_NODELAY, 1, "setsockopt(TCP_NODELAY)"); }

Status setLiveness(int fd, const LivenessOptions& options) {
  SHOAL_TRY(setIntOption(fd, SOL_SOCKET, SO_KEEPALIVE, 1, "setsockopt(SO_KEEPALIVE)"));
  SHOAL_TRY(setIntOption(fd, IPPROTO_TCP, TCP_KEEPIDLE, options.keepIdleS, "setsockopt(TCP_KEEPIDLE)"));
  SHOAL_TRY(setIntOption(fd, IPPROTO_TCP, TCP_KEEPINTVL, options.keepIntervalS,
                         "setsockopt(TCP_KEEPINTVL)"));
  SHOAL_TRY(setIntOption(fd, IPPROTO_TCP, TCP_KEEPCNT, options.keepCount, "setsockopt(TCP_KEEPCNT)"));
  if (options.userTimeoutMs > 0) {
    int ms = static_cast<int>(std::min<int64_t>(options.userTimeoutMs, std::numeric_limits<int>::max()));
    SHOAL_TRY(setIntOption(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, ms, "setsockopt(TCP_USER_TIMEOUT)"));
  }
  return Status::ok();
}

Status setBufferSizes(int fd, int64_t bytes) {
  if (bytes <= 0) return Status::ok();
  SHOAL_TRY(setSendBuffer(fd, bytes));
  int value = static_cast<int>(std::min<int64_t>(bytes, std::numeric_limits<int>::max() / 2));
  SHOAL_TRY(setIntOption(fd, SOL_SOCKET, SO_RCVBUF, value, "setsockopt(SO_RCVBUF)"));
  return Status::ok();
}

Status setSendBuffer(int fd, int64_t bytes) {
  if (bytes <= 0) return Status::ok();
  int value = static_cast<int>(std::min<int64_t>(bytes, std::numeric_limits<int>::max() / 2));
  return setIntOption(fd, SOL_SOCKET, SO_SNDBUF, value, "setsockopt(SO_SNDBUF)");
}

int64_t sameKernelSendBufferFromParams() {
  return params().socketBufferBytes > 0 ? 0 : params().socketSameKernelSendBuffer;
}

Status setNotsentLowat(int fd, int64_t bytes) {
  if (bytes <= 0) return Status::ok();
  int value = static_cast<int>(std::min<int64_t>(bytes, std::numeric_limits<int>::max()));
  return setIntOption(fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, value, "setsockopt(TCP_NOTSENT_LOWAT)");
}

// --- listen / accept / connect

Result<Fd> listenOn(const SocketAddress& address, const ListenOptions& options) {
  Fd fd(::socket(address.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) return errnoStatus(errno, "socket");
  if (options.reuseAddress) {
    SHOAL_TRY(setIntOption(fd.get(), SOL_SOCKET, SO_REUSEADDR, 1, "setsockopt(SO_REUSEADDR)"));
  }
  SHOAL_TRY(setBufferSizes(fd.get(), options.bufferBytes));
  if (::bind(fd.get(), address.raw(), address.length()) != 0)
    return errnoStatus(errno, str("bind ", address.toString()));
  if (::listen(fd.get(), options.backlog) != 0)
    return errnoStatus(errno, str("listen ", address.toString()));
  return fd;
}

Result<SocketAddress> localAddressOf(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0)
    return errnoStatus(errno, "getsockname");
  return SocketAddress::fromSockaddr(reinterpret_cast<sockaddr*>(&ss), len);
}

Result<SocketAddress> peerAddressOf(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0)
    return errnoStatus(errno, "getpeername");
  return SocketAddress::fromSockaddr(reinterpret_cast<sockaddr*>(&ss), len);
}

Result<Fd> acceptOne(int listenFd, SocketAddress* peer) {
  for (;;) {
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    int fd = ::accept4(listenFd, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      if (peer) *peer = SocketAddress::fromSockaddr(reinterpret_cast<sockaddr*>(&ss), len);
      return Fd(fd);
    }
    if (errno == EINTR) continue;
    // Nothing pending, or a connection that died in the queue or whose
    // network went away (accept(2): to be treated as EAGAIN): not our error.
    switch (errno) {
      case EAGAIN:
#if EWOULDBLOCK != EAGAIN
      case EWOULDBLOCK:
#endif
      case ECONNABORTED:
      case EPROTO:
      case ENETDOWN:
      case ENOPROTOOPT:
      case EHOSTDOWN:
      case ENONET:
      case EHOSTUNREACH:
      case EOPNOTSUPP:
      case ENETUNREACH:
        return Fd();
      default:
        break;
    }
    return errnoStatus(errno, "accept");
  }
}

RetryPolicy RetryPolicy::fromParams() {
  const Params& p = params();
  RetryPolicy policy;
  policy.retries = static_cast<int>(std::max<int64_t>(0, p.connectRetryCount));
  policy.sleepMs = std::max<int64_t>(0, p.connectRetrySleepMs);
  policy.bufferBytes = p.socketBufferBytes;
  return policy;
}

Result<Fd> connectWithRetry(const SocketAddress& address, Deadline deadline, const RetryPolicy& policy) {
  int64_t startNs = nowNs();
  int attempts = 0;
  for (;;) {
    ++attempts;
    Attempt attempt = connectOnce(address, deadline, policy.bufferBytes);
    if (attempt.fd) {
      if (attempts > 1)
        SHOAL_INFO(subsys::kNet, "connected to ", address.toString(), " after ", attempts, " attempts");
      return std::move(attempt.fd);
    }
    int64_t elapsedMs = (nowNs() - startNs) / 1000000;
    if (deadline.cancelled())
      return error(Code::kAborted, "connect to ", address.toString(), ": cancelled after ", elapsedMs,
                   " ms (", attempts, attempts == 1 ? " attempt)" : " attempts)");
    if (attempt.timedOut)
      return error(Code::kTimeout, "connect to ", address.toString(), ": timed out after ", elapsedMs,
                   " ms (", attempts, " attempts)");
    if (!retryableConnectError(attempt.error) || attempts > policy.retries)
      return errnoStatus(attempt.error, str("connect to ", address.toString(), " (", attempts,
                                            attempts == 1 ? " attempt)" : " attempts)"));
    int64_t sleepMs = policy.sleepMs * attempts;
    if (deadline.remainingMs() <= sleepMs)
      return error(Code::kTimeout, "connect to ", address.toString(), ": ",
                   errnoStatus(attempt.error, "last attempt").message(), "; deadline reached after ",
                   elapsedMs, " ms (", attempts, " attempts)");
    // In slices, so that a cancelled deadline ends the wait promptly (the
    // next attempt then reports it).
    const int64_t retryAtNs = nowNs() + sleepMs * 1000000;
    for (int64_t leftNs; (leftNs = retryAtNs - nowNs()) > 0 && !deadline.cancelled();)
      std::this_thread::sleep_for(
          std::chrono::nanoseconds(std::min(leftNs, Deadline::kCancelCheckMs * 1000000)));
  }
}

ListenerAnswer probeListener(const SocketAddress& address, Deadline deadline) {
  const Attempt attempt = connectOnce(address, deadline, 0);
  if (attempt.fd) return ListenerAnswer::kAccepts;
  return attempt.error == ECONNREFUSED ? ListenerAnswer::kRefuses : ListenerAnswer::kUnknown;
}

// --- blocking-style I/O

Result<bool> waitReadable(int fd, Deadline deadline) { return waitFor(fd, POLLIN, deadline); }

Status readExact(int fd, void* data, size_t bytes, Deadline deadline, std::string_view what) {
  auto* p = static_cast<uint8_t*>(data);
  size_t done = 0;
  while (done < bytes) {
    IoResult io = readSome(fd, p + done, bytes - done);
    if (!io.ok()) return ioStatus(io, what);
    done += io.bytes;
    if (done == bytes) break;
    if (io.bytes == 0) {
      SHOAL_ASSIGN_OR_RETURN(bool ready, waitFor(fd, POLLIN, deadline));
      if (!ready)
        return waitEnded(deadline, what, done, bytes, "received");
    }
  }
  return Status::ok();
}

Status writeExact(int fd, const void* data, size_t bytes, Deadline deadline, std::string_view what) {
  const auto* p = static_cast<const uint8_t*>(data);
  size_t done = 0;
  while (done < bytes) {
    IoResult io = writeSome(fd, p + done, bytes - done);
    if (!io.ok()) return ioStatus(io, what);
    done += io.bytes;
    if (done == bytes) break;
    if (io.bytes == 0) {
      SHOAL_ASSIGN_OR_RETURN(bool ready, waitFor(fd, POLLOUT, deadline));
      if (!ready)
        return waitEnded(deadline, what, done, bytes, "sent");
    }
  }
  return Status::ok();
}

// --- partial I/O

namespace {

// One non-blocking syscall, retried on EINTR: the bytes it moved, the peer's
// close (a read of 0 bytes when some were asked for), or its errno; EAGAIN
// is none of them.
template <typename Syscall>
IoResult nonBlockingIo(Syscall syscall, bool reading, bool askedForBytes) {
  IoResult io;
  for (;;) {
    ssize_t n = syscall();
    if (n > 0 || (n == 0 && !reading)) {
      io.bytes = static_cast<size_t>(n);
    } else if (n == 0) {
      io.closed = askedForBytes;
    } else if (errno == EINTR) {
      continue;
    } else if (errno != EAGAIN && errno != EWOULDBLOCK) {
      io.error = errno;
    }
    return io;
  }
}

msghdr messageOf(const iovec* iov, int count) {
  msghdr msg{};
  msg.msg_iov = const_cast<iovec*>(iov);
  msg.msg_iovlen = static_cast<size_t>(count);
  return msg;
}

}  // namespace

IoResult readSome(int fd, void* data, size_t bytes) {
  return nonBlockingIo([&] { return ::recv(fd, data, bytes, MSG_DONTWAIT); }, true, bytes > 0);
}

IoResult readvSome(int fd, const iovec* iov, int count) {
  msghdr msg = messageOf(iov, count);
  return nonBlockingIo([&] { return ::recvmsg(fd, &msg, MSG_DONTWAIT); }, true, true);
}

IoResult writeSome(int fd, const void* data, size_t bytes) {
  return nonBlockingIo([&] { return ::send(fd, data, bytes, MSG_NOSIGNAL | MSG_DONTWAIT); }, false,
                       bytes > 0);
}

IoResult writevSome(int fd, const iovec* iov, int count) {
  msghdr msg = messageOf(iov, count);
  return nonBlockingIo([&] { return ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT); }, false, true);
}

Status ioStatus(const IoResult& io, std::string_view what) {
  if (io.closed) return remoteError(what, ": connection closed by peer");
  if (io.error == ECONNRESET) return remoteError(what, ": connection reset by peer");
  if (io.error == EPIPE) return remoteError(what, ": connection closed by peer (broken pipe)");
  return errnoStatus(io.error, what);
}

int64_t silentAfterMs(const LivenessOptions& options) {
  return (static_cast<int64_t>(options.keepIdleS) + static_cast<int64_t>(options.keepCount) * options.keepIntervalS) *
         1000;
}

Status checkIdleSocket(int fd, int64_t silentMs, std::string_view what) {
  uint8_t byte = 0;
  ssize_t n = ::recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n == 0) return ioStatus(IoResult{0, 0, true}, what);
  if (n > 0) return Status::ok();  // the peer has sent something: it is there
  if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
    return ioStatus(IoResult{0, errno, false}, what);
  tcp_info info{};
  socklen_t length = sizeof(info);
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &length) != 0) return errnoStatus(errno, what);
  // The last thing heard from the peer's host: data, or an ACK (of data, a
  // window probe or a keepalive probe).
  int64_t quietMs = std::min<int64_t>(info.tcpi_last_data_recv, info.tcpi_last_ack_recv);
  if (silentMs > 0 && quietMs >= silentMs)
    return remoteError(what, ": no answer from the peer's host for ", quietMs / 1000,
                       " s (not even to keepalive probes: the host is down or unreachable; ",
                       info.tcpi_unacked, " segments unacknowledged)");
  return Status::ok();
}

}  // namespace shoal::net
