// Ring ReduceScatter: the reduce-scatter phase of the ring AllReduce.
//
// Vocabulary (see ring_phases.h for round, chunk, step, time):
//   block    recvcount elements: rank q's result is block q of the sum of sends.
//   channel  the same contiguous part of every block, with its own lanes.
//   segment  params.segmentBytes: the largest chunk.
//   round    one segment-sized piece of that part, taken from every block; chunk
//            j of a round is the piece of block ring[j], so ring position j ends
//            with its own block reduced (divided there for integer avg).
// In place (recvbuff == sendbuff + rank*recvcount): the own block's local
// contribution is read by the same step that writes the result over it.
#include "collectives/builders.h"
#include "collectives/ring_phases.h"

namespace shoal {

using namespace build;

Plan buildRingReduceScatter(const CollShape& shape, const RankView& view,
                            const AlgoParams& params) {
  StepEmitter e(shape, view, "ring");
  const patterns::RingOrder ring(view);
  const int p = ring.size();
  const uint64_t elemSize = e.elemSize();
  const uint64_t granule = patterns::lineGranule(elemSize);
  const uint64_t segment = segmentElems(params, elemSize, granule);
  const uint64_t blockBytes = shape.count * elemSize;

  for (const ChannelPart& part : channelParts(shape.count, params, granule)) {
    std::vector<RingRound> rounds;
    for (const patterns::ElemRange& round : patterns::segments(part.elems.count, segment, granule)) {
      const uint64_t inBlock = (part.elems.begin + round.begin) * elemSize;
      RingRound chunks;
      for (int j = 0; j < p; ++j) {
        chunks.push_back(RingChunk{sendAt(ring.rankAt(j) * blockBytes + inBlock), recvAt(inBlock),
                                   round.count * elemSize});
      }
      rounds.push_back(std::move(chunks));
    }
    emitRingChannel(e, ring, part.channel, rounds, RingPhases::kReduceScatter,
                    ReduceSpec::of(shape));
  }
  return e.finish();
}

}  // namespace shoal
