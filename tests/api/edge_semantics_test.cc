// Edge arguments of every nccl.h function, one TEST_CASE per function
// (CTest label "api"): NULL handles and out-pointers, zero counts, NULL
// buffers with zero count, double finalize/destroy/deregister, out-of-range
// codes. Each case asserts the exact ncclResult_t and, for errors, a key
// phrase of ncclGetLastError. The table these cases back, with NCCL 2.30's
// behaviour beside Shoal's, is docs/nccl-compat.md, "Edge arguments,
// function by function". Cases already asserted in nccl_behaviour_test.cc
// are referenced there rather than repeated here.
#include <nccl.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "support/scoped_env.h"

namespace {

const bool kEnvReady = [] {
  ::setenv("SHOAL_PROGRESS_TIMEOUT_MS", "30000", 0);
  ::setenv("SHOAL_INIT_TIMEOUT_MS", "30000", 0);
  ::setenv("NCCL_SOCKET_IFNAME", "lo", 0);
  return true;
}();

std::string lastError() { return ncclGetLastError(nullptr); }

// The call returns `want`; for an error, ncclGetLastError names `phrase`.
#define EXPECT_RC(call, want, phrase)                                                    \
  do {                                                                                   \
    ncclResult_t rc_ = (call);                                                           \
    std::string why_ = lastError();                                                      \
    INFO(#call << " returned " << int(rc_) << " (" << ncclGetErrorString(rc_)            \
               << "); last error: " << why_);                                            \
    CHECK(rc_ == (want));                                                                \
    if ((want) != ncclSuccess && (want) != ncclInProgress)                               \
      CHECK(why_.find(phrase) != std::string::npos);                                     \
  } while (0)

#define EXPECT_OK(call) EXPECT_RC(call, ncclSuccess, "")

// n ranks from ncclCommInitAll, destroyed at the end unless released.
class World {
 public:
  explicit World(int n) : comms_(n, nullptr) {
    REQUIRE(ncclCommInitAll(comms_.data(), n, nullptr) == ncclSuccess);
  }
  World(const World&) = delete;
  World& operator=(const World&) = delete;
  ~World() {
    for (auto c : comms_)
      if (c) (void)ncclCommDestroy(c);
  }
  ncclComm_t operator[](int r) const { return comms_[r]; }
  void release(int r) { comms_[r] = nullptr; }

 private:
  std::vector<ncclComm_t> comms_;
};

ncclComm_t oneRank() {
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  ncclComm_t c = nullptr;
  REQUIRE(ncclCommInitRank(&c, 1, id, 0) == ncclSuccess);
  return c;
}

// A communicator that was destroyed (its handle stays readable in Shoal).
ncclComm_t destroyedComm() {
  ncclComm_t c = oneRank();
  REQUIRE(ncclCommDestroy(c) == ncclSuccess);
  return c;
}

}  // namespace

TEST_CASE("edge: ncclGetVersion", "[api][edge]") {
  EXPECT_RC(ncclGetVersion(nullptr), ncclInvalidArgument, "version");
  int v = 0;
  EXPECT_OK(ncclGetVersion(&v));
  CHECK(v == NCCL_VERSION_CODE);
}

TEST_CASE("edge: ncclGetUniqueId", "[api][edge]") {
  EXPECT_RC(ncclGetUniqueId(nullptr), ncclInvalidArgument, "uniqueId");
  ncclUniqueId a, b;
  EXPECT_OK(ncclGetUniqueId(&a));
  EXPECT_OK(ncclGetUniqueId(&b));
  CHECK(std::memcmp(&a, &b, sizeof a) != 0);  // every call makes a new root
}

TEST_CASE("edge: ncclCommInitRank", "[api][edge]") {
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  ncclComm_t comm = reinterpret_cast<ncclComm_t>(0x1);
  EXPECT_RC(ncclCommInitRank(nullptr, 1, id, 0), ncclInvalidArgument, "newcomm");
  EXPECT_RC(ncclCommInitRank(&comm, 0, id, 0), ncclInvalidArgument, "nranks");
  CHECK(comm == nullptr);  // as NCCL: *newcomm is NULL after a failure
  EXPECT_RC(ncclCommInitRank(&comm, -3, id, 0), ncclInvalidArgument, "nranks");
  EXPECT_RC(ncclCommInitRank(&comm, 1, id, 1), ncclInvalidArgument, "out of range");
  EXPECT_RC(ncclCommInitRank(&comm, 1, id, -1), ncclInvalidArgument, "out of range");
  CHECK(comm == nullptr);
  EXPECT_OK(ncclCommInitRank(&comm, 1, id, 0));  // the id still works
  EXPECT_OK(ncclCommDestroy(comm));
}

TEST_CASE("edge: ncclCommInitRankConfig", "[api][edge]") {
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  ncclComm_t comm = nullptr;
  EXPECT_RC(ncclCommInitRankConfig(nullptr, 1, id, 0, nullptr), ncclInvalidArgument, "newcomm");
  ncclConfig_t bad = NCCL_CONFIG_INITIALIZER;
  bad.magic = 0;
  EXPECT_RC(ncclCommInitRankConfig(&comm, 1, id, 0, &bad), ncclInvalidArgument, "NCCL_CONFIG_INITIALIZER");
  CHECK(comm == nullptr);
  // A NULL config means the defaults (blocking).
  EXPECT_OK(ncclCommInitRankConfig(&comm, 1, id, 0, nullptr));
  REQUIRE(comm != nullptr);
  EXPECT_OK(ncclCommDestroy(comm));
}

TEST_CASE("edge: ncclCommInitRankScalable", "[api][edge]") {
  std::vector<ncclUniqueId> ids(3);
  for (auto& id : ids) REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  ncclComm_t comm = nullptr;
  // nId must be in 1..nranks (nId 0 and a NULL array: nccl_behaviour_test.cc).
  EXPECT_RC(ncclCommInitRankScalable(&comm, 2, 0, 3, ids.data(), nullptr), ncclInvalidArgument,
            "must not exceed nranks");
  EXPECT_RC(ncclCommInitRankScalable(&comm, 1, 0, -1, ids.data(), nullptr), ncclInvalidArgument, "nId");
  EXPECT_RC(ncclCommInitRankScalable(nullptr, 1, 0, 1, ids.data(), nullptr), ncclInvalidArgument, "newcomm");
  CHECK(comm == nullptr);
  EXPECT_OK(ncclCommInitRankScalable(&comm, 1, 0, 1, ids.data(), nullptr));
  EXPECT_OK(ncclCommDestroy(comm));
}

TEST_CASE("edge: ncclCommInitAll", "[api][edge]") {
  ncclComm_t comms[2] = {};
  EXPECT_RC(ncclCommInitAll(nullptr, 1, nullptr), ncclInvalidArgument, "comms");
  EXPECT_RC(ncclCommInitAll(comms, -1, nullptr), ncclInvalidArgument, "ndev");
  EXPECT_RC(ncclCommInitAll(comms, 0, nullptr), ncclInvalidArgument, "ndev");
  // A device twice: several ranks on one GPU, allowed unless
  // NCCL_MULTI_RANK_GPU_ENABLE=0 (docs/cuda.md).
  const int dup[2] = {0, 0};
  {
    shoal::testing::ScopedEnv refuse{{"NCCL_MULTI_RANK_GPU_ENABLE", "0"}};
    EXPECT_RC(ncclCommInitAll(comms, 2, dup), ncclInvalidUsage, "appears twice");
    CHECK(comms[0] == nullptr);
    CHECK(comms[1] == nullptr);
  }
  EXPECT_OK(ncclCommInitAll(comms, 2, dup));
  for (ncclComm_t c : comms) {
    REQUIRE(c != nullptr);
    int device = -1;
    EXPECT_OK(ncclCommCuDevice(c, &device));
    CHECK(device == 0);
  }
  float x[2] = {1.f, 2.f};
  EXPECT_OK(ncclGroupStart());
  for (int r = 0; r < 2; ++r) EXPECT_OK(ncclAllReduce(&x[r], &x[r], 1, ncclFloat, ncclSum, comms[r], nullptr));
  EXPECT_OK(ncclGroupEnd());
  CHECK(x[0] == 3.f);
  CHECK(x[1] == 3.f);
  for (ncclComm_t c : comms) EXPECT_OK(ncclCommDestroy(c));
}

TEST_CASE("edge: ncclCommFinalize", "[api][edge]") {
  EXPECT_OK(ncclCommFinalize(nullptr));  // NCCL: nothing to finalize
  ncclComm_t c = oneRank();
  EXPECT_OK(ncclCommFinalize(c));
  EXPECT_RC(ncclCommFinalize(c), ncclInvalidArgument, "already called");
  ncclResult_t async = ncclInternalError;
  EXPECT_OK(ncclCommGetAsyncError(c, &async));
  CHECK(async == ncclSuccess);
  // Only destroy, abort, queries and deregistrations may follow: a
  // collective or point-to-point call is refused, its buffers untouched.
  float x[2] = {1.f, 2.f};
  EXPECT_RC(ncclAllReduce(&x[0], &x[1], 1, ncclFloat, ncclSum, c, nullptr), ncclInvalidUsage,
            "was finalized (ncclCommFinalize)");
  CHECK(x[1] == 2.f);
  EXPECT_RC(ncclSend(&x[0], 1, ncclFloat, 0, c, nullptr), ncclInvalidUsage, "was finalized");
  int count = 0;
  EXPECT_OK(ncclCommCount(c, &count));
  CHECK(count == 1);
  // Refused inside a group too, which then runs none of it.
  EXPECT_OK(ncclGroupStart());
  EXPECT_RC(ncclRecv(&x[1], 1, ncclFloat, 0, c, nullptr), ncclInvalidUsage, "was finalized");
  EXPECT_RC(ncclGroupEnd(), ncclInvalidUsage, "was finalized");
  EXPECT_OK(ncclCommDestroy(c));
  EXPECT_RC(ncclCommFinalize(c), ncclInvalidArgument, "was destroyed");
}

TEST_CASE("edge: ncclCommDestroy", "[api][edge]") {
  EXPECT_OK(ncclCommDestroy(nullptr));
  ncclComm_t c = oneRank();
  EXPECT_OK(ncclCommDestroy(c));
  EXPECT_RC(ncclCommDestroy(c), ncclInvalidArgument, "was destroyed");
  // Without a Finalize first: Destroy finalizes.
  ncclComm_t d = oneRank();
  float x = 1;
  EXPECT_OK(ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, d, nullptr));
  EXPECT_OK(ncclCommDestroy(d));
}

TEST_CASE("edge: ncclCommAbort", "[api][edge]") {
  EXPECT_OK(ncclCommAbort(nullptr));
  ncclComm_t c = oneRank();
  EXPECT_OK(ncclCommAbort(c));
  EXPECT_RC(ncclCommAbort(c), ncclInvalidArgument, "was destroyed");
  // Abort after Finalize is allowed.
  ncclComm_t d = oneRank();
  EXPECT_OK(ncclCommFinalize(d));
  EXPECT_OK(ncclCommAbort(d));
}

TEST_CASE("edge: ncclCommSplit", "[api][edge]") {
  World w(1);
  ncclComm_t child = reinterpret_cast<ncclComm_t>(0x1);
  EXPECT_RC(ncclCommSplit(nullptr, 0, 0, &child, nullptr), ncclInvalidArgument, "comm is NULL");
  CHECK(child == nullptr);
  EXPECT_RC(ncclCommSplit(w[0], 0, 0, nullptr, nullptr), ncclInvalidArgument, "newcomm");
  EXPECT_RC(ncclCommSplit(w[0], -2, 0, &child, nullptr), ncclInvalidArgument, "color");
  child = reinterpret_cast<ncclComm_t>(0x1);
  EXPECT_OK(ncclCommSplit(w[0], NCCL_SPLIT_NOCOLOR, 0, &child, nullptr));
  CHECK(child == nullptr);  // NOCOLOR: no communicator
  EXPECT_OK(ncclCommSplit(w[0], 0, 0, &child, nullptr));
  REQUIRE(child != nullptr);
  EXPECT_OK(ncclCommDestroy(child));
  EXPECT_RC(ncclCommSplit(destroyedComm(), 0, 0, &child, nullptr), ncclInvalidArgument, "was destroyed");
}

TEST_CASE("edge: ncclCommShrink, Revoke, GetUniqueId, Grow, Suspend, Resume, MemStats", "[api][edge]") {
  EXPECT_OK(ncclCommRevoke(nullptr, NCCL_REVOKE_DEFAULT));  // NCCL: nothing to revoke
  World w(1);
  EXPECT_RC(ncclCommRevoke(w[0], 1), ncclInvalidArgument, "revokeFlags");
  int excl = 0;
  ncclComm_t nc = nullptr;
  // As NCCL: comm, then newcomm, then nRanks (elastic forked-process tests
  // cover the rest).
  EXPECT_RC(ncclCommShrink(nullptr, &excl, 1, &nc, nullptr, NCCL_SHRINK_DEFAULT), ncclInvalidArgument,
            "comm is NULL");
  EXPECT_RC(ncclCommShrink(w[0], &excl, 1, nullptr, nullptr, NCCL_SHRINK_DEFAULT), ncclInvalidArgument,
            "newcomm is NULL");
  ncclUniqueId id;
  EXPECT_RC(ncclCommGetUniqueId(nullptr, &id), ncclInvalidArgument, "comm is NULL");
  EXPECT_RC(ncclCommGrow(nullptr, 2, &id, 1, nullptr, nullptr), ncclInvalidArgument, "newcomm is NULL");
  EXPECT_RC(ncclCommGrow(w[0], 0, nullptr, -1, &nc, nullptr), ncclInvalidArgument, "nRanks");
  // A window registered before the revoke can be deregistered after it.
  void* windowMemory = nullptr;
  EXPECT_OK(ncclMemAlloc(&windowMemory, 1 << 16));
  ncclWindow_t window = nullptr;
  EXPECT_OK(ncclCommWindowRegister(w[0], windowMemory, 1 << 16, &window, NCCL_WIN_COLL_SYMMETRIC));
  REQUIRE(window != nullptr);
  // A revoked communicator refuses collectives and a second revoke.
  EXPECT_OK(ncclCommRevoke(w[0], NCCL_REVOKE_DEFAULT));
  float x = 1, y = 0;
  EXPECT_RC(ncclAllReduce(&x, &y, 1, ncclFloat, ncclSum, w[0], nullptr), ncclInvalidUsage, "revoked");
  EXPECT_RC(ncclCommRevoke(w[0], NCCL_REVOKE_DEFAULT), ncclInvalidArgument, "already revoked");
  // Its queries still answer, as NCCL's (the abort flag skips their readiness check).
  int count = 0, rank = -1, device = -2;
  EXPECT_OK(ncclCommCount(w[0], &count));
  EXPECT_OK(ncclCommUserRank(w[0], &rank));
  EXPECT_OK(ncclCommCuDevice(w[0], &device));
  CHECK(count == 1);
  CHECK(rank == 0);
  EXPECT_OK(ncclCommWindowDeregister(w[0], nullptr));
  EXPECT_OK(ncclCommWindowDeregister(w[0], window));
  EXPECT_OK(ncclMemFree(windowMemory));
  EXPECT_RC(ncclCommSuspend(w[0], NCCL_SUSPEND_MEM), ncclInvalidUsage, "not implemented");
  EXPECT_RC(ncclCommResume(w[0]), ncclInvalidUsage, "not implemented");
  uint64_t value = 0;
  EXPECT_RC(ncclCommMemStats(w[0], ncclStatGpuMemTotal, &value), ncclInvalidUsage, "not implemented");
}

TEST_CASE("edge: ncclGetErrorString", "[api][edge]") {
  for (int code : {-1, int(ncclNumResults), 10, 1234, INT32_MIN})
    CHECK(std::string(ncclGetErrorString(static_cast<ncclResult_t>(code))) == "unknown result code");
  CHECK(std::string(ncclGetErrorString(ncclTimeout)) == "timeout");
}

TEST_CASE("edge: ncclGetLastError", "[api][edge]") {
  const char* s = ncclGetLastError(nullptr);  // comm is unused: NULL is fine
  REQUIRE(s != nullptr);
  REQUIRE(ncclGetVersion(nullptr) == ncclInvalidArgument);
  int count = 0;
  REQUIRE(ncclCommCount(nullptr, &count) == ncclInvalidArgument);
  std::string after = lastError();
  CHECK(after.find("comm is NULL") != std::string::npos);
  // A later success does not clear it (NCCL: "The error is not cleared").
  int v = 0;
  REQUIRE(ncclGetVersion(&v) == ncclSuccess);
  CHECK(lastError() == after);
  // The comm argument is ignored: a live comm gives the same string.
  World w(1);
  CHECK(std::string(ncclGetLastError(w[0])) == after);
}

TEST_CASE("edge: ncclCommGetAsyncError", "[api][edge]") {
  World w(1);
  EXPECT_RC(ncclCommGetAsyncError(w[0], nullptr), ncclInvalidArgument, "asyncError");
  ncclResult_t st = ncclInternalError;
  EXPECT_RC(ncclCommGetAsyncError(nullptr, &st), ncclInvalidArgument, "comm is NULL");
  EXPECT_OK(ncclCommGetAsyncError(w[0], &st));
  CHECK(st == ncclSuccess);
  EXPECT_RC(ncclCommGetAsyncError(destroyedComm(), &st), ncclInvalidArgument, "was destroyed");
}

TEST_CASE("edge: ncclCommCount, ncclCommCuDevice, ncclCommUserRank", "[api][edge]") {
  World w(2);
  int out = -1;
  EXPECT_RC(ncclCommCount(nullptr, &out), ncclInvalidArgument, "comm is NULL");
  EXPECT_RC(ncclCommCuDevice(nullptr, &out), ncclInvalidArgument, "comm is NULL");
  EXPECT_RC(ncclCommUserRank(nullptr, &out), ncclInvalidArgument, "comm is NULL");
  EXPECT_RC(ncclCommCount(w[1], nullptr), ncclInvalidArgument, "count");
  EXPECT_RC(ncclCommCuDevice(w[1], nullptr), ncclInvalidArgument, "device");
  EXPECT_RC(ncclCommUserRank(w[1], nullptr), ncclInvalidArgument, "rank");
  CHECK(out == -1);  // untouched by the failures
  ncclComm_t dead = destroyedComm();
  EXPECT_RC(ncclCommCount(dead, &out), ncclInvalidArgument, "was destroyed");
  EXPECT_RC(ncclCommCuDevice(dead, &out), ncclInvalidArgument, "was destroyed");
  EXPECT_RC(ncclCommUserRank(dead, &out), ncclInvalidArgument, "was destroyed");
  CHECK(out == -1);
  EXPECT_OK(ncclCommCount(w[1], &out));
  CHECK(out == 2);
  EXPECT_OK(ncclCommUserRank(w[1], &out));
  CHECK(out == 1);
}

TEST_CASE("edge: ncclCommRegister, ncclCommDeregister", "[api][edge]") {
  World w(1);
  std::vector<char> buf(256);
  void* h = nullptr;
  EXPECT_RC(ncclCommRegister(w[0], buf.data(), buf.size(), nullptr), ncclInvalidArgument, "handle");
  EXPECT_RC(ncclCommRegister(nullptr, buf.data(), buf.size(), &h), ncclInvalidArgument, "comm is NULL");
  EXPECT_OK(ncclCommRegister(w[0], nullptr, 0, &h));  // an empty range
  EXPECT_OK(ncclCommDeregister(w[0], h));
  // A NULL handle is nothing to deregister (NCCL's ncclCommRegister returns
  // NULL when it skips registration, and callers pass that back).
  EXPECT_OK(ncclCommDeregister(w[0], nullptr));
  EXPECT_RC(ncclCommDeregister(nullptr, nullptr), ncclInvalidArgument, "comm is NULL");
  EXPECT_OK(ncclCommRegister(w[0], buf.data(), buf.size(), &h));
  EXPECT_OK(ncclCommDeregister(w[0], h));
  EXPECT_RC(ncclCommDeregister(w[0], h), ncclInvalidUsage, "not a live registration");
  int junk = 0;
  EXPECT_RC(ncclCommDeregister(w[0], &junk), ncclInvalidUsage, "not a live registration");
}

TEST_CASE("edge: ncclCommWindowRegister, ncclCommWindowDeregister, ncclWinGetUserPtr", "[api][edge]") {
  World w(1);
  std::vector<char> buf(4096);
  ncclWindow_t win = reinterpret_cast<ncclWindow_t>(&buf);  // overwritten with NULL on every error but a NULL win
  EXPECT_RC(ncclCommWindowRegister(w[0], buf.data(), buf.size(), nullptr, NCCL_WIN_DEFAULT), ncclInvalidArgument,
            "win is NULL");
  EXPECT_RC(ncclCommWindowRegister(nullptr, buf.data(), buf.size(), &win, NCCL_WIN_DEFAULT), ncclInvalidArgument,
            "comm");
  CHECK(win == nullptr);
  EXPECT_RC(ncclCommWindowRegister(w[0], nullptr, buf.size(), &win, NCCL_WIN_DEFAULT), ncclInvalidArgument, "memory");
  EXPECT_RC(ncclCommWindowRegister(w[0], buf.data(), 0, &win, NCCL_WIN_DEFAULT), ncclInvalidArgument, "memory");
  EXPECT_RC(ncclCommWindowRegister(w[0], buf.data(), buf.size(), &win, 0x100), ncclInvalidArgument, "winFlags");
  CHECK(win == nullptr);
  EXPECT_RC(ncclCommWindowRegister(destroyedComm(), buf.data(), buf.size(), &win, NCCL_WIN_DEFAULT), ncclInvalidArgument,
            "destroyed");

  EXPECT_OK(ncclCommWindowRegister(w[0], buf.data(), buf.size(), &win, NCCL_WIN_COLL_SYMMETRIC));
  REQUIRE(win != nullptr);
  void* user = nullptr;
  EXPECT_OK(ncclWinGetUserPtr(w[0], win, &user));
  CHECK(user == buf.data());
  EXPECT_RC(ncclWinGetUserPtr(w[0], nullptr, &user), ncclInvalidArgument, "win is NULL");
  EXPECT_RC(ncclWinGetUserPtr(w[0], win, nullptr), ncclInvalidArgument, "outUserPtr");
  EXPECT_RC(ncclWinGetUserPtr(nullptr, win, &user), ncclInvalidArgument, "comm");

  // A window belongs to its communicator.
  ncclComm_t other = oneRank();
  EXPECT_RC(ncclWinGetUserPtr(other, win, &user), ncclInvalidUsage, "not a live window");
  EXPECT_RC(ncclCommWindowDeregister(other, win), ncclInvalidUsage, "not a live window");
  EXPECT_OK(ncclCommDestroy(other));

  // As NCCL: deregistering NULL (what a skipped registration returns) is no error.
  EXPECT_OK(ncclCommWindowDeregister(w[0], nullptr));
  EXPECT_OK(ncclCommWindowDeregister(w[0], win));
  EXPECT_RC(ncclCommWindowDeregister(w[0], win), ncclInvalidUsage, "not a live window");
  EXPECT_RC(ncclWinGetUserPtr(w[0], win, &user), ncclInvalidUsage, "not a live window");

  // A window still registered when its communicator goes is released with it.
  EXPECT_OK(ncclCommWindowRegister(w[0], buf.data() + 64, 128, &win, NCCL_WIN_DEFAULT));
}

TEST_CASE("edge: ncclCommWindowRegister is collective: in a group, one thread registers every rank at ncclGroupEnd",
          "[api][edge]") {
  constexpr int kRanks = 3;
  World w(kRanks);
  std::vector<std::vector<float>> bufs(kRanks, std::vector<float>(1024));
  std::vector<ncclWindow_t> wins(kRanks, reinterpret_cast<ncclWindow_t>(&bufs));
  EXPECT_OK(ncclGroupStart());
  for (int r = 0; r < kRanks; ++r)
    EXPECT_OK(ncclCommWindowRegister(w[r], bufs[r].data(), bufs[r].size() * sizeof(float), &wins[r],
                                     NCCL_WIN_COLL_SYMMETRIC));
  for (int r = 0; r < kRanks; ++r) CHECK(wins[r] == nullptr);  // filled at ncclGroupEnd
  EXPECT_OK(ncclGroupEnd());
  for (int r = 0; r < kRanks; ++r) {
    REQUIRE(wins[r] != nullptr);
    void* user = nullptr;
    EXPECT_OK(ncclWinGetUserPtr(w[r], wins[r], &user));
    CHECK(user == bufs[r].data());
  }
  // The windows' memory works as any other for collectives.
  for (int r = 0; r < kRanks; ++r) std::fill(bufs[r].begin(), bufs[r].end(), float(r + 1));
  EXPECT_OK(ncclGroupStart());
  for (int r = 0; r < kRanks; ++r)
    EXPECT_OK(ncclAllReduce(bufs[r].data(), bufs[r].data(), bufs[r].size(), ncclFloat, ncclSum, w[r], nullptr));
  EXPECT_OK(ncclGroupEnd());
  for (int r = 0; r < kRanks; ++r) CHECK(bufs[r][1023] == 6.0f);
  for (int r = 0; r < kRanks; ++r) EXPECT_OK(ncclCommWindowDeregister(w[r], wins[r]));
}

TEST_CASE("edge: a split and window registrations of one communicator in one group run in call order",
          "[api][edge]") {
  // Each is an exchange over the parent's bootstrap: run together they would
  // meet the peers' in another order.
  constexpr int kRanks = 3;
  World w(kRanks);
  std::vector<std::vector<char>> bufs(kRanks, std::vector<char>(8192));
  std::vector<ncclWindow_t> first(kRanks, nullptr), second(kRanks, nullptr);
  std::vector<ncclComm_t> children(kRanks, nullptr);
  EXPECT_OK(ncclGroupStart());
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_OK(ncclCommWindowRegister(w[r], bufs[r].data(), 4096, &first[r], NCCL_WIN_DEFAULT));
    EXPECT_OK(ncclCommSplit(w[r], r % 2, r, &children[r], nullptr));
    EXPECT_OK(ncclCommWindowRegister(w[r], bufs[r].data() + 4096, 4096, &second[r], NCCL_WIN_DEFAULT));
  }
  EXPECT_OK(ncclGroupEnd());
  for (int r = 0; r < kRanks; ++r) {
    REQUIRE(first[r] != nullptr);
    REQUIRE(second[r] != nullptr);
    REQUIRE(children[r] != nullptr);
    int count = 0;
    EXPECT_OK(ncclCommCount(children[r], &count));
    CHECK(count == (r % 2 == 0 ? 2 : 1));
    void* user = nullptr;
    EXPECT_OK(ncclWinGetUserPtr(w[r], second[r], &user));
    CHECK(user == bufs[r].data() + 4096);
  }
  for (int r = 0; r < kRanks; ++r) EXPECT_OK(ncclCommDestroy(children[r]));
}

TEST_CASE("edge: ncclMemAlloc, ncclMemFree", "[api][edge]") {
  EXPECT_OK(ncclMemFree(nullptr));
  EXPECT_RC(ncclMemAlloc(nullptr, 64), ncclInvalidArgument, "ptr");
  EXPECT_RC(ncclMemAlloc(nullptr, 0), ncclInvalidArgument, "ptr");
  void* p = reinterpret_cast<void*>(0x1);
  EXPECT_OK(ncclMemAlloc(&p, 0));
  EXPECT_OK(ncclMemFree(p));  // whatever size 0 gave back frees
  EXPECT_OK(ncclMemAlloc(&p, 100));
  REQUIRE(p != nullptr);
  EXPECT_OK(ncclMemFree(p));
  EXPECT_RC(ncclMemFree(p), ncclInvalidArgument, "not returned by ncclMemAlloc");  // twice
  // A size whose page rounding would wrap around names the size asked for.
  EXPECT_RC(ncclMemAlloc(&p, SIZE_MAX), ncclInvalidArgument, "18446744073709551615 bytes");
}

TEST_CASE("edge: ncclRedOpCreatePreMulSum", "[api][edge]") {
  World w(1);
  float scalar = 2.f;
  ncclRedOp_t op;
  EXPECT_RC(ncclRedOpCreatePreMulSum(nullptr, &scalar, ncclFloat, ncclScalarHostImmediate, w[0]),
            ncclInvalidArgument, "op is NULL");
  EXPECT_RC(ncclRedOpCreatePreMulSum(&op, nullptr, ncclFloat, ncclScalarHostImmediate, w[0]),
            ncclInvalidArgument, "scalar is NULL");
  EXPECT_RC(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat, static_cast<ncclScalarResidence_t>(7), w[0]),
            ncclInvalidArgument, "residence");
  EXPECT_RC(ncclRedOpCreatePreMulSum(&op, &scalar, static_cast<ncclDataType_t>(-1), ncclScalarHostImmediate,
                                     w[0]),
            ncclInvalidArgument, "data type");
  EXPECT_RC(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat, ncclScalarHostImmediate, nullptr),
            ncclInvalidArgument, "comm is NULL");
  EXPECT_OK(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat, ncclScalarHostImmediate, w[0]));
  CHECK(int(op) >= int(ncclNumOps));
  EXPECT_OK(ncclRedOpDestroy(op, w[0]));
}

// An operator belongs to the communicator that made it: another refuses its
// handle (NCCL mangles handles per communicator), rather than running or
// destroying an operator of its own that happens to share the number.
TEST_CASE("edge: a user-created operator is refused by another communicator", "[api][edge]") {
  World a(1);
  float one = 1.f, three = 3.f;
  ncclRedOp_t opA, opB;
  EXPECT_OK(ncclRedOpCreatePreMulSum(&opA, &one, ncclFloat, ncclScalarHostImmediate, a[0]));
  // Two communicators share a numbering with a chance of 1 in 16,384 (as
  // NCCL's hash): another one then, so that the refusal is what is tested.
  std::unique_ptr<World> other;
  for (int attempt = 0; attempt < 3; ++attempt) {
    other = std::make_unique<World>(1);
    EXPECT_OK(ncclRedOpCreatePreMulSum(&opB, &three, ncclFloat, ncclScalarHostImmediate, (*other)[0]));
    if (opB != opA) break;
    EXPECT_OK(ncclRedOpDestroy(opB, (*other)[0]));
  }
  World& b = *other;
  REQUIRE(opA != opB);
  float x = 2.f, y = 0.f;
  EXPECT_RC(ncclAllReduce(&x, &y, 1, ncclFloat, opA, b[0], nullptr), ncclInvalidArgument,
            "unknown to this communicator");
  CHECK(y == 0.f);
  EXPECT_RC(ncclRedOpDestroy(opA, b[0]), ncclInvalidArgument, "not a live user-created operator");
  EXPECT_OK(ncclAllReduce(&x, &y, 1, ncclFloat, opB, b[0], nullptr));  // still there
  CHECK(y == 6.f);
  EXPECT_OK(ncclAllReduce(&x, &y, 1, ncclFloat, opA, a[0], nullptr));
  CHECK(y == 2.f);
  EXPECT_OK(ncclRedOpDestroy(opA, a[0]));
  EXPECT_OK(ncclRedOpDestroy(opB, b[0]));
  // A destroyed handle is refused by its own communicator too.
  EXPECT_RC(ncclAllReduce(&x, &y, 1, ncclFloat, opA, a[0], nullptr), ncclInvalidArgument,
            "unknown to this communicator");
}

TEST_CASE("edge: ncclRedOpDestroy", "[api][edge]") {
  World w(1);
  float scalar = 2.f;
  ncclRedOp_t op;
  REQUIRE(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat, ncclScalarHostImmediate, w[0]) == ncclSuccess);
  EXPECT_RC(ncclRedOpDestroy(op, nullptr), ncclInvalidArgument, "comm is NULL");
  EXPECT_RC(ncclRedOpDestroy(ncclSum, w[0]), ncclInvalidArgument, "built-in");
  EXPECT_RC(ncclRedOpDestroy(static_cast<ncclRedOp_t>(-1), w[0]), ncclInvalidArgument, "-1");
  EXPECT_RC(ncclRedOpDestroy(ncclMaxRedOp, w[0]), ncclInvalidArgument, "2147483647");
  EXPECT_OK(ncclRedOpDestroy(op, w[0]));
  EXPECT_RC(ncclRedOpDestroy(op, w[0]), ncclInvalidArgument, std::to_string(int(op)));
}

TEST_CASE("edge: collectives with count 0", "[api][edge]") {
  World w(1);
  ncclComm_t c = w[0];
  SECTION("NULL buffers with count 0 succeed") {
    EXPECT_OK(ncclAllReduce(nullptr, nullptr, 0, ncclFloat, ncclSum, c, nullptr));
    EXPECT_OK(ncclReduce(nullptr, nullptr, 0, ncclFloat, ncclSum, 0, c, nullptr));
    EXPECT_OK(ncclBroadcast(nullptr, nullptr, 0, ncclFloat, 0, c, nullptr));
    EXPECT_OK(ncclBcast(nullptr, 0, ncclFloat, 0, c, nullptr));
    EXPECT_OK(ncclReduceScatter(nullptr, nullptr, 0, ncclFloat, ncclSum, c, nullptr));
    EXPECT_OK(ncclAllGather(nullptr, nullptr, 0, ncclFloat, c, nullptr));
    EXPECT_OK(ncclAlltoAll(nullptr, nullptr, 0, ncclFloat, c, nullptr));
    EXPECT_OK(ncclGather(nullptr, nullptr, 0, ncclFloat, 0, c, nullptr));
    EXPECT_OK(ncclScatter(nullptr, nullptr, 0, ncclFloat, 0, c, nullptr));
  }
  SECTION("count 0 still checks the other arguments (NCCL's ArgsCheck runs first)") {
    const auto badType = static_cast<ncclDataType_t>(ncclNumTypes);
    EXPECT_RC(ncclAllReduce(nullptr, nullptr, 0, badType, ncclSum, c, nullptr), ncclInvalidArgument, "data type");
    EXPECT_RC(ncclAllReduce(nullptr, nullptr, 0, ncclFloat, static_cast<ncclRedOp_t>(77), c, nullptr),
              ncclInvalidArgument, "reduction operator");
    EXPECT_RC(ncclBroadcast(nullptr, nullptr, 0, ncclFloat, 1, c, nullptr), ncclInvalidArgument, "root");
    EXPECT_RC(ncclReduce(nullptr, nullptr, 0, ncclFloat, ncclSum, -1, c, nullptr), ncclInvalidArgument, "root");
    EXPECT_RC(ncclAllGather(nullptr, nullptr, 0, ncclFloat, nullptr, nullptr), ncclInvalidArgument, "comm is NULL");
  }
  SECTION("count 0 inside a group, on two ranks, beside real work") {
    World two(2);
    float s[2][4] = {{1, 2, 3, 4}, {10, 20, 30, 40}}, d[2][4] = {};
    REQUIRE(ncclGroupStart() == ncclSuccess);
    for (int r = 0; r < 2; ++r) {
      EXPECT_OK(ncclAllReduce(nullptr, nullptr, 0, ncclFloat, ncclSum, two[r], nullptr));
      EXPECT_OK(ncclAllReduce(s[r], d[r], 4, ncclFloat, ncclSum, two[r], nullptr));
      EXPECT_OK(ncclAllGather(nullptr, nullptr, 0, ncclFloat, two[r], nullptr));
    }
    EXPECT_OK(ncclGroupEnd());
    for (int r = 0; r < 2; ++r) CHECK(d[r][3] == 44.f);
  }
  SECTION("a NULL buffer with a count is an argument error") {
    // NCCL checks pointers only with NCCL_CHECK_MODE != DEFAULT (the GPU
    // would fault); Shoal checks always (more in nccl_behaviour_test.cc).
    EXPECT_RC(ncclAllReduce(nullptr, nullptr, 1, ncclFloat, ncclSum, c, nullptr), ncclInvalidArgument, "NULL");
  }
}

TEST_CASE("edge: ncclSend and ncclRecv", "[api][edge]") {
  World w(1);
  ncclComm_t c = w[0];
  SECTION("zero bytes to self with NULL buffers") {
    REQUIRE(ncclGroupStart() == ncclSuccess);
    EXPECT_OK(ncclSend(nullptr, 0, ncclFloat, 0, c, nullptr));
    EXPECT_OK(ncclRecv(nullptr, 0, ncclFloat, 0, c, nullptr));
    EXPECT_OK(ncclGroupEnd());
  }
  SECTION("a message to self needs both ends in one group") {
    // NCCL: "Trying to send to self without a matching recv" (ncclInvalidUsage).
    float x = 1.f, y = 0.f;
    EXPECT_RC(ncclSend(&x, 1, ncclFloat, 0, c, nullptr), ncclInvalidUsage, "no matching ncclRecv from self");
    EXPECT_RC(ncclRecv(&y, 1, ncclFloat, 0, c, nullptr), ncclInvalidUsage, "no matching ncclSend to self");
    REQUIRE(ncclGroupStart() == ncclSuccess);
    EXPECT_OK(ncclSend(&x, 1, ncclFloat, 0, c, nullptr));
    EXPECT_OK(ncclSend(&x, 1, ncclFloat, 0, c, nullptr));
    EXPECT_OK(ncclRecv(&y, 1, ncclFloat, 0, c, nullptr));
    EXPECT_RC(ncclGroupEnd(), ncclInvalidUsage, "2 ncclSend to self (rank 0) and 1 ncclRecv from self");
    CHECK(y == 0.f);  // nothing of the group ran
    // Paired, it delivers; the communicator still works after the refusals.
    REQUIRE(ncclGroupStart() == ncclSuccess);
    EXPECT_OK(ncclRecv(&y, 1, ncclFloat, 0, c, nullptr));
    EXPECT_OK(ncclSend(&x, 1, ncclFloat, 0, c, nullptr));
    EXPECT_OK(ncclGroupEnd());
    CHECK(y == 1.f);
  }
  SECTION("count 0 still checks peer, type and comm") {
    EXPECT_RC(ncclSend(nullptr, 0, ncclFloat, 1, c, nullptr), ncclInvalidArgument, "peer");
    EXPECT_RC(ncclRecv(nullptr, 0, ncclFloat, -1, c, nullptr), ncclInvalidArgument, "peer");
    EXPECT_RC(ncclSend(nullptr, 0, static_cast<ncclDataType_t>(-1), 0, c, nullptr), ncclInvalidArgument,
              "data type");
    EXPECT_RC(ncclRecv(nullptr, 0, ncclFloat, 0, nullptr, nullptr), ncclInvalidArgument, "comm is NULL");
  }
}

TEST_CASE("edge: ncclGroupStart, ncclGroupEnd, ncclGroupSimulateEnd", "[api][edge]") {
  EXPECT_RC(ncclGroupEnd(), ncclInvalidUsage, "not in a group");
  EXPECT_OK(ncclGroupStart());
  EXPECT_OK(ncclGroupEnd());  // an empty group
  EXPECT_OK(ncclGroupStart());
  EXPECT_OK(ncclGroupStart());
  EXPECT_OK(ncclGroupEnd());
  EXPECT_OK(ncclGroupEnd());
  EXPECT_RC(ncclGroupEnd(), ncclInvalidUsage, "not in a group");
  ncclSimInfo_t info = NCCL_SIM_INFO_INITIALIZER;
  EXPECT_RC(ncclGroupSimulateEnd(&info), ncclInvalidUsage, "not in a group");
  EXPECT_OK(ncclGroupStart());
  EXPECT_OK(ncclGroupSimulateEnd(&info));  // an empty group simulates to nothing
  EXPECT_RC(ncclGroupEnd(), ncclInvalidUsage, "not in a group");
}

TEST_CASE("edge: ncclResetDebugInit", "[api][edge]") {
  ncclResetDebugInit();
  ncclResetDebugInit();  // twice, with no communicator
  int v = 0;
  EXPECT_OK(ncclGetVersion(&v));
  World w(1);  // the library still works
  int n = 0;
  EXPECT_OK(ncclCommCount(w[0], &n));
  CHECK(n == 1);
}

TEST_CASE("edge: ncclParam*", "[api][edge]") {
  ncclParamHandle_t h = nullptr;
  EXPECT_RC(ncclParamBind(nullptr, "NCCL_DEBUG"), ncclInvalidArgument, "out is NULL");
  EXPECT_RC(ncclParamBind(&h, nullptr), ncclInvalidArgument, "key is NULL");
  EXPECT_RC(ncclParamBind(&h, "NCCL_NO_SUCH_KEY"), ncclInvalidArgument, "unknown parameter");
  int64_t i64 = 0;
  const char* str = nullptr;
  EXPECT_RC(ncclParamGetI64(nullptr, &i64), ncclInvalidArgument, "NULL handle");
  EXPECT_RC(ncclParamGetStr(nullptr, &str), ncclInvalidArgument, "NULL handle");
  REQUIRE(ncclParamBind(&h, "SHOAL_PROGRESS_TIMEOUT_MS") == ncclSuccess);
  EXPECT_RC(ncclParamGetI64(h, nullptr), ncclInvalidArgument, "NULL handle or output");
  EXPECT_RC(ncclParamGetStr(h, nullptr), ncclInvalidArgument, "NULL handle or output");
  int len = -1;
  EXPECT_RC(ncclParamGet(nullptr, &i64, 8, &len), ncclInvalidArgument, "NULL handle");
  char small[2];
  EXPECT_RC(ncclParamGet(h, small, sizeof small, &len), ncclInvalidArgument, "needs");
  CHECK(len == static_cast<int>(std::strlen(std::getenv("SHOAL_PROGRESS_TIMEOUT_MS"))) + 1);  // with the NUL
  const char* value = "x";
  int valueLen = 7;
  EXPECT_RC(ncclParamGetParameter("NCCL_NO_SUCH_KEY", &value, &valueLen), ncclInvalidArgument,
            "unknown parameter");
  CHECK(value == nullptr);  // as NCCL: cleared for an unknown key
  CHECK(valueLen == 0);
  EXPECT_RC(ncclParamGetParameter(nullptr, &value, &valueLen), ncclInvalidArgument, "key is NULL");
  EXPECT_RC(ncclParamGetParameter("NCCL_DEBUG", nullptr, &valueLen), ncclInvalidArgument, "NULL output");
  const char** keys = nullptr;
  int nkeys = 0;
  EXPECT_RC(ncclParamGetAllParameterKeys(nullptr, &nkeys), ncclInvalidArgument, "NULL output");
  EXPECT_RC(ncclParamGetAllParameterKeys(&keys, nullptr), ncclInvalidArgument, "NULL output");
}

// NCCL's device API (nccl_device.h) is not offered, but its host functions
// exist: PyTorch resolves them at load. Creating a device communicator is
// refused with the reason; the team queries answer truthfully.
namespace {
struct DeviceApiTeam {
  int nRanks, rank, stride;
};
}  // namespace
extern "C" {
ncclResult_t ncclDevCommCreate(ncclComm_t, const void*, void*);
DeviceApiTeam ncclTeamWorld(ncclComm_t);
DeviceApiTeam ncclTeamLsa(ncclComm_t);
int ncclTeamRankToWorld(ncclComm_t, DeviceApiTeam, int);
}

TEST_CASE("edge: the device API's host functions refuse creation and answer team queries", "[api][edge]") {
  World w(2);
  char devComm[256] = {};
  EXPECT_RC(ncclDevCommCreate(w[1], nullptr, devComm), ncclInvalidUsage, "device API");
  const DeviceApiTeam world = ncclTeamWorld(w[1]);
  CHECK(world.nRanks == 2);
  CHECK(world.rank == 1);
  CHECK(world.stride == 1);
  const DeviceApiTeam lsa = ncclTeamLsa(w[1]);
  CHECK(lsa.nRanks == 1);
  CHECK(lsa.rank == 0);
  CHECK(ncclTeamRankToWorld(w[1], world, 0) == 0);
  CHECK(ncclTeamRankToWorld(w[1], world, 2) == -1);
  CHECK(ncclTeamWorld(nullptr).nRanks == 0);
}
