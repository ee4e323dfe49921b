// Soak tests, ranks as threads of this process (ctest label "soak").
//
// Each case runs one mode (soak.h) at 3 ranks: one thread per rank, each
// with its own communicator from ncclCommInitRank on a shared ncclUniqueId
// (the in-process transport). Rank 0 samples the process's threads, fds,
// /dev/shm entries, RSS and heap after warm-up, between thirds of the run,
// after it and after teardown; the figures go to stdout (README.md).
//
// The churn modes have two cases: one asserts threads, fds, /dev/shm and
// RSS; the other ("keeps the heap flat") asserts that the heap does not grow
// in every third of the run (rank 0 hosts the bootstrap root, which once kept
// every communicator's keys and id: README.md, "What the soak found").
#include <catch2/catch.hpp>

#include "soak/soak.h"

using namespace shoal::soak;

namespace {

constexpr int kRanks = 3;

// mask: the bits of runModesOnce's code that fail this case.
void runCase(Mode m, int mask) {
  std::vector<int> codes =
      runThreadRanks(kRanks, [m](RankLink& link) { return runModesOnce(link, {m}, Slack{}); });
  for (size_t r = 0; r < codes.size(); ++r) {
    INFO("rank " << r << " of mode " << modeName(m) << " returned " << codes[r]
                 << " (1: library error or wrong data, 2: threads/fds/shm/RSS did not come back, "
                    "4: the heap grew in every third of the run; figures on stdout)");
    CHECK((codes[r] == 1 || codes[r] == 3 ? codes[r] : codes[r] & mask) == 0);
  }
}

constexpr int kAll = 2 | 4;
constexpr int kResources = 2;
constexpr int kHeap = 4;

}  // namespace

TEST_CASE("soak threads blocking collectives", "[soak][threads]") { runCase(Mode::kBlocking, kAll); }
TEST_CASE("soak threads nonblocking communicator", "[soak][threads]") { runCase(Mode::kNonblocking, kAll); }
TEST_CASE("soak threads host streams", "[soak][threads]") { runCase(Mode::kHostStream, kAll); }
TEST_CASE("soak threads grouped ops", "[soak][threads]") { runCase(Mode::kGrouped, kAll); }
TEST_CASE("soak threads split and destroy churn", "[soak][threads]") { runCase(Mode::kSplit, kResources); }
TEST_CASE("soak threads init and destroy churn", "[soak][threads]") { runCase(Mode::kInitDestroy, kResources); }
TEST_CASE("soak threads abort mid-operation churn", "[soak][threads]") { runCase(Mode::kAbort, kResources); }

TEST_CASE("soak threads split and destroy churn keeps the heap flat", "[soak][threads][heap]") {
  runCase(Mode::kSplit, kHeap);
}
TEST_CASE("soak threads init and destroy churn keeps the heap flat", "[soak][threads][heap]") {
  runCase(Mode::kInitDestroy, kHeap);
}
TEST_CASE("soak threads abort mid-operation churn keeps the heap flat", "[soak][threads][heap]") {
  runCase(Mode::kAbort, kHeap);
}
