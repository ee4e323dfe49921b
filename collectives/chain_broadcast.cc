// Chain Broadcast: a pipelined chain from the root along ring order.
//
// Vocabulary:
//   channel  a contiguous part of the buffer with its own lanes.
//   segment  at most params.segmentBytes of a channel part; the pipelining unit.
//   hop      the rank d hops after the root along the ring receives each segment
//            from the previous position and, unless it is last (d = p-1),
//            forwards it to the next position. Segments follow each other, so all
//            hops carry different segments at once.
// The root copies send to recv (a no-op in place) and sends from its send buffer;
// other ranks forward from their recv buffer and never touch send.
#include "collectives/builders.h"
#include "collectives/builder_util.h"
#include "collectives/patterns/ring.h"

namespace shoal {

using namespace build;

Plan buildChainBroadcast(const CollShape& shape, const RankView& view, const AlgoParams& params) {
  StepEmitter e(shape, view, "chain");
  const patterns::RingOrder ring(view);
  const int p = ring.size();
  const int hop = ring.distanceFrom(shape.root);
  const bool isRoot = hop == 0;
  const bool isLast = hop == p - 1;
  const uint64_t elemSize = e.elemSize();
  const uint64_t granule = patterns::lineGranule(elemSize);
  const uint64_t segment = segmentElems(params, elemSize, granule);

  for (const ChannelPart& part : channelParts(shape.count, params, granule)) {
    const uint64_t partOffset = part.elems.begin * elemSize;
    if (isRoot) e.copy(recvAt(partOffset), sendAt(partOffset), part.elems.count * elemSize);
    for (const patterns::ElemRange& seg : patterns::segments(part.elems.count, segment, granule)) {
      const uint64_t offset = partOffset + seg.begin * elemSize;
      const uint64_t bytes = seg.count * elemSize;
      if (isRoot) {
        if (p > 1) e.send(ring.next(), part.channel, sendAt(offset), bytes);
        continue;
      }
      e.recv(ring.prev(), part.channel, recvAt(offset), bytes);
      if (!isLast) e.send(ring.next(), part.channel, recvAt(offset), bytes);
    }
  }
  return e.finish();
}

}  // namespace shoal
