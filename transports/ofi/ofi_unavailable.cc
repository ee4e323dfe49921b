// The ofi transport of a build without libfabric's headers: it exists (the
// registry and the C API link against it) and says why it cannot run.
#include "transports/ofi/ofi_transport.h"

namespace shoal {
namespace {

class UnavailableOfiTransport final : public Transport {
 public:
  std::string_view name() const override { return "ofi"; }
  LinkClass linkClass() const override { return LinkClass::kNet; }
  Result<std::string> localAddress() override { return unavailable(); }
  bool canConnect(const PeerInfo&, const PeerInfo&) const override { return false; }
  Result<std::unique_ptr<Connection>> connect(const ConnectionKey&, const ConnectOptions&) override {
    return unavailable();
  }

 private:
  static Status unavailable() {
    return error(Code::kUnsupported, "ofi transport: Shoal was built without libfabric's headers (libfabric-dev)");
  }
};

}  // namespace

std::unique_ptr<Transport> makeOfiTransport() { return std::make_unique<UnavailableOfiTransport>(); }
std::unique_ptr<Transport> makeOfiTransport(const OfiOptions&) { return makeOfiTransport(); }
void ofiInvalidateRegistrations(void*, size_t) {}

namespace ofi {
RegistrationStats registrationStats() { return {}; }
ProviderSurvey surveyProviders() {
  ProviderSurvey survey;
  survey.error = "Shoal was built without libfabric's headers (libfabric-dev)";
  return survey;
}
std::string formatAddress(const Address& address) { return address.provider; }
Result<Address> parseAddress(std::string_view) { return error(Code::kUnsupported, "built without libfabric"); }
}  // namespace ofi
}  // namespace shoal
