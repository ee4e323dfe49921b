#include "net/socket_address.h"

#include <arpa/inet.h>
#include <net/if.h>
#include <netdb.h>

#include <cstdlib>
#include <cstring>

namespace shoal::net {
namespace {

// Splits "host:port" / "[host]:port" into host text and a port number.
Status splitHostPort(std::string_view text, std::string& host, uint16_t& port) {
  size_t colon;
  if (!text.empty() && text.front() == '[') {
    size_t close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':')
      return invalidArgument("address '", text, "': expected [ipv6]:port");
    host = std::string(text.substr(1, close - 1));
    colon = close + 1;
  } else {
    colon = text.rfind(':');
    if (colon == std::string_view::npos || colon == 0)
      return invalidArgument("address '", text, "': expected host:port");
    host = std::string(text.substr(0, colon));
    if (host.find(':') != std::string::npos)
      return invalidArgument("address '", text, "': write IPv6 addresses as [addr]:port");
  }
  std::string portText(text.substr(colon + 1));
  char* end = nullptr;
  long value = std::strtol(portText.c_str(), &end, 10);
  if (portText.empty() || *end != '\0' || value < 0 || value > 65535)
    return invalidArgument("address '", text, "': bad port '", portText, "'");
  port = static_cast<uint16_t>(value);
  return Status::ok();
}

bool parseNumericHost(const std::string& host, uint16_t port, SocketAddress& out) {
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) {
    out = SocketAddress::fromIpv4(reinterpret_cast<const uint8_t*>(&v4.s_addr), port);
    return true;
  }
  std::string addr = host;
  uint32_t scope = 0;
  if (auto pct = host.find('%'); pct != std::string::npos) {
    addr = host.substr(0, pct);
    std::string zone = host.substr(pct + 1);
    scope = if_nametoindex(zone.c_str());
    if (scope == 0) {
      char* end = nullptr;
      unsigned long n = std::strtoul(zone.c_str(), &end, 10);
      if (zone.empty() || *end != '\0') return false;
      scope = static_cast<uint32_t>(n);
    }
  }
  in6_addr v6{};
  if (inet_pton(AF_INET6, addr.c_str(), &v6) == 1) {
    out = SocketAddress::fromIpv6(v6.s6_addr, port, scope);
    return true;
  }
  return false;
}

}  // namespace

SocketAddress SocketAddress::fromSockaddr(const sockaddr* addr, socklen_t length) {
  SocketAddress out;
  if (addr == nullptr) return out;
  socklen_t want = addr->sa_family == AF_INET    ? sizeof(sockaddr_in)
                   : addr->sa_family == AF_INET6 ? sizeof(sockaddr_in6)
                                                 : 0;
  if (want == 0 || length < want) return out;
  std::memcpy(&out.storage_, addr, want);
  out.length_ = want;
  return out;
}

SocketAddress SocketAddress::fromIpv4(const uint8_t bytes[4], uint16_t port) {
  SocketAddress out;
  auto* sin = reinterpret_cast<sockaddr_in*>(&out.storage_);
  sin->sin_family = AF_INET;
  sin->sin_port = htons(port);
  std::memcpy(&sin->sin_addr.s_addr, bytes, 4);
  out.length_ = sizeof(sockaddr_in);
  return out;
}

SocketAddress SocketAddress::fromIpv6(const uint8_t bytes[16], uint16_t port, uint32_t scopeId) {
  SocketAddress out;
  auto* sin6 = reinterpret_cast<sockaddr_in6*>(&out.storage_);
  sin6->sin6_family = AF_INET6;
  sin6->sin6_port = htons(port);
  std::memcpy(sin6->sin6_addr.s6_addr, bytes, 16);
  sin6->sin6_scope_id = scopeId;
  out.length_ = sizeof(sockaddr_in6);
  return out;
}

Result<SocketAddress> SocketAddress::parse(std::string_view text) {
  std::string host;
  uint16_t port = 0;
  SHOAL_TRY(splitHostPort(text, host, port));
  SocketAddress out;
  if (!parseNumericHost(host, port, out))
    return invalidArgument("address '", text, "': '", host, "' is not a numeric IPv4/IPv6 address");
  return out;
}

Result<SocketAddress> SocketAddress::resolve(std::string_view text) {
  std::string host;
  uint16_t port = 0;
  SHOAL_TRY(splitHostPort(text, host, port));
  SocketAddress out;
  if (parseNumericHost(host, port, out)) return out;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &list);
  if (rc != 0)
    return invalidArgument("address '", text, "': cannot resolve '", host, "': ", gai_strerror(rc));
  SocketAddress v6;
  for (addrinfo* ai = list; ai != nullptr; ai = ai->ai_next) {
    SocketAddress candidate = fromSockaddr(ai->ai_addr, ai->ai_addrlen);
    if (candidate.family() == AF_INET && out.empty()) out = candidate;
    if (candidate.family() == AF_INET6 && v6.empty()) v6 = candidate;
  }
  freeaddrinfo(list);
  if (out.empty()) out = v6;
  if (out.empty()) return invalidArgument("address '", text, "': no IPv4/IPv6 address for '", host, "'");
  out.setPort(port);
  return out;
}

uint16_t SocketAddress::port() const {
  if (family() == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&storage_)->sin_port);
  if (family() == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage_)->sin6_port);
  return 0;
}

void SocketAddress::setPort(uint16_t port) {
  if (family() == AF_INET) reinterpret_cast<sockaddr_in*>(&storage_)->sin_port = htons(port);
  if (family() == AF_INET6) reinterpret_cast<sockaddr_in6*>(&storage_)->sin6_port = htons(port);
}

bool SocketAddress::isLoopback() const {
  if (family() == AF_INET)
    return (ntohl(reinterpret_cast<const sockaddr_in*>(&storage_)->sin_addr.s_addr) >> 24) == 127;
  if (family() == AF_INET6)
    return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(&storage_)->sin6_addr);
  return false;
}

bool SocketAddress::isLinkLocal() const {
  return family() == AF_INET6 &&
         IN6_IS_ADDR_LINKLOCAL(&reinterpret_cast<const sockaddr_in6*>(&storage_)->sin6_addr);
}

std::string SocketAddress::hostString() const {
  char buf[INET6_ADDRSTRLEN + IF_NAMESIZE + 2] = {};
  if (family() == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&storage_)->sin_addr, buf, sizeof(buf));
    return buf;
  }
  if (family() == AF_INET6) {
    const auto* sin6 = reinterpret_cast<const sockaddr_in6*>(&storage_);
    inet_ntop(AF_INET6, &sin6->sin6_addr, buf, sizeof(buf));
    std::string out = buf;
    if (sin6->sin6_scope_id != 0) out += "%" + std::to_string(sin6->sin6_scope_id);
    return out;
  }
  return "(none)";
}

std::string SocketAddress::toString() const {
  if (family() == AF_INET) return hostString() + ":" + std::to_string(port());
  if (family() == AF_INET6) return "[" + hostString() + "]:" + std::to_string(port());
  return "(none)";
}

bool SocketAddress::operator==(const SocketAddress& other) const {
  return length_ == other.length_ && std::memcmp(&storage_, &other.storage_, length_) == 0;
}

}  // namespace shoal::net
