#include "net/unix_socket.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "core/log.h"
#include "core/process.h"
#include "net/crypto.h"

namespace shoal::net {

sockaddr_un abstractAddress(const std::string& name, socklen_t& length) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const size_t n = std::min(name.size(), sizeof(addr.sun_path) - 1);
  std::memcpy(addr.sun_path + 1, name.data(), n);  // sun_path[0] == 0: the abstract namespace
  length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
  return addr;
}

Result<Fd> listenAbstract(const std::string& prefix, std::string& name) {
  uint64_t nonce = 0;
  SHOAL_TRY(randomBytes(&nonce, sizeof nonce)) << "naming a Unix socket";
  const std::string text = str(prefix, "-", currentPid(), "-", hex64(nonce));
  Fd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd) return systemError("socket(AF_UNIX): ", std::strerror(errno));
  socklen_t length = 0;
  sockaddr_un addr = abstractAddress(text, length);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), length) != 0 || ::listen(fd.get(), 256) != 0)
    return systemError("listening on @", text, ": ", std::strerror(errno));
  name = text;
  return fd;
}

Result<Fd> connectAbstract(const std::string& name, Deadline deadline) {
  socklen_t length = 0;
  sockaddr_un addr = abstractAddress(name, length);
  for (;;) {
    // Non-blocking: a listener whose backlog is full answers EAGAIN at once
    // instead of holding us past the deadline.
    Fd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd) return systemError("socket(AF_UNIX): ", std::strerror(errno));
    if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), length) == 0) return fd;
    const int err = errno;
    if ((err != EAGAIN && err != ECONNREFUSED && err != EINTR) || deadline.expired())
      return remoteError("cannot reach the socket @", name, ": ", std::strerror(err));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

Fd acceptSameUser(int listener) {
  for (;;) {
    Fd fd(::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!fd) return fd;
    ucred cred{};
    socklen_t len = sizeof cred;
    if (::getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && cred.uid == ::getuid()) return fd;
    SHOAL_INFO(subsys::kNet, "refused a Unix socket connection from uid ", cred.uid, " (pid ", cred.pid, ")");
  }
}

Status sendWithDescriptors(int socket, const void* bytes, size_t size, std::span<const int> fds) {
  iovec iov{const_cast<void*>(bytes), size};
  std::vector<char> control(CMSG_SPACE(fds.size() * sizeof(int)), 0);
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (!fds.empty()) {
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(fds.size() * sizeof(int));
    std::memcpy(CMSG_DATA(c), fds.data(), fds.size() * sizeof(int));
  }
  ssize_t sent;
  do sent = ::sendmsg(socket, &msg, MSG_NOSIGNAL);
  while (sent < 0 && errno == EINTR);
  if (sent != static_cast<ssize_t>(size))
    return systemError("sendmsg with ", fds.size(), " descriptors: ", sent < 0 ? std::strerror(errno) : "short write");
  return Status::ok();
}

Result<std::vector<Fd>> receiveWithDescriptors(int socket, void* bytes, size_t size, size_t fds) {
  iovec iov{bytes, size};
  std::vector<char> control(CMSG_SPACE(std::max<size_t>(fds, 1) * sizeof(int)), 0);
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control.data();
  msg.msg_controllen = control.size();
  const ssize_t got = ::recvmsg(socket, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return error(Code::kAgain, "not yet");
  if (got < 0) return systemError("recvmsg: ", std::strerror(errno));
  std::vector<Fd> received;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < n; ++i) {
      int fd = -1;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      received.emplace_back(fd);
    }
  }
  if (got != static_cast<ssize_t>(size) || received.size() != fds || (msg.msg_flags & MSG_CTRUNC))
    return invalidArgument("malformed message (", got, " of ", size, " bytes, ", received.size(), " of ", fds,
                           " descriptors)");
  return received;
}

}  // namespace shoal::net
