// tcp transport: the conformance suite through the real connect path, plus
// what only tcp has (hellos, several sockets, strays, connect deadlines).
// Traffic stays on 127.0.0.1 (NCCL_SOCKET_IFNAME=lo).
#include <catch2/catch.hpp>
#include <dirent.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <future>
#include <optional>
#include <set>
#include <thread>

#include "bootstrap/bootstrap.h"
#include "core/params.h"
#include "core/tag.h"
#include "net/crypto.h"
#include "net/socket.h"
#include "support/scoped_env.h"
#include "transport/conformance.h"
#include "transports/tcp/tcp_connection.h"
#include "transports/registry.h"
#include "transports/tcp/tcp_transport.h"

namespace shoal {
namespace {

using testing::TransportUnderTest;
using ConnPair = std::pair<std::unique_ptr<Connection>, std::unique_ptr<Connection>>;

using testing::ScopedEnv;

void useLoopbackInterface() {
  setenv("NCCL_SOCKET_IFNAME", "lo", 1);
  reloadParams();
}

// Two "processes" (one transport each) that persist across tests.
struct TcpWorld {
  TcpWorld() { useLoopbackInterface(); }
  std::unique_ptr<Transport> rank0 = makeTcpTransport();
  std::unique_ptr<Transport> rank1 = makeTcpTransport();
};
TcpWorld& world() {
  static TcpWorld w;
  return w;
}

std::atomic<uint64_t> gNextCommId{1};

// Two hosts unless `sameKernel` (then two network namespaces of one machine,
// as tests/netns emulates: distinct host ids, one kernel id).
PeerInfo peerInfo(Transport& transport, int rank, bool sameKernel = false) {
  PeerInfo info;
  info.rank = rank;
  info.hostname = rank == 0 ? "host-a" : "host-b";
  info.hostId = info.hostname;
  info.kernelId = sameKernel ? "one-kernel" : "kernel of " + info.hostname;
  Result<std::string> address = transport.localAddress();
  if (address.isOk()) info.addresses.emplace_back("tcp", address.value());
  return info;
}

// One rank's side of the set-up: publish the PeerInfo through a memory store,
// read the peer's, connect.
Result<std::unique_ptr<Connection>> connectSide(Transport& transport, std::shared_ptr<Store> store, uint64_t commId,
                                                int rank, int channel, const std::string& secret,
                                                int64_t deadlineMs = 20000, bool sameKernel = false) {
  PeerInfo self = peerInfo(transport, rank, sameKernel);
  Bootstrap bootstrap(store, str("comm", commId, "/ch", channel), rank, 2);
  Deadline deadline = Deadline::afterMs(deadlineMs);
  SHOAL_ASSIGN_OR_RETURN(std::vector<std::string> all, bootstrap.allGather(self.serialize(), deadline));
  SHOAL_ASSIGN_OR_RETURN(PeerInfo peer, PeerInfo::deserialize(all[static_cast<size_t>(1 - rank)]));
  ConnectOptions options;
  options.self = &self;
  options.peer = &peer;
  options.secret = secret;
  options.deadline = deadline;
  return transport.connect(ConnectionKey{commId, rank, 1 - rank, static_cast<uint16_t>(channel)}, options);
}

ConnPair makeTcpPair(int channel, uint64_t commId = 0, Transport* t0 = nullptr, Transport* t1 = nullptr,
                     bool sameKernel = false) {
  if (commId == 0) commId = gNextCommId++;
  if (!t0) t0 = world().rank0.get();
  if (!t1) t1 = world().rank1.get();
  auto store = makeMemoryStore();
  std::string secret = str("secret of comm ", commId);
  auto acceptor = std::async(std::launch::async,
                             [&] { return connectSide(*t1, store, commId, 1, channel, secret, 20000, sameKernel); });
  Result<std::unique_ptr<Connection>> c0 = connectSide(*t0, store, commId, 0, channel, secret, 20000, sameKernel);
  Result<std::unique_ptr<Connection>> c1 = acceptor.get();
  INFO("rank 0: " << c0.status().toString() << " / rank 1: " << c1.status().toString());
  REQUIRE(c0.isOk());
  REQUIRE(c1.isOk());
  return {std::move(c0.value()), std::move(c1.value())};
}

int lanesOf(const Connection& c) { return dynamic_cast<const tcp::TcpConnection&>(c).laneCount(); }

// Pumps both ends until neither has pending work; returns the first error.
Status pumpBoth(Connection& a, Connection& b, int64_t ms = 30000) {
  Deadline deadline = Deadline::afterMs(ms);
  std::vector<Completion> done;
  Backoff backoff;
  while (a.pending() + b.pending() > 0) {
    if (deadline.expired()) return error(Code::kTimeout, "pumpBoth");
    bool progressed = false;
    SHOAL_TRY(a.poll(done, progressed));
    SHOAL_TRY(b.poll(done, progressed));
    if (progressed) backoff.reset();
    else backoff.pause();
  }
  return Status::ok();
}

// Sends `bytes` a -> b and checks the data.
void exchange(Connection& a, Connection& b, uint64_t bytes, uint64_t seq = 1) {
  std::vector<uint8_t> out(bytes), in(bytes, 0);
  for (uint64_t i = 0; i < bytes; ++i) out[i] = static_cast<uint8_t>(i * 7 + seq);
  uint64_t tag = encodeTag(CollKind::kSend, DataType::kUint8, bytes, 0, -1, seq);
  REQUIRE(a.postSend(out.data(), bytes, tag, 1).isOk());
  REQUIRE(b.postRecv(in.data(), bytes, tag, 2).isOk());
  Status s = pumpBoth(a, b);
  INFO(s.toString());
  REQUIRE(s.isOk());
  REQUIRE(out == in);
}

// A raw TCP client of a listener ("host:port"), for stray-connection tests.
net::Fd rawConnect(const std::string& address) {
  Result<net::SocketAddress> parsed = net::SocketAddress::parse(address);
  REQUIRE(parsed.isOk());
  Result<net::Fd> fd = net::connectWithRetry(parsed.value(), Deadline::afterMs(5000));
  REQUIRE(fd.isOk());
  return std::move(fd.value());
}

}  // namespace

// --- the conformance suite

TEST_CASE("tcp conformance / default sockets", "[tcp][conformance]") {
  world();
  testing::runConformanceSuite(TransportUnderTest{"tcp", [](int channel) { return makeTcpPair(channel); }});
}

TEST_CASE("tcp conformance / one socket", "[tcp][conformance]") {
  world();
  ScopedEnv env{{"NCCL_SOCKET_NTHREADS", "1"}, {"NCCL_NSOCKS_PERTHREAD", "1"}};
  testing::runConformanceSuite(TransportUnderTest{"tcp/1 socket", [](int channel) {
                                                    auto pair = makeTcpPair(channel);
                                                    REQUIRE(lanesOf(*pair.first) == 1);
                                                    return pair;
                                                  }});
}

TEST_CASE("tcp conformance / four sockets and small chunks", "[tcp][conformance]") {
  world();
  ScopedEnv env{{"NCCL_SOCKET_NTHREADS", "2"}, {"NCCL_NSOCKS_PERTHREAD", "2"}, {"SHOAL_SOCKET_CHUNK_BYTES", "16384"}};
  testing::runConformanceSuite(TransportUnderTest{"tcp/4 sockets", [](int channel) {
                                                    auto pair = makeTcpPair(channel);
                                                    REQUIRE(lanesOf(*pair.second) == 4);
                                                    return pair;
                                                  },
                                                  16ull << 20});
}

// --- pure pieces

TEST_CASE("tcp striping plan covers every byte once", "[tcp]") {
  for (uint64_t bytes : {0ull, 1ull, 4096ull, 131072ull, 131073ull, 262144ull, 524288ull, 524289ull, 655360ull,
                         1000000ull, 64ull << 20, (64ull << 20) + 3}) {
    for (int lanes : {1, 2, 3, 8, 64}) {
      for (uint64_t chunk : {4096ull, 131072ull, 524288ull}) {
        int slices = tcp::sliceCount(bytes, lanes, chunk);
        REQUIRE(slices >= 1);
        REQUIRE(slices <= lanes);
        uint64_t at = 0;
        std::set<int> used;
        for (int j = 0; j < slices; ++j) {
          tcp::SlicePlan plan = tcp::planSlice(7, bytes, lanes, chunk, j);
          REQUIRE(plan.offset == at);
          REQUIRE((plan.length > 0 || bytes == 0));
          at += plan.length;
          REQUIRE(used.insert(plan.lane).second);  // one slice per lane
        }
        REQUIRE(at == bytes);
        if (bytes > chunk && lanes > 1) REQUIRE(slices > 1);
      }
    }
  }
  // With the default unit (512 KiB) a 256 KiB message is one slice, not two
  // of 128 KiB (decision 0008, amendment 2).
  REQUIRE(tcp::sliceCount(262144, 2, static_cast<uint64_t>(params().socketChunkBytes)) == 1);
  // Small messages rotate over the lanes.
  REQUIRE(tcp::planSlice(0, 10, 4, 4096, 0).lane == 0);
  REQUIRE(tcp::planSlice(5, 10, 4, 4096, 0).lane == 1);
}

TEST_CASE("tcp hello round trip and proof", "[tcp]") {
  tcp::Hello hello;
  hello.commId = 0x1234567890abcdefull;
  hello.fromRank = 3;
  hello.toRank = 9;
  hello.channel = 2;
  hello.socketIndex = 1;
  hello.sockets = 4;
  hello.chunkBytes = 131072;
  REQUIRE(tcp::signHello(hello, "s3cret").isOk());
  uint8_t bytes[tcp::kHelloBytes];
  tcp::encodeHello(hello, bytes);
  Result<tcp::Hello> back = tcp::decodeHello(bytes);
  REQUIRE(back.isOk());
  REQUIRE(back->commId == hello.commId);
  REQUIRE(back->fromRank == 3);
  REQUIRE(back->toRank == 9);
  REQUIRE(back->socketIndex == 1);
  REQUIRE(tcp::verifyHello(back.value(), "s3cret"));
  REQUIRE_FALSE(tcp::verifyHello(back.value(), "other"));
  back->channel = 3;  // a field changed in flight
  REQUIRE_FALSE(tcp::verifyHello(back.value(), "s3cret"));
  // The secret itself never appears in the hello.
  REQUIRE(std::search(bytes, bytes + sizeof(bytes), "s3cret", "s3cret" + 6) == bytes + sizeof(bytes));
  bytes[0] ^= 1;
  REQUIRE_FALSE(tcp::decodeHello(bytes).isOk());
  bytes[0] ^= 1;
  bytes[26] = 9;  // socket index beyond the count
  REQUIRE_FALSE(tcp::decodeHello(bytes).isOk());
}

// --- tcp-specific behaviours

TEST_CASE("tcp transport basics", "[tcp]") {
  world();
  Transport& t = *world().rank0;
  REQUIRE(t.name() == "tcp");
  Result<std::string> a1 = t.localAddress();
  Result<std::string> a2 = t.localAddress();
  REQUIRE(a1.isOk());
  REQUIRE(a1.value() == a2.value());
  REQUIRE_THAT(a1.value(), Catch::StartsWith("127.0.0.1:"));
  PeerInfo with = peerInfo(t, 1), without;
  REQUIRE(t.canConnect(without, with));
  REQUIRE_FALSE(t.canConnect(with, without));
  ConnectOptions options;
  options.self = &with;
  options.peer = &with;
  REQUIRE(t.connect(ConnectionKey{1, 2, 2, 0}, options).status().code() == Code::kUnsupported);
}

TEST_CASE("tcp uses NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD sockets", "[tcp]") {
  world();
  auto [threads, perThread, expected] =
      GENERATE(std::make_tuple("1", "1", 1), std::make_tuple("2", "4", 8), std::make_tuple("16", "16", 64));
  ScopedEnv env{{"NCCL_SOCKET_NTHREADS", threads}, {"NCCL_NSOCKS_PERTHREAD", perThread}};
  ConnPair pair = makeTcpPair(0);
  REQUIRE(lanesOf(*pair.first) == expected);
  REQUIRE(lanesOf(*pair.second) == expected);
  exchange(*pair.first, *pair.second, 24ull << 20, 1);
  exchange(*pair.second, *pair.first, 100, 2);
}

TEST_CASE("tcp data sockets towards a peer on this kernel get the send buffer (decision 0012)", "[tcp]") {
  world();
  const std::string listener = world().rank1->localAddress().value();
  // SO_SNDBUF of the connection's sockets at both ends: rank 0 dialled
  // rank 1's listener, rank 1 accepted on it.
  struct Socket {
    bool dialled;  // rank 0's end; else rank 1's accepted end
    int sendBuffer;
  };
  auto sockets = [&] {
    std::vector<Socket> found;
    for (int fd = 0; fd < 4096; ++fd) {
      Result<net::SocketAddress> mine = net::localAddressOf(fd);
      Result<net::SocketAddress> theirs = net::peerAddressOf(fd);
      if (!mine.isOk() || !theirs.isOk() || theirs->empty()) continue;
      if (mine->toString() != listener && theirs->toString() != listener) continue;
      int size = -1;
      socklen_t length = sizeof(size);
      REQUIRE(getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, &length) == 0);
      found.push_back({theirs->toString() == listener, size});
    }
    return found;
  };
  const int set = static_cast<int>(2 * params().socketSameKernelSendBuffer);  // the kernel doubles it
  REQUIRE(set > 0);
  {
    ConnPair pair = makeTcpPair(0, 0, nullptr, nullptr, /*sameKernel=*/true);
    std::vector<Socket> found = sockets();
    REQUIRE(found.size() == 2u * lanesOf(*pair.first));
    for (const Socket& socket : found) CHECK(socket.sendBuffer == set);
    exchange(*pair.first, *pair.second, 3u << 20, 1);
    exchange(*pair.second, *pair.first, 3u << 20, 2);
  }
  {
    // Peers on other hosts keep autotuning (a long link needs its window).
    ConnPair pair = makeTcpPair(0);
    std::vector<Socket> found = sockets();
    REQUIRE(found.size() == 2u * lanesOf(*pair.first));
    for (const Socket& socket : found) CHECK(socket.sendBuffer != set);
  }
  {
    // SHOAL_SOCKET_BUFFER_BYTES sizes the sockets itself and wins (the
    // accepted ends inherit the listener's size, made before this setting).
    ScopedEnv env{{"SHOAL_SOCKET_BUFFER_BYTES", "65536"}};
    ConnPair pair = makeTcpPair(0, 0, nullptr, nullptr, /*sameKernel=*/true);
    std::vector<Socket> found = sockets();
    REQUIRE(found.size() == 2u * lanesOf(*pair.first));
    for (const Socket& socket : found) {
      CHECK(socket.sendBuffer != set);
      if (socket.dialled) CHECK(socket.sendBuffer == 2 * 65536);
    }
  }
}

TEST_CASE("tcp set-up of many connections at once / in any order", "[tcp]") {
  world();
  constexpr int kComms = 3, kChannels = 2;
  uint64_t base = gNextCommId.fetch_add(kComms);
  std::vector<std::shared_ptr<Store>> stores;
  for (int i = 0; i < kComms * kChannels; ++i) stores.push_back(makeMemoryStore());
  std::vector<std::future<Result<std::unique_ptr<Connection>>>> side0, side1;
  for (int c = 0; c < kComms; ++c)
    for (int ch = 0; ch < kChannels; ++ch) {
      auto store = stores[static_cast<size_t>(c * kChannels + ch)];
      uint64_t commId = base + static_cast<uint64_t>(c);
      side0.push_back(std::async(std::launch::async, [=] {
        return connectSide(*world().rank0, store, commId, 0, ch, "s");
      }));
      side1.push_back(std::async(std::launch::async, [=] {
        return connectSide(*world().rank1, store, commId, 1, ch, "s");
      }));
    }
  for (size_t i = 0; i < side0.size(); ++i) {
    auto c0 = side0[i].get();
    auto c1 = side1[i].get();
    INFO(c0.status().toString() << " / " << c1.status().toString());
    REQUIRE(c0.isOk());
    REQUIRE(c1.isOk());
    exchange(*c0.value(), *c1.value(), 1000 + i, i);
  }

  // Each side sets up four channels in a row, in opposite orders: connectors
  // never wait for their acceptor, so the order cannot deadlock.
  uint64_t commId = gNextCommId++;
  auto store = makeMemoryStore();
  auto inOrder = [&](int rank, std::vector<int> channels) -> Result<std::vector<std::unique_ptr<Connection>>> {
    Transport& transport = rank == 0 ? *world().rank0 : *world().rank1;
    PeerInfo self = peerInfo(transport, rank);
    Bootstrap bootstrap(store, str("ordered", commId), rank, 2);
    Deadline deadline = Deadline::afterMs(20000);
    SHOAL_ASSIGN_OR_RETURN(std::vector<std::string> all, bootstrap.allGather(self.serialize(), deadline));
    SHOAL_ASSIGN_OR_RETURN(PeerInfo peer, PeerInfo::deserialize(all[static_cast<size_t>(1 - rank)]));
    ConnectOptions options{&self, &peer, "s", deadline};
    std::vector<std::unique_ptr<Connection>> out(4);
    for (int ch : channels) {
      SHOAL_ASSIGN_OR_RETURN(out[static_cast<size_t>(ch)],
                             transport.connect(ConnectionKey{commId, rank, 1 - rank, static_cast<uint16_t>(ch)}, options));
    }
    return out;
  };
  auto acceptor = std::async(std::launch::async, [&] { return inOrder(1, {3, 2, 1, 0}); });
  auto connected = inOrder(0, {0, 1, 2, 3});
  auto accepted = acceptor.get();
  INFO(connected.status().toString() << " / " << accepted.status().toString());
  REQUIRE(connected.isOk());
  REQUIRE(accepted.isOk());
  for (size_t ch = 0; ch < 4; ++ch) exchange(*connected.value()[ch], *accepted.value()[ch], 5000 + ch, ch);
}

TEST_CASE("tcp ignores stray / forged / garbage and silent connections", "[tcp]") {
  world();
  ScopedEnv env{{"SHOAL_HANDSHAKE_TIMEOUT_MS", "300"}};
  Transport& acceptorSide = *world().rank1;
  std::string listener = acceptorSide.localAddress().value();
  uint64_t commId = gNextCommId++;

  std::vector<net::Fd> strays;
  // A forged hello for exactly the connection about to be made, wrong secret.
  for (uint16_t index = 0; index < 2; ++index) {
    tcp::Hello forged;
    forged.commId = commId;
    forged.fromRank = 0;
    forged.toRank = 1;
    forged.channel = 0;
    forged.socketIndex = index;
    forged.sockets = static_cast<uint16_t>(tcp::socketsPerConnection());
    forged.chunkBytes = tcp::chunkBytesParam();
    REQUIRE(tcp::signHello(forged, "not the secret").isOk());
    uint8_t bytes[tcp::kHelloBytes];
    tcp::encodeHello(forged, bytes);
    strays.push_back(rawConnect(listener));
    REQUIRE(net::writeExact(strays.back().get(), bytes, sizeof(bytes), Deadline::afterMs(1000), "forged").isOk());
  }
  // Garbage, a half hello, a silent client, and a connect-then-close.
  strays.push_back(rawConnect(listener));
  uint8_t garbage[tcp::kHelloBytes];
  REQUIRE(net::randomBytes(garbage, sizeof(garbage)).isOk());
  REQUIRE(net::writeExact(strays.back().get(), garbage, sizeof(garbage), Deadline::afterMs(1000), "garbage").isOk());
  strays.push_back(rawConnect(listener));
  REQUIRE(net::writeExact(strays.back().get(), garbage, 10, Deadline::afterMs(1000), "half").isOk());
  strays.push_back(rawConnect(listener));
  rawConnect(listener);  // closed at once

  int64_t start = nowNs();
  ConnPair pair = makeTcpPair(0, commId);
  REQUIRE((nowNs() - start) / 1000000 < 2000);
  exchange(*pair.first, *pair.second, 3 << 20, 1);
  exchange(*pair.second, *pair.first, 10, 2);

  // The silent and half-hello clients are closed at the handshake deadline
  // (by the next set-up that pumps the listener).
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  ConnPair another = makeTcpPair(0);
  exchange(*another.first, *another.second, 100, 3);
  for (size_t i = 0; i < strays.size(); ++i) {
    uint8_t byte;
    Status s = net::readExact(strays[i].get(), &byte, 1, Deadline::afterMs(3000), "stray");
    INFO("stray " << i << ": " << s.toString());
    REQUIRE(s.code() == Code::kRemoteError);  // closed by the transport
  }
}

TEST_CASE("tcp connect deadlines name the peer", "[tcp]") {
  world();
  SECTION("the connector never comes") {
    PeerInfo self = peerInfo(*world().rank1, 1), peer = peerInfo(*world().rank0, 0);
    ConnectOptions options;
    options.self = &self;
    options.peer = &peer;
    options.secret = "s";
    options.deadline = Deadline::afterMs(300);
    int64_t start = nowNs();
    auto c = world().rank1->connect(ConnectionKey{gNextCommId++, 1, 0, 5}, options);
    int64_t ms = (nowNs() - start) / 1000000;
    REQUIRE_FALSE(c.isOk());
    INFO(c.status().toString());
    REQUIRE(c.status().code() == Code::kTimeout);
    REQUIRE_THAT(c.status().message(), Catch::Contains("rank 0 (host host-a, tcp 127.0.0.1:"));
    REQUIRE_THAT(c.status().message(), Catch::Contains("channel 5"));
    REQUIRE(ms >= 250);
    REQUIRE(ms < 3000);
  }
  SECTION("nobody listens at the peer's address") {
    ScopedEnv env{{"NCCL_SOCKET_RETRY_CNT", "1000"}, {"NCCL_SOCKET_RETRY_SLEEP_MSEC", "10"}};
    // A port that was just free.
    Result<net::SocketAddress> any = net::SocketAddress::parse("127.0.0.1:0");
    Result<net::Fd> temp = net::listenOn(any.value());
    REQUIRE(temp.isOk());
    std::string deadAddress = net::localAddressOf(temp.value().get()).value().toString();
    temp.value().reset();
    PeerInfo self = peerInfo(*world().rank0, 0), peer;
    peer.rank = 1;
    peer.hostname = "gone";
    peer.addresses.emplace_back("tcp", deadAddress);
    ConnectOptions options;
    options.self = &self;
    options.peer = &peer;
    options.secret = "s";
    options.deadline = Deadline::afterMs(500);
    int64_t start = nowNs();
    auto c = world().rank0->connect(ConnectionKey{gNextCommId++, 0, 1, 0}, options);
    int64_t ms = (nowNs() - start) / 1000000;
    REQUIRE_FALSE(c.isOk());
    INFO(c.status().toString());
    REQUIRE(c.status().code() == Code::kTimeout);
    REQUIRE_THAT(c.status().message(), Catch::Contains("rank 1 (host gone, tcp " + deadAddress + ")"));
    REQUIRE(ms < 3000);
  }
}

// Out of descriptors, accept fails and leaves the connection in the
// kernel's queue, so the listener stays readable: the waiting rank must not
// spin on it (it had burned a core and written a warning per try until its
// deadline), and its timeout says why nothing arrived.
// This process's listening socket at `address`, found among its
// descriptors; -1 if none.
// Descriptors this process has open.
size_t openDescriptors() {
  DIR* dir = ::opendir("/proc/self/fd");
  REQUIRE(dir != nullptr);
  size_t n = 0;
  while (::readdir(dir) != nullptr) ++n;
  ::closedir(dir);
  return n;
}

int listenerAt(const net::SocketAddress& address) {
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int found = -1;
  while (dirent* entry = ::readdir(dir)) {
    const int fd = std::atoi(entry->d_name);
    int listening = 0;
    socklen_t len = sizeof(listening);
    if (fd <= 2 || ::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || !listening) continue;
    Result<net::SocketAddress> local = net::localAddressOf(fd);
    if (local.isOk() && local.value() == address) found = fd;
  }
  ::closedir(dir);
  return found;
}

// Other processes probe whether this one lives (a stalled operation's look
// at a peer over ofi, comm/connection_table.h) by connecting to its tcp
// listener and closing at once. A process that connects over tcp rarely,
// or never (ofi only), would leave them in the listener's backlog until it
// filled and the kernel dropped every later connection: the idle check's
// tidy() accepts and drops them.
TEST_CASE("tcp tidy() drains the probes that wait on the listener while no connect pumps it", "[tcp]") {
  std::unique_ptr<Transport> t = makeTcpTransport();
  Result<std::string> address = t->localAddress();
  REQUIRE(address.isOk());
  const net::SocketAddress target = net::SocketAddress::parse(address.value()).value();
  const int listener = listenerAt(target);
  REQUIRE(listener >= 0);
  // For a listening socket, TCP_INFO's unacked is its accept queue's length.
  auto queued = [&] {
    tcp_info info{};
    socklen_t len = sizeof(info);
    REQUIRE(::getsockopt(listener, IPPROTO_TCP, TCP_INFO, &info, &len) == 0);
    return info.tcpi_unacked;
  };
  const size_t descriptors = openDescriptors();
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < 5; ++i)
      REQUIRE(net::probeListener(target, Deadline::afterMs(1000)) == net::ListenerAnswer::kAccepts);
    CHECK(queued() == 5);
    t->tidy();
    CHECK(queued() == 0);
    // Closed already, they hold no descriptor until the next tidy() either.
    CHECK(openDescriptors() == descriptors);
  }
}

TEST_CASE("tcp out of descriptors: the accept pauses and the timeout says why", "[tcp]") {
  world();
  std::unique_ptr<Transport> waiter = makeTcpTransport();
  Result<std::string> address = waiter->localAddress();
  REQUIRE(address.isOk());
  Result<net::SocketAddress> target = net::SocketAddress::parse(address.value());
  REQUIRE(target.isOk());
  // A connection queued at the listener, then no descriptor left.
  int client = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(client >= 0);
  REQUIRE(::connect(client, target.value().raw(), target.value().length()) == 0);
  std::vector<int> filler;
  for (int fd; (fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) filler.push_back(fd);
  REQUIRE(errno == EMFILE);
  PeerInfo self = peerInfo(*waiter, 1), peer = peerInfo(*world().rank0, 0);
  ConnectOptions options;
  options.self = &self;
  options.peer = &peer;
  options.secret = "s";
  options.deadline = Deadline::afterMs(1000);
  rusage before{}, after{};
  ::getrusage(RUSAGE_SELF, &before);
  auto c = waiter->connect(ConnectionKey{gNextCommId++, 1, 0, 0}, options);
  ::getrusage(RUSAGE_SELF, &after);
  for (int fd : filler) ::close(fd);
  ::close(client);
  auto cpuMs = [](const rusage& r) {
    return (r.ru_utime.tv_sec + r.ru_stime.tv_sec) * 1000.0 + (r.ru_utime.tv_usec + r.ru_stime.tv_usec) / 1000.0;
  };
  const double spent = cpuMs(after) - cpuMs(before);
  REQUIRE_FALSE(c.isOk());
  INFO(c.status().toString());
  CHECK(c.status().code() == Code::kTimeout);
  CHECK_THAT(c.status().message(), Catch::Contains("this process failed to accept connections"));
  INFO("CPU spent waiting: " << spent << " ms");
  CHECK(spent < 400);
}

// ncclConfig_t.netName chooses the network for peers on other hosts, as
// NCCL_NET does, which overrides it; a name Shoal has no network for is an
// invalid argument naming where it came from.
TEST_CASE("the network for other hosts: ncclConfig_t.netName, overridden by NCCL_NET", "[tcp]") {
  useLoopbackInterface();
  PeerInfo self, peer;
  self.rank = 0;
  self.hostId = self.hostname = "host-a";
  peer.rank = 1;
  peer.hostId = peer.hostname = "host-b";
  for (PeerInfo* p : {&self, &peer}) p->addresses.emplace_back("tcp", "127.0.0.1:9");
  TransportChoice choice;
  choice.net = "Socket";
  Result<Transport*> socket = selectTransport(self, peer, choice);
  REQUIRE(socket.isOk());
  CHECK(socket.value()->name() == "tcp");
  choice.net = "OFI";  // forced: ofi, which cannot reach a peer without an ofi address
  Result<Transport*> ofi = selectTransport(self, peer, choice);
  REQUIRE_FALSE(ofi.isOk());
  CHECK_THAT(ofi.status().message(), Catch::Contains("ofi") && Catch::Contains("ncclConfig_t.netName=OFI"));
  choice.net = "Carrier pigeon";
  Result<Transport*> bad = selectTransport(self, peer, choice);
  REQUIRE_FALSE(bad.isOk());
  CHECK(bad.status().code() == Code::kInvalidArgument);
  CHECK_THAT(bad.status().message(), Catch::Contains("ncclConfig_t.netName=Carrier pigeon is not a network"));
  {
    ScopedEnv env{{"NCCL_NET", "Socket"}};  // the environment wins
    Result<Transport*> overridden = selectTransport(self, peer, choice);
    REQUIRE(overridden.isOk());
    CHECK(overridden.value()->name() == "tcp");
  }
  {
    ScopedEnv env{{"NCCL_NET", "Libfabric"}};  // the error names the setting that forced it
    Result<Transport*> overridden = selectTransport(self, peer, choice);
    REQUIRE_FALSE(overridden.isOk());
    CHECK_THAT(overridden.status().message(), Catch::Contains("NCCL_NET=Libfabric"));
  }
}

// A rank whose communicator ended drops the sockets its peers sent for
// connections it never took: the next communicator with the same id (as
// NCCL_COMM_ID gives) must not take them for its own, and the connector's
// writes fail instead of vanishing.
TEST_CASE("tcp: sockets left for a rank that ended are dropped at forgetRank", "[tcp]") {
  world();
  std::unique_ptr<Transport> acceptor = makeTcpTransport();
  PeerInfo self0 = peerInfo(*world().rank0, 0), self1 = peerInfo(*acceptor, 1);
  const uint64_t commId = gNextCommId++;
  auto options = [](PeerInfo& self, PeerInfo& peer, int64_t ms) {
    ConnectOptions o;
    o.self = &self;
    o.peer = &peer;
    o.secret = "same secret";
    o.deadline = Deadline::afterMs(ms);
    return o;
  };
  // Rank 0 connects (its hellos go out); rank 1's end never takes them.
  auto c0 = world().rank0->connect(ConnectionKey{commId, 0, 1, 0}, options(self0, self1, 5000));
  REQUIRE(c0.isOk());
  // Something else rank 1 waits for runs its pump, which files the arrivals.
  (void)acceptor->connect(ConnectionKey{gNextCommId++, 1, 0, 0}, options(self1, self0, 300));
  acceptor->forgetRank(commId, 1);
  // The same id again: nothing is left to take.
  auto again = acceptor->connect(ConnectionKey{commId, 1, 0, 0}, options(self1, self0, 300));
  INFO(again.status().toString());
  CHECK_FALSE(again.isOk());
  CHECK(again.status().code() == Code::kTimeout);
  // The connector's end learns of it.
  std::vector<uint8_t> out(4 << 20, 1);
  Status st = c0.value()->postSend(out.data(), out.size(), encodeTag(CollKind::kSend, DataType::kUint8, out.size(), 0, 0, 1), 1);
  std::vector<Completion> done;
  Deadline deadline = Deadline::afterMs(5000);
  while (st.isOk() && !deadline.expired()) {
    bool progressed = false;
    st = c0.value()->poll(done, progressed);
  }
  INFO(st.toString());
  CHECK_FALSE(st.isOk());
}

// Destroys the pair's second side, then receives on the first: what it says.
static Status receiveAfterClose(ConnPair& pair) {
  pair.second.reset();
  std::vector<uint8_t> in(8);
  REQUIRE(pair.first->postRecv(in.data(), 8, 1, 1).isOk());
  return pumpBoth(*pair.first, *pair.first, 5000);
}

TEST_CASE("tcp errors from a closed peer name it", "[tcp]") {
  world();
  ConnPair pair = makeTcpPair(0);
  std::string description = pair.first->peerDescription();
  REQUIRE_THAT(description, Catch::StartsWith("rank 1 (host host-b, tcp 127.0.0.1:"));
  REQUIRE_THAT(pair.second->peerDescription(), Catch::StartsWith("rank 0 (host host-a, tcp 127.0.0.1:"));
  Status s = receiveAfterClose(pair);
  INFO(s.toString());
  REQUIRE(s.code() == Code::kRemoteError);
  // A connection destroyed on purpose says goodbye (a bye header): the
  // receiver names the peer and says it left, not that the bytes stopped.
  REQUIRE_THAT(s.message(), Catch::StartsWith(description + ": the peer closed its communicator"));
}

TEST_CASE("tcp carries a failing side's report in its bye", "[tcp]") {
  world();
  ConnPair pair = makeTcpPair(0);
  const std::string description = pair.first->peerDescription();
  CHECK(pair.second->carriesFailureReports());
  CHECK_FALSE(pair.second->failureReportsArriveUnread());  // read with the bye, never waited for
  pair.second->publishFailure("no progress waiting on rank 9 (host far)", /*final=*/false);
  // What the failing side learns from its own upstream extends its report;
  // another report does not replace it.
  pair.second->publishFailure("no progress waiting on rank 9 (host far); rank 9 had failed first: rank 7 died",
                              /*final=*/true);
  pair.second->publishFailure("something else", /*final=*/true);
  Status s = receiveAfterClose(pair);
  INFO(s.toString());
  REQUIRE(s.code() == Code::kRemoteError);
  CHECK_THAT(s.message(), Catch::StartsWith(description + ": the peer's communicator failed and closed"));
  CHECK(pair.first->peerFailureFinal());  // the bye carries what the peer had said when it closed
  CHECK(pair.first->peerFailure() == "no progress waiting on rank 9 (host far); rank 9 had failed first: rank 7 died");
}

TEST_CASE("tcp bounds a long report by its start and its end", "[tcp]") {
  world();
  const size_t most = tcp::TcpConnection::kMaxReportBytes;
  CHECK(tcp::TcpConnection::boundReport("short") == "short");
  // A chain of reports: this rank's view first, the first cause last.
  const std::string report = "rank 5's view" + std::string(3 * most, '.') + "rank 0 died";
  const std::string bounded = tcp::TcpConnection::boundReport(report);
  CHECK(bounded.size() == most);
  CHECK_THAT(bounded, Catch::StartsWith("rank 5's view") && Catch::EndsWith("rank 0 died") &&
                          Catch::Contains(" [...] "));
  ConnPair pair = makeTcpPair(0);
  pair.second->publishFailure(report, /*final=*/false);
  // A report already past the bound can still be extended (what the rank
  // learns from its upstream peers comes last).
  pair.second->publishFailure(report + "; rank 9 had failed first: rank 8 died", /*final=*/true);
  CHECK(receiveAfterClose(pair).code() == Code::kRemoteError);
  CHECK(pair.first->peerFailure().size() == most);
  CHECK_THAT(pair.first->peerFailure(), Catch::StartsWith("rank 5's view") &&
                                            Catch::EndsWith("rank 0 died; rank 9 had failed first: rank 8 died"));
}

TEST_CASE("tcp reads a failed peer's bye when a send to it fails first", "[tcp]") {
  world();
  ConnPair pair = makeTcpPair(0);
  pair.second->publishFailure("rank 1 lost rank 7", /*final=*/true);
  pair.second.reset();
  // Sending into the closed socket fails (its host resets it) while the bye
  // waits unread: no receive was posted to meet it.
  std::vector<uint8_t> out(1 << 20, 1);
  Status s;
  Deadline deadline = Deadline::afterMs(10000);
  for (uint64_t seq = 1; s.isOk() && !deadline.expired(); ++seq) {
    s = pair.first->postSend(out.data(), out.size(), 1, seq);
    if (s.isOk()) s = pumpBoth(*pair.first, *pair.first, 200);
    if (s.code() == Code::kTimeout) s = Status::ok();  // the send buffers filled: post more
  }
  INFO(s.toString());
  REQUIRE(s.code() == Code::kRemoteError);
  CHECK_THAT(s.message(), Catch::Contains("the peer's communicator failed and closed"));
  CHECK(pair.first->peerFailure() == "rank 1 lost rank 7");
}

// --- performance (hidden: run with "[perf]")

namespace {

// Streams `iterations` messages of `bytes` a -> b with one thread per side;
// returns GB/s (1e9 bytes per second).
double streamBandwidth(Connection& a, Connection& b, uint64_t bytes, int iterations) {
  std::vector<uint8_t> out(bytes, 1), in(bytes);
  std::atomic<bool> ok{true};
  auto pumpOne = [&ok](Connection& c, int posts, auto post) {
    std::vector<Completion> done;
    Backoff backoff;
    for (int i = 0; i < posts && ok; ++i) {
      if (!post(i).isOk()) ok = false;
      while (ok && c.pending() > 0) {
        bool progressed = false;
        if (!c.poll(done, progressed).isOk()) ok = false;
        if (progressed) backoff.reset();
        else backoff.pause();
      }
    }
  };
  int64_t start = nowNs();
  auto receiver = std::async(std::launch::async, [&] {
    pumpOne(b, iterations, [&](int i) { return b.postRecv(in.data(), bytes, 1, static_cast<uint64_t>(i)); });
  });
  pumpOne(a, iterations, [&](int i) { return a.postSend(out.data(), bytes, 1, static_cast<uint64_t>(i)); });
  receiver.get();
  REQUIRE(ok);
  double seconds = double(nowNs() - start) / 1e9;
  return double(bytes) * iterations / seconds / 1e9;
}

// Both ends send and receive `bytes` at once (a ring step), one thread each;
// returns GB/s per direction.
double exchangeBandwidth(Connection& a, Connection& b, uint64_t bytes, int iterations) {
  std::vector<uint8_t> outA(bytes, 1), inA(bytes), outB(bytes, 2), inB(bytes);
  std::atomic<bool> ok{true};
  auto run = [&](Connection& c, std::vector<uint8_t>& out, std::vector<uint8_t>& in) {
    std::vector<Completion> done;
    Backoff backoff;
    for (int i = 0; i < iterations && ok; ++i) {
      if (!c.postSend(out.data(), bytes, 1, 1).isOk() || !c.postRecv(in.data(), bytes, 1, 2).isOk()) ok = false;
      while (ok && c.pending() > 0) {
        bool progressed = false;
        if (!c.poll(done, progressed).isOk()) ok = false;
        if (progressed) backoff.reset();
        else backoff.pause();
      }
    }
  };
  int64_t start = nowNs();
  auto other = std::async(std::launch::async, [&] { run(b, outB, inB); });
  run(a, outA, inA);
  other.get();
  REQUIRE(ok);
  return double(bytes) * iterations / (double(nowNs() - start) / 1e9) / 1e9;
}

double pingPongMicros(Connection& a, Connection& b, int iterations, bool spin) {
  uint64_t x = 0, y = 0;
  std::atomic<bool> ok{true};
  auto wait = [&](Connection& c) {
    std::vector<Completion> done;
    Backoff backoff;  // as the engine waits: spin, then yield, then sleep
    while (ok && c.pending() > 0) {
      bool progressed = false;
      if (!c.poll(done, progressed).isOk()) ok = false;
      if (progressed || spin) backoff.reset();
      else backoff.pause();
    }
  };
  auto echo = std::async(std::launch::async, [&] {
    for (int i = 0; i < iterations; ++i) {
      (void)b.postRecv(&y, 8, 1, 1);
      wait(b);
      (void)b.postSend(&y, 8, 1, 2);
      wait(b);
    }
  });
  int64_t start = nowNs();
  for (int i = 0; i < iterations; ++i) {
    (void)a.postSend(&x, 8, 1, 1);
    (void)a.postRecv(&x, 8, 1, 2);
    wait(a);
  }
  double us = double(nowNs() - start) / 1e3 / iterations;
  echo.get();
  REQUIRE(ok);
  return us;
}

}  // namespace

TEST_CASE("tcp loopback throughput and latency", "[.][perf][tcp]") {
  world();
  for (const char* perThread : {"1", "2", "4"}) {
    ScopedEnv env{{"NCCL_SOCKET_NTHREADS", "1"}, {"NCCL_NSOCKS_PERTHREAD", perThread}};
    ConnPair pair = makeTcpPair(0);
    streamBandwidth(*pair.first, *pair.second, 64ull << 20, 2);  // warm-up
    double gbps = streamBandwidth(*pair.first, *pair.second, 64ull << 20, 20);
    double both = exchangeBandwidth(*pair.first, *pair.second, 64ull << 20, 10);
    double spinUs = pingPongMicros(*pair.first, *pair.second, 20000, /*spin=*/true);
    double backoffUs = pingPongMicros(*pair.first, *pair.second, 20000, /*spin=*/false);
    std::printf("tcp loopback, %s socket(s): 64 MiB messages one way %.2f GB/s, both ways %.2f GB/s each; "
                "8 B round trip %.2f us spinning, %.2f us with Backoff\n",
                perThread, gbps, both, spinUs, backoffUs);
  }
}

}  // namespace shoal
