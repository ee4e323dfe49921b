#include "collectives/layout.h"

#include "core/status.h"

namespace shoal {

OpLayout opLayout(const CollShape& shape, int rank, int nranks) {
  const uint64_t bytes = shape.count * dataTypeSize(shape.dtype);  // per NCCL's count
  const uint64_t all = bytes * static_cast<uint64_t>(nranks);
  const bool isRoot = rank == shape.root;
  OpLayout l;
  switch (shape.kind) {
    case CollKind::kAllReduce:
      l = {bytes, bytes, true, 0, 0, bytes};
      break;
    case CollKind::kBroadcast:
      l = {isRoot ? bytes : 0, bytes, true, 0, 0, bytes};
      break;
    case CollKind::kReduce:
      l = {bytes, isRoot ? bytes : 0, isRoot, 0, 0, isRoot ? bytes : 0};
      break;
    case CollKind::kReduceScatter:
      l = {all, bytes, true, -static_cast<int64_t>(bytes) * rank, 0, bytes};
      break;
    case CollKind::kAllGather:
      l = {bytes, all, true, static_cast<int64_t>(bytes) * rank, 0, all};
      break;
    case CollKind::kAllToAll:
      l = {all, all, false, 0, 0, all};
      break;
    case CollKind::kGather:
      l = {bytes, isRoot ? all : 0, isRoot, static_cast<int64_t>(bytes) * shape.root, 0,
           isRoot ? all : 0};
      break;
    case CollKind::kScatter:
      l = {isRoot ? all : 0, bytes, isRoot, -static_cast<int64_t>(bytes) * shape.root, 0, bytes};
      break;
    case CollKind::kSend:
      l = {bytes, 0, false, 0, 0, 0};
      break;
    case CollKind::kRecv:
      l = {0, bytes, false, 0, 0, bytes};
      break;
  }
  return l;
}

bool isInPlaceCall(const CollShape& shape, const void* sendbuff, const void* recvbuff, int rank, int nranks) {
  if (sendbuff == nullptr || recvbuff == nullptr) return false;
  const OpLayout l = opLayout(shape, rank, nranks);
  return l.mayAlias &&
         reinterpret_cast<uintptr_t>(sendbuff) == reinterpret_cast<uintptr_t>(recvbuff) + static_cast<uint64_t>(l.inPlaceDelta);
}

}  // namespace shoal
