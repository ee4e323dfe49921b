// Chain Reduce: a pipelined chain along ring order that ends at the root.
//
// Vocabulary:
//   channel  a contiguous part of the buffer with its own lanes.
//   segment  at most params.segmentBytes of a channel part; the pipelining unit.
//   link     chain position c = 0..p-1: c = 0 is the root's ring successor, c =
//            p-1 is the root. Position 0 sends its contribution; each later
//            position receives a segment's partial sum into a scratch slot, adds
//            its own contribution and forwards it; the root adds its
//            contribution into recv (and divides, for integer avg).
// Only the root writes recv (non-root recvbuff may be NULL). kPreMulSum: every
// contribution enters scaled, once, where it enters. In place at the root
// (send == recv): each segment's local data is read by the step that writes it.
#include <algorithm>

#include "collectives/builders.h"
#include "collectives/builder_util.h"
#include "collectives/patterns/ring.h"

namespace shoal {

using namespace build;

Plan buildChainReduce(const CollShape& shape, const RankView& view, const AlgoParams& params) {
  StepEmitter e(shape, view, "chain");
  const patterns::RingOrder ring(view);
  const int p = ring.size();
  const int link = patterns::wrap(ring.distanceFrom(shape.root) - 1, p);
  const ReduceSpec spec = ReduceSpec::of(shape);
  const uint64_t elemSize = e.elemSize();
  const uint64_t granule = patterns::lineGranule(elemSize);
  const uint64_t segment = segmentElems(params, elemSize, granule);

  for (const ChannelPart& part : channelParts(shape.count, params, granule)) {
    const uint64_t partOffset = part.elems.begin * elemSize;
    if (p == 1) {
      e.finishLocal(recvAt(partOffset), sendAt(partOffset), part.elems.count * elemSize, spec);
      continue;
    }
    const auto segs = patterns::segments(part.elems.count, segment, granule);
    uint64_t slotElems = 0;
    for (const patterns::ElemRange& seg : segs) slotElems = std::max(slotElems, seg.count);
    SlotPool slots(e.scratchEnd(), slotElems * elemSize);
    for (int64_t g = 0; g < static_cast<int64_t>(segs.size()); ++g) {
      const uint64_t offset = partOffset + segs[g].begin * elemSize;
      const uint64_t bytes = segs[g].count * elemSize;
      const Slice local = sendAt(offset);
      if (link == 0) {  // chain start: the contribution alone
        if (spec.scaleLocal) {
          int slot = slots.acquire(g);
          e.copy(slots.slice(slot), local, bytes, kScaleSrc);
          e.send(ring.next(), part.channel, slots.slice(slot), bytes);
          slots.release(slot, g);
        } else {
          e.send(ring.next(), part.channel, local, bytes);
        }
        continue;
      }
      int slot = slots.acquire(g);
      e.recv(ring.prev(), part.channel, slots.slice(slot), bytes);
      if (link < p - 1) {  // middle: add the contribution and forward
        e.reduce(slots.slice(slot), local, slots.slice(slot), bytes, spec.localFlags());
        e.send(ring.next(), part.channel, slots.slice(slot), bytes);
      } else {  // root: the result
        e.reduce(recvAt(offset), local, slots.slice(slot), bytes, spec.localFlags());
        if (spec.divisor > 1) e.divide(recvAt(offset), recvAt(offset), bytes);
      }
      slots.release(slot, g);
    }
    e.reserveScratch(slots.bytesUsed());
  }
  return e.finish();
}

}  // namespace shoal
