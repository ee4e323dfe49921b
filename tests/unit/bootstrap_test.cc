// src/bootstrap: ncclUniqueId layout, memory and TCP stores, Bootstrap
// allGather/barrier, the root's defences, NCCL_COMM_ID. Loopback only.
#include <catch2/catch.hpp>

#include <nccl.h>

#include <atomic>
#include <barrier>
#include <cstdlib>
#include <cstring>
#include <future>
#include <thread>

#include "bootstrap/bootstrap.h"
#include "bootstrap/survivors.h"
#include "bootstrap/root_server.h"
#include "bootstrap/store_protocol.h"
#include "core/params.h"
#include "net/crypto.h"
#include "net/socket.h"

namespace shoal {
namespace {

using namespace bootstrap_wire;

void useLoopback() {
  setenv("NCCL_SOCKET_IFNAME", "lo", 1);
  reloadParams();
}

UniqueIdContents sampleId(const char* address) {
  UniqueIdContents id;
  id.magic = 0x1122334455667788ull;
  for (int i = 0; i < 32; ++i) id.secret[i] = static_cast<uint8_t>(i * 11 + 1);
  id.address = address;
  return id;
}

// A root of our own, started with the current params (tests that need a short
// handshake timeout set it first).
UniqueIdContents startPrivateRoot() {
  Result<RootServer*> root = RootServer::start(net::SocketAddress::parse("127.0.0.1:0").value(), false);
  REQUIRE(root.isOk());
  UniqueIdContents id;
  REQUIRE(net::randomBytes(&id.magic, 8).isOk());
  REQUIRE(net::randomBytes(id.secret, 32).isOk());
  id.address = root.value()->address().toString();
  root.value()->addTenant(id.magic, id.secret);
  return id;
}

std::shared_ptr<Store> mustConnect(const UniqueIdContents& id) {
  Result<std::shared_ptr<Store>> store = connectStore(id, Deadline::afterMs(10000));
  INFO(store.status().toString());
  REQUIRE(store.isOk());
  return store.value();
}

// Runs `ranks` threads of fn(rank) and returns their statuses.
std::vector<Status> runRanks(int ranks, const std::function<Status(int)>& fn) {
  std::vector<std::future<Status>> futures;
  for (int r = 0; r < ranks; ++r) futures.push_back(std::async(std::launch::async, fn, r));
  std::vector<Status> out;
  for (auto& f : futures) out.push_back(f.get());
  return out;
}

bool sameUsage(const RootServer::Usage& a, const RootServer::Usage& b) {
  return a.tenants == b.tenants && a.storedValues == b.storedValues && a.connections == b.connections;
}

// The root's figures once they equal `want` (closes and erasures reach it a
// moment after the client moved on), or the last ones after 10 s.
RootServer::Usage settledUsage(const RootServer& root, const RootServer::Usage& want) {
  Deadline deadline = Deadline::afterMs(10000);
  RootServer::Usage now = root.usage();
  while (!sameUsage(now, want) && !deadline.expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    now = root.usage();
  }
  return now;
}

void checkUsage(const RootServer::Usage& got, const RootServer::Usage& want) {
  CHECK(got.tenants == want.tenants);
  CHECK(got.storedValues == want.storedValues);
  CHECK(got.connections == want.connections);
}

Status ncclStatus(ncclResult_t rc, const char* what) {
  if (rc == ncclSuccess) return Status::ok();
  return internalError(what, ": ", ncclGetErrorString(rc), " (", ncclGetLastError(nullptr), ")");
}

void requireAllOk(const std::vector<Status>& statuses) {
  for (size_t r = 0; r < statuses.size(); ++r) {
    INFO("rank " << r << ": " << statuses[r].toString());
    REQUIRE(statuses[r].isOk());
  }
}

// Every rank gathers "<rank>-<round>" `rounds` times, with a barrier after each.
Status gatherRounds(std::shared_ptr<Store> store, const std::string& scope, int rank, int size, int rounds) {
  Bootstrap bootstrap(std::move(store), scope, rank, size);
  for (int round = 0; round < rounds; ++round) {
    SHOAL_ASSIGN_OR_RETURN(std::vector<std::string> all,
                           bootstrap.allGather(str(rank, "-", round), Deadline::afterMs(20000)));
    if (all.size() != static_cast<size_t>(size)) return internalError("wrong size");
    for (int r = 0; r < size; ++r)
      if (all[static_cast<size_t>(r)] != str(r, "-", round))
        return internalError("round ", round, ": rank ", r, " gave '", all[static_cast<size_t>(r)], "'");
    SHOAL_TRY(bootstrap.barrier(Deadline::afterMs(20000)));
  }
  return Status::ok();
}

void checkStoreBasics(Store& store) {
  REQUIRE(store.set("a", "1", Deadline::afterMs(5000)).isOk());
  REQUIRE(store.set("b", std::string("\0two\0", 5), Deadline::afterMs(5000)).isOk());
  auto values = store.get({"b", "a"}, Deadline::afterMs(5000));
  REQUIRE(values.isOk());
  REQUIRE(values.value() == std::vector<std::string>{std::string("\0two\0", 5), "1"});
  REQUIRE(store.set("a", "one", Deadline::afterMs(5000)).isOk());  // overwrite
  REQUIRE(store.get({"a"}, Deadline::afterMs(5000)).value() == std::vector<std::string>{"one"});
  auto exists = store.check({"a", "zz", "b"}, Deadline::afterMs(5000));
  REQUIRE(exists.isOk());
  REQUIRE(exists.value() == std::vector<bool>{true, false, true});
  REQUIRE(store.erase({"a", "never-set"}, Deadline::afterMs(5000)).isOk());
  REQUIRE(store.check({"a", "b"}, Deadline::afterMs(5000)).value() == std::vector<bool>{false, true});

  int64_t start = nowNs();
  auto missing = store.get({"b", "missing-key"}, Deadline::afterMs(200));
  REQUIRE(missing.status().code() == Code::kTimeout);
  REQUIRE_THAT(missing.status().message(), Catch::Contains("missing-key"));
  REQUIRE((nowNs() - start) / 1000000 >= 190);

  // A get waits for a key set later.
  auto late = std::async(std::launch::async, [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    return store.set("late", "here", Deadline::afterMs(5000));
  });
  auto got = store.get({"late"}, Deadline::afterMs(5000));
  REQUIRE(late.get().isOk());
  REQUIRE(got.isOk());
  REQUIRE(got.value()[0] == "here");
}

}  // namespace

TEST_CASE("ncclUniqueId encodes into 128 bytes and decodes back", "[bootstrap]") {
  for (const char* address : {"10.0.0.1:5000", "[fd00::17]:65535", "127.0.0.1:1"}) {
    UniqueIdContents id = sampleId(address);
    char bytes[UniqueIdContents::kBytes];
    encodeUniqueId(id, bytes);
    Result<UniqueIdContents> back = decodeUniqueId(bytes);
    REQUIRE(back.isOk());
    REQUIRE(back->magic == id.magic);
    REQUIRE(std::memcmp(back->secret, id.secret, 32) == 0);
    REQUIRE(back->address == address);
  }
}

TEST_CASE("decodeUniqueId rejects garbage with kInvalidArgument", "[bootstrap]") {
  char good[UniqueIdContents::kBytes];
  encodeUniqueId(sampleId("10.0.0.1:5000"), good);
  auto rejects = [](const char* bytes) {
    Result<UniqueIdContents> r = decodeUniqueId(bytes);
    return !r.isOk() && r.status().code() == Code::kInvalidArgument;
  };
  for (int i = 0; i < 1000; ++i) {
    char random[UniqueIdContents::kBytes];
    REQUIRE(net::randomBytes(random, sizeof(random)).isOk());
    REQUIRE(rejects(random));
  }
  char zero[UniqueIdContents::kBytes] = {};
  REQUIRE(rejects(zero));
  for (int offset : {8, 12, 13, 14, 16, 24, 100, 127}) {  // tag, version, family, port, scope, padding, tail
    char bad[UniqueIdContents::kBytes];
    std::memcpy(bad, good, sizeof(bad));
    bad[offset] = static_cast<char>(bad[offset] ^ (offset == 14 ? good[14] : 0x5a));
    if (offset == 14) bad[15] = 0;  // port 0
    INFO("offset " << offset);
    REQUIRE(rejects(bad));
  }
}

TEST_CASE("memory store", "[bootstrap]") {
  auto store = makeMemoryStore();
  REQUIRE(store->describe() == "memory");
  checkStoreBasics(*store);
}

TEST_CASE("tcp store: basics / large values / many threads on one connection", "[bootstrap]") {
  useLoopback();
  Result<UniqueIdContents> id = createUniqueId();
  REQUIRE(id.isOk());
  REQUIRE_THAT(id->address, Catch::StartsWith("127.0.0.1:"));
  auto store = mustConnect(id.value());
  REQUIRE_THAT(store->describe(), Catch::StartsWith("tcp 127.0.0.1:"));
  checkStoreBasics(*store);

  std::string big(10 << 20, 'x');
  big[12345] = 'y';
  Status setBig = store->set("big", big, Deadline::afterMs(20000));
  INFO(setBig.toString());
  REQUIRE(setBig.isOk());
  auto other = mustConnect(id.value());
  auto got = other->get({"big"}, Deadline::afterMs(20000));
  INFO(got.status().toString());
  REQUIRE(got.isOk());
  REQUIRE(got.value()[0] == big);

  // Threads sharing one connection: each waits for keys the others set later,
  // so a waiting get must not hold up anyone's set.
  requireAllOk(runRanks(6, [&](int rank) -> Status {
    std::this_thread::sleep_for(std::chrono::milliseconds(10 * rank));
    SHOAL_TRY(store->set(str("shared/", rank), str("v", rank), Deadline::afterMs(10000)));
    std::vector<std::string> keys;
    for (int r = 0; r < 6; ++r) keys.push_back(str("shared/", r));
    SHOAL_ASSIGN_OR_RETURN(std::vector<std::string> values, store->get(keys, Deadline::afterMs(10000)));
    for (int r = 0; r < 6; ++r)
      if (values[static_cast<size_t>(r)] != str("v", r)) return internalError("bad value");
    return Status::ok();
  }));

  // A second id is served by the same root, in its own key space.
  Result<UniqueIdContents> second = createUniqueId();
  REQUIRE(second.isOk());
  REQUIRE(second->address == id->address);
  REQUIRE(second->magic != id->magic);
  auto secondStore = mustConnect(second.value());
  REQUIRE(secondStore->check({"big"}, Deadline::afterMs(5000)).value() == std::vector<bool>{false});
}

TEST_CASE("tcp store: a will is written when its connection ends, unless cancelled or the key exists",
          "[bootstrap]") {
  useLoopback();
  UniqueIdContents id = startPrivateRoot();
  auto watcher = mustConnect(id);
  auto leaver = mustConnect(id);
  const Deadline soon = Deadline::afterMs(5000);
  REQUIRE(watcher->set("kept", "its own report", soon).isOk());
  REQUIRE(leaver->setWill("gone", "first words", soon).isOk());
  REQUIRE(leaver->setWill("gone", "last words", soon).isOk());  // replaces
  REQUIRE(leaver->setWill("kept", "not these", soon).isOk());
  REQUIRE(leaver->setWill("cancelled", "never", soon).isOk());
  REQUIRE(leaver->cancelWill("cancelled", soon).isOk());
  REQUIRE(leaver->cancelWill("never-willed", soon).isOk());
  // Nothing is written while the connection lives.
  REQUIRE(watcher->check({"gone", "cancelled"}, soon).value() == std::vector<bool>{false, false});
  // A get already waiting for the key is answered when the will is written.
  auto waiting = std::async(std::launch::async, [&] { return watcher->get({"gone"}, Deadline::afterMs(10000)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  leaver.reset();  // the connection ends without a word, as when its process dies
  Result<std::vector<std::string>> got = waiting.get();
  INFO(got.status().toString());
  REQUIRE(got.isOk());
  CHECK(got.value()[0] == "last words");
  CHECK(watcher->get({"kept"}, soon).value()[0] == "its own report");
  CHECK(watcher->check({"cancelled"}, soon).value() == std::vector<bool>{false});

  // The memory store (ranks that are threads of one process) keeps no will.
  auto memory = makeMemoryStore();
  REQUIRE(memory->setWill("gone", "words", soon).isOk());
  REQUIRE(memory->cancelWill("gone", soon).isOk());
  CHECK(memory->check({"gone"}, soon).value() == std::vector<bool>{false});
}

// A store that passes every request on to `inner`: what a test's store
// changes, it overrides.
class ForwardingStore : public Store {
 public:
  explicit ForwardingStore(std::shared_ptr<Store> inner) : inner_(std::move(inner)) {}
  Status set(const std::string& key, std::string_view value, Deadline deadline) override {
    return inner_->set(key, value, deadline);
  }
  Result<std::vector<std::string>> get(const std::vector<std::string>& keys, Deadline deadline) override {
    return inner_->get(keys, deadline);
  }
  Status erase(const std::vector<std::string>& keys, Deadline deadline) override { return inner_->erase(keys, deadline); }
  Result<std::vector<bool>> check(const std::vector<std::string>& keys, Deadline deadline) override {
    return inner_->check(keys, deadline);
  }
  Status setWill(const std::string& key, std::string_view value, Deadline deadline) override {
    return inner_->setWill(key, value, deadline);
  }
  Status cancelWill(const std::string& key, Deadline deadline) override { return inner_->cancelWill(key, deadline); }
  std::string describe() const override { return inner_->describe(); }

 private:
  std::shared_ptr<Store> inner_;
};

// A process that dies cancels nothing: once `dying` is set, its wills stay
// with the root until its connection to it ends (here, when the last handle
// to the inner store goes).
class DyingStore final : public ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  std::atomic<bool> dying{false};
  Status cancelWill(const std::string& key, Deadline deadline) override {
    return dying.load() ? Status::ok() : ForwardingStore::cancelWill(key, deadline);
  }
};

// Six ranks over one private root, each on a connection of its own; rank
// `kGone`'s store cancels nothing, and its connection ends when `dies()`
// frees its Bootstrap, as if its process were killed. Ranks 0, 1, 4 and 5
// look at rank 2's will in their first look; rank 3 does not.
struct WillRanks {
  static constexpr int kRanks = 6, kGone = 2;
  std::vector<std::unique_ptr<Bootstrap>> ranks;
  std::shared_ptr<DyingStore> goneStore;
  explicit WillRanks(const UniqueIdContents& id, const std::string& scope = "s") {
    for (int r = 0; r < kRanks; ++r) {
      std::shared_ptr<Store> store = mustConnect(id);
      if (r == kGone) store = goneStore = std::make_shared<DyingStore>(std::move(store));
      ranks.push_back(std::make_unique<Bootstrap>(store, scope, r, kRanks));
    }
  }
  Status setWill(int rank) {
    return ranks[rank]->setWill(str("rank ", rank, "'s process ended"), 0x100 + rank, Deadline::afterMs(5000));
  }
  Status checkIn(int rank) {
    SHOAL_TRY(ranks[rank]->allGather("x", Deadline::afterMs(10000)).status());
    std::vector<uint64_t> nonces;
    for (int r = 0; r < kRanks; ++r) nonces.push_back(0x100 + r);
    return ranks[rank]->setGeneration(nonces, Deadline::afterMs(5000));
  }
  // Every rank but kGone (and `except`) runs `fn`; their statuses by rank.
  std::vector<Status> others(const std::function<Status(int)>& fn, int except = -1) {
    return runRanks(kRanks, [&](int rank) { return rank == kGone || rank == except ? Status::ok() : fn(rank); });
  }
  Result<std::vector<std::string>> gather(int rank, const char* record = "y") {
    return ranks[rank]->allGather(record, Deadline::afterMs(30000));
  }
  void dies() {
    goneStore->dying = true;
    ranks[kGone].reset();
    goneStore.reset();
  }
};

// Each of `failed` (by rank; kGone's skipped) says that rank 2 will not come
// with `why`.
void checkNamesRankTwo(const std::vector<Status>& failed, const std::string& why) {
  for (int rank = 0; rank < static_cast<int>(failed.size()); ++rank) {
    if (rank == WillRanks::kGone) continue;
    INFO("rank " << rank << ": " << failed[rank].toString());
    CHECK(failed[rank].code() == Code::kRemoteError);
    CHECK_THAT(failed[rank].message(), Catch::Contains("rank 2 will not come: " + why));
  }
}

int64_t msSince(int64_t startNs) { return (nowNs() - startNs) / 1000000; }

// A rank whose process ends after the check-in (its communicator's
// generation known) is named by its will: the ranks waiting for its record in
// a later round fail within seconds naming it, not at their deadline, also
// those whose first look found nobody gone (through the mark).
TEST_CASE("Bootstrap: a rank whose connection ends is named by the ranks waiting for it", "[bootstrap]") {
  useLoopback();
  UniqueIdContents id = startPrivateRoot();
  auto store = mustConnect(id);
  WillRanks w(id);
  // The check-in and one more round: the check-in records are erased.
  requireAllOk(runRanks(WillRanks::kRanks, [&](int rank) -> Status {
    SHOAL_TRY(w.setWill(rank));
    SHOAL_TRY(w.checkIn(rank));
    return w.ranks[rank]->allGather("x", Deadline::afterMs(10000)).status();
  }));
  // The others wait in the next round; their first looks (after 1 s) find
  // nobody gone; then rank 2 goes.
  const int64_t start = nowNs();
  auto waiting = std::async(std::launch::async, [&] { return w.others([&](int r) { return w.gather(r).takeStatus(); }); });
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  w.dies();
  checkNamesRankTwo(waiting.get(), "rank 2's process ended");
  CHECK(msSince(start) < 10000);
  // The check-in's will was withdrawn: nothing was written in place of the
  // erased record.
  CHECK(store->check({"s/ag/0/2"}, Deadline::afterMs(1000)).value() == std::vector<bool>{false});
}

// One that ends in the check-in right after its record (the others read it)
// left no mark (marks follow the check-in): the first looks of the ranks
// before it find its will, mark it, and the rank beyond their reach (3)
// finds it through the mark.
TEST_CASE("Bootstrap: a rank whose process ends in the check-in after its record is named in the next round",
          "[bootstrap]") {
  useLoopback();
  WillRanks w(startPrivateRoot());
  requireAllOk(runRanks(WillRanks::kRanks, [&](int rank) { return w.setWill(rank); }));
  // Rank 2 gives its check-in record and dies at once.
  REQUIRE(w.goneStore->set("s/ag/0/2", "x", Deadline::afterMs(1000)).isOk());
  w.dies();
  requireAllOk(w.others([&](int rank) { return w.checkIn(rank); }));
  const int64_t start = nowNs();
  checkNamesRankTwo(w.others([&](int r) { return w.gather(r).takeStatus(); }), "rank 2's process ended");
  CHECK(msSince(start) < 10000);
}

// A rank whose process ends before it gives its check-in record: its will
// stands in for the record, and the others fail the check-in naming it as
// soon as they have all arrived, however late their wait begins. The last
// of them to read it erases the check-in, so that a later communicator in
// the same scope (NCCL_COMM_ID) does not take it for its own.
TEST_CASE("Bootstrap: a rank whose process ends before it checks in fails the check-in, naming it",
          "[bootstrap]") {
  useLoopback();
  UniqueIdContents id = startPrivateRoot();
  auto store = mustConnect(id);
  WillRanks w(id);
  requireAllOk(runRanks(WillRanks::kRanks, [&](int rank) { return w.setWill(rank); }));
  w.dies();
  // Rank 3 has given its record but not begun to wait.
  REQUIRE(store->set("s/ag/0/3", "x", Deadline::afterMs(1000)).isOk());
  const int64_t start = nowNs();
  std::vector<Status> failed = w.others([&](int r) { return w.gather(r, "x").takeStatus(); }, /*except=*/3);
  CHECK(msSince(start) < 5000);
  failed[3] = remoteError("rank 2 will not come: rank 2's process ended");  // (it has not waited yet)
  checkNamesRankTwo(failed, "rank 2's process ended");
  CHECK_THAT(failed[0].message(), Catch::Contains("bootstrap allGather #0 of s"));
  std::vector<std::string> checkIn;
  for (int r = 0; r < WillRanks::kRanks; ++r) checkIn.push_back(str("s/ag/0/", r));
  CHECK(store->check(checkIn, Deadline::afterMs(1000)).value() == std::vector<bool>(WillRanks::kRanks, true));
  const int64_t late = nowNs();
  Status three = w.gather(3, "x").takeStatus();
  CHECK(msSince(late) < 1000);
  INFO(three.toString());
  CHECK(three.code() == Code::kRemoteError);
  CHECK_THAT(three.message(), Catch::Contains("rank 2 will not come: rank 2's process ended"));
  CHECK(store->check(checkIn, Deadline::afterMs(1000)).value() == std::vector<bool>(WillRanks::kRanks, false));
  // Its other will (under its nonce, 0x102 here) goes with it.
  CHECK(store->check({"s/gone/0000000000000102/2"}, Deadline::afterMs(1000)).value() == std::vector<bool>{false});
}

// A rank whose set-up fails gives up on the scope (abandon): before the
// check-in in place of its record, after it where its will would be. The
// others fail at once, or at their next look, naming it with its reason.
TEST_CASE("Bootstrap: a rank that gives up is named with its reason by the ranks waiting for it", "[bootstrap]") {
  useLoopback();
  WillRanks w(startPrivateRoot());
  requireAllOk(runRanks(WillRanks::kRanks, [&](int rank) { return w.setWill(rank); }));
  SECTION("before the check-in") {
    w.ranks[2]->abandon("rank 2's init failed: no such device");
    checkNamesRankTwo(w.others([&](int r) { return w.gather(r, "x").takeStatus(); }),
                      "rank 2's init failed: no such device");
  }
  SECTION("after the check-in") {
    requireAllOk(runRanks(WillRanks::kRanks, [&](int rank) { return w.checkIn(rank); }));
    SECTION("in the next round") {
      w.ranks[2]->abandon("rank 2's init failed: out of memory");
      const int64_t start = nowNs();
      checkNamesRankTwo(w.others([&](int r) { return w.gather(r).takeStatus(); }),
                        "rank 2's init failed: out of memory");
      CHECK(msSince(start) < 10000);
    }
    SECTION("at the set-up's finish") {
      w.ranks[2]->abandon("rank 2's init failed: no tuner");
      for (int rank = 1; rank < WillRanks::kRanks; ++rank)
        if (rank != 2) REQUIRE(w.ranks[rank]->finish(Deadline::afterMs(1000)).isOk());
      const int64_t start = nowNs();
      Status rankZero = w.ranks[0]->finish(Deadline::afterMs(30000));
      INFO(rankZero.toString());
      CHECK(rankZero.code() == Code::kRemoteError);
      CHECK_THAT(rankZero.message(), Catch::Contains("rank 2 will not come: rank 2's init failed: no tuner"));
      CHECK(msSince(start) < 10000);
    }
  }
}

// A cancel that fails (a root slow to answer) must not leave a mark that
// points the others' looks at a will: the mark goes first, and the cancels
// go on past a failure.
class WillCancelFails final : public ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  Status cancelWill(const std::string& key, Deadline deadline) override {
    if (key.find("/gone/") != std::string::npos && !key.ends_with("/some")) return remoteError("no answer");
    return ForwardingStore::cancelWill(key, deadline);
  }
};

TEST_CASE("Bootstrap: a will whose cancel fails leaves no mark behind", "[bootstrap]") {
  useLoopback();
  UniqueIdContents id = startPrivateRoot();
  auto watcher = mustConnect(id);
  {
    auto store = std::make_shared<WillCancelFails>(mustConnect(id));
    Bootstrap one(store, "solo", 0, 1);
    REQUIRE(one.setWill("rank 0's process ended", 0x100, Deadline::afterMs(5000)).isOk());
    REQUIRE(one.allGather("x", Deadline::afterMs(5000)).isOk());
    REQUIRE(one.setGeneration({0x100}, Deadline::afterMs(5000)).isOk());
  }  // its cancels: the mark's goes through, the will's fails; then its connection ends
  const std::vector<std::string> keys{"solo/gone/0000000000000100/0", "solo/gone/0000000000000100/some"};
  Result<std::vector<std::string>> will = watcher->get({keys[0]}, Deadline::afterMs(5000));
  REQUIRE(will.isOk());  // written: its cancel failed
  CHECK(watcher->check({keys[1]}, Deadline::afterMs(1000)).value() == std::vector<bool>{false});
}

// NCCL_COMM_ID gives every communicator one scope: a check-in that failed
// on a will (here rank 0's: its set-up failed) must leave nothing that the
// next communicator there, whose rank 0 comes last, would read as its own,
// also once the others give up in turn, as their communicators do.
TEST_CASE("Bootstrap: a check-in failed by a will leaves nothing for the next communicator in the scope",
          "[bootstrap]") {
  useLoopback();
  UniqueIdContents id = startPrivateRoot();
  auto store = mustConnect(id);  // keeps the id's keys, as NCCL_COMM_ID's root does
  std::vector<std::string> checkIn;
  for (int r = 0; r < WillRanks::kRanks; ++r) checkIn.push_back(str("comm-id/ag/0/", r));
  {
    WillRanks failed(id, "comm-id");
    requireAllOk(runRanks(WillRanks::kRanks, [&](int rank) { return failed.setWill(rank); }));
    failed.ranks[0]->abandon("rank 0's init failed: no such device");
    std::vector<Status> got = runRanks(WillRanks::kRanks, [&](int rank) {
      if (rank == 0) return Status::ok();
      Status st = failed.gather(rank, "x").takeStatus();
      failed.ranks[rank]->abandon(str("rank ", rank, "'s init failed: ", st.message()));
      return st;
    });
    for (int rank = 1; rank < WillRanks::kRanks; ++rank) {
      INFO(got[rank].toString());
      CHECK_THAT(got[rank].message(), Catch::Contains("rank 0 will not come: rank 0's init failed"));
    }
    CHECK(store->check(checkIn, Deadline::afterMs(1000)).value() == std::vector<bool>(WillRanks::kRanks, false));
  }
  WillRanks next(id, "comm-id");
  requireAllOk(runRanks(WillRanks::kRanks, [&](int rank) -> Status {
    SHOAL_TRY(next.setWill(rank));
    if (rank == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // past the others' first look
    return next.checkIn(rank);
  }));
}

// A failure report is no reason to give up on a rank: one whose communicator
// failed may still come to a split (NCCL allows it), later than the others.
TEST_CASE("Bootstrap: a late rank with a failure report is still waited for", "[bootstrap]") {
  auto store = makeMemoryStore();
  Bootstrap zero(store, "s", 0, 2), one(store, "s", 1, 2);
  requireAllOk(runRanks(2, [&](int rank) -> Status {
    Bootstrap& me = rank == 0 ? zero : one;
    SHOAL_TRY(me.allGather("x", Deadline::afterMs(10000)).status());
    return me.setGeneration({0x77, 0x78}, Deadline::afterMs(1000));
  }));
  REQUIRE(store->set(zero.failureKey(1), "rank 1's communicator failed", Deadline::afterMs(1000)).isOk());
  auto late = std::async(std::launch::async, [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // past rank 0's first look
    return one.allGather("y", Deadline::afterMs(10000)).takeStatus();
  });
  Result<std::vector<std::string>> got = zero.allGather("y", Deadline::afterMs(10000));
  INFO(got.status().toString());
  CHECK(got.isOk());
  CHECK(late.get().isOk());
}

TEST_CASE("Bootstrap allGather and barrier across 4 threads", "[bootstrap]") {
  useLoopback();
  SECTION("memory store") {
    auto store = makeMemoryStore();
    requireAllOk(runRanks(4, [&](int rank) { return gatherRounds(store, "mem", rank, 4, 25); }));
  }
  SECTION("tcp store, one connection per rank") {
    Result<UniqueIdContents> id = createUniqueId();
    REQUIRE(id.isOk());
    // Connected throughout: the root drops an id, keys and all, when its last
    // client leaves.
    auto store = mustConnect(id.value());
    requireAllOk(runRanks(4, [&](int rank) -> Status {
      SHOAL_ASSIGN_OR_RETURN(std::shared_ptr<Store> store, connectStore(id.value(), Deadline::afterMs(10000)));
      return gatherRounds(store, "tcp", rank, 4, 25);
    }));
    // Old rounds were erased; only the last round (50th allGather: 25 gathers
    // + 25 barriers) is left: without finish(), nobody knows all have read it.
    auto exists = store->check({"tcp/ag/0/0", "tcp/ag/0/3", "tcp/ag/48/1", "tcp/ag/49/0", "tcp/ag/49/3"},
                               Deadline::afterMs(5000));
    REQUIRE(exists.isOk());
    REQUIRE(exists.value() == std::vector<bool>{false, false, false, true, true});
  }
}

TEST_CASE("Bootstrap deadline lists the ranks that did not arrive", "[bootstrap]") {
  useLoopback();
  std::shared_ptr<Store> store;
  SECTION("memory store") { store = makeMemoryStore(); }
  SECTION("tcp store") {
    Result<UniqueIdContents> id = createUniqueId();
    REQUIRE(id.isOk());
    store = mustConnect(id.value());
  }
  int64_t start = nowNs();
  std::vector<Status> statuses = runRanks(2, [&](int i) -> Status {
    Bootstrap bootstrap(store, "partial", i * 2, 5);  // ranks 0 and 2 of 5
    return bootstrap.allGather("x", Deadline::afterMs(300)).takeStatus();
  });
  int64_t ms = (nowNs() - start) / 1000000;
  for (const Status& s : statuses) {
    INFO(s.toString());
    REQUIRE(s.code() == Code::kTimeout);
    REQUIRE_THAT(s.message(), Catch::Contains("timed out waiting for 3 ranks: 1, 3-4"));
    REQUIRE_THAT(s.message(), Catch::Contains("partial"));
  }
  REQUIRE(ms < 3000);
}

TEST_CASE("the root rejects forged / foreign / garbage and silent clients without disturbing others",
          "[bootstrap]") {
  useLoopback();
  setenv("SHOAL_HANDSHAKE_TIMEOUT_MS", "2000", 1);
  reloadParams();
  UniqueIdContents id = startPrivateRoot();
  unsetenv("SHOAL_HANDSHAKE_TIMEOUT_MS");
  reloadParams();
  net::SocketAddress root = net::SocketAddress::parse(id.address).value();
  auto raw = [&] {
    Result<net::Fd> fd = net::connectWithRetry(root, Deadline::afterMs(5000));
    REQUIRE(fd.isOk());
    return std::move(fd.value());
  };

  // Clients that never finish a handshake: silent, garbage, half a hello.
  std::vector<net::Fd> strays;
  for (int i = 0; i < 20; ++i) strays.push_back(raw());
  uint8_t garbage[64];
  REQUIRE(net::randomBytes(garbage, sizeof(garbage)).isOk());
  for (int i = 0; i < 5; ++i) {
    strays.push_back(raw());
    REQUIRE(net::writeExact(strays.back().get(), garbage, sizeof(garbage), Deadline::afterMs(1000), "g").isOk());
  }
  strays.push_back(raw());
  REQUIRE(net::writeExact(strays.back().get(), garbage, 7, Deadline::afterMs(1000), "half").isOk());

  // A client that knows the magic but not the secret, answering the challenge
  // with a made-up proof.
  net::Fd forger = raw();
  {
    std::vector<uint8_t> hello;
    Writer w(hello);
    w.u32(kHandshakeTag);
    w.u16(kVersion);
    w.u16(0);
    w.u64(id.magic);
    w.bytes(garbage, kNonceBytes);
    REQUIRE(net::writeExact(forger.get(), hello.data(), hello.size(), Deadline::afterMs(1000), "f").isOk());
    uint8_t challenge[kChallengeBytes];
    REQUIRE(net::readExact(forger.get(), challenge, sizeof(challenge), Deadline::afterMs(2000), "f").isOk());
    REQUIRE(net::writeExact(forger.get(), garbage, kProofBytes, Deadline::afterMs(1000), "f").isOk());
    uint8_t accept[kAcceptBytes];
    Status refused = net::readExact(forger.get(), accept, sizeof(accept), Deadline::afterMs(5000), "forger");
    REQUIRE(refused.code() == Code::kRemoteError);  // closed, not accepted
  }

  // A client with the wrong secret: the root's challenge does not verify.
  UniqueIdContents wrongSecret = id;
  wrongSecret.secret[0] ^= 1;
  Result<std::shared_ptr<Store>> w = connectStore(wrongSecret, Deadline::afterMs(5000));
  REQUIRE(w.status().code() == Code::kRemoteError);
  REQUIRE_THAT(w.status().message(), Catch::Contains("failed to prove"));
  // An id the root does not serve.
  UniqueIdContents foreign = id;
  foreign.magic ^= 0xff;
  Result<std::shared_ptr<Store>> f = connectStore(foreign, Deadline::afterMs(5000));
  REQUIRE(f.status().code() == Code::kRemoteError);
  REQUIRE_THAT(f.status().message(), Catch::Contains("does not serve this ncclUniqueId"));

  // Meanwhile the real ranks are served at full speed.
  int64_t start = nowNs();
  requireAllOk(runRanks(4, [&](int rank) -> Status {
    SHOAL_ASSIGN_OR_RETURN(std::shared_ptr<Store> store, connectStore(id, Deadline::afterMs(10000)));
    return gatherRounds(store, "amid-strays", rank, 4, 3);
  }));
  REQUIRE((nowNs() - start) / 1000000 < 1500);  // well before the strays' handshake deadline

  // Every stray is closed at its handshake deadline.
  for (size_t i = 0; i < strays.size(); ++i) {
    uint8_t byte;
    Status s = net::readExact(strays[i].get(), &byte, 1, Deadline::afterMs(5000), "stray");
    INFO("stray " << i << ": " << s.toString());
    REQUIRE(s.code() == Code::kRemoteError);
  }
}

TEST_CASE("the root caps unfinished handshakes / clients beyond the cap wait / then get in", "[bootstrap]") {
  useLoopback();
  setenv("SHOAL_HANDSHAKE_TIMEOUT_MS", "300", 1);
  reloadParams();
  UniqueIdContents id = startPrivateRoot();
  unsetenv("SHOAL_HANDSHAKE_TIMEOUT_MS");
  reloadParams();
  net::SocketAddress root = net::SocketAddress::parse(id.address).value();
  std::vector<net::Fd> silent;
  for (int i = 0; i < RootServer::kMaxPendingHandshakes + 50; ++i) {
    Result<net::Fd> fd = net::connectWithRetry(root, Deadline::afterMs(5000));
    REQUIRE(fd.isOk());
    silent.push_back(std::move(fd.value()));
  }
  int64_t start = nowNs();
  auto store = mustConnect(id);
  REQUIRE(store->set("k", "v", Deadline::afterMs(5000)).isOk());
  REQUIRE((nowNs() - start) / 1000000 < 5000);
}

namespace {

// A fake root that completes the handshake for `id`, reads the first bytes of
// one request and closes (with the rest of the request unread: a reset), as
// the root does when the process that hosts it exits.
// A root that completes one client's handshake, reads one request header
// and closes; or, `deaf`, never reads anything after the handshake and
// holds the connection until release().
class VanishingRoot {
 public:
  explicit VanishingRoot(bool deaf = false) : deaf_(deaf) {
    Result<net::Fd> l = net::listenOn(net::SocketAddress::parse("127.0.0.1:0").value());
    REQUIRE(l.isOk());
    listener_ = std::move(l.value());
    id_ = sampleId(net::localAddressOf(listener_.get()).value().toString().c_str());
    thread_ = std::thread([this] { serveOnce(); });
  }
  ~VanishingRoot() {
    if (thread_.joinable()) thread_.join();
  }
  const UniqueIdContents& id() const { return id_; }
  void join() { thread_.join(); }
  void release() { released_.store(true); }

 private:
  void serveOnce() {
    net::Fd conn;
    Deadline deadline = Deadline::afterMs(5000);
    while (!conn && !deadline.expired()) {
      (void)net::waitReadable(listener_.get(), deadline);
      Result<net::Fd> accepted = net::acceptOne(listener_.get());
      if (accepted.isOk()) conn = std::move(accepted.value());
    }
    if (!conn) return;
    std::string key = deriveKey(id_.secret, id_.magic);
    uint8_t hello[kClientHelloBytes];
    if (!net::readExact(conn.get(), hello, sizeof(hello), deadline, "fake").isOk()) return;
    uint8_t nonceS[kNonceBytes] = {1, 2, 3};
    net::Digest mac = serverMac(key, hello + 16, nonceS);
    std::vector<uint8_t> challenge;
    Writer w(challenge);
    w.u32(kHandshakeTag);
    w.u16(kVersion);
    w.u16(0);
    w.bytes(nonceS, kNonceBytes);
    w.bytes(mac.data(), mac.size());
    (void)net::writeExact(conn.get(), challenge.data(), challenge.size(), deadline, "fake");
    uint8_t proof[kProofBytes];
    (void)net::readExact(conn.get(), proof, sizeof(proof), deadline, "fake");
    std::vector<uint8_t> accept;
    Writer a(accept);
    a.u32(kAcceptTag);
    (void)net::writeExact(conn.get(), accept.data(), accept.size(), deadline, "fake");
    if (deaf_) {
      Deadline most = Deadline::afterMs(30000);
      while (!released_.load() && !most.expired()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      return;
    }
    uint8_t request[16];
    (void)net::readExact(conn.get(), request, sizeof(request), deadline, "fake");
  }

  bool deaf_;
  std::atomic<bool> released_{false};
  net::Fd listener_;
  UniqueIdContents id_;
  std::thread thread_;
};

}  // namespace

TEST_CASE("a root that goes away fails requests with kRemoteError naming it", "[bootstrap]") {
  useLoopback();
  VanishingRoot fake;
  auto store = mustConnect(fake.id());
  int64_t start = nowNs();
  auto got = store->get({"never"}, Deadline::afterMs(10000));
  fake.join();
  REQUIRE(got.status().code() == Code::kRemoteError);
  REQUIRE_THAT(got.status().message(),
               Catch::Contains("bootstrap root " + fake.id().address + " closed the connection"));
  REQUIRE((nowNs() - start) / 1000000 < 3000);
  // The store stays failed, quickly.
  REQUIRE(store->set("x", "y", Deadline::afterMs(1000)).code() == Code::kRemoteError);
}

// Values that together outgrow a reply frame are refused, saying so; the
// connection (which every communicator of the process shares) stays usable.
// A reply past the limit had broken it for all of them ("malformed frame").
TEST_CASE("a GET whose reply would outgrow a frame is refused and the store stays usable", "[bootstrap]") {
  useLoopback();
  auto store = mustConnect(startPrivateRoot());
  const std::string big(30 << 20, 'v');
  for (const char* key : {"a", "b", "c"}) REQUIRE(store->set(key, big, Deadline::afterMs(20000)).isOk());
  auto all = store->get({"a", "b", "c"}, Deadline::afterMs(20000));
  REQUIRE_FALSE(all.isOk());
  CHECK_THAT(all.status().message(), Catch::Contains("more than a reply holds"));
  REQUIRE(store->set("small", "x", Deadline::afterMs(5000)).isOk());
  auto small = store->get({"small", "a"}, Deadline::afterMs(20000));
  INFO(small.status().toString());
  REQUIRE(small.isOk());
  CHECK(small.value()[0] == "x");
  CHECK(small.value()[1].size() == big.size());
}

// A request the root does not read (its socket full) must not hold up
// other callers of the same store past their own deadlines: they had waited
// for the writer's lock until its deadline.
TEST_CASE("a request stuck in a full socket does not hold up another caller's deadline", "[bootstrap]") {
  useLoopback();
  VanishingRoot fake(/*deaf=*/true);
  auto store = mustConnect(fake.id());
  std::future<Status> big = std::async(std::launch::async, [&] {
    return store->set("big", std::string(48 << 20, 'x'), Deadline::afterMs(20000));  // under the frame limit
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));  // in its write (48 MiB fill the sockets)
  Result<std::vector<std::string>> got = Status::ok();
  int64_t ms = 0;
  for (int attempt = 0; attempt < 20; ++attempt) {
    const int64_t start = nowNs();
    got = store->get({"small"}, Deadline::afterMs(500));
    ms = (nowNs() - start) / 1000000;
    // On a loaded machine the big request may not have started its write
    // yet: this one then went first and waited for a reply the deaf root
    // never sends. Once the big one holds the socket, the next one waits
    // for it, until its own deadline.
    if (got.isOk() || got.status().message().find("no reply from bootstrap root") == std::string::npos) break;
  }
  fake.release();
  fake.join();
  Status bigStatus = big.get();
  INFO(got.status().toString() << " after " << ms << " ms; the big one: " << bigStatus.toString());
  REQUIRE_FALSE(got.isOk());
  CHECK(got.status().code() == Code::kTimeout);
  CHECK_THAT(got.status().message(), Catch::Contains("another request to bootstrap root"));
  CHECK(ms < 2000);
  CHECK_FALSE(bigStatus.isOk());
}

TEST_CASE("Bootstrap finish: rank 0 returns once every rank is done with the root", "[bootstrap]") {
  useLoopback();
  SECTION("all ranks finish, over memory and tcp stores") {
    Result<UniqueIdContents> id = createUniqueId();
    REQUIRE(id.isOk());
    auto memory = makeMemoryStore();
    for (bool tcp : {false, true}) {
      requireAllOk(runRanks(4, [&](int rank) -> Status {
        std::shared_ptr<Store> store = memory;
        if (tcp) {
          SHOAL_ASSIGN_OR_RETURN(store, connectStore(id.value(), Deadline::afterMs(10000)));
        }
        Bootstrap bootstrap(store, "fin", rank, 4);
        SHOAL_TRY(bootstrap.allGather("x", Deadline::afterMs(10000)).status());
        SHOAL_TRY(bootstrap.finish(Deadline::afterMs(10000)));
        // The communicator stays usable afterwards (e.g. a later split).
        SHOAL_TRY(bootstrap.barrier(Deadline::afterMs(10000)));
        return Status::ok();
      }));
    }
    REQUIRE(Bootstrap(memory, "one", 0, 1).finish(Deadline::afterMs(100)).isOk());
  }
  SECTION("rank 0 names the ranks that never finish") {
    auto store = makeMemoryStore();
    std::vector<Status> statuses = runRanks(3, [&](int rank) -> Status {
      Bootstrap bootstrap(store, "fin-missing", rank, 3);
      if (rank == 2) return Status::ok();  // never finishes
      return bootstrap.finish(Deadline::afterMs(300));
    });
    REQUIRE(statuses[1].isOk());
    INFO(statuses[0].toString());
    REQUIRE(statuses[0].code() == Code::kTimeout);
    REQUIRE_THAT(statuses[0].message(), Catch::Contains("timed out waiting for 1 rank: 2"));
  }
  SECTION("a root that vanishes while recording a rank's finish is not that rank's error") {
    VanishingRoot fake;
    auto store = mustConnect(fake.id());
    Bootstrap bootstrap(store, "fin-vanish", 3, 4);
    REQUIRE(bootstrap.finish(Deadline::afterMs(5000)).isOk());
  }
}

TEST_CASE("NCCL_COMM_ID: deterministic id / rank 0 starts the root", "[bootstrap]") {
  useLoopback();
  Result<net::Fd> temp = net::listenOn(net::SocketAddress::parse("127.0.0.1:0").value());
  std::string address = net::localAddressOf(temp->get()).value().toString();
  temp->reset();
  setenv("NCCL_COMM_ID", address.c_str(), 1);
  setenv("NCCL_SOCKET_RETRY_CNT", "2", 1);
  setenv("NCCL_SOCKET_RETRY_SLEEP_MSEC", "10", 1);
  reloadParams();

  Result<UniqueIdContents> a = createUniqueId();
  Result<UniqueIdContents> b = createUniqueId();
  REQUIRE(a.isOk());
  REQUIRE(b.isOk());
  REQUIRE(a->magic == 0x0280028002800280ull);
  REQUIRE(a->address == address);
  char bytesA[UniqueIdContents::kBytes], bytesB[UniqueIdContents::kBytes];
  encodeUniqueId(a.value(), bytesA);
  encodeUniqueId(b.value(), bytesB);
  REQUIRE(std::memcmp(bytesA, bytesB, sizeof(bytesA)) == 0);

  // Not started by createUniqueId.
  Result<std::shared_ptr<Store>> early = connectStore(a.value(), Deadline::afterMs(2000));
  REQUIRE_FALSE(early.isOk());

  // Started by startRootIfNeeded, once, however many threads ask.
  requireAllOk(runRanks(4, [&](int) { return startRootIfNeeded(a.value()); }));
  REQUIRE(startRootIfNeeded(a.value()).isOk());
  requireAllOk(runRanks(3, [&](int rank) -> Status {
    SHOAL_ASSIGN_OR_RETURN(std::shared_ptr<Store> store, connectStore(a.value(), Deadline::afterMs(10000)));
    return gatherRounds(store, "comm-id", rank, 3, 2);
  }));
  // Every communicator made from NCCL_COMM_ID uses this one id and scope:
  // once its clients have left, the root empties it (the last round,
  // "comm-id/ag/3/*", is gone) and serves the next communicator.
  Deadline emptied = Deadline::afterMs(10000);
  for (;;) {
    auto probe = mustConnect(a.value());
    Result<std::vector<bool>> left = probe->check({"comm-id/ag/3/0"}, Deadline::afterMs(1000));
    REQUIRE(left.isOk());
    if (!left.value()[0]) break;
    REQUIRE_FALSE(emptied.expired());
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  requireAllOk(runRanks(3, [&](int rank) -> Status {
    SHOAL_ASSIGN_OR_RETURN(std::shared_ptr<Store> store, connectStore(a.value(), Deadline::afterMs(10000)));
    return gatherRounds(store, "comm-id", rank, 3, 2);
  }));

  UniqueIdContents tampered = a.value();
  tampered.secret[3] ^= 1;
  REQUIRE(startRootIfNeeded(tampered).code() == Code::kInvalidArgument);

  // Port 0 cannot name a root every rank reaches: refused at creation (an id
  // made from it would be refused by every rank's decode).
  setenv("NCCL_COMM_ID", "127.0.0.1:0", 1);
  reloadParams();
  Result<UniqueIdContents> portZero = createUniqueId();
  REQUIRE_FALSE(portZero.isOk());
  CHECK(portZero.status().code() == Code::kInvalidArgument);
  CHECK(portZero.status().message().find("port is 0") != std::string::npos);

  unsetenv("NCCL_COMM_ID");
  unsetenv("NCCL_SOCKET_RETRY_CNT");
  unsetenv("NCCL_SOCKET_RETRY_SLEEP_MSEC");
  reloadParams();
  Result<UniqueIdContents> random = createUniqueId();
  REQUIRE(random.isOk());
  REQUIRE(random->magic != 0x0280028002800280ull);
  REQUIRE(startRootIfNeeded(random.value()).isOk());  // nothing to do
}


TEST_CASE("Bootstrap: finish erases the last round, the last rank to leave empties the scope", "[bootstrap]") {
  auto store = makeMemoryStore();
  constexpr int kRanks = 3;
  std::vector<std::unique_ptr<Bootstrap>> ranks;
  for (int r = 0; r < kRanks; ++r) ranks.push_back(std::make_unique<Bootstrap>(store, "s", r, kRanks));
  auto exist = [&](const std::vector<std::string>& keys) {
    Result<std::vector<bool>> e = store->check(keys, Deadline::afterMs(1000));
    REQUIRE(e.isOk());
    return e.value();
  };
  const std::vector<bool> none(kRanks, false), all(kRanks, true);

  // As a communicator's init: two allGathers (rounds 0, 1), then finish (2).
  requireAllOk(runRanks(kRanks, [&](int rank) -> Status {
    for (int i = 0; i < 2; ++i) SHOAL_TRY(ranks[rank]->allGather("x", Deadline::afterMs(10000)).status());
    return ranks[rank]->finish(Deadline::afterMs(10000));
  }));
  CHECK(exist({"s/ag/0/0", "s/ag/0/1", "s/ag/0/2"}) == none);
  CHECK(exist({"s/ag/1/0", "s/ag/1/1", "s/ag/1/2"}) == none);
  CHECK(exist({"s/done/2/1", "s/done/2/2"}) == std::vector<bool>{false, false});

  // Later use (a split's allGather, round 3) and a failure report.
  requireAllOk(runRanks(kRanks, [&](int rank) { return ranks[rank]->barrier(Deadline::afterMs(10000)); }));
  REQUIRE(store->set(ranks[1]->failureDraftKey(1), "rank 1 failing", Deadline::afterMs(1000)).isOk());
  REQUIRE(store->set(ranks[1]->failureKey(1), "rank 1 failed", Deadline::afterMs(1000)).isOk());
  REQUIRE(store->set(ranks[1]->goneKey(1), "rank 1's process ended", Deadline::afterMs(1000)).isOk());
  REQUIRE(store->set(ranks[1]->someGoneKey(), "1", Deadline::afterMs(1000)).isOk());
  CHECK(exist({"s/ag/3/0", "s/ag/3/1", "s/ag/3/2"}) == all);

  // Rank 2 never leaves (it died): the others do not wait for it.
  int64_t start = nowNs();
  REQUIRE(ranks[0]->leave(Deadline::afterMs(10000)).isOk());
  REQUIRE(ranks[1]->leave(Deadline::afterMs(10000)).isOk());
  CHECK((nowNs() - start) / 1000000 < 1000);
  CHECK(exist({"s/ag/3/0", "s/ag/3/1", "s/ag/3/2"}) == all);
  // The leave records, under the communicator's generation (0 here).
  const std::vector<std::string> left{ranks[0]->leftKey(0), ranks[0]->leftKey(1), ranks[0]->leftKey(2)};
  CHECK(left[0] == "s/left/0000000000000000/0");
  CHECK(exist(left) == std::vector<bool>{true, true, false});

  // The last to leave erases everything the scope holds.
  ranks[2].reset();  // its destructor leaves
  CHECK(exist({"s/ag/3/0", "s/ag/3/1", "s/ag/3/2"}) == none);
  CHECK(exist(left) == none);
  CHECK(exist({ranks[0]->failureKey(1), ranks[0]->failureDraftKey(1), ranks[0]->goneKey(1), ranks[0]->someGoneKey()}) ==
        std::vector<bool>{false, false, false, false});
  REQUIRE(ranks[0]->leave(Deadline::afterMs(1000)).isOk());  // once only
  CHECK(exist({left[0]}) == std::vector<bool>{false});

  // A scope that never finished is not left: its ranks may not all have
  // arrived, and a record nobody completes would stay.
  {
    Bootstrap unfinished(store, "u", 0, 2);
    REQUIRE(unfinished.leave(Deadline::afterMs(1000)).isOk());
  }
  CHECK(exist({"u/left/0"}) == std::vector<bool>{false});

  // One rank: finish erases its own last round.
  Bootstrap single(store, "one", 0, 1);
  REQUIRE(single.allGather("x", Deadline::afterMs(1000)).isOk());
  REQUIRE(single.finish(Deadline::afterMs(1000)).isOk());
  CHECK(exist({"one/ag/0/0"}) == std::vector<bool>{false});
}

// NCCL_COMM_ID gives every communicator made from it one scope: a later one
// must not read an earlier one's failure reports (a rank waiting to connect
// looks for them, ConnectionTable).
TEST_CASE("Bootstrap: failure reports are keyed by the communicator's generation within its scope",
          "[bootstrap]") {
  auto store = makeMemoryStore();
  Bootstrap earlier(store, "s", 0, 2), later(store, "s", 0, 2);
  REQUIRE(earlier.setGeneration({0x1111, 0x1112}, Deadline::afterMs(1000)).isOk());
  REQUIRE(later.setGeneration({0x2222, 0x2223}, Deadline::afterMs(1000)).isOk());
  CHECK(earlier.failureKey(1) != later.failureKey(1));
  CHECK(earlier.failureKey(1).rfind("s/failure/", 0) == 0);
  REQUIRE(store->set(earlier.failureKey(1), "rank 1 failed", Deadline::afterMs(1000)).isOk());
  auto present = store->check({earlier.failureKey(1), later.failureKey(1)}, Deadline::afterMs(1000));
  REQUIRE(present.isOk());
  CHECK(present.value() == std::vector<bool>{true, false});
}

// NCCL_COMM_ID's communicators meet in one scope. Rank 1 goes on to the
// next communicator's check-in as soon as it has finished one; rank 0, here
// slow to erase (its store's erases are late), still has its check-in record
// of the first one there. Rank 1 must not read it as the second one's (it
// then went on alone, and rank 0 waited for it until the set-up deadline),
// and the two communicators' later rounds must not meet.
TEST_CASE("Bootstrap: in a shared scope the next communicator's check-in never reads the last one's records",
          "[bootstrap]") {
  class SlowEraseStore final : public ForwardingStore {
   public:
    using ForwardingStore::ForwardingStore;
    Status erase(const std::vector<std::string>& keys, Deadline deadline) override {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      return ForwardingStore::erase(keys, deadline);
    }
  };
  auto memory = makeMemoryStore();
  auto slow = std::make_shared<SlowEraseStore>(memory);
  std::vector<std::string> secondCheckIn[2], secondRound[2], secondLater[2];
  requireAllOk(runRanks(2, [&](int rank) -> Status {
    std::shared_ptr<Store> store = rank == 0 ? std::shared_ptr<Store>(slow) : memory;
    std::unique_ptr<Bootstrap> comms[2];
    for (int comm = 0; comm < 2; ++comm) {
      const std::string tag = str(comm == 0 ? "first" : "second", " of rank ", rank);
      comms[comm] = std::make_unique<Bootstrap>(store, "c0280028002800280", rank, 2);
      Bootstrap& bootstrap = *comms[comm];
      bootstrap.setSharedScope();
      SHOAL_ASSIGN_OR_RETURN(std::vector<std::string> checkIn, bootstrap.allGather(tag, Deadline::afterMs(10000)));
      SHOAL_TRY(bootstrap.setGeneration({0x100u + comm, 0x200u + comm}, Deadline::afterMs(1000)));
      SHOAL_ASSIGN_OR_RETURN(std::vector<std::string> round, bootstrap.allGather(tag, Deadline::afterMs(10000)));
      SHOAL_TRY(bootstrap.finish(Deadline::afterMs(10000)));
      if (comm == 1) {
        secondCheckIn[rank] = checkIn;
        secondRound[rank] = round;
      }
    }
    // A later round of each (a split's), with the same number: the first
    // one's stays in the store as its last.
    for (int comm = 0; comm < 2; ++comm) {
      const std::string tag = str(comm == 0 ? "later first" : "later second", " of rank ", rank);
      SHOAL_ASSIGN_OR_RETURN(std::vector<std::string> later, comms[comm]->allGather(tag, Deadline::afterMs(10000)));
      if (comm == 1) secondLater[rank] = later;
    }
    return Status::ok();
  }));
  const std::vector<std::string> second{"second of rank 0", "second of rank 1"};
  for (int rank = 0; rank < 2; ++rank) {
    INFO("rank " << rank);
    CHECK(secondCheckIn[rank] == second);
    CHECK(secondRound[rank] == second);
    CHECK(secondLater[rank] == std::vector<std::string>{"later second of rank 0", "later second of rank 1"});
  }
}

TEST_CASE("the root keeps nothing of destroyed communicators: ids, keys and clients back to baseline",
          "[bootstrap]") {
  useLoopback();
  // Starts the root. This id is never used: it stays (as NCCL's root would)
  // and is part of the baseline.
  ncclUniqueId unused;
  REQUIRE(ncclGetUniqueId(&unused) == ncclSuccess);
  RootServer* root = processRootServer();
  REQUIRE(root != nullptr);
  RootServer::Usage baseline = root->usage();
  baseline.connections = 0;  // earlier cases' clients may still be closing
  baseline = settledUsage(*root, baseline);
  REQUIRE(baseline.connections == 0);

  constexpr int kRanks = 3;
  constexpr int kComms = 12;
  std::vector<UniqueIdContents> used;
  for (int c = 0; c < kComms; ++c) {
    ncclUniqueId id;
    REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
    used.push_back(decodeUniqueId(id.internal).value());
    CHECK(root->usage().tenants == baseline.tenants + 1);
    requireAllOk(runRanks(kRanks, [&](int rank) -> Status {
      ncclComm_t comm = nullptr, child = nullptr, grandchild = nullptr;
      SHOAL_TRY(ncclStatus(ncclCommInitRank(&comm, kRanks, id, rank), "init"));
      // A split of a split, as a job carves out groups; one rank sits out.
      SHOAL_TRY(ncclStatus(ncclCommSplit(comm, 0, -rank, &child, nullptr), "split"));
      int color = rank == 0 ? NCCL_SPLIT_NOCOLOR : 1;
      SHOAL_TRY(ncclStatus(ncclCommSplit(child, color, rank, &grandchild, nullptr), "split of the split"));
      if (grandchild) {
        SHOAL_TRY(ncclStatus(ncclCommDestroy(grandchild), "destroy"));
      }
      SHOAL_TRY(ncclStatus(ncclCommDestroy(child), "destroy"));
      return ncclStatus(c % 2 == 0 ? ncclCommDestroy(comm) : ncclCommAbort(comm), "destroy or abort");
    }));
    checkUsage(settledUsage(*root, baseline), baseline);
  }
  // A released id is refused like a foreign one.
  Result<std::shared_ptr<Store>> late = connectStore(used.back(), Deadline::afterMs(5000));
  REQUIRE(late.status().code() == Code::kRemoteError);
  CHECK_THAT(late.status().message(), Catch::Contains("does not serve this ncclUniqueId"));
}

TEST_CASE("a live communicator's keys at the root stay flat while splits of splits come and go",
          "[bootstrap]") {
  useLoopback();
  ncclUniqueId unused;  // starts the root
  REQUIRE(ncclGetUniqueId(&unused) == ncclSuccess);
  RootServer* root = processRootServer();
  REQUIRE(root != nullptr);
  RootServer::Usage baseline = root->usage();
  baseline.connections = 0;
  baseline = settledUsage(*root, baseline);
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);

  constexpr int kRanks = 3;
  constexpr int kSplits = 20;
  std::barrier sync(kRanks + 1);  // the ranks and this thread
  std::vector<std::future<Status>> ranks;
  for (int rank = 0; rank < kRanks; ++rank)
    ranks.push_back(std::async(std::launch::async, [&, rank]() -> Status {
      ncclComm_t parent = nullptr;
      Status st = ncclStatus(ncclCommInitRank(&parent, kRanks, id, rank), "init");
      for (int i = 0; i < kSplits && st.isOk(); ++i) {
        ncclComm_t child = nullptr, grandchild = nullptr;
        st = ncclStatus(ncclCommSplit(parent, 0, rank, &child, nullptr), "split");
        if (st.isOk()) st = ncclStatus(ncclCommSplit(child, 0, rank, &grandchild, nullptr), "split of the split");
        if (grandchild) (void)ncclCommDestroy(grandchild);
        if (child) (void)ncclCommDestroy(child);
      }
      sync.arrive_and_wait();  // every child destroyed; the parent lives
      sync.arrive_and_wait();  // measured
      if (parent) (void)ncclCommDestroy(parent);
      return st;
    }));
  sync.arrive_and_wait();
  // What stays while the parent lives: its last allGather (the last split's),
  // one key per rank; nothing of the 40 destroyed children.
  RootServer::Usage live = baseline;
  live.tenants += 1;
  live.storedValues += kRanks;
  live.connections += kRanks;
  checkUsage(settledUsage(*root, live), live);
  sync.arrive_and_wait();
  for (auto& r : ranks) {
    Status st = r.get();
    INFO(st.toString());
    REQUIRE(st.isOk());
  }
  checkUsage(settledUsage(*root, baseline), baseline);
}

// The first ranks of a set-up all ended (died, or gave up) before the
// others connected: what they left (their wills, their reports) stays with
// the root for the set-up deadline, for the ranks still to come, who read it
// and fail naming them; then it goes. An id whose last client left nothing
// goes at once.
TEST_CASE("the root keeps an id whose last clients left keys behind, for the ranks still to come", "[bootstrap]") {
  useLoopback();
  constexpr int64_t kKeptMs = 3000;
  setenv("SHOAL_INIT_TIMEOUT_MS", std::to_string(kKeptMs).c_str(), 1);
  reloadParams();
  Result<RootServer*> started = RootServer::start(net::SocketAddress::parse("127.0.0.1:0").value(), false);
  unsetenv("SHOAL_INIT_TIMEOUT_MS");
  reloadParams();
  REQUIRE(started.isOk());
  RootServer& root = *started.value();
  auto idOnRoot = [&] {
    UniqueIdContents id;
    REQUIRE(net::randomBytes(&id.magic, 8).isOk());
    REQUIRE(net::randomBytes(id.secret, 32).isOk());
    id.address = root.address().toString();
    root.addTenant(id.magic, id.secret);
    return id;
  };
  auto refused = [](const UniqueIdContents& id) {
    Result<std::shared_ptr<Store>> late = connectStore(id, Deadline::afterMs(5000));
    INFO(late.status().toString());
    CHECK(late.status().code() == Code::kRemoteError);
    CHECK_THAT(late.status().message(), Catch::Contains("does not serve this ncclUniqueId"));
  };
  auto tenantsReach = [&](size_t want) {
    RootServer::Usage u = root.usage();
    u.tenants = want;
    u.connections = 0;
    return settledUsage(root, u).tenants == want;
  };
  auto soon = [] { return Deadline::afterMs(5000); };

  UniqueIdContents failed = idOnRoot();
  REQUIRE(mustConnect(failed)->setWill("s/ag/0/1", "rank 1 will not come", soon()).isOk());  // and its process ends
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  int64_t lastLeftNs = 0;
  {
    auto late = mustConnect(failed);
    Result<std::vector<std::string>> read = late->get({"s/ag/0/1"}, soon());
    REQUIRE(read.isOk());
    CHECK(read.value()[0] == "rank 1 will not come");
    lastLeftNs = nowNs();
  }  // it leaves the key too: kept again, from its leaving
  REQUIRE(root.usage().tenants == 1);
  REQUIRE(tenantsReach(0));
  CHECK((nowNs() - lastLeftNs) / 1000000 >= kKeptMs - 100);
  refused(failed);

  // A communicator that ended well erased its keys: nobody can use its id again.
  UniqueIdContents ended = idOnRoot();
  {
    auto rank = mustConnect(ended);
    REQUIRE(rank->set("s/left/1", "", soon()).isOk());
    REQUIRE(rank->erase({"s/left/1"}, soon()).isOk());
  }
  const int64_t endedNs = nowNs();
  REQUIRE(tenantsReach(0));
  CHECK((nowNs() - endedNs) / 1000000 < kKeptMs);
  refused(ended);
}

// As users meet it: rank 0 hands out the id and comes last; ranks 1 and 2
// both give up in their init before it connects (here: a nonblocking init
// aborted). Rank 0's init fails at once naming one of them, not with "the
// root does not serve this id", nor after the set-up deadline.
TEST_CASE("a rank that comes after every connected rank gave up reads why they did", "[bootstrap]") {
  useLoopback();
  constexpr int kRanks = 3;
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  requireAllOk(runRanks(kRanks - 1, [&](int index) -> Status {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    ncclResult_t rc = ncclCommInitRankConfig(&comm, kRanks, id, index + 1, &config);
    if (rc != ncclInProgress && rc != ncclSuccess) return ncclStatus(rc, "nonblocking init");
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // waiting in the check-in for rank 0
    return ncclStatus(ncclCommAbort(comm), "abort");
  }));
  ncclComm_t comm = nullptr;
  const int64_t start = nowNs();
  const ncclResult_t rc = ncclCommInitRank(&comm, kRanks, id, 0);
  const int64_t ms = (nowNs() - start) / 1000000;
  const std::string last = ncclGetLastError(nullptr);
  INFO(last);
  CHECK(rc == ncclRemoteError);
  CHECK(comm == nullptr);
  CHECK_THAT(last, Catch::Contains("will not come") && Catch::Contains("its init failed"));
  CHECK(ms < 10000);
}

}  // namespace shoal

namespace shoal {
namespace {

// Counts the store's existence checks (the survivors' polls).
class CountingStore final : public ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  Result<std::vector<bool>> check(const std::vector<std::string>& keys, Deadline deadline) override {
    ++checks;
    return ForwardingStore::check(keys, deadline);
  }
  std::atomic<int> checks{0};
};

}  // namespace

// A survivor waiting for a peer that never calls shrink looks less and less
// often (every one of thousands of survivors polls the one root), and still
// names the missing rank at its deadline.
TEST_CASE("survivors waiting for a missing rank back off their polls", "[bootstrap]") {
  CountingStore store(makeMemoryStore());
  Result<SurvivorAgreement> agreed =
      agreeOnSurvivors(store, "shrink/test", 0, 3, /*excluded=*/{2}, /*goneKeys=*/{}, Deadline::afterMs(1500));
  REQUIRE_FALSE(agreed.isOk());
  CHECK(agreed.status().code() == Code::kTimeout);
  CHECK_THAT(agreed.status().message(), Catch::Contains("ranks {1} are not excluded but never called ncclCommShrink"));
  INFO(store.checks.load() << " checks in 1.5 s");
  CHECK(store.checks.load() <= 20);  // every 10 ms: about 150
}

// A survivor whose process ended before it called shrink (its will written)
// is named within about a second, not at the deadline: the caller can shrink
// again without it.
TEST_CASE("survivors waiting for a rank whose process ended name it at once", "[bootstrap]") {
  auto store = makeMemoryStore();
  const std::vector<std::string> goneKeys{"g/0", "g/1", "g/2"};
  REQUIRE(store->set("g/1", "rank 1's process ended", Deadline::afterMs(1000)).isOk());
  const int64_t start = nowNs();
  Result<SurvivorAgreement> agreed =
      agreeOnSurvivors(*store, "shrink/gone", 0, 3, /*excluded=*/{2}, goneKeys, Deadline::afterMs(20000));
  const int64_t ms = (nowNs() - start) / 1000000;
  REQUIRE_FALSE(agreed.isOk());
  CHECK(agreed.status().code() == Code::kRemoteError);
  CHECK_THAT(agreed.status().message(),
             Catch::Contains("rank 1 is not excluded but will never call ncclCommShrink: rank 1's process ended"));
  CHECK_THAT(agreed.status().message(), Catch::Contains("exclude rank 1 too"));
  CHECK(ms < 5000);
  // Excluding it too agrees (no other survivor): nothing else keeps it waiting.
  Result<SurvivorAgreement> again =
      agreeOnSurvivors(*store, "shrink/gone2", 0, 3, /*excluded=*/{1, 2}, goneKeys, Deadline::afterMs(5000));
  REQUIRE(again.isOk());
  CHECK(again.value().survivors == std::vector<int>{0});
}

}  // namespace shoal
