#include "transports/ofi/ofi_fabric.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "core/byte_order.h"
#include "core/clock.h"
#include "core/log.h"
#include "core/params.h"
#include "core/process.h"
#include "cuda/driver.h"
#include "memory/shared_memory.h"
#include "net/crypto.h"

namespace shoal::ofi {
namespace {

// The symbol versions the installed headers bind to (objdump -T of 1.17's
// libfabric.so.1); pinning them keeps a newer library's changed defaults from
// reading our structs with a different layout. Older libraries lacking a
// version fall back to the default symbol.
template <typename Fn>
bool resolve(void* library, const char* symbol, const char* version, Fn& out) {
  void* address = ::dlvsym(library, symbol, version);
  if (address == nullptr) address = ::dlsym(library, symbol);
  out = reinterpret_cast<Fn>(address);
  return address != nullptr;
}

// Provider defaults that differ from libfabric's, given to it the only way
// 1.17 takes them (its environment, read when it first initialises its
// providers), and only where the user set nothing (setenv never overwrites).
//
// FI_OFI_RXM_EAGER_LIMIT: rxm (tcp;ofi_rxm) sends messages above 16 KiB by
// rendezvous: the receiver must see the request and ask, and the sender must
// then see the ask and send, so a large message moves only while both
// processes happen to be polling; an eager message streams into the socket at
// once, as the tcp transport's do, and (rxm's dynamic receive buffers over
// tcp) lands straight in a posted receive. Measured on one host, 2 ranks, 64
// MiB AllReduce: +15 % for ofi over tcp;ofi_rxm. 8 MiB covers the tuner's
// segments (NCCL_BUFFSIZE, 4 MiB by default) with room; larger messages keep
// the rendezvous, because rxm holds an unexpected eager message in memory
// until its receive is posted. Every Shoal process sets the same value, and
// rxm wants connected peers to agree. (Too late where something else in the
// process initialised libfabric first: then only speed differs.) The value is
// the parameter table's (params.def), which reads the user's setting if any;
// docs/decisions/0004 says why a library writes its process's environment.
//
// FI_OFI_RXM_BUFFER_SIZE: rxm's bounce buffers (its inject limit too), whose
// pools rxm zeroes 1024 buffers at a time when an endpoint opens and when a
// connection is first used. At libfabric's 16 KiB that is ~17 MB a pool, and
// on a VM that pays for first touches (docs/performance.md, "The machine") it
// made ofi's init 0.75-0.93 s and its first collective 0.11-0.24 s (2
// emulated nodes, tcp;ofi_rxm); at 4 KiB 0.47-0.54 s and 0.05 s, steady
// state unchanged (expected messages land straight in posted receives;
// unexpected ones of any size still arrive whole). Every process sets the
// same value.
//
// FI_SHM_DISABLE_CMA=1 where a process's single-copy reads do not pay
// (memory::remoteReadsPay): shm then copies large messages through its
// segment (SAR) at memcpy speed instead of reading them with
// process_vm_readv, which on the development VM runs at a quarter to half of
// memcpy (2 ranks, 1-8 MiB: AllReduce 2.0-3.1 -> 5.5-6.4 GB/s). SAR streams
// a message in order, so an unreceived one would hold up later traffic:
// OfiConnection's clear-to-send (shmSendsStream) keeps every large message
// until its receive is posted.
void setProviderDefaults() {
  ::setenv("FI_OFI_RXM_EAGER_LIMIT", std::to_string(params().ofiRxmEagerLimit).c_str(), 0);
  ::setenv("FI_OFI_RXM_BUFFER_SIZE", std::to_string(params().ofiRxmBufferSize).c_str(), 0);
  if (params().ofiShmDisableCma.empty() && !memory::remoteReadsPay())
    ::setenv("FI_SHM_DISABLE_CMA", "1", 0);
}

Result<Api> loadOnce() {
  setProviderDefaults();  // before the library initialises its providers
  void* library = ::dlopen("libfabric.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* why = ::dlerror();
    return error(Code::kUnsupported, "libfabric is not installed (dlopen libfabric.so.1: ", why ? why : "?", ")");
  }
  Api api;
  bool ok = resolve(library, "fi_getinfo", "FABRIC_1.3", api.getinfo) &&
            resolve(library, "fi_freeinfo", "FABRIC_1.3", api.freeinfo) &&
            resolve(library, "fi_dupinfo", "FABRIC_1.3", api.dupinfo) &&
            resolve(library, "fi_fabric", "FABRIC_1.1", api.fabric) &&
            resolve(library, "fi_strerror", "FABRIC_1.0", api.strerror) &&
            resolve(library, "fi_version", "FABRIC_1.0", api.version) &&
            resolve(library, "fi_tostr", "FABRIC_1.0", api.tostr);
  if (!ok) return error(Code::kUnsupported, "libfabric.so.1 lacks fi_getinfo or its companions");
  return api;  // the library stays loaded for the life of the process
}

// Where a buffer is: device (or managed) memory when the process's CUDA
// driver says so; never without the driver.
MemoryPlace placeOf(cuda::Driver* driver, const void* data) {
  MemoryPlace place;
  if (driver == nullptr) return place;
  Result<cuda::Driver::Place> found = driver->placeOf(data);
  if (!found.isOk() ||
      (found.value().kind != cuda::MemoryKind::kDevice && found.value().kind != cuda::MemoryKind::kManaged))
    return place;
  place.iface = FI_HMEM_CUDA;
  place.device = std::max(found.value().device, 0);
  return place;
}

// Registers kTrialRegistrationBytes of device memory of the calling thread's
// current device with FI_HMEM_CUDA, as an operation's buffer would be, then
// closes the registration and frees the memory. The memory is of the kind
// ncclMemAlloc gives (a cuMem allocation).
Status tryDeviceRegistration(cuda::Driver& driver, MrCache& registrations) {
  SHOAL_ASSIGN_OR_RETURN(std::optional<cuda::DeviceIdentity> device, driver.currentDevice());
  if (!device) return error(Code::kInvalidUsage, "no CUDA context is current on the thread that opened the fabric");
  SHOAL_ASSIGN_OR_RETURN(void* buffer, driver.deviceAlloc(kTrialRegistrationBytes));
  Status registered = registrations.tryRegistration(buffer, kTrialRegistrationBytes,
                                                    MemoryPlace{FI_HMEM_CUDA, device->ordinal});
  driver.deviceFree(buffer);
  return registered;
}

constexpr uint32_t kHelloMagic = 0x464f4853;  // "SHOF"
constexpr uint16_t kHelloVersion = 4;  // 2: lanes and striped messages; 3: clearAbove; 4: own lanes (0007)
constexpr size_t kHelloSigned = 48;
constexpr int kControlSlots = 64;
constexpr int kHelloRecvSlots = 16;
// Bye receives kept posted on each endpoint (Rail::byeSinks_); byes that
// arrive between two polls beyond these wait in the provider until reposted.
constexpr int kByeSinksPerEndpoint = 4;
constexpr size_t kSlotBytes = 128;
constexpr size_t kMaxWaitingHellos = 4096;
constexpr int kCqBatch = 16;
constexpr int64_t kSocketScanIntervalNs = 10'000'000;
// How long a drain waits for its peer's bye (Rail::retireId): the peer's
// messages to a destroyed connection are on their way within this, unless
// the peer stalls; one that died sends none.
constexpr int64_t kDrainPatienceNs = 5'000'000'000;
// What a drain receives of each message: not nothing, since rxm 1.17 never
// finishes a rendezvous into zero bytes (nothing to read, so no read
// completes), which held the drain, and the sender's send, for good.
constexpr size_t kDrainBytes = 64;

constexpr std::string_view kHelloLabel = "shoal ofi hello v1";

std::mutex& railsMutex() {
  static std::mutex m;
  return m;
}
std::vector<Rail*>& rails() {
  static std::vector<Rail*> list;
  return list;
}

}  // namespace

bool shmSendsStream() {
  // The environment, not params(): what libfabric reads, and loading may have set it.
  const char* value = std::getenv("FI_SHM_DISABLE_CMA");
  if (value == nullptr) return false;
  std::string v(value);
  for (char& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return v == "1" || v == "true" || v == "yes" || v == "on";
}

bool processUsesCuda() { return cuda::Driver::inUse() != nullptr; }

std::string DeviceMemoryPath::describe() const {
  return str(registers ? "device buffers are registered with FI_HMEM (" : "device buffers are staged through host memory: ",
             why, registers ? ")" : "");
}

DeviceMemoryPath deviceMemoryPath(std::string_view provider, bool asked, bool granted, const Status& trial) {
  if (!asked) return {false, "FI_HMEM was not asked for (the process had not loaded the CUDA driver)"};
  if (!granted) return {false, str("provider ", provider, " did not grant FI_HMEM (libfabric built without CUDA?)")};
  if (!trial.isOk())
    return {false, str("trial registration of ", kTrialRegistrationBytes >> 20, " MiB of device memory failed: ",
                       trial.message())};
  return {true, "trial registration of device memory succeeded"};
}

Result<const Api*> loadApi() {
  static const Result<Api> api = loadOnce();
  if (!api.isOk()) return api.status();
  return &api.value();
}

std::string versionString(uint32_t version) { return str(FI_MAJOR(version), ".", FI_MINOR(version)); }

std::string fiError(const Api& api, std::string_view what, int64_t rc) {
  return str(what, ": ", api.strerror(static_cast<int>(rc < 0 ? -rc : rc)), " (", rc, ")");
}

void forEachRail(const std::function<void(Rail&)>& visit) {
  std::lock_guard<std::mutex> lock(railsMutex());
  for (Rail* rail : rails()) visit(*rail);
}

// --- hellos

namespace wire {

void encodeHello(const Hello& hello, uint8_t out[kHelloBytes]) {
  putLe(out, kHelloMagic, 4);
  putLe(out + 4, kHelloVersion, 2);
  putLe(out + 6, hello.channel, 2);
  putLe(out + 8, hello.commId, 8);
  putLe(out + 16, static_cast<uint32_t>(hello.fromRank), 4);
  putLe(out + 20, static_cast<uint32_t>(hello.toRank), 4);
  putLe(out + 24, hello.recvId, 4);
  putLe(out + 28, hello.clearAbove, 4);
  std::memcpy(out + 32, hello.nonce, 16);
  std::memcpy(out + 48, hello.proof, 32);
}

Result<Hello> decodeHello(const uint8_t* in, size_t bytes) {
  if (bytes != kHelloBytes) return invalidArgument("ofi hello of ", bytes, " bytes");
  if (getLe(in, 4) != kHelloMagic) return invalidArgument("not a Shoal ofi hello");
  if (getLe(in + 4, 2) != kHelloVersion) return invalidArgument("unsupported ofi hello version ", getLe(in + 4, 2));
  Hello h;
  h.channel = static_cast<uint16_t>(getLe(in + 6, 2));
  h.commId = getLe(in + 8, 8);
  h.fromRank = static_cast<int32_t>(getLe(in + 16, 4));
  h.toRank = static_cast<int32_t>(getLe(in + 20, 4));
  h.recvId = static_cast<uint32_t>(getLe(in + 24, 4));
  h.clearAbove = static_cast<uint32_t>(getLe(in + 28, 4));
  std::memcpy(h.nonce, in + 32, 16);
  std::memcpy(h.proof, in + 48, 32);
  if (h.fromRank < 0 || h.toRank < 0 || h.fromRank == h.toRank)
    return invalidArgument("ofi hello: ranks ", h.fromRank, " -> ", h.toRank);
  if (h.recvId == 0 || h.recvId > kMaxId) return invalidArgument("ofi hello: connection id ", h.recvId);
  return h;
}

Status signHello(Hello& hello, std::string_view secret) {
  return net::signHello<kHelloBytes>(hello, secret, kHelloLabel, kHelloSigned, encodeHello);
}

bool verifyHello(const Hello& hello, std::string_view secret) {
  return net::verifyHello<kHelloBytes>(hello, secret, kHelloLabel, kHelloSigned, encodeHello);
}

}  // namespace wire

// --- the rail

bool Rail::HelloKey::operator<(const HelloKey& o) const {
  return std::tie(commId, fromRank, toRank, channel) < std::tie(o.commId, o.fromRank, o.toRank, o.channel);
}

Rail::Rail(const Api& api, int index) : api_(api), index_(index) {}

Result<std::unique_ptr<Rail>> Rail::open(const Api& api, const fi_info& info, int index, int endpoints,
                                         const RailOptions& options) {
  std::unique_ptr<Rail> rail(new Rail(api, index));
  Rail& r = *rail;
  r.domainName_ = info.domain_attr && info.domain_attr->name ? info.domain_attr->name : "?";
  std::string where = str("ofi rail ", index, " (domain ", r.domainName_, ")");
  auto fail = [&](std::string_view call, int64_t rc) {
    return error(Code::kSystemError, where, ": ", fiError(api, call, rc));
  };
  fid_fabric* fabric = nullptr;
  if (int rc = api.fabric(info.fabric_attr, &fabric, nullptr); rc != 0) return fail("fi_fabric", rc);
  r.fabric_.reset(fabric);
  fid_domain* domain = nullptr;
  if (int rc = fi_domain(fabric, const_cast<fi_info*>(&info), &domain, nullptr); rc != 0) return fail("fi_domain", rc);
  r.domain_.reset(domain);

  endpoints = std::clamp(endpoints, 1, kMaxEndpointsPerRail);
  const bool shm = std::strcmp(info.fabric_attr->prov_name, "shm") == 0;
  std::string shmPrefix;  // shm only: see fi_setname below
  if (shm) {
    uint64_t nonce = 0;
    SHOAL_TRY(net::randomBytes(&nonce, sizeof(nonce))) << where;
    char hex[17];
    std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(nonce));
    shmPrefix = str("fi_shm://shoal-", currentPid(), "-ofi-", hex, "-", index, "-");
  }
  r.endpoints_.resize(static_cast<size_t>(endpoints));
  for (Endpoint& e : r.endpoints_) {
    fi_cq_attr cqAttr{};
    cqAttr.format = FI_CQ_FORMAT_TAGGED;
    cqAttr.wait_obj = FI_WAIT_NONE;  // we only poll (manual progress is poll())
    cqAttr.size = std::max<size_t>(info.tx_attr->size + info.rx_attr->size, 4096);
    fid_cq* cq = nullptr;
    if (int rc = fi_cq_open(domain, &cqAttr, &cq, nullptr); rc != 0) return fail("fi_cq_open", rc);
    e.cq.reset(cq);

    fi_av_attr avAttr{};
    avAttr.type = FI_AV_TABLE;
    fid_av* av = nullptr;
    if (int rc = fi_av_open(domain, &avAttr, &av, nullptr); rc != 0) return fail("fi_av_open", rc);
    e.av.reset(av);

    fid_ep* ep = nullptr;
    if (int rc = fi_endpoint(domain, const_cast<fi_info*>(&info), &ep, nullptr); rc != 0)
      return fail("fi_endpoint", rc);
    e.ep.reset(ep);
    if (int rc = fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV); rc != 0) return fail("fi_ep_bind(cq)", rc);
    if (int rc = fi_ep_bind(ep, &av->fid, 0); rc != 0) return fail("fi_ep_bind(av)", rc);
    if (shm) {
      // 1.17's shm names its region /dev/shm/<pid>:<n>:<n> and unlinks it only
      // when the endpoint is closed, which a process that exits with its
      // transport open (or is killed) never does: a later process with the
      // same pid then fails fi_enable with EBUSY. A name of Shoal's own form
      // (pid first, then a random part) never collides, and the shm
      // transport's removeStaleSegments() removes it once its pid is gone.
      std::string shmName = str(shmPrefix, &e - r.endpoints_.data());
      if (int rc = fi_setname(&ep->fid, shmName.data(), shmName.size() + 1); rc != 0) return fail("fi_setname", rc);
    }
    if (int rc = fi_enable(ep); rc != 0) return fail("fi_enable", rc);

    std::string name(64, '\0');
    size_t length = name.size();
    int rc = fi_getname(&ep->fid, name.data(), &length);
    if (rc == -FI_ETOOSMALL) {
      name.resize(length);
      rc = fi_getname(&ep->fid, name.data(), &length);
    }
    if (rc != 0) return fail("fi_getname", rc);
    name.resize(length);
    e.name = std::move(name);
  }

  if (options.socketNotsentLowat > 0 || options.socketSameKernelSendBuffer > 0) {
    r.sockets_ = std::make_unique<ProviderSockets>(options.socketNotsentLowat, options.socketSameKernelSendBuffer);
    for (const Endpoint& e : r.endpoints_) r.sockets_->addLocal(e.name);
    if (!r.sockets_->active()) r.sockets_.reset();  // names that are no socket addresses
  }

  r.injectBytes_ = info.tx_attr->inject_size;
  r.maxMessageBytes_ = info.ep_attr->max_msg_size;
  r.mrMode_ = info.domain_attr->mr_mode;
  r.hmem_ = (info.caps & FI_HMEM) != 0;
  // rxm takes a truncated message whole, whatever its protocol, and reports
  // it once, at the end (rxm_finish_recv); 1.17's shm spins forever on a
  // truncated large message, and efa's handling is untested here.
  r.drains_ = std::strstr(info.fabric_attr->prov_name, "ofi_rxm") != nullptr;
  r.cuda_ = options.deviceMemoryAsked ? cuda::Driver::inUse() : nullptr;
  // 1.17's shm handles FI_PEEK as an ordinary receive (it would consume the message).
  r.peekWorks_ = !shm;
  r.registerLocal_ = (r.mrMode_ & FI_MR_LOCAL) != 0 || options.alwaysRegister;
  size_t caches = (r.mrMode_ & FI_MR_ENDPOINT) != 0 ? r.endpoints_.size() : 1;
  for (size_t c = 0; c < caches; ++c) {
    r.caches_.push_back(std::make_unique<MrCache>());
    r.caches_.back()->configure(domain, r.endpoints_[c].ep.get(), r.mrMode_, options.cacheRegistrations,
                                options.cacheEntries, api.strerror);
  }
  // Device buffers are registered only where a real one registers: a
  // provider may grant FI_HMEM and still fail on the memory (no dma-buf or
  // peer-memory support in the kernel, a NIC the GPU cannot reach).
  Status trial = error(Code::kUnsupported, "not tried");
  if (r.hmem_ && r.cuda_ != nullptr) trial = tryDeviceRegistration(*r.cuda_, r.registrations(0));
  else if (r.hmem_) trial = error(Code::kUnsupported, "the CUDA driver is not in use");
  r.deviceMemory_ = deviceMemoryPath(info.fabric_attr->prov_name, options.deviceMemoryAsked, r.hmem_, trial);

  // Control slots (endpoint 0): hellos are received into them, hellos and
  // byes sent from them.
  r.arena_ = std::make_unique<uint8_t[]>(kControlSlots * kSlotBytes);
  r.slotOps_.resize(kControlSlots);
  if (r.registerLocal_) {
    Result<MrCache::Handle*> arena =
        r.registrations(0).acquire(r.arena_.get(), kControlSlots * kSlotBytes, MemoryPlace{});
    if (!arena.isOk()) return arena.takeStatus().withContext(where);
    r.arenaMr_ = arena.value();
  }
  // Drains' bytes (retireId), registered with the rail like the arena.
  r.drainSink_ = std::make_unique<uint8_t[]>(kDrainBytes * r.endpoints_.size());
  r.drainMrs_.assign(r.endpoints_.size(), nullptr);
  for (size_t lane = 0; lane < r.endpoints_.size() && r.registerLocal_; ++lane) {
    Result<MrCache::Handle*> sink = r.registrations(static_cast<int>(lane))
                                        .acquire(r.drainSink_.get() + lane * kDrainBytes, kDrainBytes, MemoryPlace{});
    if (!sink.isOk()) return sink.takeStatus().withContext(where);
    r.drainMrs_[lane] = sink.value();
  }
  for (int slot = kControlSlots - 1; slot >= kHelloRecvSlots; --slot) r.freeSendSlots_.push_back(slot);
  for (int slot = 0; slot < kHelloRecvSlots; ++slot) SHOAL_TRY(r.postHelloRecv(slot)) << where;
  r.byeSinks_.resize(static_cast<size_t>(r.endpointCount() * kByeSinksPerEndpoint));
  for (size_t i = 0; i < r.byeSinks_.size(); ++i) {
    r.byeSinks_[i].lane = static_cast<uint8_t>(i / kByeSinksPerEndpoint);
    SHOAL_TRY(r.postByeSink(r.byeSinks_[i])) << where;
  }

  std::lock_guard<std::mutex> lock(railsMutex());
  rails().push_back(rail.get());
  return rail;
}

Rail::~Rail() {
  {
    std::lock_guard<std::mutex> lock(railsMutex());
    auto& list = rails();
    list.erase(std::remove(list.begin(), list.end(), this), list.end());
  }
  for (Endpoint& e : endpoints_) e.ep.reset();  // cancels whatever is still posted; no completion follows
  for (Op* op : orphans_) {
    releaseRegistration(*op);
    delete op;
  }
  for (auto& [op, drain] : draining_) delete op;
  if (arenaMr_) registrations(0).release(arenaMr_);
  for (size_t lane = 0; lane < drainMrs_.size(); ++lane)
    if (drainMrs_[lane] != nullptr) registrations(static_cast<int>(lane)).release(drainMrs_[lane]);
}

std::vector<std::string> Rail::names() const {
  std::vector<std::string> out;
  for (const Endpoint& e : endpoints_) out.push_back(e.name);
  return out;
}

MrCache::Stats Rail::registrationStats() const {
  MrCache::Stats total;
  for (const auto& cache : caches_) {
    const MrCache::Stats& s = cache->stats();
    total.registrations += s.registrations;
    total.hits += s.hits;
    total.invalidated += s.invalidated;
    total.live += s.live;
    total.perOperation += s.perOperation;
  }
  return total;
}

void Rail::invalidateRegistrations(void* base, size_t bytes) {
  for (auto& cache : caches_) cache->invalidate(base, bytes);
}

Status Rail::postHelloRecv(int slot) {
  Op& op = slotOps_[static_cast<size_t>(slot)];
  op.reset();
  op.kind = Op::Kind::kHelloRecv;
  op.slot = slot;
  void* desc = arenaMr_ ? fi_mr_desc(arenaMr_->mr) : nullptr;
  ssize_t rc = fi_trecv(endpoint(0), arena_.get() + slot * kSlotBytes, kSlotBytes, desc, FI_ADDR_UNSPEC,
                        wire::helloTag(), 0, &op.context);
  if (rc != 0) return systemError(fiError(api_, "fi_trecv (hello)", rc));
  op.posted = true;
  return Status::ok();
}

Status Rail::postByeSink(Op& op) {
  const uint8_t lane = op.lane;
  op.reset();
  op.kind = Op::Kind::kByeSink;
  op.lane = lane;
  const uint64_t anyId = static_cast<uint64_t>(wire::kMaxId) << wire::kIdShift;
  ssize_t rc = fi_trecv(endpoint(lane), nullptr, 0, nullptr, FI_ADDR_UNSPEC, wire::byeTag(0), anyId, &op.context);
  if (rc != 0) return systemError(fiError(api_, "fi_trecv (bye)", rc), " on endpoint ", static_cast<int>(lane));
  op.posted = true;
  return Status::ok();
}

void Rail::recordBye(const Op& op) {
  const auto id = static_cast<uint32_t>((op.gotTag >> wire::kIdShift) & wire::kMaxId);
  if (idsInUse_.count(id) != 0) byesArrived_[id] |= 1u << op.lane;  // else: its connection is gone
}

bool Rail::byeArrived(uint32_t id, int lane) const {
  auto it = byesArrived_.find(id);
  return it != byesArrived_.end() && (it->second & (1u << lane)) != 0;
}

void Rail::repostPushedBack() {
  std::vector<Op*> sinks;
  sinks.swap(unpostedSinks_);
  for (Op* sink : sinks)
    if (!postByeSink(*sink).isOk()) unpostedSinks_.push_back(sink);
  std::vector<int> slots;
  slots.swap(unpostedHelloSlots_);
  for (int slot : slots)
    if (!postHelloRecv(slot).isOk()) unpostedHelloSlots_.push_back(slot);
}

Status Rail::progress() {
  for (int lane = 0; lane < endpointCount(); ++lane) SHOAL_TRY(progress(lane));
  return Status::ok();
}

Status Rail::progress(int lane) {
  if (!unpostedSinks_.empty() || !unpostedHelloSlots_.empty()) [[unlikely]]
    repostPushedBack();
  if (socketsDue_) adoptSockets();
  SHOAL_TRY(readCompletions(lane));
  if (!draining_.empty()) [[unlikely]]
    endQuietDrains(lane);
  return Status::ok();
}

Status Rail::readCompletions(int lane) {
  fid_cq* cq = endpoints_[static_cast<size_t>(lane)].cq.get();
  fi_cq_tagged_entry entries[kCqBatch];
  // Bounded so one poll cannot be held forever by a peer that keeps sending.
  for (int round = 0; round < 64; ++round) {
    ssize_t n = fi_cq_read(cq, entries, kCqBatch);
    if (n == -FI_EAGAIN) return Status::ok();
    if (n == -FI_EAVAIL) {
      char providerWords[256];
      fi_cq_err_entry err{};
      err.err_data = providerWords;
      err.err_data_size = sizeof(providerWords);
      ssize_t rc = fi_cq_readerr(cq, &err, 0);
      if (rc == -FI_EAGAIN) continue;  // announced but not ready yet: read again
      if (rc < 0) return systemError(fiError(api_, "fi_cq_readerr", rc), " (endpoint ", lane, ")");
      const char* words = fi_cq_strerror(cq, err.prov_errno, err.err_data, nullptr, 0);
      auto* op = static_cast<Op*>(err.op_context);
      if (op == nullptr) {
        SHOAL_WARN("ofi rail ", index_, ": completion error without an operation: ", api_.strerror(err.err),
                   " (provider: ", words ? words : "?", ", prov_errno ", err.prov_errno, ")");
        continue;
      }
      op->error = err.err != 0 ? err.err : FI_EOTHER;
      op->gotBytes = err.len;
      op->gotTag = err.tag;
      op->overflow = err.olen;
      if (err.flags & FI_REMOTE_CQ_DATA) {
        op->gotData = err.data;
        op->gotDataValid = true;
      }
      op->errorText = str(api_.strerror(op->error), " (provider: ", words ? words : "?", ", prov_errno ",
                          err.prov_errno, ")");
      dispatch(op);
      continue;
    }
    if (n < 0) return systemError(fiError(api_, "fi_cq_read", n), " (endpoint ", lane, ")");
    for (ssize_t i = 0; i < n; ++i) {
      auto* op = static_cast<Op*>(entries[i].op_context);
      if (op == nullptr) continue;
      op->gotBytes = entries[i].len;
      op->gotTag = entries[i].tag;
      if (entries[i].flags & FI_REMOTE_CQ_DATA) {
        op->gotData = entries[i].data;
        op->gotDataValid = true;
      }
      dispatch(op);
    }
    if (n < kCqBatch) return Status::ok();
  }
  return Status::ok();
}

void Rail::dispatch(Op* op) {
  if (op->done && op->kind != Op::Kind::kHelloRecv && op->kind != Op::Kind::kControlSend &&
      op->kind != Op::Kind::kByeSink)
    SHOAL_WARN("ofi rail ", index_, ": a second completion for one operation (error ", op->error, ")");
  op->done = true;
  switch (op->kind) {
    case Op::Kind::kHelloRecv: {
      if (op->error == FI_ECANCELED) return;  // the endpoint is closing
      if (op->error == 0) {
        Result<wire::Hello> hello = wire::decodeHello(arena_.get() + op->slot * kSlotBytes, op->gotBytes);
        if (hello.isOk()) {
          const wire::Hello& h = hello.value();
          hellos_[HelloKey{h.commId, h.fromRank, h.toRank, h.channel}].push_back(Arrival{h, nowNs()});
          ++helloCount_;
          expireHellos();
        } else {
          SHOAL_WARN("ofi rail ", index_, ": dropped a message on the hello tag: ", hello.status().message());
        }
      } else {
        SHOAL_WARN("ofi rail ", index_, ": hello receive failed: ", op->errorText);
      }
      if (Status s = postHelloRecv(op->slot); !s.isOk()) {
        SHOAL_WARN("ofi rail ", index_, ": reposting a hello receive: ", s.message(), " (tried again at each poll)");
        unpostedHelloSlots_.push_back(op->slot);
      }
      return;
    }
    case Op::Kind::kByeSink: {
      if (op->error == FI_ECANCELED) return;  // the endpoint is closing
      if (op->error == 0) {
        recordBye(*op);
      } else {
        SHOAL_WARN("ofi rail ", index_, ": bye receive failed on endpoint ", static_cast<int>(op->lane), ": ",
                   op->errorText);
      }
      if (!postByeSink(*op).isOk()) unpostedSinks_.push_back(op);  // progress() tries again
      return;
    }
    case Op::Kind::kDrain:
      if (op->error == FI_ECANCELED) return endDrain(op);
      drainDone(op);
      return;
    case Op::Kind::kBye:
      if (op->error == 0) recordBye(*op);
      if (op->owner == nullptr && orphans_.erase(op) == 1) delete op;  // its connection is gone
      return;  // the owner sees op->done in its poll()
    case Op::Kind::kControlSend:
      if (op->error != 0 && op->error != FI_ECANCELED)
        SHOAL_INFO(subsys::kNet, "ofi rail ", index_, ": control message not delivered: ", op->errorText);
      --controlSendsInFlight_;
      freeSendSlots_.push_back(op->slot);
      return;
    case Op::Kind::kSend:
    case Op::Kind::kRecv:
    case Op::Kind::kPeek:
    case Op::Kind::kClearance:
      if (op->owner == nullptr && orphans_.erase(op) == 1) {  // its connection is gone
        releaseRegistration(*op);
        delete op;
      }
      return;  // the owner sees op->done in its poll()
  }
}

Result<fi_addr_t> Rail::insertAddress(int lane, const std::string& name, bool sameKernel) {
  Endpoint& e = endpoints_[static_cast<size_t>(lane)];
  if (auto it = e.addresses.find(name); it != e.addresses.end()) return it->second;
  fi_addr_t address = FI_ADDR_NOTAVAIL;
  int rc = fi_av_insert(e.av.get(), name.data(), 1, &address, 0, nullptr);
  if (rc != 1) return systemError(fiError(api_, "fi_av_insert", rc < 0 ? rc : -FI_EINVAL));
  e.addresses.emplace(name, address);
  if (sockets_) sockets_->addPeer(name, sameKernel);
  return address;
}

void Rail::adoptSockets() {
  // A scan reads every descriptor of the process: bounded in rate, since a
  // job's first collectives can open many lanes at once.
  int64_t now = nowNs();
  if (now < nextSocketScanNs_) return;
  socketsDue_ = false;
  nextSocketScanNs_ = now + kSocketScanIntervalNs;
  if (int found = sockets_->adopt(); found > 0) {
    std::string lowat = sockets_->lowat() > 0 ? str("TCP_NOTSENT_LOWAT ", sockets_->lowat(), " on ") : "options on ";
    std::string sized = sockets_->sized() > 0 ? str("; SO_SNDBUF ", sockets_->sendBuffer(), " on ",
                                                    sockets_->sized(), " towards peers on this kernel")
                                              : "";
    SHOAL_INFO(subsys::kNet, "ofi rail ", index_, ": ", lowat, found, " more of the provider's sockets (",
               sockets_->adopted(), " in all", sized, ")");
  }
}

Result<uint32_t> Rail::allocateId() {
  if (idsInUse_.size() >= wire::kMaxId) return error(Code::kSystemError, "ofi: out of connection ids on one endpoint");
  // Ids are not reused until the counter wraps, so a late message for a
  // destroyed connection cannot land in a new one.
  while (idsInUse_.count(nextId_) != 0 || nextId_ == 0) nextId_ = nextId_ >= wire::kMaxId ? 1 : nextId_ + 1;
  uint32_t id = nextId_;
  nextId_ = nextId_ >= wire::kMaxId ? 1 : nextId_ + 1;
  idsInUse_.insert(id);
  return id;
}

void Rail::releaseId(uint32_t id) {
  idsInUse_.erase(id);
  byesArrived_.erase(id);
}

void Rail::retireId(uint32_t id, int lanes) {
  if (!drains_) return releaseId(id);
  int posted = 0;
  for (int lane = 0; lane < lanes && lane < endpointCount(); ++lane) {
    auto* op = new Op();
    op->lane = static_cast<uint8_t>(lane);
    if (Status s = postDrain(*op, id); !s.isOk()) {
      SHOAL_INFO(subsys::kNet, "ofi rail ", index_, ": connection ", id, ": ", s.message(),
                 "; what its peer still sends it there stays with the provider");
      delete op;
      continue;
    }
    draining_.emplace(op, Drain{id, nowNs()});
    ++posted;
  }
  if (posted == 0) return releaseId(id);
  drainingLanes_[id] = posted;
}

// Every message kind that names the connection by id (data, bye,
// clear-to-send: the id in bits 61..40) and none of another connection
// (hellos carry no id, and ids are never 0).
Status Rail::postDrain(Op& op, uint32_t id) {
  const uint8_t lane = op.lane;
  op.reset();
  op.kind = Op::Kind::kDrain;
  op.lane = lane;
  const uint64_t anyKind = 3ull << 62;
  const uint64_t anyMessage = anyKind | (wire::kSeqMask << wire::kSizeBits) | wire::kSizeMask;
  // Every drain of the lane receives into the same bytes, which nobody reads.
  uint8_t* sink = drainSink_.get() + lane * kDrainBytes;
  void* desc = drainMrs_[lane] != nullptr ? fi_mr_desc(drainMrs_[lane]->mr) : nullptr;
  ssize_t rc = fi_trecv(endpoint(lane), sink, kDrainBytes, desc, FI_ADDR_UNSPEC, wire::dataTagWithBits(id, 0, 0),
                        anyMessage, &op.context);
  if (rc != 0) return systemError(fiError(api_, "fi_trecv (drain)", rc), " on endpoint ", static_cast<int>(lane));
  op.posted = true;
  return Status::ok();
}

void Rail::drainDone(Op* op) {
  auto it = draining_.find(op);
  if (it == draining_.end()) return;
  Drain& drain = it->second;
  if (op->error != 0 && op->error != FI_ETRUNC) {
    // Not a message taken: the endpoint failed it (a peer's connection
    // reset, say). Posting again could fail the same way at every pass.
    SHOAL_INFO(subsys::kNet, "ofi rail ", index_, ": connection ", drain.id, ": drain receive failed on endpoint ",
               static_cast<int>(op->lane), ": ", op->errorText);
    return endDrain(op);
  }
  ++drainsConsumed_;
  if (op->error == 0 && (op->gotTag & (3ull << 62)) == wire::kByeKind) recordBye(*op);
  drain.quietPass = false;
  drain.cancelling = false;  // a cancel that came too late: this is a new receive
  // One completion per receive (see open()): the Op is the provider's no more.
  if (Status s = postDrain(*op, drain.id); !s.isOk()) {
    SHOAL_INFO(subsys::kNet, "ofi rail ", index_, ": connection ", drain.id, ": ", s.message(),
               "; what its peer still sends it there stays with the provider");
    endDrain(op);
  }
}

void Rail::endDrain(Op* op) {
  auto it = draining_.find(op);
  if (it == draining_.end()) return;
  const uint32_t id = it->second.id;
  draining_.erase(it);
  delete op;
  if (--drainingLanes_[id] > 0) return;
  drainingLanes_.erase(id);
  releaseId(id);
}

// Called after a lane's completions were read: a drain whose peer said bye
// on its lane (or that waited long enough) and consumed nothing in a whole
// pass since has nothing more coming.
void Rail::endQuietDrains(int lane) {
  const int64_t now = nowNs();
  for (auto& [op, drain] : draining_) {
    if (op->lane != lane || drain.cancelling) continue;
    if (!byeArrived(drain.id, lane) && now - drain.sinceNs < kDrainPatienceNs) continue;
    if (!drain.quietPass) {
      drain.quietPass = true;
      continue;
    }
    drain.cancelling = true;
    fi_cancel(&endpoint(lane)->fid, &op->context);  // its completion (FI_ECANCELED) ends it
  }
}

Rail::DrainStats Rail::drainStats() const { return DrainStats{draining_.size(), drainsConsumed_}; }

Status Rail::sendControl(int lane, fi_addr_t to, uint64_t tag, const void* payload, size_t bytes) {
  if (bytes > kSlotBytes) return internalError("ofi control message of ", bytes, " bytes");
  // The arena is registered for endpoint 0 (FI_MR_ENDPOINT); others send only byes.
  if (bytes > 0 && lane != 0) return internalError("ofi control payload on endpoint ", lane);
  if (freeSendSlots_.empty()) return error(Code::kAgain, "ofi control slots busy");
  int slot = freeSendSlots_.back();
  Op& op = slotOps_[static_cast<size_t>(slot)];
  op.reset();
  op.kind = Op::Kind::kControlSend;
  op.lane = static_cast<uint8_t>(lane);
  op.slot = slot;
  uint8_t* buffer = arena_.get() + slot * kSlotBytes;
  if (bytes > 0) std::memcpy(buffer, payload, bytes);
  void* desc = arenaMr_ ? fi_mr_desc(arenaMr_->mr) : nullptr;
  ssize_t rc = fi_tsend(endpoint(lane), bytes > 0 ? buffer : nullptr, bytes, bytes > 0 ? desc : nullptr, to, tag,
                        &op.context);
  if (rc == -FI_EAGAIN) return error(Code::kAgain, "ofi send queue full");
  if (rc != 0) return systemError(fiError(api_, "fi_tsend (control)", rc));
  freeSendSlots_.pop_back();
  op.posted = true;
  ++controlSendsInFlight_;
  return Status::ok();
}

bool Rail::takeHello(uint64_t commId, int fromRank, int toRank, uint16_t channel, std::string_view secret,
                     wire::Hello& out) {
  auto it = hellos_.find(HelloKey{commId, fromRank, toRank, channel});
  if (it == hellos_.end()) return false;
  auto& list = it->second;
  bool found = false;
  while (!list.empty() && !found) {
    Arrival arrival = list.front();
    list.erase(list.begin());
    --helloCount_;
    if (wire::verifyHello(arrival.hello, secret)) {
      out = arrival.hello;
      found = true;
    } else {
      SHOAL_WARN("ofi rail ", index_, ": a hello for communicator ", commId, " rank ", fromRank,
                 " does not prove the communicator's secret (another job?); dropped");
    }
  }
  if (list.empty()) hellos_.erase(it);
  return found;
}

void Rail::expireHellos() {
  int64_t keepNs = std::max<int64_t>(params().initTimeoutMs, 60000) * 1000000;
  int64_t now = nowNs();
  for (auto it = hellos_.begin(); it != hellos_.end();) {
    auto& list = it->second;
    size_t before = list.size();
    list.erase(std::remove_if(list.begin(), list.end(), [&](const Arrival& a) { return now - a.arrivedNs > keepNs; }),
               list.end());
    helloCount_ -= before - list.size();
    it = list.empty() ? hellos_.erase(it) : std::next(it);
  }
  while (helloCount_ > kMaxWaitingHellos && !hellos_.empty()) {
    auto& list = hellos_.begin()->second;
    list.erase(list.begin());
    --helloCount_;
    if (list.empty()) hellos_.erase(hellos_.begin());
  }
}

void Rail::adoptOrphan(Op* op) {
  op->owner = nullptr;
  orphans_.insert(op);
}

bool Rail::isDeviceMemory(const void* data) const { return placeOf(cuda_, data).iface != FI_HMEM_SYSTEM; }

Status Rail::describe(Op& op) {
  op.mr = nullptr;
  if (op.bytes == 0) return Status::ok();
  MemoryPlace place = placeOf(cuda_, op.data);
  if (place.iface != FI_HMEM_SYSTEM && !deviceMemory_.registers)
    return error(Code::kUnsupported, "a device buffer given to an ofi endpoint that does not register device memory (",
                 deviceMemory_.why, "); device buffers must be staged through host memory");
  bool needed = registerLocal_ || (place.iface != FI_HMEM_SYSTEM && (mrMode_ & FI_MR_HMEM) != 0);
  if (!needed) return Status::ok();
  SHOAL_ASSIGN_OR_RETURN(op.mr, registrations(op.lane).acquire(op.data, op.bytes, place));
  return Status::ok();
}

void Rail::releaseRegistration(Op& op) {
  if (op.mr != nullptr) registrations(op.lane).release(op.mr);
  op.mr = nullptr;
}

}  // namespace shoal::ofi
