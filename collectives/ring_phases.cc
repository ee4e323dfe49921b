#include "collectives/ring_phases.h"

#include <algorithm>

#include "core/status.h"

namespace shoal::build {

std::vector<RingRound> blockRounds(const CollShape& shape, const patterns::RingOrder& ring,
                                   const ChannelPart& part, uint64_t segment, bool reduceScatter) {
  const uint64_t elemSize = dataTypeSize(shape.dtype);
  const uint64_t blockBytes = shape.count * elemSize;
  std::vector<RingRound> rounds;
  for (const patterns::ElemRange& round :
       patterns::segments(part.elems.count, segment, patterns::lineGranule(elemSize))) {
    const uint64_t inBlock = (part.elems.begin + round.begin) * elemSize;
    RingRound chunks;
    for (int j = 0; j < ring.size(); ++j) {
      const uint64_t ofBlock = ring.rankAt(j) * blockBytes + inBlock;
      chunks.push_back(reduceScatter
                           ? RingChunk{sendAt(ofBlock), recvAt(inBlock), round.count * elemSize}
                           : RingChunk{sendAt(inBlock), recvAt(ofBlock), round.count * elemSize});
    }
    rounds.push_back(std::move(chunks));
  }
  return rounds;
}

void emitRingChannel(StepEmitter& e, const patterns::RingOrder& ring, uint16_t channel,
                     const std::vector<RingRound>& rounds, RingPhases phases,
                     const ReduceSpec& spec) {
  const int p = ring.size();
  const int i = ring.position();
  const int64_t nrounds = static_cast<int64_t>(rounds.size());
  if (nrounds == 0) return;
  auto chunk = [&](int64_t r, int64_t position) -> const RingChunk& {
    return rounds[r][patterns::wrap(position, p)];
  };

  if (p == 1) {
    for (const RingRound& round : rounds) {
      const RingChunk& own = round[0];
      if (own.bytes == 0) continue;
      if (phases == RingPhases::kAllGather) {
        e.copy(own.output, own.input, own.bytes);
      } else {
        e.finishLocal(own.output, own.input, own.bytes, spec);
      }
    }
    return;
  }

  const bool reduceScatter = phases != RingPhases::kAllGather;
  const bool allGather = phases != RingPhases::kReduceScatter;
  const int64_t rsSteps = reduceScatter ? p - 1 : 0;
  const int64_t agSteps = allGather ? p - 1 : 0;
  const int64_t stepsPerRound = rsSteps + agSteps;
  const int64_t roundLag = std::max<int64_t>(1, (stepsPerRound + kRoundsInFlight - 1) /
                                                    kRoundsInFlight);
  const int64_t endTime = (nrounds - 1) * roundLag + stepsPerRound;

  uint64_t slotBytes = 0;
  for (const RingRound& round : rounds)
    for (const RingChunk& c : round) slotBytes = std::max(slotBytes, c.bytes);
  SlotPool slots(e.scratchEnd(), slotBytes);
  std::vector<int> partialSlot(nrounds, -1);  // RS: slot holding the chunk sent next step

  auto reduceScatterStep = [&](int64_t r, int64_t s, int64_t now) {
    // Send: the local contribution at step 0, else the partial reduced last step.
    const RingChunk& out = chunk(r, i - s - 1);
    if (out.bytes > 0) {
      if (s == 0 && !spec.scaleLocal) {
        e.send(ring.next(), channel, out.input, out.bytes);
      } else {
        int slot = partialSlot[r];
        if (s == 0) {  // kPreMulSum: the contribution enters scaled, exactly once
          slot = slots.acquire(now);
          e.copy(slots.slice(slot), out.input, out.bytes, kScaleSrc);
        }
        e.send(ring.next(), channel, slots.slice(slot), out.bytes);
        slots.release(slot, now);
      }
    }
    partialSlot[r] = -1;
    // Receive the previous position's partial and add the local contribution.
    const RingChunk& in = chunk(r, i - s - 2);
    if (in.bytes == 0) return;
    if (s + 1 == rsSteps && e.shape().disjointBuffers && in.input.buffer == kSendBuffer) {
      // Last step of a flat ring, send and recv disjoint: the partial lands
      // in the output, so the receive waits for no scratch slot (with 2 ranks
      // every receive is posted when the call starts). Same messages as
      // below, so ranks may differ in placement. (A contribution in scratch,
      // as in the hierarchical rail phase, keeps the slot: its receive would
      // wait for the node phase's reads of the send buffer, ordered as if in
      // place.)
      e.recv(ring.prev(), channel, in.output, in.bytes);
      e.reduce(in.output, in.input, in.output, in.bytes, spec.localFlags());
      if (spec.divisor > 1) e.divide(in.output, in.output, in.bytes);
      return;
    }
    int slot = slots.acquire(now);
    e.recv(ring.prev(), channel, slots.slice(slot), in.bytes);
    if (s + 1 < rsSteps) {
      e.reduce(slots.slice(slot), in.input, slots.slice(slot), in.bytes, spec.localFlags());
      partialSlot[r] = slot;
      return;
    }
    // Last step: the chunk received is this position's own, now complete.
    e.reduce(in.output, in.input, slots.slice(slot), in.bytes, spec.localFlags());
    slots.release(slot, now);
    if (spec.divisor > 1) e.divide(in.output, in.output, in.bytes);
  };

  // Returns the send's step index (-1: none).
  auto allGatherStep = [&](int64_t r, int64_t s) -> int64_t {
    const RingChunk& out = chunk(r, i - s);
    int64_t sent = -1;
    if (out.bytes > 0) {
      // Step 0 sends the own chunk: the AllGather input, or the reduced result.
      Slice src = (s == 0 && !reduceScatter) ? out.input : out.output;
      sent = e.send(ring.next(), channel, src, out.bytes);
    }
    const RingChunk& in = chunk(r, i - s - 1);
    if (in.bytes > 0) e.recv(ring.prev(), channel, in.output, in.bytes);
    return sent;
  };

  for (int64_t now = 0; now < endTime; ++now) {
    // Rounds active now: 0 <= now - r*roundLag < stepsPerRound, oldest first.
    const int64_t firstRound = std::max<int64_t>(0, (now - stepsPerRound) / roundLag);
    const int64_t lastRound = std::min<int64_t>(nrounds - 1, now / roundLag);
    for (int64_t r = firstRound; r <= lastRound; ++r) {
      const int64_t s = now - r * roundLag;
      if (s >= stepsPerRound) continue;
      int64_t sent = -1;
      if (s < rsSteps) {
        reduceScatterStep(r, s, now);
      } else {
        sent = allGatherStep(r, s - rsSteps);
      }
      if (s == 0 && !reduceScatter) {
        // The own chunk's copy waits for its send to leave (it reads the
        // same bytes): copies of every round at once at the start would hold
        // the CPU while the transports, moved only when polled, sit idle.
        const RingChunk& own = chunk(r, i);
        std::vector<uint32_t> after;
        if (sent >= 0) after.push_back(static_cast<uint32_t>(sent));
        if (own.bytes > 0) e.copy(own.output, own.input, own.bytes, 0, after);
      }
    }
  }
  e.reserveScratch(slots.bytesUsed());
}

}  // namespace shoal::build
