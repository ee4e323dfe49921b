#include "transport/conformance.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <set>
#include <vector>

#include <unistd.h>

#include "core/clock.h"
#include "core/tag.h"

namespace shoal::testing {
namespace {

// One end of a pair under test, with what it has completed and its first error.
struct End {
  Connection* conn;
  std::vector<Completion> done;
  Status status;

  bool failed() const { return !status.isOk(); }
  bool hasToken(uint64_t token) const {
    return std::any_of(done.begin(), done.end(), [&](const Completion& c) { return c.token == token; });
  }
};

// Pumps both ends (a failed end is left alone) until `finished` or the deadline.
// Returns false on the deadline.
bool pumpUntil(End& a, End& b, const std::function<bool()>& finished, int64_t ms = kSuiteDeadlineMs) {
  Deadline deadline = Deadline::afterMs(ms);
  Backoff backoff;
  while (!finished()) {
    if (deadline.expired()) return false;
    bool progressed = false;
    if (!a.failed()) a.status = a.conn->poll(a.done, progressed);
    if (!b.failed()) b.status = b.conn->poll(b.done, progressed);
    if (progressed) backoff.reset();
    else backoff.pause();
  }
  return true;
}

// Pumps until both ends have nothing pending (or one fails); requires success.
void pumpToCompletion(End& a, End& b) {
  bool finished = pumpUntil(a, b, [&] {
    return a.failed() || b.failed() || (a.conn->pending() == 0 && b.conn->pending() == 0);
  });
  INFO("a: " << a.status.toString() << " / b: " << b.status.toString());
  REQUIRE(a.status.isOk());
  REQUIRE(b.status.isOk());
  REQUIRE(finished);
}

uint64_t splitmix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

void fillPattern(std::vector<uint8_t>& buffer, uint64_t seed) {
  size_t words = buffer.size() / 8;
  for (size_t i = 0; i < words; ++i) {
    uint64_t v = splitmix(seed * 1000003 + i);
    std::memcpy(buffer.data() + 8 * i, &v, 8);
  }
  for (size_t i = words * 8; i < buffer.size(); ++i) buffer[i] = static_cast<uint8_t>(splitmix(seed + i));
}

uint64_t tagFor(uint64_t bytes, uint64_t seq) {
  return encodeTag(CollKind::kAllReduce, DataType::kUint8, bytes, 0, -1, seq);
}

// A batch of messages from `from` to `to`, posted in order on both ends.
struct Batch {
  std::vector<std::vector<uint8_t>> sent, received;
  std::vector<uint64_t> sizes;
  uint64_t tokenBase;

  Batch(std::vector<uint64_t> messageSizes, uint64_t seed, uint64_t firstToken)
      : sizes(std::move(messageSizes)), tokenBase(firstToken) {
    for (size_t i = 0; i < sizes.size(); ++i) {
      sent.emplace_back(sizes[i]);
      fillPattern(sent.back(), seed + i);
      received.emplace_back(sizes[i], 0xEE);
    }
  }
  void postSends(Connection& c) {
    for (size_t i = 0; i < sizes.size(); ++i)
      REQUIRE(c.postSend(sent[i].data(), sizes[i], tagFor(sizes[i], i), tokenBase + i).isOk());
  }
  void postRecvs(Connection& c) {
    for (size_t i = 0; i < sizes.size(); ++i) postRecv(c, i);
  }
  void postRecv(Connection& c, size_t i) {
    REQUIRE(c.postRecv(received[i].data(), sizes[i], tagFor(sizes[i], i), tokenBase + 1000000 + i).isOk());
  }
  void check(const End& sender, const End& receiver) const {
    for (size_t i = 0; i < sizes.size(); ++i) {
      INFO("message " << i << " of " << sizes[i] << " bytes");
      REQUIRE(sender.hasToken(tokenBase + i));
      REQUIRE(receiver.hasToken(tokenBase + 1000000 + i));
      REQUIRE((sizes[i] == 0 || std::memcmp(sent[i].data(), received[i].data(), sizes[i]) == 0));
    }
    for (const Completion& c : receiver.done)
      if (c.token >= tokenBase + 1000000 && c.token < tokenBase + 1000000 + sizes.size())
        REQUIRE(c.bytes == sizes[c.token - tokenBase - 1000000]);
  }
};

}  // namespace

void runConformanceSuite(const TransportUnderTest& transport) {
  INFO("transport " << transport.name);
  auto pair = transport.makePair(0);
  REQUIRE(pair.first);
  REQUIRE(pair.second);
  End a{pair.first.get(), {}, {}};
  End b{pair.second.get(), {}, {}};

  SECTION("poll with nothing to do") {
    for (int i = 0; i < 1000; ++i) {
      bool progressed = false;
      REQUIRE(a.conn->poll(a.done, progressed).isOk());
      REQUIRE(b.conn->poll(b.done, progressed).isOk());
      REQUIRE_FALSE(progressed);
    }
    REQUIRE(a.done.empty());
    REQUIRE(b.done.empty());
    REQUIRE(a.conn->pending() == 0);
    REQUIRE(b.conn->pending() == 0);
    REQUIRE_FALSE(a.conn->peerDescription().empty());
  }

  SECTION("many messages matched in order, both directions") {
    std::vector<uint64_t> sizes;
    for (int i = 0; i < 300; ++i) sizes.push_back(static_cast<uint64_t>((i * 37) % 2001));
    Batch ab(sizes, 1, 0), ba(sizes, 2, 10000000);
    ab.postSends(*a.conn);
    ba.postSends(*b.conn);
    ab.postRecvs(*b.conn);
    ba.postRecvs(*a.conn);
    REQUIRE(a.conn->pending() == 600);
    pumpToCompletion(a, b);
    ab.check(a, b);
    ba.check(b, a);
    REQUIRE(a.done.size() == 600);
    REQUIRE(b.done.size() == 600);
  }

  SECTION("zero-byte messages") {
    Batch ab({0, 0, 5, 0, 1, 0}, 3, 0);
    ab.postRecvs(*b.conn);
    ab.postSends(*a.conn);
    pumpToCompletion(a, b);
    ab.check(a, b);
    // A zero-byte message with a null pointer is fine too.
    REQUIRE(a.conn->postSend(nullptr, 0, tagFor(0, 99), 77).isOk());
    REQUIRE(b.conn->postRecv(nullptr, 0, tagFor(0, 99), 78).isOk());
    pumpToCompletion(a, b);
    REQUIRE(a.hasToken(77));
    REQUIRE(b.hasToken(78));
  }

  SECTION("large messages, both directions at once, with a data check") {
    Batch ab({transport.largeBytes}, 4, 0);
    Batch ba({transport.largeBytes / 8 + 7}, 5, 100);
    ab.postSends(*a.conn);
    ba.postSends(*b.conn);
    ba.postRecvs(*a.conn);
    ab.postRecvs(*b.conn);
    pumpToCompletion(a, b);
    ab.check(a, b);
    ba.check(b, a);
  }

  SECTION("interleaved small and large sizes") {
    std::vector<uint64_t> sizes = {0,      1,          7,       4096,     8191,      8192,  8193, 65536,
                                   131072, 131073,     3,       1 << 20,  (1 << 20) + 5, 0, 12345, 262144 + 1,
                                   24,     4 << 20,    17,      100000,   2,         9000000, 524288, 524289};
    Batch ab(sizes, 6, 0);
    std::reverse(sizes.begin(), sizes.end());
    Batch ba(sizes, 7, 100);
    ab.postSends(*a.conn);
    ba.postRecvs(*a.conn);
    ab.postRecvs(*b.conn);
    ba.postSends(*b.conn);
    pumpToCompletion(a, b);
    ab.check(a, b);
    ba.check(b, a);
  }

  SECTION("receives posted late: the sender runs ahead") {
    std::vector<uint64_t> sizes;
    for (int i = 0; i < 40; ++i) sizes.push_back(i % 4 == 3 ? 1u << 20 : static_cast<uint64_t>(i * 100));
    Batch ab(sizes, 8, 0);
    ab.postSends(*a.conn);
    // Only the sender is pumped for a while: nothing may be lost or reordered.
    pumpUntil(a, b, [] { return false; }, 200);
    REQUIRE(a.status.isOk());
    REQUIRE(b.done.empty());
    for (size_t i = 0; i < sizes.size(); ++i) {
      ab.postRecv(*b.conn, i);
      bool finished = pumpUntil(a, b, [&] { return a.failed() || b.failed() || b.hasToken(1000000 + i); });
      INFO("message " << i << ": " << b.status.toString());
      REQUIRE(b.status.isOk());
      REQUIRE(finished);
    }
    pumpToCompletion(a, b);
    ab.check(a, b);
  }

  SECTION("tag mismatch fails with kInvalidUsage naming the peer and both tags") {
    std::vector<uint8_t> out(64, 1), in(64, 0);
    uint64_t sentTag = encodeTag(CollKind::kAllReduce, DataType::kFloat32, 16, 0, -1, 5);
    uint64_t postedTag = encodeTag(CollKind::kBroadcast, DataType::kFloat32, 16, 0, 0, 5);
    REQUIRE(a.conn->postSend(out.data(), out.size(), sentTag, 1).isOk());
    REQUIRE(b.conn->postRecv(in.data(), in.size(), postedTag, 2).isOk());
    bool finished = pumpUntil(a, b, [&] { return b.failed(); });
    REQUIRE(finished);
    const Status& s = b.status;
    INFO(s.toString());
    REQUIRE(s.code() == Code::kInvalidUsage);
    REQUIRE_THAT(s.message(), Catch::Contains(b.conn->peerDescription()));
    REQUIRE_THAT(s.message(), Catch::Contains(describeTag(sentTag)));
    REQUIRE_THAT(s.message(), Catch::Contains(describeTag(postedTag)));
    REQUIRE_FALSE(b.hasToken(2));
    // The failure is sticky.
    bool progressed = false;
    REQUIRE(b.conn->poll(b.done, progressed).code() == Code::kInvalidUsage);
    // The connections go before the buffers of the send that never
    // completed (a transport whose copies run on their own may read it).
    pair = {};
  }

  SECTION("size mismatch fails with kInvalidUsage") {
    uint64_t sentBytes = GENERATE(as<uint64_t>{}, 100, 3u << 20);
    uint64_t postedBytes = GENERATE(as<uint64_t>{}, 200, 4096);
    std::vector<uint8_t> out(sentBytes, 1), in(postedBytes, 0);
    uint64_t tag = tagFor(1, 1);
    REQUIRE(a.conn->postSend(out.data(), sentBytes, tag, 1).isOk());
    REQUIRE(b.conn->postRecv(in.data(), postedBytes, tag, 2).isOk());
    bool finished = pumpUntil(a, b, [&] { return b.failed(); });
    REQUIRE(finished);
    INFO(b.status.toString());
    REQUIRE(b.status.code() == Code::kInvalidUsage);
    REQUIRE_THAT(b.status.message(), Catch::Contains(b.conn->peerDescription()));
    REQUIRE_THAT(b.status.message(), Catch::Contains(std::to_string(sentBytes)));
    REQUIRE_THAT(b.status.message(), Catch::Contains(std::to_string(postedBytes)));
    pair = {};  // before the buffers, as above
  }

  SECTION("after quiesce() no later poll moves a posted operation's bytes, and posts fail") {
    // A job that ended without its messages: later jobs' polls of this
    // connection must not write into its buffers (their owner was told the
    // operation is over) nor read from them.
    Batch warmup({10}, 9, 0);
    warmup.postSends(*a.conn);
    warmup.postRecvs(*b.conn);
    pumpToCompletion(a, b);
    std::vector<uint8_t> in(1000, 7), out(1000, 3);
    REQUIRE(b.conn->postRecv(in.data(), in.size(), tagFor(1000, 1), 5).isOk());
    b.conn->quiesce();
    a.status = a.conn->postSend(out.data(), out.size(), tagFor(1000, 1), 6);  // may fail at once (loopback)
    for (int i = 0; i < 200; ++i) {  // both ends polled, whatever they answer
      bool progressed = false;
      (void)a.conn->poll(a.done, progressed);
      (void)b.conn->poll(b.done, progressed);
      if (i % 20 == 19) ::usleep(1000);
    }
    CHECK(std::count(in.begin(), in.end(), 7) == 1000);  // untouched
    CHECK_FALSE(b.hasToken(5));
    std::vector<uint8_t> late(10);
    CHECK_FALSE(b.conn->postRecv(late.data(), late.size(), tagFor(10, 2), 7).isOk());
    pair = {};  // before the buffers
  }

  SECTION("a destroyed peer is an error naming it, not a hang") {
    // Something moves first, so the pair is known to work.
    Batch warmup({10}, 9, 0);
    warmup.postSends(*a.conn);
    warmup.postRecvs(*b.conn);
    pumpToCompletion(a, b);
    pair.second.reset();
    std::vector<uint8_t> in(1000), out(4 << 20, 3);
    REQUIRE(a.conn->postRecv(in.data(), in.size(), tagFor(1000, 1), 5).isOk());
    Status posted = a.conn->postSend(out.data(), out.size(), tagFor(out.size(), 1), 6);
    Deadline deadline = Deadline::afterMs(kSuiteDeadlineMs);
    Status s = posted;
    std::vector<Completion> done;
    while (s.isOk() && !deadline.expired()) {
      bool progressed = false;
      s = a.conn->poll(done, progressed);
    }
    INFO(s.toString());
    REQUIRE_FALSE(s.isOk());
    REQUIRE(s.code() == Code::kRemoteError);
    REQUIRE_THAT(s.message(), Catch::Contains(a.conn->peerDescription()));
  }
}

}  // namespace shoal::testing
