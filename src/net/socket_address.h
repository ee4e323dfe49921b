// SocketAddress: an IPv4 or IPv6 address with a port, as a value.
//
// Role: the one representation of "where to connect / listen" for the
// bootstrap and the tcp transport. Text forms: "10.0.0.1:5000" and
// "[fe80::1]:5000" (toString() produces exactly what parse() accepts).
// Thread: a plain value; any thread.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"

namespace shoal::net {

class SocketAddress {
 public:
  SocketAddress() = default;  // empty: family() == AF_UNSPEC
  static SocketAddress fromSockaddr(const sockaddr* addr, socklen_t length);
  // IPv4 from 4 network-order bytes, IPv6 from 16; port in host order.
  static SocketAddress fromIpv4(const uint8_t bytes[4], uint16_t port);
  static SocketAddress fromIpv6(const uint8_t bytes[16], uint16_t port, uint32_t scopeId = 0);

  // Numeric forms only: "a.b.c.d:port", "[v6]:port" (a v6 may carry "%ifname"
  // or "%scope" before "]"). kInvalidArgument otherwise.
  static Result<SocketAddress> parse(std::string_view text);
  // parse(), else "hostname:port" resolved with getaddrinfo (IPv4 first).
  static Result<SocketAddress> resolve(std::string_view text);

  bool empty() const { return length_ == 0; }
  int family() const { return storage_.ss_family; }
  uint16_t port() const;
  void setPort(uint16_t port);
  bool isLoopback() const;
  bool isLinkLocal() const;  // IPv6 fe80::/10 (needs a scope id to be used)

  const sockaddr* raw() const { return reinterpret_cast<const sockaddr*>(&storage_); }
  socklen_t length() const { return length_; }

  // "10.0.0.1:5000" or "[::1]:5000".
  std::string toString() const;
  // "10.0.0.1" or "::1", without the port.
  std::string hostString() const;

  bool operator==(const SocketAddress& other) const;

 private:
  sockaddr_storage storage_{};
  socklen_t length_ = 0;
};

}  // namespace shoal::net
