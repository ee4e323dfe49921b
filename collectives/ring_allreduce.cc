// Ring AllReduce: reduce-scatter then all-gather around the ring, pipelined.
//
// Vocabulary (see ring_phases.h for round, chunk, step, time):
//   channel  a contiguous part of the buffer with its own lanes.
//   segment  params.segmentBytes: the largest chunk; a round is p chunks, so it
//            covers at most p segments.
// Phases, per channel: each round goes through p-1 reduce-scatter steps (position
// i ends owning chunk i reduced; integer avg divides it there), then p-1
// all-gather steps that circulate the owned chunks. Rounds overlap (two in
// flight); scratch holds a few chunks per channel, not the buffer.
// In place (send == recv) is safe: the local contribution of a chunk is read
// before the all-gather overwrites it, and the emitter orders those accesses.
#include "collectives/builders.h"
#include "collectives/ring_phases.h"

namespace shoal {

using namespace build;

Plan buildRingAllReduce(const CollShape& shape, const RankView& view, const AlgoParams& params) {
  StepEmitter e(shape, view, "ring");
  const patterns::RingOrder ring(view);
  const int p = ring.size();
  const uint64_t elemSize = e.elemSize();
  const uint64_t granule = patterns::lineGranule(elemSize);
  const uint64_t segment = segmentElems(params, elemSize, granule);

  for (const ChannelPart& part : channelParts(shape.count, params, granule)) {
    const uint64_t nrounds = patterns::pieceCount(part.elems.count, segment * p);
    std::vector<RingRound> rounds;
    for (uint64_t r = 0; r < nrounds; ++r) {
      const patterns::ElemRange round = patterns::evenPart(part.elems.count, nrounds, r, granule);
      RingRound chunks;
      for (const patterns::ElemRange& c : patterns::evenParts(round.count, p, granule)) {
        const uint64_t offset = (part.elems.begin + round.begin + c.begin) * elemSize;
        chunks.push_back(RingChunk{sendAt(offset), recvAt(offset), c.count * elemSize});
      }
      rounds.push_back(std::move(chunks));
    }
    emitRingChannel(e, ring, part.channel, rounds, RingPhases::kAllReduce, ReduceSpec::of(shape));
  }
  return e.finish();
}

}  // namespace shoal
