// Transport conformance suite: the behaviour every Connection must have,
// written once and run on every transport (docs/design.md, Style: one behaviour suite).
//
// How to use it for a transport: describe how to make a connected pair and
// call runConformanceSuite from one Catch2 TEST_CASE:
//
//   TEST_CASE("loopback conformance", "[loopback][conformance]") {
//     runConformanceSuite(TransportUnderTest{
//         .name = "loopback",
//         .makePair = [](int channel) { return makeLoopbackPair("rank 1", "rank 0"); }});
//   }
//
// runConformanceSuite() holds one Catch2 SECTION per behaviour; Catch2 re-runs
// the TEST_CASE once per section, so makePair is called afresh for every
// behaviour. Pairs are pumped by hand from the test thread (both ends, in
// turn), so a transport must make progress on one end without the other end's
// poll() running at the same moment (true of every non-blocking transport).
//
// Behaviours: ordered matching of many messages in both directions, zero-byte
// messages, 64 MiB messages with a data check, interleaved sizes, a tag
// mismatch and a size mismatch failing with kInvalidUsage that names the peer
// and both tags, receives posted late (sender far ahead), poll() with nothing
// to do, and a destroyed peer becoming an error (not a hang). Every wait is
// bounded by a deadline (kSuiteDeadlineMs per behaviour).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "transports/transport.h"

namespace shoal::testing {

struct TransportUnderTest {
  std::string name;
  // A connected pair on `channel`: first is rank 0's end (its peer is rank 1),
  // second is rank 1's end.
  std::function<std::pair<std::unique_ptr<Connection>, std::unique_ptr<Connection>>(int channel)> makePair;
  // Largest message the suite sends (64 MiB by default).
  uint64_t largeBytes = 64ull << 20;
};

inline constexpr int64_t kSuiteDeadlineMs = 60000;

void runConformanceSuite(const TransportUnderTest& transport);

}  // namespace shoal::testing
