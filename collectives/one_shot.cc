// One-shot algorithms: every rank sends what each peer needs from it directly
// to that peer, all in one round. One round of messages instead of log2(p)
// (recursive doubling, Bruck) or p-1 (ring): for small buffers among few
// ranks, where a round costs more than the bytes (ranks that share cores wait
// for their peers' time slices once per round). The tuner weighs posting p-1
// messages against the rounds saved (registry.cc).
//
//   AllReduce      the whole contribution to every peer; every rank sums all p.
//   AllGather      the own block to every peer, received straight into the output.
//   ReduceScatter  block q to rank q; every rank sums the p contributions to its block.
//
// Bit-exactness: contributions are summed in rank order, ((c0 + c1) + c2) +
// ..., so every rank (AllReduce) holds identical bytes whatever the reducer's
// rounding. kPreMulSum: each rank scales what it sends and its own
// contribution once, before anything leaves; the sums are plain. Integer avg
// divides the full sum once.
// Scratch: one slot per rank and channel for the contributions summed here;
// this rank's holds its own one where it is scaled, or where an in-place call
// would otherwise sum what it already overwrote (else the sum reads the send
// buffer). A scaled ReduceScatter stages its outgoing blocks too.
#include <optional>

#include "collectives/builders.h"
#include "collectives/builder_util.h"
#include "collectives/patterns/chunking.h"

namespace shoal {

using namespace build;

namespace {

// One 64-byte aligned scratch slot of `bytes` per rank, reserved together.
class RankSlots {
 public:
  RankSlots(StepEmitter& e, int p, uint64_t bytes)
      : stride_(alignUp(bytes, 64)), area_(e.reserveScratch(static_cast<uint64_t>(p) * stride_)) {}
  Slice operator()(int r) const { return scratchAt(area_ + static_cast<uint64_t>(r) * stride_); }

 private:
  uint64_t stride_;
  uint64_t area_;
};

// One receive from every peer, nearest predecessor first, into `into(from)`.
template <typename IntoFn>
void receiveFromEveryPeer(StepEmitter& e, int me, int p, uint16_t channel, uint64_t bytes, IntoFn into) {
  for (int k = 1; k < p; ++k) {
    const int from = (me - k + p) % p;
    e.recv(from, channel, into(from), bytes);
  }
}

// Sums the p contributions in slots `slot(0..p-1)` into `result` in rank order.
template <typename SlotFn>
void sumInRankOrder(StepEmitter& e, int p, Slice result, SlotFn slot, uint64_t bytes,
                    const ReduceSpec& spec) {
  e.reduce(result, slot(0), slot(1), bytes);
  for (int r = 2; r < p; ++r) e.reduce(result, result, slot(r), bytes);
  if (spec.divisor > 1) e.divide(result, result, bytes);
}

}  // namespace

Plan buildOneShotAllReduce(const CollShape& shape, const RankView& view, const AlgoParams& params) {
  StepEmitter e(shape, view, "one_shot");
  const int n = e.nranks();
  const int me = e.rank();
  const ReduceSpec spec = ReduceSpec::of(shape);
  const uint64_t elemSize = e.elemSize();
  const uint64_t granule = patterns::lineGranule(elemSize);

  for (const ChannelPart& part : channelParts(shape.count, params, granule)) {
    const uint64_t bytes = part.elems.count * elemSize;
    const Slice local = sendAt(part.elems.begin * elemSize);
    const Slice result = recvAt(part.elems.begin * elemSize);
    const uint16_t ch = part.channel;
    if (n == 1) {
      e.finishLocal(result, local, bytes, spec);
      continue;
    }
    const RankSlots slot(e, n, bytes);
    // The own contribution is summed straight from the send buffer unless it
    // is scaled first, or an in-place sum would overwrite it before reading it
    // (the running sum starts at rank 0 and 1: only a later rank's input is
    // read after the result was written). Sends go first either way: a copy
    // ahead of them delays what the peers wait for.
    const bool stageOwn = spec.scaleLocal || (!e.shape().disjointBuffers && me >= 2);
    if (spec.scaleLocal) e.copy(slot(me), local, bytes, spec.localFlags());
    const Slice outgoing = spec.scaleLocal ? slot(me) : local;
    for (int k = 1; k < n; ++k) e.send((me + k) % n, ch, outgoing, bytes);
    if (stageOwn && !spec.scaleLocal) e.copy(slot(me), local, bytes);
    receiveFromEveryPeer(e, me, n, ch, bytes, slot);
    auto contribution = [&](int r) { return r == me && !stageOwn ? local : slot(r); };
    sumInRankOrder(e, n, result, contribution, bytes, spec);
  }
  return e.finish();
}

Plan buildOneShotAllGather(const CollShape& shape, const RankView& view, const AlgoParams& params) {
  StepEmitter e(shape, view, "one_shot");
  const int p = e.nranks();
  const int me = e.rank();
  const uint64_t elemSize = e.elemSize();
  const uint64_t blockBytes = shape.count * elemSize;
  for (const ChannelPart& part : channelParts(shape.count, params, patterns::lineGranule(elemSize))) {
    const uint64_t bytes = part.elems.count * elemSize;
    const uint64_t inBlock = part.elems.begin * elemSize;
    const uint16_t ch = part.channel;
    const Slice own = sendAt(inBlock);
    auto outputOf = [&](int r) { return recvAt(static_cast<uint64_t>(r) * blockBytes + inBlock); };
    for (int k = 1; k < p; ++k) e.send((me + k) % p, ch, own, bytes);
    e.copy(outputOf(me), own, bytes);  // after the sends: the peers wait for those
    receiveFromEveryPeer(e, me, p, ch, bytes, outputOf);
  }
  return e.finish();
}

Plan buildOneShotReduceScatter(const CollShape& shape, const RankView& view, const AlgoParams& params) {
  StepEmitter e(shape, view, "one_shot");
  const int p = e.nranks();
  const int me = e.rank();
  const ReduceSpec spec = ReduceSpec::of(shape);
  const uint64_t elemSize = e.elemSize();
  const uint64_t blockBytes = shape.count * elemSize;
  for (const ChannelPart& part : channelParts(shape.count, params, patterns::lineGranule(elemSize))) {
    const uint64_t bytes = part.elems.count * elemSize;
    const uint64_t inBlock = part.elems.begin * elemSize;
    const uint16_t ch = part.channel;
    auto inputFor = [&](int r) { return sendAt(static_cast<uint64_t>(r) * blockBytes + inBlock); };
    const Slice result = recvAt(inBlock);
    if (p == 1) {
      e.finishLocal(result, inputFor(me), bytes, spec);
      continue;
    }
    const RankSlots slot(e, p, bytes);
    // Outgoing blocks: the input itself, or scaled copies of it (kPreMulSum).
    std::optional<RankSlots> staged;
    if (spec.scaleLocal) staged.emplace(e, p, bytes);
    auto outgoing = [&](int q) { return staged ? (*staged)(q) : inputFor(q); };

    e.copy(slot(me), inputFor(me), bytes, spec.localFlags());
    for (int k = 1; k < p; ++k) {
      const int to = (me + k) % p;
      if (spec.scaleLocal) e.copy(outgoing(to), inputFor(to), bytes, kScaleSrc);
      e.send(to, ch, outgoing(to), bytes);
    }
    receiveFromEveryPeer(e, me, p, ch, bytes, slot);
    sumInRankOrder(e, p, result, slot, bytes, spec);
  }
  return e.finish();
}

}  // namespace shoal
