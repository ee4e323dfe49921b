// cuda_ipc transport on the driver stand-in: the conformance suite through
// the real connect path (both ends in this process; descriptors still cross
// a Unix socket with SCM_RIGHTS and the FIFO is mapped a second time through
// cuMemImportFromShareableHandle), with the default FIFO and with small
// slots that force many chunks and wrap-around; device buffers on both
// ends; the hello's codec; a wrong secret; which peers it can connect.
// Processes: tests/cudafake/device_collectives_test.cc runs every collective
// over cuda_ipc between forked ranks.
#include <catch2/catch.hpp>

#include <cuda.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <vector>

#include "cuda/driver.h"
#include "cudafake/device0.h"
#include "cudafake/fake_cuda.h"
#include "support/scoped_env.h"
#include "transport/conformance.h"
#include "transports/cuda_ipc/cuda_ipc_transport.h"

namespace shoal {
namespace {

// The library loads the stand-in this binary links.
const bool kDriverNamed = setenv("SHOAL_CUDA_DRIVER", SHOAL_CUDAFAKE_LIB, 0) == 0;

using ConnPair = std::pair<std::unique_ptr<Connection>, std::unique_ptr<Connection>>;
using testing::ScopedEnv;

uint64_t freshCommId() {
  static std::atomic<uint64_t> next{0xc0da000000000000ull ^ static_cast<uint64_t>(getpid()) << 20};
  return next++;
}

// Device 0's primary context current on this thread; its "GPU-<uuid>".
std::string useDevice0() {
  REQUIRE(kDriverNamed);
  return testing::makeDevice0Current();
}

struct PairWorld {
  std::unique_ptr<Transport> transport = makeCudaIpcTransport();
  PeerInfo a, b;
  PairWorld() {
    std::string gpu = useDevice0();
    auto address = transport->localAddress();
    REQUIRE(address.isOk());
    for (PeerInfo* p : {&a, &b}) {
      p->hostname = "here";
      p->hostId = "host";
      p->kernelId = "kernel";
      p->gpu = gpu;
      p->addresses = {{"cuda_ipc", address.value()}};
    }
    a.rank = 0;
    b.rank = 1;
    a.processId = 1;  // two "processes" as far as canConnect can tell
    b.processId = 2;
  }
  Result<ConnPair> tryConnect(int channel, const std::string& secretA, const std::string& secretB,
                              int64_t deadlineMs) {
    uint64_t id = freshCommId();
    ConnectOptions oa{&a, &b, secretA, Deadline::afterMs(deadlineMs)};
    ConnectOptions ob{&b, &a, secretB, Deadline::afterMs(deadlineMs)};
    // The lower rank first: it never waits; the higher waits for its hello.
    auto ca = transport->connect({id, 0, 1, static_cast<uint16_t>(channel)}, oa);
    if (!ca.isOk()) return ca.status();
    auto cb = transport->connect({id, 1, 0, static_cast<uint16_t>(channel)}, ob);
    if (!cb.isOk()) return cb.status();
    return ConnPair{std::move(ca).value(), std::move(cb).value()};
  }
  ConnPair connect(int channel) {
    auto pair = tryConnect(channel, "secret", "secret", 10000);
    INFO(pair.status().toString());
    REQUIRE(pair.isOk());
    return std::move(pair).value();
  }
};

testing::TransportUnderTest cudaIpcUnderTest(const char* name) {
  return testing::TransportUnderTest{.name = name, .makePair = [](int channel) {
                                       static PairWorld world;
                                       return world.connect(channel);
                                     }};
}

TEST_CASE("cuda_ipc conformance", "[cudafake][cuda_ipc][conformance]") {
  testing::runConformanceSuite(cudaIpcUnderTest("cuda_ipc"));
}

TEST_CASE("cuda_ipc conformance / 8 KiB slots: every message in many chunks, the FIFO wrapping", "[cudafake][cuda_ipc][conformance]") {
  ScopedEnv env{{"SHOAL_CUDA_IPC_FIFO_BYTES", "65536"}};
  testing::runConformanceSuite(cudaIpcUnderTest("cuda_ipc small FIFO"));
}

// Pumps both ends until each has `want` completions.
void pumpUntilDone(ConnPair& pair, size_t wantA, size_t wantB, std::vector<Completion>& a, std::vector<Completion>& b) {
  Deadline deadline = Deadline::afterMs(20000);
  while (a.size() < wantA || b.size() < wantB) {
    bool progressed = false;
    REQUIRE(pair.first->poll(a, progressed).isOk());
    REQUIRE(pair.second->poll(b, progressed).isOk());
    REQUIRE_FALSE(deadline.expired());
  }
}

TEST_CASE("cuda_ipc moves device buffers both ways - odd sizes - several chunks", "[cudafake][cuda_ipc]") {
  ScopedEnv env{{"SHOAL_CUDA_IPC_FIFO_BYTES", "262144"}};
  PairWorld world;
  ConnPair pair = world.connect(3);
  CHECK(world.transport->movesDeviceMemory());
  for (size_t bytes : {size_t{1}, size_t{32768 + 5}, size_t{3u << 20}}) {
    std::vector<uint8_t> hostA(bytes), hostB(bytes), back(bytes);
    for (size_t i = 0; i < bytes; ++i) {
      hostA[i] = static_cast<uint8_t>(i * 31 + 7);
      hostB[i] = static_cast<uint8_t>(i * 17 + 3);
    }
    CUdeviceptr sendA = 0, sendB = 0, recvA = 0, recvB = 0;
    for (CUdeviceptr* p : {&sendA, &sendB, &recvA, &recvB}) REQUIRE(cuMemAlloc(p, bytes) == CUDA_SUCCESS);
    REQUIRE(cuMemcpyHtoD(sendA, hostA.data(), bytes) == CUDA_SUCCESS);
    REQUIRE(cuMemcpyHtoD(sendB, hostB.data(), bytes) == CUDA_SUCCESS);
    auto* pa = reinterpret_cast<void*>(sendA);
    auto* pb = reinterpret_cast<void*>(sendB);
    REQUIRE(pair.first->postSend(pa, bytes, 42, 1).isOk());
    REQUIRE(pair.second->postSend(pb, bytes, 43, 2).isOk());
    REQUIRE(pair.first->postRecv(reinterpret_cast<void*>(recvA), bytes, 43, 3).isOk());
    REQUIRE(pair.second->postRecv(reinterpret_cast<void*>(recvB), bytes, 42, 4).isOk());
    std::vector<Completion> a, b;
    pumpUntilDone(pair, 2, 2, a, b);
    REQUIRE(cuMemcpyDtoH(back.data(), recvB, bytes) == CUDA_SUCCESS);
    CHECK(back == hostA);
    REQUIRE(cuMemcpyDtoH(back.data(), recvA, bytes) == CUDA_SUCCESS);
    CHECK(back == hostB);
    for (CUdeviceptr p : {sendA, sendB, recvA, recvB}) cuMemFree(p);
  }
}

TEST_CASE("cuda_ipc refuses a hello signed with another secret", "[cudafake][cuda_ipc]") {
  PairWorld world;
  auto pair = world.tryConnect(0, "secret", "other secret", 3000);
  REQUIRE_FALSE(pair.isOk());
  INFO(pair.status().toString());
  CHECK(pair.status().code() == Code::kInvalidUsage);
  CHECK_THAT(pair.status().message(), Catch::Contains("secret"));
}

TEST_CASE("cuda_ipc: a forged hello for a connection is dropped and the real one still connects", "[cudafake][cuda_ipc]") {
  PairWorld world;
  const uint64_t id = freshCommId();
  ConnectOptions forged{&world.a, &world.b, "not the secret", Deadline::afterMs(5000)};
  ConnectOptions oa{&world.a, &world.b, "secret", Deadline::afterMs(5000)};
  ConnectOptions ob{&world.b, &world.a, "secret", Deadline::afterMs(5000)};
  auto fake = world.transport->connect({id, 0, 1, 0}, forged);  // arrives first, same key
  REQUIRE(fake.isOk());
  auto ca = world.transport->connect({id, 0, 1, 0}, oa);
  REQUIRE(ca.isOk());
  auto cb = world.transport->connect({id, 1, 0, 0}, ob);
  INFO(cb.status().toString());
  REQUIRE(cb.isOk());
  ConnPair pair{std::move(ca).value(), std::move(cb).value()};
  uint64_t sent = 0x5eed, got = 0;
  REQUIRE(pair.first->postSend(&sent, sizeof sent, 9, 1).isOk());
  REQUIRE(pair.second->postRecv(&got, sizeof got, 9, 2).isOk());
  std::vector<Completion> a, b;
  pumpUntilDone(pair, 1, 1, a, b);
  CHECK(got == sent);
}

TEST_CASE("cuda_ipc: a receive whose chunk was published completes after the sender has left", "[cudafake][cuda_ipc]") {
  PairWorld world;
  ConnPair pair = world.connect(0);
  std::vector<uint8_t> src(100000), dst(100000, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 13 + 1);
  REQUIRE(pair.first->postSend(src.data(), src.size(), 9, 1).isOk());
  REQUIRE(pair.second->postRecv(dst.data(), dst.size(), 9, 2).isOk());
  std::vector<Completion> a, b;
  Deadline deadline = Deadline::afterMs(20000);
  while (a.empty()) {  // the sender alone, until its one chunk is published
    bool progressed = false;
    REQUIRE(pair.first->poll(a, progressed).isOk());
    REQUIRE_FALSE(deadline.expired());
  }
  // Every GPU copy now takes 30 ms: the receiver polls many times while its
  // copy out runs, after the sender destroyed its end.
  shoalFakeCudaSetStreamDelayMs(30);
  pair.first.reset();
  while (b.empty()) {
    bool progressed = false;
    Status st = pair.second->poll(b, progressed);
    INFO(st.toString());
    REQUIRE(st.isOk());
    REQUIRE_FALSE(deadline.expired());
  }
  shoalFakeCudaSetStreamDelayMs(0);
  CHECK(dst == src);
  // With nothing posted, a peer that left on purpose is not an error.
  CHECK(pair.second->checkAlive().isOk());
}

TEST_CASE("cuda_ipc: the higher rank waits for the lower one's hello until its deadline", "[cudafake][cuda_ipc]") {
  PairWorld world;
  ConnectOptions ob{&world.b, &world.a, "secret", Deadline::afterMs(300)};
  auto cb = world.transport->connect({freshCommId(), 1, 0, 0}, ob);
  REQUIRE_FALSE(cb.isOk());
  CHECK(cb.status().code() == Code::kTimeout);
  CHECK_THAT(cb.status().message(), Catch::Contains("rank 0"));
  CHECK(world.transport->connectWaitsForPeer({1, 1, 0, 0}));
  CHECK_FALSE(world.transport->connectWaitsForPeer({1, 0, 1, 0}));
}

int openFds() {
  int n = 0;
  for (int fd = 0; fd < 4096; ++fd)
    if (::fcntl(fd, F_GETFD) != -1) ++n;
  return n;
}

// The lower rank's hello for a connection its peer never makes (the peer's
// communicator destroyed or aborted first) goes when that rank is
// forgotten: its descriptors are closed and the sender's liveness look
// learns of it, not at the hello's expiry (the set-up deadline) at a later
// accept.
TEST_CASE("cuda_ipc: a hello its rank never claimed goes when the rank is forgotten", "[cudafake][cuda_ipc]") {
  PairWorld world;
  const int before = openFds();
  const uint64_t id = freshCommId();
  auto ca = world.transport->connect({id, 0, 1, 0}, ConnectOptions{&world.a, &world.b, "secret", Deadline::afterMs(5000)});
  REQUIRE(ca.isOk());
  CHECK(ca.value()->checkAlive().isOk());
  world.transport->forgetRank(id, 0);  // another rank: kept
  CHECK(ca.value()->checkAlive().isOk());
  world.transport->forgetRank(id, 1);
  Status alive = ca.value()->checkAlive();
  INFO(alive.toString());
  CHECK(alive.code() == Code::kRemoteError);
  CHECK_THAT(alive.message(), Catch::Contains("its communicator ended before it connected"));
  ca.value().reset();
  CHECK(openFds() == before);
}

TEST_CASE("cuda_ipc connects ranks of device communicators in other processes of this kernel only", "[cudafake][cuda_ipc]") {
  PairWorld world;
  Transport& t = *world.transport;
  CHECK(t.canConnect(world.a, world.b));
  CHECK_FALSE(t.chosenByDefault(world.a));  // staged buffers are host memory: shm moves them better
  PeerInfo same = world.b;
  same.processId = world.a.processId;
  CHECK_FALSE(t.canConnect(world.a, same));  // one process: loopback
  PeerInfo hostOnly = world.b;
  hostOnly.gpu.clear();
  CHECK_FALSE(t.canConnect(world.a, hostOnly));
  PeerInfo otherKernel = world.b;
  otherKernel.kernelId = "another kernel";
  CHECK_FALSE(t.canConnect(world.a, otherKernel));
  PeerInfo unknownGpu = world.b;
  unknownGpu.gpu = "GPU-00000000-0000-0000-0000-000000000000";
  CHECK_FALSE(t.canConnect(world.a, unknownGpu));  // not a GPU of this process, so no peer access known
  PeerInfo noAddress = world.b;
  noAddress.addresses.clear();
  CHECK_FALSE(t.canConnect(world.a, noAddress));
}

TEST_CASE("cuda_ipc hello: round trip and refusals", "[cudafake][cuda_ipc]") {
  cuda_ipc::Hello h;
  h.commId = 0x1122334455667788ull;
  h.fromRank = 2;
  h.toRank = 5;
  h.channel = 3;
  h.slots = 8;
  h.slotBytes = 1 << 20;
  h.allocationBytes = 32 << 20;
  h.streamRing = true;
  REQUIRE(cuda_ipc::signHello(h, "s").isOk());
  uint8_t bytes[cuda_ipc::kHelloBytes];
  cuda_ipc::encodeHello(h, bytes);
  auto back = cuda_ipc::decodeHello(bytes);
  REQUIRE(back.isOk());
  CHECK(back.value().commId == h.commId);
  CHECK(back.value().fromRank == 2);
  CHECK(back.value().toRank == 5);
  CHECK(back.value().channel == 3);
  CHECK(back.value().slots == 8);
  CHECK(back.value().slotBytes == (1u << 20));
  CHECK(back.value().allocationBytes == (32u << 20));
  CHECK(back.value().streamRing);
  CHECK(cuda_ipc::verifyHello(back.value(), "s"));
  CHECK_FALSE(cuda_ipc::verifyHello(back.value(), "t"));
  // A changed field no longer matches the proof.
  cuda_ipc::Hello tampered = back.value();
  tampered.slotBytes = 2 << 20;
  CHECK_FALSE(cuda_ipc::verifyHello(tampered, "s"));
  tampered = back.value();
  tampered.streamRing = false;  // the flag is signed too
  CHECK_FALSE(cuda_ipc::verifyHello(tampered, "s"));
  // Malformed hellos are refused.
  uint8_t bad[cuda_ipc::kHelloBytes];
  std::memcpy(bad, bytes, sizeof bad);
  bad[0] ^= 1;
  CHECK_FALSE(cuda_ipc::decodeHello(bad).isOk());  // magic
  cuda_ipc::Hello wrong = h;
  wrong.slots = 0;
  cuda_ipc::encodeHello(wrong, bad);
  CHECK_FALSE(cuda_ipc::decodeHello(bad).isOk());
  wrong = h;
  wrong.toRank = wrong.fromRank;
  cuda_ipc::encodeHello(wrong, bad);
  CHECK_FALSE(cuda_ipc::decodeHello(bad).isOk());
  wrong = h;
  wrong.slotBytes = 1ull << 40;
  cuda_ipc::encodeHello(wrong, bad);
  CHECK_FALSE(cuda_ipc::decodeHello(bad).isOk());
  wrong = h;
  wrong.allocationBytes = 16 << 20;  // cannot hold four lanes of 8 slots of 1 MiB
  cuda_ipc::encodeHello(wrong, bad);
  CHECK_FALSE(cuda_ipc::decodeHello(bad).isOk());
  std::memcpy(bad, bytes, sizeof bad);
  bad[27] = 0x80;  // an unknown flag
  CHECK_FALSE(cuda_ipc::decodeHello(bad).isOk());
}

}  // namespace
}  // namespace shoal
