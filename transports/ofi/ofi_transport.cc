#include "transports/ofi/ofi_transport.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <set>
#include <strings.h>

#include "core/clock.h"
#include "core/log.h"
#include "core/params.h"
#include "net/socket.h"
#include "transports/ofi/ofi_connection.h"
#include "transports/ofi/ofi_fabric.h"

namespace shoal {
namespace ofi {
namespace {

constexpr char kHex[] = "0123456789abcdef";

int hexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// API versions to ask for, newest first: the headers' own, then the releases
// whose behaviour we know, down to 1.17 (Debian 12). A library older than a
// version answers -FI_ENOSYS, so we skip those it cannot know.
std::vector<uint32_t> apiVersions(uint32_t library) {
  std::vector<uint32_t> versions = {FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION), FI_VERSION(1, 22),
                                    FI_VERSION(1, 20), FI_VERSION(1, 18), FI_VERSION(1, 17)};
  uint32_t newest = versions.front();
  std::vector<uint32_t> out;
  for (uint32_t v : versions)
    if (v <= newest && !FI_VERSION_LT(library, v) && std::find(out.begin(), out.end(), v) == out.end()) out.push_back(v);
  return out;
}

// Domains that only reach this host: usable only when nothing else is there
// (libfabric lists lo even when FI_REMOTE_COMM is asked for).
bool localOnlyDomain(std::string_view name) { return name == "lo" || name.rfind("docker", 0) == 0; }

// Endpoints per rail (SHOAL_OFI_ENDPOINTS; -1 chooses). Over a provider whose
// endpoint reaches a peer through one kernel socket (tcp;ofi_rxm, net,
// sockets) a connection on one endpoint is one TCP stream, with one stream's
// socket buffers; striped over two (2 ranks on one host, 64 MiB AllReduce) it
// ran 5-7 % faster, as two sockets do for the tcp transport. So these get as
// many endpoints as the tcp transport has sockets per connection
// (NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD, default 2), and both
// transports put the same number of streams under a channel. libfabric 1.17's
// shm without CMA (our default here, FI_SHM_DISABLE_CMA) moves a large
// message through the receiving endpoint's region, under that region's spin
// lock (a third of both ranks' time went to pthread_spin_lock at 64 MiB): the
// sender's copy in and the receiver's copy out appear to take turns. Over two
// endpoints (two regions, two locks) one lane's copy in runs while the
// other's copy out does (2 ranks, 64 MiB: AllGather 7.9 -> 6.0 ms, AllReduce 15.3 -> 11.9,
// ReduceScatter 7.9 -> 5.8; an AllGather of 512 KiB-2 MiB, whose 256-512
// KiB messages are striped too, 15-30 % slower). So shm without CMA gets
// two; with CMA (single-copy reads by the receiver, not measured over two)
// one, as other providers (efa, verbs: hardware queues that need no help).
Result<int> endpointsFor(std::string_view provider) {
  int64_t wanted = params().ofiEndpoints;
  if (wanted != -1) {
    if (wanted < 1 || wanted > kMaxEndpointsPerRail)
      return invalidArgument("SHOAL_OFI_ENDPOINTS=", wanted, " is out of range: 1..", kMaxEndpointsPerRail,
                             ", or -1 to choose by provider");
    return static_cast<int>(wanted);
  }
  if (provider == "shm") return shmSendsStream() ? 2 : 1;
  if (!runsOverSockets(provider)) return 1;
  int64_t n = params().socketNthreads * params().nsocksPerThread;
  return static_cast<int>(std::clamp<int64_t>(n, 1, kMaxEndpointsPerRail));
}

// Which message parts wait for the receiver's clear-to-send (OfiConnection,
// README.md).
// - shm without CMA streams large messages through its segment in order: an
//   unreceived one would hold up every later one, so every part above the
//   inject size waits, as long as it takes (needed for progress).
// - rxm over kernel sockets reads a part that arrives before its receive
//   into memory of its own and copies it out later. A ring ReduceScatter's
//   sends wait for nothing, its receives for scratch slots, so 45 % of its
//   1 MiB parts arrived early and it ran at half the tcp transport's speed
//   (decision 0011). Parts above SHOAL_OFI_CLEAR_TO_SEND_BYTES (128 KiB: the
//   AllReduce's pieces through sockets stay below it) wait, for speed only:
//   at most SHOAL_OFI_CLEAR_TO_SEND_WAIT_MS, so a receive posted with another
//   size (which owes no clearance) still sees the message and reports the
//   mismatch. Measured over tcp;ofi_rxm only; other socket providers keep
//   their own ways.
ofi::ClearToSend clearToSendFor(std::string_view provider, uint64_t injectLimit) {
  if (provider == "shm" && shmSendsStream()) return {std::max<uint64_t>(injectLimit, 1), -1};
  if (runsOverSockets(provider) && hasLayer(provider, "ofi_rxm")) {
    // The hello carries the threshold in 32 bits.
    uint64_t above = static_cast<uint64_t>(std::clamp<int64_t>(params().ofiClearToSendBytes, 0, UINT32_MAX));
    return {above, std::max<int64_t>(params().ofiClearToSendWaitMs, 0) * 1000000};
  }
  return {};
}

}  // namespace

std::string formatAddress(const Address& address) {
  std::string out = address.provider + "/";
  for (size_t r = 0; r < address.rails.size(); ++r) {
    if (r > 0) out += ',';
    for (size_t e = 0; e < address.rails[r].size(); ++e) {
      if (e > 0) out += '+';
      for (unsigned char c : address.rails[r][e]) {
        out += kHex[c >> 4];
        out += kHex[c & 15];
      }
    }
  }
  return out;
}

Result<Address> parseAddress(std::string_view text) {
  size_t slash = text.rfind('/');
  if (slash == std::string_view::npos || slash == 0) return invalidArgument("ofi address without a provider: ", text);
  Address address;
  address.provider = std::string(text.substr(0, slash));
  std::string_view rest = text.substr(slash + 1);
  address.rails.emplace_back();
  while (true) {
    size_t end = rest.find_first_of(",+");
    std::string_view hex = rest.substr(0, end);
    if (hex.empty() || hex.size() % 2 != 0) return invalidArgument("bad ofi address: ", text);
    std::string bytes;
    for (size_t i = 0; i < hex.size(); i += 2) {
      int hi = hexValue(hex[i]), lo = hexValue(hex[i + 1]);
      if (hi < 0 || lo < 0) return invalidArgument("bad ofi address: ", text);
      bytes += static_cast<char>(hi * 16 + lo);
    }
    address.rails.back().push_back(std::move(bytes));
    if (address.rails.back().size() > static_cast<size_t>(kMaxEndpointsPerRail))
      return invalidArgument("ofi address with more than ", kMaxEndpointsPerRail, " endpoints on a rail: ", text);
    if (end == std::string_view::npos) break;
    if (rest[end] == ',') address.rails.emplace_back();
    rest = rest.substr(end + 1);
  }
  return address;
}

RegistrationStats registrationStats() {
  RegistrationStats total;
  forEachRail([&](Rail& rail) {
    std::lock_guard<std::mutex> lock(rail.mutex);
    const MrCache::Stats s = rail.registrationStats();
    total.registrations += s.registrations;
    total.hits += s.hits;
    total.invalidated += s.invalidated;
    total.live += s.live;
    total.perOperation += s.perOperation;
  });
  return total;
}

}  // namespace ofi

void ofiInvalidateRegistrations(void* base, size_t bytes) {
  ofi::forEachRail([&](ofi::Rail& rail) {
    std::lock_guard<std::mutex> lock(rail.mutex);
    rail.invalidateRegistrations(base, bytes);
  });
}

namespace {

// libfabric is started only when asked for (SHOAL_TRANSPORT=ofi,
// NCCL_NET=Libfabric/OFI, or FI_PROVIDER naming a provider): opening its
// endpoints in every process costs start-up time, and a process that exits
// while an init is still pending crashed in libfabric's teardown
// (docs/decisions/0002-ofi-default.md).
bool ofiRequested() {
  const Params& p = params();
  return strcasecmp(p.transport.c_str(), "ofi") == 0 || strcasecmp(p.net.c_str(), "Libfabric") == 0 ||
         strcasecmp(p.net.c_str(), "OFI") == 0 || !p.fiProvider.empty();
}

// Providers that run libfabric's reliable datagrams over kernel sockets
// (tcp;ofi_rxm, sockets, udp;ofi_rxd, net) add a layer over what the tcp
// transport does directly and measured slower here: ofi is chosen by default
// only for hardware providers (EFA, verbs, ...); NCCL_NET=Libfabric,
// ncclConfig_t.netName=Libfabric or SHOAL_TRANSPORT=ofi still force it
// (docs/decisions/0002-ofi-default.md).
bool publishedOverSockets(const PeerInfo& self) {
  const std::string* text = self.address("ofi");
  if (!text) return true;
  auto address = ofi::parseAddress(*text);
  if (!address.isOk()) return true;
  return ofi::runsOverSockets(address.value().provider);
}

using ofi::Api;
using ofi::InfoPtr;
using ofi::Rail;
namespace wire = ofi::wire;

// Which provider the user asked for, for messages.
std::string wantedProvider(const std::string& provider) {
  if (!provider.empty()) return str("provider '", provider, "'");
  if (!params().fiProvider.empty()) return str("FI_PROVIDER='", params().fiProvider, "'");
  return "no provider (FI_PROVIDER unset)";
}

// fi_getinfo with what Shoal needs of an endpoint, for `provider` (a
// fi_getinfo provider name; empty: libfabric's choice under FI_PROVIDER).
// Every offer, in libfabric's order; the error says why there is none.
// `askHmem`: ask for FI_HMEM first (processUsesCuda()).
Result<InfoPtr> queryInfo(const Api& api, const std::string& provider, bool askHmem, uint32_t& version) {
  InfoPtr hints(api.dupinfo(nullptr), ofi::InfoDeleter{&api});
  if (!hints) return systemError("fi_allocinfo failed");
  hints->caps = FI_TAGGED;
  // FI_LOCAL_COMM/FI_REMOTE_COMM stay out: 1.17's shm advertises neither.
  hints->mode = FI_CONTEXT | FI_CONTEXT2;  // every operation carries an fi_context2
  hints->ep_attr->type = FI_EP_RDM;
  hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
  hints->domain_attr->threading = FI_THREAD_DOMAIN;  // we serialise per rail
  hints->domain_attr->av_type = FI_AV_TABLE;
  hints->domain_attr->cq_data_size = 8;  // Shoal's tag rides as immediate data
  // A bye must not overtake the data sent before it (ofi_connection.h).
  hints->tx_attr->msg_order = FI_ORDER_SAS;
  hints->rx_attr->msg_order = FI_ORDER_SAS;
  if (!provider.empty()) hints->fabric_attr->prov_name = ::strdup(provider.c_str());

  std::vector<uint64_t> extraCaps = {0};
  if (askHmem) extraCaps.insert(extraCaps.begin(), FI_HMEM);  // GPU memory, where reachable
  int lastRc = -FI_ENODATA;
  uint32_t library = api.version();
  std::vector<uint32_t> versions = ofi::apiVersions(library);
  if (versions.empty())
    return error(Code::kUnsupported, "libfabric ", ofi::versionString(library), " is older than 1.17");
  for (uint64_t extra : extraCaps) {
    hints->caps = FI_TAGGED | extra;
    hints->domain_attr->mr_mode =
        FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT | (extra ? FI_MR_HMEM : 0);
    for (uint32_t v : versions) {
      fi_info* info = nullptr;
      int rc = api.getinfo(v, nullptr, nullptr, 0, hints.get(), &info);
      if (rc == 0 && info != nullptr) {
        version = v;
        return InfoPtr(info, ofi::InfoDeleter{&api});
      }
      lastRc = rc;
      version = v;
    }
  }
  // Why not: is the provider there at all?
  fi_info* any = nullptr;
  InfoPtr bare(api.dupinfo(nullptr), ofi::InfoDeleter{&api});
  if (!provider.empty()) bare->fabric_attr->prov_name = ::strdup(provider.c_str());
  int rc = api.getinfo(versions.back(), nullptr, nullptr, 0, bare.get(), &any);
  InfoPtr anyInfo(any, ofi::InfoDeleter{&api});
  std::string why = str(ofi::fiError(api, "fi_getinfo", lastRc), ", libfabric ", ofi::versionString(library),
                        ", API ", ofi::versionString(version));
  if (rc != 0 || any == nullptr)
    return error(Code::kUnsupported, "libfabric offers ", wantedProvider(provider), " on this host (", why,
                 "; fi_info -l lists the providers, FI_LOG_LEVEL=info says why one was skipped)");
  return error(Code::kUnsupported, wantedProvider(provider), " (found: ", any->fabric_attr->prov_name,
               ") gives no FI_EP_RDM endpoint with FI_TAGGED, FI_CONTEXT2, 8-byte immediate data and "
               "send-after-send order (",
               why, ")");
}

// The provider the transport takes among the offers: libfabric's first,
// except that a node-local one (shm) is taken only when nothing else is
// offered (FI_PROVIDER=shm does that).
const fi_info* chooseOffer(const fi_info* offers) {
  const fi_info* chosen = nullptr;
  for (const fi_info* i = offers; i != nullptr; i = i->next) {
    if (chosen == nullptr) chosen = i;
    if (std::strcmp(chosen->fabric_attr->prov_name, "shm") != 0) break;
    if (std::strcmp(i->fabric_attr->prov_name, "shm") != 0) chosen = i;
  }
  return chosen;
}

class OfiTransport final : public Transport {
 public:
  explicit OfiTransport(OfiOptions options) : options_(std::move(options)) {}

  std::string_view name() const override { return "ofi"; }
  LinkClass linkClass() const override { return LinkClass::kNet; }
  bool emulatesMessagesOverSockets() const override { return cpuCopiesBytes(); }
  void forgetMemory(void* base, size_t bytes) override { ofiInvalidateRegistrations(base, bytes); }
  bool wantedInThisProcess() const override { return ofiRequested(); }
  // A provider may report nothing for a peer process that is gone (EFA's
  // connectionless endpoints; rxm over tcp completes no receive from it).
  bool noticesPeerExit() const override { return false; }
  bool chosenByDefault(const PeerInfo& self) const override { return !publishedOverSockets(self); }
  Result<std::string> localAddress() override;
  bool canConnect(const PeerInfo& self, const PeerInfo& peer) const override;
  Result<std::unique_ptr<Connection>> connect(const ConnectionKey& key, const ConnectOptions& options) override;
  // The higher rank waits for the lower rank's hello.
  bool connectWaitsForPeer(const ConnectionKey& key) const override { return key.selfRank > key.peerRank; }
  bool cpuCopiesBytes() const override { return ready_.load() && ofi::runsOverSockets(provider_); }
  // Not yet, even where every rail registers device memory (hmemRegisters_):
  // a receive the NIC wrote into GPU memory needs a flush before a kernel
  // reads it (NCCL's iflush), and registrations are cached by address, which
  // a freed and reused device address would fool. Device plans therefore
  // never hand ofi device buffers; the trial's verdict is logged.
  bool movesDeviceMemory() const override { return false; }

 private:
  Status initialise();  // mutex_ held

  const OfiOptions options_;
  std::mutex mutex_;
  bool tried_ = false;
  Status initError_;
  std::atomic<bool> ready_{false};
  std::string provider_;
  std::string address_;
  std::vector<std::unique_ptr<Rail>> rails_;
  bool hmemRegisters_ = false;  // every rail's DeviceMemoryPath registers
  uint64_t injectLimit_ = 0;
  ofi::ClearToSend clearToSend_;  // OfiConnection "Clear to send"
};


Result<std::string> OfiTransport::localAddress() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!tried_) {
    tried_ = true;
    initError_ = initialise();
    if (!initError_.isOk()) {
      rails_.clear();
      initError_.withContext("ofi transport");
    }
    ready_ = initError_.isOk();
  }
  if (!initError_.isOk()) return initError_;
  return address_;
}

Status OfiTransport::initialise() {
  SHOAL_ASSIGN_OR_RETURN(const Api* api, ofi::loadApi());
  uint32_t version = 0;
  const bool askHmem = ofi::processUsesCuda();
  SHOAL_ASSIGN_OR_RETURN(InfoPtr infos, queryInfo(*api, options_.provider, askHmem, version));
  const fi_info* chosen = chooseOffer(infos.get());
  provider_ = chosen->fabric_attr->prov_name;

  // Rails: one per domain (NIC) of that provider, local-only ones last resort.
  std::vector<const fi_info*> candidates;
  std::set<std::string> seen;
  for (const fi_info* i = infos.get(); i != nullptr; i = i->next) {
    if (provider_ != i->fabric_attr->prov_name) continue;
    std::string domain = i->domain_attr->name ? i->domain_attr->name : "";
    if (seen.insert(domain).second) candidates.push_back(i);
  }
  std::vector<const fi_info*> remote;
  for (const fi_info* i : candidates)
    if (!ofi::localOnlyDomain(i->domain_attr->name ? i->domain_attr->name : "")) remote.push_back(i);
  if (!remote.empty()) candidates = remote;
  size_t maxRails = static_cast<size_t>(std::clamp<int64_t>(params().ofiMaxRails, 1, 64));
  if (candidates.size() > maxRails) candidates.resize(maxRails);

  ofi::RailOptions railOptions;
  railOptions.alwaysRegister = params().ofiAlwaysRegister;
  railOptions.cacheRegistrations = params().ofiMrCache;
  railOptions.cacheEntries = static_cast<size_t>(std::max<int64_t>(params().ofiMrCacheEntries, 1));
  railOptions.deviceMemoryAsked = askHmem;
  if (ofi::runsOverSockets(provider_)) {
    railOptions.socketNotsentLowat = params().socketNotsentLowat;
    railOptions.socketSameKernelSendBuffer = net::sameKernelSendBufferFromParams();
  }
  ofi::Address address{provider_, {}};
  std::string domains;
  SHOAL_ASSIGN_OR_RETURN(int endpoints, ofi::endpointsFor(provider_));
  for (const fi_info* info : candidates) {
    SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<Rail> rail,
                           Rail::open(*api, *info, static_cast<int>(rails_.size()), endpoints, railOptions));
    address.rails.push_back(rail->names());
    domains += str(domains.empty() ? "" : ", ", rail->domainName());
    rails_.push_back(std::move(rail));
  }
  address_ = ofi::formatAddress(address);
  size_t inject = rails_.front()->injectBytes();
  int64_t wantedInject = params().ofiInjectBytes;
  injectLimit_ = wantedInject < 0 ? inject : std::min<uint64_t>(inject, static_cast<uint64_t>(wantedInject));
  clearToSend_ = ofi::clearToSendFor(provider_, injectLimit_);

  uint64_t mrMode = chosen->domain_attr->mr_mode;
  std::string mrText = api->tostr(&mrMode, FI_TYPE_MR_MODE);
  SHOAL_INFO(subsys::kInit | subsys::kNet, "ofi: provider ", provider_, ", fabric ",
             chosen->fabric_attr->name ? chosen->fabric_attr->name : "?", ", ", rails_.size(),
             rails_.size() == 1 ? " rail (domain " : " rails (domains ", domains, "), ", endpoints,
             endpoints == 1 ? " endpoint" : " endpoints", " per rail, mr_mode [", mrText,
             "], inject ", injectLimit_, " B, ",
             clearToSend_.above == 0
                 ? std::string()
                 : str("clear-to-send above ", clearToSend_.above, " B",
                       clearToSend_.maxWaitNs < 0 ? std::string()
                                                  : str(" (waits at most ", clearToSend_.maxWaitNs / 1000000, " ms)"),
                       ", "),
             (chosen->caps & FI_HMEM) ? "FI_HMEM, " : "", "libfabric ", ofi::versionString(api->version()), " API ",
             ofi::versionString(version));
  // Device memory: once per rail, in a process that uses CUDA (in others
  // there is none to move). A connection may be on any rail, so the
  // transport registers device memory only if every rail does.
  hmemRegisters_ = true;
  for (const auto& rail : rails_) {
    const ofi::DeviceMemoryPath& path = rail->deviceMemory();
    hmemRegisters_ = hmemRegisters_ && path.registers;
    if (askHmem)
      SHOAL_INFO(subsys::kInit | subsys::kNet, "ofi: ", path.describe(),
                 rails_.size() == 1 ? std::string() : str(" (rail ", rail->index(), ", domain ", rail->domainName(), ")"));
  }
  return Status::ok();
}

bool OfiTransport::canConnect(const PeerInfo& self, const PeerInfo& peer) const {
  if (!ready_) return false;
  const std::string* mine = self.address("ofi");
  const std::string* theirs = peer.address("ofi");
  if (mine == nullptr || theirs == nullptr) return false;
  Result<ofi::Address> a = ofi::parseAddress(*mine);
  Result<ofi::Address> b = ofi::parseAddress(*theirs);
  if (!a.isOk() || !b.isOk() || a->provider != b->provider) return false;
  // shm reaches only processes of this host.
  if (a->provider == "shm" && self.hostId != peer.hostId) return false;
  return true;
}

Result<std::unique_ptr<Connection>> OfiTransport::connect(const ConnectionKey& key, const ConnectOptions& options) {
  std::string peerText = options.peer && !options.peer->hostname.empty() ? options.peer->hostname : "?";
  std::string peer = str("rank ", key.peerRank, " (host ", peerText, ", ofi ", provider_.empty() ? "?" : provider_, ")");
  std::string what = str("ofi connect to ", peer, " channel ", key.channel);
  if (key.selfRank == key.peerRank)
    return error(Code::kUnsupported, what, ": ofi does not connect a rank to itself");
  if (key.selfRank < 0 || key.peerRank < 0) return invalidArgument(what, ": bad ranks ", key.selfRank, ", ", key.peerRank);
  if (Result<std::string> local = localAddress(); !local.isOk()) return local.takeStatus().withContext(what);
  const std::string* text = options.peer ? options.peer->address("ofi") : nullptr;
  if (text == nullptr) return invalidArgument(what, ": the peer published no ofi address");
  Result<ofi::Address> parsed = ofi::parseAddress(*text);
  if (!parsed.isOk()) return parsed.takeStatus().withContext(what);
  const ofi::Address& theirs = parsed.value();
  if (theirs.provider != provider_)
    return invalidUsage(what, ": the peer uses provider ", theirs.provider, ", this rank ", provider_,
                        " (set the same FI_PROVIDER on every rank)");
  size_t rails = std::min(rails_.size(), theirs.rails.size());
  size_t railIndex = key.channel % rails;
  Rail& rail = *rails_[railIndex];
  if (rails > 1) peer = str("rank ", key.peerRank, " (host ", peerText, ", ofi ", provider_, " rail ", railIndex, ")");
  // Both sides compute the same lane count from the two addresses.
  size_t lanes = std::min(static_cast<size_t>(rail.endpointCount()), theirs.rails[railIndex].size());

  std::unique_ptr<ofi::OfiConnection> connection;
  fi_addr_t peerAddress;
  wire::Hello hello;
  {
    std::lock_guard<std::mutex> lock(rail.mutex);
    std::vector<fi_addr_t> peerLanes;
    const bool sameKernel = options.self != nullptr && options.peer != nullptr && options.self->sameKernel(*options.peer);
    for (size_t lane = 0; lane < lanes; ++lane) {
      Result<fi_addr_t> inserted =
          rail.insertAddress(static_cast<int>(lane), theirs.rails[railIndex][lane], sameKernel);
      if (!inserted.isOk()) return inserted.takeStatus().withContext(str(what, " endpoint ", lane));
      peerLanes.push_back(inserted.value());
    }
    peerAddress = peerLanes.front();  // hellos travel between endpoints 0
    Result<uint32_t> id = rail.allocateId();
    if (!id.isOk()) return id.takeStatus().withContext(what);
    // Channels railIndex, railIndex + rails, ... share this rail: number them
    // 0, 1, ... on it, so that they take different lanes (OfiConnection).
    const auto railChannel = static_cast<uint16_t>(key.channel / rails);
    connection = std::make_unique<ofi::OfiConnection>(rail, std::move(peerLanes), railChannel, id.value(),
                                                      injectLimit_, clearToSend_, peer);
    SHOAL_TRY(connection->start({key.commId, key.peerRank, key.selfRank, key.channel, options.secret})) << what;
    hello.commId = key.commId;
    hello.fromRank = key.selfRank;
    hello.toRank = key.peerRank;
    hello.channel = key.channel;
    hello.recvId = id.value();
    hello.clearAbove = static_cast<uint32_t>(clearToSend_.above);
  }
  SHOAL_TRY(wire::signHello(hello, options.secret)) << what;
  uint8_t bytes[wire::kHelloBytes];
  wire::encodeHello(hello, bytes);

  // Send ours. The lower rank returns at once and claims the peer's hello
  // when it first sends (so it never waits on a peer that waits on someone
  // else: no cycle whatever order ranks connect in); the higher rank waits for
  // the lower's, which is on its way as soon as the lower calls connect().
  bool sent = false;
  bool lower = key.selfRank < key.peerRank;
  Backoff backoff;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(rail.mutex);
      if (Status s = rail.progress(); !s.isOk()) return s.withContext(what);
      if (!sent) {
        Status s = rail.sendControl(0, peerAddress, wire::helloTag(), bytes, sizeof(bytes));
        if (s.isOk()) sent = true;
        else if (s.code() != Code::kAgain) return s.withContext(str(what, ": sending the hello"));
      }
      if (sent && (lower || connection->resolvePeer())) break;
    }
    if (options.deadline.expired())
      return error(Code::kTimeout, what, ": timed out waiting for the peer's hello (",
                   sent ? "ours was sent" : "ours could not be sent",
                   "; is the peer connecting, with the same FI_PROVIDER, communicator secret and Shoal build?)");
    backoff.pause();
  }
  SHOAL_INFO(subsys::kInit | subsys::kNet, "ofi: connected to ", peer, " channel ", key.channel, " on rail ",
             railIndex, " (", rail.domainName(), ") over ", lanes, lanes == 1 ? " endpoint" : " endpoints");
  return std::unique_ptr<Connection>(std::move(connection));
}

}  // namespace

namespace ofi {

ProviderSurvey surveyProviders() {
  ProviderSurvey survey;
  survey.requested = ofiRequested();
  Result<const Api*> api = loadApi();
  if (!api.isOk()) {
    survey.error = api.status().message();
    return survey;
  }
  survey.library = str("libfabric ", versionString(api.value()->version()));
  uint32_t version = 0;
  Result<InfoPtr> offers = queryInfo(*api.value(), "", processUsesCuda(), version);
  if (!offers.isOk()) {
    survey.error = offers.status().message();
    return survey;
  }
  for (const fi_info* i = offers.value().get(); i != nullptr; i = i->next) {
    std::string name = i->fabric_attr->prov_name;
    std::string domain = i->domain_attr->name ? i->domain_attr->name : "";
    bool known = false;
    for (auto& p : survey.providers)
      if (p.name == name) {
        known = true;
        if (std::find(p.domains.begin(), p.domains.end(), domain) == p.domains.end()) p.domains.push_back(domain);
      }
    if (!known) survey.providers.push_back({name, {domain}, runsOverSockets(name)});
  }
  survey.chosen = chooseOffer(offers.value().get())->fabric_attr->prov_name;
  survey.chosenByDefault = !runsOverSockets(survey.chosen);
  return survey;
}

}  // namespace ofi

std::unique_ptr<Transport> makeOfiTransport() { return makeOfiTransport(OfiOptions{}); }
std::unique_ptr<Transport> makeOfiTransport(const OfiOptions& options) {
  return std::make_unique<OfiTransport>(options);
}

}  // namespace shoal
