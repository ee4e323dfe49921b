// Group: NCCL's ncclGroupStart/ncclGroupEnd semantics: a thread-local depth,
// only the outermost end runs anything, an end outside a group is
// ncclInvalidUsage, and an argument error is returned at once by the call
// inside the group, leaving the group as it was.
//
// Role: a thread-local builder. Inside a group, operations are recorded per
// communicator and deferred inits are recorded; the outermost end runs the
// inits (concurrently, so one thread can init every rank of a communicator),
// then submits one job per communicator (its operations merged into one plan)
// and waits for all of them, pumping the engine — so one thread can drive
// several communicators, as ncclCommInitAll users do.
// Thread-safety: all state is thread-local; nothing is shared.
#pragma once

#include <functional>
#include <memory>

#include "comm/communicator.h"
#include "core/status.h"

namespace shoal::group {

bool active();
int depth();
void start();
// Closes one level; the outermost runs everything recorded. Returns
// kInProgress when nonblocking communicators still work in the background.
Status end();
// Like end() but runs nothing: discards the operations and returns the
// tuner's time estimate in microseconds (ncclGroupSimulateEnd).
Result<float> simulateEnd();

// Records an operation inside the current group.
void addOp(const std::shared_ptr<Communicator>& comm, OpRequest op);
// Records an init to run at the outermost end.
void addInit(std::function<Status()> init);
// Records collective set-up work over an existing communicator (`key`: its
// splits, its window registrations) to run at the outermost end with the
// inits: one communicator's run one after another in call order (their
// exchanges over its bootstrap must meet the peers' in the same order),
// different communicators' concurrently. Each runs; the first error is the
// group's.
void addOrderedInit(const void* key, std::function<Status()> work);

}  // namespace shoal::group
