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
  const uint64_t granule = patterns::lineGranule(e.elemSize());
  const uint64_t segment = segmentElems(params, e.elemSize(), granule);
  for (const ChannelPart& part : channelParts(shape.count, params, granule)) {
    emitRingChannel(e, ring, part.channel, blockRounds(shape, ring, part, segment, true),
                    RingPhases::kReduceScatter, ReduceSpec::of(shape));
  }
  return e.finish();
}

}  // namespace shoal
