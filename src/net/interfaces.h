// Network interface selection with NCCL_SOCKET_IFNAME / NCCL_SOCKET_FAMILY
// semantics.
//
// Role: decides which local address Shoal listens on (bootstrap root, tcp
// transport). The rules are a pure function over a list of interfaces
// (selectInterfaces), so that tests can feed synthetic lists; listInterfaces()
// reads the real ones with getifaddrs.
// Thread: any; no state.
//
// Rules (NCCL's):
//   NCCL_SOCKET_IFNAME  comma list of name prefixes: "eth,ib" matches eth0, ib1.
//                       A leading "^" excludes the listed names: "^docker,lo".
//                       A leading "=" (after "^" if both) matches whole names:
//                       "=eth0" matches eth0 but not eth01.
//   unset               interfaces whose name starts with "ib" first, then any
//                       other that is not loopback ("lo*") and not "docker*";
//                       if there is none, loopback.
//   NCCL_SOCKET_FAMILY  AF_INET or AF_INET6 keeps only that family; unset keeps
//                       both, IPv4 before IPv6 within an interface.
// Interfaces that are down are never chosen; IPv6 link-local addresses (which
// need a scope id everywhere) are skipped.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "net/socket_address.h"

namespace shoal::net {

struct NetInterface {
  std::string name;        // "eth0"
  SocketAddress address;   // port 0
  bool up = true;
  bool loopback = false;   // IFF_LOOPBACK
};

// A parsed NCCL_SOCKET_IFNAME value.
struct InterfaceFilter {
  bool exclude = false;   // leading '^'
  bool exact = false;     // leading '='
  std::vector<std::string> names;

  static InterfaceFilter parse(std::string_view spec);
  bool matches(std::string_view interfaceName) const;
};

// Every address of every interface, in getifaddrs order.
Result<std::vector<NetInterface>> listInterfaces();

// Candidates in order of preference (the first is the one to use); empty when
// nothing matches. `family` is NCCL_SOCKET_FAMILY's value ("" for either);
// an unknown family is kInvalidArgument.
Result<std::vector<NetInterface>> selectInterfaces(const std::vector<NetInterface>& all,
                                                   std::string_view ifnameSpec,
                                                   std::string_view family);

// The interface Shoal uses in this process: selectInterfaces(listInterfaces(),
// params().socketIfname, params().socketFamily).front(), or an error that lists
// what exists.
Result<NetInterface> chooseInterface();

}  // namespace shoal::net
