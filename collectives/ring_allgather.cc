// Ring AllGather: the all-gather phase of the ring AllReduce.
//
// Vocabulary (see ring_phases.h for round, chunk, step, time):
//   block    sendcount elements: rank q's input lands in block q of every output.
//   channel  the same contiguous part of every block, with its own lanes.
//   segment  params.segmentBytes: the largest chunk.
//   round    one segment-sized piece of that part in every block; chunk j of a
//            round is the piece of block ring[j]. Each rank copies its own chunk
//            into its output and sends it from its input at step 0.
// In place (sendbuff == recvbuff + rank*sendcount) the own copy is a no-op and
// nothing else writes the own block.
#include "collectives/builders.h"
#include "collectives/ring_phases.h"

namespace shoal {

using namespace build;

Plan buildRingAllGather(const CollShape& shape, const RankView& view, const AlgoParams& params) {
  StepEmitter e(shape, view, "ring");
  const patterns::RingOrder ring(view);
  const uint64_t granule = patterns::lineGranule(e.elemSize());
  const uint64_t segment = segmentElems(params, e.elemSize(), granule);
  for (const ChannelPart& part : channelParts(shape.count, params, granule)) {
    emitRingChannel(e, ring, part.channel, blockRounds(shape, ring, part, segment, false),
                    RingPhases::kAllGather, ReduceSpec{});
  }
  return e.finish();
}

}  // namespace shoal
