// The verifier accepts every builder's plans for 1..17 ranks and odd sizes, and
// catches broken plans.
#include <catch2/catch.hpp>

#include "collectives/plan_test_util.h"

namespace shoal::testing {
namespace {

void requireOk(const Status& s, const std::string& what) {
  INFO(what << ": " << s.toString());
  REQUIRE(s.isOk());
}

void requireError(const Status& s, const std::string& needle) {
  INFO(s.toString());
  REQUIRE_FALSE(s.isOk());
  REQUIRE(s.message().find(needle) != std::string::npos);
}

TEST_CASE("every builder's plans verify for 1..17 ranks and odd sizes", "[verify]") {
  const AlgoParams params[] = {AlgoParams{1, 1 << 20}, AlgoParams{3, 64}, AlgoParams{2, 4096}};
  size_t plansChecked = 0;
  for (const AlgorithmEntry& entry : algorithms()) {
    if (entry.kind == CollKind::kSend || entry.kind == CollKind::kRecv) continue;
    for (int nranks = 1; nranks <= 17; ++nranks) {
      for (uint64_t count : {uint64_t{0}, uint64_t{1}, uint64_t{7}, uint64_t(nranks * 3 + 1),
                             uint64_t{4097}}) {
        for (const AlgoParams& p : params) {
          for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kPreMulSum}) {
            CollShape shape;
            shape.kind = entry.kind;
            shape.dtype = count % 2 ? DataType::kFloat32 : DataType::kFloat16;
            shape.op = op;
            shape.count = count;
            shape.root = static_cast<int>(count % nranks);
            auto plans = buildAll(entry.build, shape, nranks, p);
            requireOk(verifyPlans(plans),
                      str(collKindName(entry.kind), " ", entry.name, " nranks ", nranks, " count ",
                          count, " channels ", p.channels, " segment ", p.segmentBytes));
            plansChecked += plans.size();
          }
        }
      }
    }
  }
  REQUIRE(plansChecked > 10000);
}

TEST_CASE("large plans verify and stay bounded in scratch", "[verify]") {
  CollShape shape;
  shape.kind = CollKind::kAllReduce;
  shape.dtype = DataType::kFloat32;
  shape.count = (64u << 20) / 4;
  for (int nranks : {2, 4, 8}) {
    auto plans = buildAll(buildRingAllReduce, shape, nranks, AlgoParams{});
    requireOk(verifyPlans(plans), str("ring allreduce 64 MiB nranks ", nranks));
    // A few segments of scratch per channel, never the buffer.
    REQUIRE(plans[0]->scratchBytes <= 8u << 20);
    WARN("ring allreduce 64 MiB, " << nranks << " ranks: " << plans[0]->steps.size()
                                   << " steps, scratch " << plans[0]->scratchBytes);
  }
  shape.kind = CollKind::kBroadcast;
  shape.root = 1;
  auto bcast = buildAll(buildChainBroadcast, shape, 4, AlgoParams{4, 1 << 20});
  requireOk(verifyPlans(bcast), "chain broadcast 64 MiB");
  shape.kind = CollKind::kReduce;
  auto reduce = buildAll(buildChainReduce, shape, 4, AlgoParams{2, 1 << 20});
  requireOk(verifyPlans(reduce), "chain reduce 64 MiB");
  REQUIRE(reduce[1]->scratchBytes <= 8u << 20);
}

TEST_CASE("1024 ranks of small plans verify quickly", "[verify]") {
  CollShape shape;
  shape.kind = CollKind::kAllReduce;
  shape.dtype = DataType::kFloat32;
  shape.count = 2048;
  for (BuildFn build : {buildRingAllReduce, buildRecursiveDoublingAllReduce}) {
    auto plans = buildAll(build, shape, 1024, AlgoParams{});
    requireOk(verifyPlans(plans), "1024 ranks");
  }
}

TEST_CASE("64 nodes x 16 ranks: hierarchical plans verify and compute and the model prefers them", "[verify][scale]") {
  constexpr int kNodes = 64, kLocal = 16, kRanks = kNodes * kLocal;
  std::vector<int> nodeOf(kRanks);
  for (int r = 0; r < kRanks; ++r) nodeOf[r] = r / kLocal;
  CollShape shape;
  shape.kind = CollKind::kAllReduce;
  shape.dtype = DataType::kInt32;
  shape.count = 4099;  // not a multiple of 16 or 64
  auto plans = buildAll(buildHierarchicalAllReduce, shape, kRanks, AlgoParams{1, 4096}, {}, nodeOf);
  requireOk(verifyPlans(plans), "hierarchical 64x16");
  // Real data: rank r contributes r + i; every rank must end with the sum.
  std::vector<std::vector<int32_t>> send(kRanks), recv(kRanks);
  std::vector<std::vector<SimOpBuffers>> buffers(kRanks);
  for (int r = 0; r < kRanks; ++r) {
    send[r].resize(shape.count);
    recv[r].assign(shape.count, -1);
    for (size_t i = 0; i < shape.count; ++i) send[r][i] = r + static_cast<int32_t>(i);
    buffers[r] = {SimOpBuffers{send[r].data(), recv[r].data(), nullptr}};
  }
  requireOk(simulatePlans(plans, buffers), "hierarchical 64x16 simulation");
  const int64_t rankSum = int64_t{kRanks} * (kRanks - 1) / 2;
  for (int r = 0; r < kRanks; r += 97)
    for (size_t i = 0; i < shape.count; i += 131)
      REQUIRE(recv[r][i] == static_cast<int32_t>(rankSum + int64_t{kRanks} * static_cast<int64_t>(i)));
  // The cost model's predictions (network link 25 us, 12.5 GB/s; inside a
  // node 1 us, 50 GB/s; docs/performance.md quotes them): hierarchical
  // wins from the middle up.
  RankView view = viewOf(0, kRanks, {}, nodeOf);
  CostParams net{25.0, 1.0 / 12500.0, 1.0 / 10000.0, 1.0 / 25.0, 12.5 / 50.0};
  const AlgorithmEntry* ring = findAlgorithm(CollKind::kAllReduce, "ring");
  const AlgorithmEntry* rd = findAlgorithm(CollKind::kAllReduce, "recursive_doubling");
  const AlgorithmEntry* hier = findAlgorithm(CollKind::kAllReduce, "hierarchical");
  for (uint64_t bytes : {uint64_t{8}, uint64_t{64} << 10, uint64_t{1} << 20, uint64_t{64} << 20, uint64_t{1} << 30}) {
    CollShape s{CollKind::kAllReduce, DataType::kFloat32, ReduceOp::kSum, bytes / 4};
    WARN("64x16 AllReduce " << bytes << " B: ring " << ring->estimate(s, view, net) << " us, recursive doubling "
                            << rd->estimate(s, view, net) << " us, hierarchical " << hier->estimate(s, view, net)
                            << " us");
    if (bytes >= (uint64_t{64} << 20)) REQUIRE(hier->estimate(s, view, net) < ring->estimate(s, view, net));
  }
}

// ---- negative tests: hand-made plans with one defect each ----

CollShape allReduceShape(uint64_t count) {
  CollShape s;
  s.kind = CollKind::kAllReduce;
  s.dtype = DataType::kFloat32;
  s.count = count;
  return s;
}

PlanPtr finish(Plan plan) {
  finalizePlan(plan);
  return std::make_shared<Plan>(std::move(plan));
}

Plan emptyPlan(const CollShape& shape, int rank, int nranks, uint64_t scratch = 0) {
  Plan p;
  p.shapes = {shape};
  p.algorithm = "test";
  p.rank = rank;
  p.nranks = nranks;
  p.scratchBytes = scratch;
  return p;
}

// A correct two-rank exchange: each rank sends its send buffer to the other,
// receives into scratch, reduces into recv.
std::vector<Plan> goodExchange() {
  std::vector<Plan> plans;
  for (int r = 0; r < 2; ++r) {
    Plan p = emptyPlan(allReduceShape(16), r, 2, 64);
    PlanBuilder b(p);
    uint32_t s = b.send(1 - r, Slice{kSendBuffer, 0}, 64);
    uint32_t v = b.recv(1 - r, Slice{kScratchBuffer, 0}, 64);
    b.reduce(Slice{kRecvBuffer, 0}, Slice{kSendBuffer, 0}, Slice{kScratchBuffer, 0}, 64, {s, v});
    plans.push_back(std::move(p));
  }
  return plans;
}

std::vector<PlanPtr> finishAll(std::vector<Plan> plans) {
  std::vector<PlanPtr> out;
  for (Plan& p : plans) out.push_back(finish(std::move(p)));
  return out;
}

TEST_CASE("the verifier accepts the reference exchange", "[verify][negative]") {
  requireOk(verifyPlans(finishAll(goodExchange())), "good exchange");
}

TEST_CASE("the verifier catches an unmatched send", "[verify][negative]") {
  auto plans = goodExchange();
  // Channel 1: nobody listens. (After the reduce: in place, send aliases recv.)
  PlanBuilder(plans[0]).send(1, Slice{kSendBuffer, 0}, 64, {2}, 1);
  requireError(verifyPlans(finishAll(plans)), "no matching lane");
}

TEST_CASE("the verifier catches lanes of different lengths and sizes", "[verify][negative]") {
  auto plans = goodExchange();
  PlanBuilder(plans[0]).send(1, Slice{kSendBuffer, 0}, 64, {2});  // a second message
  requireError(verifyPlans(finishAll(plans)), "has 1");
  plans = goodExchange();
  plans[1].steps[0].bytes = 32;  // rank 1 sends half
  requireError(verifyPlans(finishAll(plans)), "bytes");
}

TEST_CASE("the verifier catches concurrent overlapping writes", "[verify][negative]") {
  auto plans = goodExchange();
  // A copy into recv that does not wait for the reduce writing the same bytes.
  PlanBuilder(plans[0]).copy(Slice{kRecvBuffer, 32}, Slice{kSendBuffer, 0}, 16);
  requireError(verifyPlans(finishAll(plans)), "concurrently");
}

TEST_CASE("the verifier catches a read racing a write", "[verify][negative]") {
  auto plans = goodExchange();
  // The reduce no longer waits for the receive that fills its scratch input.
  plans[0].deps[plans[0].steps[2].depBegin + 1] = 0;
  requireError(verifyPlans(finishAll(plans)), "concurrently");
}

TEST_CASE("the verifier catches a race that only exists in place", "[verify][negative]") {
  std::vector<Plan> plans;
  for (int r = 0; r < 2; ++r) {
    Plan p = emptyPlan(allReduceShape(16), r, 2);
    PlanBuilder b(p);
    b.send(1 - r, Slice{kSendBuffer, 0}, 64);
    b.recv(1 - r, Slice{kRecvBuffer, 0}, 64);  // overwrites send when send == recv
    plans.push_back(std::move(p));
  }
  auto ptrs = finishAll(plans);
  VerifyOptions outOfPlace;
  outOfPlace.inPlace = false;
  // Out of place this is a valid plan shape-wise (the output is the peer's data).
  requireOk(verifyPlans(ptrs, outOfPlace), "out of place");
  requireError(verifyPlans(ptrs), "concurrently");
}

TEST_CASE("the verifier catches unwritten output", "[verify][negative]") {
  auto plans = goodExchange();
  plans[1].steps[2].bytes = 32;  // reduce only half of recv
  requireError(verifyPlans(finishAll(plans)), "never written");
}

TEST_CASE("the verifier catches a dependency cycle", "[verify][negative]") {
  auto ptrs = finishAll(goodExchange());
  Plan broken = *ptrs[0];
  broken.deps[broken.steps[2].depBegin] = 2;  // the reduce waits for itself
  ptrs[0] = std::make_shared<Plan>(broken);
  requireError(verifyPlans(ptrs), "not an earlier one");
}

// Two ranks that each wait to receive before they send: a deadlock.
std::vector<Plan> receiveFirstExchange() {
  std::vector<Plan> plans;
  for (int r = 0; r < 2; ++r) {
    Plan p = emptyPlan(allReduceShape(16), r, 2);
    PlanBuilder b(p);
    uint32_t v = b.recv(1 - r, Slice{kRecvBuffer, 0}, 64);
    b.send(1 - r, Slice{kRecvBuffer, 0}, 64, {v});
    plans.push_back(std::move(p));
  }
  return plans;
}

TEST_CASE("the verifier catches a deadlock", "[verify][negative]") {
  std::vector<Plan> plans = receiveFirstExchange();
  requireError(verifyPlans(finishAll(plans)), "deadlock");
  // The same exchange with lane order against dependency order on one rank.
  plans.clear();
  for (int r = 0; r < 2; ++r) {
    Plan p = emptyPlan(allReduceShape(16), r, 2, 128);
    PlanBuilder b(p);
    if (r == 0) {  // lane to 1: [A, B]; C comes back after rank 1 got A only
      uint32_t a = b.send(1, Slice{kSendBuffer, 0}, 64);
      uint32_t bb = b.send(1, Slice{kSendBuffer, 0}, 64);
      b.recv(1, Slice{kRecvBuffer, 0}, 64, {a, bb});
    } else {
      uint32_t v = b.recv(0, Slice{kScratchBuffer, 0}, 64);
      uint32_t s = b.send(0, Slice{kSendBuffer, 0}, 64, {v});
      b.recv(0, Slice{kScratchBuffer, 64}, 64);
      b.copy(Slice{kRecvBuffer, 0}, Slice{kScratchBuffer, 0}, 64, {v, s});
    }
    plans.push_back(std::move(p));
  }
  requireOk(verifyPlans(finishAll(plans)), "lane order with room");
}

// The simulator runs plans on data: it must say what stopped them, not only
// that they did not finish.
TEST_CASE("the simulator reports a deadlock, a size mismatch and a message nobody receives", "[simulate][negative]") {
  std::vector<std::vector<float>> send(2, std::vector<float>(16, 1.0f)), recv(2, std::vector<float>(16));
  std::vector<std::vector<SimOpBuffers>> buffers(2);
  for (int r = 0; r < 2; ++r) buffers[r] = {SimOpBuffers{send[r].data(), recv[r].data(), nullptr}};

  requireOk(simulatePlans(finishAll(goodExchange()), buffers), "good exchange");
  REQUIRE(recv[0] == std::vector<float>(16, 2.0f));

  Status deadlock = simulatePlans(finishAll(receiveFirstExchange()), buffers);
  requireError(deadlock, "deadlock, 4 of 4 steps never ran");
  REQUIRE(deadlock.message().find("rank 0") != std::string::npos);
  REQUIRE(deadlock.message().find("rank 1") != std::string::npos);

  std::vector<Plan> plans = goodExchange();
  plans[1].steps[0].bytes = 32;  // rank 1 sends half
  requireError(simulatePlans(finishAll(plans), buffers), "received 32 bytes, expected 64");

  plans = goodExchange();
  PlanBuilder(plans[0]).send(1, Slice{kSendBuffer, 0}, 64, {2}, 1);  // channel 1: nobody listens
  requireError(simulatePlans(finishAll(plans), buffers), "1 message(s) from rank 0 to rank 1 on channel 1 never received");
}

TEST_CASE("the verifier checks peers / bounds / buffers and flags", "[verify][negative]") {
  {
    Plan p = emptyPlan(allReduceShape(16), 0, 1);
    PlanBuilder(p).send(0, Slice{kSendBuffer, 0}, 64);
    requireError(verifyPlan(*finish(p)), "itself");
  }
  {
    Plan p = emptyPlan(allReduceShape(16), 0, 1);
    PlanBuilder(p).copy(Slice{kRecvBuffer, 8}, Slice{kSendBuffer, 0}, 64);
    requireError(verifyPlan(*finish(p)), "outside");
  }
  {
    Plan p = emptyPlan(allReduceShape(16), 0, 1);
    PlanBuilder(p).copy(Slice{kSendBuffer, 0}, Slice{kRecvBuffer, 0}, 64);
    requireError(verifyPlan(*finish(p)), "writes the send buffer");
  }
  {
    Plan p = emptyPlan(allReduceShape(16), 0, 1);
    PlanBuilder(p).copy(Slice{kRecvBuffer, 0}, Slice{kSendBuffer, 0}, 64, {}, kScaleSrc);
    requireError(verifyPlan(*finish(p)), "kScaleSrc");
  }
  {
    Plan p = emptyPlan(allReduceShape(16), 0, 1);
    PlanBuilder(p).copy(Slice{kRecvBuffer, 0}, Slice{kSendBuffer, 0}, 62);
    requireError(verifyPlan(*finish(p)), "multiple");
  }
  {
    Plan p = emptyPlan(allReduceShape(16), 0, 1, 128);
    PlanBuilder(p).copy(Slice{kScratchBuffer, 4}, Slice{kScratchBuffer, 0}, 64);
    requireError(verifyPlan(*finish(p)), "partially overlaps");
  }
  {
    Plan p = emptyPlan(allReduceShape(16), 0, 2);
    PlanBuilder(p).send(1, Slice{kSendBuffer, 0}, 64, {}, kP2pChannel);
    requireError(verifyPlan(*finish(p)), "kP2pChannel");
  }
  {
    Plan p = emptyPlan(allReduceShape(16), 0, 1);
    PlanBuilder(p).copy(Slice{kRecvBuffer, 0}, Slice{kSendBuffer, 0}, 64);
    Plan unfinished = p;  // lanes and lane numbers never computed
    unfinished.steps[0].lane = 3;
    requireError(verifyPlan(unfinished), "finalizePlan");
  }
}

TEST_CASE("the verifier accepts self send/recv only in p2p ops", "[verify]") {
  CollShape s;
  s.kind = CollKind::kSend;
  s.dtype = DataType::kInt8;
  s.count = 10;
  s.peer = 0;
  CollShape r = s;
  r.kind = CollKind::kRecv;
  auto a = std::make_shared<Plan>(buildSendRecv(s, viewOf(0, 1), {}));
  auto b = std::make_shared<Plan>(buildSendRecv(r, viewOf(0, 1), {}));
  requireOk(verifyPlans({std::make_shared<Plan>(mergePlans({a, b}))}), "self p2p");
  // A lone self send has nobody to match it.
  requireError(verifyPlans({a}), "no matching lane");
}

TEST_CASE("a builder plan with a dependency removed fails verification", "[verify][negative]") {
  auto plans = buildAll(buildRingAllReduce, allReduceShape(1000), 3, AlgoParams{1, 256});
  requireOk(verifyPlans(plans), "intact");
  Plan broken = *plans[1];
  // Drop every dependency of the first Reduce: it races with its Recv.
  for (Step& s : broken.steps) {
    if (s.kind == StepKind::kReduce) {
      s.depCount = 0;
      break;
    }
  }
  plans[1] = std::make_shared<Plan>(broken);
  requireError(verifyPlans(plans), "concurrently");
}

}  // namespace
}  // namespace shoal::testing
