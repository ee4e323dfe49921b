// The engine on hand-made plans over loopback pairs: ordering, dependencies,
// reductions, deadlines, abort and peer failure — without builders or comms.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <thread>

#include "core/params.h"
#include "core/tag.h"
#include "engine/engine.h"
#include "reduce/reduce.h"
#include "support/scoped_env.h"
#include "transports/loopback/loopback_transport.h"

using namespace shoal;

namespace {

// Rank `self` sends its send buffer to the peer and adds what it receives:
// recv = send + peer's send (float sum), in `segments` pipelined pieces.
PlanPtr exchangePlan(int self, int peer, uint64_t bytes, int segments) {
  auto plan = std::make_shared<Plan>();
  plan->rank = self;
  plan->nranks = 2;
  plan->shapes.push_back(CollShape{CollKind::kAllReduce, DataType::kFloat32, ReduceOp::kSum,
                                   bytes / 4});
  plan->scratchBytes = bytes;
  PlanBuilder b(*plan);
  uint64_t seg = bytes / segments;
  for (int s = 0; s < segments; ++s) {
    uint64_t off = s * seg;
    b.send(peer, {kSendBuffer, off}, seg);
    uint32_t r = b.recv(peer, {kScratchBuffer, off}, seg);
    b.reduce({kRecvBuffer, off}, {kSendBuffer, off}, {kScratchBuffer, off}, seg, {r});
  }
  finalizePlan(*plan);
  return plan;
}

struct Rank {
  std::vector<float> send, recv, scratch;
  JobPtr job;
};

JobPtr makeJob(PlanPtr plan, Rank& r, Connection* conn, uint64_t queue,
               const std::atomic<bool>* abortFlag = nullptr) {
  auto job = std::make_shared<Job>();
  job->prepared = preparePlan(plan);
  job->buffers = {reinterpret_cast<uint8_t*>(r.send.data()),
                  reinterpret_cast<uint8_t*>(r.recv.data()),
                  reinterpret_cast<uint8_t*>(r.scratch.data())};
  job->laneConnections.assign(plan->lanes.size(), conn);
  job->opTags = {encodeTag(CollKind::kAllReduce, DataType::kFloat32, 0, 0, -1, 1)};
  job->opScalars.resize(1);
  job->queueId = queue;
  job->abortFlag = abortFlag;
  job->commLabel = std::make_shared<const std::string>("test job");
  return job;
}

// One 256-byte receive from rank 1: a job that waits on its peer.
PlanPtr receiveOnlyPlan() {
  auto plan = std::make_shared<Plan>();
  plan->shapes.push_back(CollShape{});
  PlanBuilder builder(*plan);
  builder.recv(1, {kRecvBuffer, 0}, 256);
  finalizePlan(*plan);
  return plan;
}

void fill(Rank& r, size_t n, float base) {
  r.send.resize(n);
  std::iota(r.send.begin(), r.send.end(), base);
  r.recv.assign(n, -1);
  r.scratch.assign(n, -1);
}

// Both ranks' exchangePlan jobs over `n` floats, on queues `queue` and
// `queue` + 1.
void makeExchange(Rank& r0, Rank& r1, Connection* a, Connection* b, size_t n, int segments, uint64_t queue) {
  fill(r0, n, 0);
  fill(r1, n, 1000);
  r0.job = makeJob(exchangePlan(0, 1, n * 4, segments), r0, a, queue);
  r1.job = makeJob(exchangePlan(1, 0, n * 4, segments), r1, b, queue + 1);
}

void runBoth(Rank& r0, Rank& r1) {
  Engine::instance().submit(r0.job);
  Engine::instance().submit(r1.job);
  REQUIRE(Engine::instance().wait(*r0.job).isOk());
  REQUIRE(Engine::instance().wait(*r1.job).isOk());
}

}  // namespace

TEST_CASE("engine runs a pipelined two-rank exchange to completion", "[unit]") {
  const size_t n = 1 << 16;
  auto [a, b] = makeLoopbackPair("rank 0", "rank 1");
  Rank r0, r1;
  makeExchange(r0, r1, a.get(), b.get(), n, 8, 1);
  runBoth(r0, r1);
  for (size_t i = 0; i < n; ++i) {
    REQUIRE(r0.recv[i] == r0.send[i] + r1.send[i]);
    REQUIRE(r1.recv[i] == r0.recv[i]);
  }
}

// A detached job's scratch (ScratchPool) goes back when the job succeeds,
// not when the last holder of the job lets go: the communicator's next job
// then reuses it instead of making the pool keep a second buffer.
TEST_CASE("a job that succeeds lets its own scratch go before it reports done", "[unit]") {
  const size_t n = 4096;
  auto [a, b] = makeLoopbackPair("rank 0", "rank 1");
  Rank r0, r1;
  makeExchange(r0, r1, a.get(), b.get(), n, 2, 3);
  static std::atomic<int> released;  // outlives whoever holds the jobs
  released = 0;
  for (Rank* r : {&r0, &r1}) {
    r->job->ownedScratch = std::shared_ptr<uint8_t>(reinterpret_cast<uint8_t*>(r->scratch.data()),
                                                    [](uint8_t*) { released.fetch_add(1); });
    r->job->detached = true;
  }
  runBoth(r0, r1);
  CHECK(released.load() == 2);  // both jobs are still held here
  for (size_t i = 0; i < n; ++i) REQUIRE(r0.recv[i] == r0.send[i] + r1.send[i]);
}

TEST_CASE("jobs of one queue run in submission order", "[unit]") {
  const size_t n = 1024;
  auto [a, b] = makeLoopbackPair("rank 0", "rank 1");
  std::vector<Rank> r0(3), r1(3);
  for (int k = 0; k < 3; ++k) {
    fill(r0[k], n, static_cast<float>(k));
    fill(r1[k], n, static_cast<float>(10 * k));
    r0[k].job = makeJob(exchangePlan(0, 1, n * 4, 2), r0[k], a.get(), 7);
    r1[k].job = makeJob(exchangePlan(1, 0, n * 4, 2), r1[k], b.get(), 8);
  }
  for (int k = 0; k < 3; ++k) Engine::instance().submit(r0[k].job);
  for (int k = 0; k < 3; ++k) Engine::instance().submit(r1[k].job);
  for (int k = 0; k < 3; ++k) {
    REQUIRE(Engine::instance().wait(*r0[k].job).isOk());
    REQUIRE(Engine::instance().wait(*r1[k].job).isOk());
    REQUIRE(r0[k].recv[5] == r0[k].send[5] + r1[k].send[5]);
  }
}

// A CUDA graph's replay (docs/cuda.md, "Graph capture") is submitted when
// its stream reaches it, after a job queued by a call made after the graph's
// launch on that stream, which waits for the stream: the replay runs first,
// and the later job once its stream reaches it.
TEST_CASE("a job that runs ahead starts before an earlier job still waiting for its stream", "[unit]") {
  const size_t n = 1024;
  auto [a, b] = makeLoopbackPair("rank 0", "rank 1");
  Rank later0, later1, replay0, replay1;
  fill(later0, n, 0);
  fill(later1, n, 100);
  fill(replay0, n, 1000);
  fill(replay1, n, 2000);
  later0.job = makeJob(exchangePlan(0, 1, n * 4, 2), later0, a.get(), 31);
  later1.job = makeJob(exchangePlan(1, 0, n * 4, 2), later1, b.get(), 32);
  replay0.job = makeJob(exchangePlan(0, 1, n * 4, 2), replay0, a.get(), 31);
  replay1.job = makeJob(exchangePlan(1, 0, n * 4, 2), replay1, b.get(), 32);
  alignas(64) static uint64_t words[2];  // ready, done
  words[0] = words[1] = 0;
  later0.job->streamReady = &words[0];
  later0.job->streamDone = &words[1];
  later0.job->streamSeq = 1;
  later0.job->detached = true;
  replay0.job->runsAhead = true;
  replay0.job->detached = true;
  Engine& engine = Engine::instance();
  engine.submit(later0.job);
  engine.submit(replay0.job);
  engine.submit(replay1.job);  // rank 1 meets the replay first, as its stream order says
  engine.submit(later1.job);
  REQUIRE(engine.wait(*replay0.job, Deadline::afterMs(20000)).isOk());
  REQUIRE(engine.wait(*replay1.job, Deadline::afterMs(20000)).isOk());
  CHECK(replay0.recv[7] == replay0.send[7] + replay1.send[7]);
  CHECK_FALSE(later0.job->isDone());
  writeStreamWord(&words[0], 1);  // the stream reaches the later call
  REQUIRE(engine.wait(*later0.job, Deadline::afterMs(20000)).isOk());
  REQUIRE(engine.wait(*later1.job, Deadline::afterMs(20000)).isOk());
  CHECK(later0.recv[7] == later0.send[7] + later1.send[7]);
  CHECK(words[1] == 1);
}

TEST_CASE("a message that never arrives trips the no-progress deadline naming the peer",
          "[unit]") {
  setenv("SHOAL_PROGRESS_TIMEOUT_MS", "300", 1);
  reloadParams();
  LoopbackFaults faults;
  faults.blackholeNth = 1;
  auto [a, b] = makeLoopbackPair("rank 0 (host x)", "rank 1 (host y)", faults);
  Rank r0;
  fill(r0, 64, 0);
  // Rank 0 only receives; rank 1 "sends" into a black hole.
  PlanPtr plan = receiveOnlyPlan();
  r0.job = makeJob(plan, r0, a.get(), 11);
  std::vector<float> junk(64);
  REQUIRE(b->postSend(junk.data(), 256, r0.job->opTags[0], 0).isOk());
  int64_t start = nowNs();
  Engine::instance().submit(r0.job);
  Status st = Engine::instance().wait(*r0.job);
  double seconds = (nowNs() - start) / 1e9;
  REQUIRE(st.code() == Code::kTimeout);
  REQUIRE(st.message().find("receive from rank 1 (host y)") != std::string::npos);
  REQUIRE(seconds < 5.0);
  unsetenv("SHOAL_PROGRESS_TIMEOUT_MS");
  reloadParams();
}

TEST_CASE("a closed peer fails the waiting job with a remote error", "[unit]") {
  auto [a, b] = makeLoopbackPair("rank 0", "rank 1");
  Rank r0;
  fill(r0, 64, 0);
  PlanPtr plan = receiveOnlyPlan();
  r0.job = makeJob(plan, r0, a.get(), 12);
  Engine::instance().submit(r0.job);
  b.reset();  // the peer goes away
  Status st = Engine::instance().wait(*r0.job);
  REQUIRE(st.code() == Code::kRemoteError);
  REQUIRE(st.message().find("rank 1") != std::string::npos);
}

// What a communicator's ConnectionTable answers, without a store: a peer is
// known to have failed once its report was looked up, if it is `failed`.
struct FakeReports final : FailureReports {
  explicit FakeReports(int failed) : failed(failed) {}
  const int failed;
  std::atomic<int> lookUps{0};
  std::atomic<int> otherPeers{0};
  std::atomic<bool> lookedUp{false};
  std::string knownFailure(int peer) override {
    if (peer != 1) ++otherPeers;
    return peer == failed && lookedUp ? std::string(kReportedFailurePrefix) + "boom" : std::string();
  }
  void lookUp(int peer) override {
    if (peer != 1) ++otherPeers;
    ++lookUps;
    lookedUp = true;
  }
};

// A job that receives from rank 1, which is there and sends nothing, with
// `reports` to look at while it is stalled: how it ended, and after how long.
struct StalledRun {
  Status status;
  int failedPeer = -1;
  double seconds = 0;
};
StalledRun runStalledReceive(FailureReports& reports, uint64_t sequence) {
  auto [a, b] = makeLoopbackPair("rank 0", "rank 1");
  Rank r0;
  fill(r0, 64, 0);
  r0.job = makeJob(receiveOnlyPlan(), r0, a.get(), sequence);
  r0.job->failureReports = &reports;
  const int64_t start = nowNs();
  Engine::instance().submit(r0.job);
  StalledRun run;
  run.status = Engine::instance().wait(*r0.job);
  run.seconds = (nowNs() - start) / 1e9;
  run.failedPeer = r0.job->failedPeer();
  return run;
}

TEST_CASE("a stalled job has the reports of the peers it waits on looked up and fails once one failed", "[unit]") {
  testing::ScopedEnv env{{"SHOAL_IDLE_CHECK_MS", "100"}, {"SHOAL_PROGRESS_TIMEOUT_MS", "30000"}};
  FakeReports reports(/*failed=*/1);
  StalledRun run = runStalledReceive(reports, 14);
  INFO(run.status.toString());
  CHECK(run.status.code() == Code::kRemoteError);
  CHECK(run.status.message().find("receive from rank 1") != std::string::npos);
  CHECK(run.status.message().find("rank 1 will not come: its communicator failed") != std::string::npos);
  CHECK(run.failedPeer == 1);
  CHECK(reports.lookUps == 1);  // at the first interval of no progress; then the verdict was read
  CHECK(reports.otherPeers == 0);
  CHECK(run.seconds < 5.0);
}

// The store's answer comes from the connect watch's thread a moment after
// the lookup (here 50 ms): the stalled job reads it then, not at its next
// interval. A job stalled on a dead peer over ofi fails about one interval
// after it stalled, where it took three.
TEST_CASE("a stalled job reads the answer to its lookup within milliseconds, not an interval later", "[unit]") {
  testing::ScopedEnv env{{"SHOAL_IDLE_CHECK_MS", "2000"}, {"SHOAL_PROGRESS_TIMEOUT_MS", "30000"}};
  struct LateAnswer final : FailureReports {
    std::atomic<int64_t> askedNs{0};
    std::atomic<int> lookUps{0};
    std::string knownFailure(int) override {
      const int64_t asked = askedNs.load();
      return asked != 0 && nowNs() - asked > 50'000'000 ? std::string("its process ended") : std::string();
    }
    void lookUp(int) override {
      ++lookUps;
      int64_t none = 0;
      askedNs.compare_exchange_strong(none, nowNs());
    }
  } reports;
  StalledRun run = runStalledReceive(reports, 61);
  INFO(run.status.toString());
  CHECK(run.status.code() == Code::kRemoteError);
  CHECK(run.status.message().find("rank 1 will not come: its process ended") != std::string::npos);
  CHECK(reports.lookUps == 1);  // at the first interval of no progress
  CHECK(run.seconds >= 2.0);
  CHECK(run.seconds < 3.5);  // the next interval ends at 4 s, the one after at 6 s
}

// An idle check that asks a question answered on another thread (a look
// for wills in the bootstrap store, made by the connect watch) has the
// answer read within milliseconds of its coming, not at the next check, and
// no longer once it is read.
TEST_CASE("an idle check's answer is read within milliseconds, not an interval later", "[unit]") {
  testing::ScopedEnv env{{"SHOAL_IDLE_CHECK_MS", "2000"}};
  struct AskingWatch final : IdleWatch {
    std::atomic<int64_t> askedNs{0}, readNs{0};
    std::atomic<int> reads{0}, readsAfterAnswer{0};
    bool checkIdle() override {
      int64_t none = 0;
      return askedNs.compare_exchange_strong(none, nowNs());  // asks at its first check only
    }
    bool readIdleAnswer() override {
      ++reads;
      if (readNs.load() != 0) ++readsAfterAnswer;
      const int64_t asked = askedNs.load();
      if (asked == 0 || nowNs() - asked < 50'000'000) return false;  // answered 50 ms after the question
      int64_t none = 0;
      readNs.compare_exchange_strong(none, nowNs());
      return true;
    }
  } watch;
  Engine::instance().watchIdle(&watch);
  const int64_t start = nowNs();
  while (watch.readNs.load() == 0 && nowNs() - start < 8'000'000'000)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // reads that would follow
  Engine::instance().unwatchIdle(&watch);
  REQUIRE(watch.askedNs.load() != 0);
  REQUIRE(watch.readNs.load() != 0);
  const double afterMs = (watch.readNs.load() - watch.askedNs.load()) / 1e6;
  INFO("read " << afterMs << " ms after the question, " << watch.reads.load() << " reads");
  CHECK(afterMs >= 50);
  CHECK(afterMs < 500);            // the next check comes 2000 ms after the question
  CHECK(watch.reads.load() >= 2);  // every 10 ms until answered
  CHECK(watch.readsAfterAnswer.load() == 0);
}

// A process that forks while its progress thread holds the engine's locks
// (here a slow round of idle checks, over and over): the forked child, whose
// only thread is the one that forked, must find them free, not wait forever
// for a thread it does not have.
TEST_CASE("a child forked while the progress thread holds the engine's locks can use the engine", "[unit]") {
  testing::ScopedEnv env{{"SHOAL_IDLE_CHECK_MS", "1"}};
  struct SlowWatch final : IdleWatch {
    std::atomic<int> checks{0};
    bool checkIdle() override {
      ++checks;
      const int64_t until = nowNs() + 2'000'000;  // the watch lock held through it
      while (nowNs() < until) (void)Engine::instance().queueAtRest(1);  // the list and submit locks, again and again
      return true;  // an answer to read (none is: the next check comes first)
    }
    bool readIdleAnswer() override { return false; }
  } slow;
  Engine::instance().watchIdle(&slow);
  struct Unwatch {
    IdleWatch* w;
    ~Unwatch() { Engine::instance().unwatchIdle(w); }
  } unwatch{&slow};
  while (slow.checks.load() < 3) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  int finished = 0;
  for (int i = 0; i < 5; ++i) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      struct QuietWatch final : IdleWatch {
        bool checkIdle() override { return false; }
        bool readIdleAnswer() override { return true; }
      } quiet;
      // No thread started in the child (TSan forbids it after a threaded fork).
      ::setenv("SHOAL_IDLE_CHECK_MS", "0", 1);
      reloadParams();
      Engine::instance().watchIdle(&quiet);
      Engine::instance().unwatchIdle(&quiet);
      (void)Engine::instance().queueAtRest(2);
      (void)Engine::instance().poll();
      ::_exit(0);
    }
    REQUIRE(pid > 0);
    int status = 0;
    const int64_t deadline = nowNs() + 5'000'000'000;
    while (::waitpid(pid, &status, WNOHANG) == 0 && nowNs() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (::waitpid(pid, &status, WNOHANG) == 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      break;  // it waits on a lock held by a thread it does not have
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) ++finished;
  }
  CHECK(finished == 5);
}

TEST_CASE("a job stalled on a live peer has its reports looked up less and less often", "[unit]") {
  testing::ScopedEnv env{{"SHOAL_IDLE_CHECK_MS", "20"}, {"SHOAL_PROGRESS_TIMEOUT_MS", "1500"}};
  FakeReports reports(/*failed=*/-1);  // nobody failed: the job waits for its deadline
  StalledRun run = runStalledReceive(reports, 15);
  INFO(run.status.toString());
  CHECK(run.status.code() == Code::kTimeout);
  // Up to 75 looks of 20 ms in 1.5 s; lookups after 1, 2, 4, 8, 16, 32 and
  // 64 intervals: at most 7.
  CHECK(reports.lookUps >= 1);
  CHECK(reports.lookUps <= 7);
}

TEST_CASE("setting the abort flag fails a pending job quickly", "[unit]") {
  auto [a, b] = makeLoopbackPair("rank 0", "rank 1");
  Rank r0;
  fill(r0, 64, 0);
  PlanPtr plan = receiveOnlyPlan();
  std::atomic<bool> abortFlag{false};
  r0.job = makeJob(plan, r0, a.get(), 13, &abortFlag);
  Engine::instance().submit(r0.job);
  Engine::instance().poll();
  abortFlag = true;
  Status st = Engine::instance().wait(*r0.job);
  REQUIRE(st.code() == Code::kAborted);
}

TEST_CASE("retire removes a queue's jobs", "[unit]") {
  auto [a, b] = makeLoopbackPair("rank 0", "rank 1");
  Rank r0;
  fill(r0, 64, 0);
  PlanPtr plan = receiveOnlyPlan();
  r0.job = makeJob(plan, r0, a.get(), 14);
  Engine::instance().submit(r0.job);
  Engine::instance().retire(14, error(Code::kAborted, "gone"));
  REQUIRE(r0.job->isDone());
  REQUIRE(r0.job->status().code() == Code::kAborted);
}

namespace {

// A connection whose one incoming message lands after `landsAfterLooks`
// calls of mightProgress(); counts what the engine asks of it.
class ScriptedConnection : public Connection {
 public:
  explicit ScriptedConnection(int landsAfterLooks, bool alwaysMightProgress = false)
      : landsAfterLooks_(landsAfterLooks), alwaysMightProgress_(alwaysMightProgress) {}
  Status postSend(const void*, uint64_t, uint64_t, uint64_t) override {
    return internalError("not used");
  }
  Status postRecv(void* data, uint64_t bytes, uint64_t, uint64_t token) override {
    recv_ = static_cast<uint8_t*>(data);
    bytes_ = bytes;
    token_ = token;
    posted_ = true;
    return Status::ok();
  }
  Status poll(std::vector<Completion>& done, bool& progressed) override {
    ++polls;
    if (!posted_ || looks < landsAfterLooks_) return Status::ok();
    std::memset(recv_, 0x5a, bytes_);
    done.push_back({token_, bytes_});
    posted_ = false;
    progressed = true;
    return Status::ok();
  }
  size_t pending() const override { return posted_ ? 1 : 0; }
  bool mightProgress() const override {
    ++looks;
    return alwaysMightProgress_ || looks >= landsAfterLooks_;
  }
  const std::string& peerDescription() const override { return name_; }

  mutable int looks = 0;
  int polls = 0;

 private:
  const int landsAfterLooks_;
  const bool alwaysMightProgress_;
  const std::string name_ = "rank 1 (scripted)";
  uint8_t* recv_ = nullptr;
  uint64_t bytes_ = 0;
  uint64_t token_ = 0;
  bool posted_ = false;
};

// Engine::runInline takes a job that was never submitted, as a
// communicator's reused blocking job is: `job` gets what `filled` holds.
void fillLike(Job& job, const Job& filled) {
  job.prepared = filled.prepared;
  job.buffers = filled.buffers;
  job.laneConnections = filled.laneConnections;
  job.opTags = filled.opTags;
  job.opScalars = filled.opScalars;
}

}  // namespace

TEST_CASE("a spinning inline wait looks between passes and polls once the message lands", "[unit]") {
  Backoff::setSpinPasses(64);
  ScriptedConnection conn(/*landsAfterLooks=*/200);
  Rank r0;
  fill(r0, 64, 0);
  Job job;
  fillLike(job, *makeJob(receiveOnlyPlan(), r0, &conn, 15));
  REQUIRE(Engine::instance().runInline(job).isOk());
  const auto* bytes = reinterpret_cast<const uint8_t*>(r0.recv.data());
  REQUIRE(std::all_of(bytes, bytes + 256, [](uint8_t b) { return b == 0x5a; }));
  REQUIRE(conn.looks >= 200);
  // About one pass per kQuietLooks looks, and one right after the landing
  // (a pass per look would be ~200 polls).
  REQUIRE(conn.polls <= 200 / 8 + 4);
}

TEST_CASE("a connection that always might progress still lets an inline wait sleep", "[unit]") {
  setenv("SHOAL_PROGRESS_TIMEOUT_MS", "300", 1);
  reloadParams();
  Backoff::setSpinPasses(64);
  ScriptedConnection conn(/*landsAfterLooks=*/1 << 30, /*alwaysMightProgress=*/true);
  Rank r0;
  fill(r0, 64, 0);
  Job job;
  fillLike(job, *makeJob(receiveOnlyPlan(), r0, &conn, 16));
  Status st = Engine::instance().runInline(job);
  REQUIRE(st.code() == Code::kTimeout);
  // Looks that never find quiet must not hold the backoff in its spinning
  // phase. Counted in passes (a poll each), not in time or context switches,
  // so a loaded machine cannot fail it: a waiter that backs off makes 64
  // spinning passes, 2048 yielding ones, then sleeps 20-200 us a pass (at
  // most ~5500 passes in 300 ms); one held spinning makes a pass every few
  // hundred nanoseconds of CPU it gets (~10^6).
  CAPTURE(conn.polls);
  REQUIRE(conn.polls > 64);
  REQUIRE(conn.polls < 20000);
  unsetenv("SHOAL_PROGRESS_TIMEOUT_MS");
  reloadParams();
}

namespace {

// The receive's slot as the engine sees it after preparePlan.
PreparedPlan::ReduceOnReceiveStep fusedOf(const PlanPtr& plan, uint32_t recvStep) {
  auto prepared = preparePlan(plan);
  if (prepared->reduceOnReceive.empty()) return {};
  return prepared->reduceOnReceive[recvStep];
}

std::shared_ptr<Plan> handPlan() {
  auto plan = std::make_shared<Plan>();
  plan->rank = 0;
  plan->nranks = 2;
  plan->shapes.push_back(CollShape{CollKind::kAllReduce, DataType::kFloat32, ReduceOp::kSum, 64});
  plan->scratchBytes = 512;
  return plan;
}

// A peer that sends one message of floats: every send finishes at post, and
// a receive may be posted as a reduction, which the connection carries out
// (and counts) when it "arrives" at the first poll.
class ReducingConnection : public Connection {
 public:
  explicit ReducingConnection(std::vector<float> incoming) : incoming_(std::move(incoming)) {}
  Status postSend(const void*, uint64_t, uint64_t, uint64_t) override { return internalError("not used"); }
  Status postSendOrFinish(const void*, uint64_t, uint64_t, uint64_t, bool& finished) override {
    finished = true;
    ++sendsFinishedAtPost;
    return Status::ok();
  }
  Status postRecv(void* data, uint64_t bytes, uint64_t, uint64_t token) override {
    recv_ = static_cast<uint8_t*>(data);
    bytes_ = bytes;
    token_ = token;
    return Status::ok();
  }
  bool reducesOnReceive(uint64_t) const override { return reduces; }
  Status postRecvReduce(const ReduceOnReceive& r, uint64_t bytes, uint64_t, uint64_t token) override {
    reduce_ = r;
    bytes_ = bytes;
    token_ = token;
    ++reducingReceives;
    return Status::ok();
  }
  Status poll(std::vector<Completion>& done, bool& progressed) override {
    if (bytes_ == 0) return Status::ok();
    const auto* in = reinterpret_cast<const uint8_t*>(incoming_.data());
    if (recv_ != nullptr) {
      std::memcpy(recv_, in, bytes_);
    } else {
      const uint8_t* a = reduce_.receivedFirst ? in : reduce_.other;
      const uint8_t* b = reduce_.receivedFirst ? reduce_.other : in;
      reduce::combine(reduce_.op, reduce_.dtype, reduce_.dst, a, b, bytes_ / 4, reduce_.scalar);
    }
    done.push_back({token_, bytes_});
    bytes_ = 0;
    progressed = true;
    return Status::ok();
  }
  size_t pending() const override { return bytes_ != 0 ? 1 : 0; }
  const std::string& peerDescription() const override { return name_; }

  bool reduces = true;
  int reducingReceives = 0;
  int sendsFinishedAtPost = 0;

 private:
  std::vector<float> incoming_;
  const std::string name_ = "rank 1 (reducing)";
  uint8_t* recv_ = nullptr;
  ReduceOnReceive reduce_;
  uint64_t bytes_ = 0;
  uint64_t token_ = 0;
};

}  // namespace

TEST_CASE("a receive into scratch read by one Reduce alone may be reduced as it arrives", "[unit]") {
  SECTION("the exchange: send, receive into scratch, recv = send + scratch") {
    auto f = fusedOf(exchangePlan(0, 1, 256, 1), 1);
    CHECK(f.reduce == 2);
    CHECK_FALSE(f.receivedFirst);
  }
  SECTION("the received bytes as the first operand") {
    auto plan = handPlan();
    PlanBuilder b(*plan);
    uint32_t r = b.recv(1, {kScratchBuffer, 0}, 256);
    b.reduce({kRecvBuffer, 0}, {kScratchBuffer, 0}, {kSendBuffer, 0}, 256, {r});
    finalizePlan(*plan);
    auto f = fusedOf(plan, 0);
    CHECK(f.reduce == 1);
    CHECK(f.receivedFirst);
  }
  SECTION("not when another step reads the slot too") {
    auto plan = handPlan();
    PlanBuilder b(*plan);
    uint32_t r = b.recv(1, {kScratchBuffer, 0}, 256);
    uint32_t d = b.reduce({kRecvBuffer, 0}, {kSendBuffer, 0}, {kScratchBuffer, 0}, 256, {r});
    b.send(1, {kScratchBuffer, 128}, 64, {d});  // reads part of the slot after the reduce
    finalizePlan(*plan);
    CHECK(fusedOf(plan, 0).reduce == PreparedPlan::kNoReduce);
  }
  SECTION("not when a later receive reuses the slot") {
    auto plan = handPlan();
    PlanBuilder b(*plan);
    uint32_t r = b.recv(1, {kScratchBuffer, 0}, 256);
    uint32_t d = b.reduce({kRecvBuffer, 0}, {kSendBuffer, 0}, {kScratchBuffer, 0}, 256, {r});
    uint32_t r2 = b.recv(1, {kScratchBuffer, 0}, 256, {d});
    b.reduce({kRecvBuffer, 0}, {kRecvBuffer, 0}, {kScratchBuffer, 0}, 256, {r2});
    finalizePlan(*plan);
    CHECK(fusedOf(plan, 0).reduce == PreparedPlan::kNoReduce);
  }
  SECTION("not when the receive lands in the user's buffer") {
    auto plan = handPlan();
    PlanBuilder b(*plan);
    uint32_t r = b.recv(1, {kRecvBuffer, 0}, 256);
    b.reduce({kRecvBuffer, 0}, {kSendBuffer, 0}, {kRecvBuffer, 0}, 256, {r});
    finalizePlan(*plan);
    CHECK(fusedOf(plan, 0).reduce == PreparedPlan::kNoReduce);
  }
}

TEST_CASE("the engine hands a lone Reduce to a transport that reduces on receive", "[unit]") {
  Rank r0;
  fill(r0, 64, 1);  // send = 1, 2, 3, ...
  std::vector<float> incoming(64);
  std::iota(incoming.begin(), incoming.end(), 1000.0f);
  // The exchange's Reduce also waits for the send (as builders' plans do,
  // decision 0014): a send that finishes at post lets the receive go fused.
  auto plan = handPlan();
  {
    PlanBuilder b(*plan);
    uint32_t s = b.send(1, {kSendBuffer, 0}, 256);
    uint32_t r = b.recv(1, {kScratchBuffer, 0}, 256);
    b.reduce({kRecvBuffer, 0}, {kSendBuffer, 0}, {kScratchBuffer, 0}, 256, {s, r});
    finalizePlan(*plan);
  }
  for (bool reduces : {true, false}) {
    INFO("the transport reduces on receive: " << reduces);
    ReducingConnection conn(incoming);
    conn.reduces = reduces;
    fill(r0, 64, 1);
    Job job;
    fillLike(job, *makeJob(plan, r0, &conn, 17));
    REQUIRE(Engine::instance().runInline(job).isOk());
    for (size_t i = 0; i < 64; ++i) REQUIRE(r0.recv[i] == r0.send[i] + incoming[i]);
    CHECK(conn.sendsFinishedAtPost == 1);
    CHECK(conn.reducingReceives == (reduces ? 1 : 0));
    // Fused, the scratch slot is never written.
    CHECK((r0.scratch[0] == -1) == reduces);
  }
}
