// Group: NCCL's ncclGroupStart/ncclGroupEnd semantics: a thread-local depth,
// only the outermost end runs anything, an end outside a group is
// ncclInvalidUsage, and a call that fails inside the group (a bad argument,
// a failed communicator) makes the whole group fail: the outermost end runs
// none of it and returns that error, so no rank waits on half a group.
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
// Like end() but runs no operation: runs the inits, discards the operations
// and returns the tuner's time estimate in microseconds (ncclGroupSimulateEnd).
Result<float> simulateEnd();

// Records an operation inside the current group. A group's operations on
// one communicator run as one merged plan, which holds at most
// kMaxMergedOps (about 358 million, beyond what a process holds): one more
// is an invalid usage (and fails the group, as any refused call in it).
Status addOp(const std::shared_ptr<Communicator>& comm, OpRequest op);
// What a deferred init does when its group fails before it ran: tell the
// handle it made why (it was given out at the call).
using Abandon = std::function<void(const Status& why)>;
// Records an init to run at the outermost end.
void addInit(std::function<Status()> init, Abandon abandon = {});
// Records a nonblocking communicator's init: the outermost end starts it
// (on the handle's own thread) and returns ncclInProgress, as NCCL does,
// instead of waiting for it.
void addDetachedInit(std::function<void()> start, Abandon abandon = {});
// Records collective set-up work over an existing communicator (`key`: its
// splits, its window registrations) to run at the outermost end with the
// inits: one communicator's run one after another in call order (their
// exchanges over its bootstrap must meet the peers' in the same order),
// different communicators' concurrently. Each runs; the first error is the
// group's.
void addOrderedInit(const void* key, std::function<Status()> work, Abandon abandon = {});
// Records that `function`, called inside the group, failed (NCCL's group
// error): the outermost end (or simulated end) then runs nothing, abandons
// the inits and returns the last such error's code (as NCCL), naming them all.
void fail(const char* function, const Status& why);

}  // namespace shoal::group
