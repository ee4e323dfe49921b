// The transport conformance suite on the loopback transport (the reference
// semantics), plus loopback's own fault plan.
#include <catch2/catch.hpp>

#include "core/tag.h"
#include "transports/loopback/loopback_transport.h"
#include "transport/conformance.h"

using namespace shoal;
using shoal::testing::runConformanceSuite;
using shoal::testing::TransportUnderTest;

TEST_CASE("loopback conformance", "[loopback][conformance]") {
  runConformanceSuite(TransportUnderTest{
      .name = "loopback",
      .makePair = [](int) { return makeLoopbackPair("rank 0 (loopback)", "rank 1 (loopback)"); }});
}

TEST_CASE("loopback fault plan parses and rejects bad specs", "[loopback]") {
  auto f = LoopbackFaults::parse("delay_us=50,reorder_seed=7,fail_nth=3,blackhole_nth=9");
  REQUIRE(f.isOk());
  REQUIRE(f->delayUs == 50);
  REQUIRE(f->reorderSeed == 7);
  REQUIRE(f->failNth == 3);
  REQUIRE(f->blackholeNth == 9);
  REQUIRE(LoopbackFaults::parse("nonsense=1").status().code() == Code::kInvalidArgument);
  REQUIRE(LoopbackFaults::parse("delay_us").status().code() == Code::kInvalidArgument);
}

TEST_CASE("loopback fail_nth fails the connection at that message", "[loopback]") {
  LoopbackFaults faults;
  faults.failNth = 2;
  auto [a, b] = makeLoopbackPair("rank 0", "rank 1", faults);
  char buf[8] = {};
  uint64_t tag = encodeTag(CollKind::kSend, DataType::kInt8, 8, 0, -1, 0);
  REQUIRE(a->postSend(buf, 8, tag, 1).isOk());
  Status second = a->postSend(buf, 8, tag, 2);
  REQUIRE(second.code() == Code::kRemoteError);
  REQUIRE(second.message().find("injected failure") != std::string::npos);
}

TEST_CASE("loopback delay holds delivery until the delay passes", "[loopback]") {
  LoopbackFaults faults;
  faults.delayUs = 20000;
  auto [a, b] = makeLoopbackPair("rank 0", "rank 1", faults);
  char in[4] = {1, 2, 3, 4}, out[4] = {};
  uint64_t tag = encodeTag(CollKind::kSend, DataType::kInt8, 4, 0, -1, 0);
  // Bounds tied to the delay itself, not to how fast this thread runs: the
  // message is never delivered before the delay has passed since the send,
  // and it is delivered (within a generous 2 s) after.
  const int64_t sent = nowNs();
  REQUIRE(a->postSend(in, 4, tag, 1).isOk());
  REQUIRE(b->postRecv(out, 4, tag, 2).isOk());
  std::vector<Completion> done;
  bool moved = false;
  while (done.empty() && nowNs() - sent < 2'000'000'000) {
    REQUIRE(b->poll(done, moved).isOk());
    if (done.empty()) REQUIRE(out[3] == 0);  // nothing lands before its completion
  }
  REQUIRE(done.size() == 1);
  CHECK(nowNs() - sent >= static_cast<int64_t>(faults.delayUs) * 1000);
  REQUIRE(out[3] == 4);
}
