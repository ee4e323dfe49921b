// Bruck AllGather: the latency algorithm, ceil(log2 p) messages per rank
// instead of the ring's p-1, for any p (patterns/bruck.h).
//
// Vocabulary:
//   block    sendcount elements; block q of the output is rank q's input.
//   position a ring position (patterns::RingOrder); blocks are exchanged in
//            position order relative to this rank.
//   staging  scratch holding the part of block (me + t) at index t, so every
//            round's blocks are one contiguous message.
//   channel  the same contiguous part of every block, with its own lanes.
// Round 0 sends the input itself; rounds after it send staged blocks. The last
// round receives straight into the output where its blocks are contiguous
// there, and everything else staged is copied out at the end.
#include <optional>

#include "collectives/builders.h"
#include "collectives/builder_util.h"
#include "collectives/patterns/bruck.h"
#include "collectives/patterns/ring.h"

namespace shoal {

using namespace build;

Plan buildBruckAllGather(const CollShape& shape, const RankView& view, const AlgoParams& params) {
  StepEmitter e(shape, view, "bruck");
  const patterns::RingOrder ring(view);
  const int p = ring.size();
  const int me = ring.position();
  const uint64_t elemSize = e.elemSize();
  const uint64_t blockBytes = shape.count * elemSize;
  const std::vector<patterns::BruckRound> rounds = patterns::bruckRounds(p);
  // Output offset of the block of relative position t.
  auto blockAt = [&](int64_t t) { return static_cast<uint64_t>(ring.rankAt(me + t)) * blockBytes; };

  for (const ChannelPart& part : channelParts(shape.count, params, patterns::lineGranule(elemSize))) {
    const uint64_t bytes = part.elems.count * elemSize;
    const uint64_t inBlock = part.elems.begin * elemSize;
    const uint16_t ch = part.channel;
    const Slice own = sendAt(inBlock);
    e.copy(recvAt(blockAt(0) + inBlock), own, bytes);
    if (p == 1) continue;

    // Output slices of relative blocks [t, t + n) when they are one contiguous range.
    auto contiguousOutput = [&](int t, int n) -> std::optional<Slice> {
      if (n > 1 && bytes != blockBytes) return std::nullopt;
      for (int j = 1; j < n; ++j)
        if (ring.rankAt(me + t + j) != ring.rankAt(me + t) + j) return std::nullopt;
      return recvAt(blockAt(t) + inBlock);
    };

    const uint64_t area = e.reserveScratch(static_cast<uint64_t>(p) * bytes);
    auto staged = [&](int t) { return scratchAt(area + static_cast<uint64_t>(t) * bytes); };
    if (rounds.size() > 1) e.copy(staged(0), own, bytes);
    int directFrom = p;  // relative blocks from here on arrived in the output
    for (size_t k = 0; k < rounds.size(); ++k) {
      const auto [d, n] = rounds[k];
      e.send(ring.rankAt(me - d), ch, k == 0 ? own : staged(0), static_cast<uint64_t>(n) * bytes);
      const std::optional<Slice> out =
          k + 1 == rounds.size() ? contiguousOutput(d, n) : std::nullopt;
      if (out) directFrom = d;
      e.recv(ring.rankAt(me + d), ch, out ? *out : staged(d), static_cast<uint64_t>(n) * bytes);
    }
    // Copy out what was staged: runs of blocks that are contiguous in the output.
    for (int t = 1; t < directFrom;) {
      int n = 1;
      while (t + n < directFrom && contiguousOutput(t, n + 1)) ++n;
      e.copy(recvAt(blockAt(t) + inBlock), staged(t), static_cast<uint64_t>(n) * bytes);
      t += n;
    }
  }
  return e.finish();
}

}  // namespace shoal
