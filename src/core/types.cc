#include "core/types.h"

namespace shoal {

const char* dataTypeName(DataType t) {
  static const char* const kNames[kNumDataTypes] = {
      "int8", "uint8", "int32", "uint32", "int64", "uint64",
      "half", "float", "double", "bfloat16", "f8e4m3", "f8e5m2"};
  int i = static_cast<int>(t);
  return (i >= 0 && i < kNumDataTypes) ? kNames[i] : "invalid";
}

const char* reduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kProd: return "prod";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kPreMulSum: return "premulsum";
  }
  return "invalid";
}

const char* collKindName(CollKind kind) {
  switch (kind) {
    case CollKind::kAllReduce: return "AllReduce";
    case CollKind::kAllGather: return "AllGather";
    case CollKind::kReduceScatter: return "ReduceScatter";
    case CollKind::kBroadcast: return "Broadcast";
    case CollKind::kReduce: return "Reduce";
    case CollKind::kAllToAll: return "AlltoAll";
    case CollKind::kGather: return "Gather";
    case CollKind::kScatter: return "Scatter";
    case CollKind::kSend: return "Send";
    case CollKind::kRecv: return "Recv";
  }
  return "invalid";
}

}  // namespace shoal
