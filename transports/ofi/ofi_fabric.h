// The libfabric layer under the ofi transport: the loaded library, RAII for
// fids, the wire tags, and the Rail (one NIC/domain and its endpoints).
//
// Role: OfiTransport opens one Rail per domain of the chosen provider, with
// one or more endpoints each (over a socket provider, one per TCP stream a
// connection should stripe over); OfiConnections post their operations on the
// endpoints ("lanes") of their channel's rail and drain the rail's completion
// queues from their poll() (libfabric's manual progress).
// Owner: the Rail belongs to its OfiTransport and outlives every connection on
// it (the transport lives for the process).
// Thread: every libfabric call on a rail and every field marked "mutex" is
// made under Rail::mutex (the domain is opened FI_THREAD_DOMAIN, so we
// serialise). The engine's single pumping thread takes it once per poll();
// connect() threads take it while they wait for hellos. Lock order: the
// process-wide rail list's mutex (ofiInvalidateRegistrations, stats), then a
// rail's; nothing takes the list's while holding a rail's.
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/status.h"
#include "transports/ofi/ofi_mr_cache.h"
#include "transports/ofi/ofi_sockets.h"

namespace shoal::cuda {
class Driver;
}

namespace shoal::ofi {

// The only libfabric functions that are exported symbols (every other fi_*
// call is an inline dispatch through the fids' ops tables). They are resolved
// with dlopen("libfabric.so.1"), so libnccl.so.2 loads and runs on machines
// without libfabric and the build needs only its headers.
struct Api {
  int (*getinfo)(uint32_t, const char*, const char*, uint64_t, const fi_info*, fi_info**) = nullptr;
  void (*freeinfo)(fi_info*) = nullptr;
  fi_info* (*dupinfo)(const fi_info*) = nullptr;
  int (*fabric)(fi_fabric_attr*, fid_fabric**, void*) = nullptr;
  const char* (*strerror)(int) = nullptr;
  uint32_t (*version)() = nullptr;
  char* (*tostr)(const void*, fi_type) = nullptr;
};
// Whether this build handles device memory and the process has loaded the
// CUDA driver (cuda::Driver::inUse(); then FI_HMEM is asked for: providers
// that grant it may give up host-memory speed, e.g. shm's inline sends).
bool processUsesCuda();

// How a rail treats device buffers: registered with FI_HMEM, so connections
// send from and receive into device memory, or never registered, so device
// buffers must be staged through host memory above the transport (the
// default path, docs/cuda.md). Decided once per rail when it opens.
struct DeviceMemoryPath {
  bool registers = false;
  std::string why;  // "provider tcp;ofi_rxm did not grant FI_HMEM (...)"
  // The INFO line: "device buffers are staged through host memory: <why>".
  std::string describe() const;
};
// The size of the trial registration.
inline constexpr size_t kTrialRegistrationBytes = 2u << 20;
// The decision, from what the rail knows when it opens: `asked`, whether
// FI_HMEM was asked for (processUsesCuda()); `granted`, whether the
// provider's fi_info has it; `trial`, the outcome of registering
// kTrialRegistrationBytes of device memory with FI_HMEM_CUDA (only looked at
// when granted). Registers only when both say yes.
DeviceMemoryPath deviceMemoryPath(std::string_view provider, bool asked, bool granted, const Status& trial);
// Loads libfabric once per process; the error says why it could not.
Result<const Api*> loadApi();
std::string versionString(uint32_t version);  // "1.17"
// "fi_tsend: Resource temporarily unavailable (-11)"
std::string fiError(const Api& api, std::string_view what, int64_t rc);

// Closes a fid when it goes out of scope (wrapped the moment it exists).
struct FidCloser {
  void operator()(fid_fabric* f) const { if (f) fi_close(&f->fid); }
  void operator()(fid_domain* f) const { if (f) fi_close(&f->fid); }
  void operator()(fid_cq* f) const { if (f) fi_close(&f->fid); }
  void operator()(fid_av* f) const { if (f) fi_close(&f->fid); }
  void operator()(fid_ep* f) const { if (f) fi_close(&f->fid); }
  void operator()(fid_mr* f) const { if (f) fi_close(&f->fid); }
};
template <typename T>
using FidPtr = std::unique_ptr<T, FidCloser>;

// Frees an fi_info list through the loaded library.
struct InfoDeleter {
  const Api* api = nullptr;
  void operator()(fi_info* info) const { if (info) api->freeinfo(info); }
};
using InfoPtr = std::unique_ptr<fi_info, InfoDeleter>;

// --- wire tags (the 64-bit libfabric tag of every message)
//   [63..62] kind: 0 data, 1 hello, 2 bye
//   [61..40] data and bye: the receiving connection's id on its endpoint
//   [39..16] data: the message number on its lane, per direction
//   [15..0]  data: size bits, what keeps a message from matching a receive of
//            another size: a whole message carries [15] 0 and [14..0] a hash
//            of its byte count; a part of a message striped over s lanes
//            carries [15] 1, [14..11] bytes % s and [10..0] a hash of the
//            whole message's byte count.
// Shoal's own 64-bit tag travels as the message's immediate data (cq_data).
// The size bits keep a size mismatch from truncating inside the provider
// (1.17's shm spins forever on a truncated large message); the receiver finds
// such a message with FI_PEEK, ignoring the size bits (OfiConnection::peek),
// and sentBytes() recovers what the peer sent from the length and size bits
// of what it sees (rxm's peek reports no immediate data).
//
// Striping (ofi_connection.h): a message of at least kStripeMinBytes on a
// connection of s > 1 lanes travels as s parts, one per lane; part 0 has
// bytes / s + bytes % s bytes, the others bytes / s, in order.
namespace wire {
inline constexpr int kIdBits = 22;
inline constexpr int kSeqBits = 24;
inline constexpr int kSizeBits = 16;
inline constexpr uint32_t kMaxId = (1u << kIdBits) - 1;
inline constexpr uint64_t kSeqMask = (1ull << kSeqBits) - 1;
inline constexpr uint64_t kSizeMask = (1ull << kSizeBits) - 1;
inline constexpr int kIdShift = kSeqBits + kSizeBits;
inline constexpr uint64_t kHelloKind = 1ull << 62;
inline constexpr uint64_t kByeKind = 2ull << 62;
inline constexpr uint64_t kClearKind = 3ull << 62;
inline constexpr uint64_t kStripedBit = 1ull << 15;
inline constexpr int kRemainderShift = 11;
inline constexpr uint64_t kMaxStripes = 16;  // the remainder's 4 bits
// Below this a message stays whole: parts of 128 KiB and more keep the
// per-message costs (a rendezvous, a completion) small against the bytes.
inline constexpr uint64_t kStripeMinBytes = 256 * 1024;

inline uint64_t sizeHash(uint64_t bytes) {
  uint64_t x = bytes * 0x9E3779B97F4A7C15ull;
  return x ^ (x >> 29) ^ (x >> 47);
}
// How many parts a message of `bytes` travels in over `lanes` lanes.
inline uint64_t stripeCount(uint64_t bytes, uint64_t lanes) {
  return lanes > 1 && lanes <= kMaxStripes && bytes >= kStripeMinBytes ? lanes : 1;
}
// The lane that part `index` of a message travels on, for the channel whose
// number on its rail is `railChannel` (channel / rails): a channel's whole
// messages all take its own lane, so they reach the peer in the order its
// receives are posted. Rotating them over the lanes let a later message
// overtake on another TCP stream and arrive before its receive; rxm then
// treats every message after it on that endpoint as unexpected (bounce
// buffer and copy) until it has been read from the provider's queue: about
// 15 % of an AllReduce's messages, up to a third of a slow call's, and
// 1.5-2x the time (decision 0007).
inline uint64_t partLane(uint64_t railChannel, uint64_t index, uint64_t lanes) {
  return (railChannel + index) % lanes;
}
struct Part {
  uint64_t offset = 0;
  uint64_t bytes = 0;
};
inline Part part(uint64_t bytes, uint64_t stripes, uint64_t index) {
  uint64_t each = bytes / stripes, first = each + bytes % stripes;
  return index == 0 ? Part{0, first} : Part{first + (index - 1) * each, each};
}
inline uint64_t sizeBits(uint64_t bytes, uint64_t stripes) {
  if (stripes <= 1) return sizeHash(bytes) & (kStripedBit - 1);
  return kStripedBit | ((bytes % stripes) << kRemainderShift) | (sizeHash(bytes) & ((1ull << kRemainderShift) - 1));
}
// The byte count of the message whose first part (or whole) is `length`
// bytes with `bits` as its size bits, on a connection of `lanes` lanes.
inline uint64_t sentBytes(uint64_t bits, uint64_t length, uint64_t lanes) {
  if ((bits & kStripedBit) == 0) return length;
  uint64_t remainder = (bits >> kRemainderShift) & (kMaxStripes - 1);
  return length >= remainder ? lanes * (length - remainder) + remainder : length;
}
// The tag of message `seq` (its part's lane number) of connection `recvId`
// whose size bits are `bits` (sizeBits()).
inline uint64_t dataTagWithBits(uint32_t recvId, uint64_t seq, uint64_t bits) {
  return (static_cast<uint64_t>(recvId) << kIdShift) | ((seq & kSeqMask) << kSizeBits) | (bits & kSizeMask);
}
inline uint64_t dataTag(uint32_t recvId, uint64_t seq, uint64_t bytes, uint64_t stripes = 1) {
  return dataTagWithBits(recvId, seq, sizeBits(bytes, stripes));
}
inline uint64_t helloTag() { return kHelloKind; }
inline uint64_t byeTag(uint32_t recvId) { return kByeKind | (static_cast<uint64_t>(recvId) << kIdShift); }
// Clear-to-send for the part numbered `seq` on its lane of connection
// `recvId` (the sender's id, as in its hello): the receiver has posted that
// part's receive (OfiConnection: "Clear to send").
inline uint64_t clearTag(uint32_t recvId, uint64_t seq) { return kClearKind | dataTagWithBits(recvId, seq, 0); }

// The hello each side of a connection sends the other at set-up (80 bytes,
// little-endian): u32 "SHOF", u16 version, u16 channel, u64 commId,
// i32 fromRank, i32 toRank, u32 recvId (the sender's id for this connection:
// the peer tags its data with it), u32 clearAbove (0, or: send me a
// clear-to-send before each message part larger than this), u8 nonce[16],
// u8 proof[32] = HMAC-SHA256(secret, "shoal ofi hello v1" || bytes 0..47).
inline constexpr size_t kHelloBytes = 80;
struct Hello {
  uint64_t commId = 0;
  int32_t fromRank = -1;
  int32_t toRank = -1;
  uint16_t channel = 0;
  uint32_t recvId = 0;
  uint32_t clearAbove = 0;
  uint8_t nonce[16] = {};
  uint8_t proof[32] = {};
};
void encodeHello(const Hello& hello, uint8_t out[kHelloBytes]);
Result<Hello> decodeHello(const uint8_t* in, size_t bytes);
Status signHello(Hello& hello, std::string_view secret);
bool verifyHello(const Hello& hello, std::string_view secret);
}  // namespace wire

class OfiConnection;

// Whether libfabric's shm provider in this process moves messages above its
// inject size through its segment, in order (FI_SHM_DISABLE_CMA true, which
// loading sets where single-copy reads do not pay): an unreceived one would
// hold up every later message between the two endpoints, so each waits for
// a clear-to-send (OfiConnection).
bool shmSendsStream();

// One operation given to the provider. The fi_context2 comes first: the
// completion's op_context is the Op itself. The provider owns the context
// until the completion arrives, so an Op whose connection is destroyed first
// is "orphaned" (owner = nullptr) and the rail frees it on its completion.
struct Op {
  enum class Kind : uint8_t { kSend, kRecv, kBye, kByeSink, kPeek, kHelloRecv, kControlSend, kClearance, kDrain };
  fi_context2 context{};
  Kind kind = Kind::kSend;
  uint8_t lane = 0;     // the rail's endpoint it was posted on
  bool posted = false;  // handed to the provider
  bool done = false;    // its completion (or error) arrived
  OfiConnection* owner = nullptr;
  // What was asked.
  void* data = nullptr;
  uint64_t bytes = 0;
  uint64_t tag = 0;    // Shoal's tag
  uint64_t token = 0;
  uint64_t seq = 0;           // message number on the connection
  uint64_t laneSeq = 0;       // message number on its lane (the wire tag's)
  uint64_t messageBytes = 0;  // the whole message's (a part's op carries some of it)
  uint64_t sizeBits = 0;      // the wire tag's (wire::sizeBits)
  bool last = true;           // the message's last part: its completion is the message's
  Op* clearance = nullptr;    // a send's: the receive of its clear-to-send (null: none needed)
  MrCache::Handle* mr = nullptr;
  int slot = -1;       // control slot (hello receives, control sends)
  // What the completion said.
  uint64_t gotBytes = 0;
  uint64_t gotTag = 0;  // the libfabric tag (peeks)
  uint64_t gotData = 0;
  bool gotDataValid = false;
  int error = 0;          // FI_E* (positive), 0 = success
  uint64_t overflow = 0;  // truncated bytes (FI_ETRUNC)
  std::string errorText;  // provider's words
  void reset() { *this = Op{}; }
};

// What a rail needs from the chosen fi_info.
struct RailOptions {
  bool alwaysRegister = false;  // SHOAL_OFI_ALWAYS_REGISTER
  bool cacheRegistrations = true;
  size_t cacheEntries = 1024;
  // Over socket providers: TCP_NOTSENT_LOWAT for the provider's sockets
  // (ProviderSockets; SHOAL_SOCKET_NOTSENT_LOWAT); 0: leave them alone.
  int64_t socketNotsentLowat = 0;
  // And SO_SNDBUF for those towards peers on this kernel (decision 0012;
  // SHOAL_SOCKET_SAME_KERNEL_SNDBUF); 0: autotuning.
  int64_t socketSameKernelSendBuffer = 0;
  // FI_HMEM was asked for (processUsesCuda()): where the provider granted it,
  // the rail tries a registration of device memory (DeviceMemoryPath).
  bool deviceMemoryAsked = false;
};

// Most endpoints a rail opens (each is one more TCP stream per peer over a
// socket provider; beyond a few they only add polling).
inline constexpr int kMaxEndpointsPerRail = 16;
static_assert(kMaxEndpointsPerRail <= wire::kMaxStripes, "a striped message's remainder must fit its tag bits");

// One NIC: its domain and `endpoints` RDM endpoints, each with its own
// completion queue and AV. Why several endpoints on one NIC: over tcp;ofi_rxm
// an endpoint reaches a peer through one TCP connection, so a connection that
// stripes its large messages over k endpoints has k streams in flight, as the
// tcp transport has k sockets. Control traffic (hellos) uses endpoint 0; byes
// go on every endpoint a connection uses.
class Rail {
 public:
  static Result<std::unique_ptr<Rail>> open(const Api& api, const fi_info& info, int index, int endpoints,
                                            const RailOptions& options);
  ~Rail();
  Rail(const Rail&) = delete;
  Rail& operator=(const Rail&) = delete;

  std::mutex mutex;

  const Api& api() const { return api_; }
  int index() const { return index_; }
  int endpointCount() const { return static_cast<int>(endpoints_.size()); }
  // Each endpoint's fi_getname bytes (what peers fi_av_insert), endpoint 0 first.
  std::vector<std::string> names() const;
  const std::string& domainName() const { return domainName_; }
  fid_ep* endpoint(int lane) const { return endpoints_[static_cast<size_t>(lane)].ep.get(); }
  size_t injectBytes() const { return injectBytes_; }
  uint64_t maxMessageBytes() const { return maxMessageBytes_; }
  // Whether the provider granted FI_HMEM.
  bool hmem() const { return hmem_; }
  // Whether device buffers are registered (FI_HMEM granted and the trial
  // registration succeeded), and why or why not.
  const DeviceMemoryPath& deviceMemory() const { return deviceMemory_; }
  // Whether FI_PEEK looks without consuming (OfiConnection::peekForMismatch).
  bool peekWorks() const { return peekWorks_; }

  // All below: mutex held.
  // Drains every endpoint's completion queue (which is also what drives each
  // endpoint under manual progress) and dispatches every entry to its Op.
  // Errors here are the rail's (a CQ itself failed); an operation's error goes
  // to it.
  Status progress();
  // The same for endpoint `lane` alone.
  Status progress(int lane);
  // A peer endpoint's address in endpoint `lane`'s AV (each endpoint has its
  // own AV, so no provider state is shared between endpoints). `sameKernel`:
  // the peer runs on this kernel (its sockets get the send buffer).
  Result<fi_addr_t> insertAddress(int lane, const std::string& name, bool sameKernel);
  // A fresh connection id (wire tags) for `owner`; released on destruction.
  // One id serves every endpoint of the connection.
  Result<uint32_t> allocateId();
  // A destroyed connection's id (~OfiConnection), whose connection used
  // endpoints 0..lanes-1. What its peer sent it that nobody received (an
  // abort mid-operation: the peer's parts on their way, its clear-to-sends)
  // would stay in the provider's unexpected queue for good, a receive buffer
  // each over tcp;ofi_rxm, and make every later receive on the endpoint
  // search past it. So, over rxm, a small receive that matches any message
  // for the id (a "drain") stays posted on each lane, taking what arrives
  // (truncated), and is posted again after each; it ends at a progress of
  // its lane once the peer said bye there (its messages come before its
  // bye) or kDrainPatienceNs passed (a peer that died says nothing), and a
  // pass found nothing more for it. The id stays taken until every lane's
  // drain has ended. Over other providers the id is released at once.
  void retireId(uint32_t id, int lanes);
  bool drainsRetiredIds() const { return drains_; }
  // Drains still posted, and messages they consumed since the rail opened.
  struct DrainStats {
    size_t posted = 0;
    uint64_t consumed = 0;
  };
  DrainStats drainStats() const;
  // Whether the peer of connection `id` said bye on endpoint `lane`.
  bool byeArrived(uint32_t id, int lane) const;
  // Sends a control message from endpoint `lane` (hello: `bytes` of payload,
  // endpoint 0 only; bye: none). kAgain when the provider or the control
  // slots push back.
  Status sendControl(int lane, fi_addr_t to, uint64_t tag, const void* payload, size_t bytes);
  size_t controlSendsInFlight() const { return controlSendsInFlight_; }
  // Takes the first hello for (commId, from -> to, channel) that proves
  // `secret`; hellos that do not prove it are dropped and logged.
  bool takeHello(uint64_t commId, int fromRank, int toRank, uint16_t channel, std::string_view secret,
                 wire::Hello& out);
  // A connection's first completion on a lane: the provider may have opened
  // a socket for it, which the next progress() looks for (ProviderSockets).
  void noteNewLaneTraffic() { socketsDue_ = sockets_ != nullptr; }
  // An Op of a destroyed connection: freed when its completion arrives.
  void adoptOrphan(Op* op);
  // Whether `data` is device (or managed) memory; always false in a process
  // that did not ask for FI_HMEM (no CUDA driver when the rail opened).
  bool isDeviceMemory(const void* data) const;
  // The local descriptor for [data, data + bytes) on the op's lane,
  // registering (through the cache) when the provider needs it; nullptr desc
  // when it does not.
  Status describe(Op& op);
  void releaseRegistration(Op& op);
  // Registrations are the domain's, so one cache serves every endpoint,
  // except under FI_MR_ENDPOINT (a registration is bound to one endpoint):
  // then each endpoint has its own.
  MrCache& registrations(int lane) { return *caches_[caches_.size() == 1 ? 0 : static_cast<size_t>(lane)]; }
  MrCache::Stats registrationStats() const;
  void invalidateRegistrations(void* base, size_t bytes);

 private:
  Rail(const Api& api, int index);
  Status postHelloRecv(int slot);
  Status postByeSink(Op& op);
  Status postDrain(Op& op, uint32_t id);
  void drainDone(Op* op);  // a drain's receive completed: post it again
  void endDrain(Op* op);   // its cancel came back, or it failed, or it could not be posted
  void endQuietDrains(int lane);
  void releaseId(uint32_t id);
  Status readCompletions(int lane);
  void recordBye(const Op& op);  // a bye received by a connection's receive or a sink
  // Posts again the hello receives and bye sinks whose repost the provider
  // pushed back (progress(), before reading completions).
  void repostPushedBack();
  void dispatch(Op* op);
  void expireHellos();
  void adoptSockets();

  // One endpoint, its completion queue and AV (declared before the endpoint,
  // so the endpoint bound to them closes first).
  struct Endpoint {
    FidPtr<fid_cq> cq;
    FidPtr<fid_av> av;
    FidPtr<fid_ep> ep;
    std::string name;
    std::unordered_map<std::string, fi_addr_t> addresses;  // inserted peer names
  };

  const Api& api_;
  const int index_;
  FidPtr<fid_fabric> fabric_;
  FidPtr<fid_domain> domain_;
  std::vector<Endpoint> endpoints_;  // closed before the domain
  std::string domainName_;
  size_t injectBytes_ = 0;
  uint64_t maxMessageBytes_ = 0;
  uint64_t mrMode_ = 0;
  bool hmem_ = false;
  DeviceMemoryPath deviceMemory_;
  // The process's CUDA driver when FI_HMEM was asked for (pointer kinds in
  // describe()); null otherwise.
  cuda::Driver* cuda_ = nullptr;
  bool peekWorks_ = true;
  bool registerLocal_ = false;  // FI_MR_LOCAL or SHOAL_OFI_ALWAYS_REGISTER
  std::vector<std::unique_ptr<MrCache>> caches_;  // one, or one per endpoint (FI_MR_ENDPOINT)

  // Control slots: a registered arena (on endpoint 0); the first
  // kHelloRecvSlots stay posted there for hellos, the rest carry control sends.
  std::unique_ptr<uint8_t[]> arena_;
  MrCache::Handle* arenaMr_ = nullptr;
  std::vector<Op> slotOps_;
  std::vector<int> freeSendSlots_;
  std::vector<int> unpostedHelloSlots_;  // hello receives whose repost was pushed back (repostPushedBack)
  size_t controlSendsInFlight_ = 0;

  std::unordered_set<uint32_t> idsInUse_;
  uint32_t nextId_ = 1;
  // Byes: besides each live connection's exact-tag bye receives, a few
  // receives per endpoint that match the bye of any connection id stay
  // posted (byeSinks_, never resized: the provider holds their contexts;
  // unpostedSinks_: those whose repost the provider pushed back, retried by
  // progress()). A bye for a live id is recorded per lane (byesArrived_, a
  // bit per endpoint, until its id is released); one for an id already
  // released (both sides closed at once, each bye arriving after the other's
  // connection was gone) is dropped. Without the sinks such a late bye met
  // only the connection's cancelled receive and stayed in the provider's
  // unexpected queue for good: over tcp;ofi_rxm one receive buffer (about
  // 4.4 KiB) each, ~7 KiB of memory per communicator made and destroyed.
  std::vector<Op> byeSinks_;
  std::vector<Op*> unpostedSinks_;
  std::unordered_map<uint32_t, uint32_t> byesArrived_;
  // Drains (retireId), by their posted Op: their id, since when, whether a
  // progress pass since the end condition held found nothing, whether the
  // cancel was asked for.
  struct Drain {
    uint32_t id = 0;
    int64_t sinceNs = 0;
    bool quietPass = false;
    bool cancelling = false;
  };
  bool drains_ = false;  // whether the provider's truncation is safe to drain with (open())
  std::unordered_map<Op*, Drain> draining_;
  std::unordered_map<uint32_t, int> drainingLanes_;  // id -> lanes whose drain has not ended
  uint64_t drainsConsumed_ = 0;
  std::unique_ptr<uint8_t[]> drainSink_;    // kDrainBytes per endpoint
  std::vector<MrCache::Handle*> drainMrs_;  // its registration per endpoint, where receives need one
  struct HelloKey {
    uint64_t commId;
    int fromRank, toRank, channel;
    bool operator<(const HelloKey& o) const;
  };
  struct Arrival {
    wire::Hello hello;
    int64_t arrivedNs;
  };
  std::map<HelloKey, std::vector<Arrival>> hellos_;
  size_t helloCount_ = 0;
  std::unordered_set<Op*> orphans_;

  // The provider's sockets (null unless RailOptions::socketNotsentLowat or
  // socketSameKernelSendBuffer is set and our endpoints have socket
  // addresses); looked through at most once per
  // kSocketScanIntervalNs while due.
  std::unique_ptr<ProviderSockets> sockets_;
  bool socketsDue_ = false;
  int64_t nextSocketScanNs_ = 0;
};

// Every open rail in the process (for the invalidation hook and statistics).
void forEachRail(const std::function<void(Rail&)>& visit);

}  // namespace shoal::ofi
