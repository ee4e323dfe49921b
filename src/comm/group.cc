#include "comm/group.h"

#include "comm/call_check.h"

#include <algorithm>
#include <thread>
#include <vector>

#include "collectives/plan.h"
#include "core/log.h"
#include "core/process.h"

namespace shoal::group {
namespace {

struct CommOps {
  std::shared_ptr<Communicator> comm;
  std::vector<OpRequest> ops;
};

struct GroupState {
  std::vector<CommOps> comms;  // in order of first use
  std::vector<std::function<Status()>> inits;
  std::vector<std::function<void()>> detachedInits;  // each starts itself
  std::vector<std::pair<const void*, std::vector<std::function<Status()>>>> ordered;  // by key, in order of first use
  std::vector<Abandon> abandons;  // of the inits and ordered works that have one
  Status failure;                 // the calls that failed inside the group
};

thread_local GroupState tGroup;
// Apart from tGroup: a trivially constructed thread_local is read without a
// thread-init guard, and every collective call asks whether a group is open
// (initial-exec: a plain load, not a call to __tls_get_addr; see core/log.cc).
[[gnu::tls_model("initial-exec")]] thread_local int tDepth = 0;

// A group in which a call failed runs none of its work, as in NCCL (each
// rank's group is all or nothing): the inits' handles learn why.
Status discard(GroupState& work) {
  for (auto& abandon : work.abandons) abandon(work.failure);
  return work.failure;
}

// Runs the functions concurrently (one thread each when several) and returns
// the first error: inits of one clique, or call checks, must not wait for
// each other on one thread.
Status runInits(std::vector<std::function<Status()>>& inits) {
  if (inits.size() == 1) return inits[0]();
  std::vector<Status> results(inits.size());
  std::vector<std::thread> threads;
  threads.reserve(inits.size());
  for (size_t i = 0; i < inits.size(); ++i)
    threads.emplace_back([&, i] {
      markLibraryThread();
      results[i] = inits[i]();
    });
  for (auto& t : threads) t.join();
  for (auto& s : results)
    if (!s.isOk()) return s;
  return Status::ok();
}

// The group's inits, and its communicators' ordered set-up work, all at once.
Status runDeferredInits(GroupState& work) {
  for (auto& [key, works] : work.ordered)
    work.inits.push_back([&works]() -> Status {
      // Every one runs (each is collective: the peers run theirs too, and a
      // split's handle learns its outcome only from it); the first error wins.
      Status first;
      for (auto& w : works)
        if (Status st = w(); !st.isOk() && first.isOk()) first = std::move(st);
      return first;
    });
  return work.inits.empty() ? Status::ok() : runInits(work.inits);
}

// Whether the group runs in stream order: every operation that has buffers
// agrees, on every communicator (an invalid argument where they mix), and
// those without (zero counts, called in stream order where they could be)
// take its kind, or where the group has none their communicator's last
// call's (a call may pass no buffer to classify by).
Result<bool> settleStreamOrder(std::vector<CommOps>& comms) {
  enum Kind { kNone, kHost, kOrdered };
  Kind group = kNone;
  std::vector<Kind> kinds;
  for (const auto& c : comms) {
    Kind kind = kNone;
    for (const OpRequest& op : c.ops) {
      if (op.noBuffers) continue;
      const Kind mine = op.streamOrdered ? kOrdered : kHost;
      if (kind != kNone && kind != mine)
        return invalidArgument(c.comm->describe(), ": a group mixes operations on memory CUDA knows "
                               "with operations on pageable host memory");
      kind = mine;
    }
    if (kind != kNone && group != kNone && kind != group)
      return invalidArgument("a group mixes communicators on memory CUDA knows with communicators "
                             "on pageable host memory");
    if (kind != kNone) group = kind;
    kinds.push_back(kind);
  }
  for (size_t i = 0; i < comms.size(); ++i) {
    Kind kind = kinds[i] != kNone ? kinds[i] : group;
    // A group of no bytes at all goes as each communicator's last call with
    // buffers went (its peers' groups may have buffers of that kind).
    if (kind == kNone && comms[i].comm->lastBufferKind() == 0) kind = kHost;
    for (OpRequest& op : comms[i].ops) {
      if (!op.noBuffers || kind == kNone || op.streamOrdered == (kind == kOrdered)) continue;
      if (kind == kHost) {
        op.streamOrdered = false;
        continue;
      }
      // One of no bytes is in stream order wherever it can be (its call
      // admitted its stream): this one was called with a Shoal host stream,
      // or with no CUDA context current.
      return invalidArgument(comms[i].comm->describe(), ": an operation of no bytes in a group of "
                             "operations in CUDA stream order was called with a Shoal host stream or "
                             "without a current CUDA context");
    }
  }
  if (group != kNone) return group == kOrdered;
  // Nothing but operations of no bytes, settled per communicator above:
  // the first's kind decides, and the others must agree.
  bool ordered = !comms.empty() && comms[0].ops[0].streamOrdered;
  for (const auto& c : comms)
    for (const OpRequest& op : c.ops)
      if (op.streamOrdered != ordered)
        return invalidArgument("a group mixes operations in CUDA stream order with host operations");
  return ordered;
}

// A group whose communicators all run in stream order: every submission is
// made first (the jobs of one thread's several ranks then wait in the engine
// together), then synchronous ones are waited for and copied back.
Status endStreamOrdered(std::vector<CommOps>& comms) {
  for (const auto& c : comms)
    if (!c.ops[0].streamOrdered)
      return invalidArgument("a group mixes communicators on memory CUDA knows with communicators "
                             "on pageable host memory");
  Status result;
  std::vector<std::pair<Communicator*, Communicator::StreamSubmission>> begun;
  if (comms.size() > 1)
    for (auto& c : comms)
      if (Status s = c.comm->connectAhead(c.ops); !s.isOk()) return s;
  for (auto& c : comms) {
    auto submission = c.comm->beginStreamOrdered(c.ops);
    if (!submission.isOk()) {
      if (result.isOk()) result = submission.takeStatus();
      continue;
    }
    begun.emplace_back(c.comm.get(), std::move(submission).value());
  }
  for (auto& [comm, submission] : begun) {
    Status st = comm->finishStreamOrdered(submission);
    if (!st.isOk() && result.isOk()) result = st;
  }
  return result;
}

}  // namespace

bool active() { return tDepth > 0; }
int depth() { return tDepth; }
void start() { ++tDepth; }

Status addOp(const std::shared_ptr<Communicator>& comm, OpRequest op) {
  for (auto& c : tGroup.comms)
    if (c.comm == comm) {
      if (c.ops.size() >= kMaxMergedOps)
        return invalidUsage(comm->describe(), ": a group holds at most ", kMaxMergedOps,
                            " operations per communicator (its merged plan numbers their buffers in 32 bits); "
                            "split it into several groups");
      c.ops.push_back(std::move(op));
      return Status::ok();
    }
  tGroup.comms.push_back({comm, {std::move(op)}});  // the one reference the group keeps
  return Status::ok();
}

void addInit(std::function<Status()> init, Abandon abandon) {
  tGroup.inits.push_back(std::move(init));
  if (abandon) tGroup.abandons.push_back(std::move(abandon));
}

void addDetachedInit(std::function<void()> start, Abandon abandon) {
  tGroup.detachedInits.push_back(std::move(start));
  if (abandon) tGroup.abandons.push_back(std::move(abandon));
}

void addOrderedInit(const void* key, std::function<Status()> work, Abandon abandon) {
  if (abandon) tGroup.abandons.push_back(std::move(abandon));
  for (auto& [k, works] : tGroup.ordered)
    if (k == key) {
      works.push_back(std::move(work));
      return;
    }
  tGroup.ordered.emplace_back(key, std::vector<std::function<Status()>>{});
  tGroup.ordered.back().second.push_back(std::move(work));
}

void fail(const char* function, const Status& why) {
  // NCCL's group error is the last failure's code; every failure is said,
  // in call order (the first is often the cause of the rest).
  const std::string said = tGroup.failure.isOk()
                               ? str("the group was not run, because ", function, " inside it failed: ", why.message())
                               : str(tGroup.failure.message(), "; then ", function, " failed: ", why.message());
  tGroup.failure = Status(why.code(), said);
}

namespace {

// Starts the group's nonblocking inits; whether there were any. The starts
// go with this call: one that starts nothing (its handle was destroyed)
// lets go of what its work held now, such as a split's turn that the
// group's later set-up work waits for.
bool startDetachedInits(GroupState& work) {
  std::vector<std::function<void()>> starts = std::move(work.detachedInits);
  work.detachedInits.clear();
  for (auto& start : starts) start();
  return !starts.empty();
}

// The group's operations, once its inits have run.
Status runOps(GroupState& work);

}  // namespace

Status end() {
  if (tDepth == 0) return invalidUsage("ncclGroupEnd: not in a group call (no matching ncclGroupStart)");
  if (--tDepth > 0) return Status::ok();
  GroupState work = std::move(tGroup);
  tGroup = GroupState{};
  if (!work.failure.isOk()) return discard(work);

  const bool initsInProgress = startDetachedInits(work);
  Status result = runDeferredInits(work);
  if (result.isOk()) result = runOps(work);
  if (result.isOk() && initsInProgress) return Status(Code::kInProgress, "");
  return result;
}

namespace {

// A Send to self is delivered only by a Recv from self in the same group
// (the merged plan holds both ends of the lane); the k-th of each pair up.
// Unpaired, it would wait for the no-progress deadline: refused, as NCCL
// refuses it ("Trying to send to self without a matching recv").
Status checkSelfPointToPoint(const Communicator& comm, const std::vector<OpRequest>& ops) {
  size_t sends = 0, recvs = 0;
  for (const OpRequest& op : ops) {
    if (op.shape.peer != comm.rank()) continue;
    if (op.shape.kind == CollKind::kSend) ++sends;
    if (op.shape.kind == CollKind::kRecv) ++recvs;
  }
  if (sends == recvs) return Status::ok();
  return invalidUsage(comm.describe(), ": the group holds ", sends, " ncclSend to self (rank ", comm.rank(),
                      ") and ", recvs, " ncclRecv from self; each Send to self needs a Recv from self in the "
                      "same group");
}

Status runOps(GroupState& work) {
  Status result;
  for (const auto& c : work.comms) SHOAL_TRY(checkSelfPointToPoint(*c.comm, c.ops));

  // SHOAL_CHECK_MODE=1: every communicator's part of the group is compared
  // with its peers first (concurrently: one thread may drive several ranks).
  if (callCheckEnabled()) {
    std::vector<std::function<Status()>> checks;
    for (auto& c : work.comms) checks.push_back([&c] { return checkCallsAgree(*c.comm, c.ops); });
    SHOAL_TRY(runInits(checks));
  }

  // Operations in CUDA stream order go to their streams (StreamBridge).
  SHOAL_ASSIGN_OR_RETURN(bool streamOrdered, settleStreamOrder(work.comms));
  if (streamOrdered) return endStreamOrdered(work.comms);

  // One blocking communicator (a batch of sends and receives, coalesced
  // collectives): the same inline path as an ungrouped call when none of its
  // work is in flight (2 ranks, grouped 8-byte send and receive: 2.9 -> 0.9 us).
  if (work.comms.size() == 1 && work.comms[0].comm->options().blocking) {
    auto& c = work.comms[0];
    return c.comm->submit(c.ops, /*wait=*/true);
  }
  // Submit every communicator's job first, then wait for all: the jobs of
  // different communicators progress together in the engine.
  // Several communicators from one thread (often several ranks of one
  // process): connections that do not wait for their peer first, so that
  // none waits for a rank this thread reaches only later.
  std::vector<bool> failed(work.comms.size(), false);
  if (work.comms.size() > 1)
    for (size_t i = 0; i < work.comms.size(); ++i)
      if (Status s = work.comms[i].comm->connectAhead(work.comms[i].ops); !s.isOk()) {
        failed[i] = true;
        if (result.isOk()) result = s;
      }
  std::vector<std::pair<std::shared_ptr<Communicator>, JobPtr>> waiting;
  bool inProgress = false;
  for (size_t i = 0; i < work.comms.size(); ++i) {
    auto& c = work.comms[i];
    if (failed[i]) continue;
    bool detached = !c.comm->options().blocking;
    auto job = c.comm->enqueue(c.ops, detached);
    if (!job.isOk()) {
      if (result.isOk()) result = job.takeStatus();
      continue;
    }
    if (!job.value()) continue;
    if (detached) inProgress = true;
    else waiting.emplace_back(c.comm, job.value());
  }
  for (auto& [comm, job] : waiting) {
    Status st = comm->waitFor(*job);
    if (!st.isOk() && result.isOk()) result = st;
  }
  if (result.isOk() && inProgress) return Status(Code::kInProgress, "");
  return result;
}

}  // namespace

Result<float> simulateEnd() {
  if (tDepth == 0) return invalidUsage("ncclGroupSimulateEnd: not in a group call");
  if (--tDepth > 0) return 0.0f;
  GroupState work = std::move(tGroup);
  tGroup = GroupState{};
  if (!work.failure.isOk()) return discard(work);
  // Inits are not operations: they run, as in NCCL (their handles would
  // otherwise never finish); the operations are only estimated.
  (void)startDetachedInits(work);
  SHOAL_TRY(runDeferredInits(work));
  float total = 0;
  for (auto& c : work.comms)
    for (auto& op : c.ops) {
      auto est = c.comm->estimateUs(op.shape);
      if (est.isOk()) total += static_cast<float>(est.value());
    }
  return total;
}

}  // namespace shoal::group
