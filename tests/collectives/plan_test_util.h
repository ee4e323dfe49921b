// Helpers for the collectives tests: build every rank's plan, make test data,
// run the reference simulator with in-place or out-of-place buffers and compute
// the expected result of each collective.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "collectives/builders.h"
#include "collectives/layout.h"
#include "collectives/plan.h"
#include "collectives/plan_verify.h"
#include "collectives/registry.h"
#include "support/number_formats.h"

namespace shoal::testing {

using BuildFn = Plan (*)(const CollShape&, const RankView&, const AlgoParams&);

inline RankView viewOf(int rank, int nranks, const std::vector<int>& ring = {},
                       const std::vector<int>& nodeOf = {}) {
  RankView v;
  v.rank = rank;
  v.nranks = nranks;
  v.ring = ring;
  v.nodeOf = nodeOf;
  return v;
}

inline std::vector<PlanPtr> buildAll(BuildFn build, const CollShape& shape, int nranks,
                                     const AlgoParams& params, const std::vector<int>& ring = {},
                                     const std::vector<int>& nodeOf = {}) {
  std::vector<PlanPtr> plans;
  for (int r = 0; r < nranks; ++r)
    plans.push_back(std::make_shared<Plan>(build(shape, viewOf(r, nranks, ring, nodeOf), params)));
  return plans;
}

// Exactly representable small values, stored as dtype by the formats'
// definitions (never the library's conversions).
inline void storeValue(DataType t, void* base, size_t i, double v) {
  encodeExact(t, v, static_cast<char*>(base) + i * dataTypeSize(t));
}

inline bool isSigned(DataType t) {
  return t != DataType::kUint8 && t != DataType::kUint32 && t != DataType::kUint64;
}

// Input value of element i of rank r for a reduction with op.
inline double inputValue(DataType t, ReduceOp op, int r, uint64_t i) {
  if (op == ReduceOp::kProd) {
    const uint64_t k = (r + i) % 4;  // 1, 2, -1 (1 unsigned), 1
    return k == 1 ? 2.0 : (k == 2 && isSigned(t)) ? -1.0 : 1.0;
  }
  double v = static_cast<double>((r * 7 + i * 3) % 11);
  return isSigned(t) ? v - 5 : v;
}

// A memory arena per rank and op: send and recv pointers at NCCL's offsets.
struct OpMemory {
  std::vector<uint8_t> sendStore, recvStore, shared;
  void* send = nullptr;
  void* recv = nullptr;
  uint64_t scalarStore = 0;
};

inline constexpr uint8_t kSentinel = 0xEE;

// in place: one allocation holding both at the collective's in-place offset.
inline void allocate(OpMemory& m, const CollShape& shape, int rank, int nranks, bool inPlace) {
  const OpLayout l = opLayout(shape, rank, nranks);
  const uint64_t all = shape.count * dataTypeSize(shape.dtype) * nranks;
  if (inPlace && l.mayAlias) {
    // Address space: recv at 0, send at inPlaceDelta; allocate the union.
    int64_t lo = std::min<int64_t>(0, l.inPlaceDelta);
    int64_t hi = std::max<int64_t>(static_cast<int64_t>(l.recvBytes),
                                   l.inPlaceDelta + static_cast<int64_t>(l.sendBytes));
    hi = std::max<int64_t>(hi, static_cast<int64_t>(all));  // room like nccl-tests
    m.shared.assign(static_cast<size_t>(hi - lo) + 1, kSentinel);
    m.recv = m.shared.data() - lo;
    m.send = m.shared.data() - lo + l.inPlaceDelta;
  } else {
    m.sendStore.assign(l.sendBytes + 1, kSentinel);
    m.recvStore.assign(l.recvBytes + 1, kSentinel);
    m.send = m.sendStore.data();
    m.recv = m.recvStore.data();
  }
}

}  // namespace shoal::testing
