// ProviderSockets: the TCP sockets that libfabric's socket providers
// (tcp;ofi_rxm) open for a rail's endpoints, found by their addresses and
// given the tcp transport's cap on unsent bytes (TCP_NOTSENT_LOWAT) and,
// towards peers on this kernel, its send buffer (SO_SNDBUF, decision 0012).
//
// Why: a rank that writes megabytes into a socket at once leaves most of them
// to be sent later from the core that receives the acknowledgements; over
// veth links that reorders segments into tens of thousands of spurious
// retransmissions per 64 MiB (docs/decisions/0009). The tcp transport caps
// its own sockets; libfabric opens and owns these and has no setting for it
// (decision 0010).
// How: a provider connection's socket has one of our endpoints' addresses as
// its local address (we accepted it, or it is the listening socket) or a
// peer endpoint's address as its remote one (we connected it). adopt() looks
// through the process's descriptors for such TCP sockets it has not seen yet.
// Names that are not IPv4/IPv6 socket addresses (shm, efa) match nothing.
// Thread: not thread-safe; the owning Rail calls it under its mutex.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_set>

namespace shoal::ofi {

class ProviderSockets {
 public:
  // Either value <= 0: that option is left alone; both: adopt() does nothing.
  ProviderSockets(int64_t notsentLowat, int64_t sameKernelSendBuffer)
      : lowat_(notsentLowat), sendBuffer_(sameKernelSendBuffer) {}

  // fi_getname bytes of one of our endpoints / of a peer's endpoint;
  // `sameKernel`: that peer runs on this kernel (PeerInfo::sameKernel), so
  // sockets to or from its host get the send buffer.
  void addLocal(std::string_view name);
  void addPeer(std::string_view name, bool sameKernel);
  // Whether adopt() can find anything: an option to set and our endpoints'
  // names are socket addresses.
  bool active() const { return (lowat_ > 0 || sendBuffer_ > 0) && !local_.empty() && !failed_; }

  // Sets the options on every TCP socket of the process, not adopted before,
  // that matches (see How); the send buffer only on connected sockets whose
  // remote host is a same-kernel peer's (an accepted socket's port is not
  // the peer's endpoint port, its host is). An accepted socket from a host
  // no peer has yet (its peer dialled before we inserted its address) waits
  // for a later look, so it is sized once the peer is known. Returns how
  // many it newly adopted. A failing setsockopt on a socket still open is logged and ends
  // adoption for good (speed only, never an error).
  int adopt();
  size_t adopted() const { return adopted_.size(); }
  size_t sized() const { return sized_; }
  int64_t lowat() const { return lowat_; }
  int64_t sendBuffer() const { return sendBuffer_; }

  // "10.0.0.1:5000" for a sockaddr_in/sockaddr_in6 of `name`'s bytes, "" otherwise.
  static std::string socketName(std::string_view name);

 private:
  const int64_t lowat_;
  const int64_t sendBuffer_;
  std::unordered_set<std::string> local_;
  std::unordered_set<std::string> peers_;
  std::unordered_set<std::string> peerHosts_;        // SocketAddress::hostString()
  std::unordered_set<std::string> sameKernelHosts_;  // a subset of peerHosts_
  size_t sized_ = 0;
  // Socket inodes (a descriptor number can be reused): capped, and not ours
  // for good (not TCP, or listening or connected to someone else); sockets
  // still unconnected are looked at again.
  std::unordered_set<ino_t> adopted_;
  std::unordered_set<ino_t> settled_;
  bool failed_ = false;
};

}  // namespace shoal::ofi
