// One-shot AllReduce: every rank sends its whole contribution to every peer
// at once and sums all n contributions itself. One round of messages instead
// of log2(p): for small buffers where a round costs more than the bytes
// (ranks that share cores wait for their peers' time slices once per round).
//
// Bit-exactness: every rank sums the contributions in rank order, ((c0 + c1)
// + c2) + ..., so all hold identical bytes whatever the reducer's rounding.
// kPreMulSum: each rank scales its own contribution once, before sending it;
// the sums are plain. Integer avg divides the full sum once.
// Scratch: one buffer-sized slot per rank and channel; this rank's holds its
// own (scaled) contribution, so an in-place call never sums what it already
// overwrote.
#include "collectives/builders.h"
#include "collectives/builder_util.h"
#include "collectives/patterns/chunking.h"

namespace shoal {

using namespace build;

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
    const uint64_t stride = alignUp(bytes, 64);
    const uint64_t area = e.reserveScratch(static_cast<uint64_t>(n) * stride);
    auto slot = [&](int r) { return scratchAt(area + static_cast<uint64_t>(r) * stride); };

    e.copy(slot(me), local, bytes, spec.localFlags());
    const Slice outgoing = spec.scaleLocal ? slot(me) : local;
    for (int k = 1; k < n; ++k) e.send((me + k) % n, ch, outgoing, bytes);
    for (int k = 1; k < n; ++k) {
      const int from = (me - k + n) % n;
      e.recv(from, ch, slot(from), bytes);
    }
    e.reduce(result, slot(0), slot(1), bytes);
    for (int r = 2; r < n; ++r) e.reduce(result, result, slot(r), bytes);
    if (spec.divisor > 1) e.divide(result, result, bytes);
  }
  return e.finish();
}

}  // namespace shoal
