// Buffer layout of one collective on one rank (NCCL's; docs/nccl-compat.md,
// "In-place calls").
//
// Role: pure function shared by the builders (to order accesses that may alias
// when the call is in place), the verifier (bounds, aliasing, "every output byte
// written"), the simulator and the engine/communicator (buffer sizes).
//
// In-place calls: NCCL defines one offset between the two user pointers per
// collective; when it holds, send byte x is recv byte x + inPlaceDelta:
//   AllReduce, Broadcast, Reduce   sendbuff == recvbuff                    delta 0
//   ReduceScatter                  recvbuff == sendbuff + rank*recvcount   delta -rank*bytes
//   AllGather                      sendbuff == recvbuff + rank*sendcount   delta +rank*bytes
//   Gather (root)                  sendbuff == recvbuff + root*count       delta +root*bytes
//   Scatter (root)                 recvbuff == sendbuff + root*count       delta -root*bytes
//   AlltoAll, Send, Recv           never in place
#pragma once

#include <cstdint>

#include "collectives/plan.h"

namespace shoal {

struct OpLayout {
  uint64_t sendBytes = 0;    // bytes of sendbuff this rank may read (0: unused here)
  uint64_t recvBytes = 0;    // bytes of recvbuff this rank may write (0: unused here)
  bool mayAlias = false;     // an in-place call is defined on this rank
  int64_t inPlaceDelta = 0;  // when in place: send byte x is recv byte x + inPlaceDelta
  uint64_t outputBegin = 0;  // recv bytes the collective defines on this rank
  uint64_t outputEnd = 0;
};

OpLayout opLayout(const CollShape& shape, int rank, int nranks);

// The table above for one rank: whether an in-place call is defined here
// (OpLayout::mayAlias) and its offset (OpLayout::inPlaceDelta).
inline bool inPlaceOffset(const CollShape& shape, int rank, int64_t& delta) {
  const int64_t bytes = static_cast<int64_t>(shape.count * dataTypeSize(shape.dtype));
  delta = 0;
  switch (shape.kind) {
    case CollKind::kAllReduce:
    case CollKind::kBroadcast: return true;
    case CollKind::kReduce: return rank == shape.root;
    case CollKind::kReduceScatter: delta = -bytes * rank; return true;
    case CollKind::kAllGather: delta = bytes * rank; return true;
    case CollKind::kGather: delta = bytes * shape.root; return rank == shape.root;
    case CollKind::kScatter: delta = -bytes * shape.root; return rank == shape.root;
    default: return false;
  }
}

// Whether a call's buffers share memory on this rank (what
// CollShape::disjointBuffers denies): in place, or overlapping in any other
// way. Inline for the common collectives: every call asks.
inline bool buffersMayOverlap(const CollShape& shape, const void* sendbuff, const void* recvbuff, int rank,
                              int nranks) {
  if (sendbuff == nullptr || recvbuff == nullptr) return false;
  const uint64_t bytes = shape.count * dataTypeSize(shape.dtype);
  uint64_t sendBytes = bytes, recvBytes = bytes;
  switch (shape.kind) {
    case CollKind::kAllReduce: break;
    case CollKind::kReduceScatter: sendBytes *= static_cast<uint64_t>(nranks); break;
    case CollKind::kAllGather: recvBytes *= static_cast<uint64_t>(nranks); break;
    default: {
      const OpLayout l = opLayout(shape, rank, nranks);
      sendBytes = l.sendBytes;
      recvBytes = l.recvBytes;
    }
  }
  const auto a = reinterpret_cast<uintptr_t>(sendbuff), b = reinterpret_cast<uintptr_t>(recvbuff);
  return sendBytes > 0 && recvBytes > 0 && a < b + recvBytes && b < a + sendBytes;
}

}  // namespace shoal
