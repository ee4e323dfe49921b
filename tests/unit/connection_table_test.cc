// ConnectionTable's looks at a peer (comm/connection_table.h, Look): what a
// probe of the peer's process may conclude, and when.
#include <catch2/catch.hpp>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "comm/connection_table.h"
#include "net/fd.h"
#include "net/socket.h"
#include "net/socket_address.h"
#include "transports/registry.h"

namespace shoal {
namespace {

// A tcp listener standing for a peer process's, on loopback.
struct FakePeerListener {
  net::Fd fd;
  std::string address;
  FakePeerListener() {
    Result<net::Fd> listener = net::listenOn(net::SocketAddress::parse("127.0.0.1:0").value());
    REQUIRE(listener.isOk());
    fd = std::move(listener.value());
    address = net::localAddressOf(fd.get()).value().toString();
  }
};

bool saysExited(const std::string& why) { return why.find("its process has exited") != std::string::npos; }

}  // namespace

// A peer over a transport whose connections do not notice its exit (ofi) is
// probed through its tcp listener while an operation is stalled on it, but
// only once a probe found it alive right after a connection to it was made:
// a refusal then means the process exited, not that a firewall rejects the
// probe.
TEST_CASE("connection table: a probe of a peer's process is trusted only once it found the peer alive",
          "[unit]") {
  FakePeerListener vouched, neverVouched, refusedAtVouch, elsewhere;
  std::vector<PeerInfo> peers(5);
  for (int r = 0; r < 5; ++r) {
    peers[static_cast<size_t>(r)].rank = r;
    peers[static_cast<size_t>(r)].hostname = "host" + std::to_string(r);
    peers[static_cast<size_t>(r)].kernelId = "one kernel";  // loopback reaches them
  }
  peers[1].addresses = {{"tcp", vouched.address}};
  peers[2].addresses = {{"tcp", neverVouched.address}};
  peers[3].addresses = {{"tcp", refusedAtVouch.address}};
  // On another kernel: a loopback address there is not this kernel's.
  peers[4].addresses = {{"tcp", elsewhere.address}};
  peers[4].kernelId = "another kernel";
  std::atomic<bool> aborted{false};
  ConnectionTable table(0x5eed, 0, peers, "secret", aborted);
  auto look = [&](int peer, ConnectionTable::Look what, const Transport* connecting = nullptr) {
    return table.lookAt(peer, what, connecting, Deadline::afterMs(2000));
  };
  using Look = ConnectionTable::Look;

  // Alive: a probe proves nothing against it, vouched or not.
  CHECK(look(1, Look::kStalled).empty());
  CHECK(look(1, Look::kVouch).empty());
  CHECK(look(1, Look::kStalled).empty());
  refusedAtVouch.fd.reset();
  CHECK(look(3, Look::kVouch).empty());  // refused while it was there: never trusted
  CHECK(look(4, Look::kVouch).empty());  // not probed: not trusted

  vouched.fd.reset();
  neverVouched.fd.reset();
  elsewhere.fd.reset();
  const std::string exited = look(1, Look::kStalled);
  INFO(exited);
  CHECK(saysExited(exited));
  CHECK(exited.find(vouched.address) != std::string::npos);
  CHECK(look(2, Look::kStalled).empty());
  CHECK(look(3, Look::kStalled).empty());
  CHECK(look(4, Look::kStalled).empty());
  // A connect waiting for the peer asks the transport that connects them,
  // whose own address reaches it, without a vouch.
  const Transport* tcp = findTransport("tcp");
  REQUIRE(tcp != nullptr);
  CHECK(saysExited(look(2, Look::kConnect, tcp)));
  CHECK(look(4, Look::kConnect, tcp).empty());
}

// Every communicator with a peer vouches for it, but a probe that found the
// peer's process alive once holds for the process's life: later
// communicators take it without a probe. (Each probe waits in the peer's
// listen backlog until the peer accepts it at an idle check; thousands of
// communicators made in a row filled it, and then every vouch waited out its
// deadline.)
TEST_CASE("connection table: a peer process found alive once is not probed again by later communicators", "[unit]") {
  FakePeerListener listener;
  auto queued = [&] {  // for a listening socket, TCP_INFO's unacked is its accept queue's length
    tcp_info info{};
    socklen_t len = sizeof(info);
    REQUIRE(::getsockopt(listener.fd.get(), IPPROTO_TCP, TCP_INFO, &info, &len) == 0);
    return info.tcpi_unacked;
  };
  std::vector<PeerInfo> peers(2);
  for (int r = 0; r < 2; ++r) {
    peers[static_cast<size_t>(r)].rank = r;
    peers[static_cast<size_t>(r)].hostname = "host" + std::to_string(r);
    peers[static_cast<size_t>(r)].hostId = "host" + std::to_string(r);
    peers[static_cast<size_t>(r)].processId = 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(r);
    peers[static_cast<size_t>(r)].kernelId = "one kernel";
  }
  peers[1].addresses = {{"tcp", listener.address}};
  std::atomic<bool> aborted{false};
  using Look = ConnectionTable::Look;
  ConnectionTable first(0x5eed1, 0, peers, "secret", aborted);
  CHECK(first.lookAt(1, Look::kVouch, nullptr, Deadline::afterMs(2000)).empty());
  REQUIRE(queued() == 1);
  std::vector<std::unique_ptr<ConnectionTable>> later;
  for (int c = 0; c < 5; ++c) {
    later.push_back(std::make_unique<ConnectionTable>(0x5eed2 + c, 0, peers, "secret", aborted));
    CHECK(later.back()->lookAt(1, Look::kVouch, nullptr, Deadline::afterMs(2000)).empty());
  }
  CHECK(queued() == 1);
  // And what the first probe learnt holds for them: a refusal now means the
  // process exited.
  listener.fd.reset();
  CHECK(saysExited(later.back()->lookAt(1, Look::kStalled, nullptr, Deadline::afterMs(2000))));
}

}  // namespace shoal
