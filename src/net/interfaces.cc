#include "net/interfaces.h"

#include <ifaddrs.h>
#include <net/if.h>
#include <strings.h>

#include <algorithm>
#include <cerrno>

#include "core/log.h"
#include "core/params.h"

namespace shoal::net {
namespace {

bool startsWith(std::string_view text, std::string_view prefix) {
  return text.substr(0, prefix.size()) == prefix;
}

// -1: error, 0: either, else AF_INET / AF_INET6.
int parseFamily(std::string_view family) {
  std::string f(family);
  if (f.empty()) return 0;
  if (strcasecmp(f.c_str(), "AF_INET") == 0 || f == "4" || strcasecmp(f.c_str(), "inet") == 0 ||
      strcasecmp(f.c_str(), "ipv4") == 0)
    return AF_INET;
  if (strcasecmp(f.c_str(), "AF_INET6") == 0 || f == "6" || strcasecmp(f.c_str(), "inet6") == 0 ||
      strcasecmp(f.c_str(), "ipv6") == 0)
    return AF_INET6;
  return -1;
}

bool isLoopbackInterface(const NetInterface& itf) { return itf.loopback || startsWith(itf.name, "lo"); }

// Usable at all: up, an address family we speak, not an IPv6 link-local.
bool usable(const NetInterface& itf, int family) {
  if (!itf.up) return false;
  int f = itf.address.family();
  if (f != AF_INET && f != AF_INET6) return false;
  if (family != 0 && f != family) return false;
  return !itf.address.isLinkLocal();
}

// Stable order: by interface (first appearance), IPv4 before IPv6 within one.
std::vector<NetInterface> orderByInterface(std::vector<NetInterface> list) {
  std::vector<std::string> order;
  for (const auto& itf : list)
    if (std::find(order.begin(), order.end(), itf.name) == order.end()) order.push_back(itf.name);
  auto rank = [&](const NetInterface& itf) {
    size_t pos = std::find(order.begin(), order.end(), itf.name) - order.begin();
    return pos * 2 + (itf.address.family() == AF_INET ? 0 : 1);
  };
  std::stable_sort(list.begin(), list.end(),
                   [&](const NetInterface& a, const NetInterface& b) { return rank(a) < rank(b); });
  return list;
}

}  // namespace

InterfaceFilter InterfaceFilter::parse(std::string_view spec) {
  InterfaceFilter filter;
  // NCCL accepts "^=" ; accept "=^" too.
  for (int i = 0; i < 2 && !spec.empty(); ++i) {
    if (spec.front() == '^') {
      filter.exclude = true;
      spec.remove_prefix(1);
    } else if (spec.front() == '=') {
      filter.exact = true;
      spec.remove_prefix(1);
    }
  }
  while (!spec.empty()) {
    size_t comma = spec.find(',');
    std::string_view item = spec.substr(0, comma);
    // NCCL allows "name:port" items (for IB); the port part is irrelevant here.
    item = item.substr(0, item.find(':'));
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    if (!item.empty()) filter.names.emplace_back(item);
    if (comma == std::string_view::npos) break;
    spec.remove_prefix(comma + 1);
  }
  return filter;
}

bool InterfaceFilter::matches(std::string_view interfaceName) const {
  bool listed = false;
  for (const auto& name : names) {
    if (exact ? interfaceName == name : startsWith(interfaceName, name)) {
      listed = true;
      break;
    }
  }
  return exclude ? !listed : listed;
}

Result<std::vector<NetInterface>> listInterfaces() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return errnoStatus(errno, "getifaddrs");
  std::vector<NetInterface> out;
  for (ifaddrs* ifa = list; ifa != nullptr; ifa = ifa->ifa_next) {
    if (ifa->ifa_addr == nullptr) continue;
    int family = ifa->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    NetInterface itf;
    itf.name = ifa->ifa_name;
    socklen_t len = family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    itf.address = SocketAddress::fromSockaddr(ifa->ifa_addr, len);
    itf.address.setPort(0);
    itf.up = (ifa->ifa_flags & IFF_UP) != 0;
    itf.loopback = (ifa->ifa_flags & IFF_LOOPBACK) != 0;
    out.push_back(std::move(itf));
  }
  freeifaddrs(list);
  return out;
}

Result<std::vector<NetInterface>> selectInterfaces(const std::vector<NetInterface>& all,
                                                   std::string_view ifnameSpec,
                                                   std::string_view family) {
  int fam = parseFamily(family);
  if (fam < 0)
    return invalidArgument("NCCL_SOCKET_FAMILY='", family, "': expected AF_INET or AF_INET6");
  std::vector<NetInterface> candidates;
  for (const auto& itf : all)
    if (usable(itf, fam)) candidates.push_back(itf);

  std::vector<NetInterface> chosen;
  if (!ifnameSpec.empty()) {
    InterfaceFilter filter = InterfaceFilter::parse(ifnameSpec);
    for (const auto& itf : candidates)
      if (filter.matches(itf.name)) chosen.push_back(itf);
    return orderByInterface(std::move(chosen));
  }
  // Default: ib* first, then anything but loopback and docker*, else loopback.
  std::vector<NetInterface> ib, other, loop;
  for (const auto& itf : candidates) {
    if (isLoopbackInterface(itf)) loop.push_back(itf);
    else if (startsWith(itf.name, "docker")) continue;
    else if (startsWith(itf.name, "ib")) ib.push_back(itf);
    else other.push_back(itf);
  }
  chosen = orderByInterface(std::move(ib));
  for (auto& itf : orderByInterface(std::move(other))) chosen.push_back(std::move(itf));
  if (chosen.empty()) chosen = orderByInterface(std::move(loop));
  return chosen;
}

Result<NetInterface> chooseInterface() {
  SHOAL_ASSIGN_OR_RETURN(std::vector<NetInterface> all, listInterfaces());
  const Params& p = params();
  SHOAL_ASSIGN_OR_RETURN(std::vector<NetInterface> chosen,
                         selectInterfaces(all, p.socketIfname, p.socketFamily));
  if (chosen.empty()) {
    std::string available;
    for (const auto& itf : all)
      available += str(available.empty() ? "" : ", ", itf.name, " ", itf.address.hostString(),
                       itf.up ? "" : " (down)");
    return systemError("no usable network interface (NCCL_SOCKET_IFNAME='", p.socketIfname,
                       "', NCCL_SOCKET_FAMILY='", p.socketFamily, "'); interfaces: ",
                       available.empty() ? "none" : available);
  }
  SHOAL_INFO(subsys::kInit | subsys::kNet, "using interface ", chosen.front().name, " ",
             chosen.front().address.hostString());
  return chosen.front();
}

}  // namespace shoal::net
