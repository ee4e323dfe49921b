// Send and Recv (point-to-point): one step on kP2pChannel.
//
// A Send is a Send step to shape.peer from sendbuff; a Recv is a Recv step from
// shape.peer into recvbuff. Zero bytes is a real, matched message (NCCL >=
// 2.12.10). Self (peer == rank) is a Send to self or a Recv from self: the
// communicator groups the two, so the merged plan holds both ends of the lane.
// The k-th Send to P matches P's k-th Recv from us (merged plans keep op order).
#include "collectives/builders.h"
#include "collectives/builder_util.h"
#include "core/status.h"

namespace shoal {

using namespace build;

Plan buildSendRecv(const CollShape& shape, const RankView& view, const AlgoParams& params) {
  StepEmitter e(shape, view, "p2p");
  const uint64_t bytes = shape.count * e.elemSize();
  SHOAL_CHECK(shape.peer >= 0 && shape.peer < view.nranks, "p2p peer ", shape.peer);
  if (shape.kind == CollKind::kSend) {
    e.send(shape.peer, kP2pChannel, sendAt(0), bytes);
  } else {
    SHOAL_CHECK(shape.kind == CollKind::kRecv, "buildSendRecv for ", collKindName(shape.kind));
    e.recv(shape.peer, kP2pChannel, recvAt(0), bytes);
  }
  return e.finish();
}

}  // namespace shoal
