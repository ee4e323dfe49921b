// fuzz_socket_ifname: NCCL_SOCKET_IFNAME and NCCL_SOCKET_FAMILY
// (src/net/interfaces.cc): InterfaceFilter::parse and selectInterfaces, the
// pure rules chooseInterface() applies to the machine's interfaces.
//
// Input: text lines. Line 1 is NCCL_SOCKET_IFNAME, line 2 NCCL_SOCKET_FAMILY;
// every further line is a synthetic interface "<f><name>", whose flags byte f
// says: bit0 up, bit1 IFF_LOOPBACK, bit2 IPv6 (else IPv4), bit3 IPv6
// link-local. The same rules also run over this machine's real interfaces.
//
// Properties: every chosen interface is up, of the requested family, not
// link-local, and matches the filter; with a filter, every usable interface
// that matches is chosen (each once); filter names are non-empty and carry
// no ',' or ':' and no surrounding spaces.
#include <arpa/inet.h>

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_common.h"
#include "net/interfaces.h"

namespace {

using namespace shoal::net;

std::vector<std::string_view> splitLines(std::string_view text) {
  std::vector<std::string_view> lines;
  while (true) {
    size_t nl = text.find('\n');
    lines.push_back(text.substr(0, nl));
    if (nl == std::string_view::npos) break;
    text.remove_prefix(nl + 1);
  }
  return lines;
}

NetInterface synthetic(std::string_view line, int index) {
  uint8_t f = line.empty() ? 0 : static_cast<uint8_t>(line[0]);
  NetInterface itf;
  itf.name = std::string(line.empty() ? line : line.substr(1));
  itf.up = f & 1;
  itf.loopback = f & 2;
  if (f & 4) {
    uint8_t v6[16] = {0x20, 0x01, 0x0d, 0xb8};
    if (f & 8) v6[0] = 0xfe, v6[1] = 0x80, v6[2] = 0, v6[3] = 0;
    v6[15] = static_cast<uint8_t>(index);
    itf.address = SocketAddress::fromIpv6(v6, 0, (f & 8) ? 1 : 0);
  } else {
    uint8_t v4[4] = {10, 0, 0, static_cast<uint8_t>(index)};
    if (f & 2) v4[0] = 127;
    itf.address = SocketAddress::fromIpv4(v4, 0);
  }
  return itf;
}

void checkChoice(const std::vector<NetInterface>& all, std::string_view spec, std::string_view family) {
  shoal::Result<std::vector<NetInterface>> chosen = selectInterfaces(all, spec, family);
  if (!chosen.isOk()) return;
  const std::vector<NetInterface>& list = chosen.value();
  FUZZ_CHECK(list.size() <= all.size(), "%zu chosen of %zu", list.size(), all.size());
  InterfaceFilter filter = InterfaceFilter::parse(spec);
  for (const NetInterface& itf : list) {
    FUZZ_CHECK(itf.up, "a down interface was chosen");
    FUZZ_CHECK(!itf.address.isLinkLocal(), "a link-local address was chosen");
    FUZZ_CHECK(itf.address.family() == AF_INET || itf.address.family() == AF_INET6, "family %d chosen",
               itf.address.family());
    if (!spec.empty()) FUZZ_CHECK(filter.matches(itf.name), "'%s' chosen but not matched", itf.name.c_str());
  }
  if (!spec.empty() && family.empty()) {
    // Every usable interface the filter matches is chosen, once.
    size_t usableMatches = 0;
    for (const NetInterface& itf : all) {
      bool familyOk = itf.address.family() == AF_INET || itf.address.family() == AF_INET6;
      if (itf.up && familyOk && !itf.address.isLinkLocal() && filter.matches(itf.name)) ++usableMatches;
    }
    FUZZ_CHECK(list.size() == usableMatches, "%zu chosen, %zu usable interfaces match", list.size(), usableMatches);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  std::vector<std::string_view> lines = splitLines(text);
  std::string_view spec = lines[0];
  std::string_view family = lines.size() > 1 ? lines[1] : std::string_view();

  InterfaceFilter filter = InterfaceFilter::parse(spec);
  for (const std::string& name : filter.names) {
    FUZZ_CHECK(!name.empty(), "an empty name in the filter");
    FUZZ_CHECK(name.find(',') == std::string::npos && name.find(':') == std::string::npos,
               "separator kept in filter name '%s'", name.c_str());
    FUZZ_CHECK(name.front() != ' ' && name.back() != ' ', "spaces kept around filter name '%s'", name.c_str());
  }

  std::vector<NetInterface> all;
  for (size_t i = 2; i < lines.size() && i < 66; ++i) all.push_back(synthetic(lines[i], static_cast<int>(i)));
  checkChoice(all, spec, family);

  static const std::vector<NetInterface> real = [] {
    shoal::Result<std::vector<NetInterface>> r = listInterfaces();
    return r.isOk() ? r.value() : std::vector<NetInterface>();
  }();
  checkChoice(real, spec, family);
  return 0;
}
