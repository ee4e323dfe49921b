// Every builder, run on real data by the reference simulator, for every rank
// count 1..9, several sizes, data types, reduction ops, in and out of place.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>

#include "collectives/plan_test_util.h"
#include "reduce/reduce.h"

namespace shoal::testing {
namespace {

struct Case {
  const char* name;
  BuildFn build;
  CollShape shape;
  int nranks = 1;
  AlgoParams params;
  bool inPlace = false;
  bool mixedPlacement = false;  // odd ranks call the other way (in or out of place)
  std::vector<int> ring;
  const SimReducer* reducer = nullptr;  // nullptr: the simulator's fallback
  std::vector<int> nodeOf;               // node per rank (hierarchical algorithms)
};

std::string describe(const Case& c) {
  return str(c.name, " ", collKindName(c.shape.kind), " ", dataTypeName(c.shape.dtype), " ",
             reduceOpName(c.shape.op), c.shape.divisor > 1 ? " (avg)" : "", " count ",
             c.shape.count, " root ", c.shape.root, " nranks ", c.nranks, " channels ",
             c.params.channels, " segment ", c.params.segmentBytes,
             c.inPlace ? " in-place" : " out-of-place", c.mixedPlacement ? " (odd ranks the other way)" : "",
             c.ring.empty() ? "" : " custom ring");
}

bool rankInPlace(const Case& c, int r) { return c.inPlace != (c.mixedPlacement && r % 2 == 1); }

// Every rank's plan verifies, and the plans run together on `buffers`.
void requireRuns(const std::vector<PlanPtr>& plans, const std::vector<std::vector<SimOpBuffers>>& buffers) {
  Status v = verifyPlans(plans);
  INFO(v.toString());
  REQUIRE(v.isOk());
  Status s = simulatePlans(plans, buffers);
  INFO(s.toString());
  REQUIRE(s.isOk());
}

// The shape rank r's call has, as the communicator sees it
// (buffersMayOverlap): out of place, the buffers are disjoint.
CollShape placedShape(const Case& c, int r) {
  CollShape shape = c.shape;
  shape.disjointBuffers = !rankInPlace(c, r);
  return shape;
}

bool isReduction(CollKind k) {
  return k == CollKind::kAllReduce || k == CollKind::kReduceScatter || k == CollKind::kReduce;
}

// Input of rank r for the case.
std::vector<uint8_t> makeInput(const Case& c, int r) {
  const OpLayout l = opLayout(c.shape, r, c.nranks);
  std::vector<uint8_t> in(l.sendBytes);
  if (isReduction(c.shape.kind)) {
    const uint64_t es = dataTypeSize(c.shape.dtype);
    for (uint64_t i = 0; i < l.sendBytes / es; ++i)
      storeValue(c.shape.dtype, in.data(), i, inputValue(c.shape.dtype, c.shape.op, r, i));
  } else {
    for (uint64_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint8_t>(r * 37 + i * 11 + 5);
  }
  return in;
}

// The scalar of rank r for kPreMulSum (nccl-tests' mulsum: 1 on even ranks,
// 2 on odd ones).
double preMulScalar(int r) { return r % 2 ? 2.0 : 1.0; }

double combineExact(ReduceOp op, double a, double b) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kPreMulSum: return a + b;
    case ReduceOp::kProd: return a * b;
    case ReduceOp::kMax: return std::max(a, b);
    case ReduceOp::kMin: return std::min(a, b);
  }
  return 0;
}

// Reduction of `bytes` at `offset` of every rank's input, in closed form: the
// inputs are small integers (inputValue), so every partial result is exact in
// every type and order, and the value is computed here in double (integer
// average: the sum divided by the divisor, truncated toward zero), never by a
// reducer of the library's.
std::vector<uint8_t> reduced(const Case& c, uint64_t offset, uint64_t bytes) {
  const DataType t = c.shape.dtype;
  const uint64_t es = dataTypeSize(t);
  std::vector<uint8_t> out(bytes);
  for (uint64_t k = 0; k < bytes / es; ++k) {
    const uint64_t i = offset / es + k;
    double acc = 0;
    for (int r = 0; r < c.nranks; ++r) {
      double x = inputValue(t, c.shape.op, r, i);
      if (c.shape.op == ReduceOp::kPreMulSum) x *= preMulScalar(r);
      acc = r == 0 ? x : combineExact(c.shape.op, acc, x);
    }
    if (c.shape.divisor > 1) acc = std::trunc(acc / static_cast<double>(c.shape.divisor));
    storeValue(t, out.data(), k, acc);
  }
  return out;
}

// What rank q's recv buffer must hold in [outputBegin, outputEnd).
std::vector<uint8_t> expected(const Case& c, int q, const std::vector<std::vector<uint8_t>>& in) {
  const uint64_t B = c.shape.count * dataTypeSize(c.shape.dtype);
  const int root = c.shape.root;
  std::vector<uint8_t> out;
  auto append = [&](const std::vector<uint8_t>& v, uint64_t off, uint64_t n) {
    out.insert(out.end(), v.begin() + off, v.begin() + off + n);
  };
  switch (c.shape.kind) {
    case CollKind::kAllReduce: return reduced(c, 0, B);
    case CollKind::kReduceScatter: return reduced(c, q * B, B);
    case CollKind::kReduce: return q == root ? reduced(c, 0, B) : out;
    case CollKind::kAllGather:
      for (int r = 0; r < c.nranks; ++r) append(in[r], 0, B);
      return out;
    case CollKind::kBroadcast: append(in[root], 0, B); return out;
    case CollKind::kAllToAll:
      for (int r = 0; r < c.nranks; ++r) append(in[r], q * B, B);
      return out;
    case CollKind::kGather:
      if (q == root)
        for (int r = 0; r < c.nranks; ++r) append(in[r], 0, B);
      return out;
    case CollKind::kScatter: append(in[root], q * B, B); return out;
    default: return out;
  }
}

void runCase(const Case& c) {
  INFO(describe(c));
  std::vector<PlanPtr> plans;
  for (int r = 0; r < c.nranks; ++r)
    plans.push_back(std::make_shared<Plan>(c.build(placedShape(c, r), viewOf(r, c.nranks, c.ring, c.nodeOf), c.params)));
  Status v = verifyPlans(plans);
  INFO(v.toString());
  REQUIRE(v.isOk());

  std::vector<OpMemory> mem(c.nranks);
  std::vector<std::vector<uint8_t>> inputs(c.nranks);
  std::vector<uint64_t> scalars(c.nranks, 0);
  std::vector<std::vector<SimOpBuffers>> buffers(c.nranks);
  for (int r = 0; r < c.nranks; ++r) {
    allocate(mem[r], c.shape, r, c.nranks, rankInPlace(c, r));
    inputs[r] = makeInput(c, r);
    std::copy(inputs[r].begin(), inputs[r].end(), static_cast<uint8_t*>(mem[r].send));
    storeValue(c.shape.dtype, &scalars[r], 0, preMulScalar(r));
    buffers[r] = {SimOpBuffers{mem[r].send, mem[r].recv, &scalars[r]}};
  }
  SimOptions options;
  options.seed = c.nranks * 1000 + c.shape.count;
  options.reducer = c.reducer;
  Status s = simulatePlans(plans, buffers, options);
  INFO(s.toString());
  REQUIRE(s.isOk());

  for (int q = 0; q < c.nranks; ++q) {
    const OpLayout l = opLayout(c.shape, q, c.nranks);
    const std::vector<uint8_t> want = expected(c, q, inputs);
    REQUIRE(want.size() == l.outputEnd - l.outputBegin);
    const uint8_t* got = static_cast<const uint8_t*>(mem[q].recv) + l.outputBegin;
    auto diff = std::mismatch(want.begin(), want.end(), got);
    if (diff.first != want.end()) {
      FAIL("rank " << q << " recv byte " << (diff.first - want.begin()) << " is "
                   << int(*diff.second) << ", expected " << int(*diff.first));
    }
    if (!rankInPlace(c, q)) {
      // Inputs untouched, nothing written past the buffers or into unused ones.
      REQUIRE(std::equal(inputs[q].begin(), inputs[q].end(), mem[q].sendStore.begin()));
      REQUIRE(mem[q].sendStore.back() == kSentinel);
      REQUIRE(mem[q].recvStore.back() == kSentinel);
    }
  }
}

const AlgoParams kParams[] = {
    AlgoParams{1, 1 << 20},  // defaults: one round
    AlgoParams{2, 64},       // many small rounds on two channels
    AlgoParams{3, 256},
};

TEST_CASE("reductions compute the right result on every rank", "[simulate]") {
  struct Algo {
    const char* name;
    BuildFn build;
    CollKind kind;
  };
  const Algo algos[] = {
      {"ring", buildRingAllReduce, CollKind::kAllReduce},
      {"recursive_doubling", buildRecursiveDoublingAllReduce, CollKind::kAllReduce},
      {"one_shot", buildOneShotAllReduce, CollKind::kAllReduce},
      {"ring", buildRingReduceScatter, CollKind::kReduceScatter},
      {"one_shot", buildOneShotReduceScatter, CollKind::kReduceScatter},
      {"bruck", buildBruckReduceScatter, CollKind::kReduceScatter},
      {"chain", buildChainReduce, CollKind::kReduce},
      {"peer_read", buildPeerReadAllReduce, CollKind::kAllReduce},
      {"peer_read", buildPeerReadReduceScatter, CollKind::kReduceScatter},
      {"one_shot_read", buildPeerReadOneShotAllReduce, CollKind::kAllReduce},
  };
  const DataType types[] = {DataType::kInt8,    DataType::kUint8,   DataType::kInt32,
                            DataType::kUint64,  DataType::kFloat16, DataType::kFloat32,
                            DataType::kFloat64, DataType::kBfloat16};
  const ReduceOp ops[] = {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMax, ReduceOp::kMin,
                          ReduceOp::kPreMulSum};
  const uint64_t counts[] = {1, 37, 301};
  int variant = 0;
  for (const Algo& algo : algos) {
    for (int nranks = 1; nranks <= 9; ++nranks) {
      for (DataType t : types) {
        for (int o = 0; o <= 5; ++o) {  // 5: integer average (sum, then divide)
          if (o == 5 && isFloating(t)) continue;
          // Peer reads take raw peer inputs: no per-rank scalar (registry refuses it).
          const bool readsPeers = std::string(algo.name) == "peer_read" || std::string(algo.name) == "one_shot_read";
          if (ops[o < 5 ? o : 0] == ReduceOp::kPreMulSum && o < 5 && readsPeers) continue;
          for (uint64_t count : counts) {
            for (bool inPlace : {false, true}) {
              // One phase overwrites its input where peers read it: out of place only.
              if (inPlace && std::string(algo.name) == "one_shot_read") continue;
              Case c{algo.name, algo.build};
              c.shape.kind = algo.kind;
              c.shape.dtype = t;
              c.shape.op = o == 5 ? ReduceOp::kSum : ops[o];
              c.shape.divisor = o == 5 ? nranks : 0;
              c.shape.count = count;
              c.shape.root = (variant % nranks);
              c.nranks = nranks;
              c.params = kParams[variant % 3];
              c.inPlace = inPlace;
              ++variant;
              runCase(c);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("reductions agree with the real reducer (src/reduce)", "[simulate]") {
  static const SimReducer kReal{&reduce::combine, &reduce::scale, &reduce::divide};
  const BuildFn builds[] = {buildRingAllReduce, buildRecursiveDoublingAllReduce,
                            buildRingReduceScatter, buildChainReduce, buildBruckReduceScatter};
  const CollKind kinds[] = {CollKind::kAllReduce, CollKind::kAllReduce,
                            CollKind::kReduceScatter, CollKind::kReduce,
                            CollKind::kReduceScatter};
  const DataType types[] = {DataType::kInt8, DataType::kUint32, DataType::kInt64,
                            DataType::kFloat16, DataType::kFloat32, DataType::kFloat64,
                            DataType::kBfloat16};
  const ReduceOp ops[] = {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMax, ReduceOp::kMin,
                          ReduceOp::kPreMulSum};
  int variant = 0;
  for (int a = 0; a < 5; ++a) {
    for (int nranks : {1, 2, 3, 5, 8}) {
      for (DataType t : types) {
        for (int o = 0; o <= 5; ++o) {
          if (o == 5 && isFloating(t)) continue;
          for (bool inPlace : {false, true}) {
            Case c{"real reducer", builds[a]};
            c.shape.kind = kinds[a];
            c.shape.dtype = t;
            c.shape.op = o == 5 ? ReduceOp::kSum : ops[o];
            c.shape.divisor = o == 5 ? nranks : 0;
            c.shape.count = 301;
            c.shape.root = variant % nranks;
            c.nranks = nranks;
            c.params = kParams[variant++ % 3];
            c.inPlace = inPlace;
            c.reducer = &kReal;
            runCase(c);
          }
        }
      }
    }
  }
}

TEST_CASE("hierarchical collectives reduce and gather across equal and unequal nodes", "[simulate]") {
  // nodeOf per case: equal nodes (hierarchical), a ring order that interleaves
  // nodes, and unequal nodes (built as the flat ring).
  struct Layout {
    std::vector<int> nodeOf;
    std::vector<int> ring;
  };
  const Layout layouts[] = {
      {{0, 0, 1, 1}, {}},
      {{0, 0, 1, 1, 2, 2}, {}},
      {{0, 0, 0, 1, 1, 1}, {}},
      {{0, 0, 1, 1, 2, 2, 3, 3}, {}},
      {{0, 1, 0, 1}, {0, 2, 1, 3}},
      {{0, 0, 0, 1, 1}, {}},
  };
  const DataType types[] = {DataType::kInt32, DataType::kFloat16, DataType::kFloat32, DataType::kBfloat16};
  const ReduceOp ops[] = {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kPreMulSum};
  struct Algo {
    BuildFn build;
    CollKind kind;
  };
  const Algo algos[] = {{buildHierarchicalAllReduce, CollKind::kAllReduce},
                        {buildHierarchicalReduceScatter, CollKind::kReduceScatter},
                        {buildHierarchicalAllGather, CollKind::kAllGather}};
  int variant = 0;
  for (const Algo& algo : algos)
  for (const Layout& layout : layouts) {
    const int n = static_cast<int>(layout.nodeOf.size());
    for (DataType t : types) {
      for (int o = 0; o <= 3; ++o) {  // 3: integer average
        if (o == 3 && isFloating(t)) continue;
        if (algo.kind == CollKind::kAllGather && o != 0) continue;  // moves data only
        for (uint64_t count : {uint64_t{1}, uint64_t{37}, uint64_t{301}, uint64_t{5003}}) {
          for (bool inPlace : {false, true}) {
            Case c{"hierarchical", algo.build};
            c.shape.kind = algo.kind;
            c.shape.dtype = t;
            c.shape.op = o == 3 ? ReduceOp::kSum : ops[o];
            c.shape.divisor = o == 3 ? n : 0;
            c.shape.count = count;
            c.nranks = n;
            c.params = kParams[variant++ % 3];
            c.inPlace = inPlace;
            c.ring = layout.ring;
            c.nodeOf = layout.nodeOf;
            runCase(c);
          }
        }
      }
    }
  }
  RankView equal = viewOf(0, 4, {}, {0, 0, 1, 1});
  CHECK(hierarchicalApplies(equal));
  CHECK(buildHierarchicalAllReduce(CollShape{CollKind::kAllReduce, DataType::kFloat32, ReduceOp::kSum, 64}, equal,
                                   AlgoParams{})
            .algorithm == "hierarchical");
  CHECK_FALSE(hierarchicalApplies(viewOf(0, 5, {}, {0, 0, 0, 1, 1})));
  CHECK_FALSE(hierarchicalApplies(viewOf(0, 4, {}, {0, 0, 0, 0})));
  CHECK_FALSE(hierarchicalApplies(viewOf(0, 4)));
}

// The peer-read AllGather as a node whose ranks outnumber its cores builds it.
Plan buildPeerReadAllGatherTakingTurns(const CollShape& shape, const RankView& view, const AlgoParams& params) {
  RankView turns = view;
  turns.ranksTakeTurns = true;
  return buildPeerReadAllGather(shape, turns, params);
}

TEST_CASE("data movement collectives deliver every block", "[simulate]") {
  struct Algo {
    const char* name;
    BuildFn build;
    CollKind kind;
  };
  const Algo algos[] = {
      {"ring", buildRingAllGather, CollKind::kAllGather},
      {"bruck", buildBruckAllGather, CollKind::kAllGather},
      {"one_shot", buildOneShotAllGather, CollKind::kAllGather},
      {"peer_read", buildPeerReadAllGather, CollKind::kAllGather},
      {"peer_read, ranks take turns", buildPeerReadAllGatherTakingTurns, CollKind::kAllGather},
      {"chain", buildChainBroadcast, CollKind::kBroadcast},
      {"pairwise", buildPairwiseAllToAll, CollKind::kAllToAll},
      {"direct", buildDirectGather, CollKind::kGather},
      {"direct", buildDirectScatter, CollKind::kScatter},
  };
  const DataType types[] = {DataType::kFloat8e4m3, DataType::kFloat16, DataType::kFloat32,
                            DataType::kFloat64};
  int variant = 0;
  for (const Algo& algo : algos) {
    for (int nranks = 1; nranks <= 9; ++nranks) {
      for (DataType t : types) {
        for (uint64_t count : {1, 37, 1001}) {
          for (bool inPlace : {false, true}) {
            if (inPlace && algo.kind == CollKind::kAllToAll) continue;
            for (int root : {0, nranks - 1}) {
              Case c{algo.name, algo.build};
              c.shape.kind = algo.kind;
              c.shape.dtype = t;
              c.shape.count = count;
              c.shape.root = root;
              c.nranks = nranks;
              c.params = kParams[variant++ % 3];
              c.inPlace = inPlace;
              runCase(c);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("peer-read AllGather of blocks several chunks long", "[simulate]") {
  // Blocks of 2 chunks and a few elements past a 4 MiB boundary (the chunk).
  for (int nranks : {2, 3}) {
    for (bool inPlace : {false, true}) {
      Case c{"peer_read", inPlace ? buildPeerReadAllGather : buildPeerReadAllGatherTakingTurns};
      c.shape.kind = CollKind::kAllGather;
      c.shape.dtype = DataType::kFloat32;
      c.shape.count = (uint64_t{8} << 20) / 4 + 37;
      c.nranks = nranks;
      c.inPlace = inPlace;
      runCase(c);
    }
  }
}

TEST_CASE("ring algorithms follow a custom ring order", "[simulate]") {
  const std::vector<int> ring = {3, 0, 5, 1, 4, 2};
  const CollKind kinds[] = {CollKind::kAllReduce, CollKind::kAllReduce, CollKind::kReduceScatter,
                            CollKind::kAllGather, CollKind::kBroadcast, CollKind::kReduce,
                            CollKind::kAllGather, CollKind::kReduceScatter};
  const BuildFn builds[] = {buildRingAllReduce, buildRecursiveDoublingAllReduce,
                            buildRingReduceScatter, buildRingAllGather, buildChainBroadcast,
                            buildChainReduce, buildBruckAllGather, buildBruckReduceScatter};
  for (int a = 0; a < 8; ++a) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kPreMulSum}) {
      for (bool inPlace : {false, true}) {
        Case c{"custom", builds[a]};
        c.shape.kind = kinds[a];
        c.shape.dtype = DataType::kFloat32;
        c.shape.op = op;
        c.shape.count = 1003;
        c.shape.root = 4;
        c.nranks = 6;
        c.params = AlgoParams{2, 128};
        c.inPlace = inPlace;
        c.ring = ring;
        runCase(c);
      }
    }
  }
}

TEST_CASE("ranks may call one collective some in place, some out of place", "[simulate]") {
  // Plans differ by placement (e.g. the ring's last receive goes to the output
  // out of place); their messages must not.
  struct Algo {
    const char* name;
    BuildFn build;
    CollKind kind;
    std::vector<int> nodeOf;
  };
  const Algo algos[] = {
      {"ring", buildRingAllReduce, CollKind::kAllReduce, {}},
      {"ring", buildRingReduceScatter, CollKind::kReduceScatter, {}},
      {"ring", buildRingAllGather, CollKind::kAllGather, {}},
      {"recursive_doubling", buildRecursiveDoublingAllReduce, CollKind::kAllReduce, {}},
      {"one_shot", buildOneShotAllReduce, CollKind::kAllReduce, {}},
      {"one_shot", buildOneShotAllGather, CollKind::kAllGather, {}},
      {"one_shot", buildOneShotReduceScatter, CollKind::kReduceScatter, {}},
      {"bruck", buildBruckReduceScatter, CollKind::kReduceScatter, {}},
      {"hierarchical", buildHierarchicalAllReduce, CollKind::kAllReduce, {0, 0, 1, 1}},
      {"hierarchical", buildHierarchicalReduceScatter, CollKind::kReduceScatter, {0, 0, 1, 1, 2, 2}},
  };
  int variant = 0;
  for (const Algo& algo : algos) {
    for (int nranks : {2, 3, 4, 5, 6}) {
      if (!algo.nodeOf.empty() && static_cast<int>(algo.nodeOf.size()) != nranks) continue;
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kPreMulSum}) {
        for (bool inPlace : {false, true}) {
          Case c{algo.name, algo.build};
          c.shape.kind = algo.kind;
          c.shape.dtype = DataType::kFloat32;
          c.shape.op = algo.kind == CollKind::kAllGather ? ReduceOp::kSum : op;
          c.shape.count = 1001;
          c.nranks = nranks;
          c.params = kParams[variant++ % 3];
          c.inPlace = inPlace;
          c.mixedPlacement = true;
          c.nodeOf = algo.nodeOf;
          runCase(c);
        }
      }
    }
  }
}

TEST_CASE("the simulator refuses buffers that overlap where the plan does not allow it", "[simulate]") {
  CollShape shape{CollKind::kReduceScatter, DataType::kFloat32, ReduceOp::kSum, 32};
  std::vector<float> a(64, 1), b(64, 1);
  // In place: rank r's recv is its send + r blocks.
  std::vector<std::vector<SimOpBuffers>> inPlace = {{SimOpBuffers{a.data(), a.data()}},
                                                    {SimOpBuffers{b.data(), b.data() + 32}}};
  shape.disjointBuffers = true;
  Status s = simulatePlans(buildAll(buildRingReduceScatter, shape, 2, AlgoParams{}), inPlace, SimOptions{});
  REQUIRE(s.code() == Code::kInvalidArgument);
  REQUIRE(s.message().find("built for disjoint buffers") != std::string::npos);
  shape.disjointBuffers = false;
  auto plans = buildAll(buildRingReduceScatter, shape, 2, AlgoParams{});
  // Overlapping, but not at NCCL's offset (rank 1 passes recv == send).
  std::vector<std::vector<SimOpBuffers>> skewed = {{SimOpBuffers{a.data(), a.data()}},
                                                   {SimOpBuffers{b.data(), b.data()}}};
  s = simulatePlans(plans, skewed, SimOptions{});
  REQUIRE(s.code() == Code::kInvalidArgument);
  REQUIRE(s.message().find("other than in place") != std::string::npos);
  REQUIRE(simulatePlans(plans, inPlace, SimOptions{}).isOk());
  REQUIRE(a[0] == 2.0f);
  REQUIRE(b[32] == 2.0f);
}

TEST_CASE("recursive doubling and one-shot leave identical bytes on every rank", "[simulate]") {
  // Values whose sum depends on the order: every rank must still agree bitwise.
  for (BuildFn build : {buildRecursiveDoublingAllReduce, buildOneShotAllReduce})
  for (int nranks = 2; nranks <= 9; ++nranks) {
    CollShape shape;
    shape.kind = CollKind::kAllReduce;
    shape.dtype = DataType::kFloat32;
    shape.count = 64;
    auto plans = buildAll(build, shape, nranks, AlgoParams{});
    REQUIRE(verifyPlans(plans).isOk());
    std::vector<std::vector<float>> send(nranks, std::vector<float>(64)), recv = send;
    std::vector<std::vector<SimOpBuffers>> buffers(nranks);
    for (int r = 0; r < nranks; ++r) {
      for (int i = 0; i < 64; ++i) send[r][i] = 1.0f / (3 + r * 7 + i) * (r % 2 ? 1e7f : 1e-3f);
      buffers[r] = {SimOpBuffers{send[r].data(), recv[r].data(), nullptr}};
    }
    REQUIRE(simulatePlans(plans, buffers).isOk());
    for (int r = 1; r < nranks; ++r)
      REQUIRE(std::memcmp(recv[0].data(), recv[r].data(), 64 * sizeof(float)) == 0);
  }
}

TEST_CASE("send and recv pair up / self included / zero bytes included", "[simulate]") {
  for (int nranks = 1; nranks <= 6; ++nranks) {
    for (uint64_t count : {0, 1, 513}) {
      // Each rank sends to rank+1 and receives from rank-1, in one group.
      std::vector<PlanPtr> plans;
      std::vector<std::vector<uint8_t>> send(nranks), recv(nranks);
      std::vector<std::vector<SimOpBuffers>> buffers(nranks);
      for (int r = 0; r < nranks; ++r) {
        CollShape s;
        s.kind = CollKind::kSend;
        s.dtype = DataType::kInt32;
        s.count = count;
        s.peer = (r + 1) % nranks;
        CollShape rv = s;
        rv.kind = CollKind::kRecv;
        rv.peer = (r + nranks - 1) % nranks;
        auto a = std::make_shared<Plan>(buildSendRecv(s, viewOf(r, nranks), AlgoParams{}));
        auto b = std::make_shared<Plan>(buildSendRecv(rv, viewOf(r, nranks), AlgoParams{}));
        plans.push_back(std::make_shared<Plan>(mergePlans({a, b})));
        send[r].resize(count * 4);
        for (size_t i = 0; i < send[r].size(); ++i) send[r][i] = static_cast<uint8_t>(r + 3 * i);
        recv[r].assign(count * 4, kSentinel);
        buffers[r] = {SimOpBuffers{send[r].data(), nullptr, nullptr},
                      SimOpBuffers{nullptr, recv[r].data(), nullptr}};
      }
      requireRuns(plans, buffers);
      for (int r = 0; r < nranks; ++r) REQUIRE(recv[r] == send[(r + nranks - 1) % nranks]);
    }
  }
}

TEST_CASE("a group of two AllReduces runs as one merged plan", "[simulate]") {
  const int nranks = 4;
  std::vector<PlanPtr> plans;
  std::vector<std::vector<float>> a(nranks, std::vector<float>(100)), b(nranks,
                                                                        std::vector<float>(33));
  std::vector<std::vector<SimOpBuffers>> buffers(nranks);
  for (int r = 0; r < nranks; ++r) {
    CollShape s;
    s.kind = CollKind::kAllReduce;
    s.dtype = DataType::kFloat32;
    s.count = 100;
    auto p1 = std::make_shared<Plan>(buildRingAllReduce(s, viewOf(r, nranks), AlgoParams{2, 64}));
    s.count = 33;
    auto p2 = std::make_shared<Plan>(buildRecursiveDoublingAllReduce(s, viewOf(r, nranks), {}));
    plans.push_back(std::make_shared<Plan>(mergePlans({p1, p2})));
    for (int i = 0; i < 100; ++i) a[r][i] = static_cast<float>(r + i);
    for (int i = 0; i < 33; ++i) b[r][i] = static_cast<float>(r * i);
    buffers[r] = {SimOpBuffers{a[r].data(), a[r].data(), nullptr},
                  SimOpBuffers{b[r].data(), b[r].data(), nullptr}};
  }
  requireRuns(plans, buffers);
  for (int r = 0; r < nranks; ++r) {
    for (int i = 0; i < 100; ++i) REQUIRE(a[r][i] == 6 + 4 * i);
    for (int i = 0; i < 33; ++i) REQUIRE(b[r][i] == 6 * i);
  }
}

// A lone collective's plan, peer-reading or not, merges with the Send and
// Recv beside it on some ranks and runs alone on others: the peer-reading
// AllReduce is op 1 of rank 0's group (after a Send to rank 1), op 0 of rank
// 1's (before the Recv) and alone on rank 2; each reads the others' buffers
// of that operation.
TEST_CASE("a peer-reading collective merged with Send and Recv on some ranks and alone on others",
          "[simulate]") {
  const int nranks = 3;
  const uint64_t count = 1000;
  CollShape all;
  all.kind = CollKind::kAllReduce;
  all.dtype = DataType::kFloat32;
  all.count = count;
  CollShape send = all, recv = all;
  send.kind = CollKind::kSend;
  send.peer = 1;
  recv.kind = CollKind::kRecv;
  recv.peer = 0;
  std::vector<std::vector<float>> in(nranks, std::vector<float>(count)), out(nranks, std::vector<float>(count, -1.f));
  std::vector<float> got(count, -1.f);
  std::vector<PlanPtr> plans;
  std::vector<std::vector<SimOpBuffers>> buffers(nranks);
  for (int r = 0; r < nranks; ++r) {
    RankView view = viewOf(r, nranks);
    view.peerReads = true;
    for (uint64_t i = 0; i < count; ++i) in[r][i] = static_cast<float>((r * 7 + i) % 13);
    auto reduce = std::make_shared<Plan>(buildPeerReadAllReduce(all, view, AlgoParams{}));
    REQUIRE(reduce->readsPeers);
    const SimOpBuffers reduceBuffers{in[r].data(), out[r].data(), nullptr};
    if (r == 0) {
      plans.push_back(std::make_shared<Plan>(
          mergePlans({std::make_shared<Plan>(buildSendRecv(send, view, AlgoParams{})), reduce})));
      CHECK(plans.back()->peerReadOp == 1);
      buffers[r] = {SimOpBuffers{in[r].data(), nullptr, nullptr}, reduceBuffers};
    } else if (r == 1) {
      plans.push_back(std::make_shared<Plan>(
          mergePlans({reduce, std::make_shared<Plan>(buildSendRecv(recv, view, AlgoParams{}))})));
      CHECK(plans.back()->peerReadOp == 0);
      buffers[r] = {reduceBuffers, SimOpBuffers{nullptr, got.data(), nullptr}};
    } else {
      plans.push_back(reduce);
      buffers[r] = {reduceBuffers};
    }
    REQUIRE(plans.back()->readsPeers);
  }
  requireRuns(plans, buffers);
  for (int r = 0; r < nranks; ++r)
    for (uint64_t i = 0; i < count; ++i) REQUIRE(out[r][i] == in[0][i] + in[1][i] + in[2][i]);
  CHECK(got == in[0]);
}

}  // namespace
}  // namespace shoal::testing
