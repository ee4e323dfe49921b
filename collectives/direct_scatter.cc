// Direct Scatter: the root sends every rank its block straight.
//
// Vocabulary:
//   block    count elements; block q of the root's sendbuff lands in rank q's
//            recvbuff.
//   channel  every block is split into the same contiguous parts, one per channel.
// The root copies its own block (a no-op in place: recvbuff == sendbuff +
// root*count) and sends the others; non-roots never touch sendbuff.
#include "collectives/builders.h"
#include "collectives/builder_util.h"
#include "collectives/patterns/ring.h"

namespace shoal {

using namespace build;

Plan buildDirectScatter(const CollShape& shape, const RankView& view, const AlgoParams& params) {
  StepEmitter e(shape, view, "direct");
  const int p = view.nranks;
  const int root = shape.root;
  const uint64_t elemSize = e.elemSize();
  const uint64_t blockBytes = shape.count * elemSize;
  if (shape.count == 0) return e.finish();
  const auto parts = channelParts(shape.count, params, patterns::lineGranule(elemSize));

  if (view.rank != root) {
    for (const ChannelPart& part : parts) {
      const uint64_t inBlock = part.elems.begin * elemSize;
      e.recv(root, part.channel, recvAt(inBlock), part.elems.count * elemSize);
    }
    return e.finish();
  }
  e.copy(recvAt(0), sendAt(root * blockBytes), blockBytes);
  for (int d = 1; d < p; ++d) {
    const int to = patterns::wrap(root + d, p);
    for (const ChannelPart& part : parts) {
      const uint64_t inBlock = part.elems.begin * elemSize;
      e.send(to, part.channel, sendAt(to * blockBytes + inBlock), part.elems.count * elemSize);
    }
  }
  return e.finish();
}

}  // namespace shoal
