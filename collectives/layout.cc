#include "collectives/layout.h"

#include "core/status.h"

namespace shoal {

OpLayout opLayout(const CollShape& shape, int rank, int nranks) {
  const uint64_t bytes = shape.count * dataTypeSize(shape.dtype);  // per NCCL's count
  const uint64_t all = bytes * static_cast<uint64_t>(nranks);
  const bool isRoot = rank == shape.root;
  OpLayout l;
  auto sizes = [&](uint64_t send, uint64_t recv, uint64_t outputEnd) {
    l.sendBytes = send;
    l.recvBytes = recv;
    l.outputEnd = outputEnd;  // outputBegin is 0 for every collective
  };
  switch (shape.kind) {
    case CollKind::kAllReduce: sizes(bytes, bytes, bytes); break;
    case CollKind::kBroadcast: sizes(isRoot ? bytes : 0, bytes, bytes); break;
    case CollKind::kReduce: sizes(bytes, isRoot ? bytes : 0, isRoot ? bytes : 0); break;
    case CollKind::kReduceScatter: sizes(all, bytes, bytes); break;
    case CollKind::kAllGather: sizes(bytes, all, all); break;
    case CollKind::kAllToAll: sizes(all, all, all); break;
    case CollKind::kGather: sizes(bytes, isRoot ? all : 0, isRoot ? all : 0); break;
    case CollKind::kScatter: sizes(isRoot ? all : 0, bytes, bytes); break;
    case CollKind::kSend: sizes(bytes, 0, 0); break;
    case CollKind::kRecv: sizes(0, bytes, bytes); break;
  }
  l.mayAlias = inPlaceOffset(shape, rank, l.inPlaceDelta);
  return l;
}

}  // namespace shoal
