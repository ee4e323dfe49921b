// OfiTransport: connections to peers over libfabric reliable-datagram (RDM)
// endpoints: EFA on AWS, "tcp;ofi_rxm" or "shm" elsewhere. See README.md for
// the wire format and the knobs.
//
// Role: one per process (makeOfiTransport(), owned by the transport registry).
// localAddress() loads libfabric (dlopen), picks the provider (FI_PROVIDER,
// libfabric's own variable, filters; the API version is asked for downward
// from the newest these headers know to 1.17), opens one rail per NIC/domain
// (at most SHOAL_OFI_MAX_RAILS) with k endpoints each (k = the tcp
// transport's sockets per connection, NCCL_SOCKET_NTHREADS x
// NCCL_NSOCKS_PERTHREAD, over socket providers; 1 otherwise) and returns
// "<provider>/<hex name of rail 0 endpoint 0>+<endpoint 1>...,<rail 1 ...>".
// When no provider gives an FI_EP_RDM endpoint with FI_TAGGED, it returns an
// error saying which provider and why (a forced ofi is then an error, never a
// fallback).
// connect(): channel c of a pair uses rail c % min(local rails, peer rails)
// and stripes its messages over min(local, peer) endpoints of that rail
// (lanes, ofi_connection.h); both ranks send each other a hello (the
// connection id the other must tag its data with, HMAC proof of the
// communicator's secret). The higher rank waits for the lower's; the lower
// returns at once and claims the higher's when it first sends, so set-up
// cannot deadlock whatever order ranks, channels and communicators connect
// in. Many connections share each endpoint, told apart by tag bits.
// Thread: localAddress(), canConnect() and connect() may be called from any
// number of threads. Lock order: the transport's mutex, then a rail's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "transports/transport.h"

namespace shoal {

struct OfiOptions {
  // A fi_getinfo provider name ("tcp;ofi_rxm", "shm"); empty: libfabric's
  // choice under FI_PROVIDER. Lets tests run several providers in one process.
  std::string provider;
};

std::unique_ptr<Transport> makeOfiTransport();
std::unique_ptr<Transport> makeOfiTransport(const OfiOptions& options);

// Forgets cached memory registrations overlapping [base, base + bytes) on
// every ofi endpoint of the process. Call it before memory is freed or
// deregistered (ncclMemFree, ncclCommDeregister), so that a later buffer at
// the same address is registered afresh. Thread-safe; a no-op without ofi.
void ofiInvalidateRegistrations(void* base, size_t bytes);

namespace ofi {

// Registration cache counters, summed over every rail of the process.
struct RegistrationStats {
  uint64_t registrations = 0;
  uint64_t hits = 0;
  uint64_t invalidated = 0;
  uint64_t live = 0;
  uint64_t perOperation = 0;  // not cached: memory Shoal is not told the end of
};
RegistrationStats registrationStats();

// The address a rank publishes: provider and, per rail, each endpoint's
// fi_getname bytes. Text: "<provider>/<hex>+<hex>,<hex>+<hex>" (',' between
// rails, '+' between a rail's endpoints; one endpoint per rail is the form
// that predates endpoints, which still parses).
struct Address {
  std::string provider;
  std::vector<std::vector<std::string>> rails;  // [rail][endpoint]: raw bytes
};
std::string formatAddress(const Address& address);
Result<Address> parseAddress(std::string_view text);

// What libfabric offers this process, as the transport would see it (for
// shoal-info): every provider giving the endpoint Shoal needs (RDM, tagged,
// FI_CONTEXT2, 8-byte immediate data, send-after-send order) under the
// current FI_PROVIDER, the one the transport would take, and whether it is
// taken between hosts without NCCL_NET=Libfabric (hardware providers only).
// Loads libfabric but opens no fabric. Thread-safe.
struct ProviderSurvey {
  struct Provider {
    std::string name;                  // "tcp;ofi_rxm", "shm", "efa"
    std::vector<std::string> domains;  // its domains (NICs), libfabric's order
    bool overSockets = false;          // runsOverSockets(name)
  };
  std::string library;                 // "libfabric 1.17" ("" when it did not load)
  std::vector<Provider> providers;     // libfabric's order
  std::string chosen;                  // "" when none
  bool chosenByDefault = false;        // used between hosts unless NCCL_NET=Socket
  bool requested = false;              // the transport starts in this process (SHOAL_TRANSPORT, NCCL_NET, FI_PROVIDER)
  std::string error;                   // why there is none
};
ProviderSurvey surveyProviders();

// Whether one of a provider's ';'-separated layers ("tcp;ofi_rxm": tcp and
// ofi_rxm) is `layer`.
inline bool hasLayer(std::string_view provider, std::string_view layer) {
  while (!provider.empty()) {
    size_t end = provider.find(';');
    if (provider.substr(0, end) == layer) return true;
    if (end == std::string_view::npos) break;
    provider.remove_prefix(end + 1);
  }
  return false;
}

// Whether a provider ("tcp;ofi_rxm", "shm", "efa", ...) carries its traffic
// over kernel sockets: one of its layers is tcp, udp, sockets or net. Such
// providers are not chosen by default (the tcp transport does the same job
// directly; docs/decisions/0002) and get one endpoint per TCP stream the tcp
// transport would open (README.md, "Rails and endpoints").
inline bool runsOverSockets(std::string_view provider) {
  return hasLayer(provider, "tcp") || hasLayer(provider, "udp") || hasLayer(provider, "sockets") ||
         hasLayer(provider, "net");
}

}  // namespace ofi
}  // namespace shoal
