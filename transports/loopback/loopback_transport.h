// Loopback transport: connections between ranks that live in one process.
//
// Role: the reference semantics of a Connection (docs/design.md, Transports), the fake under
// every in-process test, and the real transport of ncclCommInitAll and of
// ranks run as threads (bench/perf -t N). A message is copied once, straight
// from the sender's buffer into the matched receive.
//
// Fault injection (SHOAL_LOOPBACK_FAULTS, or LoopbackFaults in tests):
//   delay_us=N      a message becomes deliverable N us after it was posted
//   reorder_seed=S  seeded random stalls of individual lanes, so that matches on
//                   different lanes complete in shuffled order
//   fail_nth=N      the N-th message posted on a pipe fails its connection
//   blackhole_nth=N the N-th message on a pipe is accepted and never delivered
//                   (the receiver must hit its no-progress deadline)
// connect() never blocks: one thread may set up every rank (ncclCommInitAll).
#pragma once

#include <cstdint>
#include <memory>

#include "transports/transport.h"

namespace shoal {

struct LoopbackFaults {
  int64_t delayUs = 0;
  uint64_t reorderSeed = 0;
  int64_t failNth = 0;
  int64_t blackholeNth = 0;
  static Result<LoopbackFaults> parse(const std::string& spec);
};

std::unique_ptr<Transport> makeLoopbackTransport();

// Makes a connected pair directly (tests): a.first talks to a.second.
std::pair<std::unique_ptr<Connection>, std::unique_ptr<Connection>> makeLoopbackPair(
    const std::string& descriptionA, const std::string& descriptionB,
    const LoopbackFaults& faults = {});

// Replaces the process-wide fault plan (tests; not thread-safe with traffic).
void setLoopbackFaults(const LoopbackFaults& faults);

}  // namespace shoal
