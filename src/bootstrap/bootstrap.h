// Store and Bootstrap: rendezvous of the ranks of a communicator.
//
// Role: a Store is a key-value rendezvous shared by the ranks of a job; the TCP
// store is served by a root started in the process that called
// ncclGetUniqueId (or at NCCL_COMM_ID), the memory store serves ranks that are
// threads of one process (tests, ncclCommInitAll). A Bootstrap is one rank's
// handle on a communicator's namespace in a store: rank, size, allGather,
// barrier. Any thread may use a Store; one Bootstrap is used by one thread at a
// time (its communicator's). Every wait takes a Deadline.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/clock.h"
#include "core/status.h"

namespace shoal {

class Store {
 public:
  virtual ~Store() = default;
  virtual Status set(const std::string& key, std::string_view value, Deadline deadline) = 0;
  // Waits until every key exists, then returns the values in order.
  virtual Result<std::vector<std::string>> get(const std::vector<std::string>& keys,
                                               Deadline deadline) = 0;
  // Removes keys (missing ones are ignored).
  virtual Status erase(const std::vector<std::string>& keys, Deadline deadline) = 0;
  // Which of `keys` exist now (does not wait for them); for error messages that
  // name who is missing. The default says kUnsupported.
  virtual Result<std::vector<bool>> check(const std::vector<std::string>& keys, Deadline deadline);
  // The first of `keys` that exists now, with its place in `keys` and its
  // value (nullopt: none does): a check, then a get of that key. For keys
  // that may never be set (reports, wills), which a get alone would wait for.
  struct Found {
    size_t index = 0;
    std::string value;
  };
  Result<std::optional<Found>> firstPresent(const std::vector<std::string>& keys, Deadline deadline);
  // Leaves word with the store for when this client's side closes its
  // connection to it (its process exited): `key` is then set to `value`,
  // unless it exists by then. Until cancelWill(key); the same key again
  // replaces the value. The default (a store inside this process, which
  // ends with it) keeps nothing.
  virtual Status setWill(const std::string& /*key*/, std::string_view /*value*/, Deadline /*deadline*/) {
    return Status::ok();
  }
  virtual Status cancelWill(const std::string& /*key*/, Deadline /*deadline*/) { return Status::ok(); }
  // "tcp 10.0.0.1:5000" or "memory", for error messages.
  virtual std::string describe() const = 0;
};

// 128-byte ncclUniqueId contents (opaque to users).
struct UniqueIdContents {
  static constexpr size_t kBytes = 128;
  uint64_t magic = 0;        // random; identifies the id
  uint8_t secret[32] = {};   // random; clients prove knowledge of it
  std::string address;       // root "host:port" (IPv4 or [IPv6])
};
void encodeUniqueId(const UniqueIdContents& id, char out[UniqueIdContents::kBytes]);
Result<UniqueIdContents> decodeUniqueId(const char in[UniqueIdContents::kBytes]);

// Makes a fresh id and starts the root store server in this process (listening
// on the interface chosen by NCCL_SOCKET_IFNAME, or at NCCL_COMM_ID). The server
// lives until the process exits; the id until the last rank that used it
// disconnects, or, never used, until the process exits (root_server.h).
Result<UniqueIdContents> createUniqueId();
// For an id made from NCCL_COMM_ID (magic 0x0280028002800280, whose root is
// not started by createUniqueId): starts the root at the id's address if no
// root for it runs in this process yet; ok and nothing to do for other ids.
// Called from rank 0's init. Idempotent and thread-safe.
Status startRootIfNeeded(const UniqueIdContents& id);
// Whether the id is NCCL_COMM_ID's, which every communicator made from it
// shares: they meet in one scope of its root (Bootstrap::setSharedScope).
bool isSharedId(const UniqueIdContents& id);
// Connects to the root named by the id (retries on refusal within the deadline).
Result<std::shared_ptr<Store>> connectStore(const UniqueIdContents& id, Deadline deadline);
// An in-process store (tests; ncclCommInitAll).
std::shared_ptr<Store> makeMemoryStore();

// FNV-1a of the bytes: a stable digest for store keys and records.
uint64_t fnv1a(std::string_view bytes);

class Bootstrap {
 public:
  // How long the destructor's leave() may wait for the store, and a look at
  // a round (allGather) for each of its requests.
  static constexpr int64_t kLeaveMs = 1000;

  // `scope` namespaces every key (e.g. the communicator id), so that several
  // communicators share one store.
  Bootstrap(std::shared_ptr<Store> store, std::string scope, int rank, int size);
  // Leaves the scope (leave()) if finish() succeeded and leave() was not called.
  ~Bootstrap();
  Bootstrap(const Bootstrap&) = delete;
  Bootstrap& operator=(const Bootstrap&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::shared_ptr<Store>& store() const { return store_; }
  const std::string& scope() const { return scope_; }

  // Every rank contributes `mine`; returns all contributions by rank. On a
  // deadline the message lists the ranks that did not arrive. While it
  // waits, after 1 s and then less often, it reads a few keys: a failure
  // a rank of the round published (publishRoundFailure: it fails with it),
  // its own record (another process that claims the same rank writes over
  // it: it fails, and says so to the round), rank 0's record, given to
  // `checkFirst` where set (an error fails the round the same way), and,
  // after setGeneration, which ranks are gone (setWill: one of them with no
  // record in the round fails it, kRemoteError naming the rank). The first
  // round (the check-in) fails the same way once a rank's will stands in
  // for its record.
  using RecordCheck = std::function<Status(std::string_view rankZeroRecord)>;
  Result<std::vector<std::string>> allGather(std::string_view mine, Deadline deadline,
                                             const RecordCheck& checkFirst = {});
  // Tells the ranks still waiting in the last allGather round why it cannot
  // complete (a record this rank read is wrong, a rank will not come),
  // within a short deadline; they fail with the same code.
  void publishRoundFailure(const Status& why);
  Status barrier(Deadline deadline);
  // The last store step of a set-up, for when the root lives in rank 0's
  // process (ncclGetUniqueId there): after it, rank 0 may return and its
  // process exit without breaking the others' set-up. Every other rank records
  // that it no longer needs the root and returns; rank 0 returns once all have
  // (on its deadline the error lists who did not). A non-zero rank treats a
  // root that vanishes while answering its record as done: the root vanishes
  // only once rank 0 has them all, or with rank 0 itself. Rank 0 then erases
  // the last allGather's keys: every rank has read them. In a shared scope
  // (setSharedScope) the other ranks wait for that (cleanKey), as they wait
  // in a round: the next communicator's check-in, in the same keys, must not
  // read this one's records.
  Status finish(Deadline deadline);
  // Later communicators meet in this scope too (NCCL_COMM_ID's id is the
  // same for every one): set before finish().
  void setSharedScope() { sharedScope_ = true; }
  // After setGeneration: the communicator's generation (the same on every
  // rank), which names what is its own within a shared scope.
  uint64_t generation() const { return generation_; }
  // This rank is done with the scope for good (its communicator is being
  // destroyed); only after a successful finish(), otherwise a no-op. The last
  // rank to leave erases what the scope still holds: every rank's last
  // allGather key, the leave records, the failure reports and the wills
  // written. Never waits for another rank: a rank that never leaves (it
  // died) leaves those keys to the tenant's end (root_server.h).
  Status leave(Deadline deadline);
  // Where a failing rank publishes why (Communicator::handleFailure), so that
  // leave() can erase it. Within the scope, under the communicator's
  // generation: set it (the same on every rank) before the first report.
  std::string failureKey(int rank) const;
  // Where a failing rank publishes its draft report, its own view, while it
  // reads what the peers it waited on reported (the final report then goes
  // under failureKey).
  std::string failureDraftKey(int rank) const;
  // Where leave() records that a rank left (until the last rank leaves).
  std::string leftKey(int rank) const;
  // Where the root writes a rank's will (setWill): under that rank's nonce,
  // known to the others after setGeneration (before it, only this rank's own
  // key is right).
  std::string goneKey(int rank) const;
  // Where every rank's will also leaves a mark (the first rank gone names it).
  std::string someGoneKey() const;
  // Leaves `report` with the store for when this process's connection to it
  // closes before the rank leaves (Store::setWill): a process that exits
  // with its communicator live is then named within moments, over any
  // transport, by the ranks that wait for it. Before the first allGather
  // (the check-in), with this rank's `nonce` (random per communicator): the
  // will stands in for this rank's check-in record until it gives it, so
  // that a rank that ends before it checks in fails the check-in,
  // kRemoteError naming it, instead of leaving the others to their
  // deadline; and one under goneKey(rank), which names it once the others
  // have read its record.
  // Cancelled by leave() and the destructor.
  Status setWill(std::string_view report, uint64_t nonce, Deadline deadline);
  // After the check-in, every rank's nonce by rank (the same on every rank):
  // rank 0's is the communicator's generation. It names this communicator's
  // rounds after the check-in, failure reports, leave records and wills
  // apart from those of another one in the same scope (NCCL_COMM_ID gives
  // every one the same scope): only the check-in's keys are shared.
  // From then on a rank waiting in allGather also looks for the wills of
  // the ranks whose records are missing: one whose process ended fails the
  // round within seconds instead of at its deadline. (Not a failure report:
  // a rank whose communicator failed may still take part in a split.) With
  // a will set, it withdraws the check-in's will (whose key the next
  // rounds erase) and adds the mark (someGoneKey).
  Status setGeneration(std::vector<uint64_t> nonces, Deadline deadline);
  // This rank will not take part again (its communicator's set-up failed):
  // `report` goes where its will would (in place of its check-in record
  // until the check-in is over, under goneKey once its record is given), so
  // that the ranks waiting for it fail as they would for a rank whose
  // process ended, naming it with `report`, instead of at their deadline.
  // Best effort, within 1 s.
  void abandon(std::string_view report);

 private:
  // When a rank waiting in allGather looks at the round (lookAtRound): after
  // 1 s, then after twice the last interval, up to 32 s (three keys each).
  static constexpr int64_t kFirstLookMs = 1000;
  static constexpr int64_t kMostLookMs = 32000;
  std::string roundFailureKey(uint64_t round) const;
  // "<scope>" for the check-in (round 0) and before setGeneration, else
  // "<scope>/g<generation>": where a round's keys are.
  std::string roundScope(uint64_t round) const;
  // finish()'s record of `rank` (its last round read), and rank 0's word,
  // in a shared scope, that it has erased the set-up's keys.
  std::string doneKey(uint64_t round, int rank) const;
  std::string cleanKey() const;
  // A look of a waiting allGather at its round (see allGather); `stop` ends
  // its requests.
  Status lookAtRound(uint64_t round, std::string_view mine, const RecordCheck& checkFirst,
                     const std::atomic<bool>* stop);
  // Part of a look (after setGeneration): a rank that is gone (its will
  // written) and has no record in the round (`recordKey`) will not come.
  // One key while nobody is gone (someGoneKey), so that thousands of ranks
  // looking load the root little; the first look also reads the wills of
  // the next kNeighboursLookedAt ranks, since a rank that ended in the
  // check-in, after its record, left no mark: one found is marked, and the
  // ranks beyond find it through the mark at their next look.
  Status lookForGoneRanks(const std::function<std::string(int)>& recordKey, Deadline deadline);
  static constexpr int kNeighboursLookedAt = 4;
  // The check-in's records: a will in place of one (setWill) fails it.
  Status checkInGone(const std::vector<std::string>& records);
  // The round's wait: one get, and the looks on a thread beside it (`stop`
  // ends a look's requests; an error fails the round with it).
  using Look = std::function<Status(const std::atomic<bool>* stop)>;
  Result<std::vector<std::string>> awaitRound(const std::vector<std::string>& keys, const Look& look,
                                              Deadline deadline);
  Status missingRanks(const std::vector<std::string>& keys, const std::vector<int>& ranks, const Status& failed,
                      const std::string& what);

  std::shared_ptr<Store> store_;
  std::string scope_;
  int rank_;
  int size_;
  uint64_t round_ = 0;            // rounds of allGather and finish, in call order
  int64_t lastGatherRound_ = -1;  // this rank's allGather key still in the store
  std::string lastRankZeroRecord_;  // rank 0's record of the last allGather (publishRoundFailure)
  bool finished_ = false;         // finish() succeeded: every rank took part
  uint64_t generation_ = 0;       // names this communicator's keys after the check-in (setGeneration)
  bool hasGeneration_ = false;
  bool sharedScope_ = false;      // setSharedScope
  std::vector<uint64_t> nonces_;  // by rank (setGeneration)
  uint64_t nonce_ = 0;            // this rank's (setWill)
  // Where this rank is in the check-in (the first allGather): its record
  // not given yet, given, every record read and none a will, or one a will.
  enum class CheckIn { kNotGiven, kGiven, kDone, kFailed };
  CheckIn checkIn_ = CheckIn::kNotGiven;
  bool lookedAtNeighbours_ = false;  // lookForGoneRanks trusts the mark from then on
  bool left_ = false;
  // Wills the store holds for this rank, to cancel (cancelWills).
  bool goneWill_ = false, markWill_ = false, checkInWill_ = false;
  bool willsLeft_ = false;  // setWill succeeded
  std::string roundKey(uint64_t round, int rank) const;  // a rank's record in an allGather round
  std::string checkInKey() const;                        // this rank's record in the first allGather
  // A rank's will under its nonce in hex (goneKey, or as a check-in will names it).
  std::string goneKeyUnder(std::string_view nonceHex, int rank) const;
  // Marks `rank` as the first one gone (someGoneKey).
  Status markGone(int rank, Deadline deadline);
  // Withdraws this rank's wills still set (`onlyCheckIn`: the check-in's).
  void cancelWills(Deadline deadline, bool onlyCheckIn = false);
};

}  // namespace shoal
