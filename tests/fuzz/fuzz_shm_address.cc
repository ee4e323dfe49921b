// fuzz_shm_address: shm::parseAddress (transports/shm/shm_transport.cc), the
// "<pid>:<boot id>:<probe address>:<probe value>" text every rank publishes
// through the bootstrap store and its same-host peers parse to decide on
// shared memory and single-copy reads.
//
// Properties: a parsed address has a positive pid and a boot id without ':'
// and shorter than 64 bytes; formatAddress() gives text that parses back to
// the same address.
#include <string>
#include <string_view>

#include "fuzz_common.h"
#include "transports/shm/shm_transport.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace shm = shoal::shm;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  shoal::Result<shm::Address> address = shm::parseAddress(text);
  if (!address.isOk()) return 0;
  const shm::Address& a = address.value();
  FUZZ_CHECK(a.pid > 0, "pid %d accepted", a.pid);
  FUZZ_CHECK(!a.bootId.empty() && a.bootId.size() < 64 && a.bootId.find(':') == std::string::npos,
             "boot id '%s' accepted", a.bootId.c_str());
  std::string again = shm::formatAddress(a);
  shoal::Result<shm::Address> back = shm::parseAddress(again);
  FUZZ_CHECK(back.isOk(), "formatAddress output does not parse: %s", again.c_str());
  FUZZ_CHECK(back.value().pid == a.pid && back.value().bootId == a.bootId &&
                 back.value().probeAddress == a.probeAddress && back.value().probeValue == a.probeValue,
             "parse(format(address)) differs: %s", again.c_str());
  return 0;
}
