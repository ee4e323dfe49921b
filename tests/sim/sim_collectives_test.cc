// Every collective x data type x operator x rank count, in place and out of
// place, run for real by the engine over the loopback transport in one process
// (SimWorld), with seeded reordering; results checked element by element.
//
// The oracle is independent of the library: inputs are small integers, so that
// every partial result is exact in every type whatever the reduction order (as
// nccl-tests does), and the expected value is a closed form of rank and index
// computed here in double, stored by the formats' definitions
// (tests/support/number_formats.h) and compared bit for bit; neither the
// library's conversions nor its reducer is used.
// ncclAvg on floating types pre-multiplies by s = 1/n rounded to the type: as
// in nccl-tests only ranks 0 and 1 contribute non-zero values, so the result
// is round(round(x0 s) + round(x1 s)) in any order, computed here by the
// formats' rounding.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "core/params.h"
#include "support/number_formats.h"
#include "support/scoped_env.h"
#include "support/sim_world.h"
#include "transports/loopback/loopback_transport.h"

using namespace shoal;
using shoal::testing::SimWorld;
using shoal::testing::decodeValue;
using shoal::testing::encodeExact;
using shoal::testing::roundTo;

namespace {

struct Case {
  CollKind kind;
  DataType dtype;
  ReduceOp op;
  bool avg = false;
  size_t count;
  int root = 0;
  bool inPlace = false;
  bool mixedPlacement = false;  // odd ranks call the other way (in or out of place)
};

bool rankInPlace(const Case& c, int rank) { return c.inPlace != (c.mixedPlacement && rank % 2 == 1); }

// Small values exactly representable in every type, including fp8 e5m2 sums.
double inputValue(const Case& c, int rank, size_t index) {
  if (c.avg && isFloating(c.dtype)) return rank < 2 ? static_cast<double>(1 + (rank + index) % 3) : 0.0;
  if (c.dtype == DataType::kFloat8e5m2) return static_cast<double>((rank + index) % 2);
  if (c.op == ReduceOp::kProd) return static_cast<double>(1 + (rank + index) % 2);
  return static_cast<double>((rank * 3 + index * 7) % 4);
}

double combine(ReduceOp op, double a, double b) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kPreMulSum: return a + b;
    case ReduceOp::kProd: return a * b;
    case ReduceOp::kMax: return a > b ? a : b;
    case ReduceOp::kMin: return a < b ? a : b;
  }
  return 0;
}

struct Buffers {
  std::vector<std::vector<uint8_t>> storage;  // per rank
  std::vector<const void*> send;
  std::vector<void*> recv;
};

size_t sendElems(const Case& c, int n) {
  switch (c.kind) {
    case CollKind::kReduceScatter:
    case CollKind::kAllToAll:
    case CollKind::kScatter: return c.count * n;
    default: return c.count;
  }
}

size_t recvElems(const Case& c, int n) {
  switch (c.kind) {
    case CollKind::kAllGather:
    case CollKind::kAllToAll:
    case CollKind::kGather: return c.count * n;
    default: return c.count;
  }
}

// In-place offsets (elements) of the send buffer inside the recv buffer, or of
// the recv buffer inside the send buffer (docs/nccl-compat.md, "In-place calls").
void placeBuffers(const Case& c, int n, int rank, uint8_t* base, size_t elem, Buffers& b) {
  size_t s = sendElems(c, n), r = recvElems(c, n);
  if (!rankInPlace(c, rank)) {
    b.send[rank] = base;
    b.recv[rank] = base + s * elem + 64;
    return;
  }
  switch (c.kind) {
    case CollKind::kAllGather:  // send = recv + rank*count
      b.recv[rank] = base;
      b.send[rank] = base + rank * c.count * elem;
      break;
    case CollKind::kReduceScatter:  // recv = send + rank*count
      b.send[rank] = base;
      b.recv[rank] = base + rank * c.count * elem;
      break;
    case CollKind::kGather:
      b.recv[rank] = base;
      b.send[rank] = base + c.root * c.count * elem;
      break;
    case CollKind::kScatter:
      b.send[rank] = base;
      b.recv[rank] = base + c.root * c.count * elem;
      break;
    default:
      b.send[rank] = base;
      b.recv[rank] = base;
      break;
  }
  (void)r;
}

void runCase(SimWorld& world, const Case& c) {
  int n = world.size();
  size_t elem = dataTypeSize(c.dtype);
  size_t s = sendElems(c, n), r = recvElems(c, n);
  // ncclAvg's scalar on floating types: NCCL forms float(1.0/n) (double: 1.0/n)
  // and converts it to the type (docs/nccl-compat.md, "Numerics").
  const double avgScalar = !isFloating(c.dtype)           ? 0.0
                           : c.dtype == DataType::kFloat64 ? 1.0 / n
                                                            : roundTo(c.dtype, static_cast<float>(1.0 / n));
  Buffers b;
  b.storage.resize(n);
  b.send.resize(n);
  b.recv.resize(n);
  std::vector<OpRequest> ops(n);
  for (int rank = 0; rank < n; ++rank) {
    b.storage[rank].assign((s + r) * elem + 128, 0xAB);
    placeBuffers(c, n, rank, b.storage[rank].data(), elem, b);
    for (size_t i = 0; i < s; ++i)
      encodeExact(c.dtype, inputValue(c, rank, i),
                  static_cast<uint8_t*>(const_cast<void*>(b.send[rank])) + i * elem);
    OpRequest& op = ops[rank];
    op.shape.kind = c.kind;
    op.shape.dtype = c.dtype;
    op.shape.op = c.op;
    op.shape.count = c.count;
    op.shape.root = c.root;
    op.sendbuff = b.send[rank];
    op.recvbuff = b.recv[rank];
    if (c.avg && isFloating(c.dtype)) {
      op.shape.op = ReduceOp::kPreMulSum;
      encodeExact(c.dtype, avgScalar, op.scalar.bytes.data());
    } else if (c.avg) {
      op.shape.op = ReduceOp::kSum;
      op.shape.divisor = n > 1 ? n : 0;
    } else if (c.op == ReduceOp::kPreMulSum) {
      encodeExact(c.dtype, 2.0, op.scalar.bytes.data());
    }
  }
  // Expected values computed before the run (in-place runs overwrite inputs).
  auto in = [&](int rank, size_t i) { return inputValue(c, rank, i); };
  auto reduced = [&](size_t i) {
    if (c.avg && isFloating(c.dtype)) {  // two non-zero terms: one rounding of their sum
      double acc = 0;
      for (int rank = 0; rank < n; ++rank) acc += roundTo(c.dtype, in(rank, i) * avgScalar);
      return roundTo(c.dtype, acc);
    }
    double scale = c.op == ReduceOp::kPreMulSum ? 2.0 : 1.0;
    double acc = in(0, i) * scale;
    for (int rank = 1; rank < n; ++rank) acc = combine(c.op, acc, in(rank, i) * scale);
    if (c.avg) acc = std::trunc(acc / n);  // integers: sum, then divide toward zero
    return acc;
  };
  std::vector<std::vector<double>> expected(n);
  for (int rank = 0; rank < n; ++rank) {
    auto& e = expected[rank];
    switch (c.kind) {
      case CollKind::kAllReduce:
        for (size_t i = 0; i < c.count; ++i) e.push_back(reduced(i));
        break;
      case CollKind::kReduce:
        if (rank == c.root)
          for (size_t i = 0; i < c.count; ++i) e.push_back(reduced(i));
        break;
      case CollKind::kReduceScatter:
        for (size_t i = 0; i < c.count; ++i) e.push_back(reduced(rank * c.count + i));
        break;
      case CollKind::kAllGather:
        for (int src = 0; src < n; ++src)
          for (size_t i = 0; i < c.count; ++i) e.push_back(in(src, i));
        break;
      case CollKind::kBroadcast:
        for (size_t i = 0; i < c.count; ++i) e.push_back(in(c.root, i));
        break;
      case CollKind::kAllToAll:
        for (int src = 0; src < n; ++src)
          for (size_t i = 0; i < c.count; ++i) e.push_back(in(src, rank * c.count + i));
        break;
      case CollKind::kGather:
        if (rank == c.root)
          for (int src = 0; src < n; ++src)
            for (size_t i = 0; i < c.count; ++i) e.push_back(in(src, i));
        break;
      case CollKind::kScatter:
        for (size_t i = 0; i < c.count; ++i) e.push_back(in(c.root, rank * c.count + i));
        break;
      default:
        break;
    }
  }
  auto results = world.runOne(std::move(ops));
  for (int rank = 0; rank < n; ++rank) {
    INFO("rank " << rank << " of " << n << ": " << results[rank].toString());
    REQUIRE(results[rank].isOk());
  }
  for (int rank = 0; rank < n; ++rank) {
    const uint8_t* out = static_cast<const uint8_t*>(b.recv[rank]);
    for (size_t i = 0; i < expected[rank].size(); ++i) {
      uint8_t want[16];
      encodeExact(c.dtype, expected[rank][i], want);
      if (std::memcmp(want, out + i * elem, elem) == 0) continue;
      FAIL(collKindName(c.kind) << " " << dataTypeName(c.dtype) << " " << reduceOpName(c.op)
                                << (c.avg ? " (avg)" : "") << " count " << c.count << " n " << n
                                << (rankInPlace(c, rank) ? " in-place" : "") << " rank " << rank
                                << " element " << i << ": got " << decodeValue(c.dtype, out + i * elem)
                                << ", want " << expected[rank][i]);
    }
  }
}

const std::vector<DataType> kAllTypes = {
    DataType::kInt8,    DataType::kUint8,    DataType::kInt32,      DataType::kUint32,
    DataType::kInt64,   DataType::kUint64,   DataType::kFloat16,    DataType::kFloat32,
    DataType::kFloat64, DataType::kBfloat16, DataType::kFloat8e4m3, DataType::kFloat8e5m2};

}  // namespace

TEST_CASE("every reducing collective / type and operator matches the reference", "[sim]") {
  setLoopbackFaults(LoopbackFaults{.reorderSeed = 7});
  for (int n : {1, 2, 3, 4}) {
    SimWorld world(n);
    for (CollKind kind : {CollKind::kAllReduce, CollKind::kReduceScatter, CollKind::kReduce}) {
      for (DataType dtype : kAllTypes) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMax, ReduceOp::kMin,
                            ReduceOp::kPreMulSum}) {
          for (bool inPlace : {false, true}) {
            Case c{kind, dtype, op, false, 37, n - 1, inPlace};
            runCase(world, c);
          }
        }
        Case avg{kind, dtype, ReduceOp::kSum, true, 29, 0, false};
        runCase(world, avg);
      }
    }
  }
  setLoopbackFaults(LoopbackFaults{});
}

TEST_CASE("data-movement collectives match the reference", "[sim]") {
  setLoopbackFaults(LoopbackFaults{.reorderSeed = 11});
  for (int n : {1, 2, 3, 5}) {
    SimWorld world(n);
    for (CollKind kind : {CollKind::kAllGather, CollKind::kBroadcast, CollKind::kAllToAll,
                          CollKind::kGather, CollKind::kScatter}) {
      for (DataType dtype : {DataType::kInt8, DataType::kFloat16, DataType::kFloat32,
                             DataType::kUint64}) {
        for (size_t count : {size_t{1}, size_t{33}, size_t{1000}}) {
          for (bool inPlace : {false, true}) {
            if (kind == CollKind::kAllToAll && inPlace) continue;  // not supported by NCCL
            Case c{kind, dtype, ReduceOp::kSum, false, count, n / 2, inPlace};
            runCase(world, c);
          }
        }
      }
    }
  }
  setLoopbackFaults(LoopbackFaults{});
}

TEST_CASE("large pipelined operations cross segment and channel boundaries", "[sim]") {
  for (int n : {2, 3, 4}) {
    SimWorld world(n);
    for (CollKind kind : {CollKind::kAllReduce, CollKind::kAllGather, CollKind::kReduceScatter,
                          CollKind::kBroadcast, CollKind::kReduce}) {
      Case c{kind, DataType::kFloat32, ReduceOp::kSum, false, (3u << 20) / 4 + 13, 1, false};
      runCase(world, c);
      c.inPlace = true;
      runCase(world, c);
    }
  }
}

TEST_CASE("ring plans per placement: one shape called in and out of place, ranks differing", "[sim]") {
  // Out of place the ring's last step receives into the output (decision
  // 0014): each rank keeps a plan per placement, and the messages agree.
  {
    shoal::testing::ScopedEnv env{{"SHOAL_ALGO", "ring"}};
    reloadParams();
    for (int n : {2, 3}) {
      SimWorld world(n);
      for (int round = 0; round < 2; ++round) {
        for (CollKind kind : {CollKind::kReduceScatter, CollKind::kAllReduce}) {
          for (bool mixed : {false, true}) {
            for (bool inPlace : {false, true}) {
              Case c{kind, DataType::kFloat32, ReduceOp::kSum, false, 1000, 0, inPlace, mixed};
              runCase(world, c);
            }
          }
        }
      }
    }
  }
  reloadParams();
}

TEST_CASE("zero-count collectives succeed and touch nothing", "[sim]") {
  SimWorld world(3);
  const int n = world.size();
  for (CollKind kind : {CollKind::kAllReduce, CollKind::kAllGather, CollKind::kBroadcast,
                        CollKind::kReduce, CollKind::kReduceScatter, CollKind::kAllToAll,
                        CollKind::kGather, CollKind::kScatter}) {
    INFO(collKindName(kind));
    // Guard bytes all around both buffers: a zero-count call writes none.
    std::vector<std::vector<uint8_t>> send(n, std::vector<uint8_t>(256, 0xAB)),
        recv(n, std::vector<uint8_t>(256, 0xCD));
    std::vector<OpRequest> ops(n);
    for (int rank = 0; rank < n; ++rank) {
      ops[rank].shape.kind = kind;
      ops[rank].shape.dtype = DataType::kFloat32;
      ops[rank].shape.count = 0;
      ops[rank].shape.root = 1;
      ops[rank].sendbuff = send[rank].data() + 64;
      ops[rank].recvbuff = recv[rank].data() + 64;
    }
    auto results = world.runOne(std::move(ops));
    for (int rank = 0; rank < n; ++rank) {
      REQUIRE(results[rank].isOk());
      CHECK(std::all_of(send[rank].begin(), send[rank].end(), [](uint8_t b) { return b == 0xAB; }));
      CHECK(std::all_of(recv[rank].begin(), recv[rank].end(), [](uint8_t b) { return b == 0xCD; }));
    }
  }
}

TEST_CASE("send/recv ring and self exchange inside one group", "[sim]") {
  for (int n : {1, 2, 3, 4}) {
    SimWorld world(n);
    const size_t count = 1000;
    std::vector<std::vector<float>> send(n, std::vector<float>(count)),
        recv(n, std::vector<float>(count, -1)), selfOut(n, std::vector<float>(count, -1));
    std::vector<std::vector<OpRequest>> groups(n);
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < count; ++i) send[r][i] = static_cast<float>(r * 10000 + i);
      OpRequest s, rcv, selfS, selfR;
      s.shape = {CollKind::kSend, DataType::kFloat32, ReduceOp::kSum, count, -1, (r + 1) % n};
      s.sendbuff = send[r].data();
      rcv.shape = {CollKind::kRecv, DataType::kFloat32, ReduceOp::kSum, count, -1, (r + n - 1) % n};
      rcv.recvbuff = recv[r].data();
      selfS.shape = {CollKind::kSend, DataType::kFloat32, ReduceOp::kSum, count, -1, r};
      selfS.sendbuff = send[r].data();
      selfR.shape = {CollKind::kRecv, DataType::kFloat32, ReduceOp::kSum, count, -1, r};
      selfR.recvbuff = selfOut[r].data();
      groups[r] = {s, rcv, selfS, selfR};
    }
    auto results = world.run(std::move(groups));
    for (int r = 0; r < n; ++r) {
      REQUIRE(results[r].isOk());
      int from = (r + n - 1) % n;
      for (size_t i = 0; i < count; ++i) {
        REQUIRE(recv[r][i] == static_cast<float>(from * 10000 + i));
        REQUIRE(selfOut[r][i] == static_cast<float>(r * 10000 + i));
      }
    }
  }
}

TEST_CASE("a group of different collectives runs as one job", "[sim]") {
  SimWorld world(3);
  const size_t count = 100;
  std::vector<std::vector<int32_t>> a(3, std::vector<int32_t>(count)),
      ag(3, std::vector<int32_t>(count * 3));
  std::vector<std::vector<OpRequest>> groups(3);
  for (int r = 0; r < 3; ++r) {
    for (size_t i = 0; i < count; ++i) a[r][i] = static_cast<int32_t>(r + i);
    OpRequest ar, g;
    ar.shape = {CollKind::kAllReduce, DataType::kInt32, ReduceOp::kSum, count};
    ar.sendbuff = ar.recvbuff = a[r].data();
    g.shape = {CollKind::kAllGather, DataType::kInt32, ReduceOp::kSum, count};
    g.sendbuff = ag[r].data() + r * count;  // in place
    g.recvbuff = ag[r].data();
    for (size_t i = 0; i < count; ++i) ag[r][r * count + i] = static_cast<int32_t>(100 * r + i);
    groups[r] = {ar, g};
  }
  auto results = world.run(std::move(groups));
  for (int r = 0; r < 3; ++r) {
    REQUIRE(results[r].isOk());
    for (size_t i = 0; i < count; ++i) {
      REQUIRE(a[r][i] == static_cast<int32_t>(3 * i + 3));
      for (int src = 0; src < 3; ++src)
        REQUIRE(ag[r][src * count + i] == static_cast<int32_t>(100 * src + i));
    }
  }
}

TEST_CASE("ranks calling different collectives get a mismatch error / not garbage", "[sim]") {
  SimWorld world(2);
  std::vector<float> a(64, 1), b(128, 1);
  OpRequest ar, ag;
  ar.shape = {CollKind::kAllReduce, DataType::kFloat32, ReduceOp::kSum, 64};
  ar.sendbuff = ar.recvbuff = a.data();
  ag.shape = {CollKind::kAllGather, DataType::kFloat32, ReduceOp::kSum, 64};
  ag.sendbuff = b.data();
  ag.recvbuff = b.data();
  auto results = world.runOne({ar, ag});
  bool anyMismatch = false;
  for (auto& s : results)
    if (s.code() == Code::kInvalidUsage && s.message().find("mismatch") != std::string::npos)
      anyMismatch = true;
  REQUIRE(anyMismatch);
}
