// Bootstrap: allGather and barrier over a Store (see bootstrap.h).
//
// Keys: "<scope>/ag/0/<rank>" for the check-in, and once the generation is
// known (setGeneration) "<R>/ag/<round>/<rank>", <R> being
// "<scope>/g<generation>" (roundScope): another communicator in the same
// scope (NCCL_COMM_ID) shares this one's check-in keys, no round after it.
// Round r's get returning means every rank has set its round-r key, hence
// finished reading every earlier round; so after round r each rank erases
// its key of the previous allGather, and a long job keeps at most two rounds
// in the store. finish() uses "<R>/done/<round>/<rank>": a rank records it
// after reading the last round, so once rank 0 has them all it erases them
// and that round's keys; in a shared scope it first erases the check-in
// again and says so ("<R>/clean"), which the other ranks wait for. A round
// that cannot complete (a wrong record, two processes with one rank) gets
// "<R>/ag/<round>/failed", which the ranks still waiting in it read.
// leave() uses "<scope>/left/<generation>/<rank>"; failure reports are
// "<scope>/failure/<generation>/<rank>" (final) and
// "<scope>/failure-draft/<generation>/<rank>", the generation being the
// communicator's (setGeneration): a communicator made again with the same
// scope never reads an earlier one's reports. A finished communicator's scope is empty once
// every rank has left it, so the store holds keys only for live communicators.
// "<scope>/gone/<nonce>/<rank>" is a rank's will (setWill, under its own
// nonce: it is left before the check-in, when nobody knows the generation),
// and "<scope>/gone/<generation>/some" the mark every rank's will also leaves
// once the check-in is over: written by the root if the rank's connection
// ends before leave() or the destructor cancels them. Until then a third
// will stands in for the rank's check-in record ("<scope>/ag/0/<rank>").
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

// What the root writes in place of a rank's check-in record when its process
// ends before it checked in (setWill): the mark (no record begins with it),
// the rank's nonce in 16 hex digits (where its other will is), ':', the
// report.
constexpr std::string_view kGoneRecordMark = "\xffgone\xff";
std::string goneRecord(uint64_t nonce, std::string_view report) {
  return str(kGoneRecordMark, hex64(nonce), ":", report);
}
struct GoneRecord {
  std::string nonce;  // hex, "" where the record has none
  std::string report;
};
std::optional<GoneRecord> parseGoneRecord(std::string_view record) {
  if (!record.starts_with(kGoneRecordMark)) return std::nullopt;
  record.remove_prefix(kGoneRecordMark.size());
  if (record.size() > 16 && record[16] == ':')
    return GoneRecord{std::string(record.substr(0, 16)), std::string(record.substr(17))};
  return GoneRecord{"", std::string(record)};
}

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
  cancelWills(deadline);
}

Status Bootstrap::setWill(std::string_view report, uint64_t nonce, Deadline deadline) {
  const std::string what = str("bootstrap will of ", scope_, " (rank ", rank_, ")");
  if (round_ != 0) return invalidUsage(what, ": left after the check-in");
  nonce_ = nonce;
  // Until its record is given, the rank's will stands in for it; the will
  // under its nonce names it once the others have read its record (both
  // now: a process can end right after its record). A check-in failed by
  // the first erases the second too (checkInGone: the nonce is in it).
  checkInWill_ = true;  // cancelled by the destructor even if the request failed
  SHOAL_TRY(store_->setWill(checkInKey(), goneRecord(nonce, report), deadline)) << what;
  goneWill_ = true;
  SHOAL_TRY(store_->setWill(goneKey(rank_), report, deadline)) << what;
  willsLeft_ = true;
  return Status::ok();
}

Status Bootstrap::setGeneration(std::vector<uint64_t> nonces, Deadline deadline) {
  if (nonces.size() != static_cast<size_t>(size_))
    return invalidArgument("bootstrap of ", scope_, ": ", nonces.size(), " nonces for ", size_, " ranks");
  generation_ = nonces[0];
  nonces_ = std::move(nonces);
  hasGeneration_ = true;
  // The check-in's will first: its key is erased by the next rounds, and a
  // will left on it would write there when the process ends.
  cancelWills(deadline, /*onlyCheckIn=*/true);
  if (!willsLeft_) return Status::ok();  // no mark without the will it points to
  // The mark: a look that finds none need not ask for every rank's will.
  markWill_ = true;
  SHOAL_TRY(store_->setWill(someGoneKey(), str(rank_), deadline))
      << "bootstrap will of " << scope_ << " (rank " << rank_ << ")";
  return Status::ok();
}

void Bootstrap::abandon(std::string_view report) {
  const Deadline deadline = Deadline::afterMs(kLeaveMs);
  Status s;
  // Ranks still in the check-in read its record: the report replaces it,
  // unless a will already failed the check-in (this rank read it: so did
  // everyone, and the last of them erased it). A rank that gave its record
  // may also have been read already by ranks now in the next round: they
  // look under its nonce. (After a check-in that failed for everyone, that
  // one is read by nobody: it stays, as the rest of the scope's keys of a
  // failed set-up, until the id is released.)
  if (checkIn_ == CheckIn::kNotGiven || checkIn_ == CheckIn::kGiven)
    s = store_->set(checkInKey(), goneRecord(nonce_, report), deadline);
  if (s.isOk() && checkIn_ != CheckIn::kNotGiven) s = store_->set(goneKey(rank_), report, deadline);
  // Without the generation there is no mark: the others' first look finds it.
  if (s.isOk() && checkIn_ == CheckIn::kDone && hasGeneration_) s = markGone(rank_, deadline);
  if (!s.isOk())
    SHOAL_INFO(subsys::kBootstrap, "bootstrap of ", scope_, " (rank ", rank_, "): could not tell the others why it ",
               "gave up: ", s.message());
}

void Bootstrap::cancelWills(Deadline deadline, bool onlyCheckIn) {
  // The mark before the will it points to: a mark left alone sends the
  // others' looks to a will that is not there, a will left alone is found
  // by no look that starts from the mark.
  std::vector<std::pair<bool*, std::string>> wills{{&checkInWill_, checkInKey()}};
  if (!onlyCheckIn) {
    wills.emplace_back(&markWill_, someGoneKey());
    wills.emplace_back(&goneWill_, goneKey(rank_));
  }
  for (auto& [set, key] : wills) {
    if (!*set) continue;
    if (Status s = store_->cancelWill(key, deadline); !s.isOk()) {
      SHOAL_INFO(subsys::kBootstrap, "bootstrap will of ", scope_, " (rank ", rank_, ") under ", key, ": ",
                 s.message(), "; the root writes it when this process's connection ends, unless a later cancel "
                 "succeeds");
      continue;  // the next may still go through; the destructor tries again
    }
    *set = false;
  }
}

std::string Bootstrap::roundScope(uint64_t round) const {
  return round == 0 || !hasGeneration_ ? scope_ : str(scope_, "/g", hex64(generation_));
}

std::string Bootstrap::roundKey(uint64_t round, int rank) const {
  return str(roundScope(round), "/ag/", round, "/", rank);
}

std::string Bootstrap::doneKey(uint64_t round, int rank) const {
  return str(roundScope(round), "/done/", round, "/", rank);
}

std::string Bootstrap::cleanKey() const { return str(roundScope(1), "/clean"); }

std::string Bootstrap::checkInKey() const { return roundKey(0, rank_); }

std::string Bootstrap::failureKey(int rank) const { return str(scope_, "/failure/", hex64(generation_), "/", rank); }
std::string Bootstrap::failureDraftKey(int rank) const {
  return str(scope_, "/failure-draft/", hex64(generation_), "/", rank);
}

std::string Bootstrap::leftKey(int rank) const { return str(scope_, "/left/", hex64(generation_), "/", rank); }

std::string Bootstrap::goneKey(int rank) const {
  const uint64_t nonce = static_cast<size_t>(rank) < nonces_.size() ? nonces_[static_cast<size_t>(rank)]
                         : rank == rank_                            ? nonce_
                                                                    : 0;
  return goneKeyUnder(hex64(nonce), rank);
}

std::string Bootstrap::goneKeyUnder(std::string_view nonceHex, int rank) const {
  return str(scope_, "/gone/", nonceHex, "/", rank);
}

Status Bootstrap::markGone(int rank, Deadline deadline) { return store_->set(someGoneKey(), str(rank), deadline); }

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

std::string Bootstrap::roundFailureKey(uint64_t round) const {
  return str(roundScope(round), "/ag/", round, "/failed");
}

namespace {
// A round's failure names the round's rank-0 record it was found with: a
// later communicator in the same scope (NCCL_COMM_ID gives every one the
// same) never takes an earlier one's failure for its own.
std::string anchorOf(std::string_view rankZeroRecord) { return hex64(fnv1a(rankZeroRecord)); }

// "<anchor> <R|U> rank <r> found: <why>": R for kRemoteError (a rank will
// not come), U for kInvalidUsage (a wrong record).
std::string failureRecord(std::string_view rankZeroRecord, int rank, const Status& why) {
  return str(anchorOf(rankZeroRecord), " ", why.code() == Code::kRemoteError ? 'R' : 'U', " rank ", rank,
             " found: ", why.message());
}

// This rank's record was replaced by another process's.
Status claimedTwice(int rank, int size) {
  return invalidUsage("another process claims rank ", rank, " of ", size,
                      " too (its record replaced this one's): give every rank a different rank number");
}
}  // namespace

void Bootstrap::publishRoundFailure(const Status& why) {
  if (round_ == 0) return;
  (void)store_->set(roundFailureKey(round_ - 1), failureRecord(lastRankZeroRecord_, rank_, why),
                    Deadline::afterMs(kLeaveMs));
}

Status Bootstrap::lookAtRound(uint64_t round, std::string_view mine, const RecordCheck& checkFirst,
                              const std::atomic<bool>* stop) {
  const std::vector<std::string> keys{roundFailureKey(round), roundKey(round, rank_), roundKey(round, 0)};
  const Deadline deadline = Deadline::afterMs(kLeaveMs).cancelledBy(stop);
  if (hasGeneration_) {
    SHOAL_TRY(lookForGoneRanks([&](int r) { return roundKey(round, r); }, deadline));
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
  if (failed.size() > anchor.size() + 3 && failed.compare(0, anchor.size(), anchor) == 0) {
    std::string why = failed.substr(anchor.size() + 3);
    return failed[anchor.size() + 1] == 'R' ? remoteError(why) : invalidUsage(why);
  }
  Status wrong;
  if (present.value()[1] && own != mine)
    wrong = claimedTwice(rank_, size_);
  else if (checkFirst && rank_ != 0)
    wrong = checkFirst(rankZero);
  if (wrong.isOk()) return Status::ok();
  (void)store_->set(keys[0], failureRecord(rankZero, rank_, wrong), deadline);
  return wrong;
}

Status Bootstrap::lookForGoneRanks(const std::function<std::string(int)>& recordKey, Deadline deadline) {
  if (lookedAtNeighbours_) {
    Result<std::vector<bool>> someone = store_->check({someGoneKey()}, deadline);
    if (!someone.isOk() || !someone.value()[0]) return Status::ok();
  } else {
    // The first look also reads the wills of the next few ranks: one that
    // ended in the check-in, after its record, left no mark, so whoever
    // finds its will marks it for everyone. (A slice, not everyone's: the
    // root answers thousands of ranks' first looks at once.)
    std::vector<std::string> keys{someGoneKey()};
    std::vector<int> ranks{-1};
    for (int i = 1; i <= std::min(kNeighboursLookedAt, size_ - 1); ++i) {
      ranks.push_back((rank_ + i) % size_);
      keys.push_back(goneKey(ranks.back()));
    }
    Result<std::vector<bool>> gone = store_->check(keys, deadline);
    if (!gone.isOk()) return Status::ok();  // the next look tries again
    auto found = std::find(gone.value().begin() + 1, gone.value().end(), true);
    if (found != gone.value().end() && !gone.value()[0]) {
      const int who = ranks[static_cast<size_t>(found - gone.value().begin())];
      if (!markGone(who, deadline).isOk()) return Status::ok();
    }
    lookedAtNeighbours_ = true;
    if (found == gone.value().end() && !gone.value()[0]) return Status::ok();
  }
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
    recordKeys.push_back(recordKey(ranks[i]));
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

Result<std::vector<std::string>> Bootstrap::awaitRound(const std::vector<std::string>& keys, const Look& look,
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
        Status st = look(&stop);
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
  std::string what = str("bootstrap allGather #", round, " of ", scope_, " (rank ", rank_, " of ", size_, ", store ",
                         store_->describe(), ")");
  if (round == 0 && mine.starts_with(kGoneRecordMark)) return invalidUsage(what, ": a record in the will's form");
  if (Status s = store_->set(roundKey(round, rank_), mine, deadline); !s.isOk()) return s.withContext(what);
  if (round == 0) checkIn_ = CheckIn::kGiven;

  std::vector<std::string> keys;
  std::vector<int> ranks;
  for (int r = 0; r < size_; ++r) {
    keys.push_back(roundKey(round, r));
    ranks.push_back(r);
  }
  Result<std::vector<std::string>> values = awaitRound(
      keys, [&](const std::atomic<bool>* stop) { return lookAtRound(round, mine, checkFirst, stop); }, deadline);
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
    publishRoundFailure(twice);
    return twice.withContext(what);
  }
  if (round == 0) {
    if (Status gone = checkInGone(values.value()); !gone.isOk()) {
      checkIn_ = CheckIn::kFailed;
      return gone.withContext(what);
    }
    checkIn_ = CheckIn::kDone;
  }
  if (lastGatherRound_ >= 0) {
    uint64_t previous = static_cast<uint64_t>(lastGatherRound_);
    if (Status s = store_->erase({roundKey(previous, rank_)}, deadline); !s.isOk())
      SHOAL_WARN(what, ": could not erase the previous round's key: ", s.message());
  }
  lastGatherRound_ = static_cast<int64_t>(round);
  return values;
}

Status Bootstrap::finish(Deadline deadline) {
  uint64_t round = round_++;
  auto keyOf = [&](int rank) { return doneKey(round, rank); };
  std::string what = str("bootstrap finish of ", scope_, " (rank ", rank_, " of ", size_, ", store ",
                         store_->describe(), ")");
  if (rank_ != 0) {
    Status s = store_->set(keyOf(rank_), "", deadline);
    const bool rootGone = s.code() == Code::kRemoteError;
    if (rootGone) {
      SHOAL_INFO(subsys::kBootstrap, what, ": the root went away after our record (", s.message(), ")");
      s = Status::ok();
    }
    if (!s.isOk()) return s.withContext(what);
    lastGatherRound_ = -1;  // rank 0 erases it
    if (sharedScope_ && hasGeneration_ && !rootGone) {
      // Until rank 0 has erased the check-in, the next communicator's would
      // read its records. A rank gone with no record of its finish, rank 0
      // included, fails the wait as it fails a round; on the deadline the
      // error names the ranks that did not finish, if any.
      std::atomic<bool> someoneGone{false};
      auto look = [&](const std::atomic<bool>* stop) {
        Status gone = lookForGoneRanks(keyOf, Deadline::afterMs(kLeaveMs).cancelledBy(stop));
        if (!gone.isOk()) someoneGone.store(true);
        return gone;
      };
      Result<std::vector<std::string>> clean = awaitRound({cleanKey()}, look, deadline);
      if (!clean.isOk() && clean.status().code() == Code::kRemoteError && !someoneGone.load()) {
        SHOAL_INFO(subsys::kBootstrap, what, ": the root went away before rank 0 said it was done (",
                   clean.status().message(), ")");
      } else if (!clean.isOk()) {
        Status failed = clean.takeStatus();
        if (failed.code() == Code::kTimeout) {
          std::vector<std::string> doneKeys;
          std::vector<int> others;
          for (int r = 1; r < size_; ++r) {
            doneKeys.push_back(keyOf(r));
            others.push_back(r);
          }
          SHOAL_TRY(missingRanks(doneKeys, others, failed, what));
        }
        return failed.withContext(str(what, ": waiting for rank 0 to erase the check-in"));
      }
    }
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
    // A rank that gave up (abandon) or ended since the last round is looked
    // for as in allGather.
    auto look = [&](const std::atomic<bool>* stop) {
      if (!hasGeneration_) return Status::ok();
      return lookForGoneRanks(keyOf, Deadline::afterMs(kLeaveMs).cancelledBy(stop));
    };
    Result<std::vector<std::string>> done = awaitRound(keys, look, deadline);
    if (!done.isOk()) {
      Status failed = done.takeStatus();
      if (failed.code() != Code::kTimeout) return failed.withContext(what);
      SHOAL_TRY(missingRanks(keys, ranks, failed, what));
    }
  }
  if (sharedScope_ && hasGeneration_) {
    // Every rank erased its check-in record in the round after it (an erase
    // that failed was only warned of): erased again, then the others may go
    // on to the next communicator's check-in.
    std::vector<std::string> checkIn;
    for (int r = 0; r < size_; ++r) checkIn.push_back(roundKey(0, r));
    SHOAL_TRY(store_->erase(checkIn, deadline)) << what << ": erasing the check-in";
    SHOAL_TRY(store_->set(cleanKey(), "", deadline)) << what << ": telling the others the check-in is erased";
  }
  // Every rank recorded its finish after reading the last allGather: nobody
  // reads that round again.
  if (lastGatherRound_ >= 0) {
    for (int r = 0; r < size_; ++r) keys.push_back(roundKey(static_cast<uint64_t>(lastGatherRound_), r));
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
  cancelWills(deadline);  // after the record: a process that ends between the two is still named
  std::vector<std::string> left;
  for (int r = 0; r < size_; ++r) left.push_back(leftKey(r));
  // The store orders the records: whoever sees all of them after its own is
  // last (two ranks may both be; erasing twice is harmless).
  SHOAL_ASSIGN_OR_RETURN(std::vector<bool> present, store_->check(left, deadline), what);
  if (!std::all_of(present.begin(), present.end(), [](bool p) { return p; })) return Status::ok();
  std::vector<std::string> keys = std::move(left);
  if (sharedScope_ && hasGeneration_) keys.push_back(cleanKey());
  for (int r = 0; r < size_; ++r) {
    keys.push_back(failureKey(r));
    keys.push_back(failureDraftKey(r));
    keys.push_back(goneKey(r));
    if (r == 0) keys.push_back(someGoneKey());
    // Our last allGather round is everyone's: each allGather since finish()
    // was collective.
    if (lastGatherRound_ >= 0) keys.push_back(roundKey(static_cast<uint64_t>(lastGatherRound_), r));
  }
  if (Status s = store_->erase(keys, deadline); !s.isOk()) return s.withContext(what);
  return Status::ok();
}

Status Bootstrap::checkInGone(const std::vector<std::string>& records) {
  Status gone;
  std::vector<bool> isWill(static_cast<size_t>(size_), false);
  std::vector<std::string> keys;  // what the last reader erases
  for (int r = 0; r < size_; ++r) {
    keys.push_back(roundKey(0, r));
    std::optional<GoneRecord> will = parseGoneRecord(records[static_cast<size_t>(r)]);
    if (!will) continue;
    isWill[static_cast<size_t>(r)] = true;
    if (!will->nonce.empty()) keys.push_back(goneKeyUnder(will->nonce, r));
    if (gone.isOk()) gone = remoteError("rank ", r, " will not come: ", will->report);
  }
  if (gone.isOk()) return gone;
  // Every other rank reads the wills too (the check-in ends only once every
  // record is there): each says so, under the check-in's records, and
  // whoever sees that all have erases the check-in, wills and all, so that
  // a later communicator in the same scope (NCCL_COMM_ID) does not read
  // them as its own. First this rank's own will goes: its key is erased.
  const Deadline deadline = Deadline::afterMs(kLeaveMs);
  cancelWills(deadline, /*onlyCheckIn=*/true);
  std::string all;
  for (const std::string& record : records) all += str(record.size(), ":", record);
  const std::string anchor = hex64(fnv1a(all));
  auto readKey = [&](int r) { return str(scope_, "/ag/0/read/", anchor, "/", r); };
  if (!store_->set(readKey(rank_), "", deadline).isOk()) return gone;
  std::vector<std::string> read;
  for (int r = 0; r < size_; ++r)
    if (!isWill[static_cast<size_t>(r)]) read.push_back(readKey(r));
  Result<std::vector<bool>> present = store_->check(read, deadline);
  if (!present.isOk() || !std::all_of(present.value().begin(), present.value().end(), [](bool p) { return p; }))
    return gone;
  keys.insert(keys.end(), read.begin(), read.end());
  (void)store_->erase(keys, deadline);
  return gone;
}

Status Bootstrap::barrier(Deadline deadline) {
  Result<std::vector<std::string>> done = allGather({}, deadline);
  if (!done.isOk()) return done.takeStatus().withContext("barrier");
  return Status::ok();
}

}  // namespace shoal
