// src/net: addresses, interface selection (NCCL_SOCKET_IFNAME rules over
// synthetic lists), SHA-256/HMAC vectors, socket helpers on 127.0.0.1.
#include <catch2/catch.hpp>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <cstdlib>
#include <cstring>
#include <thread>

#include "core/params.h"
#include "net/crypto.h"
#include "net/interfaces.h"
#include "net/socket.h"
#include "net/socket_address.h"

namespace shoal::net {
namespace {

NetInterface itf(const char* name, const char* address, bool up = true, bool loopback = false) {
  NetInterface i;
  i.name = name;
  Result<SocketAddress> parsed = SocketAddress::parse(address);
  REQUIRE(parsed.isOk());
  i.address = parsed.value();
  i.up = up;
  i.loopback = loopback;
  return i;
}

std::vector<std::string> names(const Result<std::vector<NetInterface>>& list) {
  REQUIRE(list.isOk());
  std::vector<std::string> out;
  for (const auto& i : list.value()) out.push_back(i.name + " " + i.address.hostString());
  return out;
}

std::string hex(const Digest& d) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (uint8_t b : d) {
    out += digits[b >> 4];
    out += digits[b & 15];
  }
  return out;
}

std::string unhex(const std::string& text) {
  std::string out;
  for (size_t i = 0; i + 1 < text.size(); i += 2) out += static_cast<char>(std::stoi(text.substr(i, 2), nullptr, 16));
  return out;
}

}  // namespace

TEST_CASE("SocketAddress parses and formats IPv4 and IPv6", "[net]") {
  Result<SocketAddress> v4 = SocketAddress::parse("10.1.2.3:4431");
  REQUIRE(v4.isOk());
  REQUIRE(v4->family() == AF_INET);
  REQUIRE(v4->port() == 4431);
  REQUIRE(v4->toString() == "10.1.2.3:4431");
  REQUIRE(v4->hostString() == "10.1.2.3");

  Result<SocketAddress> v6 = SocketAddress::parse("[fd00::1:2]:80");
  REQUIRE(v6.isOk());
  REQUIRE(v6->family() == AF_INET6);
  REQUIRE(v6->toString() == "[fd00::1:2]:80");
  REQUIRE(SocketAddress::parse(v6->toString()).value() == v6.value());

  REQUIRE(SocketAddress::parse("[::1]:5").value().isLoopback());
  REQUIRE(SocketAddress::parse("127.0.0.9:5").value().isLoopback());
  REQUIRE(SocketAddress::parse("[fe80::1%1]:5").value().isLinkLocal());

  for (const char* bad : {"", "1.2.3.4", "1.2.3.4:", "1.2.3.4:70000", "1.2.3.4:x", "::1:80", "[::1]80", "[::1",
                          "host:80", ":80", "1.2.3:80"}) {
    INFO(bad);
    Result<SocketAddress> r = SocketAddress::parse(bad);
    REQUIRE_FALSE(r.isOk());
    REQUIRE(r.status().code() == Code::kInvalidArgument);
  }
  Result<SocketAddress> resolved = SocketAddress::resolve("localhost:99");
  REQUIRE(resolved.isOk());
  REQUIRE(resolved->isLoopback());
  REQUIRE(resolved->port() == 99);
}

TEST_CASE("InterfaceFilter follows NCCL_SOCKET_IFNAME syntax", "[net]") {
  InterfaceFilter prefixes = InterfaceFilter::parse("eth,ib");
  REQUIRE(prefixes.matches("eth0"));
  REQUIRE(prefixes.matches("ib1"));
  REQUIRE_FALSE(prefixes.matches("lo"));

  InterfaceFilter exclude = InterfaceFilter::parse("^docker,lo");
  REQUIRE(exclude.matches("eth0"));
  REQUIRE_FALSE(exclude.matches("docker0"));
  REQUIRE_FALSE(exclude.matches("lo"));

  InterfaceFilter exact = InterfaceFilter::parse("=eth0");
  REQUIRE(exact.matches("eth0"));
  REQUIRE_FALSE(exact.matches("eth01"));

  InterfaceFilter excludeExact = InterfaceFilter::parse("^=eth0,eth1");
  REQUIRE_FALSE(excludeExact.matches("eth0"));
  REQUIRE(excludeExact.matches("eth01"));
  REQUIRE(excludeExact.matches("ens5"));

  InterfaceFilter withPorts = InterfaceFilter::parse("mlx5_0:1,eth");
  REQUIRE(withPorts.matches("mlx5_0"));
  REQUIRE(withPorts.matches("eth2"));
}

TEST_CASE("selectInterfaces: default / prefixes / exclusions / families", "[net]") {
  std::vector<NetInterface> all = {
      itf("lo", "127.0.0.1:0", true, true),  itf("docker0", "172.17.0.1:0"), itf("eth0", "10.0.0.5:0"),
      itf("eth0", "[fd00::5]:0"),            itf("eth1", "10.1.0.5:0", false), itf("ib0", "192.168.0.5:0"),
      itf("eth2", "[fe80::1%1]:0"),          itf("ens5", "[fd00::9]:0"),      itf("ens5", "10.2.0.9:0")};

  SECTION("default: ib first, then others; never lo, docker or down interfaces") {
    REQUIRE(names(selectInterfaces(all, "", "")) ==
            std::vector<std::string>{"ib0 192.168.0.5", "eth0 10.0.0.5", "eth0 fd00::5", "ens5 10.2.0.9",
                                     "ens5 fd00::9"});
  }
  SECTION("default falls back to loopback") {
    std::vector<NetInterface> only = {itf("docker0", "172.17.0.1:0"), itf("lo", "127.0.0.1:0", true, true),
                                      itf("eth0", "10.0.0.1:0", false)};
    REQUIRE(names(selectInterfaces(only, "", "")) == std::vector<std::string>{"lo 127.0.0.1"});
  }
  SECTION("prefix list") {
    REQUIRE(names(selectInterfaces(all, "eth", "")) ==
            std::vector<std::string>{"eth0 10.0.0.5", "eth0 fd00::5"});  // eth1 down, eth2 link-local only
    REQUIRE(names(selectInterfaces(all, "lo", "")) == std::vector<std::string>{"lo 127.0.0.1"});
    REQUIRE(names(selectInterfaces(all, "docker", "")) == std::vector<std::string>{"docker0 172.17.0.1"});
  }
  SECTION("exclusion") {
    REQUIRE(names(selectInterfaces(all, "^ib,lo,docker,eth", "")) ==
            std::vector<std::string>{"ens5 10.2.0.9", "ens5 fd00::9"});
  }
  SECTION("exact names") {
    REQUIRE(names(selectInterfaces(all, "=eth", "")).empty());
    REQUIRE(names(selectInterfaces(all, "=ens5", "")) == std::vector<std::string>{"ens5 10.2.0.9", "ens5 fd00::9"});
  }
  SECTION("family") {
    REQUIRE(names(selectInterfaces(all, "ens", "AF_INET6")) == std::vector<std::string>{"ens5 fd00::9"});
    REQUIRE(names(selectInterfaces(all, "ens", "AF_INET")) == std::vector<std::string>{"ens5 10.2.0.9"});
    REQUIRE(selectInterfaces(all, "", "AF_UNIX").status().code() == Code::kInvalidArgument);
  }
  SECTION("nothing matches") { REQUIRE(names(selectInterfaces(all, "wlan", "")).empty()); }
}

TEST_CASE("chooseInterface honours NCCL_SOCKET_IFNAME on this machine", "[net]") {
  setenv("NCCL_SOCKET_IFNAME", "lo", 1);
  reloadParams();
  Result<NetInterface> chosen = chooseInterface();
  REQUIRE(chosen.isOk());
  REQUIRE(chosen->name == "lo");
  REQUIRE(chosen->address.hostString() == "127.0.0.1");
  setenv("NCCL_SOCKET_IFNAME", "no-such-interface", 1);
  reloadParams();
  Result<NetInterface> none = chooseInterface();
  REQUIRE_FALSE(none.isOk());
  REQUIRE_THAT(none.status().message(), Catch::Contains("no-such-interface"));
  REQUIRE_THAT(none.status().message(), Catch::Contains("lo 127.0.0.1"));
  setenv("NCCL_SOCKET_IFNAME", "lo", 1);
  reloadParams();
}

TEST_CASE("SHA-256 and HMAC-SHA256 match the published vectors", "[net][crypto]") {
  REQUIRE(hex(sha256("")) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  REQUIRE(hex(sha256("abc")) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  REQUIRE(hex(sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")) ==
          "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  std::string million(1000000, 'a');
  REQUIRE(hex(sha256(million)) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  Sha256 incremental;
  for (size_t i = 0; i < million.size(); i += 777) incremental.update(million.substr(i, 777));
  REQUIRE(hex(incremental.finish()) == hex(sha256(million)));

  // RFC 4231 test cases 1, 2, 3, 4, 6, 7.
  REQUIRE(hex(hmacSha256(std::string(20, '\x0b'), "Hi There")) ==
          "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  REQUIRE(hex(hmacSha256("Jefe", "what do ya want for nothing?")) ==
          "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  REQUIRE(hex(hmacSha256(std::string(20, '\xaa'), std::string(50, '\xdd'))) ==
          "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
  REQUIRE(hex(hmacSha256(unhex("0102030405060708090a0b0c0d0e0f10111213141516171819"), std::string(50, '\xcd'))) ==
          "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
  REQUIRE(hex(hmacSha256(std::string(131, '\xaa'), "Test Using Larger Than Block-Size Key - Hash Key First")) ==
          "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  REQUIRE(hex(hmacSha256(std::string(131, '\xaa'),
                         "This is a test using a larger than block-size key and a larger than block-size data. "
                         "The key needs to be hashed before being used by the HMAC algorithm.")) ==
          "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");

  uint8_t a[32], b[32];
  REQUIRE(randomBytes(a, sizeof(a)).isOk());
  std::memcpy(b, a, sizeof(a));
  REQUIRE(constantTimeEqual(a, b, 32));
  b[31] ^= 1;
  REQUIRE_FALSE(constantTimeEqual(a, b, 32));
}

TEST_CASE("socket helpers on loopback", "[net]") {
  Result<Fd> listener = listenOn(SocketAddress::parse("127.0.0.1:0").value());
  REQUIRE(listener.isOk());
  SocketAddress bound = localAddressOf(listener->get()).value();
  REQUIRE(bound.port() != 0);

  SECTION("connect, accept, exact I/O, EOF and deadlines") {
    Result<Fd> client = connectWithRetry(bound, Deadline::afterMs(5000));
    REQUIRE(client.isOk());
    Fd server;
    Deadline deadline = Deadline::afterMs(5000);
    while (!server && !deadline.expired()) {
      Result<Fd> accepted = acceptOne(listener->get());
      REQUIRE(accepted.isOk());
      server = std::move(accepted.value());
    }
    REQUIRE(server);
    std::vector<uint8_t> out(5 << 20, 7), in(5 << 20);
    // A write larger than the socket buffers finishes only as the reader reads.
    Status written;
    std::thread writer([&] { written = writeExact(client->get(), out.data(), out.size(), Deadline::afterMs(20000), "w"); });
    Status read = readExact(server.get(), in.data(), in.size(), Deadline::afterMs(20000), "r");
    writer.join();
    INFO(written.toString() << " / " << read.toString());
    REQUIRE(written.isOk());
    REQUIRE(read.isOk());
    REQUIRE(in == out);

    int64_t start = nowNs();
    Status timeout = readExact(server.get(), in.data(), 1, Deadline::afterMs(100), "idle peer");
    REQUIRE(timeout.code() == Code::kTimeout);
    REQUIRE_THAT(timeout.message(), Catch::StartsWith("idle peer: timed out"));
    REQUIRE((nowNs() - start) / 1000000 >= 90);

    IoResult nothing = readSome(server.get(), in.data(), 10);
    REQUIRE(nothing.ok());
    REQUIRE(nothing.bytes == 0);

    client->reset();
    Status eof = readExact(server.get(), in.data(), 1, Deadline::afterMs(5000), "rank 3 (host b, tcp x)");
    REQUIRE(eof.code() == Code::kRemoteError);
    REQUIRE(eof.message() == "rank 3 (host b, tcp x): connection closed by peer");
  }

  SECTION("liveness options") {
    Result<Fd> client = connectWithRetry(bound, Deadline::afterMs(5000));
    REQUIRE(client.isOk());
    LivenessOptions options;
    options.userTimeoutMs = 12345;
    REQUIRE(setLiveness(client->get(), options).isOk());
    REQUIRE(setNoDelay(client->get()).isOk());
    auto get = [&](int level, int name) {
      int v = 0;
      socklen_t len = sizeof(v);
      REQUIRE(getsockopt(client->get(), level, name, &v, &len) == 0);
      return v;
    };
    REQUIRE(get(SOL_SOCKET, SO_KEEPALIVE) == 1);
    REQUIRE(get(IPPROTO_TCP, TCP_KEEPIDLE) == 10);
    REQUIRE(get(IPPROTO_TCP, TCP_KEEPINTVL) == 5);
    REQUIRE(get(IPPROTO_TCP, TCP_KEEPCNT) == 3);
    REQUIRE(get(IPPROTO_TCP, TCP_USER_TIMEOUT) == 12345);
    REQUIRE(get(IPPROTO_TCP, TCP_NODELAY) == 1);
    // Unsent bytes capped where asked; 0 keeps what the socket had.
    int systemDefault = get(IPPROTO_TCP, TCP_NOTSENT_LOWAT);
    REQUIRE(setNotsentLowat(client->get(), 0).isOk());
    REQUIRE(get(IPPROTO_TCP, TCP_NOTSENT_LOWAT) == systemDefault);
    REQUIRE(setNotsentLowat(client->get(), 16384).isOk());
    REQUIRE(get(IPPROTO_TCP, TCP_NOTSENT_LOWAT) == 16384);
    // The send buffer alone (the kernel keeps twice the value); 0 leaves it.
    int receiveBuffer = get(SOL_SOCKET, SO_RCVBUF);
    REQUIRE(setSendBuffer(client->get(), 131072).isOk());
    REQUIRE(get(SOL_SOCKET, SO_SNDBUF) == 262144);
    REQUIRE(setSendBuffer(client->get(), 0).isOk());
    REQUIRE(get(SOL_SOCKET, SO_SNDBUF) == 262144);
    REQUIRE(get(SOL_SOCKET, SO_RCVBUF) == receiveBuffer);
    // Keepalive detects a dead host in under a minute.
    REQUIRE(options.keepIdleS + options.keepIntervalS * options.keepCount < 60);

    setenv("SHOAL_PROGRESS_TIMEOUT_MS", "20000", 1);
    reloadParams();
    REQUIRE(LivenessOptions::fromParams().userTimeoutMs > 20000);
    setenv("SHOAL_PROGRESS_TIMEOUT_MS", "0", 1);
    reloadParams();
    REQUIRE(LivenessOptions::fromParams().userTimeoutMs == 0);
    unsetenv("SHOAL_PROGRESS_TIMEOUT_MS");
    reloadParams();
  }
}

// What the connection table's watch asks of a peer's tcp listener: a live
// one that never accepts takes the probe into its backlog (never judged
// gone); a closed one refuses.
TEST_CASE("probeListener: a live listener accepts, a closed one refuses", "[net]") {
  Result<Fd> listener = listenOn(SocketAddress::parse("127.0.0.1:0").value());
  REQUIRE(listener.isOk());
  const SocketAddress bound = localAddressOf(listener->get()).value();
  for (int probe = 0; probe < 3; ++probe)
    CHECK(probeListener(bound, Deadline::afterMs(1000)) == ListenerAnswer::kAccepts);
  listener->reset();
  CHECK(probeListener(bound, Deadline::afterMs(1000)) == ListenerAnswer::kRefuses);
}

TEST_CASE("connectWithRetry retries refusals within its deadline and says how often", "[net]") {
  // A port that was free a moment ago.
  Result<Fd> temp = listenOn(SocketAddress::parse("127.0.0.1:0").value());
  SocketAddress dead = localAddressOf(temp->get()).value();
  temp->reset();

  RetryPolicy few;
  few.retries = 3;
  few.sleepMs = 10;
  int64_t start = nowNs();
  Result<Fd> refused = connectWithRetry(dead, Deadline::afterMs(5000), few);
  REQUIRE_FALSE(refused.isOk());
  REQUIRE(refused.status().code() == Code::kRemoteError);
  REQUIRE_THAT(refused.status().message(), Catch::Contains("connect to " + dead.toString() + " (4 attempts)"));
  REQUIRE_THAT(refused.status().message(), Catch::Contains("refused"));
  REQUIRE((nowNs() - start) / 1000000 >= 60);  // 10 + 20 + 30 ms of linear backoff

  RetryPolicy many;
  many.retries = 100000;
  many.sleepMs = 5;
  start = nowNs();
  Result<Fd> late = connectWithRetry(dead, Deadline::afterMs(300), many);
  int64_t ms = (nowNs() - start) / 1000000;
  REQUIRE(late.status().code() == Code::kTimeout);
  REQUIRE_THAT(late.status().message(), Catch::Contains("deadline"));
  REQUIRE(ms < 1500);

  // A listener that appears later is found by the retries.
  std::thread later([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ListenOptions reuse;
    reuse.reuseAddress = true;
    Result<Fd> l = listenOn(dead, reuse);
    if (l.isOk()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1000));
    }
  });
  RetryPolicy patient;
  patient.retries = 100;
  patient.sleepMs = 10;
  Result<Fd> found = connectWithRetry(dead, Deadline::afterMs(5000), patient);
  later.join();
  REQUIRE(found.isOk());
}

}  // namespace shoal::net
