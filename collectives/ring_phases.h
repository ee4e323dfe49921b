// Ring reduce-scatter and all-gather phases, shared by the ring AllReduce,
// ReduceScatter and AllGather builders.
//
// Vocabulary (one channel at a time):
//   round   a piece of the channel's data small enough that each rank's share of
//           it is at most one segment. Rounds flow through the ring one after
//           another and overlap: round r starts `roundLag` time units after round
//           r-1, so about kRoundsInFlight rounds are in flight at once.
//   chunk   a round's share owned by one ring position; chunks[j] of a round is
//           owned by ring position j. All ranks agree on every chunk's size.
//   step    one hop: every rank sends one chunk to the next position and
//           receives one chunk from the previous position. A round takes p-1
//           reduce-scatter steps and/or p-1 all-gather steps.
//   time    round r's step s happens at time r*roundLag + s on every rank; steps
//           are emitted in time order, so lanes are in the same order on both
//           ends and every dependency points to an earlier time.
//
// Reduce-scatter, step s at position i: send chunk i-s-1, receive chunk i-s-2 into
// a scratch slot and add the local contribution to it; after step p-2 position i
// holds the full reduction of its own chunk i in its output. (Step p-2 receives
// straight into the output where that cannot overlap the contribution in the
// send buffer: CollShape::disjointBuffers.) All-gather, step s:
// send chunk i-s, receive chunk i-s-1 into its output.
#pragma once

#include <vector>

#include "collectives/builder_util.h"
#include "collectives/patterns/ring.h"

namespace shoal::build {

struct RingChunk {
  Slice input;   // this rank's local data for the chunk (RS: contribution; AG: own data)
  Slice output;  // where the chunk's result lives on this rank
  uint64_t bytes = 0;
};
using RingRound = std::vector<RingChunk>;  // indexed by ring position

enum class RingPhases { kReduceScatter, kAllGather, kAllReduce };

// The rounds of one channel part of a ReduceScatter or AllGather whose block
// q (shape.count elements) belongs to rank q: chunk j of a round is the
// segment-sized piece of block ring[j]. ReduceScatter chunks read it from
// the send buffer and end in the recv buffer's single block; AllGather
// chunks the reverse.
std::vector<RingRound> blockRounds(const CollShape& shape, const patterns::RingOrder& ring,
                                   const ChannelPart& part, uint64_t segment, bool reduceScatter);

inline constexpr int kRoundsInFlight = 2;

// Emits one channel's rounds. RS: each rank ends with its own chunks reduced in
// their output. AG: each rank's own chunk input reaches every rank's output. AR:
// both, the all-gather starting from the reduced own chunk.
void emitRingChannel(StepEmitter& emitter, const patterns::RingOrder& ring, uint16_t channel,
                     const std::vector<RingRound>& rounds, RingPhases phases,
                     const ReduceSpec& spec);

}  // namespace shoal::build
