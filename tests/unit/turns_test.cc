// Turns (core/turns.h): work taken in one order runs in that order on any
// threads, a turn given up unused passes on, and a wait ends at its deadline.
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "core/turns.h"

using namespace shoal;

TEST_CASE("turns run in the order they were taken, whichever threads run them", "[unit][turns]") {
  auto turns = Turns::make();
  constexpr int kTurns = 16;
  std::vector<std::shared_ptr<Turns::Turn>> taken;
  for (int k = 0; k < kTurns; ++k) taken.push_back(turns->take());
  std::mutex mutex;
  std::vector<int> ran;
  std::atomic<int> failedWaits{0};  // Catch's assertions are not for other threads
  std::vector<std::thread> threads;
  // Started last to first: each waits for the ones taken before it.
  for (int k = kTurns - 1; k >= 0; --k)
    threads.emplace_back([&, k, turn = taken[k]] {
      if (!turn->wait(Deadline::afterMs(10000), "test").isOk()) ++failedWaits;
      {
        std::lock_guard<std::mutex> lock(mutex);
        ran.push_back(k);
      }
      turn->done();
    });
  taken.clear();
  for (auto& t : threads) t.join();
  CHECK(failedWaits == 0);
  std::vector<int> inOrder(kTurns);
  for (int k = 0; k < kTurns; ++k) inOrder[k] = k;
  CHECK(ran == inOrder);
}

TEST_CASE("a turn given up unused lets the next one go", "[unit][turns]") {
  auto turns = Turns::make();
  auto first = turns->take();
  auto second = turns->take();
  auto third = turns->take();
  second.reset();  // abandoned before its turn: skipped when the first is done
  CHECK(third->wait(Deadline::afterMs(50), "third").code() == Code::kTimeout);
  first->done();
  CHECK(third->wait(Deadline::afterMs(1000), "third").isOk());
}

TEST_CASE("a wait for a turn ends at its deadline or its cancel flag, naming the work", "[unit][turns]") {
  auto turns = Turns::make();
  auto first = turns->take();
  auto second = turns->take();
  const auto t0 = std::chrono::steady_clock::now();
  Status late = second->wait(Deadline::afterMs(100), "ncclCommSplit");
  CHECK(late.code() == Code::kTimeout);
  CHECK(late.message().find("ncclCommSplit: timed out waiting for 1 earlier set-up call") != std::string::npos);
  CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(100));
  std::atomic<bool> cancel{false};
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    cancel.store(true);
  });
  Status cancelled = second->wait(Deadline::never().cancelledBy(&cancel), "ncclCommSplit");
  canceller.join();
  CHECK(cancelled.code() == Code::kAborted);
  first->done();
  CHECK(second->wait(Deadline::afterMs(1000), "ncclCommSplit").isOk());
}

TEST_CASE("a turn whose work gave up half-way fails every later turn with its reason", "[unit][turns]") {
  auto turns = Turns::make();
  auto first = turns->take();
  auto second = turns->take();
  auto third = turns->take();
  REQUIRE(first->wait(Deadline::afterMs(1000), "first").isOk());
  first->breakLater("the first gave up before its exchange");
  for (auto* later : {&second, &third}) {
    Status st = (*later)->wait(Deadline::afterMs(1000), "ncclCommSplit");
    CHECK(st.code() == Code::kInvalidUsage);
    CHECK(st.message() == "ncclCommSplit: the first gave up before its exchange");
    (*later)->done();
  }
  CHECK(turns->take()->wait(Deadline::afterMs(1000), "later").code() == Code::kInvalidUsage);
}
