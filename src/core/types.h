// Vocabulary types shared by every layer: data types, reduction operators and
// collective kinds, with the same numeric values as NCCL's enums so that the
// API layer converts by range check alone.
#pragma once

#include <cstddef>
#include <cstdint>

namespace shoal {

enum class DataType : int {
  kInt8 = 0,
  kUint8 = 1,
  kInt32 = 2,
  kUint32 = 3,
  kInt64 = 4,
  kUint64 = 5,
  kFloat16 = 6,
  kFloat32 = 7,
  kFloat64 = 8,
  kBfloat16 = 9,
  kFloat8e4m3 = 10,
  kFloat8e5m2 = 11,
};
inline constexpr int kNumDataTypes = 12;

constexpr size_t dataTypeSize(DataType t) {
  switch (t) {
    case DataType::kInt8:
    case DataType::kUint8:
    case DataType::kFloat8e4m3:
    case DataType::kFloat8e5m2: return 1;
    case DataType::kFloat16:
    case DataType::kBfloat16: return 2;
    case DataType::kInt32:
    case DataType::kUint32:
    case DataType::kFloat32: return 4;
    case DataType::kInt64:
    case DataType::kUint64:
    case DataType::kFloat64: return 8;
  }
  return 0;
}

constexpr bool isFloating(DataType t) {
  return t == DataType::kFloat16 || t == DataType::kFloat32 || t == DataType::kFloat64 ||
         t == DataType::kBfloat16 || t == DataType::kFloat8e4m3 || t == DataType::kFloat8e5m2;
}

// nccl-tests' names: int8 uint8 int32 uint32 int64 uint64 half float double bfloat16 f8e4m3 f8e5m2.
const char* dataTypeName(DataType t);

// The element-wise operators the reducer implements. NCCL's ncclAvg becomes
// kPreMulSum (floating types, scalar 1/n) or kSum plus a post-division
// (integers); ncclRedOpCreatePreMulSum ops become kPreMulSum.
enum class ReduceOp : uint8_t {
  kSum = 0,
  kProd = 1,
  kMax = 2,
  kMin = 3,
  kPreMulSum = 4,  // local * scalar + other
};
const char* reduceOpName(ReduceOp op);

enum class CollKind : uint8_t {
  kAllReduce,
  kAllGather,
  kReduceScatter,
  kBroadcast,
  kReduce,
  kAllToAll,
  kGather,
  kScatter,
  kSend,
  kRecv,
};
inline constexpr int kNumCollKinds = 10;
const char* collKindName(CollKind kind);

// How two ranks are connected, fastest first: in one process, through memory
// on one host, or over a network. Each transport says which class it is
// (Transport::linkClass); the tuner keeps one set of link costs per class
// (tuner/cost_model.h).
enum class LinkClass { kLoopback = 0, kShm = 1, kNet = 2 };
inline constexpr int kLinkClassCount = 3;

}  // namespace shoal
