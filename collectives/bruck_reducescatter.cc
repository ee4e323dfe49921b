// Bruck ReduceScatter: Bruck's AllGather transposed (patterns/bruck.h), the
// latency algorithm: ceil(log2 p) messages per rank for any p.
//
// Vocabulary:
//   block    recvcount elements: rank q's result is block q of the sum of sends.
//   position a ring position (patterns::RingOrder); blocks are exchanged in
//            position order relative to this rank.
//   partial  acc(t), scratch holding this rank's running sum for the block of
//            relative position t; a block enters it (scaled for kPreMulSum,
//            exactly once) the first time it is sent or summed.
//   channel  the same contiguous part of every block, with its own lanes.
// Rounds run from the widest distance down: each sends the partials of blocks
// [d, d+n) to position me + d and adds the partials of blocks [0, n) received
// from me - d. The last round (d = 1) completes block 0 straight into the
// output. Blocks never summed are sent from the input itself when they are one
// contiguous range there and need no scaling.
#include <vector>

#include "collectives/builders.h"
#include "collectives/builder_util.h"
#include "collectives/patterns/bruck.h"
#include "collectives/patterns/ring.h"

namespace shoal {

using namespace build;

Plan buildBruckReduceScatter(const CollShape& shape, const RankView& view,
                             const AlgoParams& params) {
  StepEmitter e(shape, view, "bruck");
  const patterns::RingOrder ring(view);
  const int p = ring.size();
  const int me = ring.position();
  const uint64_t elemSize = e.elemSize();
  const uint64_t blockBytes = shape.count * elemSize;
  const ReduceSpec spec = ReduceSpec::of(shape);
  const std::vector<patterns::BruckRound> rounds = patterns::bruckRounds(p);

  for (const ChannelPart& part : channelParts(shape.count, params, patterns::lineGranule(elemSize))) {
    const uint64_t bytes = part.elems.count * elemSize;
    const uint64_t inBlock = part.elems.begin * elemSize;
    const uint16_t ch = part.channel;
    auto inputAt = [&](int t) { return sendAt(ring.rankAt(me + t) * blockBytes + inBlock); };
    const Slice result = recvAt(inBlock);
    if (p == 1) {
      e.finishLocal(result, inputAt(0), bytes, spec);
      continue;
    }
    const uint64_t area = e.reserveScratch(static_cast<uint64_t>(p) * bytes);
    auto acc = [&](int t) { return scratchAt(area + static_cast<uint64_t>(t) * bytes); };
    std::vector<bool> summed(p, false);
    // Blocks [t, t + n) are one contiguous range of the input.
    auto inputContiguous = [&](int t, int n) {
      if (n == 1) return true;
      if (bytes != blockBytes) return false;
      for (int j = 1; j < n; ++j)
        if (ring.rankAt(me + t + j) != ring.rankAt(me + t) + j) return false;
      return true;
    };
    // Length of the run from t (before `end`) whose blocks share summed[] and,
    // when not yet summed, are contiguous in the input.
    auto runFrom = [&](int t, int end) {
      int n = 1;
      while (t + n < end && summed[t + n] == summed[t] &&
             (summed[t] || inputContiguous(t, n + 1)))
        ++n;
      return n;
    };

    for (size_t k = rounds.size(); k-- > 0;) {
      const auto [d, n] = rounds[k];
      const uint64_t messageBytes = static_cast<uint64_t>(n) * bytes;
      bool anySummed = false;
      for (int t = d; t < d + n; ++t) anySummed = anySummed || summed[t];
      const bool fromInput = !spec.scaleLocal && !anySummed && inputContiguous(d, n);
      if (!fromInput) {
        for (int t = d; t < d + n;) {
          const int run = runFrom(t, d + n);
          if (!summed[t]) {
            e.copy(acc(t), inputAt(t), static_cast<uint64_t>(run) * bytes, spec.localFlags());
            for (int j = t; j < t + run; ++j) summed[j] = true;
          }
          t += run;
        }
      }
      e.send(ring.rankAt(me + d), ch, fromInput ? inputAt(d) : acc(d), messageBytes);

      const Slice incoming = scratchAt(e.reserveScratch(messageBytes));
      e.recv(ring.rankAt(me - d), ch, incoming, messageBytes);
      if (k == 0) {  // n == 1: this rank's own block is complete
        const Slice local = summed[0] ? acc(0) : inputAt(0);
        e.reduce(result, local, incoming, bytes, summed[0] ? 0 : spec.localFlags());
        if (spec.divisor > 1) e.divide(result, result, bytes);
        continue;
      }
      for (int t = 0; t < n;) {
        const int run = runFrom(t, n);
        const Slice local = summed[t] ? acc(t) : inputAt(t);
        const Slice theirs{incoming.buffer, incoming.offset + static_cast<uint64_t>(t) * bytes};
        e.reduce(acc(t), local, theirs, static_cast<uint64_t>(run) * bytes,
                 summed[t] ? 0 : spec.localFlags());
        for (int j = t; j < t + run; ++j) summed[j] = true;
        t += run;
      }
    }
  }
  return e.finish();
}

}  // namespace shoal
