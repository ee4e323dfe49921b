// fuzz_comm_id: the parsing of NCCL_COMM_ID, "<ip>:<port>" or "[<ipv6>]:<port>"
// (net::SocketAddress in src/net/socket_address.cc), which
// createUniqueId() (src/bootstrap/unique_id.cc) turns into the id of every
// rank's root.
//
// SocketAddress::resolve() first tries the numeric parse fuzzed here, then
// asks getaddrinfo about host names; the harness never lets a name reach
// getaddrinfo (no DNS from a fuzzer): only text that parse() accepts goes on
// to createUniqueId() through the environment, as a user's NCCL_COMM_ID does.
//
// Properties: toString() of a parsed address parses back to the same
// address; createUniqueId() accepts every numeric address parse() accepts
// and its id survives encodeUniqueId/decodeUniqueId with that address --
// except port 0, which no rank could reach and createUniqueId() refuses.
#include <cstdlib>
#include <cstring>
#include <string>

#include "bootstrap/bootstrap.h"
#include "core/params.h"
#include "fuzz_common.h"
#include "net/socket_address.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using shoal::net::SocketAddress;
  std::string text(reinterpret_cast<const char*>(data), size);
  shoal::Result<SocketAddress> parsed = SocketAddress::parse(text);
  if (!parsed.isOk()) return 0;
  const SocketAddress& a = parsed.value();
  FUZZ_CHECK(a.family() == AF_INET || a.family() == AF_INET6, "family %d", a.family());
  std::string canonical = a.toString();
  shoal::Result<SocketAddress> back = SocketAddress::parse(canonical);
  FUZZ_CHECK(back.isOk(), "toString() output does not parse: %s", canonical.c_str());
  FUZZ_CHECK(back.value() == a, "parse(toString(a)) != a for %s", canonical.c_str());
  (void)a.hostString();
  (void)a.isLoopback();
  (void)a.isLinkLocal();

  if (text.find('\0') != std::string::npos) return 0;  // the environment cannot carry it
  ::setenv("NCCL_COMM_ID", text.c_str(), 1);
  shoal::reloadParams();
  shoal::Result<shoal::UniqueIdContents> id = shoal::createUniqueId();
  ::unsetenv("NCCL_COMM_ID");
  if (a.port() == 0) {  // no rank could reach such a root: refused at creation
    FUZZ_CHECK(!id.isOk(), "createUniqueId accepted NCCL_COMM_ID=%s with port 0", text.c_str());
    return 0;
  }
  FUZZ_CHECK(id.isOk(), "createUniqueId refused NCCL_COMM_ID=%s: %s", text.c_str(), id.status().message().c_str());
  FUZZ_CHECK(id.value().address == canonical, "id address %s for %s", id.value().address.c_str(), canonical.c_str());
  char bytes[shoal::UniqueIdContents::kBytes];
  shoal::encodeUniqueId(id.value(), bytes);
  shoal::Result<shoal::UniqueIdContents> decoded = shoal::decodeUniqueId(bytes);
  FUZZ_CHECK(decoded.isOk(), "the NCCL_COMM_ID id does not decode: %s", decoded.status().message().c_str());
  FUZZ_CHECK(decoded.value().address == canonical && decoded.value().magic == id.value().magic &&
                 std::memcmp(decoded.value().secret, id.value().secret, 32) == 0,
             "the NCCL_COMM_ID id changed on the way through its 128 bytes");
  return 0;
}
