// fuzz_ofi_address: ofi::parseAddress (transports/ofi/ofi_transport.cc), the
// text "<provider>/<hex>+<hex>,<hex>" every rank publishes through the
// bootstrap store and every peer parses before inserting the endpoint names
// into its address vectors.
//
// Pure text parsing; ofi_transport.cc is compiled with libfabric's headers,
// but nothing here loads libfabric (only loadApi() would, never called).
//
// Properties: a parsed address has a provider, no empty rail or endpoint
// name, at most kMaxEndpointsPerRail endpoints per rail, and
// formatAddress() gives text that parses back to the same address.
#include <string_view>

#include "fuzz_common.h"
#include "transports/ofi/ofi_connection.h"
#include "transports/ofi/ofi_transport.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace ofi = shoal::ofi;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  shoal::Result<ofi::Address> address = ofi::parseAddress(text);
  if (!address.isOk()) return 0;
  const ofi::Address& a = address.value();
  FUZZ_CHECK(!a.provider.empty(), "an address without a provider parsed");
  FUZZ_CHECK(!a.rails.empty(), "an address without rails parsed");
  for (const auto& rail : a.rails) {
    FUZZ_CHECK(!rail.empty() && rail.size() <= static_cast<size_t>(ofi::kMaxEndpointsPerRail),
               "a rail of %zu endpoints parsed", rail.size());
    for (const auto& name : rail) FUZZ_CHECK(!name.empty(), "an empty endpoint name parsed");
  }
  std::string again = ofi::formatAddress(a);
  shoal::Result<ofi::Address> reparsed = ofi::parseAddress(again);
  FUZZ_CHECK(reparsed.isOk(), "formatAddress output does not parse: %s", again.c_str());
  FUZZ_CHECK(reparsed.value().provider == a.provider && reparsed.value().rails == a.rails,
             "parse(format(address)) differs: %s", again.c_str());
  return 0;
}
