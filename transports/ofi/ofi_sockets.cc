#include "transports/ofi/ofi_sockets.h"

#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cstdlib>
#include <cstring>
#include <memory>

#include "core/log.h"
#include "net/socket.h"
#include "net/socket_address.h"

namespace shoal::ofi {

namespace {

net::SocketAddress socketAddress(std::string_view name) {
  if (name.size() < sizeof(sockaddr) || name.size() > sizeof(sockaddr_storage)) return {};
  sockaddr_storage storage{};
  std::memcpy(&storage, name.data(), name.size());  // fi_getname bytes need not be aligned
  return net::SocketAddress::fromSockaddr(reinterpret_cast<const sockaddr*>(&storage),
                                          static_cast<socklen_t>(name.size()));
}

}  // namespace

std::string ProviderSockets::socketName(std::string_view name) {
  net::SocketAddress address = socketAddress(name);
  return address.empty() ? "" : address.toString();
}

void ProviderSockets::addLocal(std::string_view name) {
  if (std::string text = socketName(name); !text.empty()) local_.insert(std::move(text));
}

void ProviderSockets::addPeer(std::string_view name, bool sameKernel) {
  net::SocketAddress address = socketAddress(name);
  if (address.empty()) return;
  peers_.insert(address.toString());
  peerHosts_.insert(address.hostString());
  if (sameKernel) sameKernelHosts_.insert(address.hostString());
}

int ProviderSockets::adopt() {
  if (!active() || (lowat_ <= 0 && sameKernelHosts_.empty())) return 0;
  std::unique_ptr<DIR, int (*)(DIR*)> dir(opendir("/proc/self/fd"), closedir);
  if (!dir) return 0;
  const int own = dirfd(dir.get());
  int found = 0;
  while (const dirent* entry = readdir(dir.get())) {
    char* end = nullptr;
    long number = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || number == own) continue;
    const int fd = static_cast<int>(number);
    struct stat st {};
    // A descriptor closed (even reused) since readdir fails or mismatches below.
    if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    if (adopted_.count(st.st_ino) != 0 || settled_.count(st.st_ino) != 0) continue;
    int protocol = 0;
    socklen_t length = sizeof(protocol);
    if (getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &protocol, &length) != 0 || protocol != IPPROTO_TCP) {
      settled_.insert(st.st_ino);  // never a TCP socket (udp providers' too)
      continue;
    }
    Result<net::SocketAddress> local = net::localAddressOf(fd);
    if (!local.isOk() || local->empty()) continue;
    Result<net::SocketAddress> peer = net::peerAddressOf(fd);
    const bool connected = peer.isOk() && !peer->empty();
    bool ours = local_.count(local->toString()) != 0 || (connected && peers_.count(peer->toString()) != 0);
    if (!ours) {
      // Its addresses cannot change once it listens or is connected.
      int listening = 0;
      length = sizeof(listening);
      if (connected || (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &length) == 0 && listening != 0))
        settled_.insert(st.st_ino);
      continue;
    }
    if (connected && sendBuffer_ > 0 && peerHosts_.count(peer->hostString()) == 0) continue;  // not yet known
    const bool sized = sendBuffer_ > 0 && connected && sameKernelHosts_.count(peer->hostString()) != 0;
    Status s = net::setNotsentLowat(fd, lowat_);
    if (s.isOk() && sized) s = net::setSendBuffer(fd, sendBuffer_);
    if (!s.isOk()) {
      if (fcntl(fd, F_GETFD) == -1) continue;  // closed while we looked
      SHOAL_WARN("ofi: could not set the options of libfabric's socket ", local->toString(), " (", s.message(),
                 "); its sockets keep the system's defaults");
      failed_ = true;
      return found;
    }
    sized_ += sized ? 1 : 0;
    adopted_.insert(st.st_ino);
    ++found;
  }
  return found;
}

}  // namespace shoal::ofi
