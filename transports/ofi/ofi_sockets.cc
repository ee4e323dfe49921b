#include "transports/ofi/ofi_sockets.h"

#include <dirent.h>
#include <sys/stat.h>

#include <cstdlib>
#include <cstring>
#include <memory>

#include "core/log.h"
#include "net/socket.h"
#include "net/socket_address.h"

namespace shoal::ofi {

std::string ProviderSockets::socketName(std::string_view name) {
  if (name.size() < sizeof(sockaddr) || name.size() > sizeof(sockaddr_storage)) return "";
  sockaddr_storage storage{};
  std::memcpy(&storage, name.data(), name.size());  // fi_getname bytes need not be aligned
  net::SocketAddress address =
      net::SocketAddress::fromSockaddr(reinterpret_cast<const sockaddr*>(&storage), static_cast<socklen_t>(name.size()));
  return address.empty() ? "" : address.toString();
}

void ProviderSockets::addLocal(std::string_view name) {
  if (std::string text = socketName(name); !text.empty()) local_.insert(std::move(text));
}

void ProviderSockets::addPeer(std::string_view name) {
  if (std::string text = socketName(name); !text.empty()) peers_.insert(std::move(text));
}

int ProviderSockets::adopt() {
  if (!active()) return 0;
  std::unique_ptr<DIR, int (*)(DIR*)> dir(opendir("/proc/self/fd"), closedir);
  if (!dir) return 0;
  const int own = dirfd(dir.get());
  int found = 0;
  while (const dirent* entry = readdir(dir.get())) {
    char* end = nullptr;
    long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == own) continue;
    struct stat st {};
    // A descriptor closed (even reused) since readdir fails or mismatches below.
    if (fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode) || adopted_.count(st.st_ino) != 0) continue;
    Result<net::SocketAddress> local = net::localAddressOf(static_cast<int>(fd));
    if (!local.isOk() || local->empty()) continue;  // not an IP socket
    bool ours = local_.count(local->toString()) != 0;
    if (!ours) {
      Result<net::SocketAddress> peer = net::peerAddressOf(static_cast<int>(fd));
      ours = peer.isOk() && !peer->empty() && peers_.count(peer->toString()) != 0;
    }
    if (!ours) continue;
    if (Status s = net::setNotsentLowat(static_cast<int>(fd), lowat_); !s.isOk()) {
      SHOAL_WARN("ofi: could not cap the unsent bytes of libfabric's socket ", local->toString(), " (", s.message(),
                 "); its sockets keep the system's default");
      failed_ = true;
      return found;
    }
    adopted_.insert(st.st_ino);
    ++found;
  }
  return found;
}

}  // namespace shoal::ofi
