// The stream ring (transports/stream_ring) on the driver stand-in, through
// the loopback transport's connect path (ranks that are threads of one
// process): messages of many chunks both ways in order with the exact
// bytes, the ring wrapping; a mismatched tag or size named by verify();
// release() letting a stream that waits for a message never sent go on, and
// refusing more; no ring where stream links were not agreed or to oneself;
// the ring's memory freed once both ends are gone.
#include <catch2/catch.hpp>

#include <cuda.h>
#include <stdlib.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <vector>

#include "cuda/driver.h"
#include "cudafake/device0.h"
#include "cudafake/fake_cuda.h"
#include "support/scoped_env.h"
#include "transports/loopback/loopback_transport.h"

namespace shoal {
namespace {

// The library loads the stand-in this binary links.
const bool kDriverNamed = setenv("SHOAL_CUDA_DRIVER", SHOAL_CUDAFAKE_LIB, 0) == 0;

#define CU_OK(call) REQUIRE((call) == CUDA_SUCCESS)

uint64_t freshCommId() {
  static std::atomic<uint64_t> next{0x5173a00000000000ull};
  return next++;
}

// Device 0's primary context current on this thread; its "GPU-<uuid>".
std::string useDevice0() {
  REQUIRE(kDriverNamed);
  return testing::makeDevice0Current();
}

// Ranks 0 and 1 as threads of one process on `gpu`.
struct ThreadRanks {
  PeerInfo a, b;
  explicit ThreadRanks(const std::string& gpu) {
    for (PeerInfo* p : {&a, &b}) {
      p->hostname = "here";
      p->hostId = "host";
      p->kernelId = "kernel";
      p->processId = 7;  // one process
      p->gpu = gpu;
    }
    a.rank = 0;
    b.rank = 1;
  }
};

// A loopback transport and two "threads" that connect through it.
struct LoopbackRanks {
  std::unique_ptr<Transport> transport = makeLoopbackTransport();
  ThreadRanks ranks{useDevice0()};
  // Rank `from`'s end of pipe `id` to the other rank.
  Result<std::unique_ptr<Connection>> connect(uint64_t id, int from, bool streamLinks = true) {
    PeerInfo& self = from == 0 ? ranks.a : ranks.b;
    PeerInfo& peer = from == 0 ? ranks.b : ranks.a;
    return transport->connect({id, from, 1 - from, 0},
                              ConnectOptions{&self, &peer, "", Deadline::afterMs(1000), streamLinks});
  }
};

CUstream newStream() {
  CUstream s = nullptr;
  CU_OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  return s;
}

// Two ends of one loopback pipe between "threads" of this process, each
// with a stream for its sends and one for its receives (a side's send may
// wait for a slot its peer frees only after its own receive).
struct RingPair {
  std::unique_ptr<Transport> transport = makeLoopbackTransport();
  ThreadRanks ranks{useDevice0()};
  PeerInfo& a = ranks.a;
  PeerInfo& b = ranks.b;
  std::unique_ptr<Connection> ends[2];
  CUstream sendStream[2] = {nullptr, nullptr}, recvStream[2] = {nullptr, nullptr};

  explicit RingPair(bool streamLinks = true) {
    const uint64_t id = freshCommId();
    ConnectOptions oa{&a, &b, "", Deadline::afterMs(10000), streamLinks};
    ConnectOptions ob{&b, &a, "", Deadline::afterMs(10000), streamLinks};
    auto ca = transport->connect({id, 0, 1, 0}, oa);
    INFO(ca.status().toString());
    REQUIRE(ca.isOk());
    auto cb = transport->connect({id, 1, 0, 0}, ob);
    INFO(cb.status().toString());
    REQUIRE(cb.isOk());
    ends[0] = std::move(ca).value();
    ends[1] = std::move(cb).value();
    for (int s = 0; s < 2; ++s) {
      sendStream[s] = newStream();
      recvStream[s] = newStream();
    }
  }
  ~RingPair() {
    for (int s = 0; s < 2; ++s) {
      cuStreamSynchronize(sendStream[s]);
      cuStreamSynchronize(recvStream[s]);
      cuStreamDestroy(sendStream[s]);
      cuStreamDestroy(recvStream[s]);
    }
  }
  StreamLink& link(int side) {
    StreamLink* l = ends[side]->streamLink();
    REQUIRE(l != nullptr);
    return *l;
  }
};

struct DeviceBytes {
  CUdeviceptr ptr = 0;
  size_t n = 0;
  explicit DeviceBytes(size_t bytes, uint8_t seed = 0) : n(bytes) {
    CU_OK(cuMemAlloc(&ptr, std::max<size_t>(n, 1)));
    std::vector<uint8_t> host(n);
    for (size_t i = 0; i < n; ++i) host[i] = static_cast<uint8_t>(seed + i * 7);
    if (n) CU_OK(cuMemcpyHtoD(ptr, host.data(), n));
  }
  ~DeviceBytes() { cuMemFree(ptr); }
  DeviceBytes(const DeviceBytes&) = delete;
  void* at() const { return reinterpret_cast<void*>(ptr); }
  std::vector<uint8_t> read() const {
    std::vector<uint8_t> host(n);
    if (n) CU_OK(cuMemcpyDtoH(host.data(), ptr, n));
    return host;
  }
};

bool finishes(CUstream s) {
  return cuStreamSynchronize(s) == CUDA_SUCCESS;
}

}  // namespace

TEST_CASE("loopback stream ring: messages of many chunks both ways arrive in order with their bytes",
          "[cudafake][stream_ring]") {
  // 8 KiB slots: the larger messages take many chunks and wrap the ring.
  testing::ScopedEnv env{{"SHOAL_LOOPBACK_RING_BYTES", "65536"}};
  RingPair pair;
  const size_t sizes[] = {1, 8192, 8193, 100000, 0, 250001};
  std::vector<std::unique_ptr<DeviceBytes>> sent[2], received[2];
  for (int from = 0; from < 2; ++from) {
    const int to = 1 - from;
    uint64_t tag = 100 * (from + 1);
    for (size_t bytes : sizes) {
      sent[from].push_back(std::make_unique<DeviceBytes>(bytes, static_cast<uint8_t>(bytes + from)));
      received[from].push_back(std::make_unique<DeviceBytes>(bytes, 0xee));
      REQUIRE(pair.link(from).enqueueSend(sent[from].back()->at(), bytes, tag, pair.sendStream[from]).isOk());
      REQUIRE(pair.link(to).enqueueRecv(received[from].back()->at(), bytes, tag, pair.recvStream[to]).isOk());
      ++tag;
    }
  }
  for (int s = 0; s < 2; ++s) {
    REQUIRE(finishes(pair.sendStream[s]));
    REQUIRE(finishes(pair.recvStream[s]));
  }
  for (int from = 0; from < 2; ++from)
    for (size_t m = 0; m < std::size(sizes); ++m) {
      INFO("from side " << from << ", message " << m << " of " << sizes[m] << " bytes");
      CHECK(received[from][m]->read() == sent[from][m]->read());
    }
  for (int s = 0; s < 2; ++s) {
    CHECK(pair.link(s).verify().isOk());
    const StreamLink::Progress p = pair.link(s).progress();
    CHECK(p.sent == p.sendEnqueued);
    CHECK(p.received == p.recvEnqueued);
    CHECK(p.sendEnqueued > 2 * 8u);  // wrapped the 8 slots
  }
}

TEST_CASE("loopback stream ring: a receive expecting another tag or size is named by verify()",
          "[cudafake][stream_ring]") {
  RingPair pair;
  DeviceBytes src(4096, 1), dst(4096);
  REQUIRE(pair.link(0).enqueueSend(src.at(), 4096, 11, pair.sendStream[0]).isOk());
  REQUIRE(pair.link(1).enqueueRecv(dst.at(), 4096, 12, pair.recvStream[1]).isOk());
  REQUIRE(finishes(pair.sendStream[0]));
  REQUIRE(finishes(pair.recvStream[1]));
  Status st = pair.link(1).verify();
  INFO(st.toString());
  CHECK(st.code() == Code::kInvalidUsage);
  CHECK(st.message().find("message mismatch on the stream ring") != std::string::npos);
  CHECK(st.message().find("4096 bytes") != std::string::npos);
}

TEST_CASE("loopback stream ring: release() lets a stream waiting for a message never sent go on, for good",
          "[cudafake][stream_ring]") {
  RingPair pair;
  DeviceBytes dst(1024);
  REQUIRE(pair.link(1).enqueueRecv(dst.at(), 1024, 5, pair.recvStream[1]).isOk());
  // Nothing comes: the stream waits.
  CHECK(cuStreamQuery(pair.recvStream[1]) == CUDA_ERROR_NOT_READY);
  pair.link(1).release();
  CHECK(finishes(pair.recvStream[1]));
  // Broken for both ends: nothing more is enqueued, verify() says so.
  DeviceBytes src(1024, 3);
  Status send = pair.link(0).enqueueSend(src.at(), 1024, 6, pair.sendStream[0]);
  CHECK(send.code() == Code::kRemoteError);
  CHECK(send.message().find("stream ring is broken") != std::string::npos);
  CHECK_FALSE(pair.link(0).verify().isOk());
}

TEST_CASE("loopback has no stream ring where stream links were not agreed, nor to oneself", "[cudafake][stream_ring]") {
  RingPair none(/*streamLinks=*/false);
  CHECK(none.ends[0]->streamLink() == nullptr);
  CHECK(none.ends[1]->streamLink() == nullptr);
  auto transport = makeLoopbackTransport();
  ConnectOptions self{&none.a, &none.a, "", Deadline::afterMs(1000), true};
  auto own = transport->connect({freshCommId(), 0, 0, 0}, self);
  REQUIRE(own.isOk());
  CHECK(own.value()->streamLink() == nullptr);
}

// A failure on one end of a pipe fails the other end at once: its connect,
// or its operations (the ring broken), never their deadline.
TEST_CASE("a loopback end that fails to make or match the stream ring fails the other end at once",
          "[cudafake][stream_ring]") {
  LoopbackRanks loopback;
  SECTION("the first end cannot allocate the ring") {
    const uint64_t id = freshCommId();
    shoalFakeCudaFailNth("cuMemCreate", 1);
    auto first = loopback.connect(id, 0);
    shoalFakeCudaFailNth("cuMemCreate", 0);
    REQUIRE_FALSE(first.isOk());
    // Asked again, the same end does not take its own failed pipe for the peer's.
    auto again = loopback.connect(id, 0);
    REQUIRE_FALSE(again.isOk());
    CHECK(again.status().message().find("an earlier connect failed") != std::string::npos);
    auto second = loopback.connect(id, 1);
    REQUIRE_FALSE(second.isOk());
    INFO(second.status().toString());
    CHECK(second.status().message().find("the peer's end failed") != std::string::npos);
  }
  SECTION("the second end would have no ring") {
    const uint64_t id = freshCommId();
    auto first = loopback.connect(id, 0);
    REQUIRE(first.isOk());
    auto second = loopback.connect(id, 1, /*streamLinks=*/false);
    REQUIRE_FALSE(second.isOk());
    CHECK(second.status().message().find("one end has a stream ring and the other none") != std::string::npos);
    // The first end's ring is broken and its connection failed.
    StreamLink* link = first.value()->streamLink();
    REQUIRE(link != nullptr);
    CUstream s = newStream();
    DeviceBytes src(64, 1);
    Status sent = link->enqueueSend(src.at(), 64, 1, s);
    CHECK(sent.message().find("stream ring is broken") != std::string::npos);
    std::vector<Completion> done;
    bool progressed = false;
    REQUIRE(first.value()->postSend(src.at(), 64, 1, 1).code() == Code::kInvalidUsage);
    // Nothing of it pending: a poll has nothing to fail, every post fails.
    CHECK(first.value()->poll(done, progressed).isOk());
    CHECK(first.value()->postRecv(src.at(), 64, 1, 2).code() == Code::kInvalidUsage);
    cuStreamDestroy(s);
  }
}

TEST_CASE("a loopback stream ring's memory is freed once both ends are gone", "[cudafake][stream_ring]") {
  useDevice0();
  const int before = shoalFakeCudaLiveAllocations();
  {
    RingPair pair;
    CHECK(shoalFakeCudaLiveAllocations() > before);  // FIFOs, words, header logs
    DeviceBytes src(20000, 9), dst(20000);
    REQUIRE(pair.link(0).enqueueSend(src.at(), 20000, 1, pair.sendStream[0]).isOk());
    REQUIRE(pair.link(1).enqueueRecv(dst.at(), 20000, 1, pair.recvStream[1]).isOk());
    REQUIRE(finishes(pair.recvStream[1]));
    CHECK(dst.read() == src.read());
    pair.ends[0].reset();  // one end gone: the other's ring memory stays
    REQUIRE(pair.link(1).verify().isOk());
  }
  CHECK(shoalFakeCudaLiveAllocations() == before);
}

}  // namespace shoal

namespace shoal {
namespace {

// An end whose peer never connects (its rank destroyed or aborted before its
// first call) gives the ring's memory back when it closes. A pipe it never
// used goes; one it used, or whose operation failed, stays, failed, so that
// a late peer fails at once instead of waiting alone for its deadline (one
// that only sent whole messages on the ring keeps them for the peer: below).
TEST_CASE("a loopback end whose peer never came gives back the ring's memory", "[cudafake][stream_ring]") {
  LoopbackRanks loopback;
  const int before = shoalFakeCudaLiveAllocations();
  enum Use { kUnused, kPosted, kFailed };
  for (Use use : {kUnused, kPosted, kFailed}) {
    INFO((use == kUnused ? "unused" : use == kPosted ? "a receive posted" : "its operation failed"));
    const uint64_t id = freshCommId();
    auto first = loopback.connect(id, 0);
    REQUIRE(first.isOk());
    CHECK(shoalFakeCudaLiveAllocations() > before);
    uint8_t byte = 0;
    if (use == kPosted) REQUIRE(first.value()->postRecv(&byte, 1, 1, 1).isOk());
    if (use == kFailed) first.value()->quiesce();
    first.value().reset();
    CHECK(shoalFakeCudaLiveAllocations() == before);
    // The peer, late: a fresh pipe it would wait on alone, or the failure.
    auto late = loopback.connect(id, 1);
    if (use == kUnused) {
      REQUIRE(late.isOk());
      late.value().reset();
    } else {
      REQUIRE_FALSE(late.isOk());
      CHECK(late.status().message().find("closed by the other end") != std::string::npos);
    }
    CHECK(shoalFakeCudaLiveAllocations() == before);
  }
}

// An end that sent whole messages on the ring and closed before its peer
// connected (a rank whose Send fit in the ring, whose thread then destroyed
// its communicator) leaves them there: the late peer connects and receives
// them. A rank that never comes is forgotten by its communicator's end
// (Transport::forgetRank): the pipe and its ring memory go, and a later
// connect to it fails.
TEST_CASE("messages a loopback end left on the ring reach its late peer, or go with it", "[cudafake][stream_ring]") {
  LoopbackRanks loopback;
  const int before = shoalFakeCudaLiveAllocations();
  for (const bool peerComes : {true, false}) {
    INFO((peerComes ? "the peer comes late" : "the peer never comes"));
    const uint64_t id = freshCommId();
    DeviceBytes src(20000, 5), dst(20000);
    {
      auto sender = loopback.connect(id, 0);
      REQUIRE(sender.isOk());
      CUstream s = newStream();
      StreamLink* link = sender.value()->streamLink();
      REQUIRE(link != nullptr);
      REQUIRE(link->enqueueSend(src.at(), 20000, 7, s).isOk());
      REQUIRE(finishes(s));  // whole in the ring
      CU_OK(cuStreamDestroy(s));
    }
    if (peerComes) {
      auto late = loopback.connect(id, 1);
      INFO(late.status().toString());
      REQUIRE(late.isOk());
      CUstream s = newStream();
      StreamLink* link = late.value()->streamLink();
      REQUIRE(link != nullptr);
      REQUIRE(link->enqueueRecv(dst.at(), 20000, 7, s).isOk());
      REQUIRE(finishes(s));
      CHECK(dst.read() == src.read());
      CHECK(link->verify().isOk());
      CHECK(late.value()->checkAlive().isOk());  // nothing owed: the sender left its message
      CU_OK(cuStreamDestroy(s));
    } else {
      CHECK(shoalFakeCudaLiveAllocations() > before);  // kept for the peer
      loopback.transport->forgetRank(id, 0);  // the maker: nothing of it waits
      CHECK(shoalFakeCudaLiveAllocations() > before);
      loopback.transport->forgetRank(id, 1);
    }
  }
  CHECK(shoalFakeCudaLiveAllocations() == before);
  // A rank whose communicator ended before this one connected: the connect
  // fails at once, with no pipe made that nobody would take.
  const uint64_t id = freshCommId();
  loopback.transport->forgetRank(id, 1);
  auto toGone = loopback.connect(id, 0);
  REQUIRE_FALSE(toGone.isOk());
  CHECK(toGone.status().message().find("its communicator ended") != std::string::npos);
  CHECK(shoalFakeCudaLiveAllocations() == before);
}

}  // namespace
}  // namespace shoal
