// Bootstrap: allGather and barrier over a Store (see bootstrap.h).
//
// Keys: "<scope>/ag/<round>/<rank>". Round r's get returning means every rank
// has set its round-r key, hence finished reading every earlier round; so
// after round r each rank erases its key of the previous allGather, and a long
// job keeps at most two rounds in the store. finish() uses
// "<scope>/done/<round>/<rank>": a rank records it after reading the last
// round, so once rank 0 has them all it erases them and that round's keys.
// A round that cannot complete (a wrong record, two processes with one rank)
// gets "<scope>/ag/<round>/failed", which the ranks still waiting in it read.
// leave() uses "<scope>/left/<generation>/<rank>"; failure reports are
// "<scope>/failure/<generation>/<rank>", the generation being the
// communicator's (setGeneration): a communicator made again with the same
// scope never reads an earlier one's reports. A finished communicator's scope is empty once
// every rank has left it, so the store holds keys only for live communicators.
// "<scope>/gone/<generation>/<rank>" is a rank's will (setWill), and
// "<scope>/gone/<generation>/some" the mark every rank's will also leaves:
// written by the root if the rank's connection ends before leave() or the
// destructor cancels them.
#include "bootstrap/bootstrap.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>

#include "core/log.h"
#include "core/process.h"

namespace shoal {
namespace {

// "3, 5-7, 9" from sorted ranks.
std::string formatRanks(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    out += std::to_string(ranks[i]);
    if (j > i) out += "-" + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

}  // namespace

Bootstrap::Bootstrap(std::shared_ptr<Store> store, std::string scope, int rank, int size)
    : store_(std::move(store)), scope_(std::move(scope)), rank_(rank), size_(size) {}

Bootstrap::~Bootstrap() {
  const Deadline deadline = Deadline::afterMs(kLeaveMs);  // for the leave and the will's cancel together
  if (finished_ && !left_) {
    if (Status s = leave(deadline); !s.isOk())
      SHOAL_INFO(subsys::kBootstrap, "bootstrap leave of ", scope_, " (rank ", rank_, "): ", s.message(),
                 "; its keys stay until the id is released");
  }
  cancelWill(deadline);
}

Status Bootstrap::setWill(std::string_view report, Deadline deadline) {
  // The second will marks the generation: a look that finds no mark need
  // not ask for every rank's will.
  willSet_ = true;  // cancelled by the destructor even if only the first was left
  SHOAL_TRY(store_->setWill(goneKey(rank_), report, deadline))
      << "bootstrap will of " << scope_ << " (rank " << rank_ << ")";
  SHOAL_TRY(store_->setWill(someGoneKey(), str(rank_), deadline))
      << "bootstrap will of " << scope_ << " (rank " << rank_ << ")";
  return Status::ok();
}

void Bootstrap::cancelWill(Deadline deadline) {
  if (!std::exchange(willSet_, false)) return;
  for (const std::string& key : {goneKey(rank_), someGoneKey()})
    if (Status s = store_->cancelWill(key, deadline); !s.isOk()) {
      SHOAL_INFO(subsys::kBootstrap, "bootstrap will of ", scope_, " (rank ", rank_, "): ", s.message(),
                 "; the root writes it when this process's connection ends");
      return;
    }
}

std::string Bootstrap::failureKey(int rank) const { return str(scope_, "/failure/", hex64(generation_), "/", rank); }

std::string Bootstrap::leftKey(int rank) const { return str(scope_, "/left/", hex64(generation_), "/", rank); }

std::string Bootstrap::goneKey(int rank) const { return str(scope_, "/gone/", hex64(generation_), "/", rank); }

std::string Bootstrap::someGoneKey() const { return str(scope_, "/gone/", hex64(generation_), "/some"); }

uint64_t fnv1a(std::string_view bytes) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
  return h;
}

// The error for a get that timed out: which ranks' keys are missing.
Status Bootstrap::missingRanks(const std::vector<std::string>& keys, const std::vector<int>& ranks,
                               const Status& failed, const std::string& what) {
  Result<std::vector<bool>> exists = store_->check(keys, Deadline::afterMs(2000));
  if (!exists.isOk()) return error(Code::kTimeout, what, ": timed out (", failed.message(), ")");
  std::vector<int> missing;
  for (size_t i = 0; i < keys.size(); ++i)
    if (!exists.value()[i]) missing.push_back(ranks[i]);
  if (missing.empty()) return Status::ok();  // everyone arrived just as the deadline passed
  return error(Code::kTimeout, what, ": timed out waiting for ", missing.size(),
               missing.size() == 1 ? " rank: " : " ranks: ", formatRanks(missing));
}

std::string Bootstrap::roundFailureKey(uint64_t round) const { return str(scope_, "/ag/", round, "/failed"); }

namespace {
// A round's failure names the round's rank-0 record it was found with: a
// later communicator in the same scope (NCCL_COMM_ID gives every one the
// same) never takes an earlier one's failure for its own.
std::string anchorOf(std::string_view rankZeroRecord) { return hex64(fnv1a(rankZeroRecord)); }

std::string failureRecord(std::string_view rankZeroRecord, int rank, std::string_view why) {
  return str(anchorOf(rankZeroRecord), " rank ", rank, " found: ", why);
}

// This rank's record was replaced by another process's.
Status claimedTwice(int rank, int size) {
  return invalidUsage("another process claims rank ", rank, " of ", size,
                      " too (its record replaced this one's): give every rank a different rank number");
}
}  // namespace

void Bootstrap::publishRoundFailure(std::string_view why) {
  if (round_ == 0) return;
  (void)store_->set(roundFailureKey(round_ - 1), failureRecord(lastRankZeroRecord_, rank_, why),
                    Deadline::afterMs(kLeaveMs));
}

Status Bootstrap::lookAtRound(uint64_t round, std::string_view mine, const RecordCheck& checkFirst,
                              const std::atomic<bool>* stop) {
  const std::vector<std::string> keys{roundFailureKey(round), str(scope_, "/ag/", round, "/", rank_),
                                      str(scope_, "/ag/", round, "/0")};
  const Deadline deadline = Deadline::afterMs(kLeaveMs).cancelledBy(stop);
  if (hasGeneration_) {
    SHOAL_TRY(lookForGoneRanks(round, deadline));
  }
  Result<std::vector<bool>> present = store_->check(keys, deadline);
  if (!present.isOk() || !present.value()[2]) return Status::ok();  // nothing to judge without rank 0's record
  std::vector<std::string> wanted;
  for (size_t i = 0; i < keys.size(); ++i)
    if (present.value()[i]) wanted.push_back(keys[i]);
  Result<std::vector<std::string>> values = store_->get(wanted, deadline);
  if (!values.isOk()) return Status::ok();
  std::string failed, own, rankZero;
  for (size_t i = 0; i < wanted.size(); ++i)
    (wanted[i] == keys[0] ? failed : wanted[i] == keys[1] ? own : rankZero) = values.value()[i];
  const std::string anchor = anchorOf(rankZero);
  if (failed.size() > anchor.size() + 1 && failed.compare(0, anchor.size(), anchor) == 0)
    return invalidUsage(failed.substr(anchor.size() + 1));
  Status wrong;
  if (present.value()[1] && own != mine)
    wrong = claimedTwice(rank_, size_);
  else if (checkFirst && rank_ != 0)
    wrong = checkFirst(rankZero);
  if (wrong.isOk()) return Status::ok();
  (void)store_->set(keys[0], failureRecord(rankZero, rank_, wrong.message()), deadline);
  return wrong;
}

Status Bootstrap::lookForGoneRanks(uint64_t round, Deadline deadline) {
  Result<std::vector<bool>> someone = store_->check({someGoneKey()}, deadline);
  if (!someone.isOk() || !someone.value()[0]) return Status::ok();
  std::vector<std::string> goneKeys;
  std::vector<int> ranks;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    goneKeys.push_back(goneKey(r));
    ranks.push_back(r);
  }
  Result<std::vector<bool>> gone = store_->check(goneKeys, deadline);
  if (!gone.isOk()) return Status::ok();
  std::vector<std::string> recordKeys, suspectKeys;
  std::vector<int> suspects;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (!gone.value()[i]) continue;
    suspects.push_back(ranks[i]);
    recordKeys.push_back(str(scope_, "/ag/", round, "/", ranks[i]));
    suspectKeys.push_back(goneKeys[i]);
  }
  if (suspects.empty()) return Status::ok();
  // A rank that went after it gave its record still lets the round end.
  Result<std::vector<bool>> recorded = store_->check(recordKeys, deadline);
  if (!recorded.isOk()) return Status::ok();
  for (size_t i = 0; i < suspects.size(); ++i) {
    if (recorded.value()[i]) continue;
    Result<std::vector<std::string>> report = store_->get({suspectKeys[i]}, deadline);
    if (!report.isOk()) return Status::ok();
    return remoteError("rank ", suspects[i], " will not come: ", report.value()[0]);
  }
  return Status::ok();
}

Result<std::vector<std::string>> Bootstrap::awaitRound(const std::vector<std::string>& keys, uint64_t round,
                                                       std::string_view mine, const RecordCheck& checkFirst,
                                                       Deadline deadline) {
  // One get for the whole wait (the root holds one waiter per rank); the
  // looks run beside it on a thread of their own, each a few keys, and end
  // the get with what they find (through the deadline's second flag, which
  // no caller of allGather sets).
  std::mutex mutex;
  std::condition_variable wake;
  std::atomic<bool> stop{false}, found{false};
  Status finding;
  std::thread looker;
  try {
    looker = std::thread([&] {
      markLibraryThread();
      int64_t waitMs = kFirstLookMs;
      std::unique_lock<std::mutex> lock(mutex);
      while (!wake.wait_for(lock, std::chrono::milliseconds(waitMs), [&] { return stop.load(); })) {
        lock.unlock();
        Status st = lookAtRound(round, mine, checkFirst, &stop);
        lock.lock();
        if (!st.isOk() && !stop.load()) {
          finding = std::move(st);
          found.store(true, std::memory_order_release);
          return;
        }
        waitMs = std::min(waitMs * 2, kMostLookMs);
      }
    });
  } catch (const std::system_error&) {
    return store_->get(keys, deadline);  // no thread: no looks, the deadline still holds
  }
  Result<std::vector<std::string>> values = store_->get(keys, deadline.alsoCancelledBy(&found));
  {
    std::lock_guard<std::mutex> lock(mutex);
    stop.store(true);
  }
  wake.notify_all();
  looker.join();
  if (found.load(std::memory_order_acquire) && !values.isOk()) return finding;
  return values;
}

Result<std::vector<std::string>> Bootstrap::allGather(std::string_view mine, Deadline deadline,
                                                      const RecordCheck& checkFirst) {
  uint64_t round = round_++;
  auto keyOf = [&](uint64_t r, int rank) { return str(scope_, "/ag/", r, "/", rank); };
  std::string what = str("bootstrap allGather #", round, " of ", scope_, " (rank ", rank_, " of ", size_, ", store ",
                         store_->describe(), ")");
  if (Status s = store_->set(keyOf(round, rank_), mine, deadline); !s.isOk()) return s.withContext(what);

  std::vector<std::string> keys;
  std::vector<int> ranks;
  for (int r = 0; r < size_; ++r) {
    keys.push_back(keyOf(round, r));
    ranks.push_back(r);
  }
  Result<std::vector<std::string>> values = awaitRound(keys, round, mine, checkFirst, deadline);
  if (!values.isOk()) {
    Status failed = values.takeStatus();
    if (failed.code() != Code::kTimeout) return failed.withContext(what);
    SHOAL_TRY(missingRanks(keys, ranks, failed, what));
    values = store_->get(keys, Deadline::afterMs(2000));
    if (!values.isOk()) return values.takeStatus().withContext(what);
  }
  lastRankZeroRecord_ = values.value()[0];
  if (values.value()[rank_] != mine) {
    // Another process with this rank wrote over this one's record.
    Status twice = claimedTwice(rank_, size_);
    publishRoundFailure(twice.message());
    return twice.withContext(what);
  }
  if (lastGatherRound_ >= 0) {
    uint64_t previous = static_cast<uint64_t>(lastGatherRound_);
    if (Status s = store_->erase({keyOf(previous, rank_)}, deadline); !s.isOk())
      SHOAL_WARN(what, ": could not erase the previous round's key: ", s.message());
  }
  lastGatherRound_ = static_cast<int64_t>(round);
  return values;
}

Status Bootstrap::finish(Deadline deadline) {
  uint64_t round = round_++;
  auto keyOf = [&](int rank) { return str(scope_, "/done/", round, "/", rank); };
  std::string what = str("bootstrap finish of ", scope_, " (rank ", rank_, " of ", size_, ", store ",
                         store_->describe(), ")");
  if (rank_ != 0) {
    Status s = store_->set(keyOf(rank_), "", deadline);
    if (s.code() == Code::kRemoteError) {
      SHOAL_INFO(subsys::kBootstrap, what, ": the root went away after our record (", s.message(), ")");
      s = Status::ok();
    }
    if (!s.isOk()) return s.withContext(what);
    lastGatherRound_ = -1;  // rank 0 erases it
    finished_ = true;
    return Status::ok();
  }
  std::vector<std::string> keys;
  std::vector<int> ranks;
  for (int r = 1; r < size_; ++r) {
    keys.push_back(keyOf(r));
    ranks.push_back(r);
  }
  if (!keys.empty()) {
    Result<std::vector<std::string>> done = store_->get(keys, deadline);
    if (!done.isOk()) {
      Status failed = done.takeStatus();
      if (failed.code() != Code::kTimeout) return failed.withContext(what);
      SHOAL_TRY(missingRanks(keys, ranks, failed, what));
    }
  }
  // Every rank recorded its finish after reading the last allGather: nobody
  // reads that round again.
  if (lastGatherRound_ >= 0) {
    for (int r = 0; r < size_; ++r) keys.push_back(str(scope_, "/ag/", lastGatherRound_, "/", r));
    lastGatherRound_ = -1;
  }
  if (!keys.empty())
    if (Status s = store_->erase(keys, deadline); !s.isOk())
      SHOAL_WARN(what, ": could not erase the records: ", s.message());
  finished_ = true;
  return Status::ok();
}

Status Bootstrap::leave(Deadline deadline) {
  if (!finished_ || left_) return Status::ok();
  left_ = true;
  std::string what = str("bootstrap leave of ", scope_, " (rank ", rank_, " of ", size_, ", store ",
                         store_->describe(), ")");
  if (Status s = store_->set(leftKey(rank_), "", deadline); !s.isOk()) return s.withContext(what);
  cancelWill(deadline);  // after the record: a process that ends between the two is still named
  std::vector<std::string> left;
  for (int r = 0; r < size_; ++r) left.push_back(leftKey(r));
  // The store orders the records: whoever sees all of them after its own is
  // last (two ranks may both be; erasing twice is harmless).
  SHOAL_ASSIGN_OR_RETURN(std::vector<bool> present, store_->check(left, deadline), what);
  if (!std::all_of(present.begin(), present.end(), [](bool p) { return p; })) return Status::ok();
  std::vector<std::string> keys = std::move(left);
  for (int r = 0; r < size_; ++r) {
    keys.push_back(failureKey(r));
    keys.push_back(goneKey(r));
    if (r == 0) keys.push_back(someGoneKey());
    // Our last allGather round is everyone's: each allGather since finish()
    // was collective.
    if (lastGatherRound_ >= 0) keys.push_back(str(scope_, "/ag/", lastGatherRound_, "/", r));
  }
  if (Status s = store_->erase(keys, deadline); !s.isOk()) return s.withContext(what);
  return Status::ok();
}

Status Bootstrap::barrier(Deadline deadline) {
  Result<std::vector<std::string>> done = allGather({}, deadline);
  if (!done.isOk()) return done.takeStatus().withContext("barrier");
  return Status::ok();
}

}  // namespace shoal
