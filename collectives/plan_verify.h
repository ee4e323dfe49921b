// The plan verifier and the reference simulator (docs/design.md, Plans).
//
// Role: tests and debug builds check plans with these before trusting them; both
// are pure functions of the plans (no I/O, no engine, no transport), callable
// from any thread.
//
// verifyPlans() takes one plan per rank (index = rank) and checks:
//   structure    dependencies in range and pointing to earlier steps (so the graph
//                is acyclic); lanes consistent with the steps; each step's buffers
//                belong to its op; sizes and offsets multiples of the element size;
//                kScaleSrc only on Reduce/Copy of a kPreMulSum op; Divide only for
//                an op with a divisor.
//   peers        every Send/Recv peer in range and not this rank, except the steps
//                of a Send/Recv op whose peer is this rank (self p2p); p2p ops use
//                kP2pChannel and collectives never do.
//   bounds       every slice inside its buffer (sizes from collectives/layout.h,
//                scratch from scratchBytes/scratchOffsets); no step writes a send
//                buffer.
//   races        no two steps that may run concurrently (neither reaches the other
//                through dependencies) write the same byte, or one writes a byte
//                the other reads. With options.inPlace, send and recv share
//                addresses at NCCL's in-place offsets, which covers out-of-place
//                calls too (builders order steps as if in place whatever the
//                shape's placement). Inside a step, dst equals or is disjoint
//                from its sources.
//   output       every byte of recv that the collective defines on the rank is
//                written by some step.
//   matching     the k-th Send on lane (r -> p, channel c) meets the k-th Recv on
//                lane (p <- r, c), with equal byte counts, for every lane,
//                collective and p2p (self lanes included).
//   progress     the plans run to completion when every message is a rendezvous
//                (a Send completes only when its Recv is posted) and each lane is
//                posted in step order, as the engine posts it: no deadlock,
//                whatever buffering the transports offer.
// verifyPlan() runs the checks that need only one rank (all but matching and
// progress).
//
// simulatePlans() executes every rank's plan on real memory: an in-memory FIFO
// per lane, a step runs when its dependencies are done (ready steps run in a
// seeded random order), a Recv takes the matching Send's bytes. Send and recv
// buffers are caller memory and may alias at NCCL's in-place offset (unless the
// op's shape says disjointBuffers); scratch is allocated here and filled with
// garbage first. It reports a deadlock, a size mismatch, an out-of-bounds
// slice or buffers that overlap where they may not as an error.
#pragma once

#include <cstdint>
#include <vector>

#include "collectives/plan.h"
#include "core/status.h"

namespace shoal {

struct VerifyOptions {
  bool inPlace = true;     // race check with send/recv aliased as in an in-place call
  bool checkProgress = true;
};

Status verifyPlan(const Plan& plan, const VerifyOptions& options = {});
Status verifyPlans(const std::vector<PlanPtr>& plansByRank);
Status verifyPlans(const std::vector<PlanPtr>& plansByRank, const VerifyOptions& options);

// The element-wise arithmetic the simulator applies; the signatures match
// shoal::reduce::combine/scale/divide (src/reduce/reduce.h), so the real reducer
// plugs in: SimReducer{&reduce::combine, &reduce::scale, &reduce::divide}.
struct SimReducer {
  void (*combine)(ReduceOp op, DataType dtype, void* dst, const void* a, const void* b,
                  size_t count, const void* scalar);
  void (*scale)(DataType dtype, void* dst, const void* src, size_t count, const void* scalar);
  void (*divide)(DataType dtype, void* dst, const void* src, size_t count, uint64_t divisor);
};
// Dependency-free reference arithmetic: integers wrap; half and bfloat16 compute in
// float and round to nearest even; fp8 is not supported (copies are).
const SimReducer& fallbackReducer();

// One op's user memory on one rank. send and recv may point into one allocation
// (in place). Sizes must be at least those of collectives/layout.h.
struct SimOpBuffers {
  void* send = nullptr;
  void* recv = nullptr;
  const void* scalar = nullptr;  // kPreMulSum: one element of the op's dtype
};

struct SimOptions {
  const SimReducer* reducer = nullptr;  // nullptr: fallbackReducer()
  uint64_t seed = 1;                    // order of ready steps
};

// buffersByRank[r][k]: rank r's buffers for op k of its plan.
Status simulatePlans(const std::vector<PlanPtr>& plansByRank,
                     const std::vector<std::vector<SimOpBuffers>>& buffersByRank,
                     const SimOptions& options = {});

}  // namespace shoal
