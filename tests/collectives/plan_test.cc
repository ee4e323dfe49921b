// Plan utilities (finalizePlan, mergePlans, toString), buffer layouts and the
// algorithm registry.
#include <catch2/catch.hpp>

#include <algorithm>
#include <span>

#include "collectives/plan_test_util.h"

namespace shoal::testing {
namespace {

TEST_CASE("finalizePlan numbers lanes per peer / channel and direction", "[plan]") {
  Plan p;
  p.shapes = {CollShape{}};
  PlanBuilder b(p);
  b.send(1, Slice{kSendBuffer, 0}, 4);
  b.recv(1, Slice{kRecvBuffer, 0}, 4);
  b.send(1, Slice{kSendBuffer, 4}, 4, {}, 1);
  b.send(1, Slice{kSendBuffer, 8}, 4, {0});
  b.copy(Slice{kRecvBuffer, 4}, Slice{kSendBuffer, 4}, 4);
  finalizePlan(p);
  REQUIRE(p.lanes.size() == 3);
  REQUIRE(p.lanes[0].steps == std::vector<uint32_t>{0, 3});
  REQUIRE(p.steps[3].lane == 0);
  REQUIRE(p.steps[3].laneSeq == 1);
  REQUIRE(p.steps[1].lane == 1);
  REQUIRE_FALSE(p.lanes[1].isSend);
  REQUIRE(p.lanes[2].channel == 1);
  REQUIRE(p.steps[4].lane == -1);
}

TEST_CASE("toString prints one line per step", "[plan]") {
  CollShape s;
  s.kind = CollKind::kAllReduce;
  s.count = 64;
  s.op = ReduceOp::kPreMulSum;
  Plan p = buildRingAllReduce(s, viewOf(0, 2), AlgoParams{});
  std::string text = p.toString();
  size_t lines = std::count(text.begin(), text.end(), '\n');
  REQUIRE(lines == p.steps.size() + 1);
  REQUIRE(text.find("plan ring rank 0/2") == 0);
  REQUIRE(text.find("Send to 1 ch 0") != std::string::npos);
  REQUIRE(text.find("*scalar") != std::string::npos);
  REQUIRE(text.find("lane ") != std::string::npos);
}

TEST_CASE("mergePlans remaps buffers / deps / scratch and lanes", "[plan]") {
  CollShape s;
  s.kind = CollKind::kAllReduce;
  s.count = 100;
  auto a = std::make_shared<Plan>(buildRingAllReduce(s, viewOf(1, 3), AlgoParams{1, 64}));
  s.count = 7;
  auto b = std::make_shared<Plan>(buildRecursiveDoublingAllReduce(s, viewOf(1, 3), AlgoParams{}));
  Plan m = mergePlans({a, b});
  REQUIRE(m.shapes.size() == 2);
  REQUIRE(m.algorithm == "ring+recursive_doubling");
  REQUIRE(m.steps.size() == a->steps.size() + b->steps.size());
  REQUIRE(m.scratchOffsets.size() == 2);
  REQUIRE(m.scratchOffsets[0] == 0);
  REQUIRE(m.scratchOffsets[1] % 64 == 0);
  REQUIRE(m.scratchOffsets[1] >= a->scratchBytes);
  REQUIRE(m.scratchBytes == m.scratchOffsets[1] + b->scratchBytes);
  const size_t base = a->steps.size();
  for (size_t i = 0; i < b->steps.size(); ++i) {
    const Step &orig = b->steps[i], &st = m.steps[base + i];
    REQUIRE(st.op == 1);
    REQUIRE(st.src.buffer == orig.src.buffer + kBuffersPerOp);
    REQUIRE(st.depCount == orig.depCount);
    for (uint32_t d = 0; d < st.depCount; ++d)
      REQUIRE(m.deps[st.depBegin + d] == b->deps[orig.depBegin + d] + base);
  }
  // Lanes of both ops to the same peer merge, op 0's messages first.
  for (const Lane& lane : m.lanes) {
    for (size_t k = 1; k < lane.steps.size(); ++k) REQUIRE(lane.steps[k - 1] < lane.steps[k]);
  }
  REQUIRE(verifyPlan(m).isOk());
}

TEST_CASE("layouts follow NCCL's in-place offsets", "[plan]") {
  CollShape s;
  s.dtype = DataType::kFloat32;
  s.count = 10;
  s.root = 1;
  s.kind = CollKind::kReduceScatter;
  OpLayout l = opLayout(s, 2, 4);
  REQUIRE(l.sendBytes == 160);
  REQUIRE(l.recvBytes == 40);
  REQUIRE(l.inPlaceDelta == -80);
  s.kind = CollKind::kAllGather;
  l = opLayout(s, 2, 4);
  REQUIRE(l.inPlaceDelta == 80);
  REQUIRE(l.outputEnd == 160);
  s.kind = CollKind::kReduce;
  REQUIRE(opLayout(s, 0, 4).recvBytes == 0);
  REQUIRE(opLayout(s, 1, 4).outputEnd == 40);
  s.kind = CollKind::kGather;
  REQUIRE(opLayout(s, 1, 4).inPlaceDelta == 40);
  s.kind = CollKind::kScatter;
  REQUIRE(opLayout(s, 1, 4).inPlaceDelta == -40);
  REQUIRE(opLayout(s, 0, 4).sendBytes == 0);
  s.kind = CollKind::kAllToAll;
  REQUIRE_FALSE(opLayout(s, 0, 4).mayAlias);
}

TEST_CASE("buffers count as disjoint exactly when they share no byte", "[plan]") {
  float buffer[128] = {};
  CollShape s;
  s.dtype = DataType::kFloat32;
  s.count = 10;
  s.kind = CollKind::kReduceScatter;  // send 40 floats, recv 10; in place: recv == send + rank*10
  REQUIRE(buffersMayOverlap(s, buffer, buffer + 20, 2, 4));
  REQUIRE(buffersMayOverlap(s, buffer, buffer, 2, 4));  // overlapping, not in place: not disjoint
  REQUIRE(buffersMayOverlap(s, buffer + 9, buffer, 2, 4));
  REQUIRE_FALSE(buffersMayOverlap(s, buffer + 10, buffer, 2, 4));  // recv ends where send starts
  REQUIRE_FALSE(buffersMayOverlap(s, buffer, buffer + 40, 2, 4));
  s.kind = CollKind::kAllGather;  // send 10, recv 40; in place: send == recv + rank*10
  REQUIRE(buffersMayOverlap(s, buffer + 30, buffer, 3, 4));
  REQUIRE_FALSE(buffersMayOverlap(s, buffer + 40, buffer, 3, 4));
  s.kind = CollKind::kAllReduce;
  REQUIRE(buffersMayOverlap(s, buffer, buffer, 1, 4));
  REQUIRE(buffersMayOverlap(s, buffer, buffer + 9, 1, 4));
  REQUIRE_FALSE(buffersMayOverlap(s, buffer, buffer + 10, 1, 4));  // adjacent
  REQUIRE_FALSE(buffersMayOverlap(s, nullptr, buffer, 1, 4));       // an unused buffer
  s.kind = CollKind::kBroadcast;  // a non-root does not read its send buffer
  s.root = 0;
  REQUIRE_FALSE(buffersMayOverlap(s, buffer, buffer, 1, 4));
  REQUIRE(buffersMayOverlap(s, buffer, buffer, 0, 4));
}

TEST_CASE("in-place offsets: inPlaceOffset agrees with opLayout", "[plan]") {
  for (CollKind kind : {CollKind::kAllReduce, CollKind::kBroadcast, CollKind::kReduce, CollKind::kReduceScatter,
                        CollKind::kAllGather, CollKind::kAllToAll, CollKind::kGather, CollKind::kScatter,
                        CollKind::kSend, CollKind::kRecv}) {
    for (int rank = 0; rank < 4; ++rank) {
      CollShape s{kind, DataType::kFloat64, ReduceOp::kSum, 7};
      s.root = 2;
      int64_t delta = 0;
      const bool defined = inPlaceOffset(s, rank, delta);
      const OpLayout l = opLayout(s, rank, 4);
      CHECK(defined == l.mayAlias);
      CHECK(delta == l.inPlaceDelta);
    }
  }
}

TEST_CASE("out of place, the ring ReduceScatter's last step receives into the output", "[plan]") {
  // No scratch slot to wait for: every receive of 2 ranks can be posted when
  // the call starts. Where the buffers may overlap (in place) the output holds
  // the local contribution, so the partial goes through scratch.
  for (int nranks : {2, 3}) {
    for (bool inPlace : {false, true}) {
      CollShape s{CollKind::kReduceScatter, DataType::kFloat32, ReduceOp::kSum, 4096};
      s.disjointBuffers = !inPlace;
      const Plan p = buildRingReduceScatter(s, viewOf(0, nranks), AlgoParams{1, 4096});
      INFO("nranks " << nranks << (inPlace ? " in place" : " out of place") << "\n" << p.toString());
      int intoOutput = 0, intoScratch = 0;
      for (const Step& step : p.steps) {
        if (step.kind != StepKind::kRecv) continue;
        (step.dst.buffer == kRecvBuffer ? intoOutput : intoScratch) += 1;
      }
      const int rounds = 4;  // 16 KiB per block in 4 KiB segments
      CHECK(intoOutput == (inPlace ? 0 : rounds));
      CHECK(intoScratch == (inPlace ? nranks - 1 : nranks - 2) * rounds);
      CHECK((p.scratchBytes == 0) == (!inPlace && nranks == 2));
      if (!inPlace && nranks == 2) {
        for (const Step& step : p.steps)  // nothing to wait for: posted at once
          if (step.kind == StepKind::kRecv) CHECK(step.depCount == 0);
      }
    }
  }
}

TEST_CASE("one-shot AllReduce: every message leaves and arrives in one round", "[plan]") {
  // Nothing a send or receive waits for (a scaled contribution waits only for
  // its own scaling copy), p-1 of each, and the p contributions summed in rank
  // order into the output.
  for (int nranks : {3, 4, 7}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kPreMulSum}) {
      CollShape s{CollKind::kAllReduce, DataType::kFloat32, ReduceOp::kSum, 37};
      s.op = op;
      const Plan p = buildOneShotAllReduce(s, viewOf(1, nranks), AlgoParams{});
      INFO("nranks " << nranks << " op " << static_cast<int>(op) << "\n" << p.toString());
      int sends = 0, recvs = 0, reduces = 0;
      for (const Step& step : p.steps) {
        if (step.kind == StepKind::kSend) {
          ++sends;
          CHECK(step.depCount == (op == ReduceOp::kPreMulSum ? 1 : 0));
        } else if (step.kind == StepKind::kRecv) {
          ++recvs;
          CHECK(step.depCount == 0);
        } else if (step.kind == StepKind::kReduce) {
          ++reduces;
          CHECK(step.dst.buffer == kRecvBuffer);
        }
      }
      CHECK(sends == nranks - 1);
      CHECK(recvs == nranks - 1);
      CHECK(reduces == nranks - 1);
    }
  }
}

TEST_CASE("one-shot AllReduce sums the own contribution from the send buffer where it can", "[plan]") {
  // Nothing ahead of the sends; the own contribution is staged in scratch only
  // where an in-place sum would overwrite it first (a rank after the first two)
  // or where it is scaled.
  for (int nranks : {2, 3, 4}) {
    for (int rank = 0; rank < nranks; ++rank) {
      for (bool disjoint : {false, true}) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kPreMulSum}) {
          CollShape s{CollKind::kAllReduce, DataType::kFloat32, op, 37};
          s.disjointBuffers = disjoint;
          const Plan p = buildOneShotAllReduce(s, viewOf(rank, nranks), AlgoParams{});
          INFO("rank " << rank << "/" << nranks << (disjoint ? " disjoint" : " in place") << " op "
                       << static_cast<int>(op) << "\n" << p.toString());
          const bool staged = op == ReduceOp::kPreMulSum || (!disjoint && rank >= 2);
          int copies = 0;
          bool readsSendBuffer = false;
          for (const Step& step : p.steps) {
            if (step.kind == StepKind::kCopy) ++copies;
            if (step.kind == StepKind::kReduce)
              readsSendBuffer |= step.src.buffer == kSendBuffer || step.src2.buffer == kSendBuffer;
          }
          CHECK(copies == (staged ? 1 : 0));
          CHECK(readsSendBuffer == !staged);
          if (op == ReduceOp::kSum) CHECK(p.steps.front().kind == StepKind::kSend);
        }
      }
    }
  }
}

TEST_CASE("one-shot AllGather and ReduceScatter: one round, straight to and from the blocks", "[plan]") {
  for (int nranks : {3, 4, 7}) {
    CollShape s{CollKind::kAllGather, DataType::kFloat32, ReduceOp::kSum, 37};
    const Plan gather = buildOneShotAllGather(s, viewOf(1, nranks), AlgoParams{});
    INFO("nranks " << nranks << "\n" << gather.toString());
    int sends = 0, recvsIntoOutput = 0;
    for (const Step& step : gather.steps) {
      if (step.kind == StepKind::kSend) ++sends;
      if (step.kind == StepKind::kRecv && step.dst.buffer == kRecvBuffer && step.depCount == 0)
        ++recvsIntoOutput;
    }
    CHECK(sends == nranks - 1);
    CHECK(recvsIntoOutput == nranks - 1);
    CHECK(gather.scratchBytes == 0);
    CHECK(gather.steps.front().kind == StepKind::kSend);  // the own copy after what peers wait for

    s.kind = CollKind::kReduceScatter;
    const Plan scatter = buildOneShotReduceScatter(s, viewOf(1, nranks), AlgoParams{});
    INFO(scatter.toString());
    int reduces = 0;
    sends = 0;
    for (const Step& step : scatter.steps) {
      if (step.kind == StepKind::kSend) {
        ++sends;
        CHECK(step.depCount == 0);
        CHECK(step.src.buffer == kSendBuffer);
      }
      if (step.kind == StepKind::kRecv) CHECK(step.depCount == 0);
      if (step.kind == StepKind::kReduce) ++reduces;
    }
    CHECK(sends == nranks - 1);
    CHECK(reduces == nranks - 1);
  }
}

TEST_CASE("peer-read AllGather: every rank copies the same source chunk at the same point", "[plan]") {
  // 2.5 chunks of 4 MiB per block: three chunks, the last one short.
  const uint64_t count = (uint64_t{10} << 20) / 4;
  for (int nranks : {2, 4}) {
    std::vector<std::vector<std::pair<int, uint64_t>>> orders;  // per rank: (source rank, offset)
    for (int r = 0; r < nranks; ++r) {
      CollShape s{CollKind::kAllGather, DataType::kFloat32, ReduceOp::kSum, count};
      const Plan plan = buildPeerReadAllGather(s, viewOf(r, nranks), AlgoParams{});
      INFO("rank " << r << " of " << nranks << "\n" << plan.toString());
      std::vector<std::pair<int, uint64_t>> order;
      int previous = -1;
      for (uint32_t i = 0; i < plan.steps.size(); ++i) {
        const Step& step = plan.steps[i];
        if (step.kind != StepKind::kCopy) continue;
        const int source = step.src.buffer == kSendBuffer ? r : peerOfBuffer(step.src.buffer);
        CHECK(step.dst.offset == static_cast<uint64_t>(source) * count * 4 + step.src.offset);
        order.emplace_back(source, step.src.offset);
        // Each copy waits for the one before it, so the engine runs them in this order.
        if (previous >= 0) {
          const auto deps = std::span(plan.deps).subspan(step.depBegin, step.depCount);
          CHECK(std::find(deps.begin(), deps.end(), static_cast<uint32_t>(previous)) != deps.end());
        }
        previous = static_cast<int>(i);
      }
      REQUIRE(order.size() == 3u * static_cast<size_t>(nranks));
      orders.push_back(order);
    }
    for (int r = 1; r < nranks; ++r) CHECK(orders[r] == orders[0]);
    CHECK(orders[0][0] == std::pair<int, uint64_t>{0, 0});
    CHECK(orders[0][1] == std::pair<int, uint64_t>{1, 0});
    CHECK(orders[0][nranks] == std::pair<int, uint64_t>{0, uint64_t{4} << 20});
  }
}

TEST_CASE("peer-read AllGather where ranks take turns: no copy waits for another", "[plan]") {
  // Ranks that outnumber the cores do not run together: a rank copies its own
  // block at once and each peer's as soon as that peer's window is there.
  RankView view = viewOf(2, 4);
  view.ranksTakeTurns = true;
  CollShape s{CollKind::kAllGather, DataType::kFloat32, ReduceOp::kSum, (uint64_t{10} << 20) / 4};
  const Plan plan = buildPeerReadAllGather(s, view, AlgoParams{});
  INFO(plan.toString());
  int copies = 0;
  for (const Step& step : plan.steps) {
    if (step.kind != StepKind::kCopy) continue;
    ++copies;
    CHECK(step.bytes == s.count * 4);
    if (step.src.buffer == kSendBuffer) {
      CHECK(step.depCount == 0);
    } else {
      REQUIRE(step.depCount == 1);
      CHECK(plan.steps[plan.deps[step.depBegin]].kind == StepKind::kRecv);
    }
  }
  CHECK(copies == 4);
}

TEST_CASE("one-shot AllReduce costs one round: cheaper than recursive doubling only while small", "[registry]") {
  const AlgorithmEntry* rd = findAlgorithm(CollKind::kAllReduce, "recursive_doubling");
  const AlgorithmEntry* oneShot = findAlgorithm(CollKind::kAllReduce, "one_shot");
  REQUIRE(oneShot != nullptr);
  CostParams c;
  CollShape s{CollKind::kAllReduce, DataType::kFloat32, ReduceOp::kSum, 2};
  CHECK(oneShot->estimate(s, viewOf(0, 4), c) < rd->estimate(s, viewOf(0, 4), c));
  // Two ranks: the same single exchange plus a copy.
  CHECK(rd->estimate(s, viewOf(0, 2), c) < oneShot->estimate(s, viewOf(0, 2), c));
  // Posting p-1 messages outweighs the rounds saved among many ranks.
  CHECK(rd->estimate(s, viewOf(0, 64), c) < oneShot->estimate(s, viewOf(0, 64), c));
  s.count = 1 << 20;  // 4 MiB: p-1 copies of the buffer per rank
  CHECK(rd->estimate(s, viewOf(0, 4), c) < oneShot->estimate(s, viewOf(0, 4), c));
}

TEST_CASE("the registry covers every collective", "[registry]") {
  for (int k = 0; k < kNumCollKinds; ++k) {
    auto kind = static_cast<CollKind>(k);
    INFO(collKindName(kind));
    REQUIRE_FALSE(candidates(kind).empty());
    for (const AlgorithmEntry* e : candidates(kind)) {
      REQUIRE(findAlgorithm(kind, e->name) == e);
      REQUIRE(e->kind == kind);
    }
  }
  REQUIRE(findAlgorithm(CollKind::kAllReduce, "ring") != nullptr);
  REQUIRE(findAlgorithm(CollKind::kAllReduce, "recursive_doubling") != nullptr);
  REQUIRE(findAlgorithm(CollKind::kAllReduce, "nope") == nullptr);
  REQUIRE(findAlgorithm(CollKind::kBroadcast, "ring") == nullptr);
}

TEST_CASE("estimates rank latency and bandwidth algorithms sensibly", "[registry]") {
  const AlgorithmEntry* ring = findAlgorithm(CollKind::kAllReduce, "ring");
  const AlgorithmEntry* rd = findAlgorithm(CollKind::kAllReduce, "recursive_doubling");
  CostParams c;
  CollShape s;
  s.kind = CollKind::kAllReduce;
  s.dtype = DataType::kFloat32;
  RankView v = viewOf(0, 8);
  s.count = 2;  // 8 bytes: latency-bound
  REQUIRE(rd->estimate(s, v, c) < ring->estimate(s, v, c));
  s.count = 16 << 20;  // 64 MiB: bandwidth-bound
  REQUIRE(ring->estimate(s, v, c) < rd->estimate(s, v, c));
  v.peerReads = true;  // ranks may read each other (peer_read)
  v.nodeOf = {0, 0, 0, 0, 1, 1, 1, 1};  // two equal nodes (hierarchical)
  for (const AlgorithmEntry& e : algorithms()) {
    CollShape shape;
    shape.kind = e.kind;
    shape.count = 1024;
    shape.root = 0;
    shape.peer = 1;
    REQUIRE(e.supports(shape, v));
    REQUIRE(e.estimate(shape, v, c) > 0);
    shape.root = 9;
    shape.peer = -1;
    if (e.kind != CollKind::kAllReduce && e.kind != CollKind::kAllGather &&
        e.kind != CollKind::kReduceScatter && e.kind != CollKind::kAllToAll)
      REQUIRE_FALSE(e.supports(shape, v));
  }
}

TEST_CASE("peer-reading algorithms need peerReads and refuse PreMulSum", "[registry]") {
  RankView v = viewOf(0, 4);
  for (CollKind kind : {CollKind::kAllReduce, CollKind::kReduceScatter, CollKind::kAllGather}) {
    const AlgorithmEntry* e = findAlgorithm(kind, "peer_read");
    REQUIRE(e != nullptr);
    CollShape shape;
    shape.kind = kind;
    shape.count = 1024;
    v.peerReads = false;
    REQUIRE_FALSE(e->supports(shape, v));
    v.peerReads = true;
    REQUIRE(e->supports(shape, v));
    shape.op = ReduceOp::kPreMulSum;
    REQUIRE_FALSE(e->supports(shape, v));
    Plan plan = e->build(CollShape{kind, DataType::kFloat32, ReduceOp::kSum, 1000}, v, AlgoParams{});
    REQUIRE(plan.readsPeers);
  }
}

TEST_CASE("empty collectives give empty plans / p2p zero bytes is a message", "[plan]") {
  for (const AlgorithmEntry& e : algorithms()) {
    CollShape s;
    s.kind = e.kind;
    s.count = 0;
    s.root = 0;
    s.peer = 1;
    Plan p = e.build(s, viewOf(0, 3), AlgoParams{});
    if (e.kind == CollKind::kSend || e.kind == CollKind::kRecv) {
      REQUIRE(p.steps.size() == 1);
      REQUIRE(p.steps[0].channel == kP2pChannel);
    } else {
      REQUIRE(p.steps.empty());
    }
  }
}

}  // namespace
}  // namespace shoal::testing
