// Recursive doubling AllReduce: the latency algorithm for small buffers.
//
// Vocabulary:
//   participant  a ring position (patterns::RecursiveDoubling numbers them).
//   fold         with p not a power of two, the first 2*rem participants pair up:
//                the even one sends its contribution to the odd one and later
//                receives the result from it.
//   round        k = 0..log2(pof2)-1: exchange the whole partial result with the
//                virtual partner v ^ 2^k and combine.
//   channel      a contiguous part of the buffer with its own lanes.
// Bit-exactness: every round combines as (lower-virtual partial, higher-virtual
// partial), the same operand order on both partners, so all ranks hold identical
// bytes after every round, whatever the reducer's rounding. kPreMulSum: the
// local contribution enters scaled once, in the first step; rounds add partial
// results unscaled. Integer avg divides once, before the unfold.
// Scratch: two buffer-sized slots per channel (alternating rounds).
#include "collectives/builders.h"
#include "collectives/builder_util.h"
#include "collectives/patterns/recursive_doubling.h"
#include "collectives/patterns/ring.h"

namespace shoal {

using namespace build;

Plan buildRecursiveDoublingAllReduce(const CollShape& shape, const RankView& view,
                                     const AlgoParams& params) {
  StepEmitter e(shape, view, "recursive_doubling");
  const patterns::RingOrder ring(view);
  const patterns::RecursiveDoubling rd(ring.size());
  const int me = ring.position();
  const ReduceSpec spec = ReduceSpec::of(shape);
  const uint64_t elemSize = e.elemSize();
  const uint64_t granule = patterns::lineGranule(elemSize);

  for (const ChannelPart& part : channelParts(shape.count, params, granule)) {
    const uint64_t bytes = part.elems.count * elemSize;
    const Slice local = sendAt(part.elems.begin * elemSize);
    const Slice result = recvAt(part.elems.begin * elemSize);
    const uint16_t ch = part.channel;
    if (rd.size() == 1) {
      e.finishLocal(result, local, bytes, spec);
      continue;
    }
    const uint64_t area = e.reserveScratch(2 * alignUp(bytes, 64));
    const Slice slot[2] = {scratchAt(area), scratchAt(area + alignUp(bytes, 64))};

    // Fold: the even member of a pair hands its contribution over and waits.
    if (rd.foldedOut(me)) {
      const int partner = ring.rankAt(me + 1);
      Slice contribution = local;
      if (spec.scaleLocal) {
        e.copy(slot[0], local, bytes, kScaleSrc);
        contribution = slot[0];
      }
      e.send(partner, ch, contribution, bytes);
      e.recv(partner, ch, result, bytes);
      continue;
    }
    // `partial`: where this rank's partial result is. Unscaled and unfolded,
    // that is the send buffer itself: the first round sends from it and
    // combines into the result (no copy step ahead of the first send).
    Slice partial = result;
    if (rd.foldsIn(me)) {
      e.recv(ring.rankAt(me - 1), ch, slot[1], bytes);
      e.reduce(result, local, slot[1], bytes, spec.localFlags());
    } else if (spec.scaleLocal) {
      e.copy(result, local, bytes, spec.localFlags());
    } else {
      partial = local;
    }

    // Rounds: exchange partial results with the partner, combine in canonical order.
    const int v = rd.virtualOf(me);
    for (int k = 0; k < rd.rounds(); ++k) {
      const int partnerV = rd.partner(v, k);
      const int partner = ring.rankAt(rd.participantOf(partnerV));
      const Slice theirs = slot[k % 2];
      e.send(partner, ch, partial, bytes);
      e.recv(partner, ch, theirs, bytes);
      if (partnerV < v) {
        e.reduce(result, theirs, partial, bytes);
      } else {
        e.reduce(result, partial, theirs, bytes);
      }
      partial = result;
    }
    if (spec.divisor > 1) e.divide(result, result, bytes);

    // Unfold: return the result to the folded-out partner.
    if (rd.foldsIn(me)) e.send(ring.rankAt(me - 1), ch, result, bytes);
  }
  return e.finish();
}

}  // namespace shoal
