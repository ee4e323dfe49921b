#include "transports/cuda_ipc/cuda_ipc_transport.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>
#include <vector>

#include "core/byte_order.h"
#include "core/log.h"
#include "core/params.h"
#include "core/process.h"
#include "cuda/driver.h"
#include "net/crypto.h"
#include "net/fd.h"
#include "net/unix_socket.h"
#include "transports/cuda_ipc/cuda_ipc_connection.h"

namespace shoal {
namespace cuda_ipc {
namespace {

constexpr uint32_t kHelloMagic = 0x43495348;  // "HSIC"
constexpr uint16_t kHelloVersion = 2;
constexpr size_t kSignedBytes = 48;  // everything before the proof
constexpr std::string_view kHelloLabel = "shoal cuda_ipc hello v2";
constexpr uint16_t kFlagStreamRing = 0x1;
constexpr uint32_t kSlots = 8;
constexpr uint64_t kMinSlotBytes = 8 << 10;
constexpr uint64_t kMaxSlotBytes = 128ull << 20;

}  // namespace

void encodeHello(const Hello& hello, uint8_t out[kHelloBytes]) {
  putLe(out, kHelloMagic, 4);
  putLe(out + 4, kHelloVersion, 2);
  putLe(out + 6, hello.channel, 2);
  putLe(out + 8, hello.commId, 8);
  putLe(out + 16, static_cast<uint32_t>(hello.fromRank), 4);
  putLe(out + 20, static_cast<uint32_t>(hello.toRank), 4);
  putLe(out + 24, hello.slots, 2);
  putLe(out + 26, hello.streamRing ? kFlagStreamRing : 0, 2);
  putLe(out + 28, hello.allocationBytes >> 16, 4);
  putLe(out + 32, hello.slotBytes, 8);
  std::memcpy(out + 40, hello.nonce, 8);
  std::memcpy(out + 48, hello.proof, 32);
}

Result<Hello> decodeHello(const uint8_t in[kHelloBytes]) {
  if (getLe(in, 4) != kHelloMagic) return invalidArgument("not a Shoal cuda_ipc hello");
  if (getLe(in + 4, 2) != kHelloVersion) return invalidArgument("unsupported cuda_ipc hello version ", getLe(in + 4, 2));
  Hello h;
  h.channel = static_cast<uint16_t>(getLe(in + 6, 2));
  h.commId = getLe(in + 8, 8);
  h.fromRank = static_cast<int32_t>(getLe(in + 16, 4));
  h.toRank = static_cast<int32_t>(getLe(in + 20, 4));
  h.slots = static_cast<uint32_t>(getLe(in + 24, 2));
  const uint64_t flags = getLe(in + 26, 2);
  if (flags & ~uint64_t{kFlagStreamRing}) return invalidArgument("cuda_ipc hello: unknown flags ", flags);
  h.streamRing = (flags & kFlagStreamRing) != 0;
  h.slotBytes = getLe(in + 32, 8);
  h.allocationBytes = getLe(in + 28, 4) << 16;
  std::memcpy(h.nonce, in + 40, 8);
  std::memcpy(h.proof, in + 48, 32);
  if (h.fromRank < 0 || h.toRank < 0 || h.fromRank == h.toRank)
    return invalidArgument("cuda_ipc hello: ranks ", h.fromRank, " -> ", h.toRank);
  if (h.slots < 1 || h.slots > kMaxSlots) return invalidArgument("cuda_ipc hello: ", h.slots, " slots");
  if (h.slotBytes < kMinSlotBytes || h.slotBytes > kMaxSlotBytes)
    return invalidArgument("cuda_ipc hello: slots of ", h.slotBytes, " bytes");
  if (h.allocationBytes < kFifoLanes * h.slots * h.slotBytes)
    return invalidArgument("cuda_ipc hello: an allocation of ", h.allocationBytes, " bytes cannot hold ", kFifoLanes,
                           " lanes of ", h.slots, " slots of ", h.slotBytes, " bytes");
  return h;
}

Status signHello(Hello& hello, std::string_view secret) {
  return net::signHello<kHelloBytes>(hello, secret, kHelloLabel, kSignedBytes, encodeHello);
}

bool verifyHello(const Hello& hello, std::string_view secret) {
  return net::verifyHello<kHelloBytes>(hello, secret, kHelloLabel, kSignedBytes, encodeHello);
}

}  // namespace cuda_ipc

namespace {

using cuda_ipc::Hello;

// A hello that arrived, with the descriptors that came with it.
struct Arrival {
  Hello hello;
  net::Fd socket, fifo, control;
  Deadline expires = Deadline::never();  // unclaimed hellos do not pin the peer's memory for ever
};

// Bounds on what unauthenticated local processes can make the listener hold.
constexpr size_t kMaxAccepted = 64;
constexpr size_t kMaxArrived = 1024;

// An accepted socket whose hello has not arrived yet.
struct Accepted {
  net::Fd socket;
  Deadline deadline;
};

using ArrivalKey = std::tuple<uint64_t, int, int, uint16_t>;  // commId, from, to, channel

std::string describePeer(const ConnectionKey& key, const ConnectOptions& options) {
  std::string host = options.peer && !options.peer->hostname.empty() ? options.peer->hostname : "?";
  return str("rank ", key.peerRank, " (host ", host, ", cuda_ipc ", options.peer ? options.peer->gpu : "?", ")");
}

// Reads one hello and its two descriptors without blocking: kAgain when the
// bytes are not there yet.
Result<Arrival> receiveHello(net::Fd& socket) {
  uint8_t bytes[cuda_ipc::kHelloBytes];
  Result<std::vector<net::Fd>> fds = net::receiveWithDescriptors(socket.get(), bytes, sizeof bytes, 2);
  if (!fds.isOk() && fds.status().code() == Code::kAgain) return fds.takeStatus();
  SHOAL_TRY(fds.status()) << "cuda_ipc: reading a hello";
  SHOAL_ASSIGN_OR_RETURN(Hello hello, cuda_ipc::decodeHello(bytes));
  std::vector<net::Fd> both = std::move(fds).value();
  return Arrival{hello, std::move(socket), std::move(both[0]), std::move(both[1])};
}

Status sendHello(int socket, const Hello& hello, int fifoFd, int controlFd) {
  uint8_t bytes[cuda_ipc::kHelloBytes];
  cuda_ipc::encodeHello(hello, bytes);
  const int fds[2] = {fifoFd, controlFd};
  SHOAL_TRY(net::sendWithDescriptors(socket, bytes, sizeof bytes, fds)) << "cuda_ipc: sending the hello";
  return Status::ok();
}

// The peer's listener, connected; retried while it refuses (backlog full).
Result<net::Fd> connectTo(const std::string& name, Deadline deadline, const std::string& peer) {
  SHOAL_ASSIGN_OR_RETURN(net::Fd fd, net::connectAbstract(name, deadline), "cuda_ipc: reaching ", peer);
  return fd;
}

// A shared control block in a memfd, mapped here. Its creator sizes it and
// seals the size, so neither side can make the other's mapping fault.
Result<cuda_ipc::Control*> mapControl(int fd, bool create) {
  size_t bytes = cuda_ipc::controlBytes();
  if (create) {
    if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0)
      return systemError("cuda_ipc: ftruncate: ", std::strerror(errno));
    if (::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
      return systemError("cuda_ipc: sealing the control block: ", std::strerror(errno));
  } else {
    struct stat st {};
    if (::fstat(fd, &st) != 0 || st.st_size < static_cast<off_t>(bytes))
      return remoteError("cuda_ipc: the peer's control block is smaller than ", bytes, " bytes");
    int seals = ::fcntl(fd, F_GET_SEALS);
    if (seals < 0 || !(seals & F_SEAL_SHRINK))
      return remoteError("cuda_ipc: the peer's control block is not sealed against shrinking");
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return systemError("cuda_ipc: mmap of the control block: ", std::strerror(errno));
  return static_cast<cuda_ipc::Control*>(p);
}

class CudaIpcTransport final : public Transport {
 public:
  std::string_view name() const override { return "cuda_ipc"; }
  LinkClass linkClass() const override { return LinkClass::kShm; }
  bool movesDeviceMemory() const override { return true; }
  // Chosen first on device-direct communicators (by movesDeviceMemory,
  // transports/registry.h), where device buffers go straight to it; on others
  // staging hands connections pinned host memory, which shm moves better.
  bool chosenByDefault(const PeerInfo& /*self*/) const override { return false; }
  bool wantedInThisProcess() const override { return cuda::Driver::inUse() != nullptr; }
  bool connectWaitsForPeer(const ConnectionKey& key) const override { return key.selfRank > key.peerRank; }

  Result<std::string> localAddress() override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!address_.empty()) return address_;
    if (cuda::Driver::inUse() == nullptr) return error(Code::kUnsupported, "this process does not use CUDA");
    // Its copies, even of staged messages, run on streams of its own: with
    // so few hardware queues they would sit behind a user's stream that
    // waits for them. Unpublished, no peer picks it and forcing it is refused.
    if (cuda::Driver::fewHardwareQueues())
      return error(Code::kUnsupported, "CUDA_DEVICE_MAX_CONNECTIONS=", std::getenv("CUDA_DEVICE_MAX_CONNECTIONS"),
                   " leaves too few hardware queues for its copies, which run on streams of their own (it needs at least 4)");
    std::string name;
    SHOAL_ASSIGN_OR_RETURN(net::Fd fd, net::listenAbstract("shoal-cuda-ipc", name), "cuda_ipc");
    listener_ = std::move(fd);
    address_ = name;
    return address_;
  }

  bool canConnect(const PeerInfo& self, const PeerInfo& peer) const override {
    if (params().p2pDisable) return false;
    if (self.gpu.empty() || peer.gpu.empty() || !self.address("cuda_ipc") || !peer.address("cuda_ipc")) return false;
    if (self.hostId != peer.hostId || !self.sameKernel(peer) || self.processId == peer.processId) return false;
    cuda::Driver* driver = cuda::Driver::inUse();
    return driver != nullptr && driver->gpusShareMemory(self.gpu, peer.gpu);
  }

  Result<std::unique_ptr<Connection>> connect(const ConnectionKey& key, const ConnectOptions& options) override {
    if (!options.self || !options.peer) return invalidUsage("cuda_ipc connect without peer information");
    cuda::Driver* driver = cuda::Driver::inUse();
    if (driver == nullptr) return error(Code::kUnsupported, "cuda_ipc: this process does not use CUDA");
    std::string peer = describePeer(key, options);
    cuda_ipc::ConnectionSetup setup;
    setup.side = key.selfRank < key.peerRank ? 0 : 1;
    setup.peerDescription = peer;
    SHOAL_ASSIGN_OR_RETURN(setup.context, driver->primaryContext(options.self->gpu), "cuda_ipc connection to ", peer);
    cuda::ContextScope scope(*driver, setup.context);
    SHOAL_TRY(scope.status()) << "cuda_ipc connection to " << peer;
    return setup.side == 0 ? offer(key, options, *driver, std::move(setup)) : accept(key, options, *driver, std::move(setup));
  }

 private:
  // The lower rank: allocates the FIFO and the control block, sends both.
  Result<std::unique_ptr<Connection>> offer(const ConnectionKey& key, const ConnectOptions& options,
                                            cuda::Driver& driver, cuda_ipc::ConnectionSetup setup) {
    const std::string* address = options.peer->address("cuda_ipc");
    if (!address) return invalidUsage(setup.peerDescription, " published no cuda_ipc address");
    int64_t fifoBytes = std::clamp<int64_t>(params().cudaIpcFifoBytes, 64 << 10, 1ll << 30);
    setup.slots = cuda_ipc::kSlots;
    setup.slotBytes = (static_cast<uint64_t>(fifoBytes) / cuda_ipc::kSlots + 4095) / 4096 * 4096;
    SHOAL_ASSIGN_OR_RETURN(setup.fifo, driver.deviceAlloc(cuda_ipc::kFifoLanes * setup.slots * setup.slotBytes),
                           "cuda_ipc: allocating the FIFO for ", setup.peerDescription);
    // From here the setup owns the FIFO: CudaIpcConnection (or its failure) frees it.
    net::Fd controlFd(::memfd_create("shoal-cuda-ipc", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    if (!controlFd) {
      (void)driver.deviceFree(setup.fifo);
      return systemError("cuda_ipc: memfd_create: ", std::strerror(errno));
    }
    Result<cuda_ipc::Control*> control = mapControl(controlFd.get(), true);
    if (!control.isOk()) {
      (void)driver.deviceFree(setup.fifo);
      return control.status();
    }
    setup.control = new (control.value()) cuda_ipc::Control();
    setup.control->magic = cuda_ipc::kControlMagic;
    setup.control->slots = setup.slots;
    setup.control->slotBytes = setup.slotBytes;
    // The stream ring where this GPU's streams run memory operations and
    // the communicator's ranks agreed on stream links; the peer refuses the
    // connection if it would not run it.
    setup.streamRing = options.streamLinks && driver.streamPlansWanted(options.self->gpu);
    if (setup.streamRing) {
      if (Status st = driver.registerHost(setup.control, cuda_ipc::controlBytes()); !st.isOk()) {
        // Not a quiet downgrade: every connection of a rank has the ring or none.
        ::munmap(setup.control, cuda_ipc::controlBytes());
        (void)driver.deviceFree(setup.fifo);
        return StatusBuilder(std::move(st)) << "cuda_ipc: registering the stream ring's control block for "
                                            << setup.peerDescription;
      }
    }
    setup.control->streamRing = setup.streamRing ? 1 : 0;
    const bool streamRing = setup.streamRing;
    void* fifo = setup.fifo;
    uint32_t slots = setup.slots;
    uint64_t slotBytes = setup.slotBytes;
    std::string peer = setup.peerDescription;
    // The connection owns memory, stream and events from here, whatever follows.
    SHOAL_ASSIGN_OR_RETURN(auto connection, cuda_ipc::CudaIpcConnection::make(std::move(setup)),
                           "cuda_ipc connection to ", peer);
    SHOAL_ASSIGN_OR_RETURN(cuda::Driver::Exported exported, driver.exportDeviceMemory(fifo),
                           "cuda_ipc: exporting the FIFO for ", peer);
    net::Fd fifoFd(exported.fd);
    SHOAL_ASSIGN_OR_RETURN(net::Fd socket, connectTo(*address, options.deadline, peer));
    Hello hello;
    hello.commId = key.commId;
    hello.fromRank = key.selfRank;
    hello.toRank = key.peerRank;
    hello.channel = key.channel;
    hello.slots = slots;
    hello.slotBytes = slotBytes;
    hello.allocationBytes = exported.bytes;
    hello.streamRing = streamRing;
    if (exported.bytes % (64 << 10) != 0 || (exported.bytes >> 16) > UINT32_MAX)
      return internalError("cuda_ipc: a FIFO allocation of ", exported.bytes, " bytes has no hello encoding");
    SHOAL_TRY(cuda_ipc::signHello(hello, options.secret)) << "cuda_ipc hello";
    SHOAL_TRY(sendHello(socket.get(), hello, fifoFd.get(), controlFd.get())) << "cuda_ipc connection to " << peer;
    connection->adoptSocket(std::move(socket));
    return std::unique_ptr<Connection>(std::move(connection));
  }

  // The higher rank: waits for the lower rank's hello and maps what it sent.
  Result<std::unique_ptr<Connection>> accept(const ConnectionKey& key, const ConnectOptions& options,
                                             cuda::Driver& driver, cuda_ipc::ConnectionSetup setup) {
    SHOAL_ASSIGN_OR_RETURN(Arrival arrival, awaitHello(key, options), "cuda_ipc connection to ",
                           setup.peerDescription);
    setup.slots = arrival.hello.slots;
    setup.slotBytes = arrival.hello.slotBytes;
    SHOAL_ASSIGN_OR_RETURN(setup.control, mapControl(arrival.control.get(), false), "cuda_ipc connection to ",
                           setup.peerDescription);
    if (setup.control->magic != cuda_ipc::kControlMagic || setup.control->slots != setup.slots ||
        setup.control->slotBytes != setup.slotBytes ||
        setup.control->streamRing != (arrival.hello.streamRing ? 1u : 0u)) {
      ::munmap(setup.control, cuda_ipc::controlBytes());
      return remoteError(setup.peerDescription, " sent a cuda_ipc control block that does not match its hello");
    }
    // Both sides run the stream ring or neither, and so do all of a rank's
    // connections: its messages are matched only with the peer's stream
    // messages, and a plan runs on the streams only if every lane can.
    setup.streamRing = arrival.hello.streamRing;
    const bool mine = options.streamLinks && driver.streamPlansWanted(options.self->gpu);
    if (mine != setup.streamRing) {
      ::munmap(setup.control, cuda_ipc::controlBytes());
      return invalidUsage("cuda_ipc connection to ", setup.peerDescription, ": ",
                          mine ? "this rank" : "the peer", " runs stream plans and ", mine ? "the peer" : "this rank",
                          " does not (SHOAL_CUDA_STREAM_PLANS, SHOAL_CUDA_WAIT, CUDA_DEVICE_MAX_CONNECTIONS or the "
                          "device): give every rank the same settings");
    }
    if (setup.streamRing) {
      if (Status st = driver.registerHost(setup.control, cuda_ipc::controlBytes()); !st.isOk()) {
        ::munmap(setup.control, cuda_ipc::controlBytes());
        return StatusBuilder(std::move(st)) << "cuda_ipc: registering the stream ring's control block of "
                                            << setup.peerDescription;
      }
    }
    Result<void*> fifo = driver.importDeviceMemory(arrival.fifo.get(), arrival.hello.allocationBytes);
    if (!fifo.isOk()) {
      if (setup.streamRing) driver.unregisterHost(setup.control);
      ::munmap(setup.control, cuda_ipc::controlBytes());
      return StatusBuilder(fifo.takeStatus()) << "cuda_ipc: mapping the FIFO of " << setup.peerDescription;
    }
    setup.fifo = fifo.value();
    setup.fifoIsImported = true;
    setup.socket = std::move(arrival.socket);
    std::string peer = setup.peerDescription;
    SHOAL_ASSIGN_OR_RETURN(auto connection, cuda_ipc::CudaIpcConnection::make(std::move(setup)),
                           "cuda_ipc connection to ", peer);
    return std::unique_ptr<Connection>(std::move(connection));
  }

  // Hellos a rank now gone never claimed: their FIFO descriptors, control
  // memory and sockets go now (the sender sees its socket close), not when
  // they expire at a later accept.
  void closeInForkedChild() override { listener_.reset(); }

  void forgetRank(uint64_t commId, int rank) override {
    std::lock_guard<std::mutex> lock(mutex_);
    drainListenerLocked();
    std::erase_if(arrived_, [&](const auto& entry) {
      return std::get<0>(entry.first) == commId && std::get<2>(entry.first) == rank;
    });
  }

  // Accepts on the listener until the hello for `key` has arrived (hellos
  // for other connections are kept for their connect()).
  Result<Arrival> awaitHello(const ConnectionKey& key, const ConnectOptions& options) {
    const ArrivalKey want{key.commId, key.peerRank, key.selfRank, key.channel};
    std::string refused;  // why a hello for this key was dropped
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        drainListenerLocked();
        // Hellos are verified when claimed (only the connect knows the
        // secret): a forged one for this key is dropped and the real one
        // still awaited.
        auto [first, last] = arrived_.equal_range(want);
        for (auto it = first; it != last;) {
          if (cuda_ipc::verifyHello(it->second.hello, options.secret)) {
            Arrival arrival = std::move(it->second);
            arrived_.erase(it);
            return arrival;
          }
          refused = "a hello that did not carry this communicator's secret was refused";
          it = arrived_.erase(it);
        }
      }
      if (options.deadline.expired()) {
        if (!refused.empty()) return invalidUsage("rank ", key.peerRank, " over cuda_ipc: ", refused);
        return error(Code::kTimeout, "rank ", key.peerRank, " sent no cuda_ipc hello before the set-up deadline");
      }
      pollfd pfd{listener_.get(), POLLIN, 0};
      (void)::poll(&pfd, 1, 5);
    }
  }

  // Accepts what is waiting (processes of this user only) and reads the
  // hellos that have arrived; drops expired ones. Caller holds mutex_.
  void drainListenerLocked() {
    for (;;) {
      net::Fd fd = net::acceptSameUser(listener_.get());
      if (!fd) break;
      if (accepted_.size() >= kMaxAccepted) continue;  // closed: the sender retries or times out
      accepted_.push_back(Accepted{std::move(fd), Deadline::afterMs(handshakeTimeoutMs())});
    }
    for (auto it = accepted_.begin(); it != accepted_.end();) {
      Result<Arrival> arrival = receiveHello(it->socket);
      if (!arrival.isOk() && arrival.status().code() == Code::kAgain && !it->deadline.expired()) {
        ++it;
        continue;
      }
      if (arrival.isOk()) {
        Arrival a = std::move(arrival).value();
        a.expires = Deadline::afterMs(params().initTimeoutMs);
        const Hello& h = a.hello;
        if (arrived_.size() < kMaxArrived)
          arrived_.emplace(ArrivalKey{h.commId, h.fromRank, h.toRank, h.channel}, std::move(a));
      } else {
        SHOAL_INFO(subsys::kNet, "cuda_ipc: dropped an incoming connection: ", arrival.status().message());
      }
      it = accepted_.erase(it);
    }
    std::erase_if(arrived_, [](const auto& entry) { return entry.second.expires.expired(); });
  }

  std::mutex mutex_;
  std::string address_;
  net::Fd listener_;
  std::vector<Accepted> accepted_;
  std::multimap<ArrivalKey, Arrival> arrived_;
};

}  // namespace

std::unique_ptr<Transport> makeCudaIpcTransport() { return std::make_unique<CudaIpcTransport>(); }

}  // namespace shoal
