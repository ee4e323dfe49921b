#include "transports/tcp/tcp_transport.h"

#include <poll.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "core/byte_order.h"
#include "core/log.h"
#include "core/params.h"
#include "net/crypto.h"
#include "net/interfaces.h"
#include "net/reject_log.h"
#include "net/socket.h"
#include "transports/tcp/tcp_connection.h"

namespace shoal {
namespace tcp {
namespace {

constexpr uint32_t kHelloMagic = 0x43544853;  // "SHTC"
constexpr uint16_t kHelloVersion = 1;
constexpr size_t kSignedBytes = 48;  // hello bytes covered by the proof
constexpr uint32_t kMinChunkBytes = 4096;
constexpr uint32_t kMaxChunkBytes = 1u << 30;

constexpr std::string_view kHelloLabel = "shoal tcp hello v1";

}  // namespace

void encodeHello(const Hello& hello, uint8_t out[kHelloBytes]) {
  putLe(out, kHelloMagic, 4);
  putLe(out + 4, kHelloVersion, 2);
  putLe(out + 6, hello.sockets, 2);
  putLe(out + 8, hello.commId, 8);
  putLe(out + 16, static_cast<uint32_t>(hello.fromRank), 4);
  putLe(out + 20, static_cast<uint32_t>(hello.toRank), 4);
  putLe(out + 24, hello.channel, 2);
  putLe(out + 26, hello.socketIndex, 2);
  putLe(out + 28, hello.chunkBytes, 4);
  std::memcpy(out + 32, hello.nonce, 16);
  std::memcpy(out + 48, hello.proof, 32);
}

Result<Hello> decodeHello(const uint8_t in[kHelloBytes]) {
  if (getLe(in, 4) != kHelloMagic) return invalidArgument("not a Shoal tcp hello");
  if (getLe(in + 4, 2) != kHelloVersion) return invalidArgument("unsupported hello version ", getLe(in + 4, 2));
  Hello h;
  h.sockets = static_cast<uint16_t>(getLe(in + 6, 2));
  h.commId = getLe(in + 8, 8);
  h.fromRank = static_cast<int32_t>(getLe(in + 16, 4));
  h.toRank = static_cast<int32_t>(getLe(in + 20, 4));
  h.channel = static_cast<uint16_t>(getLe(in + 24, 2));
  h.socketIndex = static_cast<uint16_t>(getLe(in + 26, 2));
  h.chunkBytes = static_cast<uint32_t>(getLe(in + 28, 4));
  std::memcpy(h.nonce, in + 32, 16);
  std::memcpy(h.proof, in + 48, 32);
  if (h.sockets < 1 || h.sockets > kMaxLanes || h.socketIndex >= h.sockets)
    return invalidArgument("hello: socket ", h.socketIndex, " of ", h.sockets);
  if (h.fromRank < 0 || h.toRank < 0 || h.fromRank == h.toRank)
    return invalidArgument("hello: ranks ", h.fromRank, " -> ", h.toRank);
  if (h.chunkBytes < kMinChunkBytes || h.chunkBytes > kMaxChunkBytes)
    return invalidArgument("hello: chunk size ", h.chunkBytes);
  return h;
}

Status signHello(Hello& hello, std::string_view secret) {
  return net::signHello<kHelloBytes>(hello, secret, kHelloLabel, kSignedBytes, encodeHello);
}

bool verifyHello(const Hello& hello, std::string_view secret) {
  return net::verifyHello<kHelloBytes>(hello, secret, kHelloLabel, kSignedBytes, encodeHello);
}

int socketsPerConnection() {
  int64_t n = params().socketNthreads * params().nsocksPerThread;
  return static_cast<int>(std::clamp<int64_t>(n, 1, kMaxLanes));
}

uint32_t chunkBytesParam() {
  return static_cast<uint32_t>(std::clamp<int64_t>(params().socketChunkBytes, kMinChunkBytes, kMaxChunkBytes));
}

}  // namespace tcp

namespace {

using tcp::Hello;

constexpr int kMaxPendingHellos = 256;
constexpr size_t kMaxWaitingSockets = 4096;
constexpr int64_t kPumpSliceMs = 50;

void warnOnce(std::once_flag& once, const Status& refused, std::string_view setting) {
  std::call_once(once, [&] {
    SHOAL_WARN("tcp: ", setting, " not applied (", refused.message(), "); sockets keep the system's setting");
  });
}

// The options of every data socket, on both sides. The unsent-bytes cap
// and the send buffer are performance settings (docs/decisions/0009, 0012),
// not conditions of the connection: a kernel that refuses one keeps its
// default, said once.
Status prepareDataSocket(int fd, const net::LivenessOptions& liveness, int64_t sendBuffer) {
  SHOAL_TRY(net::setNoDelay(fd));
  SHOAL_TRY(net::setLiveness(fd, liveness));
  if (Status capped = net::setNotsentLowat(fd, params().socketNotsentLowat); !capped.isOk()) {
    static std::once_flag once;
    warnOnce(once, capped, "SHOAL_SOCKET_NOTSENT_LOWAT");
  }
  if (Status sized = net::setSendBuffer(fd, sendBuffer); !sized.isOk()) {
    static std::once_flag once;
    warnOnce(once, sized, "SHOAL_SOCKET_SAME_KERNEL_SNDBUF");
  }
  return Status::ok();
}

// SO_SNDBUF for a connection's sockets: the same-kernel size when the peer
// runs on this kernel; else 0, autotuning.
int64_t sendBufferFor(const ConnectOptions& options) {
  if (options.self == nullptr || options.peer == nullptr || !options.self->sameKernel(*options.peer)) return 0;
  return net::sameKernelSendBufferFromParams();
}

std::string sendBufferNote(int64_t sendBuffer) {
  return sendBuffer > 0 ? str(", SO_SNDBUF ", sendBuffer, " (the peer runs on this kernel)") : std::string();
}

// Which connection a socket belongs to, as the acceptor sees it.
struct SocketKey {
  uint64_t commId;
  int fromRank;  // the connector
  int toRank;    // the acceptor
  int channel;
  bool operator<(const SocketKey& o) const {
    return std::tie(commId, fromRank, toRank, channel) < std::tie(o.commId, o.fromRank, o.toRank, o.channel);
  }
};

// An accepted socket whose hello is complete, waiting for its owner.
struct Arrival {
  net::Fd fd;
  net::SocketAddress from;
  Hello hello;
  int64_t arrivedNs;
};

// An accepted socket whose hello is still being read (the pump's only).
struct PendingHello {
  net::Fd fd;
  net::SocketAddress from;
  uint8_t bytes[tcp::kHelloBytes];
  size_t have = 0;
  int64_t deadlineNs;
};

std::string describePeer(const ConnectionKey& key, const ConnectOptions& options) {
  if (options.peer == nullptr) return str("rank ", key.peerRank);
  const std::string* address = options.peer->address("tcp");
  return str("rank ", key.peerRank, " (host ", options.peer->hostname.empty() ? "?" : options.peer->hostname,
             ", tcp ", address ? *address : std::string("?"), ")");
}

class TcpTransport final : public Transport {
 public:
  TcpTransport() = default;

  std::string_view name() const override { return "tcp"; }
  LinkClass linkClass() const override { return LinkClass::kNet; }
  bool cpuCopiesBytes() const override { return true; }
  Result<std::string> localAddress() override;
  bool canConnect(const PeerInfo& self, const PeerInfo& peer) const override {
    return peer.address("tcp") != nullptr;
  }
  // Its listener lives as long as its process (the registry keeps it): a
  // refusal at its address means the process is gone. A live process that
  // takes the probe drops it quietly, as any connection closed before its
  // hello (readHello).
  ProcessProbe probePeerProcess(const PeerInfo& self, const PeerInfo& peer, Deadline deadline) const override {
    const std::string* text = peer.address("tcp");
    if (text == nullptr) return {};
    Result<net::SocketAddress> address = net::SocketAddress::parse(*text);
    // A loopback address reaches this kernel's listeners, not another's.
    if (!address.isOk() || (address.value().isLoopback() && !self.sameKernel(peer))) return {};
    switch (net::probeListener(address.value(), deadline)) {
      case net::ListenerAnswer::kAccepts: return {ProcessProbe::kAlive, ""};
      case net::ListenerAnswer::kRefuses:
        return {ProcessProbe::kGone, str("its process has exited (its tcp listener at ", *text,
                                         " refuses connections)")};
      case net::ListenerAnswer::kUnknown: break;
    }
    return {};
  }
  Result<std::unique_ptr<Connection>> connect(const ConnectionKey& key, const ConnectOptions& options) override;
  // The higher rank waits for the lower rank's hello.
  bool connectWaitsForPeer(const ConnectionKey& key) const override { return key.selfRank > key.peerRank; }
  // One pass of the pump, waiting for nothing, where no connect pumps:
  // probes closed before their hello are dropped (at this pass or the
  // next), hellos kept for a later connect.
  void tidy() override;
  // Closes the sockets peers sent for connections the rank never took: a
  // peer writing on one learns of the end at once, and a later communicator
  // with the same id (NCCL_COMM_ID gives every one the same) never takes
  // them for its own.
  void forgetRank(uint64_t commId, int rank) override;
  void closeInForkedChild() override { listener_.reset(); }

 private:
  Result<std::unique_ptr<Connection>> connectActive(const ConnectionKey& key, const ConnectOptions& options,
                                                    const std::string& peer);
  Result<std::unique_ptr<Connection>> acceptPassive(const ConnectionKey& key, const ConnectOptions& options,
                                                    const std::string& peer);
  // Moves arrivals for `want` that prove `secret` into `lanes` (mutex_ held).
  void claim(const SocketKey& want, std::string_view secret, std::vector<net::Fd>& lanes, int& filled,
             uint32_t& chunkBytes);
  // Accepts and reads hellos for up to `timeoutMs` (one thread at a time; no
  // lock); 0: one pass that waits for nothing.
  void pump(int64_t timeoutMs);
  // pump() unless another thread pumps already (then false at once); `lock`
  // holds mutex_, released while pumping.
  bool pumpIfFree(std::unique_lock<std::mutex>& lock, int64_t timeoutMs);
  void acceptNew();
  void readHello(PendingHello& pending);
  void expireWaiting(int64_t now);  // mutex_ held

  std::mutex mutex_;
  std::condition_variable arrived_;
  net::Fd listener_;
  std::string address_;
  bool pumping_ = false;
  std::map<SocketKey, std::vector<Arrival>> waiting_;
  size_t waitingCount_ = 0;
  std::vector<PendingHello> pending_;  // only the pumping thread touches it
  net::RejectLog rejects_{"tcp transport"};
  // A failed accept (out of descriptors, memory): the connection stays in
  // the kernel's queue and the listener readable, so the pump leaves the
  // listener alone until then instead of spinning on it, and the failure
  // is said once per pause and in a timeout's message.
  static constexpr int64_t kAcceptPauseMs = 100;
  int64_t acceptPausedUntilNs_ = 0;  // the pumping thread's
  bool acceptFailing_ = false;       // the pumping thread's: acceptFailure_ is set
  std::string acceptFailure_;        // mutex_; cleared by the next accept
  int64_t acceptFailureNs_ = 0;      // mutex_; when it last failed
};

Result<std::string> TcpTransport::localAddress() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (listener_) return address_;
  SHOAL_ASSIGN_OR_RETURN(net::NetInterface itf, net::chooseInterface());
  net::ListenOptions options;
  options.bufferBytes = params().socketBufferBytes;
  Result<net::Fd> listener = net::listenOn(itf.address, options);
  if (!listener.isOk()) return listener.takeStatus().withContext("tcp transport listener");
  SHOAL_ASSIGN_OR_RETURN(net::SocketAddress bound, net::localAddressOf(listener.value().get()));
  listener_ = std::move(listener.value());
  address_ = bound.toString();
  SHOAL_INFO(subsys::kInit | subsys::kNet, "tcp transport listening on ", address_, " (", itf.name, ")");
  return address_;
}

Result<std::unique_ptr<Connection>> TcpTransport::connect(const ConnectionKey& key, const ConnectOptions& options) {
  std::string peer = describePeer(key, options);
  std::string what = str("tcp connect to ", peer, " channel ", key.channel);
  if (key.selfRank == key.peerRank)
    return error(Code::kUnsupported, what, ": tcp does not connect a rank to itself");
  if (key.selfRank < 0 || key.peerRank < 0) return invalidArgument(what, ": bad ranks ", key.selfRank, ", ", key.peerRank);
  Result<std::unique_ptr<Connection>> connection =
      key.selfRank < key.peerRank ? connectActive(key, options, peer) : acceptPassive(key, options, peer);
  if (!connection.isOk()) return connection.takeStatus().withContext(what);
  return connection;
}

// --- the lower rank: connect and say hello

Result<std::unique_ptr<Connection>> TcpTransport::connectActive(const ConnectionKey& key,
                                                                const ConnectOptions& options,
                                                                const std::string& peer) {
  const std::string* text = options.peer ? options.peer->address("tcp") : nullptr;
  if (text == nullptr) return invalidArgument("the peer published no tcp address");
  SHOAL_ASSIGN_OR_RETURN(net::SocketAddress address, net::SocketAddress::parse(*text));
  int sockets = tcp::socketsPerConnection();
  uint32_t chunkBytes = tcp::chunkBytesParam();
  net::LivenessOptions liveness = net::LivenessOptions::fromParams();
  const int64_t sendBuffer = sendBufferFor(options);
  std::vector<net::Fd> lanes;
  for (int i = 0; i < sockets; ++i) {
    Result<net::Fd> connected = net::connectWithRetry(address, options.deadline);
    if (!connected.isOk()) return connected.takeStatus().withContext(str("socket ", i, " of ", sockets));
    net::Fd fd = std::move(connected.value());
    SHOAL_TRY(prepareDataSocket(fd.get(), liveness, sendBuffer));
    Hello hello;
    hello.commId = key.commId;
    hello.fromRank = key.selfRank;
    hello.toRank = key.peerRank;
    hello.channel = key.channel;
    hello.socketIndex = static_cast<uint16_t>(i);
    hello.sockets = static_cast<uint16_t>(sockets);
    hello.chunkBytes = chunkBytes;
    SHOAL_TRY(tcp::signHello(hello, options.secret));
    uint8_t bytes[tcp::kHelloBytes];
    tcp::encodeHello(hello, bytes);
    SHOAL_TRY(net::writeExact(fd.get(), bytes, sizeof(bytes), options.deadline, "hello"));
    lanes.push_back(std::move(fd));
  }
  SHOAL_INFO(subsys::kInit | subsys::kNet, "tcp: connected to ", peer, " channel ", key.channel, " with ",
             sockets, sockets == 1 ? " socket" : " sockets", sendBufferNote(sendBuffer));
  return std::unique_ptr<Connection>(std::make_unique<tcp::TcpConnection>(std::move(lanes), chunkBytes, peer));
}

// --- the higher rank: take sockets from the listener

Result<std::unique_ptr<Connection>> TcpTransport::acceptPassive(const ConnectionKey& key,
                                                                const ConnectOptions& options,
                                                                const std::string& peer) {
  SHOAL_TRY(localAddress().status());
  SocketKey want{key.commId, key.peerRank, key.selfRank, key.channel};
  const int64_t waitStartNs = nowNs();  // accept failures before it are not this wait's
  std::vector<net::Fd> lanes;
  int filled = 0;
  uint32_t chunkBytes = 0;
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    claim(want, options.secret, lanes, filled, chunkBytes);
    if (!lanes.empty() && filled == static_cast<int>(lanes.size())) break;
    if (options.deadline.expired()) {
      std::string arrived = lanes.empty() ? "no socket" : str(filled, " of ", lanes.size(), " sockets");
      return error(Code::kTimeout, "timed out waiting for the peer to connect (", arrived, " arrived at ",
                   address_, ")",
                   acceptFailure_.empty() || acceptFailureNs_ < waitStartNs
                       ? ""
                       : str("; this process failed to accept connections: ", acceptFailure_));
    }
    int64_t sliceMs = std::min<int64_t>(options.deadline.remainingMs() + 1, kPumpSliceMs);
    if (!pumpIfFree(lock, sliceMs)) arrived_.wait_for(lock, std::chrono::milliseconds(sliceMs));
  }
  lock.unlock();
  net::LivenessOptions liveness = net::LivenessOptions::fromParams();
  const int64_t sendBuffer = sendBufferFor(options);
  for (const net::Fd& fd : lanes) {
    SHOAL_TRY(prepareDataSocket(fd.get(), liveness, sendBuffer));
  }
  SHOAL_INFO(subsys::kInit | subsys::kNet, "tcp: accepted ", peer, " channel ", key.channel, " with ",
             lanes.size(), lanes.size() == 1 ? " socket" : " sockets", sendBufferNote(sendBuffer));
  return std::unique_ptr<Connection>(std::make_unique<tcp::TcpConnection>(std::move(lanes), chunkBytes, peer));
}

bool TcpTransport::pumpIfFree(std::unique_lock<std::mutex>& lock, int64_t timeoutMs) {
  if (pumping_) return false;
  pumping_ = true;
  lock.unlock();
  pump(timeoutMs);
  lock.lock();
  pumping_ = false;
  arrived_.notify_all();  // another waiter may take the pump over, or find what it brought
  return true;
}

void TcpTransport::tidy() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (listener_) (void)pumpIfFree(lock, 0);
}

void TcpTransport::claim(const SocketKey& want, std::string_view secret, std::vector<net::Fd>& lanes,
                         int& filled, uint32_t& chunkBytes) {
  auto it = waiting_.find(want);
  if (it == waiting_.end()) return;
  std::vector<Arrival> arrivals = std::move(it->second);
  waiting_.erase(it);
  waitingCount_ -= arrivals.size();
  for (Arrival& a : arrivals) {
    if (!tcp::verifyHello(a.hello, secret)) {
      rejects_.note(a.from, "hello does not prove the communicator's secret (another job?)");
      continue;
    }
    if (lanes.empty()) {
      lanes.resize(a.hello.sockets);
      chunkBytes = a.hello.chunkBytes;
    }
    if (a.hello.sockets != lanes.size() || a.hello.chunkBytes != chunkBytes) {
      rejects_.note(a.from, "hello disagrees with its connection's other sockets");
      continue;
    }
    net::Fd& slot = lanes[a.hello.socketIndex];
    if (slot) {
      rejects_.note(a.from, "duplicate socket in a connection");
      continue;
    }
    slot = std::move(a.fd);
    ++filled;
  }
}

void TcpTransport::pump(int64_t timeoutMs) {
  const int64_t untilNs = nowNs() + std::max<int64_t>(timeoutMs, 0) * 1000000;  // 0: this pass only
  std::vector<pollfd> fds;
  do {
    fds.clear();
    // At the cap of unfinished hellos, new sockets wait in the kernel backlog.
    bool acceptMore = static_cast<int>(pending_.size()) < kMaxPendingHellos && nowNs() >= acceptPausedUntilNs_;
    fds.push_back({listener_.get(), static_cast<short>(acceptMore ? POLLIN : 0), 0});
    for (const auto& p : pending_) fds.push_back({p.fd.get(), POLLIN, 0});
    int64_t now = nowNs();
    int64_t waitNs = untilNs - now;
    for (const auto& p : pending_) waitNs = std::min(waitNs, p.deadlineNs - now);
    if (!acceptMore && acceptPausedUntilNs_ > now) waitNs = std::min(waitNs, acceptPausedUntilNs_ - now);
    int waitMs = static_cast<int>(std::clamp<int64_t>((waitNs + 999999) / 1000000, 0, kPumpSliceMs));
    int rc = ::poll(fds.data(), fds.size(), waitMs);
    if (rc < 0 && errno != EINTR) {
      SHOAL_WARN("tcp transport: poll: ", std::strerror(errno));
      return;
    }
    bool newHello = false;
    if (rc > 0) {
      for (size_t i = 1; i < fds.size(); ++i)
        if (fds[i].revents != 0) readHello(pending_[i - 1]);
      if (fds[0].revents != 0) acceptNew();
    }
    // Publish finished hellos, drop failed and late ones.
    now = nowNs();
    std::vector<Arrival> finished;
    for (auto& p : pending_) {
      if (!p.fd) continue;
      if (p.have == tcp::kHelloBytes) {
        Result<Hello> hello = tcp::decodeHello(p.bytes);
        if (!hello.isOk()) rejects_.note(p.from, hello.status().message());
        else finished.push_back(Arrival{std::move(p.fd), p.from, hello.value(), now});
        p.fd.reset();
      } else if (now >= p.deadlineNs) {
        rejects_.note(p.from, "no hello within SHOAL_HANDSHAKE_TIMEOUT_MS");
        p.fd.reset();
      }
    }
    pending_.erase(std::remove_if(pending_.begin(), pending_.end(), [](const PendingHello& p) { return !p.fd; }),
                   pending_.end());
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& a : finished) {
      SocketKey key{a.hello.commId, a.hello.fromRank, a.hello.toRank, a.hello.channel};
      waiting_[key].push_back(std::move(a));
      ++waitingCount_;
      newHello = true;
    }
    expireWaiting(now);
    if (newHello) {
      arrived_.notify_all();
      return;  // let the caller look at what arrived
    }
  } while (nowNs() < untilNs);
}

void TcpTransport::acceptNew() {
  const int64_t handshakeMs = handshakeTimeoutMs();
  for (int i = 0; i < 64 && static_cast<int>(pending_.size()) < kMaxPendingHellos; ++i) {
    net::SocketAddress from;
    Result<net::Fd> accepted = net::acceptOne(listener_.get(), &from);
    if (!accepted.isOk()) {
      // Said once per pause: the next try may fail alike.
      const bool first = acceptPausedUntilNs_ == 0 || nowNs() - acceptPausedUntilNs_ > kAcceptPauseMs * 1000000;
      acceptPausedUntilNs_ = nowNs() + kAcceptPauseMs * 1000000;
      if (first) SHOAL_WARN("tcp transport: ", accepted.status().message(), " (accepts paused for ", kAcceptPauseMs, " ms)");
      std::lock_guard<std::mutex> lock(mutex_);
      acceptFailure_ = accepted.status().message();
      acceptFailureNs_ = nowNs();
      acceptFailing_ = true;
      return;
    }
    if (accepted.value() && acceptFailing_) {
      std::lock_guard<std::mutex> lock(mutex_);
      acceptFailure_.clear();
      acceptFailing_ = false;
    }
    if (!accepted.value()) return;
    PendingHello p;
    p.fd = std::move(accepted.value());
    p.from = from;
    p.deadlineNs = nowNs() + handshakeMs * 1000000;
    // A peer's probe (probePeerProcess) has mostly closed by now: dropped
    // here, it does not hold a descriptor until the next pass, which an idle
    // process makes only at its next idle check.
    readHello(p);
    if (p.fd) pending_.push_back(std::move(p));
  }
}

void TcpTransport::readHello(PendingHello& p) {
  if (!p.fd) return;
  net::IoResult io = net::readSome(p.fd.get(), p.bytes + p.have, tcp::kHelloBytes - p.have);
  if (!io.ok()) {
    p.fd.reset();  // closed or reset before its hello: a scanner, quietly dropped
    return;
  }
  p.have += io.bytes;
}

void TcpTransport::forgetRank(uint64_t commId, int rank) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if (it->first.commId == commId && it->first.toRank == rank) {
      waitingCount_ -= it->second.size();
      it = waiting_.erase(it);
    } else {
      ++it;
    }
  }
}

void TcpTransport::expireWaiting(int64_t now) {
  int64_t keepNs = std::max<int64_t>(params().initTimeoutMs, 60000) * 1000000;
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    auto& list = it->second;
    size_t before = list.size();
    list.erase(std::remove_if(list.begin(), list.end(),
                              [&](const Arrival& a) { return now - a.arrivedNs > keepNs; }),
               list.end());
    waitingCount_ -= before - list.size();
    it = list.empty() ? waiting_.erase(it) : std::next(it);
  }
  // Bound the table: drop the oldest arrivals beyond the cap.
  while (waitingCount_ > kMaxWaitingSockets) {
    auto oldest = waiting_.end();
    for (auto it = waiting_.begin(); it != waiting_.end(); ++it)
      if (oldest == waiting_.end() || it->second.front().arrivedNs < oldest->second.front().arrivedNs) oldest = it;
    rejects_.note(oldest->second.front().from, "nobody claimed the socket (table full)");
    oldest->second.erase(oldest->second.begin());
    --waitingCount_;
    if (oldest->second.empty()) waiting_.erase(oldest);
  }
}

}  // namespace

std::unique_ptr<Transport> makeTcpTransport() { return std::make_unique<TcpTransport>(); }

}  // namespace shoal
