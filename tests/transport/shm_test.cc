// shm transport: the conformance suite through the real connect path (both
// ends in this process, which the transport cannot tell from two processes:
// it names segments by pid and probes single-copy reads against itself), in
// both large-message modes and with a small ring that forces wrap-around and
// streaming; plus set-up, secrets, stale segments and dead peers.
#include <catch2/catch.hpp>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <thread>
#include <vector>

#include "core/params.h"
#include "memory/shared_memory.h"
#include "support/scoped_env.h"
#include "transport/conformance.h"
#include "transports/shm/shm_connection.h"
#include "transports/shm/shm_segment.h"
#include "transports/shm/shm_transport.h"

namespace shoal {
namespace {

using testing::TransportUnderTest;
using ConnPair = std::pair<std::unique_ptr<Connection>, std::unique_ptr<Connection>>;

using testing::ScopedEnv;

uint64_t freshCommId() {
  static std::atomic<uint64_t> next{0x5eed000000000000ull ^ static_cast<uint64_t>(getpid()) << 20};
  return next++;
}

struct PairWorld {
  std::unique_ptr<Transport> transport = makeShmTransport();
  PeerInfo a, b;
  PairWorld() {
    std::string address = transport->localAddress().value();
    a.rank = 0;
    b.rank = 1;
    a.hostname = b.hostname = "here";
    a.hostId = b.hostId = "host";
    a.processId = 1;  // two "processes" as far as canConnect can tell
    b.processId = 2;
    a.addresses = {{"shm", address}};
    b.addresses = {{"shm", address}};
  }
  ConnPair connect(int channel, const std::string& secretA = "secret", const std::string& secretB = "secret",
                   int64_t deadlineMs = 10000) {
    uint64_t id = freshCommId();
    ConnectOptions oa{&a, &b, secretA, Deadline::afterMs(deadlineMs), true, Deadline::afterMs(deadlineMs)};
    ConnectOptions ob{&b, &a, secretB, Deadline::afterMs(deadlineMs), true, Deadline::afterMs(deadlineMs)};
    auto ca = transport->connect({id, 0, 1, static_cast<uint16_t>(channel)}, oa);
    REQUIRE(ca.isOk());
    auto cb = transport->connect({id, 1, 0, static_cast<uint16_t>(channel)}, ob);
    REQUIRE(cb.isOk());
    return {std::move(ca).value(), std::move(cb).value()};
  }
  // connect(channel), then one poll of each side: the opener maps the
  // segment, the creator sees it attached.
  ConnPair attached(int channel) {
    ConnPair pair = connect(channel);
    std::vector<Completion> done;
    bool progressed = false;
    REQUIRE(pair.second->poll(done, progressed).isOk());
    REQUIRE(pair.first->poll(done, progressed).isOk());
    return pair;
  }
};

TransportUnderTest shmUnderTest(const char* name) {
  return TransportUnderTest{.name = name, .makePair = [](int channel) {
                              static PairWorld world;
                              return world.connect(channel);
                            }};
}

TEST_CASE("shm conformance / single copy", "[shm][conformance]") {
  ScopedEnv env{{"SHOAL_SHM_CMA", "1"}};
  testing::runConformanceSuite(shmUnderTest("shm single copy"));
}

TEST_CASE("shm conformance / copy through the segment", "[shm][conformance]") {
  ScopedEnv env{{"SHOAL_SHM_CMA", "0"}};
  testing::runConformanceSuite(shmUnderTest("shm copy-through"));
}

TEST_CASE("shm conformance / small ring and small single-copy threshold", "[shm][conformance]") {
  ScopedEnv env{{"SHOAL_SHM_FIFO_BYTES", "65536"}, {"SHOAL_SHM_CMA_MIN_BYTES", "100"}};
  testing::runConformanceSuite(shmUnderTest("shm small ring"));
}

// Pumps both ends until both report `want` completions or a deadline passes.
Status pumpUntil(ConnPair& pair, size_t wantA, size_t wantB, std::vector<Completion>& doneA,
                 std::vector<Completion>& doneB, int64_t ms = 10000) {
  Deadline deadline = Deadline::afterMs(ms);
  while (doneA.size() < wantA || doneB.size() < wantB) {
    bool progressed = false;
    SHOAL_TRY(pair.first->poll(doneA, progressed));
    SHOAL_TRY(pair.second->poll(doneB, progressed));
    if (deadline.expired()) return error(Code::kTimeout, "pumpUntil deadline");
  }
  return Status::ok();
}

// Posts one receive and polls until the connection fails (or 5 s pass).
Status receiveUntilError(Connection& connection) {
  static int sink = 0;
  SHOAL_TRY(connection.postRecv(&sink, sizeof(sink), 1, 1));
  std::vector<Completion> done;
  Deadline guard = Deadline::afterMs(5000);
  while (!guard.expired()) {
    bool progressed = false;
    SHOAL_TRY(connection.poll(done, progressed));
  }
  return Status::ok();
}

TEST_CASE("shm single copy is used for large messages and moves data", "[shm]") {
  ScopedEnv env{{"SHOAL_SHM_CMA", "1"}, {"SHOAL_SHM_CMA_MIN_BYTES", "4096"}};
  PairWorld world;
  auto pair = world.connect(0);
  std::vector<uint32_t> src(1 << 20), dst(1 << 20, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint32_t>(i * 2654435761u);
  REQUIRE(pair.first->postSend(src.data(), src.size() * 4, 7, 1).isOk());
  REQUIRE(pair.second->postRecv(dst.data(), dst.size() * 4, 7, 2).isOk());
  std::vector<Completion> a, b;
  REQUIRE(pumpUntil(pair, 1, 1, a, b).isOk());
  CHECK(dst == src);
  auto* shm = dynamic_cast<shm::ShmConnection*>(pair.first.get());
  REQUIRE(shm != nullptr);
  CHECK(shm->singleCopyToPeer());
}

TEST_CASE("shm writes a small send when it is posted, a large one when polled", "[shm]") {
  ScopedEnv env{{"SHOAL_SHM_CMA", "0"}};
  PairWorld world;
  auto pair = world.connect(0);
  std::vector<Completion> a, b;
  // Attach both ends with one message.
  uint64_t first = 1;
  uint64_t got = 0;
  REQUIRE(pair.first->postSend(&first, sizeof(first), 1, 1).isOk());
  REQUIRE(pair.second->postRecv(&got, sizeof(got), 1, 2).isOk());
  REQUIRE(pumpUntil(pair, 1, 1, a, b).isOk());
  REQUIRE(got == 1);

  // Small (up to 4 KiB): the receiver completes while the sender never polls.
  std::vector<uint8_t> small(4096), smallIn(4096, 0);
  for (size_t i = 0; i < small.size(); ++i) small[i] = static_cast<uint8_t>(i * 7 + 3);
  REQUIRE(pair.first->postSend(small.data(), small.size(), 2, 3).isOk());
  REQUIRE(pair.second->postRecv(smallIn.data(), smallIn.size(), 2, 4).isOk());
  std::vector<Completion> done;
  bool moved = false;
  REQUIRE(pair.second->poll(done, moved).isOk());
  REQUIRE(done.size() == 1);
  CHECK(done[0].token == 4);
  CHECK(smallIn == small);
  // The send still completes through the sender's next poll, exactly once.
  done.clear();
  REQUIRE(pair.first->poll(done, moved).isOk());
  REQUIRE(done.size() == 1);
  CHECK(done[0].token == 3);
  CHECK(pair.first->pending() == 0);
  done.clear();
  REQUIRE(pair.first->poll(done, moved).isOk());
  CHECK(done.empty());

  // Larger: nothing reaches the ring until the sender polls.
  std::vector<uint8_t> large(4097, 9), largeIn(4097, 0);
  REQUIRE(pair.first->postSend(large.data(), large.size(), 3, 5).isOk());
  REQUIRE(pair.second->postRecv(largeIn.data(), largeIn.size(), 3, 6).isOk());
  done.clear();
  REQUIRE(pair.second->poll(done, moved).isOk());
  CHECK(done.empty());
  a.clear();
  b.clear();
  REQUIRE(pumpUntil(pair, 1, 1, a, b).isOk());
  CHECK(largeIn == large);
}

TEST_CASE("shm with SHOAL_SHM_CMA=0 never reads the peer directly", "[shm]") {
  ScopedEnv env{{"SHOAL_SHM_CMA", "0"}};
  PairWorld world;
  auto pair = world.connect(0);
  std::vector<Completion> a, b;
  int x = 1, y = 0;
  REQUIRE(pair.first->postSend(&x, sizeof(x), 1, 1).isOk());
  REQUIRE(pair.second->postRecv(&y, sizeof(y), 1, 1).isOk());
  REQUIRE(pumpUntil(pair, 1, 1, a, b).isOk());
  CHECK(y == 1);
  CHECK_FALSE(dynamic_cast<shm::ShmConnection*>(pair.first.get())->singleCopyToPeer());
}

TEST_CASE("shm segment made with another secret is refused", "[shm]") {
  PairWorld world;
  auto pair = world.connect(0, "right", "wrong");
  std::vector<Completion> done;
  bool progressed = false;
  Status s = pair.second->poll(done, progressed);
  REQUIRE_FALSE(s.isOk());
  CHECK_THAT(s.message(), Catch::Contains("wrong secret"));
}

TEST_CASE("shm opener whose creator never comes fails at the deadline naming it", "[shm]") {
  PairWorld world;
  uint64_t id = freshCommId();
  ConnectOptions ob{&world.b, &world.a, "secret", Deadline::afterMs(200), true, Deadline::afterMs(200)};
  auto cb = world.transport->connect({id, 1, 0, 0}, ob);
  REQUIRE(cb.isOk());
  Status s = receiveUntilError(*cb.value());
  REQUIRE_FALSE(s.isOk());
  CHECK_THAT(s.message(), Catch::Contains("rank 0") && Catch::Contains("did not attach"));
}

TEST_CASE("shm carries a failing side's reason to its peer", "[shm]") {
  PairWorld world;
  auto pair = world.attached(0);
  CHECK(pair.first->carriesFailureReports());
  CHECK(pair.second->peerFailure().empty());
  CHECK_FALSE(pair.second->peerFailureFinal());
  // A draft first: the failing side's own view, while it reads its upstream.
  pair.first->publishFailure("no progress waiting on rank 9 (host far)", /*final=*/false);
  CHECK(pair.second->peerFailure() == "no progress waiting on rank 9 (host far)");
  CHECK_FALSE(pair.second->peerFailureFinal());
  // What the failing side learns from its own upstream extends its report
  // (only appended: the peer may be reading it) and makes it final; another
  // report does not replace it.
  pair.first->publishFailure("no progress waiting on rank 9 (host far); rank 9 had failed first: rank 7 died",
                             /*final=*/true);
  CHECK(pair.second->peerFailureFinal());
  CHECK(pair.second->peerFailure() == "no progress waiting on rank 9 (host far); rank 9 had failed first: rank 7 died");
  pair.first->publishFailure("something else", /*final=*/true);
  CHECK(pair.second->peerFailure() == "no progress waiting on rank 9 (host far); rank 9 had failed first: rank 7 died");
  // Each side's report is its own.
  CHECK(pair.first->peerFailure().empty());
  CHECK_FALSE(pair.first->peerFailureFinal());
  pair.first.reset();  // closes its side
  Status s = receiveUntilError(*pair.second);
  REQUIRE_FALSE(s.isOk());
  CHECK_THAT(s.message(), Catch::Contains("it reported: no progress waiting on rank 9") &&
                              Catch::Contains("rank 7 died"));
}

TEST_CASE("shm keeps a chain of reports whole up to its bound", "[shm]") {
  PairWorld world;
  auto pair = world.attached(0);
  // Twenty ranks' views, each naming the one before it, the first cause last.
  std::string chain = "rank 0 died";
  for (int r = 1; r <= 20; ++r)
    chain = "comm 4f2a rank " + std::to_string(r) + "/64 (host node" + std::to_string(r) +
            "): AllReduce #12 (ring): no progress for 300000 ms waiting on: receive from rank " +
            std::to_string(r - 1) + " (host node" + std::to_string(r - 1) + ", shm pid 4242); rank " +
            std::to_string(r - 1) + " had failed first: " + chain;
  REQUIRE(chain.size() > 2048);
  REQUIRE(chain.size() <= shm::kReasonBytes);
  pair.first->publishFailure(chain, /*final=*/false);
  CHECK(pair.second->peerFailure() == chain);
  // Beyond the bound, the start is kept (the segment is only appended to).
  pair.first->publishFailure(chain + std::string(shm::kReasonBytes, '.'), /*final=*/true);
  CHECK(pair.second->peerFailureFinal());  // final even where the bound cut its tail
  CHECK(pair.second->peerFailure().size() == shm::kReasonBytes);
  CHECK_THAT(pair.second->peerFailure(), Catch::StartsWith(chain));
}

TEST_CASE("shm stale segments of dead processes are removed", "[shm]") {
  // A child process creates a segment and dies without unlinking it.
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    std::string name = shm::segmentName(getpid(), 42, 0, 1, 0);
    int fd = shm_open(name.c_str(), O_CREAT | O_RDWR, 0600);
    _exit(fd >= 0 ? 0 : 1);
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  std::string name = shm::segmentName(child, 42, 0, 1, 0);
  int fd = shm_open(name.c_str(), O_RDWR, 0600);
  REQUIRE(fd >= 0);
  close(fd);
  shm::removeStaleSegments();
  CHECK(shm_open(name.c_str(), O_RDWR, 0600) < 0);
}

TEST_CASE("shm a peer that exits with operations pending is an error naming it", "[shm]") {
  // Connect to a pid that is gone: the transport must not wait for it.
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) _exit(0);
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  PairWorld world;
  shm::Address ghost{child, "boot", 0x1000, 1};
  world.a.addresses = {{"shm", shm::formatAddress(ghost)}};
  ConnectOptions ob{&world.b, &world.a, "secret", Deadline::afterMs(60000)};
  auto cb = world.transport->connect({freshCommId(), 1, 0, 0}, ob);
  REQUIRE(cb.isOk());
  Status s = receiveUntilError(*cb.value());
  REQUIRE_FALSE(s.isOk());
  CHECK_THAT(s.message(), Catch::Contains("rank 0") && Catch::Contains("has exited"));
}

TEST_CASE("shm memory: pre-touching pages keeps every byte - shared allocations start zeroed and map alike",
          "[shm]") {
  constexpr size_t kBytes = 5 * 4096 + 123;  // pages and a tail
  std::vector<uint8_t> data(kBytes);
  for (size_t i = 0; i < kBytes; ++i) data[i] = static_cast<uint8_t>(i * 31 + 7);
  const std::vector<uint8_t> before = data;
  memory::prefaultPages(data.data(), data.size(), memory::PageAccess::kWrite);
  memory::prefaultPages(data.data(), data.size(), memory::PageAccess::kRead);
  REQUIRE(data == before);

  auto allocated = memory::allocateShared(kBytes);
  REQUIRE(allocated.isOk());
  auto* p = static_cast<uint8_t*>(allocated.value());
  CHECK(std::all_of(p, p + kBytes, [](uint8_t b) { return b == 0; }));
  std::memcpy(p, before.data(), kBytes);
  auto where = memory::findShared(p, kBytes);
  REQUIRE(where.has_value());
  const uint8_t* mapped = memory::mapPeerAllocation(getpid(), where->sequence);  // as a peer would
  REQUIRE(mapped != nullptr);
  CHECK(std::memcmp(mapped + where->offset, before.data(), kBytes) == 0);
  CHECK(memory::freeShared(p));
}

TEST_CASE("shm addresses round trip and reject garbage", "[shm]") {
  shm::Address a{1234, "b00t-1d", 0xdeadbeef, 0x1234};
  auto back = shm::parseAddress(shm::formatAddress(a));
  REQUIRE(back.isOk());
  CHECK(back.value().pid == 1234);
  CHECK(back.value().bootId == "b00t-1d");
  CHECK(back.value().probeAddress == 0xdeadbeef);
  CHECK(back.value().probeValue == 0x1234);
  CHECK_FALSE(shm::parseAddress("nonsense").isOk());
  CHECK_FALSE(shm::parseAddress("-1:x:1:1").isOk());
}

TEST_CASE("shm canConnect needs the same host and boot and another process", "[shm]") {
  PairWorld world;
  CHECK(world.transport->canConnect(world.a, world.b));
  PeerInfo other = world.b;
  other.hostId = "elsewhere";
  CHECK_FALSE(world.transport->canConnect(world.a, other));
  other = world.b;
  other.processId = world.a.processId;
  CHECK_FALSE(world.transport->canConnect(world.a, other));
  {
    ScopedEnv env{{"NCCL_SHM_DISABLE", "1"}};
    CHECK_FALSE(world.transport->canConnect(world.a, world.b));
  }
}

TEST_CASE("PeerInfo carries the kernel id - ranks on one kernel are told apart from other hosts", "[shm]") {
  PeerInfo a;
  a.rank = 3;
  a.hostname = "node0";
  a.hostId = "node0";
  a.processId = 77;
  a.kernelId = "b00t-1d";
  a.gpu = "GPU-00000000-0000-0000-0000-000000000001";
  a.addresses = {{"tcp", "10.0.0.1:5"}, {"ofi", "xyz"}};
  Result<PeerInfo> back = PeerInfo::deserialize(a.serialize());
  REQUIRE(back.isOk());
  CHECK(back->rank == 3);
  CHECK(back->hostId == "node0");
  CHECK(back->processId == 77);
  CHECK(back->kernelId == "b00t-1d");
  CHECK(back->gpu == a.gpu);
  CHECK(back->addresses == a.addresses);
  // A record from a writer that knew no GPU (it ends after the kernel id)
  // reads as a host rank.
  std::string noGpu = a.serialize();
  noGpu.resize(noGpu.size() - sizeof(uint32_t) - a.gpu.size());
  Result<PeerInfo> noGpuBack = PeerInfo::deserialize(noGpu);
  REQUIRE(noGpuBack.isOk());
  CHECK(noGpuBack->kernelId == "b00t-1d");
  CHECK(noGpuBack->gpu.empty());
  // A record from a writer that had no kernel id (it ends after the
  // addresses) reads as none, and none is never the same kernel.
  std::string old = noGpu;
  old.resize(old.size() - sizeof(uint32_t) - a.kernelId.size());
  Result<PeerInfo> oldBack = PeerInfo::deserialize(old);
  REQUIRE(oldBack.isOk());
  CHECK(oldBack->kernelId.empty());
  CHECK(oldBack->addresses == a.addresses);
  CHECK_FALSE(oldBack->sameKernel(*oldBack));
  CHECK_FALSE(PeerInfo::deserialize(old + "xy").isOk());  // a torn field is an error

  // Emulated nodes: other host ids, one kernel.
  PeerInfo b = a;
  b.hostId = "node1";
  CHECK(a.sameKernel(b));
  CHECK(a.sharesCpusWith(b));
  b.kernelId = "another-boot";
  CHECK_FALSE(a.sameKernel(b));
  CHECK_FALSE(a.sharesCpusWith(b));
  b.hostId = a.hostId;
  CHECK(a.sharesCpusWith(b));  // one host id: one machine as far as the user said
}

// --- performance (hidden: run with "[perf]")

// Both ends exchange a message at once, each on its own thread, as the two
// ranks of a small AllReduce do; only the connection's poll in between, no
// engine. Prints the mean time per exchange for frames of one to five
// cache lines, to tell the transport's share of small-message latency from
// the engine's.
TEST_CASE("shm exchange latency by message size", "[.][perf][shm]") {
  PairWorld world;
  ConnPair pair = world.connect(0);
  constexpr int kIters = 50000;
  for (uint64_t bytes : {8, 32, 40, 64, 96, 128, 256}) {
    std::vector<double> perExchangeUs(2);
    bool failures[2] = {false, false};
    auto side = [&](Connection& c, int who) {
      std::vector<uint8_t> out(bytes, static_cast<uint8_t>(who)), in(bytes);
      std::vector<Completion> done;
      int64_t start = 0;
      for (int i = 0; i < kIters + 1000; ++i) {
        if (i == 1000) start = nowNs();
        done.clear();
        // No assertion per poll: Catch2's cost would be what this measures.
        bool ok = c.postRecv(in.data(), bytes, 7, 1).isOk() && c.postSend(out.data(), bytes, 7, 2).isOk();
        while (ok && done.size() < 2) {
          bool progressed = false;
          ok = c.poll(done, progressed).isOk();
        }
        if (!ok) failures[who] = true;
      }
      perExchangeUs[who] = (nowNs() - start) / 1e3 / kIters;
    };
    std::thread other([&] { side(*pair.second, 1); });
    side(*pair.first, 0);
    other.join();
    REQUIRE_FALSE(failures[0]);
    REQUIRE_FALSE(failures[1]);
    printf("shm exchange %4llu B: %.3f us\n", static_cast<unsigned long long>(bytes), perExchangeUs[0]);
  }
}

}  // namespace
}  // namespace shoal

namespace shoal {
namespace {

// Receives `count` floats from pair.first into pair.second as a reduction:
// dst = received * 3 + other (received first, PreMulSum) or other * 3 + received.
void checkReducingReceive(ConnPair& pair, size_t count, bool receivedFirst, bool inPlace, uint64_t tag) {
  std::vector<float> sent(count), other(count), dst(count, -1.0f);
  for (size_t i = 0; i < count; ++i) {
    sent[i] = static_cast<float>(i % 1000) * 0.5f + 1.0f;
    other[i] = static_cast<float>(i % 777) * 0.25f - 3.0f;
  }
  const std::vector<float> otherBefore = other;
  const float scalar = 3.0f;
  ReduceOnReceive r;
  r.dst = reinterpret_cast<uint8_t*>(inPlace ? other.data() : dst.data());
  r.other = reinterpret_cast<const uint8_t*>(other.data());
  r.receivedFirst = receivedFirst;
  r.op = ReduceOp::kPreMulSum;
  r.dtype = DataType::kFloat32;
  r.scalar = &scalar;
  const uint64_t bytes = count * sizeof(float);
  REQUIRE(pair.second->reducesOnReceive(bytes));
  REQUIRE(pair.second->postRecvReduce(r, bytes, tag, 2).isOk());
  REQUIRE(pair.first->postSend(sent.data(), bytes, tag, 1).isOk());
  std::vector<Completion> a, b;
  REQUIRE(pumpUntil(pair, 1, 1, a, b).isOk());
  CHECK(b[0].token == 2);
  const std::vector<float>& got = inPlace ? other : dst;
  for (size_t i = 0; i < count; ++i) {
    float want = receivedFirst ? sent[i] * scalar + otherBefore[i] : otherBefore[i] * scalar + sent[i];
    INFO("element " << i << " of " << count);
    REQUIRE(got[i] == want);
  }
}

}  // namespace

TEST_CASE("shm reduces a receive out of its ring, in operand order, across frames and the ring's end",
          "[shm]") {
  // A 64 KiB ring: frames of at most 16 KiB, so 40 000 bytes take three
  // frames, and repeated messages wrap around the ring's end.
  ScopedEnv env{{"SHOAL_SHM_CMA", "0"}, {"SHOAL_SHM_FIFO_BYTES", "65536"}};
  PairWorld world;
  auto pair = world.connect(0);
  uint64_t first = 1, got = 0;
  std::vector<Completion> a, b;
  REQUIRE(pair.second->postRecv(&got, sizeof(got), 1, 1).isOk());
  REQUIRE(pair.first->postSend(&first, sizeof(first), 1, 1).isOk());
  REQUIRE(pumpUntil(pair, 1, 1, a, b).isOk());  // both ends attached
  uint64_t tag = 10;
  for (int round = 0; round < 4; ++round) {
    for (size_t count : {size_t{2}, size_t{7}, size_t{1024}, size_t{10000}}) {
      for (bool receivedFirst : {false, true}) {
        for (bool inPlace : {false, true}) {
          INFO("count " << count << " received first " << receivedFirst << " in place " << inPlace);
          checkReducingReceive(pair, count, receivedFirst, inPlace, ++tag);
        }
      }
    }
  }
}

TEST_CASE("shm reduces a receive that the peer sent by single copy (thresholds differ)", "[shm]") {
  PairWorld world;
  uint64_t id = freshCommId();
  ConnectOptions oa{&world.a, &world.b, "secret", Deadline::afterMs(10000)};
  ConnectOptions ob{&world.b, &world.a, "secret", Deadline::afterMs(10000)};
  ConnPair pair;
  {
    ScopedEnv env{{"SHOAL_SHM_CMA", "1"}, {"SHOAL_SHM_CMA_MIN_BYTES", "100"}};
    auto ca = world.transport->connect({id, 0, 1, 0}, oa);
    REQUIRE(ca.isOk());
    pair.first = std::move(ca).value();
  }
  {
    ScopedEnv env{{"SHOAL_SHM_CMA", "1"}, {"SHOAL_SHM_CMA_MIN_BYTES", "1048576"}};
    auto cb = world.transport->connect({id, 1, 0, 0}, ob);
    REQUIRE(cb.isOk());
    pair.second = std::move(cb).value();
  }
  uint64_t first = 1, got = 0;
  std::vector<Completion> a, b;
  REQUIRE(pair.second->postRecv(&got, sizeof(got), 1, 1).isOk());
  REQUIRE(pair.first->postSend(&first, sizeof(first), 1, 1).isOk());
  REQUIRE(pumpUntil(pair, 1, 1, a, b).isOk());
  auto* sender = dynamic_cast<shm::ShmConnection*>(pair.first.get());
  REQUIRE(sender != nullptr);
  REQUIRE(sender->singleCopyToPeer());
  // 4096 bytes: single copy by the sender's threshold, a frame by the receiver's.
  checkReducingReceive(pair, 1024, /*receivedFirst=*/false, /*inPlace=*/false, 20);
  checkReducingReceive(pair, 1024, /*receivedFirst=*/true, /*inPlace=*/true, 21);
}

}  // namespace shoal
